// MLX affine quantization of float weights (docs/formats.md, "Writing"): the inverse of the
// affine format gemm_nt reads. The arithmetic is mlx's CPU quantizer's, step for step in f32
// (mlx/backend/cpu/quantized.cpp, `quantize`), so moekit's codes, scales and biases are the
// ones mlx.core.quantize writes for the same input — tests pin this against mlx's own output.
#pragma once

#include <cstdint>

#include "moekit/tensor.hpp"

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

/// mlx's floating-point quantization modes (mx.quantize(..., mode=...)).
enum class FpMode {
  mxfp4,  ///< e2m1 codes, groups of 32, e8m0 scales
  nvfp4,  ///< e2m1 codes, groups of 16, e4m3 scales
  mxfp8,  ///< e4m3 codes, groups of 32, e8m0 scales
};

/// Quantizes one row of `in` weights (`in` a multiple of the mode's group) as mlx's CPU quantizer
/// does for weights of dtype `dtype` (f32, bf16 or f16; `w` holds values of that dtype widened to
/// f32): its fallback composes array ops evaluated in the weights' dtype, so every step here is
/// rounded to `dtype` as mlx rounds it (mlx.core.quantize, mlx 0.32.4, pinned by the goldens).
/// Per group: m = max |w|; s = m / 6 (4 bits) or m / 448 (8 bits), in `dtype`. e8m0 modes:
/// e = ceil(log2 s) (0 where s = 0), the scale byte e + 127 (as mlx casts it), w / 2^e; nvfp4: the
/// scale byte to_fp8(s), w / from_fp8(byte) (then in f32). 4-bit codes: the index of the nearest of the 16 e2m1 values
/// (the first on a tie: +0 before −0); 8-bit codes: to_fp8 (round to nearest even, saturating at ±448). Writes
/// in·bits/32 words of codes (element 0 in the lowest bits) and in/group scale bytes. The row
/// must be finite (callers check).
void quantize_fp_row(const float* w, std::int64_t in, FpMode mode, DType dtype, std::uint32_t* codes,
                     std::uint8_t* scales);

/// f32 -> e4m3 as mlx's to_fp8: round to nearest even, |x| >= 464 saturating to ±448 (0x7E), a
/// NaN to 0x7E with its sign.
std::uint8_t f32_to_e4m3_saturating(float x);

}  // namespace moekit::kernels
