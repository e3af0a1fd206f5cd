// e4m3 (FP8, OCP E4M3FN) weights with a scale per block (docs/formats.md): the block-scaled FP8
// of DeepSeek-V3 and its kin (128 × 128 blocks, f32 or e8m0 scales), compressed-tensors' FP8
// (a scale per row, per tensor, per group or per block) and MXFP8 as mlx writes its `mxfp8` mode
// (groups of 32 inputs, e8m0 scales). The format's rules, outside the SIMD code; the kernels'
// decode is e4m3-inl.h.
//
// A row of K weights is K bytes (mlx: U32 words [.., out, in / 4] little-endian, the same bytes),
// each sign (bit 7), exponent (bits 6-3, bias 7), mantissa (bits 2-0); exponent 0 is subnormal
// (m · 2^-9), S.1111.111 is NaN, there are no infinities. Each block of block_rows × block_cols
// weights shares a scale (f32, bf16, f16 or e8m0 2^(s − 127)); blocks at the right and bottom
// edges may be cut short. The weight is value × scale, one fp32 multiply (what DeepSeek's
// weight_dequant, transformers' fine-grained FP8 dequantization in fp32 and
// mx.dequantize(mode="mxfp8") compute; the value is exact, the product rounds once).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::e4m3 {

inline float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const auto* row = static_cast<const std::uint8_t*>(B.data) + n * B.ld;
  const std::int64_t g = scale_index(B, n, k);
  return round_to(e4m3_to_f32(row[k]) * load_f32(B.scales, B.format.scale_dtype, g), B.format.decode_dtype);
}

inline std::int64_t row_elements(const WeightFormat&, std::int64_t cols) { return cols; }

inline std::string check(const WeightFormat& f, std::int64_t, std::int64_t) {
  if (f.bits != 8) return MOEKIT_MSG("e4m3 elements are 8 bits, got " << f.bits);
  if (f.block_rows < 1 || f.block_cols < 1)
    return MOEKIT_MSG("e4m3 blocks must be at least 1 × 1, got " << f.block_rows << " × " << f.block_cols);
  if (f.scale_dtype != DType::f32 && f.scale_dtype != DType::bf16 && f.scale_dtype != DType::f16 &&
      f.scale_dtype != DType::f8_e8m0)
    return MOEKIT_MSG("e4m3 scales must be f32, bf16, f16 or f8_e8m0, got " << dtype_name(f.scale_dtype));
  if (f.has_bias) return "e4m3 blocks have no bias";
  if (f.decode_dtype != DType::f32 && f.decode_dtype != DType::bf16 && f.decode_dtype != DType::f16)
    return MOEKIT_MSG("e4m3 weights decode to f32, bf16 or f16, got " << dtype_name(f.decode_dtype));
  return {};
}

inline std::string describe(const WeightFormat& f) {
  if (f.block_rows == 1 && f.block_cols == 32 && f.scale_dtype == DType::f8_e8m0)
    return MOEKIT_MSG("mxfp8 (e4m3, group " << f.block_cols << ", " << dtype_name(f.scale_dtype) << " scales)");
  return MOEKIT_MSG(
      "fp8 e4m3, " << f.block_rows << " × " << f.block_cols << " blocks, " << dtype_name(f.scale_dtype) << " scales"
                   << (f.decode_dtype != DType::f32 ? std::string(", decoded in ") + dtype_name(f.decode_dtype) : ""));
}

inline constexpr FormatTraits kTraits{"e4m3", DType::u8, row_elements, check, describe, decode};

}  // namespace moekit::kernels::formats::e4m3
