// Training an MoE block: the backward of the whole block (docs/training.md, "The gradients moekit computes"), its trainable fp32
// parameters and their gradients. docs/training.md explains the gradients and the choices.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

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
  /// "shared.down_proj", "shared_gate" (kMoeTensorMembers).
  template <class Fn>
  void for_each(Fn&& fn) const;
  /// Bytes of all members.
  std::size_t nbytes() const;
  /// Zero tensors with the shapes of `layer`'s parameters.
  static MoeTensors zeros_like(const MoeLayer& layer);
  /// Zero tensors shaped like `like`'s members (empty where `like`'s are).
  static MoeTensors zeros_like(const MoeTensors& like);
};

/// Every member of MoeTensors with its name, in for_each's order.
struct MoeTensorMember {
  const char* name;
  Tensor MoeTensors::*member;
};
inline constexpr MoeTensorMember kMoeTensorMembers[] = {
    {"router", &MoeTensors::router},
    {"router_bias", &MoeTensors::router_bias},
    {"experts.gate", &MoeTensors::gate},
    {"experts.up", &MoeTensors::up},
    {"experts.down", &MoeTensors::down},
    {"experts.gate_bias", &MoeTensors::gate_bias},
    {"experts.up_bias", &MoeTensors::up_bias},
    {"experts.down_bias", &MoeTensors::down_bias},
    {"shared.gate_proj", &MoeTensors::shared_gate_proj},
    {"shared.up_proj", &MoeTensors::shared_up_proj},
    {"shared.down_proj", &MoeTensors::shared_down_proj},
    {"shared_gate", &MoeTensors::shared_gate},
};

template <class Fn>
void MoeTensors::for_each(Fn&& fn) const {
  for (const MoeTensorMember& m : kMoeTensorMembers) {
    const Tensor& t = this->*(m.member);
    if (t.numel() > 0) fn(std::string(m.name), t);
  }
}

/// An owned f32 copy of `layer`'s parameters: float weights of any dtype or layout (panels
/// included) and quantized ones (MLX affine, MXFP4) widened exactly, to the values the layer's
/// forward multiplies by — so a block can be fine-tuned from a quantized release; the f32 copy
/// trains.
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
/// The same for a process that holds only the routed experts `local_experts` (ascending ids in
/// [0, E), possibly none) — a rank of an expert-parallel run (moekit/dist.hpp): params.gate, up
/// and down are [E_local, ...] in that order; every other tensor (router, expert biases, shared
/// experts) is whole. The other experts' matrices point at one zero matrix of the right shape and
/// are never run here (their owners run them). Throws std::invalid_argument for ids out of order
/// or range, or expert tensors of another count.
MoeLayer make_trainable_layer(const MoeConfig& config, const MoeTensors& params,
                              const Tensor& selection_bias,
                              const std::vector<std::int64_t>& local_experts);

/// Throws std::invalid_argument, saying why, if training `config`'s router is pointless: with
/// K = 1 and weights that are renormalised over the one selected expert (or a softmax over the
/// selected logits) every gate weight is the constant 1, so the router never gets a gradient
/// (Megatron refuses this configuration too).
void check_trainable(const MoeConfig& config);

/// dL/dlogits [T, E] from dL/dweights [T, K] for the routing `ids` of `logits` under `cfg`
/// (docs/training.md, "The gradients moekit computes"): the selection is a constant (straight through); only the gate values carry
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

/// How experts_backward() writes the experts' gradients.
struct ExpertGradOptions {
  /// Add into the gradients already in `grads` instead of overwriting them.
  bool accumulate = false;
  /// The mode the forward ran in (run_experts' `mode`): pre-activations the trace did not keep
  /// are recomputed in it, so they are the forward's bits.
  ComputeMode mode = ComputeMode::exact;
  /// Write gate and up as one fused gate‖up gradient, as transformers stores the parameter:
  /// grads.gate [E, 2F, D] (each expert's gate rows, then its up rows) and grads.gate_bias
  /// [E, 2F]; grads.up and grads.up_bias stay empty. Gated bodies only.
  bool fuse_gate_up = false;
};

/// The routed experts' backward alone, for a routing the caller made: the gradients of
/// run_experts(w, body, x, ids, weights, weight_on_input, y, false, &trace) for dL/dy = `dy`
/// (f32 or bf16 [T, D]). This is what a framework's experts backend needs (transformers'
/// ExpertsInterface routes with its own router and hands moekit ids and weights; moekit.transformers).
/// `x` is the forward's f32 input [T, D], `trace` the forward's. Returns dL/dx [T, D] f32; writes
/// dL/dweights [T, K] f32 into `dweights` and each expert's weight (and bias) gradients into the
/// experts' members of `grads` (gate, up, down and the biases the experts have, or the fused
/// gate‖up of `options`; allocated when empty, otherwise checked against [E, F, D] / [E, D, F] /
/// [E, F] / [E, D] f32, and added to when options.accumulate). Experts without rows get exact
/// zeros. fp32; bit-identical for any thread count. Throws std::invalid_argument for quantized or
/// AMX-packed experts, a trace of another forward, mismatched shapes or dtypes, or a non-finite dy
/// (naming the element); `grads` is untouched then.
Tensor experts_backward(const ExpertWeights& w, const ExpertBody& body, const TensorView& x, const TensorView& ids,
                        const TensorView& weights, bool weight_on_input, const ExpertTrace& trace, const TensorView& dy,
                        MoeTensors& grads, Tensor& dweights, const ExpertGradOptions& options = {});

}  // namespace moekit

namespace moekit {

// ---------------------------------------------------------------------------------------------
// Aux-loss-free load balancing (Wang et al. 2024, Algorithm 1; docs/training.md, "Aux-loss-free balancing")

/// How the selection bias moves once per step: sign: b_i += u · sign(c̄ − c_i) (sign(0) = 0);
/// proportional: b_i += u · (c̄ − c_i) / c̄.
enum class BalanceRule : std::uint8_t { sign, proportional };

/// The bias update rate u as a function of the step (0-based, the step being finished):
/// `rate` until `decay_start`, then linearly to `final_rate` at `decay_end` (if decay_end >
/// decay_start), then `final_rate`; explicit `pieces` (step, rate), ascending, override that
/// (the rate of the last piece whose step <= the current step); from `freeze_step` on (if >= 0)
/// the rate is 0 (DeepSeek-V3 trains with u = 1e-3 and then freezes the bias).
struct RateSchedule {
  double rate = 1e-3;
  std::int64_t decay_start = -1, decay_end = -1;
  double final_rate = 0.0;
  std::vector<std::pair<std::int64_t, double>> pieces;
  std::int64_t freeze_step = -1;

  double at(std::int64_t step) const;
  /// Throws std::invalid_argument for a negative or non-finite rate, unsorted pieces, or
  /// decay_end < decay_start.
  void validate() const;
};

/// Load statistics of one set of expert counts (docs/training.md, "Load metrics").
struct LoadMetrics {
  double max_violation = 0;  ///< (max_i c_i − c̄) / c̄
  std::int64_t dead_experts = 0;  ///< experts with c_i = 0
  double entropy = 0;        ///< −Σ p_i ln p_i of p = c / Σc, in nats (ln E when balanced)
  std::int64_t tokens = 0;   ///< Σ c_i (= T · K)
};
LoadMetrics load_metrics(const std::vector<std::int64_t>& counts);

/// What one balancer update did.
struct BalanceUpdate {
  LoadMetrics load;          ///< of the step's counts (MaxVio_batch, dead experts, entropy)
  double rate = 0;           ///< u used
  double bias_min = 0, bias_mean = 0, bias_max = 0;  ///< after the update
};

/// The loss-free balancer of one MoE block: per-expert counts summed over the micro-batches of a
/// step, then one update of the fp32 selection bias. Only what the caller counts is counted:
/// count the training forwards of a step (count(saved) after forward_train), never evaluation or
/// recomputed forwards (Megatron guards the same way). Under expert/data parallelism the counts
/// are summed over ranks before update() (add_counts), so every rank holds the same bias.
class LoadBalancer {
 public:
  LoadBalancer() = default;
  /// Throws std::invalid_argument for num_experts < 1 or an invalid schedule.
  LoadBalancer(std::int64_t num_experts, BalanceRule rule, RateSchedule rate);

  /// Adds the expert counts of a training forward's routing.
  void count(const SavedForward& saved);
  /// Adds counts gathered elsewhere ([E], e.g. summed over ranks). Throws std::invalid_argument
  /// for a wrong length or a negative count.
  void add_counts(const std::vector<std::int64_t>& counts);
  const std::vector<std::int64_t>& counts() const noexcept { return counts_; }

  /// Applies the rule with u = rate.at(step) to `bias` ([E] f32, in place), resets the counts
  /// and returns what it did. A step with no counted tokens leaves the bias as it is. Throws
  /// std::invalid_argument for a bias of the wrong shape or dtype (counts kept then).
  BalanceUpdate update(const Tensor& bias, std::int64_t step);

  BalanceRule rule() const noexcept { return rule_; }
  const RateSchedule& schedule() const noexcept { return rate_; }
  std::int64_t num_experts() const noexcept { return static_cast<std::int64_t>(counts_.size()); }

 private:
  BalanceRule rule_ = BalanceRule::sign;
  RateSchedule rate_;
  std::vector<std::int64_t> counts_;
};

/// `config` with a selection bias switched on: a family without one (a softmax router) gets one
/// for loss-free balancing, added to the scores for selection only; start it at zeros [E].
MoeConfig with_selection_bias(MoeConfig config);

// ---------------------------------------------------------------------------------------------
// Auxiliary losses (docs/training.md, "Auxiliary losses"), for comparison runs and users who want them

struct AuxLossOptions {
  /// α of the Switch / GShard top-K load loss α · E/(K·T²) · Σ_i (Σ_t p_i(t)) · c_i, with p the
  /// scores normalised over all E (softmax of the logits for softmax routers; s / Σ s for
  /// sigmoid and sqrt-softplus scores). Uniform routing gives exactly α.
  double switch_coef = 0;
  /// α of DeepSeek-V3's sequence-wise loss α Σ_i f_i P_i per sequence, averaged over sequences:
  /// f_i = E/(K·T_s) · #{t : i selected}, P_i = mean_t s_i(t) / Σ_j s_j(t) (unbiased scores).
  double seq_coef = 0;
  /// Token offset of each sequence's first token, ascending, starting at 0 (empty: the whole
  /// batch is one sequence).
  std::vector<std::int64_t> sequence_starts;
  /// c_z of the router z-loss c_z / T · Σ_t (logsumexp z_t)² (ST-MoE).
  double z_coef = 0;
  /// Data parallel: these logits are one part of a batch spread over processes. total_tokens
  /// (> 0): the batch's T, which the switch and z losses are normalised by; total_counts (E
  /// entries): the batch's expert counts c_i for the switch loss; total_sequences (> 0): the
  /// batch's number of sequences, which the seq loss averages over (each sequence whole in one
  /// part). The losses returned are then this part's share (the parts' shares sum to the batch's
  /// loss) and dlogits this part's rows of the batch's gradient. 0 / empty: this call's own.
  std::int64_t total_tokens = 0;
  std::vector<std::int64_t> total_counts;
  std::int64_t total_sequences = 0;
};

struct AuxLosses {
  double switch_loss = 0, seq_loss = 0, z_loss = 0;
  /// [T, E] f32: dL_aux/dlogits (zero where every coefficient is 0), for BackwardOptions.
  Tensor dlogits;
  double total() const noexcept { return switch_loss + seq_loss + z_loss; }
};

/// The auxiliary losses of one forward (logits [T, E] and its routing ids [T, K]) and their
/// gradient with respect to the logits; the counts are constants. Throws std::invalid_argument
/// for a negative or non-finite coefficient, bad sequence starts, or mismatched shapes.
AuxLosses aux_losses(const RouterConfig& cfg, const TensorView& logits, const TensorView& ids,
                     const AuxLossOptions& options);

}  // namespace moekit

namespace moekit {

// ---------------------------------------------------------------------------------------------
// Optimizers, clipping, learning-rate schedules (fp32 state; deterministic element order)

/// Warm-up from 0 to `lr` over `warmup` steps (linear: step s < warmup gets lr · (s + 1) /
/// warmup), then constant, or a cosine or linear decay to `min_lr` at `total_steps`.
struct LrSchedule {
  enum class Decay : std::uint8_t { constant, cosine, linear };
  double lr = 1e-3;
  std::int64_t warmup = 0;
  std::int64_t total_steps = 0;  ///< the decay's end (ignored for constant)
  Decay decay = Decay::cosine;
  double min_lr = 0.0;

  double at(std::int64_t step) const;
  /// Throws std::invalid_argument for a negative or non-finite lr/min_lr, a negative warm-up,
  /// or a decay whose total_steps <= warmup.
  void validate() const;
};

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  ///< decoupled (p -= lr · wd · p), on weight matrices only, never biases
};

struct SgdOptions {
  double momentum = 0.9;       ///< v = momentum · v + g; p -= lr · v
  double weight_decay = 0.0;   ///< added to the gradient (g += wd · p) of weight matrices only
  bool nesterov = false;
};

/// Named f32 tensors in a fixed order: parameters, their gradients, optimizer state.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// `t`'s members (MoeTensors::for_each order and names) with `prefix` before each name; the
/// tensors share `t`'s storage.
NamedTensors named_tensors(const MoeTensors& t, const std::string& prefix = "");

/// AdamW or SGD with momentum over named parameters (one block's MoeTensors, or every tensor of
/// a whole model), fp32 state keyed by name. Weight decay applies to every tensor whose name
/// contains neither "bias" nor "norm" (weight matrices and embeddings, never biases or norm
/// gains).
class Optimizer {
 public:
  enum class Kind : std::uint8_t { adamw, sgd };
  static Optimizer adamw(AdamWOptions options = {});
  static Optimizer sgd(SgdOptions options = {});

  /// One update of every parameter with its gradient at learning rate `lr`. The state is
  /// allocated on the first step. Throws std::invalid_argument if params and grads disagree
  /// (naming the tensor), or lr is negative or non-finite; nothing is updated then.
  void step(MoeTensors& params, const MoeTensors& grads, double lr);
  /// The same over named tensors: `grads` must name the same tensors in the same order, with
  /// the same shapes (f32). The update of each element depends only on its own values, so it
  /// is the same bits whatever else is in the list.
  /// `grad_scale` multiplies every gradient element (rounded to f32) before it is used: the
  /// same bits as clip_grad_norm's scaling followed by step(), without a pass over the
  /// gradients.
  void step(const NamedTensors& params, const NamedTensors& grads, double lr, float grad_scale = 1.0f);

  Kind kind() const noexcept { return kind_; }
  std::int64_t steps() const noexcept { return steps_; }
  const AdamWOptions& adamw_options() const noexcept { return adam_; }
  const SgdOptions& sgd_options() const noexcept { return sgd_; }
  /// The state as named tensors ("m.experts.up", "v.router", ...; SGD: "momentum.*"), for
  /// checkpoints; empty before the first step.
  std::vector<std::pair<std::string, Tensor>> state() const;
  /// Restores state() output and the step count. Throws std::invalid_argument naming a missing,
  /// unexpected or mis-shaped tensor (checked against `params`) before changing anything.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, std::int64_t steps,
                  const MoeTensors& params);
  void load_state(const NamedTensors& state, std::int64_t steps, const NamedTensors& params);

 private:
  Kind kind_ = Kind::adamw;
  AdamWOptions adam_;
  SgdOptions sgd_;
  std::int64_t steps_ = 0;
  std::map<std::string, Tensor> m_, v_;  // Adam moments; SGD: m_ is the momentum buffer
};

/// The global L2 norm of every gradient in `grads` (summed in double, in a fixed order).
double grad_norm(const std::vector<const MoeTensors*>& grads);
/// Scales every gradient so that the global norm is at most `max_norm` (no change if it is
/// already); returns the norm before clipping. Throws std::invalid_argument for max_norm <= 0
/// and std::runtime_error if the norm is not finite (naming nothing changed).
double clip_grad_norm(const std::vector<MoeTensors*>& grads, double max_norm);
/// The same over named gradients (summed in list order).
double grad_norm(const NamedTensors& grads);
/// grad_norm's sum before the square root: Σ over the tensors in list order of each one's Σ x²
/// (in double), for a norm whose parts live in several processes.
double grad_sum_squares(const NamedTensors& grads);
double clip_grad_norm(const NamedTensors& grads, double max_norm);
/// The factor clip_grad_norm scales by for a gradient of norm `norm` (1 if norm <= max_norm).
float clip_factor(double norm, double max_norm);

}  // namespace moekit
