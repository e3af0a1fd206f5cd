// Signed int4 weights with a scale per group: compressed-tensors' `pack-quantized` format
// (Kimi-K2-Thinking, Kimi-K2.5; docs/formats.md). The format's rules, outside the SIMD code; the
// kernels' decode is int4-inl.h.
//
// A row of K weights is K nibbles, two per byte, element 2j in the low nibble of byte j: the bytes
// of compressed-tensors' `weight_packed` I32 [out, ceil(in / 8)] (element k at bits 4·(k mod 8)
// of word k / 8, little endian). A nibble holds q + 8 for q in [−8, 7]. Each group of block_cols
// inputs of a row shares a scale (bf16 in the releases); the weight is (nibble − 8) × scale,
// rounded to decode_dtype — compressed-tensors' `_dequantize` computes in the scale's dtype, so a
// bf16 scale gives the bf16-rounded product. An asymmetric scheme (has_bias) adds a zero point z
// in [−8, 7] per group, held beside the scales in their dtype (`biases`; the loader unpacks
// compressed-tensors' `weight_zero_point`, packed along the rows): the weight is
// (nibble − 8 − z) × scale, the difference exact, rounded the same way.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::int4 {

/// A nibble's integer q = nibble − 8 (the int8 fast mode's codes).
alignas(16) inline constexpr std::int8_t kIntegers[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/// Nibble k of a row.
inline std::uint32_t code(const std::uint8_t* row, std::int64_t k) { return (row[k / 2] >> (4 * (k & 1))) & 0xFu; }

inline float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const auto* row = static_cast<const std::uint8_t*>(B.data) + n * B.ld;
  const std::int64_t i = scale_index(B, n, k);
  float q = static_cast<float>(static_cast<int>(code(row, k)) - 8);
  if (B.format.has_bias) q -= load_f32(B.biases, B.format.scale_dtype, i);
  return round_to(q * load_f32(B.scales, B.format.scale_dtype, i), B.format.decode_dtype);
}

inline std::int64_t row_elements(const WeightFormat&, std::int64_t cols) { return (cols + 1) / 2; }

inline std::string check(const WeightFormat& f, std::int64_t, std::int64_t) {
  if (f.bits != 4) return MOEKIT_MSG("int4 elements are 4 bits, got " << f.bits);
  if (f.block_rows != 1) return MOEKIT_MSG("block_rows " << f.block_rows << ": int4 groups are one row");
  if (f.block_cols < 1) return MOEKIT_MSG("int4 groups must hold at least one input, got " << f.block_cols);
  if (f.scale_dtype != DType::f32 && f.scale_dtype != DType::bf16 && f.scale_dtype != DType::f16)
    return MOEKIT_MSG("int4 scales must be f32, bf16 or f16, got " << dtype_name(f.scale_dtype));
  if (f.decode_dtype != DType::f32 && f.decode_dtype != DType::bf16 && f.decode_dtype != DType::f16)
    return MOEKIT_MSG("int4 weights decode to f32, bf16 or f16, got " << dtype_name(f.decode_dtype));
  return {};
}

inline std::string describe(const WeightFormat& f) {
  return MOEKIT_MSG("int4 (" << (f.has_bias ? "asymmetric" : "symmetric") << ", group " << f.block_cols << ", "
                             << dtype_name(f.scale_dtype) << " scales"
                             << (f.decode_dtype != DType::f32
                                     ? std::string(", decoded in ") + dtype_name(f.decode_dtype)
                                     : std::string())
                             << ")");
}

inline constexpr FormatTraits kTraits{"int4", DType::u8, row_elements, check, describe, decode};

}  // namespace moekit::kernels::formats::int4
