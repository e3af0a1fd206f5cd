// gemm_nt on quantized weights, every format of the list (kernels/formats/table.hpp), with
// Highway's dynamic dispatch per CPU target.
//
// C[M, N] (+)= A[M, K] · Bᵀ with B [N, K] in its stored format, read in place. Every weight is
// decoded to the f32 value the format's reference decode gives and enters the dot-product kernel's
// order (dot-inl.h), so the result never depends on M. Two paths compute that same order:
//  - few rows of A (decode, M ≤ kFusedRows): each format's view decodes B's rows in registers, one
//    pass over the stored stream, where the target can (the format's GemmInRegisters);
//  - many rows (prefill), or a format the target does not decode in registers: a block of B's
//    rows is decoded once into a per-thread f32 scratch (a thread_local vector of ≈ 256 KB,
//    L2-resident; the format's DequantRows) and gemm_nt's f32 kernel runs every row of A over it,
//    so the decoding is amortised over the rows.
#include <algorithm>
#include <vector>

#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "kernels/plan.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_quant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/dot-inl.h"
#include "kernels/formats/affine-inl.h"
#include "kernels/formats/e2m1-inl.h"
#include "kernels/formats/e4m3-inl.h"
#include "kernels/formats/ggml-inl.h"
#include "kernels/formats/int4-inl.h"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {

void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  switch (B.format.element) {
#define MOEKIT_FORMAT_DEQUANT(f) \
  case Element::f:               \
    return f::DequantRows(B, n0, rows, K, dst);
    MOEKIT_QUANTIZED_FORMATS(MOEKIT_FORMAT_DEQUANT)
#undef MOEKIT_FORMAT_DEQUANT
    case Element::plain:
      break;
  }
  // Not reached: the drivers (gemm.cpp) refuse other weights with a named error first.
  HWY_ABORT("moekit: quantized GEMM kernel reached with weights of element %d", static_cast<int>(B.format.element));
}

// Rows of B decoded to bf16 values (decode_dtype bf16) as bf16 bits: FP8 in one pass; any other
// format through its f32 decode, narrowed.
void DequantRowsBf16(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, uint16_t* dst) {
  if (B.format.element == Element::e4m3) return e4m3::DequantRowsBf16(B, n0, rows, K, dst);
  thread_local std::vector<float> wide;
  wide.resize(static_cast<size_t>(rows * K));
  DequantRows(B, n0, rows, K, wide.data());
  for (size_t i = 0; i < wide.size(); ++i) dst[i] = f32_to_bf16(wide[i]);
}

bool InRegisters(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (B.format.element) {
#define MOEKIT_FORMAT_FUSED(f) \
  case Element::f:             \
    return f::GemmInRegisters(A, B, C, M, N, K);
    MOEKIT_QUANTIZED_FORMATS(MOEKIT_FORMAT_FUSED)
#undef MOEKIT_FORMAT_FUSED
    case Element::plain:
      break;
  }
  return false;
}

bool InRegistersTakes(const WeightMatrix& B, int64_t K) {
  switch (B.format.element) {
#define MOEKIT_FORMAT_TAKES(f) \
  case Element::f:             \
    return f::InRegistersTakes(B, K);
    MOEKIT_QUANTIZED_FORMATS(MOEKIT_FORMAT_TAKES)
#undef MOEKIT_FORMAT_TAKES
    case Element::plain:
      break;
  }
  return false;
}

// in_registers: the kernel plan's choice (plan.hpp: at most kFusedRows rows, where
// InRegistersTakes); else a block of B's rows decoded at a time.
void GemmNtQuant(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K,
                 bool in_registers) {
  if (in_registers && InRegisters(A, B, C, M, N, K)) return;
  // A block of B's rows as f32, reused by every row of A while it sits in L2.
  const int64_t block = std::max<int64_t>(4, (256 * 1024 / (K * 4)) / 4 * 4);
  thread_local std::vector<float> scratch;
  const int64_t nb = std::min(block, N);
  if (scratch.size() < static_cast<size_t>(nb * K)) scratch.resize(static_cast<size_t>(nb * K));
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t r = std::min(nb, N - n0);
    DequantRows(B, n0, r, K, scratch.data());
    Output c = C;
    c.data += n0;
    detail::gemm_nt_kernel(A, {scratch.data(), DType::f32, K}, c, M, r, K);
  }
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNtQuant);
HWY_EXPORT(InRegistersTakes);
HWY_EXPORT(DequantRows);
HWY_EXPORT(DequantRowsBf16);

void dequantize_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst) {
  if (rows <= 0 || K <= 0) return;
  HWY_DYNAMIC_DISPATCH(DequantRows)(B, n0, rows, K, dst);
}

void dequantize_rows_bf16(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K,
                          std::uint16_t* dst) {
  if (rows <= 0 || K <= 0) return;
  HWY_DYNAMIC_DISPATCH(DequantRowsBf16)(B, n0, rows, K, dst);
}

void detail::gemm_nt_quant_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                  std::int64_t N, std::int64_t K, bool in_registers) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNtQuant)(A, B, C, M, N, K, in_registers);
}

bool detail::quant_fuses(const WeightMatrix& B, std::int64_t K) noexcept {
  return B.quantized() && HWY_DYNAMIC_DISPATCH(InRegistersTakes)(B, K);
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
