// The per-token arithmetic that route() and router_backward() share, so the backward recomputes
// exactly the forward's values and decisions (docs/routing.md, "The pipeline"): step 2's scores,
// step 6's gate values for the score functions that select on raw logits, and the decisions of
// steps 7 (renormalise, and by what) and 8 (scale). Internal.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/activation.hpp"
#include "moekit/routing.hpp"

namespace moekit::detail {

/// Step 2: scores[e] = f(z[e]) for all E experts. For softmax_selected / sigmoid_selected, which
/// select on the raw logits, the logits themselves.
inline void expert_scores(const RouterConfig& cfg, const float* z, float* scores) {
  const std::int64_t E = cfg.num_experts;
  switch (cfg.score_func) {
    case ScoreFunc::softmax:
      kernels::router_softmax(z, E, scores);
      return;
    case ScoreFunc::sigmoid:
      for (std::int64_t e = 0; e < E; ++e) scores[e] = kernels::router_sigmoid(z[e]);
      return;
    case ScoreFunc::sqrt_softplus:
      for (std::int64_t e = 0; e < E; ++e) scores[e] = std::sqrt(kernels::router_softplus(z[e]));
      return;
    case ScoreFunc::softmax_selected:
    case ScoreFunc::sigmoid_selected:
      for (std::int64_t e = 0; e < E; ++e) scores[e] = z[e];
      return;
  }
}

/// Whether the score function takes its gate values from the chosen raw logits (step 6).
inline bool gates_from_selected_logits(const RouterConfig& cfg) {
  return cfg.score_func == ScoreFunc::softmax_selected || cfg.score_func == ScoreFunc::sigmoid_selected;
}

/// Step 6 where gates_from_selected_logits: w[k] = softmax over the K chosen logits, or their
/// sigmoid.
inline void selected_logit_gates(const RouterConfig& cfg, const float* z, const std::int32_t* ids, float* w) {
  const std::int64_t K = cfg.top_k;
  if (cfg.score_func == ScoreFunc::softmax_selected) {
    for (std::int64_t k = 0; k < K; ++k) w[k] = z[ids[k]];
    kernels::router_softmax(w, K, w);
  } else {
    for (std::int64_t k = 0; k < K; ++k) w[k] = kernels::router_sigmoid(z[ids[k]]);
  }
}

/// Step 7's decision for the K gate values w: renormalised (w / denom) or left as they are —
/// `renorm` none, K = 1 under renorm_only_if_k_gt_1, or (guard_zero_sum) a zero or non-finite
/// denominator.
struct RenormDecision {
  bool applies = false;
  float denom = 1.0f;
  bool floored = false;  ///< sum_floor took the floor: the denominator does not depend on w
};

inline RenormDecision renormalisation(const RouterConfig& cfg, const float* w) {
  const std::int64_t K = cfg.top_k;
  RenormDecision d;
  if (cfg.renorm == Renorm::none || (cfg.renorm_only_if_k_gt_1 && K == 1)) return d;
  float sum = 0.0f;
  for (std::int64_t k = 0; k < K; ++k) sum += w[k];
  d.denom = cfg.renorm == Renorm::sum_eps     ? sum + static_cast<float>(cfg.renorm_eps)
            : cfg.renorm == Renorm::sum_floor ? std::max(sum, static_cast<float>(cfg.renorm_eps))
                                              : sum;
  d.floored = cfg.renorm == Renorm::sum_floor && sum < static_cast<float>(cfg.renorm_eps);
  d.applies = !cfg.guard_zero_sum || (d.denom != 0.0f && std::isfinite(d.denom));
  return d;
}

/// Step 8's decision: whether the gate values are multiplied by routed_scaling_factor, given
/// whether step 7 renormalised them.
inline bool scale_applies(const RouterConfig& cfg, bool renormed) {
  return !(cfg.scale_only_without_renorm && renormed) && cfg.routed_scaling_factor != 1.0f;
}

}  // namespace moekit::detail
