// What the int8 fast mode's files share (int8_activations.cpp, int8_rows.cpp, int8_panels.cpp,
// gemm_amx_int8.cpp): A's rows quantized per group (QuantA) and the functions that make them, how
// B's rows and C are addressed, and what the kernels know of ggml's block types. Internal to the
// kernel layer; kernels/plan.hpp decides which of these kernels runs.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu.hpp"
#include "kernels/formats/e2m1.hpp"
#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/int4.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOEKIT_X86 1
#else
#define MOEKIT_X86 0
#endif

namespace moekit::kernels::int8 {

// The codes a kernel multiplies: MLX affine 4- or 8-bit (u8 codes, a scale and a bias per group),
// or signed 4-bit (e2m1, int4: a nibble's integer from a table, a scale per group, no bias).
enum class Codes { affine4, affine8, signed4 };

// Whether the x86 kernels take A's activations as int16 (QuantA::q16: 8-bit codes without VNNI)
// rather than int8 (q8). Only that one of the two arrays is filled.
constexpr bool int16_activations(Codes codes, bool vnni) { return codes == Codes::affine8 && !vnni; }

inline Codes codes_of(const WeightFormat& f) {
  if (f.element == Element::affine) return f.bits == 4 ? Codes::affine4 : Codes::affine8;
  return Codes::signed4;
}

// A signed 4-bit format's nibbles as small integers w and the factor that makes them weights:
// weight = w · scale_factor · the group's scale, exactly (the formats' own rules:
// e2m1.hpp, int4.hpp).
struct SignedCodes {
  const std::int8_t* table;  // 16 entries
  float scale;
};

inline SignedCodes signed_codes(const WeightFormat& f) {
  if (f.element == Element::e2m1) return {formats::e2m1::kTwice, 0.5f};
  return {formats::int4::kIntegers, 1.0f};
}

// A's rows quantized for one call: per row, K int8 codes (4-bit B: in the nibble order below),
// or K int16 (8-bit B on AVX2); per group, the scale d, the integer Σq and d · Σq (the rounded
// activations' sum: the affine bias term, the signed codes' offset).
struct QuantA {
  std::int64_t M = 0, K = 0, groups = 0;
  // d, qsum and xsum's row stride: groups rounded up to a multiple of 8, the pad zero (the x86
  // kernels take eight groups' scales at once).
  std::int64_t gstride = 0;
  bool bytes8 = false;  // 8-bit codes' activations in q8 (natural order), not q16
  // 4-bit codes with K a multiple of 64: each 64-chunk stored as its 32 even elements then its 32
  // odd ones, the order 32 packed bytes unpack into (low nibbles, then high), so the x86 kernels
  // load 64 codes at once; else per 32-block (16 bytes; the portable kernel alone).
  bool pair64 = false;

  // Where element k of a row sits in q8 (4-bit codes): the unpack order above.
  std::int64_t at(std::int64_t k) const {
    const std::int64_t span = pair64 ? 64 : 32, i = k % span;
    return k - i + (i % 2 == 0 ? i / 2 : span / 2 + i / 2);
  }
  std::vector<std::int8_t> q8;
  std::vector<std::int16_t> q16;
  std::vector<float> d, xsum;
  std::vector<std::int32_t> qsum;
  // q2_K's row kernel (ggml_int8-inl.h): each row's sums of 16 codes, K / 16 per row.
  std::vector<std::int16_t> qsum16;
};

// ---- A's rows (int8_activations.cpp) ---------------------------------------------------------

// A's M rows quantized for B's groups of gs inputs, a scale per `span` inputs (0: per group;
// quantize_row). bytes8: 8-bit codes take int8 activations too (the VNNI kernel), in natural
// order; 4-bit codes in QuantA's nibble order. vector: the AVX2 steps (the same results; the
// caller checked the CPU).
void quantize_a(const RowSource& A, std::int64_t M, std::int64_t K, int gs, int bits, bool bytes8, bool vector,
                QuantA& qa, int span = 0);

// This thread's quantized activations, reused across calls.
QuantA& thread_quant_a();

// QuantA::qsum16 from its int8 codes (natural order): each row's sums of 16 codes.
void sums16(QuantA& qa);

#if MOEKIT_X86
// A's int8 codes (natural order) rearranged for the x86 row kernels of ggml's types
// (ggml_int8-inl.h): pair_order for pair32 (per 64 inputs, elements 0-15, 32-47, 16-31, 48-63),
// quad_order for quad32 (per 128 in whole chunks of 256, the four low-nibble halves then the four
// high ones), k4_order for q4_K's and q5_K's chunk_k45 (per 128, sub-blocks 0, 2, 1, 3).
void pair_order(QuantA& qa);
void quad_order(QuantA& qa);
void k4_order(QuantA& qa);
#endif

// ---- B and C ---------------------------------------------------------------------------------

// Bytes between rows of B's codes (its container's elements: u32 words for affine, bytes else).
inline std::int64_t row_stride_bytes(const WeightMatrix& B) {
  return B.ld * static_cast<std::int64_t>(dtype_size(B.dtype));
}

inline const std::uint8_t* row_bytes(const WeightMatrix& B, std::int64_t n) {
  return static_cast<const std::uint8_t*>(B.data) + n * row_stride_bytes(B);
}

inline void store(const Output& C, std::int64_t m, std::int64_t n, float v) {
  if (C.row_scale) v *= C.row_scale[m];
  float& c = C.data[m * C.ld + n];
  c = C.accumulate ? c + v : v;
}

// ---- ggml's block types (GGUF) -------------------------------------------------------------
//
// The fast mode on ggml's types: A quantized per 32 inputs (QuantA, groups of 32, int8 in natural
// order), B's blocks in ggml_common.hpp's integer form (w = ws · qs16 · q + wb per 32 weights).
// Per row of A and group g of 32 inputs: S_g = Σ_h qs16_h Σ_k q_k · a_k, exact, then
//   y = Σ_g ( S_g · ws_g · d[m,g]  +  wb_g · d[m,g]·Σa ),
// so, as for the affine codes, |y_fast − y_exact| ≤ Σ_g (d[m,g] / 2) Σ_k |w_k| (docs/numerics.md).
// ggml itself quantizes the activations per 256 for the K-quants (q8_K) and per 32 for the rest
// (q8_0, f16 scales); moekit's per-32 f32 scales are never coarser.

// What the kernels need to know of a type beyond its integer form, from its own file
// (formats/ggml_common.hpp's Int8Facts): whether its codes are signed (else u8 ≤ 31), the offset
// its unsigned codes carry in the x86 kernels (q = code − offset: S_g loses offset · Σa), and
// whether it has a bias term. Every type with an integer form has x86 kernels (ggml_int8-inl.h);
// the portable kernel serves other CPUs and the tests.
template <class T>
struct GgmlInt8 {
  static constexpr bool kSigned = T::kInt8Facts.signed_codes;
  static constexpr int kOffset = T::kInt8Facts.row_offset;
  static constexpr bool kBias = T::kInt8Facts.bias;
  // q2_K: a min per 16 weights (ggml_common.hpp's Mins): per group the integer
  // M_g = Σ_h qm16_h Σ_k a_k (exact), then bacc = fma(wm, M_g · d, bacc).
  static constexpr bool kMin16 = T::kInt8Facts.min16;
  static constexpr bool kAdd = kBias || kMin16;  // a second accumulator, added at the end
};

// The 32-block types whose 32 codes are 16 bytes of nibbles (element j low, j + 16 high) behind
// an optional table (kHasTable, kTable), which the x86 row kernel takes two blocks at a time
// (ggml_int8-inl.h's pair32, A's rows in pair_order): kQs the nibbles' offset in the block. The
// one statement of these types' codes: codes32 and pair32 both read it (nibble_codes).
template <class T>
struct NibblePairs {
  static constexpr bool kYes = T::kInt8Facts.nibble_pairs;
  static constexpr int kQs = T::kInt8Facts.codes_at;
  static constexpr bool kHasTable = T::kInt8Facts.has_table;
  static constexpr const std::int8_t* kTable = T::kInt8Facts.table;
};

// The nibble types whose codes are u8 (no table, or MXFP4's shifted one), which the VNNI row
// kernel takes four blocks at a time in a whole chunk of eight (ggml_int8-inl.h's quad32, A's
// rows in quad_order).
template <class T>
struct QuadNibbles {
  static constexpr bool kYes = NibblePairs<T>::kYes && !GgmlInt8<T>::kSigned;
};

// Calls fn(T{}) for B's ggml type T where it has a fast mode; returns whether it did.
template <class Fn>
bool with_ggml_int8_type(Element element, const Fn& fn) {
  switch (element) {
#define MOEKIT_GGML_INT8_CASE(f)             \
  case Element::f:                           \
    if constexpr (formats::f::Type::kInt8) { \
      fn(formats::f::Type{});                \
      return true;                           \
    } else {                                 \
      return false;                          \
    }
    MOEKIT_GGML_FORMATS(MOEKIT_GGML_INT8_CASE)
#undef MOEKIT_GGML_INT8_CASE
    default:
      return false;
  }
}

// Calls fn(T{}) for B's ggml type T; returns whether B is one.
template <class Fn>
bool with_ggml_type(Element element, const Fn& fn) {
  switch (element) {
#define MOEKIT_GGML_CASE(f) \
  case Element::f:          \
    fn(formats::f::Type{}); \
    return true;
    MOEKIT_GGML_FORMATS(MOEKIT_GGML_CASE)
#undef MOEKIT_GGML_CASE
    default:
      return false;
  }
}

#if MOEKIT_X86
// A's rows for the panel kernels (ggml_panel-inl.h): int8 codes in blocks of 4 rows, each
// [K / 4][4 rows][4 inputs] (so one tile's rows are a few pointers and small offsets), and per
// group of kG inputs d, d·Σa and −off·Σa (where a group's int32 sums start) as [groups][Mp]; Mp
// the rows rounded up to 4, the padding zero.
struct Rows {
  const std::int8_t* q = nullptr;
  const float* d = nullptr;
  const float* xs = nullptr;
  const std::int32_t* t0 = nullptr;
  std::int64_t Mp = 0;
};
#endif

// ---- AMX-INT8 (gemm_amx_int8.cpp) -------------------------------------------------------------

// C[M, N] (+)= A · Bᵀ for MLX affine 4- or 8-bit codes whose group size is a multiple of 64, on
// AMX-INT8 tiles (the CPU has them): A quantized once, the work split over the pool in whole
// 16-row panels or 32-column tile pairs where `threads` asks for it. The portable kernel's bits.
void amx_int8_gemm(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                   std::int64_t K, Threads threads);

}  // namespace moekit::kernels::int8
