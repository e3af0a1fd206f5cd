// Elementwise expert-body activations. Internal; never throw.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moekit/config.hpp"

namespace moekit::kernels {

/// h[i] = act(gate[i], up[i]) for gated bodies, act(up[i]) for plain MLPs (gate unused, may be
/// null). n elements; h may alias gate or up.
void apply_body(BodyKind kind, float limit, float alpha, const float* gate, const float* up, float* h,
                std::int64_t n);

/// The body's backward: from the pre-activations gate, up and dL/dh, dgate[i] = dL/dgate[i] and
/// dup[i] = dL/dup[i] (dgate unused and may be null for plain MLPs). GPT-OSS's clamps pass no
/// gradient where they clamp (gate > limit; |up| > limit), as torch.clamp; ReLU's derivative
/// at 0 is 0. dgate / dup may alias dh.
void apply_body_backward(BodyKind kind, float limit, float alpha, const float* gate, const float* up, const float* dh,
                         float* dgate, float* dup, std::int64_t n);

/// The router's score arithmetic, one definition for route() and its backward (which must
/// recompute route()'s values bit for bit): σ(z), softplus without overflow, and a softmax of n
/// values (max subtracted, sum in index order; `out` may be `in`).
inline float router_sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
inline float router_softplus(float z) { return std::max(z, 0.0f) + std::log1p(std::exp(-std::fabs(z))); }
inline void router_softmax(const float* in, std::int64_t n, float* out) {
  float mx = in[0];
  for (std::int64_t i = 1; i < n; ++i) mx = std::max(mx, in[i]);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(in[i] - mx);
    sum += out[i];
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < n; ++i) out[i] *= inv;
}

/// m[i, j] += bias[j] for a row-major [rows, cols] matrix (the biases of every projection).
void add_row_bias(float* m, std::int64_t rows, std::int64_t cols, const float* bias);

}  // namespace moekit::kernels
