#include "kernels/ref/gemm_ref.hpp"

#include <cmath>

namespace moekit::kernels::ref {

namespace {

float load(const WeightMatrix& B, std::int64_t row, std::int64_t col) {
  const std::int64_t i = row * B.ld + col;
  switch (B.dtype) {
    case DType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(B.data)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(B.data)[i]);
    default:
      return static_cast<const float*>(B.data)[i];
  }
}

// A's element (row i, column k) as the kernels see it: the row's value times its scale.
float at(const RowSource& A, std::int64_t i, std::int64_t k) {
  const float v = A.row(i)[k];
  return A.scale ? v * A.scale[i] : v;
}

void store(const Output& C, std::int64_t m, std::int64_t n, float sum) {
  float v = sum;
  if (C.row_scale) v *= C.row_scale[m];
  float& c = C.data[m * C.ld + n];
  c = C.accumulate ? c + v : v;
}

}  // namespace

void gemm_nt(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += at(A, m, k) * load(B, n, k);
      store(C, m, n, acc);
    }
  }
}

void gemm_nt_fma(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                 std::int64_t K) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc = std::fma(at(A, m, k), load(B, n, k), acc);
      store(C, m, n, acc);
    }
  }
}

void gemm_nn(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc = std::fma(at(A, m, k), load(B, k, n), acc);
      store(C, m, n, acc);
    }
  }
}

void gemm_tn(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K) {
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc = std::fma(at(A, k, m), at(B, k, n), acc);
      store(C, m, n, acc);
    }
  }
}

}  // namespace moekit::kernels::ref
