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

/// The fixed tree gemm_nt_bf16's AVX512-BF16 path sums an accumulator's 16 lanes with:
/// v8_i = l_i + l_(i+8), v4_i = v8_i + v8_(i+4), v2_i = v4_i + v4_(i+2), v2_0 + v2_1.
float reduce16(const float lanes[16]);
/// One fused multiply-add of `vdpbf16ps`: acc + a·b rounded once, with a, b and acc read as zero
/// when denormal and a denormal result flushed to (signed) zero.
float dpbf16_fma(float acc, float a, float b);
/// gemm_nt_bf16 on the AVX512-BF16 path, element by element: 16 lanes per element, lane j
/// taking pairs k = 32·s + 2j + 1 then 32·s + 2j (K zero-padded to a multiple of 32), then
/// reduce16. Bitwise equal to the fast kernel where the CPU has AVX512-BF16.
void gemm_nt_bf16_dpbf16(const Bf16Rows& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                         std::int64_t N, std::int64_t K);

/// One AMX `tdpbf16ps` step of one C element over 32 reduction elements: the even-indexed
/// products added in order by fused multiply-adds from +0, the odd-indexed likewise, then
/// acc + (even + odd); every operation rounded to nearest even, denormal inputs read as zero and
/// denormal sums flushed, a denormal product kept exact inside its fused add (found on the
/// hardware: 560 000 random elements, denormal inputs, products and sums and signed zeros among
/// them).
float tdpbf16_chunk(float acc, const float a[32], const float b[32]);
/// gemm_nt_bf16 on the AMX path, element by element: K zero-padded to a multiple of 32, the
/// chunks taken in order by tdpbf16_chunk from acc = +0. Bitwise equal to the fast kernel where
/// the CPU has AMX-BF16.
void gemm_nt_bf16_tdpbf16(const Bf16Rows& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                          std::int64_t N, std::int64_t K);

/// Materialises a quantized [N, K] matrix (any format, rows layout) into dst [N, K] f32, element by
/// element through the format's scalar reference decode (kernels/formats/).
void dequantize(const WeightMatrix& B, std::int64_t N, std::int64_t K, float* dst);

}  // namespace moekit::kernels::ref
