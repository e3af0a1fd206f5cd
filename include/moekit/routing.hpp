// Routing: which K experts each token goes to, and with what weight (docs/routing.md, "The pipeline").
// Every family is one RouterConfig; nothing here knows model names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

/// How router logits become scores (docs/routing.md, "The pipeline", steps 2 and 6).
enum class ScoreFunc : std::uint8_t {
  softmax,           ///< scores = softmax over all E experts (Qwen, OLMoE, Mixtral, DeepSeek-V2)
  sigmoid,           ///< scores = sigmoid(logit) (DeepSeek-V3 family, MiniMax-M2)
  sqrt_softplus,     ///< scores = sqrt(softplus(logit))
  softmax_selected,  ///< select on raw logits; weights = softmax over the K selected logits (GPT-OSS)
  sigmoid_selected,  ///< select on raw logits; weights = sigmoid of each selected logit (Llama-4)
};

/// Group-limited selection (docs/routing.md, "The pipeline", step 4).
enum class GroupMode : std::uint8_t {
  none,      ///< plain top-K over all experts
  max,       ///< group score = max of its selection scores (DeepSeek-V2 group_limited_greedy)
  top2_sum,  ///< group score = sum of its two best selection scores (DeepSeek-V3 noaux_tc)
};

/// What dropped groups' experts are set to before top-K.
enum class MaskFill : std::uint8_t {
  neg_inf,      ///< -inf: they can never be chosen (the reference semantics; moekit's default)
  legacy_zero,  ///< 0.0: reproduces mlx-lm / old HF bit for bit; wrong when biased scores go negative
};

/// Which scores the weights are gathered from (step 6).
enum class WeightsFrom : std::uint8_t {
  scores,            ///< the unbiased scores (every reference family)
  selection_scores,  ///< scores + selection bias (reproduces implementations that weight by the
                     ///< biased score; no preset uses it)
};

/// Renormalisation of the K weights (step 7).
enum class Renorm : std::uint8_t {
  none,
  sum,      ///< w /= sum(w)          (Qwen, OLMoE, Mixtral)
  sum_eps,  ///< w /= sum(w) + 1e-20  (DeepSeek, MiniMax)
  /// w /= max(sum(w), renorm_eps): llama.cpp's norm_w, which clamps the sum below at the
  /// smallest normal f16, 6.103515625e-5 (GGUF models).
  sum_floor,
};

/// Every routing knob of docs/routing.md, "The pipeline" as data. Defaults are plain softmax top-K.
struct RouterConfig {
  std::int64_t num_experts = 0;  ///< E
  std::int64_t top_k = 1;        ///< K, in [1, E]
  ScoreFunc score_func = ScoreFunc::softmax;

  /// The router linear has a bias `[E]` added to the logits (GPT-OSS). Applied by
  /// router_logits(); route() receives logits that already include it.
  bool has_router_bias = false;
  /// A selection bias `[E]` (e_score_correction_bias) is added, in fp32, to the scores used for
  /// selection only; it never enters the weights (unless weights_from = selection_scores).
  bool has_selection_bias = false;

  GroupMode group_mode = GroupMode::none;
  std::int64_t n_group = 1;     ///< G; E % G == 0
  std::int64_t topk_group = 1;  ///< Kg, in [1, G]
  MaskFill mask_fill = MaskFill::neg_inf;

  WeightsFrom weights_from = WeightsFrom::scores;
  Renorm renorm = Renorm::none;
  bool renorm_only_if_k_gt_1 = false;  ///< skip renormalisation when K == 1 (mlx-lm, DeepSeek-V2)
  /// A zero or non-finite weight sum leaves the weights unrenormalised instead of producing
  /// NaN/Inf. Turning it off reproduces the raw division.
  bool guard_zero_sum = true;
  double renorm_eps = 1e-20;  ///< the epsilon of Renorm::sum_eps; the floor of Renorm::sum_floor

  float routed_scaling_factor = 1.0f;  ///< w *= rsf, applied exactly once
  /// Apply the scale only when no renormalisation happened (DeepSeek-V2's own reference code).
  bool scale_only_without_renorm = false;

  /// Llama-4: the weight multiplies the expert *input* instead of its output. Routing itself is
  /// unaffected; the layer reads this flag.
  bool weight_on_input = false;
};

/// Throws std::invalid_argument naming the field and values if `cfg` is inconsistent:
/// E < 1, top_k outside [1, E], n_group < 1, E % n_group != 0, topk_group outside [1, n_group],
/// top2_sum with fewer than 2 experts per group, topk_group * (E / n_group) < top_k,
/// a non-finite or negative routed_scaling_factor, renorm_eps < 0.
void validate(const RouterConfig& cfg);

/// Sets one knob by name, for command lines and golden files: `mask_fill` (neg_inf |
/// legacy_zero), `renorm` (none | sum | sum_eps | sum_floor), `renorm_only_if_k_gt_1`,
/// `scale_only_without_renorm`, `guard_zero_sum` (true | false), `routed_scaling_factor` (a
/// number). Throws std::invalid_argument naming the key and value (listing the keys or values
/// accepted). The config is unchanged on a throw; call validate() afterwards.
void set_router_knob(RouterConfig& cfg, const std::string& key, const std::string& value);

/// Human-readable one-line summary of the knobs (for `moekit inspect` and logs).
std::string describe(const RouterConfig& cfg);

/// The routing of T tokens. Slots are ordered by descending selection score, ties to the lower
/// expert id.
struct Routing {
  Tensor ids;      ///< [..., K] int32, K distinct experts per token
  Tensor weights;  ///< [..., K] f32
};

/// Routes `logits` ([..., E], f32) under `cfg`.
/// `selection_bias` is `[E]` f32 when cfg.has_selection_bias, else must be undefined.
/// NaN/Inf policy: any non-finite logit or bias element is rejected with std::invalid_argument
/// naming the token and expert; nothing is computed.
/// Throws std::invalid_argument for an invalid config, a wrong shape or dtype.
Routing route(const RouterConfig& cfg, const TensorView& logits, const TensorView& selection_bias = {});

/// As route(), writing into caller-provided `ids` ([..., K] i32) and `weights` ([..., K] f32).
/// Everything is validated first; on a throw the outputs are untouched.
void route_into(const RouterConfig& cfg, const TensorView& logits, const TensorView& selection_bias,
                const TensorView& ids, const TensorView& weights);

/// The router GEMM: logits = x · W_rᵀ (+ bias), fp32 accumulation and fp32 output.
/// x [..., D] f32 or bf16; w_router [E, D] f32 or bf16; bias [E] f32 or undefined.
/// Returns [..., E] f32. Throws std::invalid_argument on shape/dtype mismatch.
Tensor router_logits(const TensorView& x, const TensorView& w_router, const TensorView& bias = {});

/// Per-expert token counts of a routing: counts[e] = number of (token, slot) pairs on e.
/// ids [..., K] i32 with values in [0, E). Throws std::out_of_range for an id outside [0, E).
std::vector<std::int64_t> expert_counts(const TensorView& ids, std::int64_t num_experts);

/// MaxVio = (max_e c_e - mean) / mean with mean = sum(c) / E (docs/training.md, "Load metrics"). 0 for no tokens.
double max_violation(const std::vector<std::int64_t>& counts);

}  // namespace moekit
