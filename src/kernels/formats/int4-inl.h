// Signed int4 weights in registers (per-target Highway header; the format's rules: int4.hpp).
//
// Int4B is the format's view for dot-inl.h's tiles: a vector of nibbles is unpacked from the row
// (codes-inl.h, as 4-bit codes), converted to f32 and offset by −8 and, for an asymmetric scheme,
// by the group's zero point (exact), multiplied by the group's scale and rounded to the format's
// decode dtype as the reference rounds it (RoundTo), so
// the tiles see exactly the reference decode's values. On targets of 16 lanes those 16 possible
// values are computed once per group and a vector of nibbles is one table lookup.
#if defined(MOEKIT_KERNELS_FORMATS_INT4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_INT4_INL_H_
#undef MOEKIT_KERNELS_FORMATS_INT4_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_INT4_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/dot-inl.h"
#include "kernels/formats/codes-inl.h"
#include "kernels/formats/int4.hpp"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE::int4 {

constexpr bool kInRegisters = kUnpacks<4> && kLanes >= 4;  // nibble pairs: not one lane

struct Int4B {
  static constexpr bool kGrouped = true;
  using Row = const std::uint8_t*;
  // The group's scale and zero point, and on targets of 16 lanes its 16 decoded values
  // (nibble − 8 − zero point) × scale, rounded as the format says: a vector's weights are then one
  // table lookup.
  struct Scale {
    float s, z;
    hn::Vec<DF> values;
  };
  WeightMatrix B;  // a copy: the tiles then reach its fields through one pointer, not two

  Row row(int64_t n) const { return static_cast<const std::uint8_t*>(B.data) + n * B.ld; }
  int64_t group() const { return B.format.block_cols; }
  int64_t row_bytes(int64_t K) const { return K / 2; }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // GroupedTile prefetches
  Scale scale(int64_t n, int64_t k) const {
    const DF df;
    const int64_t i = scale_index(B, n, k);
    const float s = load_f32(B.scales, B.format.scale_dtype, i);
    const float z = B.format.has_bias ? load_f32(B.biases, B.format.scale_dtype, i) : 0.0f;
    if constexpr (kLanes >= 16) {
      const hn::RebindToSigned<DF> di;
      const auto q = hn::Sub(hn::ConvertTo(df, hn::Sub(hn::Iota(di, 0), hn::Set(di, 8))), hn::Set(df, z));
      return {s, z, RoundTo(df, hn::Mul(q, hn::Set(df, s)), B.format.decode_dtype)};
    } else {
      return {s, z, hn::Zero(df)};
    }
  }
  void prefetch(Row r, int rows_ahead, int64_t g0) const { hwy::Prefetch(r + rows_ahead * B.ld + g0 / 2); }
  hn::Vec<DF> decode(DF df, Row r, int64_t k, int64_t K, const Scale& s) const {
    const hn::RebindToSigned<DF> di;
    if constexpr (kLanes >= 16) {
      return hn::TableLookupLanes(s.values, hn::IndicesFromVec(df, hn::BitCast(di, CodeBits<4>(r, k, K))));
    } else {
      const auto q =
          hn::Sub(hn::ConvertTo(df, hn::Sub(hn::BitCast(di, CodeBits<4>(r, k, K)), hn::Set(di, 8))), hn::Set(df, s.z));
      return RoundTo(df, hn::Mul(q, hn::Set(df, s.s)), B.format.decode_dtype);
    }
  }
};

// The format's entry points (gemm_quant.cpp): dot-inl.h's, on this view.
inline bool GemmInRegisters(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N,
                            int64_t K) {
  return GemmWithView<Int4B, kInRegisters>(A, B, C, M, N, K);
}

inline bool InRegistersTakes(const WeightMatrix& B, int64_t K) { return ViewTakes<kInRegisters>(B, K); }

inline void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  DecodeRowsWith<Int4B, kInRegisters>(B, n0, rows, K, dst, formats::int4::decode);
}

}  // namespace moekit::kernels::HWY_NAMESPACE::int4
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_INT4_INL_H_
