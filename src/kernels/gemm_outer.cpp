// The backward micro-kernel (Highway, dynamic dispatch per CPU target): outer products.
//
// gemm_nn: C[M, N] (+)= A[M, K] · B[K, N]   (dx = dh · W, W stored [out, in] and read along in)
// gemm_tn: C[M, N] (+)= Σ_k A(k)[m] · B(k)[n] (dW = dhᵀ · x over the rows routed to one expert)
//
// gemm_tn's tiles are outer-inl.h's, gemm_nn's its own (NnChunkTile, B streamed in chunks of
// rows): either way every C element is one sequential FMA chain over k from +0, an order that
// depends on nothing but K and that the scalar reference twin reproduces with std::fma.
// Column tails go through a zero-padded copy of B's row and a buffered store, with the same
// arithmetic per lane, so a column gives the same bits whichever tile or thread computed it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/prefetch.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_outer.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include "kernels/outer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// gemm_tn: a(i, k) = A(k)[m + i] · sA(k); b(k, ·) = B(k) · sB(k) (rows gathered by RowSource).
// Each side's scale is its own template flag: an unscaled side pays no multiply (the backward's
// dW_down scales only A, Llama-4's dW_gate/up only B).
template <bool kScaledA, bool kScaledB>
struct TnOps {
  RowSource A, B;
  int64_t m, n;
  struct Step {
    const float* a;
    const float* b;
    float sa, sb;
  };
  Step step(int64_t k) const { return {A.row(k) + m, B.row(k) + n, A.factor(k), B.factor(k)}; }
  float a_at(const Step& st, int i) const { return kScaledA ? st.a[i] * st.sa : st.a[i]; }
  template <bool kTail>
  hn::Vec<DF> b_at(DF df, const Step& st, int j, int64_t cols) const {
    const auto v = LoadRow<kTail>(df, st.b, j, cols);
    if constexpr (kScaledB) return hn::Mul(v, hn::Set(df, st.sb));
    return v;
  }
};

// Register tile shapes: MR × NV accumulators + NV B vectors + 1 broadcast fit the register file
// (AVX-512's 32: 6 × 4; narrower targets 4 × 3, sized for AVX2's and SSE4's 16).
constexpr int kMr = HWY_MAX_BYTES >= 64 ? 6 : 4;
constexpr int kNv = HWY_MAX_BYTES >= 64 ? 4 : 3;

// Column blocks of B stay in L2 while every row tile of A passes over them: a block of
// kNv·lanes columns × K rows is 196 KB at K = 2048 f32 on AVX2.
// When all of B is small (gemm_tn over the few rows one expert got: K = 32 rows of N = 2048
// is 256 KB), it stays in L2 anyway: then each row tile sweeps all of N instead, so C is written
// row by row (contiguous stores) and A's elements of the tile are reused across the sweep. The
// order of tiles never changes an element's chain.
constexpr int64_t kSmallB = 256 * 1024;

template <class MakeOps>
HWY_INLINE void OuterGemm(const MakeOps& make, const Output& C, int64_t M, int64_t N, int64_t K) {
  const DF df;
  if (K * N * static_cast<int64_t>(sizeof(float)) <= kSmallB) {
    for (int64_t m = 0; m < M; m += kMr)
      OuterRows<kNv, kMr>(static_cast<int>(std::min<int64_t>(kMr, M - m)), make, K, C, m, 0, N);
    return;
  }
  const int64_t block = kNv * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n1 = std::min(N, n0 + block);
    for (int64_t m = 0; m < M; m += kMr) {
      OuterRows<kNv, kMr>(static_cast<int>(std::min<int64_t>(kMr, M - m)), make, K, C, m, n0, n1);
    }
  }
}

// gemm_nn streams B (the weights) once per block of C's rows (as many rows as kNnPartialBytes of
// partial sums hold), in chunks of whole rows: B's rows k0 .. k0 + kc (kc ≤ kNnChunk) are
// contiguous in memory (when the call covers all columns) and sit in L2 while every tile of the
// block passes over them, and the next chunk is prefetched into L2 a few lines per step while
// this one computes (NextRows). A tile's accumulators go on from the previous chunk's partial sums
// (an f32 scratch row per row of C, stored exactly), so every C element is still one FMA chain
// over k = 0 .. K-1 from +0, with the epilogue (row scale, accumulate) after the last chunk: the
// bits of one tile over all of K. A's rows of a strip are packed per chunk as the products see
// them (times their scale), k-major, so the tile's broadcasts read one contiguous line.
// Whole rows rather than a column block down all of K: the weights' rows are long (8 KB at 2048
// f32), which puts a column block's lines on few L2 sets and has the first strip read them from
// DRAM at a stride no prefetcher follows (docs/performance.md).
constexpr int64_t kNnChunk = 64;                 // rows of B per chunk
constexpr int64_t kNnPartialBytes = 384 * 1024;  // the partial sums of a block of C's rows

struct NnScratch {
  std::vector<float> partial, apack;
};
NnScratch& nn_scratch() {
  thread_local NnScratch s;
  return s;
}

// One tile of R rows × NV vectors (kTail: one vector's first `cols` columns) over one chunk.
// ap: the strip's packed A, ap[k * R + i]; b: B's chunk row 0 at the tile's first column;
// part: the tile's partial sums (row i at part + i * ldpart).
template <int R, int NV, bool kTail, typename TB>
HWY_INLINE void NnChunkTile(const float* HWY_RESTRICT ap, const TB* b, int64_t ldb, int64_t kc,
                            float* part, int64_t ldpart, bool first, bool last, const Output& C,
                            int64_t m, int64_t n, int64_t cols, NextRows& next) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[R][NV];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NV; ++j)
      acc[i][j] = first ? hn::Zero(df) : hn::LoadU(df, part + i * ldpart + j * L);
  for (int64_t k = 0; k < kc; ++k) {
    next.step();
    hn::Vec<DF> bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = LoadRow<kTail>(df, b + k * ldb, j, cols);
    for (int i = 0; i < R; ++i) {
      const auto a = hn::Set(df, ap[k * R + i]);
      for (int j = 0; j < NV; ++j) acc[i][j] = hn::MulAdd(a, bv[j], acc[i][j]);
    }
  }
  if (!last) {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NV; ++j) hn::StoreU(acc[i][j], df, part + i * ldpart + j * L);
    return;
  }
  StoreOuterTile<R, NV, kTail>(df, acc, C, m, n, cols);
}

template <int MR, int NV, bool kScaled, typename TB>
void NnStream(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N,
              int64_t K) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t ldpart = (N + L - 1) / L * L;
  // Rows of C per block: as many whole strips as the partial sums' budget holds (one at least).
  const int64_t fit = kNnPartialBytes / (ldpart * static_cast<int64_t>(sizeof(float))) / MR * MR;
  const int64_t mc = std::max<int64_t>(MR, std::min((M + MR - 1) / MR * MR, fit));
  NnScratch& s = nn_scratch();
  if (s.partial.size() < static_cast<size_t>(mc * ldpart))
    s.partial.resize(static_cast<size_t>(mc * ldpart));
  if (s.apack.size() < static_cast<size_t>(mc * kNnChunk))
    s.apack.resize(static_cast<size_t>(mc * kNnChunk));
  int64_t tiles = 0;  // column tiles per strip, for the prefetch's pace
  ForColumnTiles<NV>(0, N, [&](auto, auto, int64_t, int64_t) { ++tiles; });
  for (int64_t m0 = 0; m0 < M; m0 += mc) {
    const int64_t rows = std::min(mc, M - m0), strips = (rows + MR - 1) / MR;
    // K = 0: one empty chunk, the epilogue alone.
    for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kNnChunk) {
      const int64_t kc = std::min(kNnChunk, K - k0);
      const bool first = k0 == 0, last = k0 + kc == K;
      for (int64_t st = 0; st < strips; ++st)
        PackStrip<kScaled>(A, m0 + st * MR, std::min<int64_t>(MR, rows - st * MR), k0, kc,
                           s.apack.data() + st * MR * kNnChunk);
      const int64_t knext = std::min(kNnChunk, K - k0 - kc);
      NextRows next =
          NextRows::over(B + (k0 + kc) * ldb, knext, N * static_cast<int64_t>(sizeof(TB)),
                         ldb * static_cast<int64_t>(sizeof(TB)), tiles * strips * kc);
      const TB* bk = B + k0 * ldb;
      const auto tile = [&](auto nv, auto tail, int64_t n, int64_t cols) {
        for (int64_t st = 0; st < strips; ++st) {
          const int64_t m = m0 + st * MR;
          WithRows<MR>(static_cast<int>(std::min<int64_t>(MR, rows - st * MR)), [&](auto r) {
            NnChunkTile<decltype(r)::value, decltype(nv)::value, decltype(tail)::value>(
                s.apack.data() + st * MR * kNnChunk, bk + n, ldb, kc,
                s.partial.data() + (m - m0) * ldpart + n, ldpart, first, last, C, m, n, cols, next);
          });
        }
      };
      ForColumnTiles<NV>(0, N, tile);
    }
  }
}

template <bool kScaledA, bool kScaledB>
struct TnMaker {
  const RowSource* A;
  const RowSource* B;
  template <int MR>
  TnOps<kScaledA, kScaledB> make(int64_t m, int64_t n) const {
    return {*A, *B, m, n};
  }
};

// Tiles: 8 × 3 vectors on AVX-512 (24 accumulators, 3 B vectors, 1 broadcast of 32 registers;
// 6 × 4 and 12 × 2 fit too, compared in docs/performance.md), 4 × 3 on narrower targets.
constexpr int kNnMr = HWY_MAX_BYTES >= 64 ? 8 : kMr, kNnNv = HWY_MAX_BYTES >= 64 ? 3 : kNv;

template <typename TB>
void NnTyped(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N, int64_t K) {
  if (A.scale) {
    NnStream<kNnMr, kNnNv, true>(A, B, ldb, C, M, N, K);
  } else {
    NnStream<kNnMr, kNnNv, false>(A, B, ldb, C, M, N, K);
  }
}

void GemmNn(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (B.dtype) {
    case DType::bf16:
      return NnTyped(A, static_cast<const hwy::bfloat16_t*>(B.data), B.ld, C, M, N, K);
    case DType::f16:
      return NnTyped(A, static_cast<const hwy::float16_t*>(B.data), B.ld, C, M, N, K);
    case DType::f32:
      return NnTyped(A, static_cast<const float*>(B.data), B.ld, C, M, N, K);
    default:
      break;
  }
  // Not reached: the drivers (gemm.cpp) refuse other weights with a named error first.
  HWY_ABORT("moekit: float GEMM kernel reached with weights of dtype %s", dtype_name(B.dtype));
}

// dW = Aᵀ·B writes an [M, N] result from a short reduction (the rows routed to one expert): few
// FMAs per element stored, and a result not in cache costs a read for ownership of every line
// stored. From kStreamBytes up (and unless it is accumulated) whole aligned vectors go out with
// non-temporal stores instead, which skip that read and keep the result from evicting the
// operands (docs/performance.md). The fence (FlushStream) makes them visible before the pool
// reports the task done.
constexpr int64_t kStreamBytes = int64_t{1} << 20;

void GemmTn(const RowSource& A, const RowSource& B, const Output& C0, int64_t M, int64_t N, int64_t K) {
  Output C = C0;
  C.stream = !C.accumulate && M * N * static_cast<int64_t>(sizeof(float)) >= kStreamBytes;
  if (A.scale && B.scale) {
    OuterGemm(TnMaker<true, true>{&A, &B}, C, M, N, K);
  } else if (A.scale) {
    OuterGemm(TnMaker<true, false>{&A, &B}, C, M, N, K);
  } else if (B.scale) {
    OuterGemm(TnMaker<false, true>{&A, &B}, C, M, N, K);
  } else {
    OuterGemm(TnMaker<false, false>{&A, &B}, C, M, N, K);
  }
  if (C.stream) hwy::FlushStream();
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNn);
HWY_EXPORT(GemmTn);

void detail::gemm_nn_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                            std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNn)(A, B, C, M, N, K);
}

void detail::gemm_tn_kernel(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M,
                            std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmTn)(A, B, C, M, N, K);
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
