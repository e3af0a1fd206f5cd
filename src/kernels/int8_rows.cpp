// The int8 fast mode's row kernels (kernels/plan.hpp's int8_rows): gemm_nt on MLX affine 4- and
// 8-bit, e2m1 (MXFP4, NVFP4), int4 and ggml's block types with activations quantized to int8 per
// weight group (int8_activations.cpp), integer dot products with the codes, one float multiply-add
// per group. For few rows of A (decode and small batches), where the exact kernel's per-weight
// unpack-convert-dequantize is the cost and the weights are streamed once; the many-row kernels
// are int8_panels.cpp (ggml's types) and gemm_amx_int8.cpp (MLX affine codes on AMX-INT8).
//
// Per row m of A and weight group g of gs inputs:
//   d[m,g] = max_k |x| / 127, q[m,k] = clamp(rint(x · (127 / max_k |x|)), -127, 127)
//   (d = 0, q = 0 for a zero group; a group holding a NaN or Inf makes its row's outputs NaN,
//   never finite garbage),
//   qsum[m,g] = d[m,g] · Σ_k q[m,k];
// per output element:  y = Σ_g ( s_g · d[m,g] · Σ_k q[m,k]·code[k]  +  b_g · qsum[m,g] ),
// the weights times the int8-rounded activations x̂ = d·q (up to f32 rounding), so it differs
// from the exact value by Σ_k w_k (x̂_k − x_k): |y_fast − y_exact| ≤ Σ_g (d[m,g] / 2) Σ_k |w_k|. The
// integer sums are exact; the float sums run in a fixed order, so the result does not depend on
// the thread count (it may differ in the last bits between the AVX2 and the portable path).
// Signed 4-bit formats: code[k] is the nibble's integer (2 × the e2m1 value, or q = nibble − 8),
// s_g the group's scale times the factor that makes it the weight (1/2, 1), and no bias term, so
// the bound is the same with the exact weights (int4 decoded in bf16 / f16: the weight unrounded,
// docs/numerics.md). Only the x86 kernels and the portable one take them (no AMX kernel).
//
// x86 with AVX512-VNNI (cpu_paths().int8 picks it where present): `vpdpbusd` on 256-bit vectors,
// u8 codes × int8 activations (4- and 8-bit).
// x86 with AVX2: codes and activations as bytes, `vpmaddubsw` + `vpmaddwd` (4-bit: the codes are
// u8 ≤ 15, so a pair of products fits an int16) or widened to int16 and `vpmaddwd` (8-bit); both
// from affine_int8-inl.h (bit-identical for 4-bit codes, to f32 rounding for 8-bit). Elsewhere
// the same arithmetic in portable C++.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/int8_common.hpp"

namespace moekit::kernels::int8 {

namespace {

// Σ_k q·code over one 32-block at k (portable; the codes of row `row` of B).
std::int32_t block_dot_scalar(const QuantA& qa, std::int64_t m, const std::uint8_t* row, std::int64_t k, int bits) {
  std::int32_t acc = 0;
  if (bits == 4) {
    const std::int8_t* q = qa.q8.data() + m * qa.K;
    for (std::int64_t kk = k; kk < k + 32; ++kk)
      acc += static_cast<std::int32_t>((row[kk / 2] >> (4 * (kk & 1))) & 0x0F) * q[qa.at(kk)];
  } else {  // 8-bit: activations as int8 (VNNI's quantization) or int16
    const auto dot = [&](const auto* q) {
      for (int j = 0; j < 32; ++j) acc += static_cast<std::int32_t>(row[k + j]) * q[j];
    };
    if (qa.bytes8) {
      dot(qa.q8.data() + m * qa.K + k);
    } else {
      dot(qa.q16.data() + m * qa.K + k);
    }
  }
  return acc;
}

// The 256 values of an 8-bit float scale encoding.
struct F8Table {
  float v[256];
  explicit F8Table(DType dtype) {
    for (int b = 0; b < 256; ++b) {
      const auto byte = static_cast<std::uint8_t>(b);
      v[b] = load_f32(&byte, dtype, 0);
    }
  }
};

// rows × groups values of B's scale-shaped array `src` (row stride B.scale_ld) widened to f32 and
// times f, into dst (row j at j · stride, the pad past `groups` zero); `value(bytes, i)` decodes
// element i.
template <class Value>
void widen_rows(const WeightMatrix& B, const void* src, std::int64_t n, int rows, std::int64_t groups,
                std::int64_t stride, float f, float* dst, Value value) {
  const auto* bytes = static_cast<const std::uint8_t*>(src);
  for (int j = 0; j < rows; ++j) {
    const std::int64_t base = (n + j) * B.scale_ld;
    float* o = dst + j * stride;
    for (std::int64_t g = 0; g < groups; ++g) o[g] = value(bytes, base + g) * f;
    for (std::int64_t g = groups; g < stride; ++g) o[g] = 0.0f;
  }
}

// The scales of rows [n, n + rows) of B as f32 (signed codes: times the codes' factor), then for
// affine codes their biases, in this thread's scratch: scale of row j, group g at j · stride + g,
// its bias at (rows + j) · stride + g, with stride = QuantA::gstride (the pad zero); valid until
// the thread's next call. The dtype is decided once per call, not per scale (8-bit encodings
// through a table of their 256 values), so the kernels' epilogue reads plain floats from L1.
const float* widen_scales(const WeightMatrix& B, std::int64_t n, int rows, std::int64_t groups, std::int64_t stride) {
  thread_local std::vector<float> out;
  const bool affine = codes_of(B.format) != Codes::signed4;
  out.resize(static_cast<std::size_t>((affine ? 2 : 1) * rows * stride));
  static const F8Table e8m0(DType::f8_e8m0), e4m3(DType::f8_e4m3);
  const DType dt = B.format.scale_dtype;
  const auto widen = [&](const void* src, float* dst, float f) {
    switch (dt) {
      case DType::f8_e8m0:
        return widen_rows(B, src, n, rows, groups, stride, f, dst,
                          [](const std::uint8_t* p, std::int64_t i) { return e8m0.v[p[i]]; });
      case DType::f8_e4m3:
        return widen_rows(B, src, n, rows, groups, stride, f, dst,
                          [](const std::uint8_t* p, std::int64_t i) { return e4m3.v[p[i]]; });
      case DType::bf16:  // the dtype known here
        return widen_rows(B, src, n, rows, groups, stride, f, dst,
                          [](const std::uint8_t* p, std::int64_t i) { return load_f32(p, DType::bf16, i); });
      default:
        return widen_rows(B, src, n, rows, groups, stride, f, dst,
                          [dt](const std::uint8_t* p, std::int64_t i) { return load_f32(p, dt, i); });
    }
  };
  widen(B.scales, out.data(), affine ? 1.0f : signed_codes(B.format).scale);
  if (affine) widen(B.biases, out.data() + rows * stride, 1.0f);
  return out.data();
}

// The portable kernel: every column of C (the x86 kernels' reference, to f32 rounding).
void kernel_scalar(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N) {
  const int gs = B.format.block_cols, bits = B.format.bits;
  const bool affine = codes_of(B.format) != Codes::signed4;
  const SignedCodes sc = signed_codes(B.format);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::uint8_t* row = row_bytes(B, n);
    for (std::int64_t m = 0; m < M; ++m) {
      float acc = 0.0f, bacc = 0.0f;
      for (std::int64_t g = 0; g < qa.groups; ++g) {
        std::int32_t isum = 0;
        if (affine) {
          for (std::int64_t k = g * gs; k < (g + 1) * gs; k += 32) isum += block_dot_scalar(qa, m, row, k, bits);
        } else {  // element kk of the group times its activation, at its place in the nibble order
          const std::int8_t* q = qa.q8.data() + m * qa.K;
          for (std::int64_t kk = g * gs; kk < (g + 1) * gs; ++kk)
            isum += static_cast<std::int32_t>(sc.table[(row[kk / 2] >> (4 * (kk & 1))) & 0xF]) * q[qa.at(kk)];
        }
        const std::int64_t sg = n * B.scale_ld + g;
        const std::size_t gi = static_cast<std::size_t>(m * qa.gstride + g);
        if (affine) {
          const float s = load_f32(B.scales, B.format.scale_dtype, sg);
          const float b = load_f32(B.biases, B.format.scale_dtype, sg);
          acc = std::fma(static_cast<float>(isum), s * qa.d[gi], acc);
          bacc = std::fma(b, qa.xsum[gi], bacc);
        } else {
          const float s = load_f32(B.scales, B.format.scale_dtype, sg) * sc.scale;
          acc = std::fma(static_cast<float>(isum), s * qa.d[gi], acc);
        }
      }
      store(C, m, n, acc + bacc);
    }
  }
}

// How far ahead of the row it computes the x86 kernels fetch B's bytes (ggml_rows).
constexpr std::int64_t kGgmlPrefetchBytes = 2048;

// The portable kernel: the x86 kernels' steps lane by lane (lane g mod 8 of acc and bacc, then
// reduce8's order), so the same bits.
template <class T>
void ggml_kernel_scalar(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N) {
  constexpr int kGroups = T::kBlock / 32;
  std::int8_t q[T::kBlock];
  std::int16_t qs16[T::kBlock / 16], qm16[T::kBlock / 16] = {};
  float ws[kGroups], wb[kGroups], wm[kGroups] = {};
  for (std::int64_t n = 0; n < N; ++n) {
    const std::uint8_t* row = row_bytes(B, n);
    for (std::int64_t m = 0; m < M; ++m) {
      const std::int8_t* a = qa.q8.data() + m * qa.K;
      float acc[8] = {}, bacc[8] = {};
      for (std::int64_t blk = 0; blk < qa.groups / kGroups; ++blk) {
        T::Int8(row + blk * T::kBytes, q, qs16, ws, wb);
        if constexpr (GgmlInt8<T>::kMin16) T::Mins(row + blk * T::kBytes, qm16, wm);
        for (int j = 0; j < kGroups; ++j) {
          const std::int64_t g = blk * kGroups + j;
          std::int32_t S = 0, Mg = 0;
          for (int h = 0; h < 2; ++h) {
            std::int32_t s = 0, as = 0;
            for (int k = 32 * j + 16 * h; k < 32 * j + 16 * h + 16; ++k) {
              s += static_cast<std::int32_t>(q[k]) * a[32 * (g - j) + k];
              as += a[32 * (g - j) + k];
            }
            S += static_cast<std::int32_t>(qs16[2 * j + h]) * s;
            Mg += static_cast<std::int32_t>(qm16[2 * j + h]) * as;
          }
          const std::size_t gi = static_cast<std::size_t>(m * qa.gstride + g);
          acc[g % 8] = std::fma(static_cast<float>(S), ws[j] * qa.d[gi], acc[g % 8]);
          if (GgmlInt8<T>::kBias) bacc[g % 8] = std::fma(wb[j], qa.xsum[gi], bacc[g % 8]);
          if (GgmlInt8<T>::kMin16) bacc[g % 8] = std::fma(wm[j], static_cast<float>(Mg) * qa.d[gi], bacc[g % 8]);
        }
      }
      float v[8];
      for (int l = 0; l < 8; ++l) v[l] = GgmlInt8<T>::kAdd ? acc[l] + bacc[l] : acc[l];
      store(C, m, n, ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])));
    }
  }
}

#if MOEKIT_X86
// The includes come in the order of their definitions, not sorted:
// clang-format off
namespace avx2 {
#define MOEKIT_I8_VNNI 0
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/affine_int8-inl.h"
#include "kernels/ggml_int8-inl.h"
#include "kernels/ggml_int8_k-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace avx2
namespace vnni {
#define MOEKIT_I8_VNNI 1
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/affine_int8-inl.h"
#include "kernels/ggml_int8-inl.h"
#include "kernels/ggml_int8_k-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace vnni
// clang-format on
#endif

// The fast mode on a ggml type T: A quantized as ggml's activation blocks for T (a scale per 32
// inputs for the 32-block types, q8_0's; per 256 for the K-quants, q8_K's; the sums per 32 either
// way), then the x86 kernels where the path allows, else the portable one (the same bits).
template <class T>
void ggml_int8(T, const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
               std::int64_t K, Int8Path path, QuantA& qa) {
  if (path == Int8Path::best || path == Int8Path::amx) path = cpu_paths().int8;  // no AMX kernel for these
  quantize_a(A, M, K, 32, 8, true, path != Int8Path::portable, qa, T::kBlock);
  if constexpr (GgmlInt8<T>::kMin16) sums16(qa);
#if MOEKIT_X86
  // A's codes in the order each x86 row kernel reads them (ggml_int8-inl.h), and the sums of 16
  // that VNNI's scaled_block takes its offsets from.
  if (path == Int8Path::avx512vnni) {
    if constexpr (T::kInt8Facts.per16 && !T::kInt8Facts.min16) sums16(qa);  // (q2_K's are there)
    if constexpr (T::kInt8Facts.k45) {
      k4_order(qa);
    } else if constexpr (QuadNibbles<T>::kYes) {
      quad_order(qa);
    } else if constexpr (NibblePairs<T>::kYes) {
      pair_order(qa);
    }
    return vnni::ggml_rows<T>(qa, B, C, M, N);
  }
  if (path == Int8Path::avx2) {
    if constexpr (T::kInt8Facts.per16 && !T::kInt8Facts.min16) sums16(qa);  // scaled_block's offsets
    if constexpr (NibblePairs<T>::kYes) pair_order(qa);
    return avx2::ggml_rows<T>(qa, B, C, M, N);
  }
#endif
  ggml_kernel_scalar<T>(qa, B, C, M, N);
}

}  // namespace

}  // namespace moekit::kernels::int8

namespace moekit::kernels {

void detail::gemm_nt_affine_int8_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                        std::int64_t N, std::int64_t K, Int8Path path) {
  using namespace int8;  // NOLINT(google-build-using-namespace): this file's own namespace
  if (M <= 0 || N <= 0) return;
  QuantA& qa = thread_quant_a();
  if (with_ggml_int8_type(B.format.element, [&](auto type) { ggml_int8(type, A, B, C, M, N, K, path, qa); })) return;
#if MOEKIT_X86
  if (path == Int8Path::amx) return amx_int8_gemm(A, B, C, M, N, K, Threads::caller);
  if (path == Int8Path::best) path = cpu_paths().int8;
  const Codes codes = codes_of(B.format);
  quantize_a(A, M, K, B.format.block_cols, B.format.bits, path == Int8Path::avx512vnni, path != Int8Path::portable, qa);
  // 4-bit codes take the x86 kernels with K a multiple of 64 (QuantA::pair64, every MoE shape
  // moekit knows), else the portable one.
  if (codes != Codes::affine8 && !qa.pair64) path = Int8Path::portable;
  if (path == Int8Path::avx512vnni) {
    if (codes == Codes::signed4) return vnni::kernel<Codes::signed4>(qa, B, C, M, N);
    if (codes == Codes::affine4) return vnni::kernel<Codes::affine4>(qa, B, C, M, N);
    return vnni::kernel<Codes::affine8>(qa, B, C, M, N);
  }
  if (path == Int8Path::avx2) {
    if (codes == Codes::signed4) return avx2::kernel<Codes::signed4>(qa, B, C, M, N);
    if (codes == Codes::affine4) return avx2::kernel<Codes::affine4>(qa, B, C, M, N);
    return avx2::kernel<Codes::affine8>(qa, B, C, M, N);
  }
#else
  quantize_a(A, M, K, B.format.block_cols, B.format.bits, false, false, qa);
#endif
  kernel_scalar(qa, B, C, M, N);
}

}  // namespace moekit::kernels
