// The fast mode of gemm_nt on MLX affine weights (AffineQuant::int8_activations): activations
// quantized to int8 per weight group, integer dot products with the 4- or 8-bit codes, one float
// multiply-add per group. For few rows of A (decode and small batches), where the exact kernel's
// per-weight unpack-convert-dequantize is the cost and the weights are streamed once.
//
// Per row m of A and weight group g of gs inputs:
//   d[m,g] = max_k |x| / 127, q[m,k] = clamp(rint(x / d), -127, 127) (d = 0, q = 0 for a zero group;
//   a group holding a NaN or Inf makes its row's outputs NaN, never finite garbage),
//   qsum[m,g] = d[m,g] · Σ_k q[m,k];
// per output element:  y = Σ_g ( s_g · d[m,g] · Σ_k q[m,k]·code[k]  +  b_g · qsum[m,g] ),
// the weights times the int8-rounded activations x̂ = d·q (up to f32 rounding), so it differs
// from the exact value by Σ_k w_k (x̂_k − x_k): |y_fast − y_exact| ≤ Σ_g (d[m,g] / 2) Σ_k |w_k|. The
// integer sums are exact; the float sums run in a fixed order, so the result does not depend on
// the thread count (it may differ in the last bits between the AVX2 and the portable path).
//
// x86 with AVX512-VNNI: `vpdpbusd` on 256-bit vectors, u8 codes × int8 activations (4- and 8-bit).
// x86 with AVX2: codes and activations as bytes, `vpmaddubsw` + `vpmaddwd` (4-bit: the codes are
// u8 ≤ 15, so a pair of products fits an int16) or widened to int16 and `vpmaddwd` (8-bit); both
// from affine_int8-inl.h (bit-identical for 4-bit codes, to f32 rounding for 8-bit). Elsewhere
// the same arithmetic in portable C++.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu.hpp"
#include "kernels/gemm.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOEKIT_X86 1
#else
#define MOEKIT_X86 0
#endif

namespace moekit::kernels {

namespace {

// A's rows quantized for one call: per row, K int8 codes (4-bit B: each 32-block stored as its
// 16 even elements then its 16 odd ones, the order the packed nibbles unpack into), or K int16
// (8-bit B); per group, the scale d and d · Σ q (the rounded activations' sum, for the bias term).
struct QuantA {
  std::int64_t M = 0, K = 0, groups = 0;
  bool bytes8 = false;  // 8-bit codes' activations in q8 (natural order), not q16
  std::vector<std::int8_t> q8;
  std::vector<std::int16_t> q16;
  std::vector<float> d, xsum;
};

// bytes8: 8-bit codes take int8 activations too (the VNNI kernel), in natural order.
void quantize_a(const RowSource& A, std::int64_t M, std::int64_t K, int gs, int bits, bool bytes8, QuantA& qa) {
  qa.M = M;
  qa.K = K;
  qa.bytes8 = bits == 8 && bytes8;
  qa.groups = K / gs;
  qa.d.assign(static_cast<std::size_t>(M * qa.groups), 0.0f);
  qa.xsum.assign(qa.d.size(), 0.0f);
  if (bits == 4 || bytes8)
    qa.q8.assign(static_cast<std::size_t>(M * K), 0);
  else
    qa.q16.assign(static_cast<std::size_t>(M * K), 0);
  for (std::int64_t m = 0; m < M; ++m) {
    const float* x = A.row(m);
    const float f = A.scale ? A.scale[m] : 1.0f;
    for (std::int64_t g = 0; g < qa.groups; ++g) {
      const std::int64_t k0 = g * gs;
      float amax = 0.0f;
      bool finite = true;
      for (int k = 0; k < gs; ++k) {
        const float v = A.scale ? x[k0 + k] * f : x[k0 + k];
        finite = finite && std::isfinite(v);
        amax = std::max(amax, std::fabs(v));
      }
      const std::size_t gi = static_cast<std::size_t>(m * qa.groups + g);
      if (!finite) {  // NaN or Inf: the outputs of this row become NaN, as the exact kernel's would
        qa.d[gi] = qa.xsum[gi] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (amax == 0.0f) continue;  // d = 0, codes 0
      qa.d[gi] = amax / 127.0f;
      const float inv = 127.0f / amax;
      std::int32_t qsum = 0;
      for (int k = 0; k < gs; ++k) {
        const float v = A.scale ? x[k0 + k] * f : x[k0 + k];
        const float r = std::min(127.0f, std::max(-127.0f, std::rint(v * inv)));
        qsum += static_cast<std::int32_t>(r);
        const std::int64_t kk = k0 + k;
        if (bits == 4) {
          // Within each 32-block: position i/2 for even i, 16 + i/2 for odd i.
          const std::int64_t i = kk % 32;
          const std::int64_t at = kk - i + (i % 2 == 0 ? i / 2 : 16 + i / 2);
          qa.q8[static_cast<std::size_t>(m * K + at)] = static_cast<std::int8_t>(r);
        } else if (bytes8) {
          qa.q8[static_cast<std::size_t>(m * K + kk)] = static_cast<std::int8_t>(r);
        } else {
          qa.q16[static_cast<std::size_t>(m * K + kk)] = static_cast<std::int16_t>(r);
        }
      }
      qa.xsum[gi] = qa.d[gi] * static_cast<float>(qsum);
    }
  }
}

// Σ_k q·code over one 32-block at k (portable; the codes of row `row` of B).
std::int32_t block_dot_scalar(const QuantA& qa, std::int64_t m, const std::uint8_t* row, std::int64_t k, int bits) {
  std::int32_t acc = 0;
  if (bits == 4) {
    const std::int8_t* q = qa.q8.data() + m * qa.K + k;
    const std::uint8_t* c = row + k / 2;
    for (int j = 0; j < 16; ++j) {
      acc += static_cast<std::int32_t>(c[j] & 0x0F) * q[j];
      acc += static_cast<std::int32_t>(c[j] >> 4) * q[16 + j];
    }
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

const std::uint8_t* row_bytes(const WeightMatrix& B, std::int64_t n) {
  return reinterpret_cast<const std::uint8_t*>(static_cast<const std::uint32_t*>(B.data) + n * B.ld);
}

void store(const Output& C, std::int64_t m, std::int64_t n, float v) {
  if (C.row_scale) v *= C.row_scale[m];
  float& c = C.data[m * C.ld + n];
  c = C.accumulate ? c + v : v;
}

// Columns [n0, N) of C.
void kernel_scalar(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                   std::int64_t n0 = 0) {
  const int gs = B.affine.group_size, bits = B.affine.bits;
  for (std::int64_t n = n0; n < N; ++n) {
    const std::uint8_t* row = row_bytes(B, n);
    for (std::int64_t m = 0; m < M; ++m) {
      float acc = 0.0f, bacc = 0.0f;
      for (std::int64_t g = 0; g < qa.groups; ++g) {
        std::int32_t isum = 0;
        for (std::int64_t k = g * gs; k < (g + 1) * gs; k += 32) isum += block_dot_scalar(qa, m, row, k, bits);
        const std::int64_t sg = n * B.affine.scale_ld + g;
        const float s = load_f32(B.affine.scales, B.affine.scale_dtype, sg);
        const float b = load_f32(B.affine.biases, B.affine.scale_dtype, sg);
        const std::size_t gi = static_cast<std::size_t>(m * qa.groups + g);
        acc = std::fma(static_cast<float>(isum), s * qa.d[gi], acc);
        bacc = std::fma(b, qa.xsum[gi], bacc);
      }
      store(C, m, n, acc + bacc);
    }
  }
}

#if MOEKIT_X86
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma")))
#define MOEKIT_I8_NAME(f) f##_avx2
#define MOEKIT_I8_VNNI 0
#include "kernels/affine_int8-inl.h"
#undef MOEKIT_I8_ATTR
#undef MOEKIT_I8_NAME
#undef MOEKIT_I8_VNNI
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))
#define MOEKIT_I8_NAME(f) f##_vnni
#define MOEKIT_I8_VNNI 1
#include "kernels/affine_int8-inl.h"
#undef MOEKIT_I8_ATTR
#undef MOEKIT_I8_NAME
#undef MOEKIT_I8_VNNI

bool have_avx2() {
  static const bool ok = cpu_features().avx2_fma;
  return ok;
}

bool have_vnni() {
  static const bool ok = have_avx2() && cpu_features().avx512_vnni;
  return ok;
}
#endif

// What Int8Path::best resolves to: AVX2 where the CPU has it — the AVX512-VNNI tiles did not
// measure faster (docs/performance.md: decode is bound by the weight stream and the per-group
// float work, not by the integer dot products) — or what MOEKIT_INT8_PATH=avx512vnni|avx2|portable
// asks for, where the CPU has it.
detail::Int8Path best_path() {
  static const detail::Int8Path path = [] {
    const char* env = std::getenv("MOEKIT_INT8_PATH");
    const auto is = [env](const char* name) { return env && std::strcmp(env, name) == 0; };
#if MOEKIT_X86
    if (is("avx512vnni") && have_vnni()) return detail::Int8Path::avx512vnni;
    if (have_avx2() && !is("portable")) return detail::Int8Path::avx2;
#endif
    (void)is;
    return detail::Int8Path::portable;
  }();
  return path;
}

}  // namespace

bool detail::int8_activations_apply(const WeightMatrix& B, std::int64_t M) {
  return B.affine.int8_activations && (B.affine.bits == 4 || B.affine.bits == 8) && B.affine.group_size % 32 == 0 &&
         M <= kInt8MaxRows;
}

bool detail::int8_path_supported(Int8Path path) noexcept {
#if MOEKIT_X86
  if (path == Int8Path::avx512vnni) return have_vnni();
  if (path == Int8Path::avx2) return have_avx2();
#endif
  return path == Int8Path::portable || path == Int8Path::best;
}

const char* detail::int8_path_name(Int8Path path) noexcept {
  if (path == Int8Path::best) path = best_path();
  return path == Int8Path::avx512vnni ? "avx512vnni" : path == Int8Path::avx2 ? "avx2" : "portable";
}

void detail::gemm_nt_affine_int8_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                        std::int64_t N, std::int64_t K, Int8Path path) {
  if (M <= 0 || N <= 0) return;
  thread_local QuantA qa;
#if MOEKIT_X86
  if (path == Int8Path::best) path = best_path();
  quantize_a(A, M, K, B.affine.group_size, B.affine.bits, path == Int8Path::avx512vnni, qa);
  if (path == Int8Path::avx512vnni) {
    if (B.affine.bits == 4) return kernel_vnni<4>(qa, B, C, M, N);
    return kernel_vnni<8>(qa, B, C, M, N);
  }
  if (path == Int8Path::avx2) {
    if (B.affine.bits == 4) return kernel_avx2<4>(qa, B, C, M, N);
    return kernel_avx2<8>(qa, B, C, M, N);
  }
#else
  quantize_a(A, M, K, B.affine.group_size, B.affine.bits, false, qa);
#endif
  kernel_scalar(qa, B, C, M, N);
}

}  // namespace moekit::kernels
