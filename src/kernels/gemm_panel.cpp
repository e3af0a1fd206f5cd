// The forward kernel on packed weight panels (Highway, dynamic dispatch per CPU target).
//
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ with B repacked once at load into [K, 16] panels (gemm.hpp,
// WeightLayout::panels) in its stored dtype. Each k step reads 16 consecutive weights of a
// panel — one contiguous stream per panel instead of one per output row — and broadcasts A's
// elements from a copy of its rows packed per call (PackRows), unrolled four k steps at a time.
// How it compares with the dot-product kernel on rows: docs/performance.md. The rows past N in
// the last panel are zeros, so loads never need a mask; only the stores of a column tail are
// partial.
#include <algorithm>
#include <vector>

#include "kernels/gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_panel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/outer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tiles: AVX2 6 rows × 16 columns (2 vectors), SSE4 / NEON 3 rows × 16 columns (4 vectors): 12
// accumulators, sized for 16 registers; AVX-512 (32 registers) 12 rows × 32 columns (two panels:
// 24 accumulators).
constexpr int kPanelVectorsPerTile = HWY_LANES(float) >= 16 ? 2 : static_cast<int>(kPanelRows / HWY_LANES(float));
constexpr int kPanelNv = kPanelVectorsPerTile > 4 ? 4 : kPanelVectorsPerTile;
constexpr int kPanelMr = HWY_LANES(float) >= 16 ? 12 : (HWY_LANES(float) >= 8 ? 6 : 3);

// Strips of rows: ceil(M / kPanelMr) of them, their heights as even as can be (41 rows: 11, 10,
// 10, 10 rather than 12, 12, 12, 5 — a short strip reads the same weights for fewer products, so
// it runs on L2's bandwidth instead of the FMA units). Calls f(m, R) for each: first row, height.
template <class F>
HWY_INLINE void ForStrips(int64_t M, const F& f) {
  const int64_t strips = (M + kPanelMr - 1) / kPanelMr;
  for (int64_t s = 0, m = 0; s < strips; ++s) {
    const int64_t R = M / strips + (s < M % strips ? 1 : 0);
    f(m, R);
    m += R;
  }
}

// A's rows, packed once per call (at most kPackFloats at a time, or one strip of kPanelMr rows
// if that is more; into a thread_local vector that grows to the largest) strip by strip
// (ForStrips) and in chunks of kKc k: the strip from row m at m · Kp (Kp: K rounded up to kKc),
// and in it chunk c's row i at (c · R + i) · kKc for a strip of R rows — each run a plain copy
// of kKc floats (times the row's factor when scaled). A tile then reads its broadcasts at fixed
// offsets from one pointer.
constexpr int64_t kKc = 16;
constexpr int64_t kPackFloats = int64_t{1} << 20;  // 4 MB: 512 rows at K = 2048
// A packed row's length: K rounded up to whole chunks.
constexpr int64_t PackedK(int64_t K) { return (K + kKc - 1) / kKc * kKc; }
// Columns of the widest tile (ForColumnTiles' NV vectors).
HWY_INLINE int64_t TileCols() { return kPanelNv * static_cast<int64_t>(hn::Lanes(DF())); }

template <bool kScaled>
void PackRows(const RowSource& A, int64_t M, int64_t K, float* dst) {
  const int64_t Kp = PackedK(K);
  ForStrips(M, [&](int64_t m, int64_t R) {
    float* strip = dst + m * Kp;
    for (int64_t i = 0; i < R; ++i) {
      const float* src = A.row(m + i);
      const float f = A.factor(m + i);
      for (int64_t k0 = 0; k0 < K; k0 += kKc) {
        float* d = strip + (k0 / kKc * R + i) * kKc;
        const int64_t n = std::min(kKc, K - k0);
        for (int64_t k = 0; k < n; ++k) d[k] = kScaled ? src[k0 + k] * f : src[k0 + k];
      }
    }
  });
}

// Where the tiles of one column block find their operands and their share of the next block.
// The next block is fetched into L2 at an even pace over all the block's tiles, weighted by
// their rows: `ratio` is its lines per row-step of the block's work (rows × tiles per strip × K)
// in 32.32 fixed point, and step k of a tile whose work starts at row-step s prefetches the line
// ((s + k · rows) · ratio) >> 32 (at byte offset (…) >> 26, inside that line).
template <typename TB>
struct PanelBlock {
  const float* pack;  // PackRows
  const TB* B;
  int64_t N, K;
  const char* next = nullptr;  // the next block's first line (none: this block's, resident)
  uint64_t ratio = 0;
  int64_t n0 = 0, tiles_per_strip = 1;
};

// One k step of a tile: NV weight vectors at row k of their panels, MR broadcasts of A at
// ak[i · kKc] (PackRows), and the prefetch of the step's line of the next block.
template <int MR, int NV, bool kPrefetch, typename TB>
HWY_INLINE void PanelStep(DF df, hn::Vec<DF> (&acc)[MR][NV], const TB* const (&b)[NV], const float* ak, int64_t k,
                          const char* pf, uint64_t fp) {
  if constexpr (kPrefetch) __builtin_prefetch(pf + (fp >> 26), 0, 2);
  hn::Vec<DF> bv[NV];
  for (int j = 0; j < NV; ++j) bv[j] = WidenLoad(df, b[j] + k * kPanelRows);
  for (int i = 0; i < MR; ++i) {
    const auto ai = hn::Set(df, ak[i * kKc]);
    for (int j = 0; j < NV; ++j) acc[i][j] = hn::MulAdd(ai, bv[j], acc[i][j]);
  }
}

template <int MR, int NV, bool kTail, bool kPrefetch, typename TB>
HWY_INLINE void PanelTile(const PanelBlock<TB>& blk, const Output& C, int64_t m, int64_t n, int64_t cols) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t K = blk.K;
  const TB* b[NV];
  const int64_t last = (blk.N + kPanelRows - 1) / kPanelRows * kPanelRows - L;
  for (int j = 0; j < NV; ++j) {
    // Vector j covers columns c .. c + L - 1 of one panel (L divides 16); clamped in bounds.
    const int64_t c = std::min(n + j * L, last);
    b[j] = blk.B + (c / kPanelRows) * kPanelRows * K + c % kPanelRows;
  }
  uint64_t fp = static_cast<uint64_t>((m * blk.tiles_per_strip + (n - blk.n0) / TileCols() * MR) * K) * blk.ratio;
  const uint64_t inc = static_cast<uint64_t>(MR) * blk.ratio;
  const char* pf = blk.next;
  const float* a = blk.pack + m * PackedK(K);

  hn::Vec<DF> acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = hn::Zero(df);
  int64_t k0 = 0;
  for (; k0 + kKc <= K; k0 += kKc, a += MR * kKc) {
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < kKc; ++kk) {
      PanelStep<MR, NV, kPrefetch>(df, acc, b, a + kk, k0 + kk, pf, fp);
      fp += inc;
    }
  }
  for (int64_t kk = 0; k0 + kk < K; ++kk) {
    PanelStep<MR, NV, kPrefetch>(df, acc, b, a + kk, k0 + kk, pf, fp);
    fp += inc;
  }
  StoreOuterTile<MR, NV, kTail>(df, acc, C, m, n, cols);
}

// Column blocks of 32 (two panels, 32·K weights: 256 KB at K = 2048 f32) stay in L2 while
// every row tile passes over them; a block this narrow (one tile column on AVX-512) leaves L2
// room for the next block and the packed rows besides. With more than one strip of rows the
// next block is fetched into L2 meanwhile, at an even pace over all the block's tiles rather
// than in a burst at their start; with one strip (decode, small batches) the tile is itself the
// stream, left to the hardware prefetchers (docs/performance.md).
template <typename TB, bool kPrefetch>
void PanelRowsBlock(PanelBlock<TB>& blk, const Output& C, int64_t M) {
  const int64_t N = blk.N, K = blk.K;
  constexpr int64_t kBlock = 2 * kPanelRows;
  const int64_t panel_bytes = kPanelRows * K * static_cast<int64_t>(sizeof(TB));
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t n1 = std::min(N, n0 + kBlock);
    const int64_t next_panels = n1 < N ? (std::min(N, n1 + kBlock) - n1 + kPanelRows - 1) / kPanelRows : 0;
    blk.next = reinterpret_cast<const char*>(blk.B + (next_panels > 0 ? n1 : n0) / kPanelRows * kPanelRows * K);
    blk.n0 = n0;
    blk.tiles_per_strip = (n1 - n0 + TileCols() - 1) / TileCols();
    const int64_t lines = next_panels * panel_bytes / 64, work = std::max<int64_t>(1, M * blk.tiles_per_strip * K);
    blk.ratio = (static_cast<uint64_t>(lines) << 32) / static_cast<uint64_t>(work);
    ForStrips(M, [&](int64_t m, int64_t R) {
      WithRows<kPanelMr>(static_cast<int>(R), [&](auto r) {
        ForColumnTiles<kPanelNv>(n0, n1, [&](auto nv, auto tail, int64_t n, int64_t cols) {
          PanelTile<decltype(r)::value, decltype(nv)::value, decltype(tail)::value, kPrefetch>(blk, C, m, n, cols);
        });
      });
    });
  }
}

template <typename TB>
void PanelTyped(const RowSource& A, const TB* B, const Output& C, int64_t M, int64_t N, int64_t K) {
  thread_local std::vector<float> pack;
  const int64_t Kp = PackedK(K);
  const int64_t rows = std::max<int64_t>(kPanelMr, kPackFloats / std::max(Kp, kKc) / kPanelMr * kPanelMr);
  const int64_t mb = std::min(M, rows);
  // Never empty, so the packed pointer is never null (K = 0 packs nothing).
  const size_t need = static_cast<size_t>(std::max<int64_t>(1, mb * Kp));
  if (pack.size() < need) pack.resize(need);
  for (int64_t m0 = 0; m0 < M; m0 += mb) {
    const int64_t r = std::min(mb, M - m0);
    const RowSource a = A.from(m0);
    A.scale ? PackRows<true>(a, r, K, pack.data()) : PackRows<false>(a, r, K, pack.data());
    PanelBlock<TB> blk{pack.data(), B, N, K};
    const Output c{C.data + m0 * C.ld, C.ld, C.row_scale ? C.row_scale + m0 : nullptr, C.accumulate};
    r > kPanelMr ? PanelRowsBlock<TB, true>(blk, c, r) : PanelRowsBlock<TB, false>(blk, c, r);
  }
}

void GemmNtPanels(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (B.dtype) {
    case DType::bf16:
      return PanelTyped(A, static_cast<const hwy::bfloat16_t*>(B.data), C, M, N, K);
    case DType::f16:
      return PanelTyped(A, static_cast<const hwy::float16_t*>(B.data), C, M, N, K);
    case DType::f32:
      return PanelTyped(A, static_cast<const float*>(B.data), C, M, N, K);
    default:
      break;
  }
  // Not reached: the drivers (gemm.cpp) refuse other weights with a named error first.
  HWY_ABORT("moekit: float GEMM kernel reached with weights of dtype %s", dtype_name(B.dtype));
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNtPanels);

void detail::gemm_nt_panel_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                  std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNtPanels)(A, B, C, M, N, K);
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
