#include "kernels/activation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// h = silu(gate) · up, vectorised: silu(v) = v · σ(v) with e = exp(-|v|) ∈ [0, 1] (Highway's Exp,
// ≤ 1 ULP, never asked past its range) and σ(v) = 1 / (1 + e) for v ≥ 0, e / (1 + e) below. An e
// below FLT_MIN (v < -87.3, where Exp's denormals are inexact) is taken as 0, so such a v gives
// v · 0 = -0 — what torch's x / (1 + exp(-x)) and the scalar form give there (exp(-v)
// overflows); ±∞ and NaN as they do too. Elementwise: the same bits for any split of the rows.
void Swiglu(const float* gate, const float* up, float* h, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  const auto body = [&](hn::Vec<decltype(d)> v, hn::Vec<decltype(d)> u) {
    const auto x = hn::Exp(d, hn::Neg(hn::Abs(v)));
    const auto e = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, std::numeric_limits<float>::min())), x);
    const auto sig = hn::Div(hn::IfThenElse(hn::Ge(v, hn::Zero(d)), one, e), hn::Add(one, e));
    return hn::Mul(hn::Mul(v, sig), u);
  };
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(body(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, h + i);
  if (i < n) {  // the tail through zero-padded copies (the padding's lanes are discarded)
    const size_t r = static_cast<size_t>(n - i);
    HWY_ALIGN float g[HWY_MAX_BYTES / sizeof(float)] = {}, u[HWY_MAX_BYTES / sizeof(float)] = {},
                    o[HWY_MAX_BYTES / sizeof(float)];
    std::copy_n(gate + i, r, g);
    std::copy_n(up + i, r, u);
    hn::Store(body(hn::Load(d, g), hn::Load(d, u)), d, o);
    std::copy_n(o, r, h + i);
  }
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(Swiglu);

namespace {
inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
inline float silu(float v) { return v * sigmoid(v); }
inline float gelu_erf(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }
inline float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
}
// d/dv of silu(v) = v·σ(v): σ(v)·(1 + v·(1 − σ(v))).
inline float dsilu(float v) {
  const float s = sigmoid(v);
  return s * (1.0f + v * (1.0f - s));
}
inline float dgelu_erf(float v) {
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  return 0.5f * (1.0f + std::erf(v * 0.70710678118654752f)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
}
inline float dgelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  const float t = std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
}
}  // namespace

void apply_body_backward(BodyKind kind, float limit, float alpha, const float* gate, const float* up, const float* dh,
                         float* dgate, float* dup, std::int64_t n) {
  switch (kind) {
    case BodyKind::swiglu:
      for (std::int64_t i = 0; i < n; ++i) {
        const float a = gate[i], b = up[i], d = dh[i];
        dgate[i] = d * b * dsilu(a);
        dup[i] = d * silu(a);
      }
      break;
    case BodyKind::swiglu_clamped:
      for (std::int64_t i = 0; i < n; ++i) {
        const float g = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        const float s = sigmoid(alpha * g), d = dh[i];
        const float dg = d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s));
        const float du = d * g * s;
        dgate[i] = gate[i] <= limit ? dg : 0.0f;
        dup[i] = up[i] >= -limit && up[i] <= limit ? du : 0.0f;
      }
      break;
    case BodyKind::geglu:
      for (std::int64_t i = 0; i < n; ++i) {
        const float a = gate[i], b = up[i], d = dh[i];
        dgate[i] = d * b * dgelu_erf(a);
        dup[i] = d * gelu_erf(a);
      }
      break;
    case BodyKind::geglu_tanh:
      for (std::int64_t i = 0; i < n; ++i) {
        const float a = gate[i], b = up[i], d = dh[i];
        dgate[i] = d * b * dgelu_tanh(a);
        dup[i] = d * gelu_tanh(a);
      }
      break;
    case BodyKind::mlp_relu:
      for (std::int64_t i = 0; i < n; ++i) dup[i] = up[i] > 0.0f ? dh[i] : 0.0f;
      break;
    case BodyKind::mlp_relu2:
      for (std::int64_t i = 0; i < n; ++i) dup[i] = up[i] > 0.0f ? 2.0f * up[i] * dh[i] : 0.0f;
      break;
    case BodyKind::mlp_silu:
      for (std::int64_t i = 0; i < n; ++i) dup[i] = dh[i] * dsilu(up[i]);
      break;
  }
}

void apply_body(BodyKind kind, float limit, float alpha, const float* gate, const float* up, float* h,
                std::int64_t n) {
  switch (kind) {
    case BodyKind::swiglu:
      HWY_DYNAMIC_DISPATCH(Swiglu)(gate, up, h, n);
      break;
    case BodyKind::swiglu_clamped:
      // GPT-OSS: the gate is clamped from above only, the up projection on both sides.
      for (std::int64_t i = 0; i < n; ++i) {
        const float g = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        h[i] = g * sigmoid(alpha * g) * (u + 1.0f);
      }
      break;
    case BodyKind::geglu:
      for (std::int64_t i = 0; i < n; ++i) h[i] = gelu_erf(gate[i]) * up[i];
      break;
    case BodyKind::geglu_tanh:
      for (std::int64_t i = 0; i < n; ++i) h[i] = gelu_tanh(gate[i]) * up[i];
      break;
    case BodyKind::mlp_relu:
      for (std::int64_t i = 0; i < n; ++i) h[i] = std::max(up[i], 0.0f);
      break;
    case BodyKind::mlp_relu2:
      for (std::int64_t i = 0; i < n; ++i) {
        const float r = std::max(up[i], 0.0f);
        h[i] = r * r;
      }
      break;
    case BodyKind::mlp_silu:
      for (std::int64_t i = 0; i < n; ++i) h[i] = silu(up[i]);
      break;
  }
}

void add_row_bias(float* m, std::int64_t rows, std::int64_t cols, const float* bias) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) m[i * cols + j] += bias[j];
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
