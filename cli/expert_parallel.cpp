#include "expert_parallel.hpp"

#include <CLI/CLI.hpp>

#ifdef MOEKIT_HAVE_DIST
#include <cctype>
#include <charconv>
#include <climits>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#endif

namespace moekit::cli {

void add_expert_parallel_options(CLI::App& cmd, ExpertParallelOptions& opt, const std::string& what) {
  CLI::Option* flag = cmd.add_flag("--expert-parallel", opt.enabled,
                                   "Run under mpirun with the routed experts split over the ranks (--placement; MPI, "
                                   "docs/distributed.md): " + what);
  cmd.add_option("--placement", opt.placement,
                 "With --expert-parallel, which rank owns each routed expert: contiguous (the default: blocks of "
                 "experts in rank order), a comma list of one rank per expert, expert 0 first (e.g. 0,1,1,0; a "
                 "rank may own none), or @FILE holding that list. The results are the same bytes for every "
                 "placement")
      ->needs(flag);
}

#ifdef MOEKIT_HAVE_DIST

int as_count(const std::string& prefix, std::int64_t n) {
  if (n > INT32_MAX) throw std::length_error(prefix + "the input is too large for one MPI message");
  return static_cast<int>(n);
}

namespace {

std::string trimmed(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

dist::ExpertPlacement parse_placement(const std::string& prefix, const std::string& spec, std::int64_t num_experts,
                                      int num_ranks) {
  if (spec == "contiguous") return dist::ExpertPlacement::contiguous(num_experts, num_ranks);
  const std::string named = prefix + "--placement '" + spec + "'";
  std::string list = spec;
  if (!spec.empty() && spec[0] == '@') {
    std::ifstream in(spec.substr(1));
    if (!in) throw std::runtime_error(named + ": cannot read the file '" + spec.substr(1) + "'");
    std::ostringstream text;
    text << in.rdbuf();
    list = text.str();
  }
  std::vector<int> owner;
  std::istringstream entries(list);
  for (std::string entry; std::getline(entries, entry, ',');) {
    entry = trimmed(entry);
    int rank = 0;
    const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), rank);
    if (entry.empty() || ec != std::errc() || end != entry.data() + entry.size())
      throw std::invalid_argument(named + ": entry " + std::to_string(owner.size()) + " ('" + entry +
                                  "') is not a rank number; expected contiguous, a comma list of ranks or @FILE");
    owner.push_back(rank);
  }
  if (static_cast<std::int64_t>(owner.size()) != num_experts)
    throw std::invalid_argument(named + " lists " + std::to_string(owner.size()) + " owners, but the layer has " +
                                std::to_string(num_experts) + " routed experts (one owner rank per expert, expert 0 "
                                "first)");
  try {
    return dist::ExpertPlacement::from_owners(std::move(owner), num_ranks);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(named + ": " + e.what() + " (the job has " + std::to_string(num_ranks) + " ranks)");
  }
}

void agreed(const std::function<void()>& step) {
  std::exception_ptr err;
  try {
    step();
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
}

void run_mpi_job(const std::string& prefix, const std::function<void(const MpiSession&)>& job) {
  const MpiSession mpi;
  try {
    job(mpi);
  } catch (const dist::RankError& e) {
    end_failed_job(mpi, e, prefix);
  }
}

TokenSplit::TokenSplit(const MpiSession& mpi, const Tensor& x, const std::string& prefix)
    : rank_(mpi.rank), prefix_(prefix) {
  std::int64_t dims = mpi.rank == 0 ? x.rank() - 1 : 0;
  MPI_Bcast(&dims, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  lead_.resize(static_cast<std::size_t>(dims));
  if (mpi.rank == 0) lead_.assign(x.shape().begin(), x.shape().end() - 1);
  MPI_Bcast(lead_.data(), static_cast<int>(dims), MPI_INT64_T, 0, MPI_COMM_WORLD);
  const std::int64_t T = shape_numel(lead_), N = mpi.size;
  rows_.resize(static_cast<std::size_t>(N));
  first_.assign(static_cast<std::size_t>(N), 0);
  for (std::int64_t r = 0; r < N; ++r) rows_[r] = T / N + (r < T % N ? 1 : 0);
  for (std::int64_t r = 1; r < N; ++r) first_[r] = first_[r - 1] + rows_[r - 1];
}

void TokenSplit::counts(std::int64_t width, std::vector<int>& count, std::vector<int>& displ) const {
  count.resize(rows_.size());
  displ.resize(rows_.size());
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    count[r] = as_count(prefix_, rows_[r] * width);
    displ[r] = as_count(prefix_, first_[r] * width);
  }
}

Tensor TokenSplit::scatter(const Tensor& whole, std::int64_t width) const {
  std::vector<int> count, displ;
  counts(width, count, displ);
  Tensor part({rows_[static_cast<std::size_t>(rank_)], width}, DType::f32);
  MPI_Scatterv(rank_ == 0 ? whole.data() : nullptr, count.data(), displ.data(), MPI_FLOAT, part.data(),
               count[static_cast<std::size_t>(rank_)], MPI_FLOAT, 0, MPI_COMM_WORLD);
  return part;
}

Tensor TokenSplit::gather(const Tensor& part, std::int64_t width, DType dtype) const {
  std::vector<int> count, displ;
  counts(width, count, displ);
  const MPI_Datatype type = dtype == DType::i32 ? MPI_INT32_T : MPI_FLOAT;
  Tensor whole;
  if (rank_ == 0) {
    Shape shape = lead_;
    shape.push_back(width);
    whole = Tensor(shape, dtype);
  }
  MPI_Gatherv(part.data(), count[static_cast<std::size_t>(rank_)], type, rank_ == 0 ? whole.data() : nullptr,
              count.data(), displ.data(), type, 0, MPI_COMM_WORLD);
  return whole;
}

#endif  // MOEKIT_HAVE_DIST

}  // namespace moekit::cli
