// ggml q5_0: blocks of 32 weights in 22 bytes — f16 d, a u32 of fifth bits (bit j for weight j),
// then 16 bytes of low nibbles (weight j low, j + 16 high); w = (q − 16)·d.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q5_0 {

struct Type {
  static constexpr const char* kName = "q5_0";
  static constexpr int kBits = 5, kBlock = 32, kBytes = 22;
  static constexpr std::uint32_t kGgufId = 6;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.row_offset = 16, .panel_offset = 16, .max_code = 31};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]);
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const std::uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - 16) * d;
      y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const std::uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      q[j] = static_cast<std::int8_t>(((qs[j] & 0x0F) | h0) - 16);
      q[j + 16] = static_cast<std::int8_t>(((qs[j] >> 4) | h1) - 16);
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q5_0
