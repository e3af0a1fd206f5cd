// ggml q6_K: blocks of 256 weights in 210 bytes — 128 bytes of low nibbles, 64 bytes of high
// 2-bit pairs, 16 int8 sub-block scales, f16 d. Each half (128 weights) takes 64 low bytes and 32
// high bytes: weight l + 32·i (i = 0-3) is the low (i even) or high (i odd) nibble of ql[l + 32·(i
// mod 2)] with bits 2i, 2i + 1 of qh[l] above it, minus 32. w = (d·scale)·q.
#pragma once

#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::q6_k {

struct Type {
  static constexpr const char* kName = "q6_K";
  static constexpr int kBits = 6, kBlock = 256, kBytes = 210;
  static constexpr std::uint32_t kGgufId = 14;   // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {208, -1};  // bytes of a block's f16 scales d, dmin (m); -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.panel_offset = 32, .max_code = 63, .per16 = true, .direct_vnni = true};
  static void Block(const std::uint8_t* b, float* y) {
    const std::uint8_t* ql = b;
    const std::uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    const float d = ggml::half(b + kScaleAt[0]);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* ql = b;
    const std::uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, q += 128) {
      for (int l = 0; l < 32; ++l) {
        q[l] = static_cast<std::int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        q[l + 32] = static_cast<std::int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        q[l + 64] = static_cast<std::int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        q[l + 96] = static_cast<std::int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    for (int i = 0; i < 16; ++i) qs16[i] = sc[i];  // weights 16i .. 16i + 15
    for (int j = 0; j < 8; ++j) ws[j] = ggml::half(b + kScaleAt[0]), wb[j] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::q6_k
