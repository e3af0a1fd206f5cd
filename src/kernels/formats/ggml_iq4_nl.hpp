// ggml iq4_nl: blocks of 32 weights in 18 bytes — f16 d, then 16 bytes of nibbles (weight j low,
// j + 16 high), each an index into 16 non-linear values; w = d·value.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::iq4_nl {

struct Type {
  static constexpr const char* kName = "iq4_nl";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 18;
  static constexpr std::uint32_t kGgufId = 20;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};   // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.signed_codes = true,
                                              .panel_offset = 128,
                                              .max_code = 128,
                                              .nibble_pairs = true,
                                              .codes_at = 2,
                                              .has_table = true,
                                              .table = ggml::kIq4Values};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]);
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(ggml::kIq4Values[qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(ggml::kIq4Values[qs[j] >> 4]);
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      q[j] = ggml::kIq4Values[qs[j] & 0xF];
      q[j + 16] = ggml::kIq4Values[qs[j] >> 4];
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = ggml::half(b + kScaleAt[0]);
    wb[0] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::iq4_nl
