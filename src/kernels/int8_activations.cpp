// The int8 fast mode's activations: A's rows quantized to int8 per group of inputs (QuantA), in
// portable C++ and with AVX2 (the same codes, scales and sums, bit for bit), and the orders the
// x86 row kernels read them in. docs/numerics.md states the quantization and its error bound.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/int8_common.hpp"

namespace moekit::kernels::int8 {

namespace {

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
#endif

}  // namespace

// A's M rows quantized for B's groups of gs inputs, a scale per `span` inputs (0: per group;
// quantize_row). bytes8: 8-bit codes take int8 activations too (the VNNI kernel), in natural
// order; 4-bit codes in QuantA's nibble order. vector: the AVX2 steps (the same results; the
// caller checked the CPU).
void quantize_a(const RowSource& A, std::int64_t M, std::int64_t K, int gs, int bits, bool bytes8, bool vector,
                QuantA& qa, int span) {
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

// This thread's quantized activations, reused across calls. Returned by reference from a function
// GCC may not inline: inlined, it would specialise the kernels on the thread_local's address and
// re-derive it at every access, which under -fPIC (the README's build: the Python module links
// the library) costs the decode kernels 10-12 % (docs/performance.md).
[[gnu::noinline]] QuantA& thread_quant_a() {
  thread_local QuantA qa;
  return qa;
}

// QuantA::qsum16 from its int8 codes (natural order): each row's sums of 16 codes.
void sums16(QuantA& qa) {
  qa.qsum16.resize(static_cast<std::size_t>(qa.M * qa.K / 16));
  for (std::int64_t i = 0; i < qa.M * qa.K / 16; ++i) {
    int sum = 0;
    for (int k = 0; k < 16; ++k) sum += qa.q8[static_cast<std::size_t>(16 * i + k)];
    qa.qsum16[static_cast<std::size_t>(i)] = static_cast<std::int16_t>(sum);  // |sum| ≤ 16 · 127
  }
}

#if MOEKIT_X86
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

// A's codes for the VNNI row kernel's q4_K and q5_K (ggml_int8_k-inl.h's chunk_k45): per 128
// inputs (four sub-blocks of 32) sub-blocks 0, 2, 1, 3 — the low nibbles of 64 bytes, then the high ones.
void k4_order(QuantA& qa) { evens_then_odds(qa, 0, qa.K, 128, 32); }
#endif

}  // namespace moekit::kernels::int8
