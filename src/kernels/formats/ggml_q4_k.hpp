// ggml q4_K: blocks of 256 weights in 144 bytes — f16 d, f16 dmin, 12 bytes of eight 6-bit
// scales and mins (get_scale_min_k4), 128 bytes of nibbles: each 32 bytes hold sub-block 2i in
// their low nibbles and 2i + 1 in their high ones. Sub-block s: w = (d·scale_s)·q − dmin·min_s.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q4_k {

struct Type {
  static constexpr const char* kName = "q4_K";
  static constexpr int kBits = 4, kBlock = 256, kBytes = 144;
  static constexpr std::uint32_t kGgufId = 12;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, 2};    // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.max_code = 15, .bias = true, .k45 = true, .direct_vnni = true};
  static void Block(const std::uint8_t* b, float* y) {
    const float d = ggml::half(b + kScaleAt[0]), dmin = ggml::half(b + kScaleAt[1]);
    const std::uint8_t* scales = b + 4;
    const std::uint8_t* q = b + 16;
    for (int is = 0; is < 8; is += 2) {
      std::uint8_t sc, m;
      ggml::scale_min_k4(is, scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      ggml::scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l)
        q[32 * j + l] = static_cast<std::int8_t>((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF);
    ggml::k45_terms(b, qs16, ws, wb);
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q4_k
