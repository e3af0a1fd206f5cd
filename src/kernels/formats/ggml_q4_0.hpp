// ggml q4_0: blocks of 32 weights in 18 bytes — f16 d, then 16 bytes of nibbles (weight j in
// the low nibble of byte j, weight j + 16 in its high nibble); w = (q − 8)·d.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q4_0 {

struct Type {
  static constexpr const char* kName = "q4_0";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 18;
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b);
    const std::uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q4_0
