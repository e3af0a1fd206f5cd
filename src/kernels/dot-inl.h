// The dot-product kernel's tiles, strips and blocking (gemm_nt on weights in rows layout; gemm_nn
// on panels read transposed), templated on a view of B: RowsB / PanelsT for plain float weights,
// a format's view (kernels/formats/*-inl.h) for quantized ones. Per-target Highway header.
//
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ in register tiles of up to kMaxRows rows × 4 (or 8) columns,
// as dot products: each C element owns one vector accumulator whose lane j sums k ≡ j (mod
// lanes) sequentially with FMA, then the lanes are reduced in a fixed order (StoreDotTile). That
// order depends only on K and the CPU target, never on the tile an element landed in, M, N or the
// thread count, or on whether its weights were loaded or decoded: every format computes the same
// sums on its decoded values.
#if defined(MOEKIT_KERNELS_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_DOT_INL_H_
#undef MOEKIT_KERNELS_DOT_INL_H_
#else
#define MOEKIT_KERNELS_DOT_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm.hpp"
#include "kernels/outer-inl.h"  // WidenLoad, ARows, LoadA, StoreDotTile, DF
#include "kernels/prefetch.hpp"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Where B's element (n, k) lives. RowsB: the weights as stored, [N, K] rows (gemm_nt). PanelsT:
// a panel-packed [K, N] weight read transposed (gemm_nn on packed weights: W [out, in] packed
// over out, so for one input column n the reduction's 16 consecutive k of a panel are
// contiguous). Lanes divide 16, so a vector of k never straddles a panel.
template <typename TB>
struct RowsB {
  using T = TB;
  static constexpr bool kGrouped = false;
  const TB* base;
  int64_t ldb;
  int64_t row_bytes(int64_t K) const { return K * static_cast<int64_t>(sizeof(TB)); }
  const TB* at(int64_t n, int64_t k) const { return base + n * ldb + k; }
  // Rows [n1, n2) fetched into L2 over `steps` k steps (kernels/prefetch.hpp).
  NextRows next(int64_t n1, int64_t n2, int64_t K, int64_t steps) const {
    const int64_t bytes = static_cast<int64_t>(sizeof(TB));
    return NextRows::over(n2 > n1 ? at(n1, 0) : base, n2 - n1, K * bytes, ldb * bytes, steps);
  }
};
template <typename TB>
struct PanelsT {
  using T = TB;
  static constexpr bool kGrouped = false;
  const TB* base;
  int64_t panel_stride;  // kPanelRows · N
  const TB* at(int64_t n, int64_t k) const {
    return base + (k / kPanelRows) * panel_stride + n * kPanelRows + k % kPanelRows;
  }
  int64_t row_bytes(int64_t K) const { return K * static_cast<int64_t>(sizeof(TB)); }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // no prefetch: empty
};

// Plain (float) weights as stored: each vector loaded and widened in registers.
template <bool kScaled, int MR, int NR, class BV>
HWY_INLINE void PlainTile(const ARows<MR>& a_rows, const BV& B, hn::Vec<DF> (&acc)[MR][NR], int64_t n, int64_t K,
                          NextRows& pf) {
  using TB = typename BV::T;
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    hn::Vec<DF> a[MR];
    for (int i = 0; i < MR; ++i) a[i] = LoadA<kScaled>(df, a_rows, i, a_rows.p[i] + k);
    for (int j = 0; j < NR; ++j) {
      const auto b = WidenLoad(df, B.at(n + j, k));
      for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], b, acc[i][j]);
    }
    pf.step();
  }
  if (k < K) {
    const int64_t r = K - k;
    HWY_ALIGN float abuf[MR][HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN TB bbuf[HWY_MAX_BYTES / sizeof(float)];
    hn::Vec<DF> a[MR];
    for (int i = 0; i < MR; ++i) {
      std::memcpy(abuf[i], a_rows.p[i] + k, static_cast<size_t>(r) * sizeof(float));
      a[i] = LoadA<kScaled>(df, a_rows, i, abuf[i]);
    }
    for (int j = 0; j < NR; ++j) {
      std::memset(bbuf, 0, sizeof(bbuf));
      std::memcpy(bbuf, B.at(n + j, k), static_cast<size_t>(r) * sizeof(TB));
      const auto b = WidenLoad(df, bbuf);
      for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], b, acc[i][j]);
    }
  }
}

// The weights of a quantized format's rows, decoded a vector at a time (a format's view, e.g.
// formats/affine-inl.h's): `k` runs over groups of group() columns that share a scale per row,
// decode() turns lanes k .. k + lanes - 1 of a row into f32 weights in registers. A group, and K,
// are whole numbers of vectors (ViewFits), so there is no tail; the last group may be ragged (a
// block shape that does not divide K).
template <bool kScaled, int MR, int NR, class BV>
HWY_INLINE void GroupedTile(const ARows<MR>& a_rows, const BV& view, hn::Vec<DF> (&acc)[MR][NR], int64_t n, int64_t K) {
  const BV B = view;  // a local copy: its fields stay in registers across the tile
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t gs = B.group();
  typename BV::Row rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = B.row(n + j);
  for (int64_t g0 = 0; g0 < K; g0 += gs) {
    typename BV::Scale s[NR];
    for (int j = 0; j < NR; ++j) s[j] = B.scale(n + j, g0);
    // This group of the next tile's rows (NR rows on), a tile ahead of use: a row of a quantized
    // format is too short a stream for the hardware prefetcher, and decode otherwise waits on
    // DRAM latency row after row. A hint only: past the matrix it is ignored.
    for (int j = 0; j < NR; ++j) B.prefetch(rows[j], NR, g0);
    const int64_t g1 = std::min(g0 + gs, K);
    for (int64_t k = g0; k < g1; k += L) {
      hn::Vec<DF> a[MR];
      for (int i = 0; i < MR; ++i) a[i] = LoadA<kScaled>(df, a_rows, i, a_rows.p[i] + k);
      for (int j = 0; j < NR; ++j) {
        const auto w = B.decode(df, rows[j], k, K, s[j]);
        for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], w, acc[i][j]);
      }
    }
  }
}

// One MR x NR tile over the full K. Plain weights are loaded and widened; a quantized format's
// are decoded in registers (GroupedTile) into the same accumulators, in the same order. Tail
// lanes (K % lanes) of plain weights come from zero-padded copies, so they add exact zeros and
// never read past the rows.
template <bool kScaled, int MR, int NR, class BV>
HWY_INLINE void Tile(const ARows<MR>& a_rows, const BV& B, const Output& C, int64_t m, int64_t n, int64_t K,
                     NextRows& pf) {
  const DF df;
  hn::Vec<DF> acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  if constexpr (BV::kGrouped) {
    GroupedTile<kScaled>(a_rows, B, acc, n, K);
  } else {
    PlainTile<kScaled>(a_rows, B, acc, n, K, pf);
  }
  StoreDotTile(df, acc, C, m, n);
}

template <bool kScaled, int MR, class BV>
HWY_INLINE void RowStrip(const ARows<MR>& a, const BV& B, const Output& C, int64_t m, int64_t n0, int64_t n1, int64_t K,
                         NextRows& pf) {
  int64_t n = n0;
  // A single row (decode) has no A reuse to gain from tall tiles; 8 columns give 8 independent
  // FMA chains and 8 weight streams in flight instead of 4.
  if constexpr (MR == 1) {
    for (; n + 8 <= n1; n += 8) Tile<kScaled, 1, 8>(a, B, C, m, n, K, pf);
  }
  for (; n + 4 <= n1; n += 4) Tile<kScaled, MR, 4>(a, B, C, m, n, K, pf);
  // The last N % 4 columns one at a time: a column's sum does not depend on the tile width, and
  // no MoE shape has such a tail on its hot path (F, D and E are multiples of 4), so 3- and
  // 2-wide tiles would only cost compile time (every MR x dtype x target instantiates them).
  for (; n < n1; ++n) Tile<kScaled, MR, 1>(a, B, C, m, n, K, pf);
}

template <int MR, class BV>
HWY_INLINE void StripOf(const RowSource& A, const BV& B, const Output& C, int64_t m, int64_t n0, int64_t n1, int64_t K,
                        NextRows& pf) {
  const auto a = ARows<MR>::Of(A, m);
  if (A.scale) {
    RowStrip<true, MR>(a, B, C, m, n0, n1, K, pf);
  } else {
    RowStrip<false, MR>(a, B, C, m, n0, n1, K, pf);
  }
}

// Rows per register tile: 3 x 4 accumulators fit AVX2's 16 registers; AVX-512's 32 hold 6 x 4
// (24 accumulators, 6 rows of A, 1 weight vector), which halves the B loads per FMA.
constexpr int kMaxRows = HWY_MAX_BYTES >= 64 ? 6 : 3;

template <class BV>
HWY_INLINE void Strip(int rows, const RowSource& A, const BV& B, const Output& C, int64_t m, int64_t n0, int64_t n1,
                      int64_t K, NextRows& pf) {
  switch (rows) {
    case 1:
      return StripOf<1>(A, B, C, m, n0, n1, K, pf);
    case 2:
      return StripOf<2>(A, B, C, m, n0, n1, K, pf);
    case 3:
      return StripOf<3>(A, B, C, m, n0, n1, K, pf);
#if HWY_MAX_BYTES >= 64
    case 4:
      return StripOf<4>(A, B, C, m, n0, n1, K, pf);
    case 5:
      return StripOf<5>(A, B, C, m, n0, n1, K, pf);
    case 6:
      return StripOf<6>(A, B, C, m, n0, n1, K, pf);
#endif
    default:
      return;
  }
}

// A block of B's columns is reused by every row strip of A while it sits in L2 (≈ 256 KB).
template <class BV>
void GemmBlocks(const RowSource& A, const BV& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  const int64_t row_bytes = std::max<int64_t>(1, B.row_bytes(K));
  const int64_t block_n = std::max<int64_t>(4, (256 * 1024 / row_bytes) / 4 * 4);
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t strips = (M + kMaxRows - 1) / kMaxRows;
  for (int64_t n0 = 0; n0 < N; n0 += block_n) {
    const int64_t n1 = std::min(N, n0 + block_n);
    // The next block's rows into L2 over this block's k steps (about (n1 - n0) / 4 tiles a strip).
    NextRows pf = B.next(n1, std::min(N, n1 + block_n), K, strips * ((n1 - n0 + 3) / 4) * (K / L));
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m));
      Strip(rows, A, B, C, m, n0, n1, K, pf);
    }
  }
}

// A decoded vector stored as f32, or as bf16 bits (uint16_t: the view's values are bf16 ones,
// decode_dtype bf16, so the narrowing is exact).
HWY_INLINE void StoreDecoded(DF df, hn::Vec<DF> v, float* dst) { hn::StoreU(v, df, dst); }
HWY_INLINE void StoreDecoded(DF, hn::Vec<DF> v, uint16_t* dst) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  hn::StoreU(hn::TruncateTo(d16, hn::ShiftRight<16>(hn::BitCast(du, v))), d16, dst);
}
inline float Narrowed(float v, float*) { return v; }
inline uint16_t Narrowed(float v, uint16_t*) { return f32_to_bf16(v); }  // exact: a bf16 value

// Row n of a quantized format's view decoded into dst [K], f32 or bf16 bits (`row`: its stored
// elements, B.row(n) or a copy unpacked into the view's form): exactly the values GroupedTile
// multiplies by.
template <class BV, class Out>
HWY_INLINE void DecodeRow(const BV& view, int64_t n, typename BV::Row row, int64_t K, Out* dst) {
  const BV B = view;  // a local copy, as in GroupedTile
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t g0 = 0; g0 < K; g0 += B.group()) {
    const typename BV::Scale s = B.scale(n, g0);
    const int64_t g1 = std::min(g0 + B.group(), K);
    for (int64_t k = g0; k < g1; k += L) StoreDecoded(df, B.decode(df, row, k, K, s), dst + k);
  }
}

// Whether a format's view decodes B's rows of K columns: groups and K of whole vectors (a group
// as long as the row, such as a per-channel scale's, needs only K to be).
// A weight rounded to f16 (WeightFormat::decode_dtype) needs the hardware conversion (F16C,
// AVX2 and up): Highway's emulation elsewhere does not round as f32_to_f16 does, so the scalar
// decode serves there.
HWY_INLINE bool ViewFits(const WeightMatrix& B, int64_t K) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
#if !HWY_ARCH_X86 || HWY_TARGET > HWY_AVX2
  if (B.format.decode_dtype == DType::f16) return false;
#endif
  return K % L == 0 && (B.format.block_cols % L == 0 || B.format.block_cols >= K);
}

// The two entry points of a format whose view `View` (constructed from the WeightMatrix) exists on
// this target when kInRegisters, where ViewFits:
//  GemmWithView: gemm_nt with the weights decoded in registers; false where it cannot.
//  DecodeRowsWith: rows [n0, n0 + rows) of B into dst [rows, K] with the tiles' values, element by
//  element through `scalar(B, n, k)` (the format's reference decode) where the view cannot; dst
//  f32, or bf16 bits for a B whose values are bf16 ones (decode_dtype bf16: the bf16 compute
//  mode's decoded blocks, gemm.cpp), narrowed as each vector is stored.
template <class View, bool kInRegisters>
HWY_INLINE bool GemmWithView(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N,
                             int64_t K) {
  if constexpr (!kInRegisters) {
    return false;
  } else {
    if (!ViewFits(B, K)) return false;
    GemmBlocks(A, View{B}, C, M, N, K);
    return true;
  }
}

// Whether GemmWithView<View, kInRegisters> takes B [.., K] on this target (the kernel plan asks).
template <bool kInRegisters>
HWY_INLINE bool ViewTakes(const WeightMatrix& B, int64_t K) {
  if constexpr (!kInRegisters) {
    return false;
  } else {
    return ViewFits(B, K);
  }
}

template <class View, bool kInRegisters, class Out, class Scalar>
HWY_INLINE void DecodeRowsWith(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, Out* dst,
                               const Scalar& scalar) {
  const bool simd = kInRegisters && ViewFits(B, K);
  for (int64_t r = 0; r < rows; ++r) {
    Out* d = dst + r * K;
    const int64_t n = n0 + r;
    if constexpr (kInRegisters) {
      if (simd) {
        const View view{B};
        DecodeRow(view, n, view.row(n), K, d);
        continue;
      }
    }
    for (int64_t k = 0; k < K; ++k) d[k] = Narrowed(scalar(B, n, k), d);
  }
  (void)simd;
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_DOT_INL_H_
