// ggml iq4_xs: blocks of 256 weights in 136 bytes — f16 d, a u16 of the scales' high 2-bit pairs,
// 4 bytes of their low nibbles, 128 bytes of nibbles; sub-block ib of 32 weights (weight j low,
// j + 16 high in its 16 bytes) has scale ls (6 bits); w = (d·(ls − 32))·value.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::iq4_xs {

struct Type {
  static constexpr const char* kName = "iq4_xs";
  static constexpr int kBits = 4, kBlock = 256, kBytes = 136;
  static constexpr std::uint32_t kGgufId = 23;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};   // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.panel_offset = 128, .max_code = 128};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]);
    std::uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    const std::uint8_t* scales_l = b + 4;
    const std::uint8_t* qs = b + 8;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(ggml::kIq4Values[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(ggml::kIq4Values[qs[j] >> 4]);
      }
      y += 32;
      qs += 16;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    std::uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    const std::uint8_t* scales_l = b + 4;
    const std::uint8_t* qs = b + 8;
    for (int ib = 0; ib < 8; ++ib, qs += 16) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      for (int j = 0; j < 16; ++j) {
        q[32 * ib + j] = ggml::kIq4Values[qs[j] & 0xF];
        q[32 * ib + j + 16] = ggml::kIq4Values[qs[j] >> 4];
      }
      qs16[2 * ib] = qs16[2 * ib + 1] = static_cast<std::int16_t>(ls - 32);
      ws[ib] = ggml::half(b + kScaleAt[0]);
      wb[ib] = 0.0f;
    }
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::iq4_xs
