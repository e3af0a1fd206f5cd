// e2m1 (FP4) weights with a scale per group: MXFP4 as OpenAI ships GPT-OSS and as mlx writes its
// `mxfp4` mode (groups of 32, e8m0 scales), and NVFP4 as mlx writes its `nvfp4` mode (groups of
// 16, e4m3 scales; docs/formats.md). The format's rules, outside the SIMD code; the
// kernels' decode is e2m1-inl.h.
//
// A row of K weights is K nibbles, two per byte, element 2j in the low nibble of byte j (GPT-OSS's
// `*_blocks` [.., out, in / 32, 16] U8, and mlx's U32 words [.., out, in / 8] little-endian, are the
// same bytes). A nibble is sign (bit 3), exponent (bits 2-1, bias 1), mantissa (bit 0): ±{0, 0.5,
// 1, 1.5, 2, 3, 4, 6}. Each group of block_cols inputs of a row shares a scale: MXFP4 32 inputs
// and e8m0 2^(s − 127), NVFP4 16 inputs and e4m3. The weight is value × scale in fp32, which is
// exact for both (2 significant bits times 1 or 4): what transformers' convert_moe_packed_tensors
// computes with ldexp, and mlx's dequantize.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::e2m1 {

/// The 16 values of an e2m1 nibble (−0 for 8, as the references' tables have it).
alignas(64) inline constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/// Twice the values: integers in [−12, 12] (the int8 fast mode multiplies these and halves the
/// scale, so the weights stay exact).
alignas(16) inline constexpr std::int8_t kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// Nibble k of a row.
inline std::uint32_t code(const std::uint8_t* row, std::int64_t k) { return (row[k / 2] >> (4 * (k & 1))) & 0xFu; }

inline float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const auto* row = static_cast<const std::uint8_t*>(B.data) + n * B.ld;
  const std::int64_t g = scale_index(B, n, k);
  return kValues[code(row, k)] * load_f32(B.scales, B.format.scale_dtype, g);
}

inline std::int64_t row_elements(const WeightFormat&, std::int64_t cols) { return cols / 2; }

inline std::string check(const WeightFormat& f, std::int64_t, std::int64_t cols) {
  if (f.bits != 4) return MOEKIT_MSG("e2m1 elements are 4 bits, got " << f.bits);
  if (f.block_rows != 1) return MOEKIT_MSG("block_rows " << f.block_rows << ": e2m1 groups are one row");
  const bool mx = f.block_cols == 32 && f.scale_dtype == DType::f8_e8m0;
  const bool nv = f.block_cols == 16 && f.scale_dtype == DType::f8_e4m3;
  if (!mx && !nv)
    return MOEKIT_MSG("e2m1 groups are 32 inputs with f8_e8m0 scales (MXFP4) or 16 with f8_e4m3 scales (NVFP4), got "
                      << f.block_cols << " with " << dtype_name(f.scale_dtype));
  if (cols % f.block_cols != 0)
    return MOEKIT_MSG("cols " << cols << " is not a multiple of the group " << f.block_cols);
  if (f.has_bias) return "e2m1 groups have no bias";
  return {};
}

inline std::string describe(const WeightFormat& f) {
  return MOEKIT_MSG((f.scale_dtype == DType::f8_e4m3 ? "nvfp4" : "mxfp4")
                    << " (e2m1, group " << f.block_cols << ", " << dtype_name(f.scale_dtype) << " scales)");
}

inline constexpr FormatTraits kTraits{"e2m1", DType::u8, row_elements, check, describe, decode};

}  // namespace moekit::kernels::formats::e2m1
