// Outer-product register tiles shared by the kernels that read B along N (gemm_outer.cpp:
// A·B and Aᵀ·B; gemm_panel.cpp: A·Bᵀ on packed panels), and the widening load of a weight vector
// that every kernel uses (gemm_nt.cpp's dot-product tiles too). Per-target Highway header: included
// once per target from a translation unit that uses foreach_target.
//
// A tile is MR rows × NV vectors of C. Each step k loads NV vectors of B's row k (widened to f32
// in registers when B is bf16 or f16), broadcasts MR scalars of A, and adds their products
// with one fused multiply-add per accumulator: every C element is a single sequential FMA
// chain over k = 0, 1, ..., K-1 from +0, whatever tile or thread computed it.
#if defined(MOEKIT_KERNELS_OUTER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_OUTER_INL_H_
#undef MOEKIT_KERNELS_OUTER_INL_H_
#else
#define MOEKIT_KERNELS_OUTER_INL_H_
#endif

#include <cstring>
#include <type_traits>

#include "kernels/gemm.hpp"
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

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

// Rows m .. m + MR - 1 of A for one tile: pointers and per-row factors (1 without a scale).
template <int MR>
struct ARows {
  const float* p[MR];
  float s[MR];
  static ARows Of(const RowSource& A, int64_t m) {
    ARows r;
    for (int i = 0; i < MR; ++i) {
      r.p[i] = A.row(m + i);
      r.s[i] = A.factor(m + i);
    }
    return r;
  }
};

// Rows m .. m + r - 1 of A at k0 .. k0 + kc - 1, as the products see them (times their scale
// when kScaled), packed k-major: dst[k * r + i], so a tile broadcasts its r elements of one k
// from one contiguous run instead of r rows of A (gemm_nn's chunk tiles).
template <bool kScaled>
HWY_INLINE void PackStrip(const RowSource& A, int64_t m, int64_t r, int64_t k0, int64_t kc,
                          float* dst) {
  for (int64_t i = 0; i < r; ++i) {
    const float* p = A.row(m + i) + k0;
    const float f = A.factor(m + i);
    for (int64_t k = 0; k < kc; ++k) dst[k * r + i] = kScaled ? p[k] * f : p[k];
  }
}

// A vector of A's row i at p as the dot products see it (dot-inl.h). The row
// scale is a template flag: an unscaled product must not pay a multiply per load.
template <bool kScaled, int MR>
HWY_INLINE hn::Vec<DF> LoadA(DF df, const ARows<MR>& a, int i, const float* p) {
  const auto v = hn::LoadU(df, p);
  if constexpr (kScaled) return hn::Mul(v, hn::Set(df, a.s[i]));
  return v;
}

// The epilogue of a dot-product tile (dot-inl.h, on float weights and on quantized
// ones): each accumulator reduced by SumOfLanes, × the row's factor, stored or added. One copy, so
// the two kernels round their results alike.
template <int MR, int NR>
HWY_INLINE void StoreDotTile(DF df, const hn::Vec<DF> (&acc)[MR][NR], const Output& C, int64_t m, int64_t n) {
  for (int i = 0; i < MR; ++i) {
    float* c = C.data + (m + i) * C.ld + n;
    const float s = C.row_scale ? C.row_scale[m + i] : 1.0f;
    for (int j = 0; j < NR; ++j) {
      float v = hn::GetLane(hn::SumOfLanes(df, acc[i][j]));
      if (C.row_scale) v *= s;
      c[j] = C.accumulate ? c[j] + v : v;
    }
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

// The epilogue of an outer-product tile: each accumulator × the row's factor, stored or added
// (kTail: the first `cols` columns of one vector). One copy, so every outer-product kernel rounds
// its results alike.
template <int MR, int NV, bool kTail>
HWY_INLINE void StoreOuterTile(DF df, const hn::Vec<DF> (&acc)[MR][NV], const Output& C, int64_t m,
                               int64_t n, int64_t cols) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
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
        if (C.stream && reinterpret_cast<uintptr_t>(c + j * L) % (L * sizeof(float)) == 0) {
          hn::Stream(v, df, c + j * L);
        } else {
          hn::StoreU(v, df, c + j * L);
        }
      }
    }
  }
}

// One tile: MR rows × NV full vectors, or (kTail) MR rows × `cols` < lanes columns.
template <int MR, int NV, bool kTail, class Ops>
HWY_INLINE void OuterTile(const Ops& ops, int64_t K, const Output& C, int64_t m, int64_t n,
                          int64_t cols) {
  const DF df;
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
  StoreOuterTile<MR, NV, kTail>(df, acc, C, m, n, cols);
}

// Calls f(nv, tail, n, cols) for the column tiles of [n0, n1): NV-vector tiles, then single
// vectors, then the column tail (nv: std::integral_constant<int, NV or 1>; tail:
// std::bool_constant; cols: the tail's columns, else 0). The outer-product kernels walk columns in
// this one order.
template <int NV, class F>
HWY_INLINE void ForColumnTiles(int64_t n0, int64_t n1, const F& f) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  using Wide = std::integral_constant<int, NV>;
  using One = std::integral_constant<int, 1>;
  int64_t n = n0;
  for (; n + NV * L <= n1; n += NV * L) f(Wide(), std::false_type(), n, int64_t{0});
  for (; n + L <= n1; n += L) f(One(), std::false_type(), n, int64_t{0});
  if (n < n1) f(One(), std::true_type(), n, n1 - n);
}

// Calls f(std::integral_constant<int, R>) for the run-time row count R in 1 .. MR: the tile
// height picked at run time, the shapes at compile time.
template <int MR, int R = 1, class F>
HWY_INLINE void WithRows(int rows, const F& f) {
  if constexpr (R <= MR) {
    if (rows == R) return f(std::integral_constant<int, R>());
    WithRows<MR, R + 1>(rows, f);
  }
}

// `rows` (1..MRmax) rows from m over the columns [n0, n1).
template <int NV, int MRmax, class MakeOps>
HWY_INLINE void OuterRows(int rows, const MakeOps& make, int64_t K, const Output& C, int64_t m, int64_t n0,
                          int64_t n1) {
  WithRows<MRmax>(rows, [&](auto r) {
    constexpr int R = decltype(r)::value;
    ForColumnTiles<NV>(n0, n1, [&](auto nv, auto tail, int64_t n, int64_t cols) {
      OuterTile<R, decltype(nv)::value, decltype(tail)::value>(make.template make<R>(m, n), K, C, m, n, cols);
    });
  });
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_OUTER_INL_H_
