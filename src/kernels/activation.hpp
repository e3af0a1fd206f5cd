// Elementwise expert-body activations. Internal; never throw.
#pragma once

#include <cstdint>

#include "moekit/config.hpp"

namespace moekit::kernels {

/// h[i] = act(gate[i], up[i]) for gated bodies, act(up[i]) for plain MLPs (gate unused, may be
/// null). n elements; h may alias gate or up.
void apply_body(BodyKind kind, float limit, float alpha, const float* gate, const float* up, float* h,
                std::int64_t n);

/// m[i, j] += bias[j] for a row-major [rows, cols] matrix (the biases of every projection).
void add_row_bias(float* m, std::int64_t rows, std::int64_t cols, const float* bias);

}  // namespace moekit::kernels
