// ggml q4_0: blocks of 32 weights in 18 bytes — f16 d, then 16 bytes of nibbles (weight j in
// the low nibble of byte j, weight j + 16 in its high nibble); w = (q − 8)·d.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q4_0 {

struct Type {
  static constexpr const char* kName = "q4_0";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 18;
  static constexpr std::uint32_t kGgufId = 2;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{
      .row_offset = 8, .panel_offset = 8, .max_code = 15, .nibble_pairs = true, .codes_at = 2};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]);
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>((qs[j] & 0x0F) - 8);
      q[j + 16] = static_cast<std::int8_t>((qs[j] >> 4) - 8);
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q4_0
