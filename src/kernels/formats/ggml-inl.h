// ggml block types (ggml_<type>.hpp) in the kernels (per-target Highway header).
//
// The exact mode decodes whole blocks of a row into fp32 with the type's Block() — ggml's own
// dequantize_row_* arithmetic, compiled for each target — and gemm_quant.cpp's scratch path
// multiplies them with the f32 kernel; no type is decoded in registers (GemmInRegisters is false),
// so decode and prefill both take that path.
#if defined(MOEKIT_KERNELS_FORMATS_GGML_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_GGML_INL_H_
#undef MOEKIT_KERNELS_FORMATS_GGML_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_GGML_INL_H_
#endif

#include <hwy/highway.h>

#include "kernels/dot-inl.h"
#include "kernels/formats/ggml_types.hpp"

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace ggml {

// Rows [n0, n0 + rows) of B, K weights each, into dst [rows, K]: block by block.
template <typename T>
void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  if (detail::ggml_dequant_rows(B, n0, rows, K, dst)) return;  // x86 with AVX2: in vectors
  const int64_t blocks = K / T::kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = static_cast<const std::uint8_t*>(B.data) + (n0 + r) * B.ld;
    float* out = dst + r * K;
    for (int64_t b = 0; b < blocks; ++b) T::Block(row + b * T::kBytes, out + b * T::kBlock);
  }
}

}  // namespace ggml

// The entry points gemm_quant.cpp's dispatch calls, one namespace per type.
#define MOEKIT_GGML_ENTRY_POINTS(f)                                                                              \
  namespace f {                                                                                                  \
  inline bool GemmInRegisters(const RowSource&, const WeightMatrix&, const Output&, int64_t, int64_t, int64_t) { \
    return false;                                                                                                \
  }                                                                                                              \
  inline bool InRegistersTakes(const WeightMatrix&, int64_t) { return false; }                                   \
  inline void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {              \
    ggml::DequantRows<formats::f::Type>(B, n0, rows, K, dst);                                                    \
  }                                                                                                              \
  }
MOEKIT_GGML_FORMATS(MOEKIT_GGML_ENTRY_POINTS)
#undef MOEKIT_GGML_ENTRY_POINTS

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_GGML_INL_H_
