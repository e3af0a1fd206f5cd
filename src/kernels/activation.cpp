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

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// σ(v), vectorised, for SwiGLU: e = exp(-|v|) ∈ [0, 1] (Highway's Exp, ≤ 1 ULP), σ = 1 / (1 + e)
// for v ≥ 0 and e / (1 + e) below. An e below FLT_MIN (|v| past 87.34) is taken as 0: σ = 0
// there, as torch's 1 / (1 + exp(-x)) and the scalar form give (exp(-v) overflows); σ(+∞) = 1,
// σ(-∞) = 0; σ(NaN) = 0, and the NaN reaches the result through the v that multiplies σ.
// Exp is never asked for a denormal result: x86 computes those with microcode assists, which
// made a vector holding one 5-6 times slower (large gate pre-activations, docs/performance.md),
// and they are flushed to 0 anyway. A vector whose |v| are all ≤ 87 (exp(-87) is normal; the
// common case by far for a trained model's gates) takes Exp as it is. Any other vector takes Exp
// on |v| capped at 87, a second Exp for the lanes in (87, 87.5] (whose e may still be normal)
// when it holds one, and e = 0 past 87.5 (exp(-87.5) ≈ 0.85 FLT_MIN), for ±∞ and for NaN. The same bits as Exp on
// every |v| with the denormals flushed afterwards (compared on every float on the AVX3 and AVX2
// targets, on |v| in [80, 110], ±∞ and NaN on SSE4 and the scalar one), and Exp's argument stays
// in its range (it converts it to an integer, which for NaN or -∞ is undefined behaviour on
// Highway's scalar target).
HWY_INLINE VF Sigmoid(DF d, VF v) {
  const VF one = hn::Set(d, 1.0f);
  const VF a = hn::Abs(v), normal = hn::Set(d, 87.0f);
  const auto low = hn::Le(a, normal);  // false for NaN
  VF e;
  if (HWY_LIKELY(hn::AllTrue(d, low))) {
    e = hn::Exp(d, hn::Neg(a));  // all normal: exp(-87) ≈ 1.4 FLT_MIN
  } else {
    const auto near = hn::And(hn::Gt(a, normal), hn::Le(a, hn::Set(d, 87.5f)));  // e may be normal
    VF x = hn::Exp(d, hn::Neg(hn::IfThenElse(low, a, normal)));
    if (!hn::AllFalse(d, near)) x = hn::IfThenElse(near, hn::Exp(d, hn::Neg(hn::IfThenElse(near, a, normal))), x);
    e = hn::IfThenElseZero(hn::And(hn::Or(low, near), hn::Ge(x, hn::Set(d, std::numeric_limits<float>::min()))), x);
  }
  return hn::Div(hn::IfThenElse(hn::Ge(v, hn::Zero(d)), one, e), hn::Add(one, e));
}

// f(vector index i, lanes) over n elements: whole vectors, then the tail (fewer lanes valid).
// Elementwise, so the same bits for any split of the rows.
template <class F>
HWY_INLINE void Elementwise(int64_t n, const F& f) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + L <= n; i += L) f(i, L);
  if (i < n) f(i, n - i);
}

// Loads `lanes` floats (a tail through a zero-padded copy) / stores them.
HWY_INLINE VF Load(DF d, const float* p, int64_t lanes) {
  if (lanes == static_cast<int64_t>(hn::Lanes(d))) return hn::LoadU(d, p);
  HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
  std::copy_n(p, lanes, buf);
  return hn::Load(d, buf);
}
HWY_INLINE void Store(DF d, VF v, float* p, int64_t lanes) {
  if (lanes == static_cast<int64_t>(hn::Lanes(d))) return hn::StoreU(v, d, p);
  HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, buf);
  std::copy_n(buf, lanes, p);
}

// h = silu(gate) · up.
void Swiglu(const float* gate, const float* up, float* h, int64_t n) {
  const DF d;
  Elementwise(n, [&](int64_t i, int64_t lanes) {
    const VF v = Load(d, gate + i, lanes), u = Load(d, up + i, lanes);
    Store(d, hn::Mul(hn::Mul(v, Sigmoid(d, v)), u), h + i, lanes);
  });
}

// dgate = dh · up · silu'(gate), dup = dh · silu(gate), silu'(v) = σ(1 + v(1 − σ)); every input
// of an element is loaded before its outputs are stored (dgate / dup may alias dh).
void SwigluBackward(const float* gate, const float* up, const float* dh, float* dgate, float* dup, int64_t n) {
  const DF d;
  const VF one = hn::Set(d, 1.0f);
  Elementwise(n, [&](int64_t i, int64_t lanes) {
    const VF a = Load(d, gate + i, lanes), b = Load(d, up + i, lanes), g = Load(d, dh + i, lanes);
    const VF s = Sigmoid(d, a);
    const VF ds = hn::Mul(s, hn::Add(one, hn::Mul(a, hn::Sub(one, s))));
    Store(d, hn::Mul(hn::Mul(g, b), ds), dgate + i, lanes);
    Store(d, hn::Mul(g, hn::Mul(a, s)), dup + i, lanes);
  });
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(Swiglu);
HWY_EXPORT(SwigluBackward);

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
      HWY_DYNAMIC_DISPATCH(SwigluBackward)(gate, up, dh, dgate, dup, n);
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
