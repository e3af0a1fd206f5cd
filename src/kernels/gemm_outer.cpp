// The backward micro-kernel (Highway, dynamic dispatch per CPU target): outer products.
//
// gemm_nn: C[M, N] (+)= A[M, K] · B[K, N]   (dx = dh · W, W stored [out, in] and read along in)
// gemm_tn: C[M, N] (+)= Σ_k A(k)[m] · B(k)[n] (dW = dhᵀ · x over the rows routed to one expert)
//
// A register tile is MR rows × NV vectors of C. Each step k loads NV vectors of B's row k
// (widened to f32 in registers when B is bf16 or f16), broadcasts MR scalars of A, and adds
// their products with one fused multiply-add per accumulator. So every C element is a single
// sequential FMA chain over k = 0, 1, ..., K-1 starting from +0 — an order that depends on
// nothing but K, and that the scalar reference twin (kernels/ref) reproduces with std::fma.
// Column tails go through a zero-padded copy of B's row and a buffered store, with the same
// arithmetic per lane, so a column gives the same bits whichever tile or thread computed it.
#include <algorithm>
#include <cstring>

#include "kernels/gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_outer.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

template <typename TB>
HWY_INLINE hn::Vec<DF> WidenLoad(DF df, const TB* p) {
  if constexpr (std::is_same_v<TB, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<TB, hwy::bfloat16_t>) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));
  } else {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::LoadU(df16, p));
  }
}

// Loads vector j of a B row at p (its first column is the tile's), or, in a column tail, the
// first `cols` elements through a zero-padded copy so nothing past the row is read.
template <bool kTail, typename TB>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const TB* p, int j, int64_t cols) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  if constexpr (kTail) {
    HWY_ALIGN TB buf[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(buf, p, static_cast<size_t>(cols) * sizeof(TB));
    return WidenLoad(df, buf);
  } else {
    return WidenLoad(df, p + j * L);
  }
}

// gemm_nn: a(i, k) = A row (m + i) at k (times its scale); B row k = B + k * ldb.
template <int MR, bool kScaled, typename TB>
struct NnOps {
  const float* a[MR];
  float s[MR];
  const TB* b;
  int64_t ldb;
  struct Step {
    int64_t k;
  };
  Step step(int64_t k) const { return {k}; }
  float a_at(const Step& st, int i) const { return kScaled ? a[i][st.k] * s[i] : a[i][st.k]; }
  template <bool kTail>
  hn::Vec<DF> b_at(DF df, const Step& st, int j, int64_t cols) const {
    return LoadRow<kTail>(df, b + st.k * ldb, j, cols);
  }
};

// gemm_tn: a(i, k) = A(k)[m + i] · sA(k); b(k, ·) = B(k) · sB(k) (rows gathered by RowSource).
template <bool kScaled>
struct TnOps {
  RowSource A, B;
  int64_t m, n;
  struct Step {
    const float* a;
    const float* b;
    float sa, sb;
  };
  Step step(int64_t k) const { return {A.row(k) + m, B.row(k) + n, A.factor(k), B.factor(k)}; }
  float a_at(const Step& st, int i) const { return kScaled ? st.a[i] * st.sa : st.a[i]; }
  template <bool kTail>
  hn::Vec<DF> b_at(DF df, const Step& st, int j, int64_t cols) const {
    const auto v = LoadRow<kTail>(df, st.b, j, cols);
    if constexpr (kScaled) return hn::Mul(v, hn::Set(df, st.sb));
    return v;
  }
};

// One tile: MR rows × NV full vectors, or (kTail) MR rows × `cols` < lanes columns.
template <int MR, int NV, bool kTail, class Ops>
HWY_INLINE void OuterTile(const Ops& ops, int64_t K, const Output& C, int64_t m, int64_t n, int64_t cols) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = hn::Zero(df);
  for (int64_t k = 0; k < K; ++k) {
    const auto st = ops.step(k);
    hn::Vec<DF> b[NV];
    for (int j = 0; j < NV; ++j) b[j] = ops.template b_at<kTail>(df, st, j, cols);
    for (int i = 0; i < MR; ++i) {
      const auto a = hn::Set(df, ops.a_at(st, i));
      for (int j = 0; j < NV; ++j) acc[i][j] = hn::MulAdd(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* c = C.data + (m + i) * C.ld + n;
    for (int j = 0; j < NV; ++j) {
      auto v = acc[i][j];
      if (C.row_scale) v = hn::Mul(v, hn::Set(df, C.row_scale[m + i]));
      if constexpr (kTail) {
        HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
        hn::Store(v, df, buf);
        for (int64_t x = 0; x < cols; ++x) c[x] = C.accumulate ? c[x] + buf[x] : buf[x];
      } else {
        if (C.accumulate) v = hn::Add(hn::LoadU(df, c + j * L), v);
        hn::StoreU(v, df, c + j * L);
      }
    }
  }
}

// Register tile shapes: MR × NV accumulators + NV B vectors + 1 broadcast fit the register file
// (AVX2 / SSE4 / NEON 16: 4 × 3; AVX-512 32: 6 × 4).
constexpr int kMr = HWY_MAX_BYTES >= 64 ? 6 : 4;
constexpr int kNv = HWY_MAX_BYTES >= 64 ? 4 : 3;

// All columns [n0, n1) of MR rows starting at m: wide tiles, then single vectors, then the tail.
template <int MR, class MakeOps>
HWY_INLINE void OuterStrip(const MakeOps& make, int64_t K, const Output& C, int64_t m, int64_t n0, int64_t n1) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t n = n0;
  for (; n + kNv * L <= n1; n += kNv * L) OuterTile<MR, kNv, false>(make(m, n), K, C, m, n, 0);
  for (; n + L <= n1; n += L) OuterTile<MR, 1, false>(make(m, n), K, C, m, n, 0);
  if (n < n1) OuterTile<MR, 1, true>(make(m, n), K, C, m, n, n1 - n);
}

template <class MakeOps>
HWY_INLINE void OuterRows(int rows, const MakeOps& make, int64_t K, const Output& C, int64_t m, int64_t n0,
                          int64_t n1) {
  switch (rows) {
    case 1:
      return OuterStrip<1>(make.template rows<1>(), K, C, m, n0, n1);
    case 2:
      return OuterStrip<2>(make.template rows<2>(), K, C, m, n0, n1);
    case 3:
      return OuterStrip<3>(make.template rows<3>(), K, C, m, n0, n1);
    case 4:
      return OuterStrip<4>(make.template rows<4>(), K, C, m, n0, n1);
#if HWY_MAX_BYTES >= 64
    case 5:
      return OuterStrip<5>(make.template rows<5>(), K, C, m, n0, n1);
    case 6:
      return OuterStrip<6>(make.template rows<6>(), K, C, m, n0, n1);
#endif
    default:
      return;
  }
}

// Column blocks of B stay in L2 while every row tile of A passes over them: a block of
// kNv·lanes columns × K rows is 196 KB at K = 2048 f32 on AVX2.
template <class MakeOps>
HWY_INLINE void OuterGemm(const MakeOps& make, const Output& C, int64_t M, int64_t N, int64_t K) {
  const DF df;
  const int64_t block = kNv * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n1 = std::min(N, n0 + block);
    for (int64_t m = 0; m < M; m += kMr) {
      OuterRows(static_cast<int>(std::min<int64_t>(kMr, M - m)), make, K, C, m, n0, n1);
    }
  }
}

template <bool kScaled, typename TB>
struct NnMaker {
  const RowSource* A;
  const TB* B;
  int64_t ldb;
  template <int MR>
  auto rows() const {
    return [this](int64_t m, int64_t n) {
      NnOps<MR, kScaled, TB> ops;
      for (int i = 0; i < MR; ++i) {
        ops.a[i] = A->row(m + i);
        ops.s[i] = A->factor(m + i);
      }
      ops.b = B + n;
      ops.ldb = ldb;
      return ops;
    };
  }
};

template <bool kScaled>
struct TnMaker {
  const RowSource* A;
  const RowSource* B;
  template <int MR>
  auto rows() const {
    return [this](int64_t m, int64_t n) { return TnOps<kScaled>{*A, *B, m, n}; };
  }
};

template <typename TB>
void NnTyped(const RowSource& A, const TB* B, int64_t ldb, const Output& C, int64_t M, int64_t N, int64_t K) {
  if (A.scale) {
    OuterGemm(NnMaker<true, TB>{&A, B, ldb}, C, M, N, K);
  } else {
    OuterGemm(NnMaker<false, TB>{&A, B, ldb}, C, M, N, K);
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
  if (A.scale || B.scale) {
    OuterGemm(TnMaker<true>{&A, &B}, C, M, N, K);
  } else {
    OuterGemm(TnMaker<false>{&A, &B}, C, M, N, K);
  }
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
