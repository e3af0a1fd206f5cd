#include "kernels/ref/gemm_ref.hpp"

#include <cmath>

#include "kernels/formats/table.hpp"

namespace moekit::kernels::ref {

namespace {

float load(const WeightMatrix& B, std::int64_t row, std::int64_t col) { return formats::decode(B, row, col); }

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

float reduce16(const float lanes[16]) {
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = lanes[i];
  for (int width = 8; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) v[i] = v[i] + v[i + width];
  return v[0];
}

namespace {
float flush_denormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}
}  // namespace

float dpbf16_fma(float acc, float a, float b) {
  return flush_denormal(std::fma(flush_denormal(a), flush_denormal(b), flush_denormal(acc)));
}

void gemm_nt_bf16_dpbf16(const Bf16Rows& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                         std::int64_t N, std::int64_t K) {
  const auto* b = static_cast<const std::uint16_t*>(B.data);
  const std::int64_t padded = (K + 31) / 32 * 32;
  for (std::int64_t m = 0; m < M; ++m) {
    const std::uint16_t* a = A.row(m);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::uint16_t* w = b + n * B.ld;
      const auto value = [&](const std::uint16_t* row, std::int64_t k) {
        return k < K ? bf16_to_f32(row[k]) : 0.0f;
      };
      float lanes[16] = {};
      for (std::int64_t k = 0; k < padded; k += 2) {
        float& l = lanes[(k / 2) % 16];
        l = dpbf16_fma(l, value(a, k + 1), value(w, k + 1));
        l = dpbf16_fma(l, value(a, k), value(w, k));
      }
      store(C, m, n, reduce16(lanes));
    }
  }
}

void dequantize(const WeightMatrix& B, std::int64_t N, std::int64_t K, float* dst) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k) dst[n * K + k] = formats::decode(B, n, k);
}

float tdpbf16_chunk(float acc, const float a[32], const float b[32]) {
  float even = 0.0f, odd = 0.0f;
  for (int j = 0; j < 32; j += 2) {
    even = flush_denormal(std::fma(flush_denormal(a[j]), flush_denormal(b[j]), even));
    odd = flush_denormal(std::fma(flush_denormal(a[j + 1]), flush_denormal(b[j + 1]), odd));
  }
  return flush_denormal(flush_denormal(acc) + flush_denormal(even + odd));
}

void gemm_nt_bf16_tdpbf16(const Bf16Rows& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                          std::int64_t N, std::int64_t K) {
  const auto* b = static_cast<const std::uint16_t*>(B.data);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::uint16_t* a = A.row(m);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::uint16_t* w = b + n * B.ld;
      float acc = 0.0f;
      for (std::int64_t k0 = 0; k0 < K; k0 += 32) {
        float av[32], wv[32];
        for (std::int64_t j = 0; j < 32; ++j) {
          av[j] = k0 + j < K ? bf16_to_f32(a[k0 + j]) : 0.0f;
          wv[j] = k0 + j < K ? bf16_to_f32(w[k0 + j]) : 0.0f;
        }
        acc = tdpbf16_chunk(acc, av, wv);
      }
      store(C, m, n, acc);
    }
  }
}

}  // namespace moekit::kernels::ref
