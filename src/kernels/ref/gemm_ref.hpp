// Scalar reference twin of kernels::gemm_nt: one double-free, plain fp32 dot product per
// output element, summed in index order. Tests compare the fast kernels against it.
#pragma once

#include <cstdint>

#include "moekit/tensor.hpp"

namespace moekit::kernels::ref {

void gemm_nt(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
             std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate);

}  // namespace moekit::kernels::ref
