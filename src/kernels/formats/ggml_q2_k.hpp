// ggml q2_K: blocks of 256 weights in 84 bytes — 16 bytes of sub-block scales (low nibble) and
// mins (high nibble), 64 bytes of 2-bit codes, f16 d, f16 dmin. Each half of the block (128
// weights) reads 32 code bytes four times, at shifts 0, 2, 4, 6; each pass is two sub-blocks of 16
// (bytes 0-15, 16-31). Sub-block s: w = (d·scale_s)·q − dmin·min_s.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q2_k {

struct Type {
  static constexpr const char* kName = "q2_K";
  static constexpr int kBits = 2, kBlock = 256, kBytes = 84;
  static constexpr bool kInt8 = false;  // a min per 16 weights (ggml_common.hpp)
  static void Block(const std::uint8_t* b, float* y) {
    const std::uint8_t* scales = b;
    const std::uint8_t* q = b + 16;
    const float d = ggml::half(b + 80), dmin = ggml::half(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const std::uint8_t sc = scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
      q += 32;
    }
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q2_k
