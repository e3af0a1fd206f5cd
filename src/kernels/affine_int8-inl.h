// The x86 tiles of the int8 fast mode (gemm_affine_int8.cpp), included once per instruction
// set: AVX2 (`vpmaddubsw` + `vpmaddwd`; 8-bit codes widened to int16 and `vpmaddwd`) and
// AVX512-VNNI on 256-bit vectors (`vpdpbusd`: four u8 × int8 products into each int32 lane in
// one instruction, 4- and 8-bit codes alike). The integer sums are exact either way and the
// float part is the same code; for 4-bit codes every int32 lane sums the same four products
// (bytes 4l..4l+3), so the two give the same bits (tested). For 8-bit codes AVX2's lane l holds
// codes {2l, 2l+1, 16+2l, 17+2l} of a 32-block and VNNI's {4l..4l+3}: the same total, other f32
// roundings per lane (they agree to f32 rounding, tested).
// Signed 4-bit codes (Codes::signed4: e2m1 and int4 through a 16-entry table of small integers)
// go in as |w| (u8) times the activation with w's sign (`vpsignb`), ggml's way of feeding a
// signed operand to the u8 × int8 instructions.
//   MOEKIT_I8_ATTR  the functions' target attribute
//   MOEKIT_I8_NAME  name decoration of this instruction set's functions
//   MOEKIT_I8_VNNI  1: vpdpbusd (8-bit activations as int8 for 8-bit codes too)
// No include guard: included twice on purpose.

// The 8 lanes of v summed pairwise in a fixed order.
MOEKIT_I8_ATTR inline float MOEKIT_I8_NAME(reduce8)(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(load256)(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// isum plus, in each int32 lane, the four products of its bytes: u (u8) times a (int8). VNNI:
// `vpdpbusd`; AVX2: `vpmaddubsw` + `vpmaddwd`, whose int16 pair sums are exact only for small u
// (4-bit codes, |w| ≤ 12), the only ones it is given.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(dot4)(__m256i isum, __m256i u, __m256i a) {
#if MOEKIT_I8_VNNI
  return _mm256_dpbusd_epi32(isum, u, a);
#else
  return _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)));
#endif
}

// A 32-block's 4-bit codes from its 16 bytes: the low nibbles (even elements), then the high ones
// (odd elements), as u8.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(nibbles32)(const std::uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

// A 64-chunk's 4-bit codes from its 32 bytes (QuantA::pair64): lo the low nibbles (even
// elements), hi the high ones (odd elements).
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(nibbles64)(const std::uint8_t* p, __m256i& lo, __m256i& hi) {
  const __m256i v = MOEKIT_I8_NAME(load256)(p), low4 = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(v, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
}

// MR rows of A against NR rows of B (MR · NR int32 accumulators of 8 lanes per group; a row's
// unpacked codes serve all MR rows of A), then per group one multiply-add each into f32
// accumulators; reduced at the end in a fixed order. `ws` points at the tile's first row's scales
// widened to f32 (widen_scales for `ws_rows` rows: row j's scales at ws + j · groups, its biases
// ws_rows · groups further). The loops over the tile are unrolled so its accumulators stay in
// registers. A tile of one row (decode) reads its row in address order and leaves the fetching
// to the hardware prefetcher, which follows one stream well; wider tiles prefetch (below).
template <Codes kCodes, int MR, int NR>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(tile)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t m,
                                         std::int64_t n, const float* ws, int ws_rows) {
  constexpr int kBits = kCodes == Codes::affine8 ? 8 : 4;
  const int gs = B.format.block_cols;
  const std::uint8_t* rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = row_bytes(B, n + j);
  // The next tile's rows, prefetched one block at a time as this tile walks its own: each row
  // is only K·bits/8 bytes, too short a stream for the hardware prefetcher to ramp up, so
  // without this a decode step waits on DRAM latency row after row.
  const std::int64_t row_stride = B.ld * 4, ahead = NR * row_stride;
  __m256 acc[MR][NR];
  float bacc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      acc[i][j] = _mm256_setzero_ps();
      bacc[i][j] = 0.0f;
    }
  for (std::int64_t g = 0; g < qa.groups; ++g) {
    __m256i isum[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) isum[i][j] = _mm256_setzero_si256();
    for (std::int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
      if (NR > 1 && (MR == 1 || m == 0))  // the first strip of A's rows fetches for the others
        for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(rows[j] + ahead + k * kBits / 8), _MM_HINT_T0);
      if constexpr (kBits == 4) {
        if (qa.pair64) {  // 64 codes from 32 bytes: low nibbles (even elements), then high (odd)
          if (k % 64 != 0) continue;
          __m256i lo_a[MR], hi_a[MR];
          for (int i = 0; i < MR; ++i) {
            lo_a[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.q8.data() + (m + i) * qa.K + k));
            hi_a[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.q8.data() + (m + i) * qa.K + k + 32));
          }
          for (int j = 0; j < NR; ++j) {
            __m256i lo, hi;
            MOEKIT_I8_NAME(nibbles64)(rows[j] + k / 2, lo, hi);
            for (int i = 0; i < MR; ++i)
              isum[i][j] = MOEKIT_I8_NAME(dot4)(MOEKIT_I8_NAME(dot4)(isum[i][j], lo, lo_a[i]), hi, hi_a[i]);
          }
          continue;
        }
        __m256i a[MR];
        for (int i = 0; i < MR; ++i)
          a[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.q8.data() + (m + i) * qa.K + k));
        for (int j = 0; j < NR; ++j) {
          const __m256i c = MOEKIT_I8_NAME(nibbles32)(rows[j] + k / 2);
          for (int i = 0; i < MR; ++i) isum[i][j] = MOEKIT_I8_NAME(dot4)(isum[i][j], c, a[i]);
        }
      } else {
#if MOEKIT_I8_VNNI
        // u8 codes × int8 activations, four products per int32 lane: no int16 intermediate.
        __m256i a[MR];
        for (int i = 0; i < MR; ++i)
          a[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.q8.data() + (m + i) * qa.K + k));
        for (int j = 0; j < NR; ++j) {
          const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + k));
          for (int i = 0; i < MR; ++i) isum[i][j] = MOEKIT_I8_NAME(dot4)(isum[i][j], c, a[i]);
        }
#else
        for (int j = 0; j < NR; ++j) {
          const __m256i c0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + k)));
          const __m256i c1 =
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + k + 16)));
          for (int i = 0; i < MR; ++i) {
            const std::int16_t* q = qa.q16.data() + (m + i) * qa.K + k;
            const __m256i p0 = _mm256_madd_epi16(c0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
            const __m256i p1 = _mm256_madd_epi16(c1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
            isum[i][j] = _mm256_add_epi32(isum[i][j], _mm256_add_epi32(p0, p1));
          }
        }
#endif
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const float s = ws[j * qa.groups + g], b = ws[(ws_rows + j) * qa.groups + g];
#pragma GCC unroll 2
      for (int i = 0; i < MR; ++i) {
        const std::size_t gi = static_cast<std::size_t>((m + i) * qa.groups + g);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][j]), _mm256_set1_ps(s * qa.d[gi]), acc[i][j]);
        bacc[i][j] = std::fma(b, qa.xsum[gi], bacc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      store(C, m + i, n + j, MOEKIT_I8_NAME(reduce8)(acc[i][j]) + bacc[i][j]);
    }
}

// The same for signed 4-bit codes (e2m1, int4): the nibbles' integers w from a 16-entry table
// (`vpshufb`), multiplied as |w| (u8) times the activation with w's sign (`vpsignb`); no bias.
// `ws` holds the NR rows' scales widened to f32 and multiplied by the codes' factor
// (ws[j · groups + g]); prefetching as tile(). A span is a group, or for groups of 16 (NVFP4) a 32-block holding two:
// its int32 lanes {0, 1, 4, 5} hold the first group's products and {2, 3, 6, 7} the second's (the
// nibble order), so the span's multiply-add takes a scale per lane.
template <int MR, int NR>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(signed_tile)(const QuantA& qa, const WeightMatrix& B, const Output& C,
                                                std::int64_t m, std::int64_t n, const float* ws) {
  const int gs = B.format.block_cols, gstep = gs == 16 ? 2 : 1, span = gs * gstep;
  const std::int64_t row_stride = row_stride_bytes(B), ahead = NR * row_stride;  // prefetch: as tile()
  const std::uint8_t* rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = row_bytes(B, n + j);
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(signed_codes(B.format).table)));
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (std::int64_t g = 0; g < qa.groups; g += gstep) {
    __m256i isum[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) isum[i][j] = _mm256_setzero_si256();
    for (std::int64_t k = g * gs; k < g * gs + span; k += 32) {
      if (NR > 1 && (MR == 1 || m == 0))
        for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(rows[j] + ahead + k / 2), _MM_HINT_T0);
      __m256i a[MR];
      for (int i = 0; i < MR; ++i)
        a[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.q8.data() + (m + i) * qa.K + k));
      for (int j = 0; j < NR; ++j) {
        const __m256i w = _mm256_shuffle_epi8(table, MOEKIT_I8_NAME(nibbles32)(rows[j] + k / 2));  // |w| <= 12
        const __m256i u = _mm256_abs_epi8(w);
        for (int i = 0; i < MR; ++i) isum[i][j] = MOEKIT_I8_NAME(dot4)(isum[i][j], u, _mm256_sign_epi8(a[i], w));
      }
    }
    for (int j = 0; j < NR; ++j)
      for (int i = 0; i < MR; ++i) {
        const float* d = qa.d.data() + (m + i) * qa.groups + g;
        const float a0 = ws[j * qa.groups + g] * d[0];
        const float a1 = gstep == 2 ? ws[j * qa.groups + g + 1] * d[1] : a0;
        acc[i][j] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][j]), _mm256_setr_ps(a0, a0, a1, a1, a0, a0, a1, a1), acc[i][j]);
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) store(C, m + i, n + j, MOEKIT_I8_NAME(reduce8)(acc[i][j]));
}

// Every row of A over NR rows of B at a time (their codes stay in L1 across the strips of A):
// strips of 2 rows of A (NR = 2) and then of 1, each unpacking the codes once for its rows;
// the scales (and biases) widened once for all the strips.
// AVX2 has 16 vector registers: MR · NR int32 and as many f32 accumulators must leave room for
// the activations, the codes and two constants, so tiles are 2 × 2 (and 1 × 2 for an odd last
// row); a single row of A takes single_row() below.
template <Codes kCodes, int NR>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(columns)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                                            std::int64_t n) {
  const float* ws = widen_scales(B, n, NR, qa.groups);
  std::int64_t m = 0;
  if constexpr (NR == 2)
    for (; m + 2 <= M; m += 2) {
      if constexpr (kCodes == Codes::signed4) {
        MOEKIT_I8_NAME(signed_tile)<2, 2>(qa, B, C, m, n, ws);
      } else {
        MOEKIT_I8_NAME(tile)<kCodes, 2, 2>(qa, B, C, m, n, ws, NR);
      }
    }
  for (; m < M; ++m) {
    if constexpr (kCodes == Codes::signed4) {
      MOEKIT_I8_NAME(signed_tile)<1, NR>(qa, B, C, m, n, ws);
    } else {
      MOEKIT_I8_NAME(tile)<kCodes, 1, NR>(qa, B, C, m, n, ws, NR);
    }
  }
}

// MR (1 or 2) rows of A against one row of B holding affine codes in groups of 64 — 4-bit in
// the pair64 order (32 code bytes: low nibbles, then high) or 8-bit (64 code bytes): a decode
// step's inner loop, straight-line per group — the codes loaded once for the MR rows, the dot
// products, one multiply-add and the bias term. `s` and `b` are B's row's widened scales and
// biases. The same float steps as tile(), and each int32 lane sums the same products: the same
// bits.
template <Codes kCodes, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(row_g64)(const QuantA& qa, std::int64_t m, const std::uint8_t* row,
                                                   const float* s, const float* b, float* out) {
  constexpr bool k4 = kCodes == Codes::affine4;
  __m256 acc[MR];
  float bacc[MR];
  for (int i = 0; i < MR; ++i) {
    acc[i] = _mm256_setzero_ps();
    bacc[i] = 0.0f;
  }
  for (std::int64_t g = 0; g < qa.groups; ++g) {
    __m256i isum[MR];
    if constexpr (k4) {
      __m256i lo, hi;
      MOEKIT_I8_NAME(nibbles64)(row + g * 32, lo, hi);
      for (int i = 0; i < MR; ++i) {
        const std::int8_t* a = qa.q8.data() + (m + i) * qa.K + g * 64;
        isum[i] = MOEKIT_I8_NAME(dot4)(MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), lo, MOEKIT_I8_NAME(load256)(a)), hi,
                                       MOEKIT_I8_NAME(load256)(a + 32));
      }
    } else {
#if MOEKIT_I8_VNNI
      const __m256i c0 = MOEKIT_I8_NAME(load256)(row + g * 64), c1 = MOEKIT_I8_NAME(load256)(row + g * 64 + 32);
      for (int i = 0; i < MR; ++i) {
        const std::int8_t* a = qa.q8.data() + (m + i) * qa.K + g * 64;
        isum[i] = MOEKIT_I8_NAME(dot4)(MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), c0, MOEKIT_I8_NAME(load256)(a)), c1,
                                       MOEKIT_I8_NAME(load256)(a + 32));
      }
#else
      __m256i c[4];
      for (int h = 0; h < 4; ++h)
        c[h] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 64 + 16 * h)));
      for (int i = 0; i < MR; ++i) {
        const std::int16_t* q = qa.q16.data() + (m + i) * qa.K + g * 64;
        const __m256i first = _mm256_add_epi32(_mm256_madd_epi16(c[0], MOEKIT_I8_NAME(load256)(q)),
                                               _mm256_madd_epi16(c[1], MOEKIT_I8_NAME(load256)(q + 16)));
        isum[i] = _mm256_add_epi32(first, _mm256_add_epi32(_mm256_madd_epi16(c[2], MOEKIT_I8_NAME(load256)(q + 32)),
                                                           _mm256_madd_epi16(c[3], MOEKIT_I8_NAME(load256)(q + 48))));
      }
#endif
    }
    for (int i = 0; i < MR; ++i) {
      const std::int64_t gi = (m + i) * qa.groups + g;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(s[g] * qa.d[gi]), acc[i]);
      bacc[i] = std::fma(b[g], qa.xsum[gi], bacc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) out[i] = MOEKIT_I8_NAME(reduce8)(acc[i]) + bacc[i];
}

// Every row of A (at most kInt8MaxRows) against B's affine rows in groups of 64: B's rows one at
// a time, in address order (the hardware prefetcher follows that one stream), their scales widened
// 8 rows at a time; A's rows two at a time against each (the row's codes from L1 for the second
// pair).
template <Codes kCodes>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(rows_g64)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                                             std::int64_t N) {
  constexpr int kRows = 8;
  for (std::int64_t n = 0; n < N; n += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, N - n));
    const float* ws = widen_scales(B, n, rows, qa.groups);
    for (int j = 0; j < rows; ++j) {
      const std::uint8_t* row = row_bytes(B, n + j);
      const float *s = ws + j * qa.groups, *b = ws + (rows + j) * qa.groups;
      float out[2];
      std::int64_t m = 0;
      for (; m + 2 <= M; m += 2) {
        MOEKIT_I8_NAME(row_g64)<kCodes, 2>(qa, m, row, s, b, out);
        store(C, m, n + j, out[0]);
        store(C, m + 1, n + j, out[1]);
      }
      if (m < M) {
        MOEKIT_I8_NAME(row_g64)<kCodes, 1>(qa, m, row, s, b, out);
        store(C, m, n + j, out[0]);
      }
    }
  }
}

// Whether rows_g64 takes B: affine codes in groups of exactly 64 (MLX's default), 4-bit ones in
// the pair64 order.
inline bool MOEKIT_I8_NAME(takes_g64)(Codes codes, const QuantA& qa) {
  if (qa.K != qa.groups * 64) return false;
  if (codes == Codes::affine4) return qa.pair64;
  return codes == Codes::affine8 && (MOEKIT_I8_VNNI ? qa.bytes8 : !qa.bytes8);
}

// One row of A (decode): B's rows one at a time, in address order, their scales widened 8 rows
// at a time. The same per-element arithmetic as the wider tiles (the same bits).
template <Codes kCodes>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(single_row)(const QuantA& qa, const WeightMatrix& B, const Output& C,
                                               std::int64_t n0, std::int64_t n1) {
  constexpr int kRows = 8;
  for (std::int64_t n = n0; n < n1; n += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, n1 - n));
    const float* ws = widen_scales(B, n, rows, qa.groups);
    for (int j = 0; j < rows; ++j) {
      if constexpr (kCodes == Codes::signed4) {
        MOEKIT_I8_NAME(signed_tile)<1, 1>(qa, B, C, 0, n + j, ws + j * qa.groups);
      } else {
        MOEKIT_I8_NAME(tile)<kCodes, 1, 1>(qa, B, C, 0, n + j, ws + j * qa.groups, rows);
      }
    }
  }
}

template <Codes kCodes>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(kernel)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                                           std::int64_t N) {
  if (MOEKIT_I8_NAME(takes_g64)(kCodes, qa)) return MOEKIT_I8_NAME(rows_g64)<kCodes>(qa, B, C, M, N);
  std::int64_t n = 0;
  if (M == 1) {
    // Signed codes in groups of 32 or fewer take a multiply-add per 32-block into each row's
    // accumulator: a row alone would wait on that chain's latency, so they go 4 rows at a time.
    if (kCodes != Codes::signed4 || qa.K / qa.groups >= 64) return MOEKIT_I8_NAME(single_row)<kCodes>(qa, B, C, 0, N);
    for (; n + 4 <= N; n += 4) MOEKIT_I8_NAME(columns)<kCodes, 4>(qa, B, C, M, n);
  } else {
    for (; n + 2 <= N; n += 2) MOEKIT_I8_NAME(columns)<kCodes, 2>(qa, B, C, M, n);
  }
  kernel_scalar(qa, B, C, M, N, n);  // the last N % tile-width columns
}
