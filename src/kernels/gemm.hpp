// GEMM kernels used by the router and the experts. Internal; never throw, never allocate on
// the caller's behalf beyond fixed-size stack tiles.
//
// Determinism: every output element is a sum over the reduction dimension in one fixed order
// that depends only on K (never on the thread count or the tile a thread happened to take);
// drivers split work over rows and columns of C, never over K.
#pragma once

#include <cstdint>

#include "moekit/tensor.hpp"

namespace moekit::kernels {

/// C[M, N] = A[M, K] · B[N, K]ᵀ  (or C += … when accumulate). A and C are f32; B is f32 or
/// bf16 (weights stored [out, in]); fp32 accumulation. Strides are in elements.
/// Parallelised over the thread pool. Preconditions (debug-asserted): M, N, K >= 0, strides
/// >= row lengths, b_dtype in {f32, bf16, f16}.
void gemm_nt(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
             std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate);

/// The same on the calling thread only (for callers that parallelise at a coarser level).
void gemm_nt_serial(const float* A, std::int64_t lda, const void* B, DType b_dtype, std::int64_t ldb, float* C,
                    std::int64_t ldc, std::int64_t M, std::int64_t N, std::int64_t K, bool accumulate);

/// The SIMD target the kernels dispatch to on this CPU ("AVX3", "AVX2", "SSE4", "NEON", ...),
/// for benchmark headers.
const char* simd_target_name();

}  // namespace moekit::kernels
