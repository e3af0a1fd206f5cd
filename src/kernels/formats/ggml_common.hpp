// What every ggml block type (GGUF's quantized tensors; Element::q4_0 … ggml_mxfp4) shares:
// rows of whole self-contained blocks, read in place, no separate scale array. Each type's file
// (ggml_q4_0.hpp, …) gives its block — kBlock weights in kBytes bytes — and Block(), which
// decodes one block into fp32 with exactly the operations, in exactly the order, of ggml's
// dequantize_row_* (ggml/src/ggml-quants.c): int × float products and float sums, each rounded
// once (moekit compiles with -ffp-contract=off, so `q·d − m` is never fused; docs/numerics.md).
// The rules template below turns that into the format table's entry (table.hpp).
//
// The int8 fast mode (kernels/int8_rows.cpp, int8_panels.cpp) needs each type as integers: a type with
// kInt8 gives Int8(block, q, qs16, ws, wb), its weights as w_k = ws[k/32] · qs16[k/16] · q[k] +
// wb[k/32] in real arithmetic — q an int8 code, qs16 an integer per 16 weights (the K-quants'
// sub-block scales, else 1), ws and wb a float per 32 (wb 0 where the type has no min or bias).
// The fast mode multiplies q by int8 activations exactly and applies ws, wb per 32 weights.
// q2_K's min per 16 weights does not fit wb: it has kMin16 and Mins(block, qm16, wm), an integer
// min per 16 weights and a float per 32, w_k = ws · qs16 · q_k + wm · qm16[k/16] (its wb is 0).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/formats/table.hpp"
#include "util/error.hpp"

namespace moekit::kernels::formats::ggml {

/// The f16 at `p` (unaligned), widened exactly (GGML_FP16_TO_FP32).
inline float half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

/// K-quants' 6-bit scale and min of sub-block j (0-7) from the 12 packed bytes `q`
/// (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t& d, std::uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// The K-quants' eight 6-bit scales sc[0..7] and mins m[0..7] from their 12 packed bytes `q`: the
/// same values as scale_min_k4, all at once.
inline void scales_mins_k4(const std::uint8_t* q, std::uint8_t* sc, std::uint8_t* m) {
  std::uint32_t u[3];
  std::memcpy(u, q, 12);
  const std::uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, top2 = 0x03030303u;
  const std::uint32_t s[2] = {u[0] & low6, (u[2] & low4) | (((u[0] >> 6) & top2) << 4)};
  const std::uint32_t n[2] = {u[1] & low6, ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4)};
  std::memcpy(sc, s, 8);
  std::memcpy(m, n, 8);
}

/// q4_K's and q5_K's per-group terms of the integer form (Int8): each 32 weights' 6-bit scale as
/// qs16 (both halves), ws = d, wb = −dmin · m.
inline void k45_terms(const std::uint8_t* b, std::int16_t* qs16, float* ws, float* wb) {
  const float d = half(b), dmin = half(b + 2);
  std::uint8_t sc[8], m[8];
  scales_mins_k4(b + 4, sc, m);
  for (int j = 0; j < 8; ++j) {
    qs16[2 * j] = qs16[2 * j + 1] = sc[j];
    ws[j] = d;
    wb[j] = -(dmin * static_cast<float>(m[j]));
  }
}

/// iq4_nl's and iq4_xs's 16 non-linear values (ggml's kvalues_iq4nl).
inline constexpr std::int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

/// What the int8 mode's x86 kernels (ggml_int8-inl.h, ggml_int8_k-inl.h, ggml_unpack-inl.h, ggml_pack-inl.h) know of a
/// block type beyond its integer form (Int8): each type's file states its own (Type::kInt8Facts), and the kernels read
/// nothing else of a type's identity.
struct Int8Facts {
  bool signed_codes = false;  ///< Int8's codes are signed (q8_0, iq4_nl); else unsigned
  int row_offset = 0;         ///< the row kernel multiplies code − row_offset (S_g loses offset · Σa)
  int panel_offset = 0;       ///< the panel's offset making every code a u8 (128 for signed codes)
  int max_code = 31;          ///< the largest u8 code the panel multiplies (AVX2's int16 budget)
  bool bias = false;          ///< Int8's wb: a bias term per 32 weights (q4_1, q5_1, q4_K, q5_K)
  bool min16 = false;         ///< a min per 16 weights (Mins; q2_K)
  bool per16 = false;         ///< a scale per 16 weights: the panel's groups are 16 inputs
  bool byte_codes = false;    ///< the codes are the block's bytes as stored (q8_0)
  /// 32 codes as 16 bytes of nibbles, element j low and j + 16 high, through `table` if it has one
  bool nibble_pairs = false;
  int codes_at = 0;        ///< where a 32-block's code bytes start (byte_codes, nibble_pairs)
  bool has_table = false;  ///< (not table != nullptr: UBSan builds refuse that as a constant)
  const std::int8_t* table = nullptr;
  bool e8m0_scale = false;   ///< the block's scale is an e8m0 byte (MXFP4), else an f16
  bool k45 = false;          ///< q4_K's and q5_K's layout: 32 bytes of nibbles per two sub-blocks
  bool direct_vnni = false;  ///< the VNNI panel's pack takes its blocks straight from 16 rows
};

/// The format-table entry of block type T (T::kName, kBlock, kBytes, kBits, Block(block, out)).
template <typename T>
struct Rules {
  static std::int64_t row_elements(const WeightFormat&, std::int64_t cols) { return cols / T::kBlock * T::kBytes; }
  static std::string check(const WeightFormat& f, std::int64_t, std::int64_t cols) {
    if (f.bits != T::kBits || f.block_cols != T::kBlock || f.block_rows != 1 || f.has_bias)
      return MOEKIT_MSG("ggml's " << T::kName << " is WeightFormat::ggml: bits " << T::kBits << ", blocks of "
                                  << T::kBlock << " inputs, no bias");
    if (cols % T::kBlock != 0)
      return MOEKIT_MSG("cols " << cols << " is not a multiple of " << T::kName << "'s block of " << T::kBlock);
    return {};
  }
  static std::string describe(const WeightFormat&) {
    return MOEKIT_MSG(T::kName << " (ggml, " << 8.0 * T::kBytes / T::kBlock << " bits per weight)");
  }
  static float decode(const WeightMatrix& B, std::int64_t n, std::int64_t k) {
    const auto* row = static_cast<const std::uint8_t*>(B.data) + n * B.ld;
    float out[T::kBlock];
    T::Block(row + k / T::kBlock * T::kBytes, out);
    return out[k % T::kBlock];
  }
  static constexpr FormatTraits kTraits{
      T::kName,     DType::u8,
      row_elements, check,
      describe,     decode,
      true,         {static_cast<int>(T::kGgufId), T::kBits, T::kBlock, T::kBytes, {T::kScaleAt[0], T::kScaleAt[1]}}};
};

}  // namespace moekit::kernels::formats::ggml
