// ggml q5_1: blocks of 32 weights in 24 bytes — f16 d, f16 m, a u32 of fifth bits, then 16 bytes
// of low nibbles (weight j low, j + 16 high); w = q·d + m, the product rounded before the sum.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q5_1 {

struct Type {
  static constexpr const char* kName = "q5_1";
  static constexpr int kBits = 5, kBlock = 32, kBytes = 24;
  static constexpr std::uint32_t kGgufId = 7;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, 2};   // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.max_code = 31, .bias = true};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]), m = ggml::half(b + kScaleAt[1]);
    std::uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const std::uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>((qs[j] & 0x0F) | h0) * d + m;
      y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const std::uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      q[j] = static_cast<std::int8_t>((qs[j] & 0x0F) | h0);
      q[j + 16] = static_cast<std::int8_t>((qs[j] >> 4) | h1);
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = ggml::half(b + kScaleAt[1]);
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q5_1
