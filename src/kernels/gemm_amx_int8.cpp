// The int8 fast mode on AMX-INT8 (kernels/plan.hpp's int8_amx): MLX affine 4- and 8-bit codes,
// many rows of A (prefill), group sizes a multiple of 64.
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
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/amx.hpp"
#include "kernels/int8_common.hpp"

namespace moekit::kernels::int8 {

namespace {

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
          const __m512 r = _mm512_min_ps(
              lim, _mm512_max_ps(neg, _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(v + c + k), inv),
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
      _mm256_store_si256(reinterpret_cast<__m256i*>(tile + r * 64 + 32),
                         _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    } else {
      _mm512_store_si512(tile + r * 64, _mm512_loadu_si512(src));
    }
  }
}

// Loads chunk c of weight tile `w` into tile register T: 8-bit whole tiles in place, else staged.
#define MOEKIT_LOAD_CODES(T, w, c, staging)          \
  do {                                               \
    if (kBits == 8 && (w).rows == 16) {              \
      _tile_loadd(T, (w).base + (c)*64, (w).stride); \
    } else {                                         \
      unpack_chunk<kBits>((w), (c), (staging));      \
      _tile_loadd(T, (staging), 64);                 \
    }                                                \
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
        for (std::int64_t l = 0; l < rows_m; ++l)
          store(C, m0 + l, n0 + 16 * t + r, acc[i][r * 16 + l] + bacc[i][r * 16 + l]);
    }
}

#undef MOEKIT_LOAD_CODES

// Panels [q0, q1) × column pairs [c0, c1) of C on this thread.
template <int kBits>
MOEKIT_AMX8 void amx8_run(const AmxQuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t N, std::int64_t q0,
                          std::int64_t q1, std::int64_t c0, std::int64_t c1) {
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
      if (two_n && two_m)
        amx8_block<kBits, 2, 2>(qa, w, B, C, p, n0, gs);
      else if (two_n)
        amx8_block<kBits, 2, 1>(qa, w, B, C, p, n0, gs);
      else if (two_m)
        amx8_block<kBits, 1, 2>(qa, w, B, C, p, n0, gs);
      else
        amx8_block<kBits, 1, 1>(qa, w, B, C, p, n0, gs);
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

}  // namespace

void amx_int8_gemm(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                   std::int64_t K, Threads threads) {
  if (M <= 0 || N <= 0) return;
#if MOEKIT_X86
  thread_local AmxQuantA aq;
  quantize_amx(A, M, K, B.format.block_cols, B.format.bits, aq);
  amx8_split(aq, B, C, N, threads);
#else
  (void)A, (void)B, (void)C, (void)K, (void)threads;
#endif
}

}  // namespace moekit::kernels::int8
