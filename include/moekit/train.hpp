// Training an MoE block: the backward of the whole block (TRAINING.md §1), its trainable fp32
// parameters and their gradients. docs/training.md explains the gradients and the choices.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "moekit/layer.hpp"
#include "moekit/routing.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

/// The trainable tensors of one MoE block, f32 and stacked: a trainable layer's parameters and,
/// with the same shapes, their gradients. A member is empty where the block has no such part.
/// The selection bias is not among them: it is the balancer's state, never a gradient's.
struct MoeTensors {
  Tensor router;            ///< [E, D]
  Tensor router_bias;       ///< [E] (GPT-OSS)
  Tensor gate;              ///< [E, F, D]; empty for plain-MLP bodies
  Tensor up;                ///< [E, F, D]
  Tensor down;              ///< [E, D, F]
  Tensor gate_bias;         ///< [E, F] (GPT-OSS)
  Tensor up_bias;           ///< [E, F]
  Tensor down_bias;         ///< [E, D]
  Tensor shared_gate_proj;  ///< [S, D], S = config.shared_width
  Tensor shared_up_proj;    ///< [S, D]
  Tensor shared_down_proj;  ///< [D, S]
  Tensor shared_gate;       ///< [1, D] (Qwen2-MoE's shared_expert_gate)

  /// Calls fn(name, tensor) for every non-empty member in the order above, named "router",
  /// "router_bias", "experts.gate", "experts.up", "experts.down", "experts.gate_bias",
  /// "experts.up_bias", "experts.down_bias", "shared.gate_proj", "shared.up_proj",
  /// "shared.down_proj", "shared_gate".
  template <class Fn>
  void for_each(Fn&& fn) const {
    const std::pair<const char*, const Tensor*> all[] = {
        {"router", &router},           {"router_bias", &router_bias},
        {"experts.gate", &gate},       {"experts.up", &up},
        {"experts.down", &down},       {"experts.gate_bias", &gate_bias},
        {"experts.up_bias", &up_bias}, {"experts.down_bias", &down_bias},
        {"shared.gate_proj", &shared_gate_proj}, {"shared.up_proj", &shared_up_proj},
        {"shared.down_proj", &shared_down_proj}, {"shared_gate", &shared_gate}};
    for (const auto& [name, t] : all)
      if (t->numel() > 0) fn(std::string(name), *t);
  }
  /// Bytes of all members.
  std::size_t nbytes() const;
  /// Zero tensors with the shapes of `layer`'s parameters.
  static MoeTensors zeros_like(const MoeLayer& layer);
};

/// An owned f32 copy of `layer`'s parameters (float weights of any dtype or layout, panels
/// included, widened exactly). Throws std::invalid_argument for quantized weights, which have no
/// trainable float form here.
MoeTensors trainable_parameters(const MoeLayer& layer);

/// Fresh parameters for `config` from `seed`: every weight matrix N(0, 1/fan_in) (fan_in = its
/// input width), biases 0. The draws are a fixed function of the seed (splitmix64 + Box-Muller),
/// the same on every platform and thread count. Throws std::invalid_argument for an invalid
/// config (validate(config.router), non-positive sizes).
MoeTensors init_parameters(const MoeConfig& config, std::uint64_t seed);

/// A layer computing with `params` in place (no copy: an optimizer updating `params` changes
/// what the layer computes). `selection_bias` is [E] f32 when config.router.has_selection_bias,
/// else empty. Throws std::invalid_argument as the MoeLayer constructor does.
MoeLayer make_trainable_layer(const MoeConfig& config, const MoeTensors& params, const Tensor& selection_bias = {});

/// Throws std::invalid_argument, saying why, if training `config`'s router is pointless: with
/// K = 1 and weights that are renormalised over the one selected expert (or a softmax over the
/// selected logits) every gate weight is the constant 1, so the router never gets a gradient
/// (Megatron refuses this configuration too).
void check_trainable(const MoeConfig& config);

/// dL/dlogits [T, E] from dL/dweights [T, K] for the routing `ids` of `logits` under `cfg`
/// (TRAINING.md §1): the selection is a constant (straight through); only the gate values carry
/// gradient, through the score function, the renormalisation (taken or skipped per token exactly
/// as route() decided) and the scale. Non-selected experts get gradient only from a softmax over
/// all experts. `selection_bias` as for route() (it enters the gradient only through weights
/// taken from biased scores). Throws std::invalid_argument for mismatched shapes or dtypes.
Tensor router_backward(const RouterConfig& cfg, const TensorView& logits, const TensorView& ids,
                       const TensorView& dweights, const TensorView& selection_bias = {});

struct BackwardOptions {
  /// Add into the gradients already in `grads` (micro-batches of one step) instead of
  /// overwriting them.
  bool accumulate = false;
  /// [T, E] f32 added to dL/dlogits before the router's own backward (auxiliary losses).
  TensorView extra_dlogits;
};

/// The backward of the MoE block for the loss L with dL/dy = `dy` (shaped like the forward's x,
/// f32 or bf16). Returns dL/dx (f32, x's shape) and writes dL/dθ of every parameter into `grads`
/// (empty members are allocated; defined ones must have the parameter's shape): the router weight
/// and bias, every expert's gate/up/down weights and biases (experts that got no rows get exactly
/// zero, at no cost beyond zeroing), the shared experts and the shared gate. fp32 throughout;
/// only routed rows are touched. Bit-identical for any thread count: every weight gradient is a
/// sum over rows in sorted order in fixed chunks. Throws std::invalid_argument for a quantized
/// layer, a `saved` that does not belong to this layer, a wrong dy shape or a non-finite dy
/// (naming the element); `grads` is untouched then.
Tensor backward(const MoeLayer& layer, const SavedForward& saved, const TensorView& dy, MoeTensors& grads,
                const BackwardOptions& options = {});

}  // namespace moekit
