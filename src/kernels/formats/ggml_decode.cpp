// ggml's block types in the exact mode, decoded in vectors (detail::ggml_dequant_rows, which
// ggml-inl.h's DequantRows calls on x86): a block's codes unpacked as the int8 panel kernel unpacks
// them (ggml_unpack-inl.h), then w = ws · (u − off) + wb per group — the same products and sums,
// rounded as ggml's dequantize_row_* rounds them, so the same bits (tests/kernels/ggml_formats_test.cpp).
// 8 weights a step with AVX2, 16 with AVX-512.
#include <cstdint>
#include <cstring>

#include "kernels/int8_common.hpp"

namespace moekit::kernels::int8 {

namespace {

#if MOEKIT_X86
// The includes come in the order of their definitions, not sorted:
// clang-format off
namespace avx2 {
#define MOEKIT_I8_VNNI 0
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/ggml_unpack-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace avx2
namespace vnni {
#define MOEKIT_I8_VNNI 1
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/ggml_unpack-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace vnni
// clang-format on
#endif

}  // namespace

}  // namespace moekit::kernels::int8

namespace moekit::kernels {

bool detail::ggml_dequant_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst,
                               Int8Path path) {
#if MOEKIT_X86
  using namespace int8;  // NOLINT(google-build-using-namespace): the int8 kernels' namespace
  if (path == Int8Path::best || path == Int8Path::amx) path = cpu_paths().int8;
  if (path == Int8Path::portable || !int8_path_supported(path)) return false;
  const bool wide = path == Int8Path::avx512vnni;  // AVX-512: 16 weights per step (the same bits)
  return with_ggml_type(B.format.element, [&](auto type) {
    using T = decltype(type);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (wide) {
        vnni::dequant<T>(row_bytes(B, n0 + r), K / T::kBlock, dst + r * K);
      } else {
        avx2::dequant<T>(row_bytes(B, n0 + r), K / T::kBlock, dst + r * K);
      }
    }
  });
#else
  (void)B, (void)n0, (void)rows, (void)K, (void)dst, (void)path;
  return false;
#endif
}

}  // namespace moekit::kernels
