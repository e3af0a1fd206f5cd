// Expert parallelism over MPI (docs/distributed.md): the routed experts split across ranks,
// tokens sent to the ranks that own their experts and back. Optional at build time
// (MOEKIT_WITH_MPI, library moekit::dist); not part of moekit.hpp.
//
// Every rank holds the whole layer's router and shared experts (data parallel) and reads only
// its own experts' matrices: with weights memory-mapped from a checkpoint, the other experts'
// pages are never touched, so the resident expert bytes per rank are ~1/N of the layer's.
//
// Contract: forward() on N ranks, each passing its own slice of the tokens, gives each rank the
// rows forward() of the single-process layer gives those tokens, bit for bit, for any N and any
// thread count: the exchange only moves rows, every expert runs the same rows in the same order
// (by rank, then by the rank's own order — the global token order when the ranks hold
// consecutive slices), and the combine sums the same values in slot order. (The int8 fast mode
// picks its kernel by an expert's row count, which is the same as in one process for the routed
// experts; the shared experts run on each rank's own rows, so with the fast mode on and a rank
// holding at most 8 tokens their kernel can differ from one process's.)
//
// Training: forward_train + backward run the same exchange backward (dx and the owners' expert
// gradients bit-identical to one process; router and shared gradients summed over the ranks in
// rank order, equal to one process's to fp32 rounding).
//
// Failure: an exception on any rank (bad input, a missing tensor, an expert's error) is agreed
// on before the next collective: every rank then throws dist::RankError with the failing rank's
// message, so a job ends with one message and never hangs.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/lm.hpp"
#include "moekit/lm_train.hpp"
#include "moekit/train.hpp"

namespace moekit::dist {

/// The error every rank throws when one rank failed: the lowest failing rank and its message.
class RankError : public std::runtime_error {
 public:
  RankError(int rank, const std::string& message)
      : std::runtime_error("rank " + std::to_string(rank) + ": " + message),
        rank_(rank),
        message_(message) {}
  int rank() const noexcept { return rank_; }
  /// The failing rank's message, without the "rank N: " before it.
  const std::string& message() const noexcept { return message_; }

 private:
  int rank_;
  std::string message_;
};

/// Collective: throws RankError on every rank if `error` is set on any (the lowest such rank's
/// message; a RankError there — a failure agreed on before — is passed on as it is), else returns.
/// The only way the dist layer lets a local failure reach a collective.
void agree(MPI_Comm comm, const std::exception_ptr& error);

/// Which rank owns each routed expert.
struct ExpertPlacement {
  std::vector<int> owner;  ///< [E] rank of expert e
  int num_ranks = 0;

  /// Contiguous blocks: with E = q·N + r the first r ranks own q + 1 experts, the rest q
  /// (E need not divide by N; a rank may own none when E < N).
  static ExpertPlacement contiguous(std::int64_t num_experts, int num_ranks);
  /// Any map: owner[e] in [0, num_ranks). Throws std::invalid_argument naming a bad entry.
  static ExpertPlacement from_owners(std::vector<int> owner, int num_ranks);
  /// The experts `rank` owns, ascending.
  std::vector<std::int64_t> experts_of(int rank) const;
};

/// Per-phase wall times (seconds) and bytes of the last forward() on this rank.
struct PhaseTimes {
  double route = 0;         ///< input checks, router, routing, send buffers
  double exchange_out = 0;  ///< counts (Alltoall) + rows and weights (Alltoallv)
  double compute = 0;       ///< the local experts on the rows received
  double exchange_back = 0;  ///< the outputs back (Alltoallv)
  double combine = 0;       ///< slot-order combine + shared experts + output
  std::int64_t rows_sent = 0, rows_received = 0;
  std::int64_t bytes_sent = 0, bytes_received = 0;  ///< both exchanges, this rank
};

/// What an expert-parallel training forward keeps on one rank for backward(): the home part (this
/// rank's tokens: x, logits, routing, the shared experts' trace, and where each (token, slot) row
/// went in the exchange) and the owner part (the rows this rank's experts received, in their
/// expert-sorted order, with slot weights and pre-activations, and the exchange's layout).
struct DistSavedForward {
  SavedForward home;
  std::vector<std::int64_t> position;      ///< [T·K] pair t·K + k → its row in the send order
  Tensor rows;                              ///< [R, D] the rows received, in receive order
  std::vector<std::int32_t> src;            ///< [R] expert-sorted row i → receive row
  std::vector<float> row_weight;            ///< [R] slot weights, expert-sorted
  std::vector<std::int64_t> offsets;        ///< [E_local + 1] rows of each local expert
  Tensor pre_gate, pre_up;                  ///< [R, F] expert-sorted; empty when not kept
  std::vector<int> sx, sxd, rx, rxd, send_rows, send_displ, recv_rows, recv_displ;  ///< the exchange
  std::int64_t T = 0, R = 0;
  bool filled = false;
};

/// A MoeLayer run expert-parallel over `comm`.
class ExpertParallelLayer {
 public:
  /// Collective over `comm` (which it duplicates). Every rank passes the same config and
  /// placement, and a layer whose router, shared experts and own experts are valid (the other
  /// experts' matrices are never read). Throws RankError if any rank's arguments are bad
  /// (placement size or rank count differing from comm's, experts of another shape, ...).
  ExpertParallelLayer(std::shared_ptr<const MoeLayer> layer, ExpertPlacement placement, MPI_Comm comm);
  ~ExpertParallelLayer();
  ExpertParallelLayer(const ExpertParallelLayer&) = delete;
  ExpertParallelLayer& operator=(const ExpertParallelLayer&) = delete;

  /// Collective: this rank's tokens x [..., D] (f32 or bf16; zero tokens allowed) → y as
  /// MoeLayer::forward gives them. Not thread-safe (one forward per layer at a time: the
  /// exchange buffers, kept between calls, are the layer's).
  Tensor forward(const TensorView& x, ForwardInfo* info = nullptr) const;

  /// Collective: forward() keeping in `saved` what backward() needs (y the same bits).
  /// `keep_pre_activations` false keeps only the rows: backward() recomputes the pre-activations
  /// with the same kernels and gets the same gradients.
  Tensor forward_train(const TensorView& x, DistSavedForward& saved, bool keep_pre_activations = true) const;
  /// The same with the home part kept in `home` instead of saved.home (a caller that keeps it
  /// elsewhere, e.g. LmSaved's blocks); pass the same `home` to backward().
  Tensor forward_train(const TensorView& x, SavedForward& home, DistSavedForward& saved,
                       bool keep_pre_activations = true) const;

  /// Collective: the backward of this rank's tokens for dL/dy = dy (shaped like this rank's x).
  /// Rows of dy travel to the experts' owners (the forward's exchange), the owners run the
  /// experts' backward, dL/d(row) and dL/d(slot weight) come back and are combined in slot order.
  /// Returns dx for this rank's tokens — **bit-identical to MoeLayer's backward** for those
  /// tokens at any rank count. `grads`: the experts' members hold this rank's experts only
  /// ([E_local, ...], local_experts()' order; empty members are allocated) — bit-identical to the
  /// single-process gradients of those experts; router, router_bias, shared experts and shared
  /// gate hold the whole batch's gradient, each rank's partial sum added **in rank order** (0, 1,
  /// …) and broadcast: the same bits on every rank and for every run at a given rank count,
  /// equal to one process's to fp32 rounding (bit-identical at one rank). Throws RankError on
  /// every rank if any rank's dy, saved state or grads are bad.
  Tensor backward(const DistSavedForward& saved, const TensorView& dy, MoeTensors& grads,
                  const BackwardOptions& options = {}) const;
  /// The same for a forward_train that kept its home part in `home`.
  Tensor backward(const DistSavedForward& saved, const SavedForward& home, const TensorView& dy,
                  MoeTensors& grads, const BackwardOptions& options = {}) const;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const ExpertPlacement& placement() const noexcept { return placement_; }
  /// This rank's experts (views into the layer's weights), local index i = experts_of(rank)[i].
  const ExpertWeights& local_experts() const noexcept { return local_; }
  const MoeLayer& layer() const noexcept { return *layer_; }
  const PhaseTimes& last_times() const noexcept { return times_; }

 private:
  void routed(const TensorView& x, const Routing& routing, const TensorView& y) const;
  // Copies the own experts' biases from the layer (select_experts copied them): a layer trained
  // in place changes them between forwards.
  void refresh_biases() const;
  // Runs `run` (a MoeLayer forward given routed()) with the failure agreement around it.
  Tensor collective_forward(const std::function<Tensor(const MoeLayer::RoutedExperts&)>& run) const;

  std::shared_ptr<const MoeLayer> layer_;
  ExpertPlacement placement_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<std::int64_t> mine_;  ///< experts_of(rank_)
  std::vector<std::vector<std::int64_t>> owned_;  ///< experts_of(r) for every rank
  mutable ExpertWeights local_;                   // biases refreshed per forward (refresh_biases)
  mutable PhaseTimes times_;
  mutable DistSavedForward* saving_ = nullptr;  ///< set during forward_train
  mutable bool keep_pre_ = true;
  // The exchange's buffers, kept between forwards.
  struct Buffers {
    std::vector<float> send_x, send_w, recv_x, recv_w, out, back, mine_out;
  };
  mutable Buffers buffers_;
  mutable double started_ = 0;
};

/// The MoE blocks of a LanguageModel run expert-parallel (LanguageModel::set_block_runner): one
/// ExpertParallelLayer per block over the model's own layers. Collective, like every call.
class ExpertParallelBlocks : public MoeBlockRunner {
 public:
  /// `model` holds the experts placement.experts_of(rank) of every block (LanguageModel's
  /// local_experts constructor) or all of them, and outlives the runner.
  ExpertParallelBlocks(const LanguageModel& model, const ExpertPlacement& placement, MPI_Comm comm);

  Tensor forward(std::int64_t layer, const TensorView& x, ForwardInfo* info) override;
  Tensor forward_train(std::int64_t layer, const TensorView& x, SavedForward& saved,
                       bool keep) override;
  /// `grads`: the block's gradients as the rank holds them — routed matrices [E_local, ...],
  /// everything else whole; the expert biases' rows of the other ranks' experts are left at 0
  /// (or unchanged when accumulating), so a sum over the ranks gives the whole gradient.
  Tensor backward(std::int64_t layer, const SavedForward& saved, const TensorView& dy,
                  MoeTensors& grads, const BackwardOptions& options) override;

  const ExpertParallelLayer& layer(std::int64_t l) const {
    return *layers_.at(static_cast<std::size_t>(l));
  }

 private:
  std::vector<std::unique_ptr<ExpertParallelLayer>> layers_;
  std::vector<DistSavedForward> saved_;  ///< the exchange state of each block's last forward_train
};

/// LmTrainer's data + expert parallel job over MPI (moekit/lm_train.hpp, LmParallel): the
/// tokens split over the ranks of `comm`, the routed experts placed by `placement`.
class MpiLmParallel : public LmParallel {
 public:
  /// Collective over `comm` (duplicated). Throws RankError on every rank for a placement of
  /// another rank count.
  MpiLmParallel(ExpertPlacement placement, MPI_Comm comm);
  ~MpiLmParallel() override;
  MpiLmParallel(const MpiLmParallel&) = delete;
  MpiLmParallel& operator=(const MpiLmParallel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::int64_t> local_experts() const override { return placement_.experts_of(rank_); }
  std::shared_ptr<MoeBlockRunner> make_runner(const LanguageModel& model) override;
  void sum(float* data, std::int64_t n) override;
  void sum(double* data, std::int64_t n) override;
  void sum(std::int64_t* data, std::int64_t n) override;
  void agree(const std::exception_ptr& error) override;
  Tensor gather_experts(const Tensor& local, std::int64_t num_experts) override;
  const ExpertPlacement& placement() const noexcept { return placement_; }

 private:
  ExpertPlacement placement_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

/// The experts `ids` of `w` as an ExpertWeights of ids.size() experts (views of the same
/// memory, biases copied): what one rank runs.
ExpertWeights select_experts(const ExpertWeights& w, const std::vector<std::int64_t>& ids);

/// Collective: rank 0 receives the whole [E, ...] f32 tensor of which every rank holds its own
/// experts' rows [E_local, ...] (experts_of(rank) order) in `local`; the other ranks get an
/// empty tensor. Throws std::invalid_argument on a rank whose `local` has another expert count
/// (before any message: call it only when every rank's part is right, e.g. after agree()).
Tensor gather_experts(MPI_Comm comm, const ExpertPlacement& placement, const Tensor& local);

/// Collective: sums per-expert integer counts over the ranks (exact), e.g. the loads the
/// aux-loss-free balancer's update reads, so every rank computes the identical bias.
std::vector<std::int64_t> allreduce_counts(MPI_Comm comm, const std::vector<std::int64_t>& counts);

}  // namespace moekit::dist
