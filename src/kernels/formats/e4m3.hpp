// e4m3 (FP8, OCP E4M3FN) weights with a power-of-two scale per group: MXFP8 as mlx writes its
// `mxfp8` mode (docs/formats.md). The format's rules, outside the SIMD code; the kernels' decode is
// e4m3-inl.h.
//
// A row of K weights is K bytes (mlx: U32 words [.., out, in / 4] little-endian, the same bytes),
// each sign (bit 7), exponent (bits 6-3, bias 7), mantissa (bits 2-0); exponent 0 is subnormal
// (m · 2^-9), S.1111.111 is NaN, there are no infinities. Each group of block_cols = 32 inputs of a
// row shares an e8m0 scale 2^(s − 127); the weight is value × scale in fp32, exact (what
// mx.dequantize(mode="mxfp8") computes).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::e4m3 {

inline float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const auto* row = static_cast<const std::uint8_t*>(B.data) + n * B.ld;
  const std::int64_t g = n / B.format.block_rows * B.scale_ld + k / B.format.block_cols;
  return e4m3_to_f32(row[k]) * load_f32(B.scales, B.format.scale_dtype, g);
}

inline std::int64_t row_elements(const WeightFormat&, std::int64_t cols) { return cols; }

inline std::string check(const WeightFormat& f, std::int64_t, std::int64_t cols) {
  if (f.bits != 8) return MOEKIT_MSG("e4m3 elements are 8 bits, got " << f.bits);
  if (f.block_rows != 1) return MOEKIT_MSG("block_rows " << f.block_rows << ": e4m3 groups are one row here");
  if (f.scale_dtype != DType::f8_e8m0)
    return MOEKIT_MSG("e4m3 scales must be f8_e8m0 (MXFP8), got " << dtype_name(f.scale_dtype));
  if (f.block_cols != 32) return MOEKIT_MSG("MXFP8 groups are 32 inputs, got " << f.block_cols);
  if (cols % f.block_cols != 0)
    return MOEKIT_MSG("cols " << cols << " is not a multiple of the group " << f.block_cols);
  if (f.has_bias) return "e4m3 groups have no bias";
  return {};
}

inline std::string describe(const WeightFormat& f) {
  return MOEKIT_MSG("mxfp8 (e4m3, group " << f.block_cols << ", " << dtype_name(f.scale_dtype) << " scales)");
}

inline constexpr FormatTraits kTraits{"e4m3", DType::u8, row_elements, check, describe, decode};

}  // namespace moekit::kernels::formats::e4m3
