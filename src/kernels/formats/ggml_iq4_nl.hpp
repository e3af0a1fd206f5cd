// ggml iq4_nl: blocks of 32 weights in 18 bytes — f16 d, then 16 bytes of nibbles (weight j low,
// j + 16 high), each an index into 16 non-linear values; w = d·value.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::iq4_nl {

struct Type {
  static constexpr const char* kName = "iq4_nl";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 18;
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b);
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(ggml::kIq4Values[qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(ggml::kIq4Values[qs[j] >> 4]);
    }
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::iq4_nl
