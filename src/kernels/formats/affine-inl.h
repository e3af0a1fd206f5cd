// MLX affine codes in registers (per-target Highway header; the format's rules: affine.hpp).
//
// AffineB<kBits> is the format's view for dot-inl.h's tiles: the codes of a row are unpacked a
// vector at a time from the packed stream and dequantized to w = fma(scale, q, bias) with one
// fused multiply-add, so the tiles see exactly the reference decode's values. The view exists where
// the target can unpack kBits-bit codes in registers (kInRegisters); elsewhere DequantRows unpacks
// to bytes first, or decodes element by element.
#if defined(MOEKIT_KERNELS_FORMATS_AFFINE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_AFFINE_INL_H_
#undef MOEKIT_KERNELS_FORMATS_AFFINE_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_AFFINE_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstring>
#include <vector>

#include "kernels/dot-inl.h"
#include "kernels/formats/affine.hpp"
#include "kernels/formats/codes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE::affine {

// Whether kBits-bit codes are dequantized in registers on this target: unpacked there
// (kUnpacks), and the dequantization a fused multiply-add.
template <int kBits>
constexpr bool kInRegisters = HWY_NATIVE_FMA&& kUnpacks<kBits>;

// Codes k .. k + lanes - 1 of a row of K codes (k a multiple of the lane count) as f32.
template <int kBits>
HWY_INLINE hn::Vec<DF> Codes(DF df, const std::uint32_t* row, int64_t k, int64_t K) {
  // Codes are < 2^8, so they convert as signed integers: one instruction, where an unsigned
  // conversion has none on AVX2 and Highway emulates it with three more.
  const hn::RebindToSigned<DF> di;
  return hn::ConvertTo(df, hn::BitCast(di, CodeBits<kBits>(reinterpret_cast<const std::uint8_t*>(row), k, K)));
}

// The format's view (dot-inl.h): rows of packed codes, a scale and a bias per group.
template <int kBits>
struct AffineB {
  static constexpr bool kGrouped = true;
  using Row = const std::uint32_t*;
  struct Scale {
    float s, b;
  };
  WeightMatrix B;  // a copy: the tiles then reach its fields through one pointer, not two

  Row row(int64_t n) const { return static_cast<const std::uint32_t*>(B.data) + n * B.ld; }
  int64_t group() const { return B.format.block_cols; }
  int64_t row_bytes(int64_t K) const { return K * kBits / 8; }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // GroupedTile prefetches
  // The scale and bias of row n's group containing column k.
  Scale scale(int64_t n, int64_t k) const {
    const int64_t g = scale_index(B, n, k);
    return {load_f32(B.scales, B.format.scale_dtype, g), load_f32(B.biases, B.format.scale_dtype, g)};
  }
  void prefetch(Row r, int rows_ahead, int64_t g0) const {
    hwy::Prefetch(reinterpret_cast<const std::uint8_t*>(r + rows_ahead * B.ld) + g0 * kBits / 8);
  }
  hn::Vec<DF> decode(DF df, Row r, int64_t k, int64_t K, Scale s) const {
    return hn::MulAdd(hn::Set(df, s.s), Codes<kBits>(df, r, k, K), hn::Set(df, s.b));
  }
};

// Calls fn(AffineB<bits>{B}) where this target unpacks B's codes in registers and its groups are
// whole vectors; returns whether it did.
template <class Fn>
HWY_INLINE bool WithView(const WeightMatrix& B, const Fn& fn) {
  if (B.format.block_cols % static_cast<int64_t>(hn::Lanes(DF())) != 0) return false;
  switch (B.format.bits) {
    case 4:
      if constexpr (kInRegisters<4>) return fn(AffineB<4>{B}), true;
      break;
    case 8:
      if constexpr (kInRegisters<8>) return fn(AffineB<8>{B}), true;
      break;
    case 2:
      if constexpr (kInRegisters<2>) return fn(AffineB<2>{B}), true;
      break;
    case 3:
      if constexpr (kInRegisters<3>) return fn(AffineB<3>{B}), true;
      break;
    case 5:
      if constexpr (kInRegisters<5>) return fn(AffineB<5>{B}), true;
      break;
    case 6:
      if constexpr (kInRegisters<6>) return fn(AffineB<6>{B}), true;
      break;
    default:
      break;
  }
  return false;
}

// gemm_nt with few rows of A: the codes dequantized in registers, one pass over the packed
// stream. Returns false where the target cannot (the caller then dequantizes blocks of rows).
inline bool GemmInRegisters(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N,
                            int64_t K) {
  return WithView(B, [&](const auto& view) { GemmBlocks(A, view, C, M, N, K); });
}

// Whether GemmInRegisters takes B on this target.
inline bool InRegistersTakes(const WeightMatrix& B, int64_t) {
  return WithView(B, [](const auto&) {});
}

// Rows [n0, n0 + rows) of B dequantized into dst [rows, K] with the tiles' values.
inline void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  thread_local std::vector<std::uint32_t> unpacked;  // K codes as bytes, word-aligned
  const AffineB<8> bytes{B};
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * K;
    const int64_t n = n0 + r;
    if (WithView(B, [&](const auto& view) { DecodeRow(view, n, view.row(n), K, d); })) continue;
    if (B.format.block_cols % static_cast<int64_t>(hn::Lanes(DF())) == 0 && kInRegisters<8>) {
      // 3, 5, 6 bits on targets that unpack only whole bytes: unpacked to bytes first, then the
      // 8-bit view (the codes, so the values, are the same).
      unpacked.resize(static_cast<size_t>((K + 3) / 4));
      UnpackToBytes(bytes.row(n), K, B.format.bits, reinterpret_cast<std::uint8_t*>(unpacked.data()));
      DecodeRow(bytes, n, unpacked.data(), K, d);
    } else {
      for (int64_t k = 0; k < K; ++k) d[k] = formats::affine::decode(B, n, k);
    }
  }
}

}  // namespace moekit::kernels::HWY_NAMESPACE::affine
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_AFFINE_INL_H_
