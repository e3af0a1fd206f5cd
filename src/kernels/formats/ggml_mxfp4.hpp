// ggml MXFP4 (gpt-oss in GGUF): blocks of 32 weights in 17 bytes — an e8m0 exponent e, then 16
// bytes of e2m1 nibbles in ggml's order (weight j in the low nibble of byte j, weight j + 16 in
// its high nibble; Hugging Face's blocks put weight 2j low and 2j + 1 high). ggml multiplies
// twice the e2m1 value (an integer in [−12, 12]) by 2^(e − 128); w = that product, exact.
#pragma once

#include "kernels/formats/e2m1.hpp"
#include "kernels/formats/ggml_common.hpp"

namespace moekit::kernels::formats::ggml_mxfp4 {

/// The codes the int8 mode's kernels multiply: twice the e2m1 value plus 12, a u8 ≤ 24 (the
/// panel's and the row kernel's offset of 12 takes it off again).
alignas(16) inline constexpr std::int8_t kShifted[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

struct Type {
  static constexpr const char* kName = "mxfp4";
  static constexpr int kBits = 4, kBlock = 32, kBytes = 17;
  static constexpr std::uint32_t kGgufId = 39;  // its number in GGUF files (ggml_type)
  static constexpr int kScaleAt[2] = {0, -1};   // the byte of a block's e8m0 exponent; -1: none
  static constexpr bool kInt8 = true;
  static constexpr ggml::Int8Facts kInt8Facts{.row_offset = 12,
                                              .panel_offset = 12,
                                              .max_code = 24,
                                              .nibble_pairs = true,
                                              .codes_at = 1,
                                              .has_table = true,
                                              .table = kShifted,
                                              .e8m0_scale = true};
  // ggml_e8m0_to_fp32_half: 2^(e − 128), as f32 bits (subnormal for e < 2); e = 0xFF gives
  // 2^127 (ggml does not treat it as NaN).
  static float Scale(std::uint8_t e) {
    const std::uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<std::uint32_t>(e - 1) << 23;
    float d;
    std::memcpy(&d, &bits, 4);
    return d;
  }
  static void Block(const std::uint8_t* b, float* y) {
    const float d = Scale(b[kScaleAt[0]]);
    const std::uint8_t* qs = b + 1;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(e2m1::kTwice[qs[j] & 0xF]) * d;
      y[j + 16] = static_cast<float>(e2m1::kTwice[qs[j] >> 4]) * d;
    }
  }
  // The integer form (ggml_common.hpp).
  static void Int8(const std::uint8_t* b, std::int8_t* q, std::int16_t* qs16, float* ws, float* wb) {
    const std::uint8_t* qs = b + 1;
    for (int j = 0; j < 16; ++j) {
      q[j] = e2m1::kTwice[qs[j] & 0xF];
      q[j + 16] = e2m1::kTwice[qs[j] >> 4];
    }
    qs16[0] = qs16[1] = 1;
    ws[0] = Scale(b[kScaleAt[0]]);
    wb[0] = 0.0f;
  }
};

inline constexpr FormatTraits kTraits = ggml::Rules<Type>::kTraits;

}  // namespace moekit::kernels::formats::ggml_mxfp4
