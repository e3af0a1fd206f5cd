// router_backward: dL/dweights -> dL/dlogits, straight through the selection (docs/training.md, "The gradients moekit computes").
// Per token, the forward's weights are recomputed from the logits with route()'s own helpers
// (routing/gates.hpp), so the renormalise-or-not decision (guard_zero_sum, renorm_only_if_k_gt_1)
// is the forward's.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/activation.hpp"
#include "moekit/train.hpp"
#include "routing/gates.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

float sigmoid(float z) { return kernels::router_sigmoid(z); }

struct Scratch {
  std::vector<float> scores, v, dv;
};

void token_backward(const RouterConfig& cfg, const float* z, const float* bias, const std::int32_t* ids,
                    const float* dw, float* dz, Scratch& s) {
  const std::int64_t E = cfg.num_experts, K = cfg.top_k;
  std::fill(dz, dz + E, 0.0f);
  s.scores.resize(static_cast<std::size_t>(E));
  s.v.resize(static_cast<std::size_t>(K));
  s.dv.resize(static_cast<std::size_t>(K));
  // The raw gate values v_k before renormalisation and scale, and the decisions of steps 7 and 8,
  // with route()'s arithmetic (routing/gates.hpp).
  detail::expert_scores(cfg, z, s.scores.data());
  if (detail::gates_from_selected_logits(cfg)) {
    detail::selected_logit_gates(cfg, z, ids, s.v.data());
  } else {
    const bool biased = cfg.weights_from == WeightsFrom::selection_scores && bias != nullptr;
    for (std::int64_t k = 0; k < K; ++k) s.v[k] = s.scores[ids[k]] + (biased ? bias[ids[k]] : 0.0f);
  }
  const detail::RenormDecision renorm = detail::renormalisation(cfg, s.v.data());
  const bool renormed = renorm.applies;
  const float denom = renorm.denom;
  const double c = detail::scale_applies(cfg, renormed) ? static_cast<double>(cfg.routed_scaling_factor) : 1.0;
  // dL/dv: through the scale, then the renormalisation v'_k = v_k / denom.
  if (renormed && renorm.floored) {  // a constant denominator: v'_k = v_k / floor
    for (std::int64_t k = 0; k < K; ++k) s.dv[k] = static_cast<float>(c * dw[k] / denom);
  } else if (renormed) {
    double dot = 0.0;
    for (std::int64_t k = 0; k < K; ++k) dot += c * dw[k] * s.v[k];
    const double inv = 1.0 / denom;
    for (std::int64_t k = 0; k < K; ++k) s.dv[k] = static_cast<float>((c * dw[k] - dot * inv) * inv);
  } else {
    for (std::int64_t k = 0; k < K; ++k) s.dv[k] = static_cast<float>(c * dw[k]);
  }
  // dL/dz through the score function.
  switch (cfg.score_func) {
    case ScoreFunc::softmax: {
      double dot = 0.0;  // Σ_k dv_k p_{ids_k}
      for (std::int64_t k = 0; k < K; ++k) dot += static_cast<double>(s.dv[k]) * s.scores[ids[k]];
      for (std::int64_t e = 0; e < E; ++e) dz[e] = static_cast<float>(-s.scores[e] * dot);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int32_t e = ids[k];
        dz[e] = static_cast<float>(s.scores[e] * (static_cast<double>(s.dv[k]) - dot));
      }
      break;
    }
    case ScoreFunc::sigmoid:
      for (std::int64_t k = 0; k < K; ++k) {
        const float p = s.scores[ids[k]];
        dz[ids[k]] = s.dv[k] * p * (1.0f - p);
      }
      break;
    case ScoreFunc::sqrt_softplus:
      // s = sqrt(softplus(z)): ds/dz = σ(z) / (2 s); 0 where s underflowed to 0.
      for (std::int64_t k = 0; k < K; ++k) {
        const float sv = s.scores[ids[k]];
        dz[ids[k]] = sv > 0.0f ? s.dv[k] * sigmoid(z[ids[k]]) / (2.0f * sv) : 0.0f;
      }
      break;
    case ScoreFunc::softmax_selected: {
      double dot = 0.0;
      for (std::int64_t k = 0; k < K; ++k) dot += static_cast<double>(s.dv[k]) * s.v[k];
      for (std::int64_t k = 0; k < K; ++k)
        dz[ids[k]] = static_cast<float>(s.v[k] * (static_cast<double>(s.dv[k]) - dot));
      break;
    }
    case ScoreFunc::sigmoid_selected:
      for (std::int64_t k = 0; k < K; ++k) dz[ids[k]] = s.dv[k] * s.v[k] * (1.0f - s.v[k]);
      break;
  }
}

}  // namespace

Tensor router_backward(const RouterConfig& cfg, const TensorView& logits, const TensorView& ids,
                       const TensorView& dweights, const TensorView& selection_bias) {
  validate(cfg);
  const std::int64_t E = cfg.num_experts, K = cfg.top_k;
  detail::expect_tensor("router_backward", "logits", logits, {DType::f32}, detail::trailing(E));
  const std::int64_t T = logits.rows();
  Shape routed = logits.shape();
  routed.back() = K;
  detail::expect_tensor("router_backward", "ids", ids, {DType::i32}, routed);
  detail::expect_tensor("router_backward", "dweights", dweights, {DType::f32}, routed);
  if (selection_bias.defined())
    detail::expect_tensor("router_backward", "selection_bias", selection_bias, {DType::f32}, {E});
  const std::int32_t* id = ids.data_as<const std::int32_t>();
  for (std::int64_t i = 0; i < T * K; ++i)
    if (id[i] < 0 || id[i] >= E)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::router_backward] expert id " << id[i] << " at token " << i / K
                                                                                  << ", slot " << i % K
                                                                                  << " outside [0, " << E << ")"));
  Tensor dz(logits.shape(), DType::f32);
  const float* z = logits.data_as<const float>();
  const float* dw = dweights.data_as<const float>();
  const float* b = selection_bias.defined() ? selection_bias.data_as<const float>() : nullptr;
  float* out = dz.data_as<float>();
  detail::parallel_for(T, 16, [&](std::int64_t t0, std::int64_t t1) {
    Scratch s;
    for (std::int64_t t = t0; t < t1; ++t) token_backward(cfg, z + t * E, b, id + t * K, dw + t * K, out + t * E, s);
  });
  return dz;
}

void check_trainable(const MoeConfig& config) {
  const RouterConfig& r = config.router;
  if (r.top_k != 1) return;
  const bool renormed = r.renorm != Renorm::none && !r.renorm_only_if_k_gt_1;
  if (r.score_func == ScoreFunc::softmax_selected || renormed)
    throw std::invalid_argument(MOEKIT_MSG(
        "[moekit::check_trainable] " << config.model_type << " with top_k = 1 "
                                     << (renormed ? "renormalises the one selected weight" : "takes a softmax over the one selected logit")
                                     << ": every gate weight is the constant 1, so the router would never get a gradient; "
                                        "use top_k >= 2 or a router without renormalisation"));
}

}  // namespace moekit
