// The parts of LmTrainer that the training loop (trainer.cpp) and the whole-model state of an
// expert-parallel run (trainer_state.cpp) share: which block tensors are the routed experts'
// matrices, and one rank's share of them. Internal to src/lm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/lm_train.hpp"

namespace moekit::lm_detail {

// The routed experts' matrices of a block (the tensors expert parallelism splits by owner): the
// entries of kMoeTensorMembers (their members and their names in LmParams::named()) that hold one
// matrix per expert.
inline constexpr MoeTensorMember kRoutedMatrices[] = {kMoeTensorMembers[2], kMoeTensorMembers[3], kMoeTensorMembers[4]};
static_assert(kRoutedMatrices[0].member == &MoeTensors::gate && kRoutedMatrices[1].member == &MoeTensors::up &&
                  kRoutedMatrices[2].member == &MoeTensors::down,
              "kRoutedMatrices: the gate, up and down entries of kMoeTensorMembers");

constexpr bool is_routed(Tensor MoeTensors::*m) {
  for (const MoeTensorMember& r : kRoutedMatrices)
    if (r.member == m) return true;
  return false;
}

inline Optimizer make_optimizer(const LmTrainOptions& o) {
  return o.optimizer == Optimizer::Kind::adamw ? Optimizer::adamw(o.adamw) : Optimizer::sgd(o.sgd);
}

// Rows `ids` of t's first dimension (a copy): one rank's experts of a stacked [E, ...] tensor.
Tensor take_experts(const Tensor& t, const std::vector<std::int64_t>& ids);

// Whether a named tensor (a parameter's or its optimizer state's: "layers.3.experts.up",
// "m.layers.3.experts.up") is a routed matrix.
bool is_routed_matrix(const std::string& name);

// `p` with every block's routed matrices cut to the experts `ids` (nullptr: unchanged).
LmParams local_part(LmParams p, const std::vector<std::int64_t>* ids);

}  // namespace moekit::lm_detail
