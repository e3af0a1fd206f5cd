// A plain scalar router, written independently of src/routing for property tests: full sorts,
// explicit loops, no shared helpers. Same semantics as docs/routing.md, "The pipeline".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "moekit/routing.hpp"

namespace moekit::testing {

struct RefRoute {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

inline RefRoute reference_route_token(const RouterConfig& c, const float* z, const float* bias) {
  const int E = static_cast<int>(c.num_experts), K = static_cast<int>(c.top_k);
  std::vector<float> s(z, z + E);
  if (c.score_func == ScoreFunc::softmax) {
    float m = *std::max_element(s.begin(), s.end()), sum = 0;
    for (auto& v : s) sum += (v = std::exp(v - m));
    for (auto& v : s) v /= sum;
  } else if (c.score_func == ScoreFunc::sigmoid) {
    for (auto& v : s) v = 1.0f / (1.0f + std::exp(-v));
  } else if (c.score_func == ScoreFunc::sqrt_softplus) {
    for (auto& v : s) v = std::sqrt(std::log1p(std::exp(v)));
  }
  std::vector<float> sel = s;
  if (bias) for (int e = 0; e < E; ++e) sel[e] += bias[e];
  std::vector<bool> allowed(E, true);
  if (c.group_mode != GroupMode::none) {
    const int G = static_cast<int>(c.n_group), per = E / G;
    std::vector<float> gs(G);
    for (int g = 0; g < G; ++g) {
      std::vector<float> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[g] = c.group_mode == GroupMode::max ? v[0] : v[0] + v[1];
    }
    std::vector<int> go(G);
    std::iota(go.begin(), go.end(), 0);
    std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gs[a] > gs[b]; });
    std::vector<bool> keep(G, false);
    for (int i = 0; i < c.topk_group; ++i) keep[go[i]] = true;
    for (int e = 0; e < E; ++e) {
      if (keep[e / per]) continue;
      if (c.mask_fill == MaskFill::legacy_zero) sel[e] = 0.0f;
      else allowed[e] = false;
    }
  }
  std::vector<int> order;
  for (int e = 0; e < E; ++e) if (allowed[e]) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  RefRoute r;
  r.ids.assign(order.begin(), order.begin() + K);
  for (int k = 0; k < K; ++k) {
    const int e = r.ids[k];
    if (c.score_func == ScoreFunc::softmax_selected) r.weights.push_back(z[e]);
    else if (c.score_func == ScoreFunc::sigmoid_selected) r.weights.push_back(1.0f / (1.0f + std::exp(-z[e])));
    else r.weights.push_back(c.weights_from == WeightsFrom::scores ? s[e] : sel[e]);
  }
  if (c.score_func == ScoreFunc::softmax_selected) {
    float m = *std::max_element(r.weights.begin(), r.weights.end()), sum = 0;
    for (auto& v : r.weights) sum += (v = std::exp(v - m));
    for (auto& v : r.weights) v /= sum;
  }
  bool renormed = false;
  if (c.renorm != Renorm::none && !(c.renorm_only_if_k_gt_1 && K == 1)) {
    float sum = 0;
    for (float v : r.weights) sum += v;
    if (c.renorm == Renorm::sum_eps) sum += static_cast<float>(c.renorm_eps);
    if (!c.guard_zero_sum || (sum != 0.0f && std::isfinite(sum))) {
      for (auto& v : r.weights) v /= sum;
      renormed = true;
    }
  }
  if (!(c.scale_only_without_renorm && renormed))
    for (auto& v : r.weights) v *= c.routed_scaling_factor;
  return r;
}

}  // namespace moekit::testing
