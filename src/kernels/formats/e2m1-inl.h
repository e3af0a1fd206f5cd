// e2m1 (MXFP4) weights in registers (per-target Highway header; the format's rules: e2m1.hpp).
//
// E2m1B is the format's view for dot-inl.h's tiles: a vector of nibbles is unpacked from the row
// (codes-inl.h, as 4-bit codes) and turned into its value by one table lookup — of the 16 signed
// values where a vector holds 16 lanes, else of the 8 magnitudes (bits 0-2) with the sign (bit 3)
// set as the float's sign bit — then multiplied by the group's scale: every step exact, so the
// tiles see exactly the reference decode's values. The view exists on targets of at least 8 lanes
// (the table is one vector); elsewhere DequantRows decodes element by element.
#if defined(MOEKIT_KERNELS_FORMATS_E2M1_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_E2M1_INL_H_
#undef MOEKIT_KERNELS_FORMATS_E2M1_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_E2M1_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/dot-inl.h"
#include "kernels/formats/codes-inl.h"
#include "kernels/formats/e2m1.hpp"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE::e2m1 {

constexpr bool kInRegisters = kUnpacks<4> && kLanes >= 8;

struct E2m1B {
  static constexpr bool kGrouped = true;
  using Row = const std::uint8_t*;
  struct Scale {
    float s;
  };
  WeightMatrix B;  // a copy: the tiles then reach its fields through one pointer, not two

  Row row(int64_t n) const { return static_cast<const std::uint8_t*>(B.data) + n * B.ld; }
  int64_t group() const { return B.format.block_cols; }
  int64_t row_bytes(int64_t K) const { return K / 2; }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // GroupedTile prefetches
  Scale scale(int64_t n, int64_t k) const { return {load_f32(B.scales, B.format.scale_dtype, scale_index(B, n, k))}; }
  void prefetch(Row r, int rows_ahead, int64_t g0) const { hwy::Prefetch(r + rows_ahead * B.ld + g0 / 2); }
  hn::Vec<DF> decode(DF df, Row r, int64_t k, int64_t K, Scale s) const {
    const DU du;
    const hn::RebindToSigned<DF> di;
    // The 8 magnitudes, twice over, so a table of any width ≥ 8 lanes holds them at indices 0-7.
    HWY_ALIGN static constexpr float kMagnitudes[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                                        0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const auto q = CodeBits<4>(r, k, K);
    if constexpr (kLanes >= 16) {
      // All 16 signed values fit one vector: the nibble is the index, −0 included.
      const auto value =
          hn::TableLookupLanes(hn::Load(df, formats::e2m1::kValues), hn::IndicesFromVec(df, hn::BitCast(di, q)));
      return hn::Mul(value, hn::Set(df, s.s));
    } else {
      const auto index = hn::BitCast(di, hn::And(q, hn::Set(du, 7u)));
      const auto magnitude = hn::TableLookupLanes(hn::Load(df, kMagnitudes), hn::IndicesFromVec(df, index));
      const auto sign = hn::ShiftLeft<28>(hn::And(q, hn::Set(du, 8u)));
      return hn::Mul(hn::Or(magnitude, hn::BitCast(df, sign)), hn::Set(df, s.s));
    }
  }
};

// The format's entry points (gemm_quant.cpp): dot-inl.h's, on this view.
inline bool GemmInRegisters(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N,
                            int64_t K) {
  return GemmWithView<E2m1B, kInRegisters>(A, B, C, M, N, K);
}

inline bool InRegistersTakes(const WeightMatrix& B, int64_t K) { return ViewTakes<kInRegisters>(B, K); }

inline void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  DecodeRowsWith<E2m1B, kInRegisters>(B, n0, rows, K, dst, formats::e2m1::decode);
}

}  // namespace moekit::kernels::HWY_NAMESPACE::e2m1
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_E2M1_INL_H_
