// The x86 kernels of the int8 fast mode (gemm_affine_int8.cpp), included once per instruction
// set: AVX2 (`vpmaddubsw` + `vpmaddwd`; 8-bit codes widened to int16 and `vpmaddwd`) and
// AVX512-VNNI on 256-bit vectors (`vpdpbusd`: four u8 × int8 products into each int32 lane in
// one instruction, 4- and 8-bit codes alike). Each group's integer sum is exact either way and
// reduced to one int32 before any float step, and the float part is the same code, so the two
// give the same bits for every format (tested).
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

// Eight groups' int32 sums in order, as one vector: `h[p]` = vphaddd of the lane vectors of
// groups 2p and 2p + 1 (each lane a partial sum of its group), p = 0..3. Exact.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(sum_groups8)(const __m256i (&h)[4]) {
  // t0's 128-bit halves: groups 0-3's sums of lanes 0-3 and of lanes 4-7; t1: groups 4-7's.
  const __m256i t0 = _mm256_hadd_epi32(h[0], h[1]), t1 = _mm256_hadd_epi32(h[2], h[3]);
  return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
}

// The same for groups of 16 (NVFP4), two to a 32-block whose lanes {0, 1, 4, 5} hold the first
// group's products and {2, 3, 6, 7} the second's: `h[p]` = vphaddd of blocks 2p and 2p + 1.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(sum_pairs4)(const __m256i (&h)[4]) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(h[0], h[1], 0x20), _mm256_permute2x128_si256(h[0], h[1], 0x31));
}

// The int32 lanes of one unit of B's row — a group, or a 32-block of two groups of 16 — against
// MR rows of A: `codes` the unit's first code byte, a[i] (int8) or q[i] (int16: 8-bit codes on
// AVX2) row i's activations at the unit's first input. kUnit: the unit's inputs, known at compile
// time (32, 64, 128, 256), or 0: `unit` of them, a counted loop. 4-bit affine codes in units of a
// multiple of 64 are in the pair64 order (quantize_a). The codes are loaded and unpacked once for
// the MR rows.
template <Codes kCodes, int kUnit, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(unit_dot)(const std::uint8_t* codes, const std::int8_t* const (&a)[MR],
                                                    const std::int16_t* const (&q)[MR], int unit, __m256i table,
                                                    __m256i (&isum)[MR]) {
  for (int i = 0; i < MR; ++i) isum[i] = _mm256_setzero_si256();
  const int n = kUnit > 0 ? kUnit : unit;
  const bool pair64 = kCodes == Codes::affine4 && n % 64 == 0;
  const int step = pair64 ? 64 : 32;
#pragma GCC unroll 8
  for (int k = 0; k < n; k += step) {
    if constexpr (kCodes == Codes::affine4) {
      if (pair64) {
        __m256i lo, hi;
        MOEKIT_I8_NAME(nibbles64)(codes + k / 2, lo, hi);
        for (int i = 0; i < MR; ++i)
          isum[i] = MOEKIT_I8_NAME(dot4)(MOEKIT_I8_NAME(dot4)(isum[i], lo, MOEKIT_I8_NAME(load256)(a[i] + k)), hi,
                                         MOEKIT_I8_NAME(load256)(a[i] + k + 32));
      } else {
        const __m256i c = MOEKIT_I8_NAME(nibbles32)(codes + k / 2);
        for (int i = 0; i < MR; ++i) isum[i] = MOEKIT_I8_NAME(dot4)(isum[i], c, MOEKIT_I8_NAME(load256)(a[i] + k));
      }
    } else if constexpr (kCodes == Codes::affine8) {
#if MOEKIT_I8_VNNI
      (void)q;
      const __m256i c = MOEKIT_I8_NAME(load256)(codes + k);
      for (int i = 0; i < MR; ++i) isum[i] = MOEKIT_I8_NAME(dot4)(isum[i], c, MOEKIT_I8_NAME(load256)(a[i] + k));
#else
      // u8 codes widened to int16 times int16 activations (vpmaddubsw's int16 pair sums would
      // overflow for codes up to 255).
      (void)a;
      const __m256i c0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)));
      const __m256i c1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k + 16)));
      for (int i = 0; i < MR; ++i)
        isum[i] =
            _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(c0, MOEKIT_I8_NAME(load256)(q[i] + k)),
                                                       _mm256_madd_epi16(c1, MOEKIT_I8_NAME(load256)(q[i] + k + 16))));
#endif
    } else {
      // Signed codes: |w| (u8) times the activation with w's sign; |w| <= 12.
      const __m256i w = _mm256_shuffle_epi8(table, MOEKIT_I8_NAME(nibbles32)(codes + k / 2));
      const __m256i u = _mm256_abs_epi8(w);
      for (int i = 0; i < MR; ++i)
        isum[i] = MOEKIT_I8_NAME(dot4)(isum[i], u, _mm256_sign_epi8(MOEKIT_I8_NAME(load256)(a[i] + k), w));
    }
  }
}

// unit_dot of unit u of B's row (`row`; a[i], q[i]: the rows of A from input 0), or zero lanes
// past the last of `units`.
template <Codes kCodes, int kUnit, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(unit_at)(const std::uint8_t* row, const std::int8_t* const (&a)[MR],
                                                   const std::int16_t* const (&q)[MR], std::int64_t u,
                                                   std::int64_t units, int unit, __m256i table, __m256i (&isum)[MR]) {
  if (u >= units) {
    for (int i = 0; i < MR; ++i) isum[i] = _mm256_setzero_si256();
    return;
  }
  constexpr int kBits = kCodes == Codes::affine8 ? 8 : 4;
  const std::int64_t n = kUnit > 0 ? kUnit : unit;
  const std::int8_t* au[MR];
  const std::int16_t* qu[MR];
  for (int i = 0; i < MR; ++i) {
    au[i] = a[i] + u * n;
    qu[i] = q[i] + u * n;
  }
  MOEKIT_I8_NAME(unit_dot)<kCodes, kUnit, MR>(row + u * n * kBits / 8, au, qu, unit, table, isum);
}

// MR (1 or 2) rows of A from row m against one row of B (`row`: its codes; `s`, `b`: its scales
// and, for affine codes, biases widened by widen_scales): out[i] = Σ_g s_g · d[m+i,g] · Σ_k q·code
// + Σ_g b_g · d·Σq. Eight groups at a time: their int32 lane vectors summed into one vector of
// eight exact group sums (sum_groups8), converted, and one multiply-add by the eight s_g · d_g
// (the bias term likewise); the eight f32 lanes summed at the end in a fixed order. Past the last
// group the lanes are zero (no codes read; zero scales and d: the pad of QuantA and widen_scales).
// kPairs: groups of 16, two to a 32-input unit (NVFP4). The same steps on AVX2 and VNNI: the same
// bits for every format.
template <Codes kCodes, int kUnit, bool kPairs, int MR>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(row_dot)(const QuantA& qa, std::int64_t m, const std::uint8_t* row, int unit,
                                            const float* s, const float* b, __m256i table, float* out) {
  constexpr bool kAffine = kCodes != Codes::signed4;
  constexpr int kPer8 = kPairs ? 4 : 8;  // units per eight groups
  const std::int64_t units = qa.K / unit;
  const std::int8_t* a[MR];
  const std::int16_t* q[MR];
  for (int i = 0; i < MR; ++i) {
    a[i] = qa.q8.data() + (m + i) * qa.K;
    q[i] = qa.q16.data() + (m + i) * qa.K;
  }
  __m256 acc[MR], bacc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = bacc[i] = _mm256_setzero_ps();
  for (std::int64_t g = 0, u0 = 0; g < qa.groups; g += 8, u0 += kPer8) {
    __m256i h[MR][4];
#pragma GCC unroll 4
    for (int p = 0; p < kPer8 / 2; ++p) {
      __m256i x[MR], y[MR];
      MOEKIT_I8_NAME(unit_at)<kCodes, kUnit, MR>(row, a, q, u0 + 2 * p, units, unit, table, x);
      MOEKIT_I8_NAME(unit_at)<kCodes, kUnit, MR>(row, a, q, u0 + 2 * p + 1, units, unit, table, y);
      for (int i = 0; i < MR; ++i) h[i][p] = _mm256_hadd_epi32(x[i], y[i]);
    }
    const __m256 sv = _mm256_loadu_ps(s + g);
    for (int i = 0; i < MR; ++i) {
      __m256i sums;
      if constexpr (kPairs) {
        sums = MOEKIT_I8_NAME(sum_pairs4)(h[i]);
      } else {
        sums = MOEKIT_I8_NAME(sum_groups8)(h[i]);
      }
      const float* d = qa.d.data() + (m + i) * qa.gstride + g;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sv, _mm256_loadu_ps(d)), acc[i]);
      if constexpr (kAffine) {
        const float* xs = qa.xsum.data() + (m + i) * qa.gstride + g;
        bacc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(b + g), _mm256_loadu_ps(xs), bacc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) out[i] = MOEKIT_I8_NAME(reduce8)(_mm256_add_ps(acc[i], bacc[i]));
}

// Every row of A (at most kInt8MaxRows) against B's rows [0, N): B's rows one at a time, in
// address order (the hardware prefetcher follows that one stream), their scales widened 8 rows at
// a time; A's rows two at a time against each (the row's codes from L1 for the next pair).
template <Codes kCodes, int kUnit, bool kPairs>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(rows)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                                         std::int64_t N) {
  constexpr int kRows = 8;
  const int unit = std::max(B.format.block_cols, 32);
  const __m256i table =
      kCodes == Codes::signed4
          ? _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(signed_codes(B.format).table)))
          : _mm256_setzero_si256();
  for (std::int64_t n = 0; n < N; n += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, N - n));
    const float* ws = widen_scales(B, n, rows, qa.groups, qa.gstride);
    for (int j = 0; j < rows; ++j) {
      const std::uint8_t* row = row_bytes(B, n + j);
      const float *s = ws + j * qa.gstride, *b = ws + (rows + j) * qa.gstride;
      float out[2];
      std::int64_t m = 0;
      for (; m + 2 <= M; m += 2) {
        MOEKIT_I8_NAME(row_dot)<kCodes, kUnit, kPairs, 2>(qa, m, row, unit, s, b, table, out);
        store(C, m, n + j, out[0]);
        store(C, m + 1, n + j, out[1]);
      }
      if (m < M) {
        MOEKIT_I8_NAME(row_dot)<kCodes, kUnit, kPairs, 1>(qa, m, row, unit, s, b, table, out);
        store(C, m, n + j, out[0]);
      }
    }
  }
}

// rows() with the unit's size fixed at compile time where it is 32, 64, 128 or 256 (every group
// size MLX, MXFP4, NVFP4 and int4 checkpoints use), else counted.
template <Codes kCodes>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(kernel)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                                           std::int64_t N) {
  switch (B.format.block_cols) {
    case 16:
      if constexpr (kCodes == Codes::signed4) return MOEKIT_I8_NAME(rows)<kCodes, 32, true>(qa, B, C, M, N);
      break;
    case 32:
      return MOEKIT_I8_NAME(rows)<kCodes, 32, false>(qa, B, C, M, N);
    case 64:
      return MOEKIT_I8_NAME(rows)<kCodes, 64, false>(qa, B, C, M, N);
    case 128:
      return MOEKIT_I8_NAME(rows)<kCodes, 128, false>(qa, B, C, M, N);
    case 256:
      return MOEKIT_I8_NAME(rows)<kCodes, 256, false>(qa, B, C, M, N);
    default:
      break;
  }
  MOEKIT_I8_NAME(rows)<kCodes, 0, false>(qa, B, C, M, N);
}
