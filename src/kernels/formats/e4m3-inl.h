// e4m3 (FP8) weights in registers (per-target Highway header; the format's rules: e4m3.hpp).
//
// E4m3B is the format's view for dot-inl.h's tiles: a vector of bytes is widened to u32 lanes, the
// 7 bits of exponent and mantissa shifted into an f32's exponent and mantissa fields (exponent
// field e, mantissa m << 20) and multiplied by 2^120, which rebiases a normal value exactly and
// turns the f32 subnormal of exponent 0 into m · 2^-9 exactly; the sign bit is set, S.1111.111
// becomes NaN, and the result is multiplied by the group's scale. Every step is exact, so the
// tiles see exactly the reference decode's values.
#if defined(MOEKIT_KERNELS_FORMATS_E4M3_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_E4M3_INL_H_
#undef MOEKIT_KERNELS_FORMATS_E4M3_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_E4M3_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <limits>

#include "kernels/dot-inl.h"
#include "kernels/formats/codes-inl.h"
#include "kernels/formats/e4m3.hpp"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE::e4m3 {

constexpr bool kInRegisters = kUnpacks<8>;

struct E4m3B {
  static constexpr bool kGrouped = true;
  using Row = const std::uint8_t*;
  struct Scale {
    float s;
  };
  WeightMatrix B;  // a copy: the tiles then reach its fields through one pointer, not two

  Row row(int64_t n) const { return static_cast<const std::uint8_t*>(B.data) + n * B.ld; }
  int64_t group() const { return B.format.block_cols; }
  int64_t row_bytes(int64_t K) const { return K; }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // GroupedTile prefetches
  Scale scale(int64_t n, int64_t k) const { return {load_f32(B.scales, B.format.scale_dtype, scale_index(B, n, k))}; }
  void prefetch(Row r, int rows_ahead, int64_t g0) const { hwy::Prefetch(r + rows_ahead * B.ld + g0); }
  hn::Vec<DF> decode(DF df, Row r, int64_t k, int64_t K, Scale s) const {
    const DU du;
    const auto bits = CodeBits<8>(r, k, K);
    const auto magnitude = hn::And(bits, hn::Set(du, 0x7Fu));
    const auto value = hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(magnitude)), hn::Set(df, 0x1p120f));
    const auto sign = hn::BitCast(df, hn::ShiftLeft<24>(hn::And(bits, hn::Set(du, 0x80u))));
    const auto nan = hn::RebindMask(df, hn::Eq(magnitude, hn::Set(du, 0x7Fu)));
    const auto v = hn::IfThenElse(nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), hn::Or(value, sign));
    return RoundTo(df, hn::Mul(v, hn::Set(df, s.s)), B.format.decode_dtype);
  }
};

// The format's entry points (gemm_quant.cpp): dot-inl.h's, on this view.
inline bool GemmInRegisters(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N,
                            int64_t K) {
  return GemmWithView<E4m3B, kInRegisters>(A, B, C, M, N, K);
}

inline bool InRegistersTakes(const WeightMatrix& B, int64_t K) { return ViewTakes<kInRegisters>(B, K); }

inline void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  DecodeRowsWith<E4m3B, kInRegisters>(B, n0, rows, K, dst, formats::e4m3::decode);
}

// B with decode_dtype bf16, as bf16 bits (the bf16 compute mode's blocks).
inline void DequantRowsBf16(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, uint16_t* dst) {
  DecodeRowsWith<E4m3B, kInRegisters>(B, n0, rows, K, dst, formats::e4m3::decode);
}

}  // namespace moekit::kernels::HWY_NAMESPACE::e4m3
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_E4M3_INL_H_
