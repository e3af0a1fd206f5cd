// gemm_nt on plain float weights in rows layout, and gemm_nn on panel-packed ones (Highway,
// dynamic dispatch per CPU target): dot-inl.h's tiles instantiated for f32, bf16 and f16 weights,
// streamed in their stored dtype and widened in registers (a bf16 or f16 model is never expanded
// in memory). Also round_to_bf16's kernel and the target's name.
#include <cstring>

#include "kernels/gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_nt.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/dot-inl.h"  // RowsB, PanelsT, GemmBlocks

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <template <typename> class BV, class... Args>
void ByDtype(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K,
             int64_t stride) {
  switch (B.dtype) {
    case DType::bf16:
      return GemmBlocks(A, BV<hwy::bfloat16_t>{static_cast<const hwy::bfloat16_t*>(B.data), stride}, C, M, N, K);
    case DType::f16:
      return GemmBlocks(A, BV<hwy::float16_t>{static_cast<const hwy::float16_t*>(B.data), stride}, C, M, N, K);
    case DType::f32:
      return GemmBlocks(A, BV<float>{static_cast<const float*>(B.data), stride}, C, M, N, K);
    default:
      break;
  }
  // Not reached: the drivers (gemm.cpp) refuse other weights with a named error first.
  HWY_ABORT("moekit: float GEMM kernel reached with weights of dtype %s", dtype_name(B.dtype));
}

void GemmNt(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  ByDtype<RowsB>(A, B, C, M, N, K, B.ld);
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
