// Random ggml blocks for the benchmarks: random codes with plausible scales (no NaN, Inf or
// subnormal products to slow the float steps). A type's block bytes and where its f16 scales (or
// MXFP4's e8m0) lie are its format's (kernels/formats/ggml_*.hpp). moe_bench.cpp's BM_GgmlRows
// and panel_tile.cpp share them.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/formats/table.hpp"

namespace moekit::bench {

struct GgmlKind {
  const char* name;
  Element element;
  const kernels::formats::FormatTraits::GgufBlock& block() const { return kernels::formats::traits(element).gguf; }
  int bytes() const { return block().bytes; }
};

inline constexpr GgmlKind kQ4K{"q4_K", Element::q4_k};
inline constexpr GgmlKind kQ6K{"q6_K", Element::q6_k};
inline constexpr GgmlKind kQ3K{"q3_K", Element::q3_k};
inline constexpr GgmlKind kQ8_0{"q8_0", Element::q8_0};
inline constexpr GgmlKind kQ4_0{"q4_0", Element::q4_0};
inline constexpr GgmlKind kMxfp4{"MXFP4", Element::ggml_mxfp4};
inline constexpr GgmlKind kQ5K{"q5_K", Element::q5_k};

// N rows of K weights of `kind` (row stride `ld` bytes, set), seeded.
inline std::vector<std::uint8_t> random_ggml_rows(const GgmlKind& kind, std::int64_t N, std::int64_t K,
                                                  std::int64_t& ld, std::uint32_t seed = 11) {
  const WeightFormat f = WeightFormat::ggml(kind.element);
  ld = kernels::formats::traits(kind.element).row_elements(f, K);  // bytes
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(N * ld));
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  for (std::size_t blk = 0; blk < bytes.size(); blk += static_cast<std::size_t>(kind.bytes()))
    for (const int at : kind.block().scale_at) {
      if (at < 0) continue;
      if (kind.element == Element::ggml_mxfp4) {
        bytes[blk] = static_cast<std::uint8_t>(121 + rng() % 6);  // 2^-6 .. 2^-1
      } else {
        const auto h = static_cast<std::uint16_t>(0x1C00 + rng() % 0x800);  // f16 in [2^-8, 2^-6)
        std::memcpy(&bytes[blk + static_cast<std::size_t>(at)], &h, 2);
      }
    }
  return bytes;
}

}  // namespace moekit::bench
