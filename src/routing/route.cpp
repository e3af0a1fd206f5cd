// route(): logits -> (ids, weights), docs/routing.md, "The pipeline", steps 2–8, one token at a time.
// Each token's result depends only on its own row, so splitting tokens over threads cannot
// change a bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/gemm.hpp"
#include "moekit/routing.hpp"
#include "routing/gates.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Descending by value, ties to the lower index: the one ordering used for groups and experts.
struct ByScore {
  const float* v;
  bool operator()(std::int32_t a, std::int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Working buffers for one token, reused across the tokens of a chunk.
struct Scratch {
  std::vector<float> scores, sel, group_score;
  std::vector<std::int32_t> order, group_order;
  std::vector<char> group_kept;
};

void route_token(const RouterConfig& cfg, const float* z, const float* bias, Scratch& s, std::int32_t* ids,
                 float* w) {
  const std::int64_t E = cfg.num_experts;
  const std::int64_t K = cfg.top_k;
  s.scores.resize(static_cast<std::size_t>(E));
  detail::expert_scores(cfg, z, s.scores.data());
  s.sel = s.scores;
  if (bias != nullptr) {
    for (std::int64_t e = 0; e < E; ++e) s.sel[e] += bias[e];
  }

  s.order.resize(static_cast<std::size_t>(E));
  std::iota(s.order.begin(), s.order.end(), 0);
  std::int64_t candidates = E;

  if (cfg.group_mode != GroupMode::none && cfg.topk_group < cfg.n_group) {
    const std::int64_t G = cfg.n_group;
    const std::int64_t per = E / G;
    s.group_score.resize(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) {
      const float* v = s.sel.data() + g * per;
      if (cfg.group_mode == GroupMode::max) {
        s.group_score[g] = *std::max_element(v, v + per);
      } else {  // sum of the two largest
        float a = kNegInf, b = kNegInf;
        for (std::int64_t i = 0; i < per; ++i) {
          if (v[i] > a) {
            b = a;
            a = v[i];
          } else if (v[i] > b) {
            b = v[i];
          }
        }
        s.group_score[g] = a + b;
      }
    }
    s.group_order.resize(static_cast<std::size_t>(G));
    std::iota(s.group_order.begin(), s.group_order.end(), 0);
    std::partial_sort(s.group_order.begin(), s.group_order.begin() + cfg.topk_group, s.group_order.end(),
                      ByScore{s.group_score.data()});
    s.group_kept.assign(static_cast<std::size_t>(G), 0);
    for (std::int64_t i = 0; i < cfg.topk_group; ++i) s.group_kept[s.group_order[i]] = 1;
    if (cfg.mask_fill == MaskFill::legacy_zero) {
      for (std::int64_t e = 0; e < E; ++e)
        if (!s.group_kept[e / per]) s.sel[e] = 0.0f;
    } else {
      // -inf: dropped experts are simply not candidates.
      candidates = 0;
      for (std::int64_t e = 0; e < E; ++e)
        if (s.group_kept[e / per]) s.order[candidates++] = static_cast<std::int32_t>(e);
    }
  }

  std::partial_sort(s.order.begin(), s.order.begin() + K, s.order.begin() + candidates, ByScore{s.sel.data()});
  for (std::int64_t k = 0; k < K; ++k) ids[k] = s.order[k];

  if (detail::gates_from_selected_logits(cfg)) {
    detail::selected_logit_gates(cfg, z, ids, w);
  } else {
    const std::vector<float>& src = cfg.weights_from == WeightsFrom::scores ? s.scores : s.sel;
    for (std::int64_t k = 0; k < K; ++k) w[k] = src[ids[k]];
  }

  const detail::RenormDecision renorm = detail::renormalisation(cfg, w);
  if (renorm.applies)
    for (std::int64_t k = 0; k < K; ++k) w[k] /= renorm.denom;
  if (detail::scale_applies(cfg, renorm.applies))
    for (std::int64_t k = 0; k < K; ++k) w[k] *= cfg.routed_scaling_factor;
}

void check_inputs(const RouterConfig& cfg, const TensorView& logits, const TensorView& bias) {
  validate(cfg);
  detail::expect_tensor("route", "logits", logits, {DType::f32}, detail::trailing(cfg.num_experts));
  if (cfg.has_selection_bias) {
    if (!bias.defined())
      throw std::invalid_argument("[moekit::route] config has_selection_bias but no selection_bias was given");
    detail::expect_tensor("route", "selection_bias", bias, {DType::f32}, {cfg.num_experts},
                          "a bf16 bias collapses selections");
    const float* b = bias.data_as<const float>();
    for (std::int64_t e = 0; e < cfg.num_experts; ++e)
      if (!std::isfinite(b[e]))
        throw std::invalid_argument(MOEKIT_MSG("[moekit::route] selection_bias[" << e << "] is " << b[e]));
  } else if (bias.defined()) {
    throw std::invalid_argument("[moekit::route] selection_bias given but config.has_selection_bias is false");
  }
  const float* z = logits.data_as<const float>();
  const std::int64_t n = logits.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(z[i])) {
      throw std::invalid_argument(MOEKIT_MSG("[moekit::route] non-finite logit " << z[i] << " at token "
                                                                                 << i / cfg.num_experts << ", expert "
                                                                                 << i % cfg.num_experts));
    }
  }
}

Shape routed_shape(const TensorView& logits, std::int64_t K) {
  Shape s = logits.shape();
  s.back() = K;
  return s;
}

void route_checked(const RouterConfig& cfg, const TensorView& logits, const TensorView& bias, std::int32_t* ids,
                   float* w) {
  const std::int64_t T = logits.rows();
  const std::int64_t E = cfg.num_experts;
  const std::int64_t K = cfg.top_k;
  const float* z = logits.data_as<const float>();
  const float* b = cfg.has_selection_bias ? bias.data_as<const float>() : nullptr;
  detail::parallel_for(T, 16, [&](std::int64_t t0, std::int64_t t1) {
    Scratch s;
    for (std::int64_t t = t0; t < t1; ++t) route_token(cfg, z + t * E, b, s, ids + t * K, w + t * K);
  });
}

}  // namespace

void route_into(const RouterConfig& cfg, const TensorView& logits, const TensorView& selection_bias,
                const TensorView& ids, const TensorView& weights) {
  check_inputs(cfg, logits, selection_bias);
  const Shape expect = routed_shape(logits, cfg.top_k);
  detail::expect_tensor("route_into", "ids", ids, {DType::i32}, expect);
  detail::expect_tensor("route_into", "weights", weights, {DType::f32}, expect);
  route_checked(cfg, logits, selection_bias, ids.data_as<std::int32_t>(), weights.data_as<float>());
}

Routing route(const RouterConfig& cfg, const TensorView& logits, const TensorView& selection_bias) {
  check_inputs(cfg, logits, selection_bias);
  const Shape shape = routed_shape(logits, cfg.top_k);
  Routing r{Tensor(shape, DType::i32), Tensor(shape, DType::f32)};
  route_checked(cfg, logits, selection_bias, r.ids.data_as<std::int32_t>(), r.weights.data_as<float>());
  return r;
}

Tensor router_logits(const TensorView& x, const TensorView& w_router, const TensorView& bias) {
  detail::expect_tensor("router_logits", "x", x, {DType::f32, DType::bf16}, detail::trailing("D"));
  detail::expect_tensor("router_logits", "w_router", w_router, {DType::f32, DType::bf16}, {"E", "D"});
  const std::int64_t D = x.dim(-1);
  const std::int64_t E = w_router.dim(0);
  if (w_router.dim(1) != D)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::router_logits] x has D = " << D << " but w_router is "
                                                                               << shape_str(w_router.shape())));
  if (bias.defined()) detail::expect_tensor("router_logits", "bias", bias, {DType::f32}, {E});
  Shape out_shape = x.shape();
  out_shape.back() = E;
  Tensor out(out_shape, DType::f32);
  const std::int64_t T = x.rows();
  Tensor x32;
  const float* a = x.data_as<const float>();
  if (x.dtype() != DType::f32) {
    x32 = to_dtype(x, DType::f32);
    a = x32.data_as<const float>();
  }
  kernels::gemm_nt({a, D}, {w_router.data(), w_router.dtype(), D}, {out.data_as<float>(), E}, T, E, D);
  if (bias.defined()) kernels::add_row_bias(out.data_as<float>(), T, E, bias.data_as<const float>());
  return out;
}

std::vector<std::int64_t> expert_counts(const TensorView& ids, std::int64_t num_experts) {
  detail::expect_tensor("expert_counts", "ids", ids, {DType::i32}, detail::ShapeSpec({}, true));
  if (num_experts < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::expert_counts] num_experts (" << num_experts << ") must be >= 1"));
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_experts), 0);
  const std::int32_t* p = ids.data_as<const std::int32_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    if (p[i] < 0 || p[i] >= num_experts)
      throw std::out_of_range(MOEKIT_MSG("[moekit::expert_counts] id " << p[i] << " at position " << i
                                                                     << " outside [0, " << num_experts << ")"));
    ++counts[static_cast<std::size_t>(p[i])];
  }
  return counts;
}

double max_violation(const std::vector<std::int64_t>& counts) {
  if (counts.empty()) return 0.0;
  std::int64_t total = 0, mx = 0;
  for (auto c : counts) {
    total += c;
    mx = std::max(mx, c);
  }
  if (total == 0) return 0.0;
  const double mean = static_cast<double>(total) / static_cast<double>(counts.size());
  return (static_cast<double>(mx) - mean) / mean;
}

}  // namespace moekit
