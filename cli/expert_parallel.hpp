// What the `--expert-parallel` commands (forward, backward) share: their two options, the expert
// placement `--placement` names, rank 0's tokens split into consecutive slices (scattered to the
// ranks and gathered back) and the steps whose failure every rank agrees on.
#pragma once

#include <string>

namespace CLI {
class App;
}

#ifdef MOEKIT_HAVE_DIST
#include <cstdint>
#include <functional>
#include <vector>

#include "moekit/dist.hpp"
#include "moekit/tensor.hpp"
#include "mpi_session.hpp"
#endif

namespace moekit::cli {

struct ExpertParallelOptions {
  bool enabled = false;
  std::string placement = "contiguous";  ///< "contiguous", "0,1,1,0" or "@FILE"
};

/// Adds `--expert-parallel` (its help: "Run under mpirun ..." followed by `what`, what the
/// command does there) and `--placement`, which needs it.
void add_expert_parallel_options(CLI::App& cmd, ExpertParallelOptions& opt, const std::string& what);

#ifdef MOEKIT_HAVE_DIST

/// `n` as an MPI count; std::length_error (starting with `prefix`) above INT32_MAX.
int as_count(const std::string& prefix, std::int64_t n);

/// The placement `spec` names for `num_experts` routed experts on `num_ranks` ranks:
/// "contiguous" (ExpertPlacement::contiguous), a comma list of one owner rank per expert, expert 0
/// first ("0,1,1,0"), or "@FILE", a file holding that list (whitespace and newlines around the
/// entries ignored). Ranks may own no experts (ExpertPlacement::from_owners' rule). Throws
/// std::invalid_argument (a wrong length, an entry that is not a rank, a rank outside
/// [0, num_ranks)) or std::runtime_error (FILE unreadable), starting with `prefix` and naming
/// `--placement`.
dist::ExpertPlacement parse_placement(const std::string& prefix, const std::string& spec, std::int64_t num_experts,
                                      int num_ranks);

/// Collective: runs `step` on this rank; if it threw on any rank, every rank throws
/// dist::RankError with the lowest failing rank's message (dist::agree).
void agreed(const std::function<void()>& step);

/// Runs `job` under an MpiSession. A dist::RankError (a failure every rank agreed on) ends the job
/// as end_failed_job does: rank 0 prints "moekit: error: `prefix` message", every rank exits 1.
void run_mpi_job(const std::string& prefix, const std::function<void(const MpiSession&)>& job);

/// Rank 0's tokens in consecutive slices, one per rank in rank order (the first T % N ranks one
/// row more): rank order is then token order, which is what makes the expert-parallel layer's
/// results the single-process bytes (docs/distributed.md).
class TokenSplit {
 public:
  /// Collective: `x` is rank 0's input [..., width] (ignored on the other ranks); every rank
  /// learns its shape.
  TokenSplit(const MpiSession& mpi, const Tensor& x, const std::string& prefix);

  /// Collective: rank 0's f32 `whole` (x's leading dimensions, last dimension `width`; ignored
  /// elsewhere) → this rank's rows [T_r, width].
  Tensor scatter(const Tensor& whole, std::int64_t width) const;
  /// Collective: every rank's rows `part` [T_r, width] of `dtype` (f32 or i32) → on rank 0 the
  /// whole [x's leading dimensions..., width]; an empty tensor on the other ranks.
  Tensor gather(const Tensor& part, std::int64_t width, DType dtype) const;

 private:
  // Per rank: MPI counts and displacements of `width` values per row.
  void counts(std::int64_t width, std::vector<int>& count, std::vector<int>& displ) const;

  int rank_ = 0;
  std::string prefix_;
  Shape lead_;                    ///< x's shape without its last dimension
  std::vector<std::int64_t> rows_, first_;  ///< [N] rows and first row of each rank
};

#endif  // MOEKIT_HAVE_DIST

}  // namespace moekit::cli
