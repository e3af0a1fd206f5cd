// Data + expert parallel training of the language model (moekit/dist.hpp: ExpertParallelBlocks,
// MpiLmParallel; docs/distributed.md, "Training").
//
// Every rank holds the model whole except the routed experts' matrices, of which it holds its
// own (placement); it trains on its share of each micro-batch's sequences. The MoE blocks run
// through ExpertParallelLayer (rows to the experts' owners and back); LmTrainer sums the rest of
// the gradients over the ranks in rank order with sum() and the counts exactly.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>

#include "dist/mpi_util.hpp"
#include "moekit/dist.hpp"
#include "util/error.hpp"

namespace moekit::dist {

using mpi_util::comm_rank;
using mpi_util::comm_size;
using mpi_util::mpi_count;

ExpertParallelBlocks::ExpertParallelBlocks(const LanguageModel& model,
                                           const ExpertPlacement& placement, MPI_Comm comm) {
  for (std::int64_t l = 0; l < model.config().layers(); ++l) {
    // A non-owning handle: the model outlives the runner (it holds it).
    const std::shared_ptr<const MoeLayer> layer(std::shared_ptr<const MoeLayer>(), &model.block(l));
    layers_.push_back(std::make_unique<ExpertParallelLayer>(layer, placement, comm));
  }
  saved_.resize(layers_.size());
}

Tensor ExpertParallelBlocks::forward(std::int64_t layer, const TensorView& x, ForwardInfo* info) {
  return layers_.at(static_cast<std::size_t>(layer))->forward(x, info);
}

Tensor ExpertParallelBlocks::forward_train(std::int64_t layer, const TensorView& x,
                                           SavedForward& saved, bool keep) {
  const auto l = static_cast<std::size_t>(layer);
  return layers_.at(l)->forward_train(x, saved, saved_.at(l), keep);
}

Tensor ExpertParallelBlocks::backward(std::int64_t layer, const SavedForward& saved,
                                      const TensorView& dy, MoeTensors& grads,
                                      const BackwardOptions& options) {
  const auto l = static_cast<std::size_t>(layer);
  const ExpertParallelLayer& epl = *layers_.at(l);
  const std::vector<std::int64_t> mine = epl.placement().experts_of(epl.rank());
  const auto X = static_cast<std::int64_t>(mine.size());
  // The layer's backward wants the own experts' bias gradients [E_local, n]; the model holds the
  // biases whole [E, n] (every rank the same bits), so they go through scratch rows.
  MoeTensors g = grads;
  Tensor* whole[3] = {&grads.gate_bias, &grads.up_bias, &grads.down_bias};
  Tensor* part[3] = {&g.gate_bias, &g.up_bias, &g.down_bias};
  for (int i = 0; i < 3; ++i)
    if (whole[i]->numel() > 0) *part[i] = Tensor({X, whole[i]->dim(-1)}, DType::f32);
  Tensor dx = epl.backward(saved_.at(l), saved, dy, g, options);
  for (int i = 0; i < 3; ++i) {
    if (whole[i]->numel() == 0) continue;
    const std::int64_t n = whole[i]->dim(-1), E = whole[i]->dim(0);
    float* dst = whole[i]->data_as<float>();
    const float* src = part[i]->data_as<const float>();
    if (!options.accumulate) std::fill_n(dst, E * n, 0.0f);
    for (std::int64_t j = 0; j < X; ++j)
      for (std::int64_t c = 0; c < n; ++c) {
        float& d = dst[mine[static_cast<std::size_t>(j)] * n + c];
        d = options.accumulate ? d + src[j * n + c] : src[j * n + c];
      }
  }
  // Everything else the layer wrote in place or (first use) allocated: take those handles.
  for (const MoeTensorMember& m : kMoeTensorMembers)
    if (m.member != &MoeTensors::gate_bias && m.member != &MoeTensors::up_bias &&
        m.member != &MoeTensors::down_bias)
      grads.*m.member = g.*m.member;
  return dx;
}

MpiLmParallel::MpiLmParallel(ExpertPlacement placement, MPI_Comm comm)
    : placement_(std::move(placement)) {
  MPI_Comm_dup(comm, &comm_);
  rank_ = comm_rank(comm_);
  size_ = comm_size(comm_);
  std::exception_ptr err;
  if (placement_.num_ranks != size_)
    err = std::make_exception_ptr(std::invalid_argument(
        MOEKIT_MSG("[moekit::dist::MpiLmParallel] placement is for "
                   << placement_.num_ranks << " ranks, the communicator has " << size_)));
  try {
    dist::agree(comm_, err);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiLmParallel::~MpiLmParallel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::shared_ptr<MoeBlockRunner> MpiLmParallel::make_runner(const LanguageModel& model) {
  return std::make_shared<ExpertParallelBlocks>(model, placement_, comm_);
}

void MpiLmParallel::sum(float* data, std::int64_t n) {
  mpi_util::sum_in_rank_order(comm_, data, n);
}

void MpiLmParallel::sum(double* data, std::int64_t n) {
  mpi_util::sum_in_rank_order(comm_, data, n);
}

void MpiLmParallel::sum(std::int64_t* data, std::int64_t n) {
  if (size_ == 1 || n == 0) return;
  MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(n, "counts"), MPI_INT64_T, MPI_SUM, comm_);
}

void MpiLmParallel::agree(const std::exception_ptr& error) { dist::agree(comm_, error); }

Tensor MpiLmParallel::gather_experts(const Tensor& local, std::int64_t num_experts) {
  if (static_cast<std::int64_t>(placement_.owner.size()) != num_experts)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::dist::MpiLmParallel] gather of "
                                           << num_experts << " experts, the placement has "
                                           << placement_.owner.size()));
  return dist::gather_experts(comm_, placement_, local);
}

}  // namespace moekit::dist
