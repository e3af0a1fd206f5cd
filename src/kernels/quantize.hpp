// MLX affine quantization of float weights (docs/formats.md, "Writing"): the inverse of the
// affine format gemm_nt reads. The arithmetic is mlx's CPU quantizer's, step for step in f32
// (mlx/backend/cpu/quantized.cpp, `quantize`), so moekit's codes, scales and biases are the
// ones mlx.core.quantize writes for the same input — tests pin this against mlx's own output.
#pragma once

#include <cstdint>

namespace moekit::kernels {

/// Quantizes one row of `in` floats (`in` a multiple of `group`; group in {32, 64, 128}; bits in
/// {2, 3, 4, 5, 6, 8}). Per group: w_min, w_max; scale = max((w_max - w_min) / (2^bits - 1), 1e-7),
/// negated unless |w_min| > |w_max|; edge = the endpoint of larger magnitude; q0 = rint(edge /
/// scale); if q0 != 0, scale = edge / q0 and bias = edge, else bias = 0; code = clamp(rint((w -
/// bias) / scale), 0, 2^bits - 1). Writes in·bits/32 words of codes (little-endian bit stream,
/// element 0 in the lowest bits), in/group scales and biases, in f32: the caller rounds them to
/// the stored dtype (the codes are chosen with the unrounded values, as mlx does).
/// The row must be finite (callers check; a NaN would yield arbitrary codes).
void quantize_affine_row(const float* w, std::int64_t in, int bits, int group, std::uint32_t* codes, float* scales,
                         float* biases);

}  // namespace moekit::kernels
