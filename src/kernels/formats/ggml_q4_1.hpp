// ggml q4_1: blocks of 32 weights in 20 bytes — f16 d, f16 m, then 16 bytes of nibbles (weight j
// low, j + 16 high); w = q·d + m, the product rounded before the sum.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q4_1 {

struct Type {
  static constexpr const char* kName = "q4_1";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 20;
  static constexpr std::uint32_t kGgufId = 3;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, 2};   // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.max_code = 15, .bias = true, .nibble_pairs = true, .codes_at = 4};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]), m = ggml::half(b + kScaleAt[1]);
    const std::uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>(qs[j] & 0x0F);
      q[j + 16] = static_cast<std::int8_t>(qs[j] >> 4);
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = ggml::half(b + kScaleAt[1]);
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q4_1
