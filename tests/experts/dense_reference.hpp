// The dense oracle: every expert on every token, masked by the routing (the seed library's
// method), in double precision from the same stored weights. Independent of src/experts.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "moekit/experts.hpp"

namespace moekit::testing {

inline double load_weight(const ExpertMatrix& m, std::int64_t e, std::int64_t r, std::int64_t c) {
  const std::int64_t i = r * m.row_stride + c;
  switch (m.dtype) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(m.experts[e])[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(m.experts[e])[i]);
    default:
      return static_cast<const float*>(m.experts[e])[i];
  }
}

inline double act(const ExpertBody& b, double g, double u) {
  const auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  switch (b.kind) {
    case BodyKind::swiglu:
      return g * sig(g) * u;
    case BodyKind::swiglu_clamped: {
      const double gc = std::min<double>(g, b.swiglu_limit);
      const double uc = std::max<double>(-b.swiglu_limit, std::min<double>(u, b.swiglu_limit));
      return gc * sig(b.swiglu_alpha * gc) * (uc + 1.0);
    }
    case BodyKind::geglu:
      return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))) * u;
    case BodyKind::geglu_tanh:
      return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
    case BodyKind::mlp_relu:
      return std::max(u, 0.0);
    case BodyKind::mlp_relu2:
      return std::max(u, 0.0) * std::max(u, 0.0);
    case BodyKind::mlp_silu:
      return u * sig(u);
  }
  return 0.0;
}

/// out[D] = expert e applied to x[D]; also accumulates sum of |terms| into mag for tolerances.
inline void expert_dense(const ExpertWeights& w, const ExpertBody& body, std::int64_t e, const double* x,
                         double* out) {
  const std::int64_t D = w.hidden_size(), F = w.width();
  std::vector<double> h(static_cast<std::size_t>(F));
  for (std::int64_t f = 0; f < F; ++f) {
    double u = 0, g = 0;
    for (std::int64_t d = 0; d < D; ++d) {
      u += load_weight(w.up, e, f, d) * x[d];
      if (w.gate.defined()) g += load_weight(w.gate, e, f, d) * x[d];
    }
    if (w.up_bias.numel()) u += w.up_bias.data_as<const float>()[e * F + f];
    if (w.gate_bias.numel()) g += w.gate_bias.data_as<const float>()[e * F + f];
    h[f] = act(body, g, u);
  }
  for (std::int64_t d = 0; d < D; ++d) {
    double acc = 0;
    for (std::int64_t f = 0; f < F; ++f) acc += load_weight(w.down, e, d, f) * h[f];
    if (w.down_bias.numel()) acc += w.down_bias.data_as<const float>()[e * D + d];
    out[d] = acc;
  }
}

/// y [T, D] (double) = Σ_e mask(t, e) · expert_e(x_t), every expert on every token.
inline std::vector<double> dense_moe(const ExpertWeights& w, const ExpertBody& body, const float* x, std::int64_t T,
                                     const std::int32_t* ids, const float* weights, std::int64_t K,
                                     bool weight_on_input) {
  const std::int64_t D = w.hidden_size(), E = w.num_experts();
  std::vector<double> y(static_cast<std::size_t>(T * D), 0.0), xin(static_cast<std::size_t>(D)),
      out(static_cast<std::size_t>(D));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t e = 0; e < E; ++e) {
      double mask = 0.0;
      bool chosen = false;
      for (std::int64_t k = 0; k < K; ++k)
        if (ids[t * K + k] == e) {
          mask = weights[t * K + k];
          chosen = true;
        }
      for (std::int64_t d = 0; d < D; ++d) xin[d] = x[t * D + d] * (weight_on_input ? mask : 1.0);
      expert_dense(w, body, e, xin.data(), out.data());
      if (!chosen) continue;  // masked: contributes exactly 0
      for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += (weight_on_input ? 1.0 : mask) * out[d];
    }
  }
  return y;
}

}  // namespace moekit::testing
