// MLX affine quantization (mlx-lm's checkpoints; docs/formats.md): the format's rules, outside
// the SIMD code. The kernels' decode is affine-inl.h.
//
// A row of K weights is K codes of `bits` bits (2, 3, 4, 5, 6 or 8) packed little-endian into
// K · bits / 32 uint32 words, one continuous bit stream (element 0 in the lowest bits; 3-, 5- and
// 6-bit codes straddle words). Each group of block_cols consecutive inputs of a row shares a scale
// s and a bias b (f32, bf16 or f16); the weight is w = fma(s, q, b) in fp32: the exact affine
// value rounded once.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::affine {

/// uint32 words of one row of K codes of `bits` bits (K · bits must be a multiple of 32).
inline std::int64_t words(std::int64_t K, int bits) { return K * bits / 32; }

/// Code i of a row of packed codes.
inline std::uint32_t code(const std::uint32_t* row, std::int64_t i, int bits) {
  const std::int64_t bit = i * bits;
  const std::int64_t word = bit / 32, off = bit % 32;
  std::uint64_t v = row[word] >> off;
  if (off + bits > 32) v |= static_cast<std::uint64_t>(row[word + 1]) << (32 - off);
  return static_cast<std::uint32_t>(v & ((1u << bits) - 1u));
}

inline float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
  const std::int64_t g = scale_index(B, n, k);
  const auto* row = static_cast<const std::uint32_t*>(B.data) + n * B.ld;
  return std::fma(load_f32(B.scales, B.format.scale_dtype, g), static_cast<float>(code(row, k, B.format.bits)),
                  load_f32(B.biases, B.format.scale_dtype, g));
}

inline std::int64_t row_elements(const WeightFormat& f, std::int64_t cols) { return words(cols, f.bits); }

inline std::string check(const WeightFormat& f, std::int64_t, std::int64_t cols) {
  const int b = f.bits;
  if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8) return MOEKIT_MSG("bits " << b << " not in 2-6, 8");
  if (f.block_rows != 1) return MOEKIT_MSG("block_rows " << f.block_rows << ": affine groups are one row");
  // Groups of whole 16-code runs keep every code width's packing inside whole words per group.
  if (f.block_cols < 16 || f.block_cols % 16 != 0 || cols % f.block_cols != 0)
    return MOEKIT_MSG("group_size " << f.block_cols << " does not divide cols " << cols << " in multiples of 16");
  if (!is_float(f.scale_dtype)) return MOEKIT_MSG("scale dtype " << dtype_name(f.scale_dtype) << " is not a float");
  if (!f.has_bias) return "affine codes need a bias beside every scale";
  return {};
}

inline std::string describe(const WeightFormat& f) {
  return MOEKIT_MSG(f.bits << "-bit affine, group " << f.block_cols << ", " << dtype_name(f.scale_dtype) << " scales");
}

inline constexpr FormatTraits kTraits{"affine", DType::u32, row_elements, check, describe, decode};

}  // namespace moekit::kernels::formats::affine
