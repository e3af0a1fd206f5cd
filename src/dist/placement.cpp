// Expert parallelism's placement and collectives outside the layer (moekit/dist.hpp): which
// rank owns which expert, one rank's share of a layer's experts, the routed experts gathered
// whole on rank 0, summed counts, and `agree` — every rank learns whether any rank failed.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/mpi_util.hpp"
#include "moekit/dist.hpp"
#include "util/error.hpp"

namespace moekit::dist {

namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

using mpi_util::comm_rank;
using mpi_util::comm_size;
using mpi_util::copy_rows;
using mpi_util::mpi_count;

void agree(MPI_Comm comm, const std::exception_ptr& error) {
  const int rank = comm_rank(comm);
  const int mine = error ? rank : INT_MAX;
  int first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return;
  std::string msg;
  int origin = first;  // the rank the failure began on (another one for an agreed RankError)
  if (rank == first) {
    try {
      std::rethrow_exception(error);
    } catch (const RankError& e) {
      origin = e.rank();
      msg = e.message();
    } catch (...) {
      msg = message_of(error);
    }
  }
  int head[2] = {origin, static_cast<int>(std::min<std::size_t>(msg.size(), 1 << 16))};
  MPI_Bcast(head, 2, MPI_INT, first, comm);
  msg.resize(static_cast<std::size_t>(head[1]));
  MPI_Bcast(msg.data(), head[1], MPI_CHAR, first, comm);
  throw RankError(head[0], msg);
}

ExpertPlacement ExpertPlacement::contiguous(std::int64_t num_experts, int num_ranks) {
  if (num_experts < 1 || num_ranks < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::ExpertPlacement] need >= 1 expert and rank, got "
                                           << num_experts << " experts, " << num_ranks << " ranks"));
  ExpertPlacement p;
  p.num_ranks = num_ranks;
  p.owner.resize(static_cast<std::size_t>(num_experts));
  const std::int64_t q = num_experts / num_ranks, r = num_experts % num_ranks;
  std::int64_t e = 0;
  for (int rank = 0; rank < num_ranks; ++rank)
    for (std::int64_t i = 0; i < q + (rank < r ? 1 : 0); ++i) p.owner[static_cast<std::size_t>(e++)] = rank;
  return p;
}

ExpertPlacement ExpertPlacement::from_owners(std::vector<int> owner, int num_ranks) {
  if (owner.empty() || num_ranks < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::ExpertPlacement] need >= 1 expert and rank, got "
                                           << owner.size() << " experts, " << num_ranks << " ranks"));
  for (std::size_t e = 0; e < owner.size(); ++e)
    if (owner[e] < 0 || owner[e] >= num_ranks)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::ExpertPlacement] owner of expert "
                                             << e << " is rank " << owner[e] << ", outside [0, " << num_ranks << ")"));
  ExpertPlacement p;
  p.owner = std::move(owner);
  p.num_ranks = num_ranks;
  return p;
}

std::vector<std::int64_t> ExpertPlacement::experts_of(int rank) const {
  std::vector<std::int64_t> out;
  for (std::size_t e = 0; e < owner.size(); ++e)
    if (owner[e] == rank) out.push_back(static_cast<std::int64_t>(e));
  return out;
}

ExpertWeights select_experts(const ExpertWeights& w, const std::vector<std::int64_t>& ids) {
  const std::int64_t E = w.num_experts();
  for (const std::int64_t e : ids)
    if (e < 0 || e >= E)
      throw std::out_of_range(MOEKIT_MSG("[moekit::dist::select_experts] expert " << e << " outside [0, " << E << ")"));
  ExpertWeights out;
  const auto pick = [&](const ExpertMatrix& m) { return m.defined() ? m.select(ids) : m; };
  const auto rows_of = [&](const Tensor& b) {
    if (b.numel() == 0) return Tensor();
    Tensor t({static_cast<std::int64_t>(ids.size()), b.dim(1)}, DType::f32);
    copy_rows(b, ids, t);
    return t;
  };
  out.gate = pick(w.gate);
  out.up = pick(w.up);
  out.down = pick(w.down);
  out.gate_bias = rows_of(w.gate_bias);
  out.up_bias = rows_of(w.up_bias);
  out.down_bias = rows_of(w.down_bias);
  out.keep_alive = w.keep_alive;
  return out;
}

Tensor gather_experts(MPI_Comm comm, const ExpertPlacement& placement, const Tensor& local) {
  // One message per expert (each rank sends its experts in ascending order, rank 0 receives in
  // expert order, so no send waits on a later receive), straight into place: no staging copy.
  const auto E = static_cast<std::int64_t>(placement.owner.size());
  const int rank = comm_rank(comm);
  if (local.rank() < 1 || local.dtype() != DType::f32 ||
      local.dim(0) != static_cast<std::int64_t>(placement.experts_of(rank).size()))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::gather_experts] rank " << rank << " holds "
                                                                                  << shape_str(local.shape())
                                                                                  << ", not f32 [its experts, ...]"));
  Shape shape = local.shape();
  shape[0] = E;
  const std::int64_t per = shape_numel(shape) / E;
  const int count = mpi_count(per, "one expert");
  if (rank != 0) {
    for (std::int64_t i = 0; i < local.dim(0); ++i)
      MPI_Send(local.data_as<const float>() + i * per, count, MPI_FLOAT, 0, 0, comm);
    return Tensor();
  }
  Tensor whole(shape, DType::f32);
  std::int64_t mine = 0;  // rank 0's next local expert
  for (std::int64_t e = 0; e < E; ++e) {
    float* to = whole.data_as<float>() + e * per;
    const int owner = placement.owner[static_cast<std::size_t>(e)];
    if (owner == 0)
      std::copy_n(local.data_as<const float>() + mine++ * per, per, to);
    else
      MPI_Recv(to, count, MPI_FLOAT, owner, 0, comm, MPI_STATUS_IGNORE);
  }
  return whole;
}

std::vector<std::int64_t> allreduce_counts(MPI_Comm comm, const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> out(counts.size(), 0);
  MPI_Allreduce(counts.data(), out.data(), mpi_count(static_cast<std::int64_t>(counts.size()), "counts"), MPI_INT64_T,
                MPI_SUM, comm);
  return out;
}

}  // namespace moekit::dist
