// Elementwise expert-body activations. Internal; never throw.
#pragma once

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

/// m[i, j] += bias[j] for a row-major [rows, cols] matrix (the biases of every projection).
void add_row_bias(float* m, std::int64_t rows, std::int64_t cols, const float* bias);

}  // namespace moekit::kernels
