// ggml q8_0: blocks of 32 weights in 34 bytes — f16 d, then 32 int8 codes; w = q·d.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q8_0 {

struct Type {
  static constexpr const char* kName = "q8_0";
  static constexpr int kBits = 8, kBlock = 32, kBytes = 34;
  static constexpr std::uint32_t kGgufId = 8;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{
      .signed_codes = true, .panel_offset = 128, .max_code = 128, .byte_codes = true, .codes_at = 2};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]);
    const auto* qs = reinterpret_cast<const std::int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    std::memcpy(q, b + 2, 32);
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q8_0
