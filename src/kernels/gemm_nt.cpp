// The forward micro-kernel (Highway, dynamic dispatch per CPU target).
//
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ with B the weights as stored, [out, in], A's rows read in
// place through a RowSource (gathered, optionally scaled). The kernel computes
// register tiles of up to 3 rows × 4 columns as dot products: each C element owns one vector
// accumulator whose lane j sums k ≡ j (mod lanes) sequentially with FMA, then the lanes are
// reduced in a fixed order. That order depends only on K and the CPU target, never on the tile
// an element landed in, M, N or the thread count, so results are bit-identical however the
// work is split. B is streamed in its stored dtype (f32, bf16 or f16) and widened in registers:
// a bf16 or f16 model is never expanded in memory.
#include "kernels/gemm.hpp"
#include "kernels/prefetch.hpp"

#include <algorithm>
#include <cstring>


#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_nt.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/outer-inl.h"  // WidenLoad, ARows, LoadA, DF

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
  const TB* base;
  int64_t ldb;
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
  const TB* base;
  int64_t panel_stride;  // kPanelRows · N
  const TB* at(int64_t n, int64_t k) const {
    return base + (k / kPanelRows) * panel_stride + n * kPanelRows + k % kPanelRows;
  }
  NextRows next(int64_t, int64_t, int64_t, int64_t) const { return {}; }  // no prefetch: empty
};

// One MR x NR tile over the full K. Tail lanes (K % lanes) come from zero-padded copies, so
// they add exact zeros and never read past the rows.
template <bool kScaled, int MR, int NR, class BV>
HWY_INLINE void Tile(const ARows<MR>& a_rows, const BV& B, const Output& C, int64_t m, int64_t n, int64_t K,
                     NextRows& pf) {
  using TB = typename BV::T;
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
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
  StoreDotTile(df, acc, C, m, n);
}

template <bool kScaled, int MR, class BV>
HWY_INLINE void RowStrip(const ARows<MR>& a, const BV& B, const Output& C, int64_t m, int64_t n0,
                         int64_t n1, int64_t K, NextRows& pf) {
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
HWY_INLINE void StripOf(const RowSource& A, const BV& B, const Output& C, int64_t m, int64_t n0,
                        int64_t n1, int64_t K, NextRows& pf) {
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
HWY_INLINE void Strip(int rows, const RowSource& A, const BV& B, const Output& C, int64_t m,
                      int64_t n0, int64_t n1, int64_t K, NextRows& pf) {
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
  const int64_t row_bytes = std::max<int64_t>(1, K * static_cast<int64_t>(sizeof(typename BV::T)));
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

template <template <typename> class BV, class... Args>
void ByDtype(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K,
             int64_t stride) {
  switch (B.dtype) {
    case DType::bf16:
      return GemmBlocks(A, BV<hwy::bfloat16_t>{static_cast<const hwy::bfloat16_t*>(B.data), stride}, C, M, N, K);
    case DType::f16:
      return GemmBlocks(A, BV<hwy::float16_t>{static_cast<const hwy::float16_t*>(B.data), stride}, C, M, N, K);
    default:
      return GemmBlocks(A, BV<float>{static_cast<const float*>(B.data), stride}, C, M, N, K);
  }
}

void GemmNt(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  ByDtype<RowsB>(A, B, C, M, N, K, B.ld);
}

// f32 -> bf16, round to nearest even (f32_to_bf16's rule; a NaN becomes a quiet NaN), as the
// upper 16 bits of each u32 lane.
template <class DU>
HWY_INLINE hn::Vec<DU> RoundedBf16Bits(DU du, hn::Vec<DF> v) {
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb));
  const auto quiet = hn::Or(bits, hn::Set(du, 0x400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
}

// round_to_bf16's kernel: rows of A (gathered, scaled) rounded to bf16, stored as bf16 or as the
// f32 values they are, rows `ld` elements apart.
void RoundRowsBf16(const RowSource& A, int64_t rows, int64_t K, bool as_f32, void* dst, int64_t ld) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t i = 0; i < rows; ++i) {
    const float* src = A.row(i);
    const float s = A.factor(i);
    float* out32 = static_cast<float*>(dst) + i * ld;
    uint16_t* out16 = static_cast<uint16_t*>(dst) + i * ld;
    int64_t k = 0;
    for (; k + L <= K; k += L) {
      auto v = hn::LoadU(df, src + k);
      if (A.scale) v = hn::Mul(v, hn::Set(df, s));
      const auto bits = RoundedBf16Bits(du, v);
      if (as_f32) {
        hn::StoreU(hn::BitCast(df, hn::And(bits, hn::Set(du, 0xffff0000u))), df, out32 + k);
      } else {
        hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(bits))), d16, out16 + k);
      }
    }
    for (; k < K; ++k) {
      const std::uint16_t b = f32_to_bf16(A.scale ? src[k] * s : src[k]);
      if (as_f32) {
        out32[k] = bf16_to_f32(b);
      } else {
        out16[k] = b;
      }
    }
  }
}

// gemm_nn with B = W [K, N] packed in panels over K (the forward's packing of W [out, in]).
// `n_total` is W's full column count (the panel stride), N the columns of this call.
void GemmNnPanels(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K,
                  int64_t n_total) {
  ByDtype<PanelsT>(A, B, C, M, N, K, kPanelRows * n_total);
}

// The name of the target this translation unit was compiled for ("AVX3", "AVX2", ...).
const char* TargetNameOfThisTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNt);
HWY_EXPORT(RoundRowsBf16);
HWY_EXPORT(GemmNnPanels);
HWY_EXPORT(TargetNameOfThisTarget);

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetNameOfThisTarget)(); }

void detail::gemm_nt_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                            std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNt)(A, B, C, M, N, K);
}

void detail::round_rows_bf16(const RowSource& A, std::int64_t rows, std::int64_t K, bool as_f32, void* dst,
                             std::int64_t ld) {
  if (rows <= 0 || K <= 0) return;
  HWY_DYNAMIC_DISPATCH(RoundRowsBf16)(A, rows, K, as_f32, dst, ld);
}

void detail::gemm_nn_panel_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                  std::int64_t N, std::int64_t K, std::int64_t n_total) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNnPanels)(A, B, C, M, N, K, n_total);
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
