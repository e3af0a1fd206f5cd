// The forward kernel on packed weight panels (Highway, dynamic dispatch per CPU target).
//
// C[M, N] (+)= A[M, K] · B[N, K]ᵀ with B repacked once at load into [K, 16] panels (gemm.hpp,
// WeightLayout::panels) in its stored dtype. Each k step reads 16 consecutive weights of a
// panel — one contiguous stream per panel instead of one per output row — and broadcasts A, as
// gemm_nn does (outer-inl.h). Measured against the dot-product kernel on rows: see
// docs/performance.md. The rows past N in the last panel are zeros, so loads never need a mask;
// only the stores of a column tail are partial.
#include <algorithm>

#include "kernels/gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_panel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/outer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tiles: AVX2 / SSE4 / NEON (16 registers) 6 rows × 16 columns (2 or 4 vectors: 12 accumulators);
// AVX-512 (32 registers) 12 rows × 32 columns (two panels: 24 accumulators).
constexpr int kPanelVectorsPerTile = HWY_LANES(float) >= 16 ? 2 : static_cast<int>(kPanelRows / HWY_LANES(float));
constexpr int kPanelNv = kPanelVectorsPerTile > 4 ? 4 : kPanelVectorsPerTile;
constexpr int kPanelMr = HWY_LANES(float) >= 16 ? 12 : (HWY_LANES(float) >= 8 ? 6 : 3);

template <int MR, bool kScaled, typename TB, bool kPrefetch>
struct PanelOps {
  ARows<MR> a;
  const TB* b[kPanelNv];  // vector j's first weight at k = 0
  // The next column block, fetched into L2 at an even pace over the whole block's work: step k
  // of this tile prefetches line (fp0 + k · inc) >> 32 of it (PanelMaker::make).
  const char* pf = nullptr;
  uint64_t fp0 = 0, inc = 0;
  struct Step {
    int64_t k;
  };
  Step step(int64_t k) const {
    if constexpr (kPrefetch)
      __builtin_prefetch(pf + ((fp0 + static_cast<uint64_t>(k) * inc) >> 32) * 64, 0, 2);
    return {k};
  }
  float a_at(const Step& st, int i) const { return a.template at<kScaled>(i, st.k); }
  template <bool kTail>
  hn::Vec<DF> b_at(DF df, const Step& st, int j, int64_t) const {
    return WidenLoad(df, b[j] + st.k * kPanelRows);  // whole vector: panels are zero-padded
  }
};

template <bool kScaled, typename TB, bool kPrefetch>
struct PanelMaker {
  const RowSource* A;
  const TB* B;
  int64_t N, K;
  // The next block's first line and its lines (0: none, `next` is then this block's first line,
  // already resident), the current block's first column, its tiles per strip and the block's
  // work in row-steps (rows × tiles per strip × K), over which the next block is spread.
  const char* next = nullptr;
  int64_t next_lines = 0, n0 = 0, tiles_per_strip = 1, work = 1;
  template <int MR>
  PanelOps<MR, kScaled, TB, kPrefetch> make(int64_t m, int64_t n) const {
    PanelOps<MR, kScaled, TB, kPrefetch> ops;
    // Lines per row-step in 32.32 fixed point; this tile's row-steps start after the strips
    // above it (m rows) and the tiles left of it in its strip. The last step's line is < lines.
    const uint64_t ratio = (static_cast<uint64_t>(next_lines) << 32) / static_cast<uint64_t>(work);
    const int64_t start = (m * tiles_per_strip + (n - n0) / 32 * MR) * K;
    ops.pf = next;
    ops.fp0 = static_cast<uint64_t>(start) * ratio;
    ops.inc = static_cast<uint64_t>(MR) * ratio;
    ops.a = ARows<MR>::Of(*A, m);
    const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
    const int64_t last = (N + kPanelRows - 1) / kPanelRows * kPanelRows - L;
    for (int j = 0; j < kPanelNv; ++j) {
      // Vector j covers columns c .. c + L - 1 of one panel (L divides 16). A vector past the
      // last panel is never read (only j = 0 is, in a narrower tile), so it is clamped in bounds.
      const int64_t c = std::min(n + j * L, last);
      ops.b[j] = B + (c / kPanelRows) * kPanelRows * K + c % kPanelRows;
    }
    return ops;
  }
};

// Column blocks of 64 (four panels, 64·K weights: 512 KB at K = 2048 f32) stay in L2 while
// every row tile passes over them. With more than one strip of rows the next block is fetched
// into L2 meanwhile, at an even pace over all the block's tiles, weighted by their rows
// (docs/performance.md: Xeon, T = 512 f32 -5 %, bf16 weights -11 %; paced evenly instead of one
// line per k step of the first tiles, -7 % more; with one strip — decode, small batches — it
// measured slower). A software prefetch holds one of the core's few L1 miss buffers until its line
// arrives from DRAM, so bursts of them stall the loads of the tiles; an even pace does not.
template <bool kScaled, typename TB, bool kPrefetch>
void PanelGemm(const RowSource& A, const TB* B, const Output& C, int64_t M, int64_t N, int64_t K) {
  PanelMaker<kScaled, TB, kPrefetch> make{&A, B, N, K};
  constexpr int64_t kBlock = 4 * kPanelRows;
  const int64_t panel_bytes = kPanelRows * K * static_cast<int64_t>(sizeof(TB));
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t n1 = std::min(N, n0 + kBlock);
    const int64_t next_panels = n1 < N ? (std::min(N, n1 + kBlock) - n1 + kPanelRows - 1) / kPanelRows : 0;
    make.next = reinterpret_cast<const char*>(B + (next_panels > 0 ? n1 / kPanelRows : n0 / kPanelRows) * kPanelRows * K);
    make.next_lines = next_panels * panel_bytes / 64;
    make.n0 = n0;
    make.tiles_per_strip = (n1 - n0 + 31) / 32;
    make.work = std::max<int64_t>(1, M * make.tiles_per_strip * K);
    for (int64_t m = 0; m < M; m += kPanelMr)
      OuterRows<kPanelNv, kPanelMr>(static_cast<int>(std::min<int64_t>(kPanelMr, M - m)), make, K, C, m, n0, n1);
  }
}

template <typename TB>
void PanelTyped(const RowSource& A, const TB* B, const Output& C, int64_t M, int64_t N, int64_t K) {
  const bool pf = M > kPanelMr;
  if (A.scale) {
    pf ? PanelGemm<true, TB, true>(A, B, C, M, N, K) : PanelGemm<true, TB, false>(A, B, C, M, N, K);
  } else {
    pf ? PanelGemm<false, TB, true>(A, B, C, M, N, K) : PanelGemm<false, TB, false>(A, B, C, M, N, K);
  }
}

void GemmNtPanels(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (B.dtype) {
    case DType::bf16:
      return PanelTyped(A, static_cast<const hwy::bfloat16_t*>(B.data), C, M, N, K);
    case DType::f16:
      return PanelTyped(A, static_cast<const hwy::float16_t*>(B.data), C, M, N, K);
    default:
      return PanelTyped(A, static_cast<const float*>(B.data), C, M, N, K);
  }
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
