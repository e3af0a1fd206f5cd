// The x86 row kernels of the int8 fast mode on MLX affine, e2m1 and int4 codes (int8_rows.cpp),
// included after int8_codes-inl.h once per instruction set: AVX2 (`vpmaddubsw` + `vpmaddwd`; 8-bit codes widened to
// int16 and `vpmaddwd`) and AVX512-VNNI on 256-bit vectors (`vpdpbusd`: four u8 × int8 products into each int32 lane in
// one instruction, 4- and 8-bit codes alike). Each group's integer sum is exact either way and
// reduced to one int32 before any float step, and the float part is the same code, so the two
// give the same bits for every format (tested).
// Signed 4-bit codes (Codes::signed4: e2m1 and int4 through a 16-entry table of small integers
// w) go in as w + c, a u8, and each group's sum loses c · Σq (the activations' integer sum).
//   MOEKIT_I8_ATTR  the functions' target attribute
//   MOEKIT_I8_VNNI  1: vpdpbusd (8-bit activations as int8 for 8-bit codes too)
// No include guard: included twice on purpose.

// A 64-chunk's 4-bit codes from its 32 bytes (QuantA::pair64): lo the low nibbles (even
// elements), hi the high ones (odd elements).
MOEKIT_I8_ATTR inline void nibbles64(const std::uint8_t* p, __m256i& lo, __m256i& hi) {
  const __m256i v = load256(p), low4 = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(v, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
}

// The int32 lanes of one unit of B's row against MR rows of A: `codes` the unit's first code
// byte, a[i] (int8) or q[i] (int16: 8-bit codes on AVX2) row i's activations at the unit's first
// input; kUnit inputs (0: `unit` of them, a counted loop). 4-bit codes go 64 at a time (QuantA's
// pair64 order: 32 bytes, low nibbles then high); signed ones through `table`, which gives each
// nibble's integer plus the codes' offset (a u8). The codes are unpacked once for the MR rows.
template <Codes kCodes, int kUnit, int MR>
MOEKIT_I8_ATTR inline void unit_dot(const std::uint8_t* codes, const std::int8_t* const (&a)[MR],
                                    const std::int16_t* const (&q)[MR], int unit, __m256i table, __m256i (&isum)[MR]) {
  for (int i = 0; i < MR; ++i) isum[i] = _mm256_setzero_si256();
  const int n = kUnit > 0 ? kUnit : unit;
#pragma GCC unroll 8
  for (int k = 0; k < n; k += kCodes == Codes::affine8 ? 32 : 64) {
    if constexpr (kCodes == Codes::affine8) {
#if MOEKIT_I8_VNNI
      (void)q, (void)table;
      const __m256i c = load256(codes + k);
      for (int i = 0; i < MR; ++i) isum[i] = dot4(isum[i], c, load256(a[i] + k));
#else
      // u8 codes widened to int16 times int16 activations (vpmaddubsw's int16 pair sums would
      // overflow for codes up to 255).
      (void)a, (void)table;
      const __m256i c0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k)));
      const __m256i c1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k + 16)));
      for (int i = 0; i < MR; ++i)
        isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(c0, load256(q[i] + k)),
                                                             _mm256_madd_epi16(c1, load256(q[i] + k + 16))));
#endif
    } else {
      (void)q;
      __m256i lo, hi;
      nibbles64(codes + k / 2, lo, hi);
      if constexpr (kCodes == Codes::signed4) {  // u8 ≤ 24: vpmaddubsw's pair sums fit
        lo = _mm256_shuffle_epi8(table, lo);
        hi = _mm256_shuffle_epi8(table, hi);
      } else {
        (void)table;
      }
      for (int i = 0; i < MR; ++i) isum[i] = dot4(dot4(isum[i], lo, load256(a[i] + k)), hi, load256(a[i] + k + 32));
    }
  }
}

// unit_dot of unit u of B's row (`row`; a[i], q[i]: the rows of A from input 0), or zero lanes
// past the last of `units`.
template <Codes kCodes, int kUnit, int MR>
MOEKIT_I8_ATTR inline void unit_at(const std::uint8_t* row, const std::int8_t* const (&a)[MR],
                                   const std::int16_t* const (&q)[MR], std::int64_t u, std::int64_t units, int unit,
                                   __m256i table, __m256i (&isum)[MR]) {
  if (u >= units) {
    for (int i = 0; i < MR; ++i) isum[i] = _mm256_setzero_si256();
    return;
  }
  constexpr int kBits = kCodes == Codes::affine8 ? 8 : 4;
  const std::int64_t n = kUnit > 0 ? kUnit : unit;
  const std::int8_t* au[MR] = {};
  const std::int16_t* qu[MR] = {};
  // Only the activations in use (int16_activations) are non-empty: offsetting the other's null
  // data() would be undefined behaviour (clang's UBSan reports it).
  for (int i = 0; i < MR; ++i) {
    if constexpr (int16_activations(kCodes, MOEKIT_I8_VNNI)) {
      qu[i] = q[i] + u * n;
    } else {
      au[i] = a[i] + u * n;
    }
  }
  unit_dot<kCodes, kUnit, MR>(row + u * n * kBits / 8, au, qu, unit, table, isum);
}

// MR (1 or 2) rows of A from row m against one row of B (`row`: its codes; `s`, `b`: its scales
// and, for affine codes, biases widened by widen_scales):
//   out[i] = Σ_g s_g · d[m+i,g] · Σ_k q·code + Σ_g b_g · d·Σq   (affine),
//   out[i] = Σ_g s_g · d[m+i,g] · (Σ_k q·(w + c) − c · Σq)       (signed codes w, offset c).
// Eight groups at a time: their units' int32 lanes summed into one vector of eight exact group
// sums (group_sums8), converted, and one multiply-add by the eight s_g · d_g (the bias term
// likewise); the eight f32 lanes summed at the end in a fixed order. Past the last group the
// lanes are zero (no codes read; zero scales, d and Σq: the pad of QuantA and widen_scales).
// kSub groups per unit (group_sums8). The same steps on AVX2 and VNNI: the same bits.
template <Codes kCodes, int kUnit, int kSub, int MR>
MOEKIT_I8_ATTR void row_dot(const QuantA& qa, std::int64_t m, const std::uint8_t* row, int unit, const float* s,
                            const float* b, __m256i table, int offset, float* out) {
  constexpr bool kAffine = kCodes != Codes::signed4;
  constexpr int kUnits = 8 / kSub;  // units per eight groups
  const std::int64_t units = qa.K / unit;
  const std::int8_t* a[MR] = {};
  const std::int16_t* q[MR] = {};
  for (int i = 0; i < MR; ++i) {  // the activations in use only (unit_at)
    if constexpr (int16_activations(kCodes, MOEKIT_I8_VNNI)) {
      q[i] = qa.q16.data() + (m + i) * qa.K;
    } else {
      a[i] = qa.q8.data() + (m + i) * qa.K;
    }
  }
  const __m256i c = _mm256_set1_epi32(offset);
  __m256 acc[MR], bacc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = bacc[i] = _mm256_setzero_ps();
  for (std::int64_t g = 0, u0 = 0; g < qa.groups; g += 8, u0 += kUnits) {
    __m256i h[MR][4];
#pragma GCC unroll 4
    for (int p = 0; p < kUnits / 2; ++p) {
      __m256i x[MR], y[MR];
      unit_at<kCodes, kUnit, MR>(row, a, q, u0 + 2 * p, units, unit, table, x);
      unit_at<kCodes, kUnit, MR>(row, a, q, u0 + 2 * p + 1, units, unit, table, y);
      for (int i = 0; i < MR; ++i) h[i][p] = _mm256_hadd_epi32(x[i], y[i]);
    }
    const __m256 sv = _mm256_loadu_ps(s + g);
    for (int i = 0; i < MR; ++i) {
      __m256i sums = group_sums8<kSub>(h[i]);
      if constexpr (!kAffine) {
        const __m256i qs =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.qsum.data() + (m + i) * qa.gstride + g));
        sums = _mm256_sub_epi32(sums, _mm256_mullo_epi32(qs, c));
      }
      const float* d = qa.d.data() + (m + i) * qa.gstride + g;
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(sv, _mm256_loadu_ps(d)), acc[i]);
      if constexpr (kAffine) {
        const float* xs = qa.xsum.data() + (m + i) * qa.gstride + g;
        bacc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(b + g), _mm256_loadu_ps(xs), bacc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) out[i] = reduce8(_mm256_add_ps(acc[i], bacc[i]));
}

// Every row of A (at most kInt8MaxRows) against B's rows [0, N): B's rows one at a time, in
// address order (the hardware prefetcher follows that one stream), their scales widened 8 rows at
// a time; A's rows two at a time against each (the row's codes from L1 for the next pair).
template <Codes kCodes, int kUnit, int kSub>
MOEKIT_I8_ATTR void rows(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N) {
  constexpr int kRows = 8;
  const int unit = kCodes == Codes::affine8 ? B.format.block_cols : std::max(B.format.block_cols, 64);
  // Signed codes: each nibble's integer w plus the offset c that makes every w + c a u8 (≤ 24).
  alignas(16) std::int8_t shifted[16] = {};
  int offset = 0;
  if constexpr (kCodes == Codes::signed4) {
    const std::int8_t* w = signed_codes(B.format).table;
    offset = -*std::min_element(w, w + 16);
    for (int i = 0; i < 16; ++i) shifted[i] = static_cast<std::int8_t>(w[i] + offset);
  }
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  const std::int64_t scale_bytes = B.scale_ld * static_cast<std::int64_t>(dtype_size(B.format.scale_dtype));
  for (std::int64_t n = 0; n < N; n += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, N - n));
    const float* ws = widen_scales(B, n, rows, qa.groups, qa.gstride);
    // The next rows' scales (and biases), a stream of their own beside the codes', fetched while
    // these rows compute.
    if (n + kRows < N) {
      const std::int64_t ahead = std::min<std::int64_t>(kRows, N - n - kRows) * scale_bytes;
      for (const void* p : {B.scales, kCodes == Codes::signed4 ? nullptr : B.biases}) {
        if (p == nullptr) continue;
        const char* first = static_cast<const char*>(p) + (n + kRows) * scale_bytes;
        for (std::int64_t o = 0; o < ahead; o += 64) _mm_prefetch(first + o, _MM_HINT_T0);
      }
    }
    for (int j = 0; j < rows; ++j) {
      const std::uint8_t* row = row_bytes(B, n + j);
      const float *s = ws + j * qa.gstride, *b = ws + (rows + j) * qa.gstride;
      float out[2];
      std::int64_t m = 0;
      for (; m + 2 <= M; m += 2) {
        row_dot<kCodes, kUnit, kSub, 2>(qa, m, row, unit, s, b, table, offset, out);
        store(C, m, n + j, out[0]);
        store(C, m + 1, n + j, out[1]);
      }
      if (m < M) {
        row_dot<kCodes, kUnit, kSub, 1>(qa, m, row, unit, s, b, table, offset, out);
        store(C, m, n + j, out[0]);
      }
    }
  }
}

// rows() with the unit's size fixed at compile time where it is 32 (8-bit), 64, 128 or 256 (every
// group size MLX, MXFP4, NVFP4 and int4 checkpoints use), else counted. 4-bit codes (K a multiple
// of 64, QuantA::pair64) go in units of 64 inputs holding 1, 2 or 4 groups.
template <Codes kCodes>
MOEKIT_I8_ATTR void kernel(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N) {
  const int gs = B.format.block_cols;
  if constexpr (kCodes != Codes::affine8) {
    if (gs == 16) return rows<kCodes, 64, 4>(qa, B, C, M, N);
    if (gs == 32) return rows<kCodes, 64, 2>(qa, B, C, M, N);
  } else if (gs == 32) {
    return rows<kCodes, 32, 1>(qa, B, C, M, N);
  }
  switch (gs) {
    case 64:
      return rows<kCodes, 64, 1>(qa, B, C, M, N);
    case 128:
      return rows<kCodes, 128, 1>(qa, B, C, M, N);
    case 256:
      return rows<kCodes, 256, 1>(qa, B, C, M, N);
    default:
      return rows<kCodes, 0, 1>(qa, B, C, M, N);
  }
}
