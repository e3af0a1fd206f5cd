// The backward micro-kernel (Highway, dynamic dispatch per CPU target): outer products.
//
// gemm_nn: C[M, N] (+)= A[M, K] · B[K, N]   (dx = dh · W, W stored [out, in] and read along in)
// gemm_tn: C[M, N] (+)= Σ_k A(k)[m] · B(k)[n] (dW = dhᵀ · x over the rows routed to one expert)
//
// The tiles are outer-inl.h's: every C element is one sequential FMA chain over k from +0, an
// order that depends on nothing but K and that the scalar reference twin reproduces with std::fma.
// Column tails go through a zero-padded copy of B's row and a buffered store, with the same
// arithmetic per lane, so a column gives the same bits whichever tile or thread computed it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_outer.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/outer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// gemm_nn: a(i, k) = A row (m + i) at k (times its scale); B row k = B + k * ldb. kFirst: the
// first strip of rows over a column block, which brings the block's rows in (prefetching) and
// stores each B vector it loads, widened to f32, into the block's contiguous copy (row k at
// pack + k * ldp) for the other strips.
template <int MR, bool kScaled, typename TB, bool kFirst = false, bool kCopy = false>
struct NnOps {
  ARows<MR> a;
  const TB* b;
  int64_t ldb;
  float* pack = nullptr;
  int64_t ldp = 0;
  struct Step {
    int64_t k;
  };
  Step step(int64_t k) const {
    if constexpr (kFirst) {
      // Row k + 16's lines (the widest tile's 4 vectors; a prefetch past the last row reads
      // nothing and never faults): the hardware prefetchers do not follow a few lines per row
      // at such strides.
      const char* p = reinterpret_cast<const char*>(b + (k + 16) * ldb);
      const int64_t bytes = 4 * static_cast<int64_t>(hn::Lanes(DF()) * sizeof(TB));
      for (int64_t l = 0; l < bytes; l += 64) __builtin_prefetch(p + l, 0, 3);
    }
    return {k};
  }
  float a_at(const Step& st, int i) const { return a.template at<kScaled>(i, st.k); }
  template <bool kTail>
  hn::Vec<DF> b_at(DF df, const Step& st, int j, int64_t cols) const {
    const auto v = LoadRow<kTail>(df, b + st.k * ldb, j, cols);
    if constexpr (kFirst && kCopy)
      hn::StoreU(v, df, pack + st.k * ldp + j * static_cast<int64_t>(hn::Lanes(df)));
    return v;
  }
};

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
// (AVX2 / SSE4 / NEON 16: 4 × 3; AVX-512 32: 6 × 4).
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

// gemm_nn reads B (the weights) in place, down its columns: a tile's B rows are a whole row
// stride apart (8 KB for D = 2048 f32), so a column block's rows fall into few cache sets and
// may not stay in L2 (crowds_l2 below). There the first strip of A's rows over a column block
// reads the rows in place, prefetching ahead, and stores every vector it loads into a
// contiguous f32 copy of the block; the other strips read that copy (L2-resident, sequential:
// 96 KB at K = 768 on AVX-512's 32-column blocks). The copy costs the first strip one store per
// vector loaded and no pass of its own: a separate copying pass before the products cost as
// much as they did at an expert's few rows (docs/performance.md). Values and chains are the same
// from either source (widening is exact), so the bits are too.
template <bool kScaled, typename TB, bool kFirst, bool kCopy>
struct NnMaker {
  const RowSource* A;
  const TB* B;  // the block's first column (kFirst: in place; else: the copy)
  int64_t ldb;
  int64_t n0;  // the block's first column
  float* pack;
  int64_t ldp;
  template <int MR>
  NnOps<MR, kScaled, TB, kFirst, kCopy> make(int64_t m, int64_t n) const {
    NnOps<MR, kScaled, TB, kFirst, kCopy> ops;
    ops.a = ARows<MR>::Of(*A, m);
    ops.b = B + (n - n0);
    ops.ldb = ldb;
    if constexpr (kFirst && kCopy) {
      ops.pack = pack + (n - n0);
      ops.ldp = ldp;
    }
    return ops;
  }
};

// The column block's copy (K rows of a block's vectors), per thread, grown and never shrunk.
std::vector<float>& nn_block_copy() {
  thread_local std::vector<float> copy;
  return copy;
}

// Column blocks of NV vectors, strips of MR rows. kCopy: the first strip reads the block in
// place and copies it, the others read the copy; else every strip reads in place (the first
// prefetching), the block staying in L2.
template <int MR, int NV, bool kCopy, bool kScaled, typename TB>
void NnBlocks(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N,
              int64_t K) {
  const DF df;
  const int64_t width = NV * static_cast<int64_t>(hn::Lanes(df));
  float* copy = nullptr;
  if constexpr (kCopy) {
    std::vector<float>& buf = nn_block_copy();
    if (buf.size() < static_cast<size_t>(K * width)) buf.resize(static_cast<size_t>(K * width));
    copy = buf.data();
  }
  for (int64_t n0 = 0; n0 < N; n0 += width) {
    const int64_t n1 = std::min(N, n0 + width);
    const NnMaker<kScaled, TB, true, kCopy> first{&A, B + n0, ldb, n0, copy, width};
    for (int64_t m = 0; m < M; m += MR) {
      const int rows = static_cast<int>(std::min<int64_t>(MR, M - m));
      if (m == 0) {
        OuterRows<NV, MR>(rows, first, K, C, m, n0, n1);
      } else if constexpr (kCopy) {
        OuterRows<NV, MR>(rows,
                          NnMaker<kScaled, float, false, false>{&A, copy, width, n0, nullptr, 0}, K,
                          C, m, n0, n1);
      } else {
        OuterRows<NV, MR>(rows, NnMaker<kScaled, TB, false, false>{&A, B + n0, ldb, n0, nullptr, 0},
                          K, C, m, n0, n1);
      }
    }
  }
}

// Whether a column block's K rows, `stride` bytes apart, crowd into too few L2 sets to stay
// there while the strips pass: the rows start at kL2Period / gcd(stride, kL2Period) distinct
// set offsets (kL2Period = sets × line: 128 KB on a 2 MB 16-way L2, and on a 1 MB 8-way one),
// and more than kRowsPerOffset rows at one offset fill its sets' ways. 8 KB strides (D = 2048
// f32) at K = 768 put 48 rows on each of 16 offsets; 3 KB (F = 768 f32) at K = 2048 16 on 128;
// 5.5 KB (F = 1408) at K = 2048 8 on 256, which stays.
constexpr int64_t kL2Period = 128 * 1024;
constexpr int64_t kRowsPerOffset = 8;
inline bool crowds_l2(int64_t stride, int64_t K) {
  const int64_t offsets = kL2Period / std::gcd(stride, kL2Period);
  return K > kRowsPerOffset * offsets;
}

// Where the rows crowd the cache, the block is copied, on taller and narrower tiles (12 × 2
// vectors on AVX-512: 2 loads of the copy per 24 FMAs, measured faster than 6 × 4 there); else
// it stays in L2 in place, where copying measured slower (docs/performance.md).
template <bool kScaled, typename TB>
void NnDispatch(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N,
                int64_t K) {
  constexpr int kCopyMr = HWY_MAX_BYTES >= 64 ? 12 : kMr, kCopyNv = HWY_MAX_BYTES >= 64 ? 2 : kNv;
  if (M > kCopyMr && crowds_l2(ldb * static_cast<int64_t>(sizeof(TB)), K))
    return NnBlocks<kCopyMr, kCopyNv, true, kScaled>(A, B, ldb, C, M, N, K);
  NnBlocks<kMr, kNv, false, kScaled>(A, B, ldb, C, M, N, K);
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

template <typename TB>
void NnTyped(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N, int64_t K) {
  if (A.scale) {
    NnDispatch<true>(A, B, ldb, C, M, N, K);
  } else {
    NnDispatch<false>(A, B, ldb, C, M, N, K);
  }
}

void GemmNn(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (B.dtype) {
    case DType::bf16:
      return NnTyped(A, static_cast<const hwy::bfloat16_t*>(B.data), B.ld, C, M, N, K);
    case DType::f16:
      return NnTyped(A, static_cast<const hwy::float16_t*>(B.data), B.ld, C, M, N, K);
    default:
      return NnTyped(A, static_cast<const float*>(B.data), B.ld, C, M, N, K);
  }
}

void GemmTn(const RowSource& A, const RowSource& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  if (A.scale && B.scale) return OuterGemm(TnMaker<true, true>{&A, &B}, C, M, N, K);
  if (A.scale) return OuterGemm(TnMaker<true, false>{&A, &B}, C, M, N, K);
  if (B.scale) return OuterGemm(TnMaker<false, true>{&A, &B}, C, M, N, K);
  OuterGemm(TnMaker<false, false>{&A, &B}, C, M, N, K);
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
