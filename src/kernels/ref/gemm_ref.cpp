#include "kernels/ref/gemm_ref.hpp"

namespace moekit::kernels::ref {

namespace {
float load(const void* B, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(B)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(B)[i]);
    default:
      return static_cast<const float*>(B)[i];
  }
}
}  // namespace

void gemm_nt(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
             std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += A[m * lda + k] * load(B, b_dtype, n * ldb + k);
      C[m * ldc + n] = accumulate ? C[m * ldc + n] + acc : acc;
    }
  }
}

}  // namespace moekit::kernels::ref
