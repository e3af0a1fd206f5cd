// The fast mode of gemm_nt on MLX affine 4/8-bit, e2m1 (MXFP4, NVFP4) and int4 weights
// (ComputeMode::int8, planned by kernels/plan.hpp): activations quantized to int8 per weight group, integer dot
// products with the codes, one float multiply-add per group. For few rows of A (decode and small
// batches), where the exact kernel's per-weight unpack-convert-dequantize is the cost and the
// weights are streamed once; where the CPU has AMX-INT8, for many rows too (the AMX kernel below,
// MLX affine only).
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
// x86 with AVX512-VNNI (cpu_paths().int8 picks it where present): `vpdpbusd` on 256-bit vectors, u8 codes × int8
// activations (4- and 8-bit).
// x86 with AVX2: codes and activations as bytes, `vpmaddubsw` + `vpmaddwd` (4-bit: the codes are
// u8 ≤ 15, so a pair of products fits an int16) or widened to int16 and `vpmaddwd` (8-bit); both
// from affine_int8-inl.h (bit-identical for 4-bit codes, to f32 rounding for 8-bit). Elsewhere
// the same arithmetic in portable C++.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/amx.hpp"
#include "kernels/cpu.hpp"
#include "kernels/formats/e2m1.hpp"
#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/int4.hpp"
#include "kernels/gemm.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOEKIT_X86 1
#else
#define MOEKIT_X86 0
#endif

namespace moekit::kernels {

namespace {

// The codes a kernel multiplies: MLX affine 4- or 8-bit (u8 codes, a scale and a bias per group),
// or signed 4-bit (e2m1, int4: a nibble's integer from a table, a scale per group, no bias).
enum class Codes { affine4, affine8, signed4 };

// Whether the x86 kernels take A's activations as int16 (QuantA::q16: 8-bit codes without VNNI)
// rather than int8 (q8). Only that one of the two arrays is filled.
constexpr bool int16_activations(Codes codes, bool vnni) { return codes == Codes::affine8 && !vnni; }

Codes codes_of(const WeightFormat& f) {
  if (f.element == Element::affine) return f.bits == 4 ? Codes::affine4 : Codes::affine8;
  return Codes::signed4;
}

// A signed 4-bit format's nibbles as small integers w and the factor that makes them weights:
// weight = w · scale_factor · the group's scale, exactly (the formats' own rules:
// e2m1.hpp, int4.hpp).
struct SignedCodes {
  const std::int8_t* table;  // 16 entries
  float scale;
};

inline SignedCodes signed_codes(const WeightFormat& f) {
  if (f.element == Element::e2m1) return {formats::e2m1::kTwice, 0.5f};
  return {formats::int4::kIntegers, 1.0f};
}

// A's rows quantized for one call: per row, K int8 codes (4-bit B: in the nibble order below),
// or K int16 (8-bit B on AVX2); per group, the scale d, the integer Σq and d · Σq (the rounded
// activations' sum: the affine bias term, the signed codes' offset).
struct QuantA {
  std::int64_t M = 0, K = 0, groups = 0;
  // d, qsum and xsum's row stride: groups rounded up to a multiple of 8, the pad zero (the x86
  // kernels take eight groups' scales at once).
  std::int64_t gstride = 0;
  bool bytes8 = false;  // 8-bit codes' activations in q8 (natural order), not q16
  // 4-bit codes with K a multiple of 64: each 64-chunk stored as its 32 even elements then its 32
  // odd ones, the order 32 packed bytes unpack into (low nibbles, then high), so the x86 kernels
  // load 64 codes at once; else per 32-block (16 bytes; the portable kernel alone).
  bool pair64 = false;

  // Where element k of a row sits in q8 (4-bit codes): the unpack order above.
  std::int64_t at(std::int64_t k) const {
    const std::int64_t span = pair64 ? 64 : 32, i = k % span;
    return k - i + (i % 2 == 0 ? i / 2 : span / 2 + i / 2);
  }
  std::vector<std::int8_t> q8;
  std::vector<std::int16_t> q16;
  std::vector<float> d, xsum;
  std::vector<std::int32_t> qsum;
  // q2_K's row kernel (ggml_int8-inl.h): each row's sums of 16 codes, K / 16 per row.
  std::vector<std::int16_t> qsum16;
};

// One row of A's groups of gs inputs (x[k] times f where `scaled`), each `span` inputs (a
// multiple of gs dividing K) sharing one scale d = max |x| / 127 over the span (span = gs: a scale
// per group, q8_0's activations; 256 for the K-quants: q8_K's): per group d, d·Σq and Σq into
// d[g], xsum[g] and isum[g], its codes in natural order into q[k]. A span holding NaN or Inf
// gives its groups d = d·Σq = NaN and codes 0. The definition the vector version below follows
// step for step (the same codes, d, Σq and d·Σq, bit for bit).
void quantize_row(const float* x, float f, bool scaled, std::int64_t K, int gs, int span, float* d, float* xsum,
                  std::int32_t* isum, std::int8_t* q) {
  if (gs <= 0 || span < gs) return;
  const auto value = [&](std::int64_t k) { return scaled ? x[k] * f : x[k]; };
  for (std::int64_t s0 = 0; s0 < K; s0 += span) {
    float amax = 0.0f;
    bool finite = true;
    for (std::int64_t k = s0; k < s0 + span; ++k) {
      const float v = value(k);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    std::fill(q + s0, q + s0 + span, std::int8_t{0});
    for (std::int64_t k0 = s0; k0 < s0 + span; k0 += gs) {
      const std::int64_t g = k0 / gs;
      d[g] = xsum[g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      isum[g] = 0;
      if (!finite || amax == 0.0f) continue;  // NaN or Inf: this row's outputs NaN, as exactly; 0: d = 0, codes 0
      d[g] = amax / 127.0f;
      const float inv = 127.0f / amax;
      std::int32_t qsum = 0;
      for (std::int64_t k = k0; k < k0 + gs; ++k) {
        const float r = std::min(127.0f, std::max(-127.0f, std::rint(value(k) * inv)));
        qsum += static_cast<std::int32_t>(r);
        q[k] = static_cast<std::int8_t>(r);
      }
      isum[g] = qsum;
      xsum[g] = d[g] * static_cast<float>(qsum);
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
#define MOEKIT_QA_AVX2 __attribute__((target("avx2,fma")))

// quantize_row on AVX2 (gs a multiple of 16): the same float operations per element (the product
// by f, |v|, the max, v · inv rounded to nearest even, the clamp) and an exact integer sum.
MOEKIT_QA_AVX2 void quantize_row_avx2(const float* x, float f, bool scaled, std::int64_t K, int gs, int span, float* d,
                                      float* xsum, std::int32_t* isum, std::int8_t* q) {
  if (gs <= 0 || span < gs) return;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 fv = _mm256_set1_ps(f), lim = _mm256_set1_ps(127.0f), neg = _mm256_set1_ps(-127.0f);
#define MOEKIT_QA_LOAD(k) (scaled ? _mm256_mul_ps(_mm256_loadu_ps(x + (k)), fv) : _mm256_loadu_ps(x + (k)))
  for (std::int64_t s0 = 0; s0 < K; s0 += span) {
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (std::int64_t k = s0; k < s0 + span; k += 8) {
      const __m256 a = _mm256_and_ps(MOEKIT_QA_LOAD(k), abs_mask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // NaN or Inf
      amax = _mm256_max_ps(amax, a);
    }
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    const __m128 h2 = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax_s = _mm_cvtss_f32(_mm_max_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
    const bool finite = _mm256_movemask_ps(bad) == 0;
    if (!finite || amax_s == 0.0f) {
      std::memset(q + s0, 0, static_cast<std::size_t>(span));
      for (std::int64_t g = s0 / gs; g < (s0 + span) / gs; ++g) {
        d[g] = xsum[g] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        isum[g] = 0;
      }
      continue;
    }
    const float ds = amax_s / 127.0f;
    const __m256 inv = _mm256_set1_ps(127.0f / amax_s);
    for (std::int64_t k0 = s0; k0 < s0 + span; k0 += gs) {
      __m256i qsum = _mm256_setzero_si256();
      for (std::int64_t k = k0; k < k0 + gs; k += 16) {
        __m256i i[2];
        for (int h8 = 0; h8 < 2; ++h8) {
          const __m256 r = _mm256_round_ps(_mm256_mul_ps(MOEKIT_QA_LOAD(k + 8 * h8), inv),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          i[h8] = _mm256_cvtps_epi32(_mm256_min_ps(lim, _mm256_max_ps(neg, r)));
          qsum = _mm256_add_epi32(qsum, i[h8]);
        }
        const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8);  // 16 int16 in order
        const __m256i w8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(w16, w16), 0x08);     // 16 int8 in order
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm256_castsi256_si128(w8));
      }
      const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
      const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
      const std::int64_t g = k0 / gs;
      d[g] = ds;
      isum[g] = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
      xsum[g] = ds * static_cast<float>(isum[g]);
    }
  }
#undef MOEKIT_QA_LOAD
}

// A 32-block of int8 codes in natural order as its 16 even elements, then its 16 odd ones.
MOEKIT_QA_AVX2 inline __m256i evens_odds32(__m256i v) {
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                         14, 1, 3, 5, 7, 9, 11, 13, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, split), 0xD8);
}

MOEKIT_QA_AVX2 inline __m256i load32(const std::int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

MOEKIT_QA_AVX2 inline void put32(std::int8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// Natural-order codes of a row (K a multiple of 32; of 64 with pair64) in QuantA's 4-bit order.
MOEKIT_QA_AVX2 void place4_avx2(const std::int8_t* src, std::int64_t K, bool pair64, std::int8_t* dst) {
  if (!pair64) {
    for (std::int64_t k = 0; k < K; k += 32) put32(dst + k, evens_odds32(load32(src + k)));
    return;
  }
  for (std::int64_t k = 0; k < K; k += 64) {
    const __m256i a = evens_odds32(load32(src + k)), b = evens_odds32(load32(src + k + 32));
    put32(dst + k, _mm256_permute2x128_si256(a, b, 0x20));       // the 32 even elements
    put32(dst + k + 32, _mm256_permute2x128_si256(a, b, 0x31));  // the 32 odd ones
  }
}

MOEKIT_QA_AVX2 void widen16_avx2(const std::int8_t* src, std::int64_t K, std::int16_t* dst) {
  for (std::int64_t k = 0; k < K; k += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
}
#undef MOEKIT_QA_AVX2
#endif

// A's M rows quantized for B's groups of gs inputs, a scale per `span` inputs (0: per group;
// quantize_row). bytes8: 8-bit codes take int8 activations too (the VNNI kernel), in natural
// order; 4-bit codes in QuantA's nibble order. vector: the AVX2 steps (the same results; the
// caller checked the CPU).
void quantize_a(const RowSource& A, std::int64_t M, std::int64_t K, int gs, int bits, bool bytes8, bool vector,
                QuantA& qa, int span = 0) {
  if (span == 0) span = gs;
  qa.M = M;
  qa.K = K;
  qa.bytes8 = bits == 8 && bytes8;
  qa.pair64 = bits == 4 && K % 64 == 0;
  qa.groups = K / gs;
  qa.gstride = (qa.groups + 7) / 8 * 8;
  qa.d.assign(static_cast<std::size_t>(M * qa.gstride), 0.0f);
  qa.xsum.assign(qa.d.size(), 0.0f);
  qa.qsum.assign(qa.d.size(), 0);
  const bool natural = bits == 8 && bytes8;  // codes written in place
  if (bits == 4 || bytes8)
    qa.q8.resize(static_cast<std::size_t>(M * K));
  else
    qa.q16.resize(static_cast<std::size_t>(M * K));
  thread_local std::vector<std::int8_t> row;
  row.resize(static_cast<std::size_t>(K));
#if !(defined(__x86_64__) || defined(__i386__))
  vector = false;
#endif
  for (std::int64_t m = 0; m < M; ++m) {
    std::int8_t* q = natural ? qa.q8.data() + m * K : row.data();
    float* d = qa.d.data() + m * qa.gstride;
    float* xsum = qa.xsum.data() + m * qa.gstride;
    std::int32_t* isum = qa.qsum.data() + m * qa.gstride;
    const float f = A.factor(m);
#if defined(__x86_64__) || defined(__i386__)
    if (vector) {
      quantize_row_avx2(A.row(m), f, A.scale != nullptr, K, gs, span, d, xsum, isum, q);
      if (bits == 4) place4_avx2(q, K, qa.pair64, qa.q8.data() + m * K);
      if (bits == 8 && !bytes8) widen16_avx2(q, K, qa.q16.data() + m * K);
      continue;
    }
#endif
    quantize_row(A.row(m), f, A.scale != nullptr, K, gs, span, d, xsum, isum, q);
    for (std::int64_t k = 0; k < K && !natural; ++k) {
      if (bits == 4) {
        qa.q8[static_cast<std::size_t>(m * K + qa.at(k))] = q[k];
      } else {
        qa.q16[static_cast<std::size_t>(m * K + k)] = q[k];
      }
    }
  }
}

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

// Bytes between rows of B's codes (its container's elements: u32 words for affine, bytes else).
std::int64_t row_stride_bytes(const WeightMatrix& B) { return B.ld * static_cast<std::int64_t>(dtype_size(B.dtype)); }

const std::uint8_t* row_bytes(const WeightMatrix& B, std::int64_t n) {
  return static_cast<const std::uint8_t*>(B.data) + n * row_stride_bytes(B);
}

void store(const Output& C, std::int64_t m, std::int64_t n, float v) {
  if (C.row_scale) v *= C.row_scale[m];
  float& c = C.data[m * C.ld + n];
  c = C.accumulate ? c + v : v;
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

// This thread's quantized activations, reused across calls. Returned by reference from a function
// GCC may not inline: inlined, it would specialise the kernels on the thread_local's address and
// re-derive it at every access, which under -fPIC (the README's build: the Python module links
// the library) costs the decode kernels 10-12 % (docs/performance.md).
[[gnu::noinline]] QuantA& thread_quant_a() {
  thread_local QuantA qa;
  return qa;
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

// ---- ggml's block types (GGUF) -------------------------------------------------------------
//
// The fast mode on ggml's types: A quantized per 32 inputs (QuantA, groups of 32, int8 in natural
// order), B's blocks in ggml_common.hpp's integer form (w = ws · qs16 · q + wb per 32 weights).
// Per row of A and group g of 32 inputs: S_g = Σ_h qs16_h Σ_k q_k · a_k, exact, then
//   y = Σ_g ( S_g · ws_g · d[m,g]  +  wb_g · d[m,g]·Σa ),
// so, as for the affine codes, |y_fast − y_exact| ≤ Σ_g (d[m,g] / 2) Σ_k |w_k| (docs/numerics.md).
// ggml itself quantizes the activations per 256 for the K-quants (q8_K) and per 32 for the rest
// (q8_0, f16 scales); moekit's per-32 f32 scales are never coarser.

// What the kernels need to know of a type beyond its integer form, from its own file
// (formats/ggml_common.hpp's Int8Facts): whether its codes are signed (else u8 ≤ 31), the offset
// its unsigned codes carry in the x86 kernels (q = code − offset: S_g loses offset · Σa), and
// whether it has a bias term. Every type with an integer form has x86 kernels (ggml_int8-inl.h);
// the portable kernel serves other CPUs and the tests.
template <class T>
struct GgmlInt8 {
  static constexpr bool kSigned = T::kInt8Facts.signed_codes;
  static constexpr int kOffset = T::kInt8Facts.row_offset;
  static constexpr bool kBias = T::kInt8Facts.bias;
  // q2_K: a min per 16 weights (ggml_common.hpp's Mins): per group the integer
  // M_g = Σ_h qm16_h Σ_k a_k (exact), then bacc = fma(wm, M_g · d, bacc).
  static constexpr bool kMin16 = T::kInt8Facts.min16;
  static constexpr bool kAdd = kBias || kMin16;  // a second accumulator, added at the end
};

// The 32-block types whose 32 codes are 16 bytes of nibbles (element j low, j + 16 high) behind
// an optional table (kHasTable, kTable), which the x86 row kernel takes two blocks at a time
// (ggml_int8-inl.h's pair32, A's rows in pair_order): kQs the nibbles' offset in the block. The
// one statement of these types' codes: codes32 and pair32 both read it (nibble_codes).
template <class T>
struct NibblePairs {
  static constexpr bool kYes = T::kInt8Facts.nibble_pairs;
  static constexpr int kQs = T::kInt8Facts.codes_at;
  static constexpr bool kHasTable = T::kInt8Facts.has_table;
  static constexpr const std::int8_t* kTable = T::kInt8Facts.table;
};

// The nibble types whose codes are u8 (no table, or MXFP4's shifted one), which the VNNI row
// kernel takes four blocks at a time in a whole chunk of eight (ggml_int8-inl.h's quad32, A's
// rows in quad_order).
template <class T>
struct QuadNibbles {
  static constexpr bool kYes = NibblePairs<T>::kYes && !GgmlInt8<T>::kSigned;
};

#if MOEKIT_X86
// Per `span` inputs of A's rows in [k0, k1) (whole spans), cut in pieces of `piece` inputs: the
// even pieces side by side, then the odd ones (the orders the x86 row kernels unpack in).
void evens_then_odds(QuantA& qa, std::int64_t k0, std::int64_t k1, std::int64_t span, std::int64_t piece) {
  std::int8_t tmp[128];
  const std::int64_t half = span / piece / 2;
  for (std::int64_t m = 0; m < qa.M; ++m) {
    std::int8_t* row = qa.q8.data() + m * qa.K;
    for (std::int64_t k = k0; k + span <= k1; k += span) {
      for (std::int64_t j = 0; j < half; ++j) {
        std::memcpy(tmp + piece * j, row + k + piece * 2 * j, static_cast<std::size_t>(piece));
        std::memcpy(tmp + piece * (half + j), row + k + piece * (2 * j + 1), static_cast<std::size_t>(piece));
      }
      std::memcpy(row + k, tmp, static_cast<std::size_t>(span));
    }
  }
}

// A's int8 codes (natural order) rearranged for pair32: per 64 inputs (two 32-blocks), elements
// 0-15, 32-47, 16-31, 48-63 — each block's low-nibble half beside the other's, then the high
// halves. A last lone block keeps its natural order.
void pair_order(QuantA& qa) { evens_then_odds(qa, 0, qa.K, 64, 16); }

// The same for quad32 in the whole chunks of 256 inputs (eight blocks), per 128 (four blocks):
// the four low-nibble halves, then the four high ones; past the last whole chunk pair_order's.
void quad_order(QuantA& qa) {
  const std::int64_t whole = qa.K / 256 * 256;
  evens_then_odds(qa, 0, whole, 128, 16);
  evens_then_odds(qa, whole, qa.K, 64, 16);
}

// A's codes for the VNNI row kernel's q4_K and q5_K (ggml_int8-inl.h's chunk_k45): per 128 inputs (four
// sub-blocks of 32) sub-blocks 0, 2, 1, 3 — the low nibbles of 64 bytes, then the high ones.
void k4_order(QuantA& qa) { evens_then_odds(qa, 0, qa.K, 128, 32); }
#endif

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

// Calls fn(T{}) for B's ggml type T where it has a fast mode; returns whether it did.
template <class Fn>
bool with_ggml_int8_type(Element element, const Fn& fn) {
  switch (element) {
#define MOEKIT_GGML_INT8_CASE(f)             \
  case Element::f:                           \
    if constexpr (formats::f::Type::kInt8) { \
      fn(formats::f::Type{});                \
      return true;                           \
    } else {                                 \
      return false;                          \
    }
    MOEKIT_GGML_FORMATS(MOEKIT_GGML_INT8_CASE)
#undef MOEKIT_GGML_INT8_CASE
    default:
      return false;
  }
}

// Calls fn(T{}) for B's ggml type T; returns whether B is one.
template <class Fn>
bool with_ggml_type(Element element, const Fn& fn) {
  switch (element) {
#define MOEKIT_GGML_CASE(f) \
  case Element::f:          \
    fn(formats::f::Type{}); \
    return true;
    MOEKIT_GGML_FORMATS(MOEKIT_GGML_CASE)
#undef MOEKIT_GGML_CASE
    default:
      return false;
  }
}

#if MOEKIT_X86
// A's rows for the panel kernels (ggml_panel-inl.h): int8 codes in blocks of 4 rows, each
// [K / 4][4 rows][4 inputs] (so one tile's rows are a few pointers and small offsets), and per
// group of kG inputs d, d·Σa and −off·Σa (where a group's int32 sums start) as [groups][Mp]; Mp
// the rows rounded up to 4, the padding zero.
struct Rows {
  const std::int8_t* q = nullptr;
  const float* d = nullptr;
  const float* xs = nullptr;
  const std::int32_t* t0 = nullptr;
  std::int64_t Mp = 0;
};

#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c")))
#define MOEKIT_I8_NAME(f) f##_avx2
#define MOEKIT_I8_VNNI 0
#include "kernels/affine_int8-inl.h"
#include "kernels/ggml_int8-inl.h"
namespace panel_avx2 {
#include "kernels/ggml_panel-inl.h"
}  // namespace panel_avx2
#undef MOEKIT_I8_ATTR
#undef MOEKIT_I8_NAME
#undef MOEKIT_I8_VNNI
#define MOEKIT_I8_ATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))
#define MOEKIT_I8_NAME(f) f##_vnni
#define MOEKIT_I8_VNNI 1
// GCC 12's false positive on _mm512_cvtepi32_ps and the other 512-bit intrinsics built on an
// undefined vector (see the AMX kernel below).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/affine_int8-inl.h"
#include "kernels/ggml_int8-inl.h"
namespace panel_vnni {
#include "kernels/ggml_panel-inl.h"
}  // namespace panel_vnni
#pragma GCC diagnostic pop
#undef MOEKIT_I8_ATTR
#undef MOEKIT_I8_NAME
#undef MOEKIT_I8_VNNI

#endif

// ---- AMX-INT8: many rows (prefill) ---------------------------------------------------------
//
// `tdpbusd` on 16 × 16 int32 tiles, the weight codes (u8) its first operand — 8-bit codes
// loaded in place with their row stride (a tile of fewer than 16 rows staged), 4-bit codes
// unpacked per 64-k chunk into a stack tile (low nibbles, then high: elements 0, 2, .., 62,
// then 1, 3, .., 63) — and the int8 activations, laid out to match, its second; so a tile holds
// Cᵀ (16 weight rows × 16 activation rows).
// Blocking as the bf16 AMX kernel: 2 × 2 tiles. A group (a multiple of 64 inputs) is summed
// exactly in the int32 tiles; then, per element, acc = fma(float(isum), s·d, acc) and
// bacc = fma(b, d·Σq, bacc) in group order — the portable kernel's steps, element by element,
// so the same bits (tested), vectorised over 16 activation rows.

// A quantized for the AMX kernel: per 16-row panel and 64-k chunk one 1 KB tile (byte
// (p / 4)·64 + (m % 16)·4 + p % 4 for chunk position p), and d, d·Σq per [group][row].
struct AmxQuantA {
  std::int64_t M = 0, Mp = 0, panels = 0, chunks = 0, groups = 0;
  std::vector<std::int8_t> q;
  std::vector<float> d, xsum;
};

#if MOEKIT_X86
// GCC 12's AVX-512 headers make their "undefined" source operands as `__m512 __Y = __Y;`, which
// -W(maybe-)uninitialized reports once _mm512_cvtepi32_ps is inlined: a false positive (the
// conversion writes every lane), silenced for the AMX kernel alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MOEKIT_AMX8 __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2")))

// quantize_a's arithmetic (the same d, codes and d·Σq, bit for bit: the max and the integer sum
// do not depend on the order, v·inv is one rounding, rint rounds to nearest even), 16 elements
// at a time, written straight into AmxQuantA's tiles: element e of a 64-k chunk at position
// p = e (8-bit) or the nibble order's (4-bit: e / 2 for even e, 32 + e / 2 for odd).
MOEKIT_AMX8 void quantize_amx(const RowSource& A, std::int64_t M, std::int64_t K, int gs, int bits, AmxQuantA& out) {
  out.M = M;
  out.panels = (M + 15) / 16;
  out.Mp = out.panels * 16;
  out.chunks = K / 64;
  out.groups = K / gs;
  out.q.assign(static_cast<std::size_t>(out.panels * out.chunks * 1024), 0);
  out.d.assign(static_cast<std::size_t>(out.groups * out.Mp), 0.0f);
  out.xsum.assign(out.d.size(), 0.0f);
  thread_local std::vector<float> group;  // one group's (scaled) inputs; any group size
  group.resize(static_cast<std::size_t>(gs));
  float* v = group.data();
  alignas(64) std::int8_t natural[64], placed[64];
  const __m512 lim = _mm512_set1_ps(127.0f), neg = _mm512_set1_ps(-127.0f);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (std::int64_t m = 0; m < M; ++m) {
    const float* x = A.row(m);
    const __m512 f = _mm512_set1_ps(A.scale ? A.scale[m] : 1.0f);
    std::int8_t* panel = out.q.data() + (m / 16) * out.chunks * 1024 + (m % 16) * 4;
    for (std::int64_t g = 0; g < out.groups; ++g) {
      const std::int64_t k0 = g * gs;
      __m512 amax = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int k = 0; k < gs; k += 16) {
        __m512 e = _mm512_loadu_ps(x + k0 + k);
        if (A.scale) e = _mm512_mul_ps(e, f);
        _mm512_storeu_ps(v + k, e);
        const __m512 a = _mm512_and_ps(e, abs_mask);
        bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(std::numeric_limits<float>::infinity()), _CMP_NLT_UQ);
        amax = _mm512_max_ps(amax, a);
      }
      const std::size_t gi = static_cast<std::size_t>(g * out.Mp + m);
      if (bad) {  // NaN or Inf: the outputs of this row become NaN, as the exact kernel's would
        out.d[gi] = out.xsum[gi] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float amax_s = _mm512_reduce_max_ps(amax);
      if (amax_s == 0.0f) continue;  // d = 0, codes 0
      out.d[gi] = amax_s / 127.0f;
      const __m512 inv = _mm512_set1_ps(127.0f / amax_s);
      __m512i qsum = _mm512_setzero_si512();
      for (int c = 0; c < gs; c += 64) {
        for (int k = 0; k < 64; k += 16) {
          const __m512 r = _mm512_min_ps(lim, _mm512_max_ps(neg, _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(v + c + k), inv),
                                                                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
          const __m512i ri = _mm512_cvtps_epi32(r);
          qsum = _mm512_add_epi32(qsum, ri);
          _mm_store_si128(reinterpret_cast<__m128i*>(natural + k), _mm512_cvtepi32_epi8(ri));
        }
        const std::int8_t* src = natural;
        if (bits == 4) {
          for (int j = 0; j < 32; ++j) {
            placed[j] = natural[2 * j];
            placed[32 + j] = natural[2 * j + 1];
          }
          src = placed;
        }
        std::int8_t* tile = panel + ((k0 + c) / 64) * 1024;
        for (int j = 0; j < 16; ++j) std::memcpy(tile + j * 64, src + 4 * j, 4);
      }
      out.xsum[gi] = out.d[gi] * static_cast<float>(_mm512_reduce_add_epi32(qsum));
    }
  }
}

struct CodeRows {
  const std::uint8_t* base = nullptr;  // row 0's codes
  std::int64_t stride = 0;             // bytes between rows
  std::int64_t rows = 0;               // 1..16 (0: absent)
};

// Chunk c (64 inputs) of `w` as 16 × 64 u8 codes in `tile` (rows past w.rows stay as they are:
// zero). 8-bit: a copy; 4-bit: the two nibbles of 32 bytes, low then high.
template <int kBits>
MOEKIT_AMX8 void unpack_chunk(const CodeRows& w, std::int64_t c, std::uint8_t* tile) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (std::int64_t r = 0; r < w.rows; ++r) {
    const std::uint8_t* src = w.base + r * w.stride + c * 64 * kBits / 8;
    if constexpr (kBits == 4) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      _mm256_store_si256(reinterpret_cast<__m256i*>(tile + r * 64), _mm256_and_si256(v, low4));
      _mm256_store_si256(reinterpret_cast<__m256i*>(tile + r * 64 + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    } else {
      _mm512_store_si512(tile + r * 64, _mm512_loadu_si512(src));
    }
  }
}

// Loads chunk c of weight tile `w` into tile register T: 8-bit whole tiles in place, else staged.
#define MOEKIT_LOAD_CODES(T, w, c, staging)                                   \
  do {                                                                       \
    if (kBits == 8 && (w).rows == 16) {                                      \
      _tile_loadd(T, (w).base + (c) * 64, (w).stride);                       \
    } else {                                                                 \
      unpack_chunk<kBits>((w), (c), (staging));                              \
      _tile_loadd(T, (staging), 64);                                         \
    }                                                                        \
  } while (0)

// NT weight tiles × MT activation panels over every group. Tile registers: C(t, u) = 2t + u,
// codes 4 + t, activations 6 + u.
template <int kBits, int NT, int MT>
MOEKIT_AMX8 void amx8_block(const AmxQuantA& qa, const CodeRows* w, const WeightMatrix& B, const Output& C,
                            std::int64_t p0, std::int64_t n0, int gs) {
  alignas(64) std::uint8_t staging[2][1024] = {};
  alignas(64) std::int32_t isum[4][256];
  alignas(64) float acc[4][256] = {}, bacc[4][256] = {};
  const std::int64_t per_group = gs / 64;
  const std::int8_t* x[2] = {qa.q.data() + p0 * qa.chunks * 1024, qa.q.data() + (p0 + 1) * qa.chunks * 1024};
  for (std::int64_t g = 0; g < qa.groups; ++g) {
    _tile_zero(0);
    if constexpr (MT == 2) _tile_zero(1);
    if constexpr (NT == 2) _tile_zero(2);
    if constexpr (NT == 2 && MT == 2) _tile_zero(3);
    for (std::int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      // Each code row's line two chunks ahead, into L1: the tile loads otherwise wait on 32
      // rows' lines at once (the distance and the level: docs/performance.md).
      for (int t = 0; t < NT; ++t)
        for (std::int64_t r = 0; r < w[t].rows; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(w[t].base + r * w[t].stride + (c + 2) * 64 * kBits / 8),
                       _MM_HINT_T0);
      MOEKIT_LOAD_CODES(4, w[0], c, staging[0]);
      if constexpr (NT == 2) MOEKIT_LOAD_CODES(5, w[1], c, staging[1]);
      _tile_loadd(6, x[0] + c * 1024, 64);
      if constexpr (MT == 2) _tile_loadd(7, x[1] + c * 1024, 64);
      _tile_dpbusd(0, 4, 6);
      if constexpr (MT == 2) _tile_dpbusd(1, 4, 7);
      if constexpr (NT == 2) _tile_dpbusd(2, 5, 6);
      if constexpr (NT == 2 && MT == 2) _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, isum[0], 64);
    if constexpr (MT == 2) _tile_stored(1, isum[1], 64);
    if constexpr (NT == 2) _tile_stored(2, isum[2], 64);
    if constexpr (NT == 2 && MT == 2) _tile_stored(3, isum[3], 64);
    for (int u = 0; u < MT; ++u) {
      const __m512 d = _mm512_loadu_ps(qa.d.data() + g * qa.Mp + (p0 + u) * 16);
      const __m512 xs = _mm512_loadu_ps(qa.xsum.data() + g * qa.Mp + (p0 + u) * 16);
      for (int t = 0; t < NT; ++t) {
        const int i = 2 * t + u;
        for (std::int64_t r = 0; r < w[t].rows; ++r) {
          const std::int64_t sg = (n0 + 16 * t + r) * B.scale_ld + g;
          const __m512 s = _mm512_set1_ps(load_f32(B.scales, B.format.scale_dtype, sg));
          const __m512 b = _mm512_set1_ps(load_f32(B.biases, B.format.scale_dtype, sg));
          const __m512 is = _mm512_cvtepi32_ps(_mm512_load_si512(isum[i] + r * 16));
          _mm512_store_ps(acc[i] + r * 16, _mm512_fmadd_ps(is, _mm512_mul_ps(s, d), _mm512_load_ps(acc[i] + r * 16)));
          _mm512_store_ps(bacc[i] + r * 16, _mm512_fmadd_ps(b, xs, _mm512_load_ps(bacc[i] + r * 16)));
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int u = 0; u < MT; ++u) {
      const int i = 2 * t + u;
      const std::int64_t m0 = (p0 + u) * 16, rows_m = std::min<std::int64_t>(16, qa.M - m0);
      for (std::int64_t r = 0; r < w[t].rows; ++r)
        for (std::int64_t l = 0; l < rows_m; ++l) store(C, m0 + l, n0 + 16 * t + r, acc[i][r * 16 + l] + bacc[i][r * 16 + l]);
    }
}

#undef MOEKIT_LOAD_CODES

// Panels [q0, q1) × column pairs [c0, c1) of C on this thread.
template <int kBits>
MOEKIT_AMX8 void amx8_run(const AmxQuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t N,
                          std::int64_t q0, std::int64_t q1, std::int64_t c0, std::int64_t c1) {
  static constexpr AmxTileConfig config = AmxTileConfig::full();
  _tile_loadconfig(&config);
  const auto* codes = static_cast<const std::uint8_t*>(B.data);
  const std::int64_t stride = B.ld * 4;
  const int gs = B.format.block_cols;
  for (std::int64_t pair = c0; pair < c1; ++pair) {
    const std::int64_t n0 = pair * 32;
    CodeRows w[2];
    for (int t = 0; t < 2; ++t)
      w[t] = {codes + (n0 + 16 * t) * stride, stride, std::clamp<std::int64_t>(N - n0 - 16 * t, 0, 16)};
    const bool two_n = w[1].rows > 0;
    for (std::int64_t p = q0; p < q1; p += 2) {
      const bool two_m = p + 1 < q1;
      if (two_n && two_m) amx8_block<kBits, 2, 2>(qa, w, B, C, p, n0, gs);
      else if (two_n) amx8_block<kBits, 2, 1>(qa, w, B, C, p, n0, gs);
      else if (two_m) amx8_block<kBits, 1, 2>(qa, w, B, C, p, n0, gs);
      else amx8_block<kBits, 1, 1>(qa, w, B, C, p, n0, gs);
    }
  }
  _tile_release();
}

void amx8_split(const AmxQuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t N, Threads threads) {
  split_amx(qa.panels, (N + 31) / 32, threads, [&](std::int64_t q0, std::int64_t q1, std::int64_t c0, std::int64_t c1) {
    if (B.format.bits == 4) return amx8_run<4>(qa, B, C, N, q0, q1, c0, c1);
    amx8_run<8>(qa, B, C, N, q0, q1, c0, c1);
  });
}
#pragma GCC diagnostic pop
#endif

// QuantA::qsum16 from its int8 codes (natural order): each row's sums of 16 codes.
void sums16(QuantA& qa) {
  qa.qsum16.resize(static_cast<std::size_t>(qa.M * qa.K / 16));
  for (std::int64_t i = 0; i < qa.M * qa.K / 16; ++i) {
    int sum = 0;
    for (int k = 0; k < 16; ++k) sum += qa.q8[static_cast<std::size_t>(16 * i + k)];
    qa.qsum16[static_cast<std::size_t>(i)] = static_cast<std::int16_t>(sum);  // |sum| ≤ 16 · 127
  }
}

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
    return ggml_rows_vnni<T>(qa, B, C, M, N);
  }
  if (path == Int8Path::avx2) {
    if constexpr (NibblePairs<T>::kYes) pair_order(qa);
    return ggml_rows_avx2<T>(qa, B, C, M, N);
  }
#endif
  ggml_kernel_scalar<T>(qa, B, C, M, N);
}

#if MOEKIT_X86
// Which rows of A a call reads, and in which ReuseQuantizedRows scope (epoch 0: none).
struct RowsKey {
  std::uint64_t epoch = 0;
  const float* data = nullptr;
  std::int64_t ld = 0;
  const std::int32_t* index = nullptr;
  const float* scale = nullptr;
  std::int64_t M = 0, K = 0;
  bool operator==(const RowsKey&) const = default;
};

// The open ReuseQuantizedRows scopes on this thread, and the epoch of the outermost: a new one
// per scope, so rows prepared in an earlier scope are never taken again.
thread_local int reuse_depth = 0;
thread_local std::uint64_t reuse_epoch = 0;

RowsKey rows_key(const RowSource& A, std::int64_t M, std::int64_t K) {
  return {reuse_depth > 0 ? reuse_epoch : 0, A.data, A.ld, A.index, A.scale, M, K};
}

// A quantized as ggml_int8 quantizes it (QuantA) and laid out for the panel kernels (Rows):
// codes, and per group of T's kG inputs d, d·Σa (Σa where the tile applies d per block) and
// −off·Σa.
template <class T>
void prepare_rows(const RowSource& A, std::int64_t M, std::int64_t K, std::int64_t Mp, std::vector<std::int8_t>& q,
                  std::vector<float>& d, std::vector<float>& xs, std::vector<std::int32_t>& t0) {
  using Tr = panel_avx2::Traits<T>;  // its group and offset: the same for both widths
  const std::int64_t groups = K / Tr::kG;
  QuantA& qa = thread_quant_a();
  quantize_a(A, M, K, 32, 8, true, true, qa, T::kBlock);
  if constexpr (Tr::kG == 16) sums16(qa);
  q.assign(static_cast<std::size_t>(Mp * K), 0);
  d.assign(static_cast<std::size_t>(Mp * groups), 0.0f);
  xs.assign(d.size(), 0.0f);
  t0.assign(d.size(), 0);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int8_t* row = qa.q8.data() + m * K;
    std::int8_t* block = q.data() + (m / 4) * 4 * K + (m % 4) * 4;  // Rows's layout
    for (std::int64_t j = 0; j < K / 4; ++j) std::memcpy(block + 16 * j, row + 4 * j, 4);
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::size_t at = static_cast<std::size_t>(g * Mp + m);
      const std::size_t gi = static_cast<std::size_t>(m * qa.gstride + g * Tr::kG / 32);
      const std::int32_t sum = Tr::kG == 16 ? qa.qsum16[static_cast<std::size_t>(m * (K / 16) + g)] : qa.qsum[gi];
      d[at] = qa.d[gi];
      // With a scale per block of 256 (Tr::kSb > 1) the tile applies d once per block: xs is Σq.
      xs[at] = Tr::kSb > 1 ? static_cast<float>(sum) : Tr::kG == 32 ? qa.xsum[gi] : qa.d[gi] * static_cast<float>(sum);
      t0[at] = -Tr::kOff * sum;
    }
  }
}

// The fast mode on a ggml type for many rows (ggml_panel-inl.h): A prepared once (prepare_rows;
// inside a ReuseQuantizedRows scope, once for every call on the same rows and type), then B's
// rows a panel at a time (16 rows with AVX512-VNNI, 8 with AVX2), split over the pool in whole
// panels where `threads` asks for it.
template <class T>
void ggml_panels(T, const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                 std::int64_t K, Threads threads, bool vnni) {
  const std::int64_t Mp = (M + 3) / 4 * 4;
  thread_local std::vector<std::int8_t> q;
  thread_local std::vector<float> d, xs;
  thread_local std::vector<std::int32_t> t0;
  thread_local RowsKey last;  // the rows q, d, xs and t0 hold
  const RowsKey key = rows_key(A, M, K);
  if (key.epoch == 0 || !(key == last)) {
    last = {};  // until the rows are whole again
    prepare_rows<T>(A, M, K, Mp, q, d, xs, t0);
  }
  last = key;
  const Rows rows{q.data(), d.data(), xs.data(), t0.data(), Mp};
  const std::int64_t width = vnni ? panel_vnni::kW : panel_avx2::kW;
  const auto run = [&](std::int64_t b0, std::int64_t b1) {
    if (vnni) return panel_vnni::run<T>(rows, M, Mp, B, C, b0 * width, std::min(N, b1 * width), K);
    panel_avx2::run<T>(rows, M, Mp, B, C, b0 * width, std::min(N, b1 * width), K);
  };
  const std::int64_t panels = (N + width - 1) / width;
  if (threads == Threads::caller) return run(0, panels);
  moekit::detail::parallel_for(panels, 1, run);
}
#endif

}  // namespace

bool detail::ggml_dequant_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst,
                               Int8Path path) {
#if MOEKIT_X86
  if (path == Int8Path::best || path == Int8Path::amx) path = cpu_paths().int8;
  if (path == Int8Path::portable || !int8_path_supported(path)) return false;
  const bool wide = path == Int8Path::avx512vnni;  // AVX-512: 16 weights per step (the same bits)
  return with_ggml_type(B.format.element, [&](auto type) {
    using T = decltype(type);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (wide) {
        panel_vnni::dequant<T>(row_bytes(B, n0 + r), K / T::kBlock, dst + r * K);
      } else {
        panel_avx2::dequant<T>(row_bytes(B, n0 + r), K / T::kBlock, dst + r * K);
      }
    }
  });
#else
  (void)B, (void)n0, (void)rows, (void)K, (void)dst, (void)path;
  return false;
#endif
}

void detail::gemm_nt_int8_many(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                               std::int64_t N, std::int64_t K, Threads threads, Int8Path path) {
  if (M <= 0 || N <= 0) return;
#if MOEKIT_X86
  if (path == Int8Path::best) path = cpu_paths().int8;
  const bool vnni = path == Int8Path::avx512vnni;
  if (with_ggml_type(B.format.element, [&](auto type) { ggml_panels(type, A, B, C, M, N, K, threads, vnni); })) return;
  thread_local AmxQuantA aq;
  quantize_amx(A, M, K, B.format.block_cols, B.format.bits, aq);
  amx8_split(aq, B, C, N, threads);
#else
  (void)A, (void)B, (void)C, (void)K, (void)threads, (void)path;
#endif
}

ReuseQuantizedRows::ReuseQuantizedRows() noexcept {
#if MOEKIT_X86
  if (reuse_depth++ == 0) ++reuse_epoch;
#endif
}

ReuseQuantizedRows::~ReuseQuantizedRows() {
#if MOEKIT_X86
  --reuse_depth;
#endif
}

void detail::gemm_nt_affine_int8_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                        std::int64_t N, std::int64_t K, Int8Path path) {
  if (M <= 0 || N <= 0) return;
  QuantA& qa = thread_quant_a();
  if (with_ggml_int8_type(B.format.element, [&](auto type) { ggml_int8(type, A, B, C, M, N, K, path, qa); })) return;
#if MOEKIT_X86
  if (path == Int8Path::amx) return gemm_nt_int8_many(A, B, C, M, N, K, Threads::caller);
  if (path == Int8Path::best) path = cpu_paths().int8;
  const Codes codes = codes_of(B.format);
  quantize_a(A, M, K, B.format.block_cols, B.format.bits, path == Int8Path::avx512vnni, path != Int8Path::portable, qa);
  // 4-bit codes take the x86 kernels with K a multiple of 64 (QuantA::pair64, every MoE shape
  // moekit knows), else the portable one.
  if (codes != Codes::affine8 && !qa.pair64) path = Int8Path::portable;
  if (path == Int8Path::avx512vnni) {
    if (codes == Codes::signed4) return kernel_vnni<Codes::signed4>(qa, B, C, M, N);
    if (codes == Codes::affine4) return kernel_vnni<Codes::affine4>(qa, B, C, M, N);
    return kernel_vnni<Codes::affine8>(qa, B, C, M, N);
  }
  if (path == Int8Path::avx2) {
    if (codes == Codes::signed4) return kernel_avx2<Codes::signed4>(qa, B, C, M, N);
    if (codes == Codes::affine4) return kernel_avx2<Codes::affine4>(qa, B, C, M, N);
    return kernel_avx2<Codes::affine8>(qa, B, C, M, N);
  }
#else
  quantize_a(A, M, K, B.format.block_cols, B.format.bits, false, false, qa);
#endif
  kernel_scalar(qa, B, C, M, N);
}

}  // namespace moekit::kernels
