// Scalar reference twins of the kernels in kernels/gemm.hpp, written for clarity, not speed.
// Tests compare the fast kernels against them.
//   gemm_nt: one plain fp32 dot product per element, summed in index order (the fast kernel
//            sums lane-strided: equal within the dot-product error bound, not bitwise).
//   gemm_nt_fma (B packed in panels), gemm_nn, gemm_tn: one std::fma chain per element over
//            k = 0..K-1 from +0, the fast kernels' exact order: bitwise equal on targets with
//            fused multiply-add.
// The output epilogue is the fast kernels': v = sum (· row_scale[m]); C = accumulate ? C + v : v.
#pragma once

#include <cstdint>

#include "kernels/gemm.hpp"

namespace moekit::kernels::ref {

void gemm_nt(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K);
/// gemm_nt with each element one std::fma chain over k from +0: the panel kernel's order
/// (B given in rows layout here; the fast kernel reads the same matrix packed).
void gemm_nt_fma(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                 std::int64_t K);
void gemm_nn(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K);
void gemm_tn(const RowSource& A, const RowSource& B, const Output& C, std::int64_t M, std::int64_t N,
             std::int64_t K);

/// Code i of one row of MLX affine codes (`bits` bits per code, little-endian bit stream).
std::uint32_t affine_code(const std::uint32_t* row, std::int64_t i, int bits);
/// The f32 value of element (n, k) of an affine-quantized matrix: std::fma(scale, q, bias).
float affine_value(const WeightMatrix& B, std::int64_t n, std::int64_t k);
/// Materialises an affine-quantized [N, K] matrix into dst [N, K] f32, element by element.
void dequantize_affine(const WeightMatrix& B, std::int64_t N, std::int64_t K, float* dst);

}  // namespace moekit::kernels::ref
