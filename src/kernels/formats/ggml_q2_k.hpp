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
  static constexpr std::uint32_t kGgufId = 10;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {80, 82};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.max_code = 3, .min16 = true, .per16 = true};
  static constexpr bool kMin16 = true;  // its min is per 16 weights (ggml_common.hpp)
  static void Block(const std::uint8_t* b, float* y) {
    const std::uint8_t* scales = b;
    const std::uint8_t* q = b + 16;
    const float d = ggml::half(b + kScaleAt[0]), dmin = ggml::half(b + kScaleAt[1]);
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
  // The integer form (ggml_common.hpp), with the mins per 16 (Mins): codes 0..3, qs16 the 4-bit
  // scales, ws = d; wb 0.
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    for (int n = 0; n < 2; ++n)
      for (int s = 0; s < 4; ++s)
        for (int l = 0; l < 32; ++l)
          q[128 * n + 32 * s + l] = static_cast<std::int8_t>((b[16 + 32 * n + l] >> (2 * s)) & 3);
    const float d = ggml::half(b + kScaleAt[0]);
    for (int h = 0; h < 16; ++h) qs16[h] = static_cast<std::int16_t>(b[h] & 0xF);
    for (int j = 0; j < 8; ++j) {
      ws[j] = d;
      wb[j] = 0.0f;
    }
  }
  // The min term of the integer form: qm16 the 4-bit mins, wm = −dmin per 32.
  static void Mins(const std::uint8_t* b, std::int16_t* qm16, float* wm) {
    const float dmin = ggml::half(b + kScaleAt[1]);
    for (int h = 0; h < 16; ++h) qm16[h] = static_cast<std::int16_t>(b[h] >> 4);
    for (int j = 0; j < 8; ++j) wm[j] = -dmin;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q2_k
