// ggml q3_K: blocks of 256 weights in 110 bytes — 32 bytes of high-bit masks, 64 bytes of low
// 2-bit codes, 12 bytes of 16 packed 6-bit scales, f16 d. Codes are read as in q2_K (two halves,
// four shifts, two sub-blocks of 16); the high bit of weight l of pass p is bit p of hmask[l]
// (over both halves), and a clear bit subtracts 4. Sub-block s: w = (d·(scale_s − 32))·q.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q3_k {

struct Type {
  static constexpr const char* kName = "q3_K";
  static constexpr int kBits = 3, kBlock = 256, kBytes = 110;
  static constexpr std::uint32_t kGgufId = 11;   // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {108, -1};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.panel_offset = 4, .max_code = 7, .per16 = true};
  // The 16 6-bit scales (biased by 32): low 4 bits from bytes 96-103 (nibbles), high 2 bits from
  // bytes 104-107.
  // As four words, scales 4j .. 4j + 3 in word j's bytes (kept in registers by the x86 kernels).
  struct ScaleWords {
    std::uint32_t w[4];
  };
  static ScaleWords Words(const std::uint8_t* b) {
    std::uint32_t in[3];
    std::memcpy(in, b + 96, 12);
    const std::uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu;
    return {{(in[0] & kmask2) | (((in[2] >> 0) & kmask1) << 4), (in[1] & kmask2) | (((in[2] >> 2) & kmask1) << 4),
             ((in[0] >> 4) & kmask2) | (((in[2] >> 4) & kmask1) << 4),
             ((in[1] >> 4) & kmask2) | (((in[2] >> 6) & kmask1) << 4)}};
  }
  static void Scales(const std::uint8_t* b, std::int8_t* scales) { std::memcpy(scales, Words(b).w, 16); }
  static void Block(const std::uint8_t* b, float* y) {
    const std::uint8_t* hm = b;
    const std::uint8_t* q = b + 32;
    const float d_all = ggml::half(b + kScaleAt[0]);
    std::int8_t scales[16];
    Scales(b, scales);
    int is = 0;
    std::uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<std::uint8_t>(m << 1)) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l)
            *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
      }
      q += 32;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* hm = b;
    const std::uint8_t* qs = b + 32;
    std::int8_t scales[16];
    Scales(b, scales);
    for (int i = 0; i < 16; ++i) qs16[i] = static_cast<std::int16_t>(scales[i] - 32);
    std::uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, qs += 32)
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<std::uint8_t>(m << 1))
        for (int l = 0; l < 32; ++l) *q++ = static_cast<std::int8_t>(((qs[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
    for (int j = 0; j < 8; ++j) ws[j] = ggml::half(b + kScaleAt[0]), wb[j] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q3_k
