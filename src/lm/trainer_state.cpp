// LmTrainer's whole-model state in a data + expert parallel run (moekit/lm_train.hpp): the
// routed experts gathered from their owners for a checkpoint (whole_params, whole_optimizer) and
// split to them again on restore; and the routed-matrix helpers of lm/routed.hpp.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "lm/routed.hpp"
#include "moekit/lm_train.hpp"
#include "util/error.hpp"

namespace moekit {

namespace lm_detail {

Tensor take_experts(const Tensor& t, const std::vector<std::int64_t>& ids) {
  Shape shape = t.shape();
  shape[0] = static_cast<std::int64_t>(ids.size());
  Tensor out(shape, DType::f32);
  const std::size_t row = static_cast<std::size_t>(t.numel() / std::max<std::int64_t>(t.dim(0), 1)) * sizeof(float);
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * row,
                static_cast<const char*>(t.data()) + static_cast<std::size_t>(ids[i]) * row, row);
  return out;
}

bool is_routed_matrix(const std::string& name) {
  for (const MoeTensorMember& r : kRoutedMatrices) {
    const std::size_t n = std::strlen(r.name);
    if (name.size() >= n && name.compare(name.size() - n, n, r.name) == 0 &&
        (name.size() == n || name[name.size() - n - 1] == '.'))
      return true;
  }
  return false;
}

LmParams local_part(LmParams p, const std::vector<std::int64_t>* ids) {
  if (ids)
    for (MoeTensors& b : p.blocks)
      for (const MoeTensorMember& r : kRoutedMatrices)
        if ((b.*r.member).numel() > 0) b.*r.member = take_experts(b.*r.member, *ids);
  return p;
}

}  // namespace lm_detail

using namespace lm_detail;  // NOLINT(google-build-using-namespace): the trainer's own parts

LmParams LmTrainer::whole_params() const {
  if (!parallel_) return params_;
  LmParams out = params_;  // shares the storage of what every rank holds whole
  const std::int64_t E = config_.block.router.num_experts;
  for (MoeTensors& b : out.blocks)
    for (const MoeTensorMember& r : kRoutedMatrices)
      if ((b.*r.member).rank() == 3) b.*r.member = parallel_->gather_experts(b.*r.member, E);
  return parallel_->rank() == 0 ? out : LmParams{};
}

Optimizer LmTrainer::whole_optimizer(const LmParams& whole) const {
  if (!parallel_) return optimizer_;
  const std::int64_t E = config_.block.router.num_experts;
  // Every rank gathers the same list: the routed matrices' state by name from the config's
  // blocks (a rank holding no experts has no state for them: it sends none).
  NamedTensors state = optimizer_.state();
  const bool stepped = optimizer_.steps() > 0;
  NamedTensors whole_state;
  for (auto& [name, t] : state)
    if (!is_routed_matrix(name)) whole_state.emplace_back(name, t);
  if (stepped)
    for (const char* prefix : optimizer_.kind() == Optimizer::Kind::adamw ? std::vector<const char*>{"m.", "v."}
                                                                          : std::vector<const char*>{"momentum."})
      for (std::size_t l = 0; l < params_.blocks.size(); ++l)
        for (const MoeTensorMember& r : kRoutedMatrices) {
          const Tensor& p = params_.blocks[l].*r.member;
          if (p.rank() != 3) continue;
          const std::string name = prefix + ("layers." + std::to_string(l) + "." + r.name);
          Tensor local = p;  // shape [0, ...] when this rank holds no experts (no state then)
          for (const auto& [n, t] : state)
            if (n == name) local = t;
          whole_state.emplace_back(name, parallel_->gather_experts(local, E));
        }
  Optimizer out = make_optimizer(options_);
  if (parallel_->rank() == 0 && stepped) out.load_state(whole_state, optimizer_.steps(), whole.named());
  return out;
}

void LmTrainer::restore(const LmParams& whole, const std::vector<Tensor>& biases, const Optimizer& whole_optimizer,
                        std::int64_t step, std::uint64_t rng_state) {
  // Expert parallel: this rank's part of the checkpoint's experts and their optimizer state.
  if (parallel_)
    for (std::size_t l = 0; l < whole.blocks.size(); ++l)
      for (const MoeTensorMember& r : kRoutedMatrices) {
        const Tensor& t = whole.blocks[l].*r.member;
        if (t.numel() > 0 && (t.rank() != 3 || t.dim(0) != config_.block.router.num_experts || t.dtype() != DType::f32))
          throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] layer "
                                                 << l << "'s routed experts are " << shape_str(t.shape())
                                                 << ", not f32 [" << config_.block.router.num_experts << ", ...]"));
      }
  const LmParams params = local_part(whole, parallel_ ? &local_ : nullptr);
  Optimizer optimizer = whole_optimizer;
  if (parallel_) {
    NamedTensors state = whole_optimizer.state();
    for (auto& [name, t] : state)
      if (is_routed_matrix(name) && t.rank() == 3 && t.dim(0) == config_.block.router.num_experts)
        t = take_experts(t, local_);
    // A rank holding no experts holds no state for them (named() lists no empty tensor).
    state.erase(std::remove_if(state.begin(), state.end(), [](const auto& e) { return e.second.numel() == 0; }),
                state.end());
    if (!state.empty()) optimizer.load_state(state, whole_optimizer.steps(), params.named());
  }
  const NamedTensors mine = params_.named(), given = params.named();
  if (mine.size() != given.size())
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::LmTrainer::restore] " << given.size() << " tensors, the model has " << mine.size()));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i].first != given[i].first || mine[i].second.shape() != given[i].second.shape() ||
        given[i].second.dtype() != DType::f32)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] "
                                             << given[i].first << " " << shape_str(given[i].second.shape())
                                             << " does not match the model's " << mine[i].first << " "
                                             << shape_str(mine[i].second.shape())));
  if (biases.size() != biases_.size())
    throw std::invalid_argument("[moekit::LmTrainer::restore] wrong number of selection biases");
  for (std::size_t l = 0; l < biases.size(); ++l)
    if (biases[l].shape() != biases_[l].shape() || (biases[l].numel() > 0 && biases[l].dtype() != DType::f32))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] layer "
                                             << l << "'s selection bias is " << shape_str(biases[l].shape())
                                             << ", the model's " << shape_str(biases_[l].shape())));
  if (optimizer.kind() != optimizer_.kind())
    throw std::invalid_argument("[moekit::LmTrainer::restore] the checkpoint's optimizer is not the run's");
  if (step < 0 || step > options_.steps)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::LmTrainer::restore] the checkpoint is at step "
                                           << step << ", outside this run's 0.." << options_.steps));
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i].second.nbytes() > 0)
      std::memcpy(mine[i].second.data(), given[i].second.data(), mine[i].second.nbytes());
  for (std::size_t l = 0; l < biases.size(); ++l)
    if (biases_[l].nbytes() > 0) std::memcpy(biases_[l].data(), biases[l].data(), biases_[l].nbytes());
  optimizer_ = optimizer;
  step_ = step;
  rng_ = rng_state;
}

}  // namespace moekit
