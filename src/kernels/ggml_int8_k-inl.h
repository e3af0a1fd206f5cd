// The x86 row kernels of the int8 fast mode on ggml's K-quants (q4_K, q5_K, q6_K, q3_K, iq4_xs,
// q2_K: a block of 256 weights per eight groups of 32), and the row driver of every ggml type
// (ggml_row_dot, ggml_rows), included after ggml_int8-inl.h, once per instruction set
// (int8_rows.cpp). The arithmetic is ggml_int8-inl.h's (its header says it).
// No include guard: included twice on purpose.

// q4_K / q5_K: a block's eight sub-block scales times their groups' sums (S, lane j group j), ws = d,
// wb = −dmin·m.
template <int MR>
MOEKIT_I8_ATTR inline void k_epilogue(const std::uint8_t* b, __m256i (&S)[MR], __m256& ws, __m256& wb) {
  alignas(8) std::uint8_t sc[8], m[8];
  formats::ggml::scales_mins_k4(b + 4, sc, m);
  const __m256i scv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
  const __m256 mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))));
  for (int i = 0; i < MR; ++i) S[i] = _mm256_mullo_epi32(S[i], scv);
  ws = _mm256_set1_ps(half(b));
  wb = _mm256_mul_ps(_mm256_set1_ps(-half(b + 2)), mv);
}

#if MOEKIT_I8_VNNI
// 16-bit lanes: c0 in the low 256 bits, c1 in the high (per-half shift counts).
MOEKIT_I8_ATTR inline __m512i halves16(int c0, int c1) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(c0)), _mm256_set1_epi16(static_cast<short>(c1)), 1);
}
#endif

// q4_K / q5_K: sub-blocks 2p and 2p + 1 against MR rows (k45_codes).
template <bool kFifth, int MR>
MOEKIT_I8_ATTR inline void chunk_k45(const std::uint8_t* b, std::int64_t g, const std::int8_t* const (&a0)[MR],
                                     __m256i (&S)[MR], __m256& ws, __m256& wb) {
#if MOEKIT_I8_VNNI
  {  // 64 bytes of nibbles a register, A in the k4 order (k4_order)
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i x[4][MR];
    // q5_K: the 32 bytes of fifth bits in both halves; sub-block j's bit to bit 4 of each byte by
    // a 16-bit shift (no bit crosses into bit 4 of the other byte), merged into the nibbles.
    [[maybe_unused]] __m512i qh2, bit4;
    if constexpr (kFifth) {
      qh2 = _mm512_broadcast_i64x4(load256(b + 16));
      bit4 = _mm512_set1_epi8(0x10);
    }
    for (int n = 0; n < 2; ++n) {
      const __m512i v = _mm512_loadu_si512(b + (kFifth ? 48 : 16) + 64 * n);
      __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      if constexpr (kFifth) {  // lo holds sub-blocks 4n and 4n + 2, hi 4n + 1 and 4n + 3
        const __m512i flo = n == 0 ? _mm512_sllv_epi16(qh2, halves16(4, 2)) : _mm512_srlv_epi16(qh2, halves16(0, 2));
        const __m512i fhi = n == 0 ? _mm512_sllv_epi16(qh2, halves16(3, 1)) : _mm512_srlv_epi16(qh2, halves16(1, 3));
        lo = _mm512_ternarylogic_epi32(lo, flo, bit4, 0xF8);  // lo | (flo & bit4)
        hi = _mm512_ternarylogic_epi32(hi, fhi, bit4, 0xF8);
      }
      for (int i = 0; i < MR; ++i) {
        const std::int8_t* a = a0[i] + 32 * g + 128 * n;
        x[2 * n][i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(a));
        x[2 * n + 1][i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(a + 64));
      }
    }
    for (int i = 0; i < MR; ++i) S[i] = sums8_512<false>(x[0][i], x[1][i], x[2][i], x[3][i]);
    k_epilogue<MR>(b, S, ws, wb);
    return;
  }
#endif
  __m256i h[MR][4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    __m256i lo, hi;
    k45_codes<kFifth>(b, p, lo, hi);
    for (int i = 0; i < MR; ++i) {
      const std::int8_t* a = a0[i] + 32 * g + 64 * p;
      h[i][p] = _mm256_hadd_epi32(dot4(_mm256_setzero_si256(), lo, load256(a)),
                                  dot4(_mm256_setzero_si256(), hi, load256(a + 32)));
    }
  }
  for (int i = 0; i < MR; ++i) S[i] = group_sums8<1>(h[i]);
  k_epilogue<MR>(b, S, ws, wb);
}

template <int MR>
MOEKIT_I8_ATTR inline void chunk_k(formats::q4_k::Type, [[maybe_unused]] const QuantA& qa,
                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                   const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  chunk_k45<false, MR>(row + g / 8 * formats::q4_k::Type::kBytes, g, a0, S, ws, wb);
}

template <int MR>
MOEKIT_I8_ATTR inline void chunk_k(formats::q5_k::Type, [[maybe_unused]] const QuantA& qa,
                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                   const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  chunk_k45<true, MR>(row + g / 8 * formats::q5_k::Type::kBytes, g, a0, S, ws, wb);
}

// The eight groups' lanes x[j] of a K-quant block summed per group (S[i], lane j group j).
template <int MR>
MOEKIT_I8_ATTR inline void sums8(const __m256i (&x)[8][MR], __m256i (&S)[MR]) {
  for (int i = 0; i < MR; ++i) {
    __m256i h[4];
    for (int p = 0; p < 4; ++p) h[p] = _mm256_hadd_epi32(x[2 * p][i], x[2 * p + 1][i]);
    S[i] = group_sums8<1>(h);
  }
}

// A K-quant block with a scale per 16 weights against MR rows of A from input 32 · g: c[j] group
// j's 32 codes as u8 (the signed code plus kOff, u ≤ 63), sc8 the 16 scales (int8); S[i]
// lane j group j's Σ_h scale_h Σ_k (u_k − kOff) · a_k. AVX2: u times a by `vpmaddubsw` (|pair| ≤
// 2 · 63 · 127 < 2^15: no saturation), the pairs times the scale by `vpmaddwd`, the groups' lanes
// summed (sums8), and kOff · Σa taken off per block as VNNI does (the same integers as summing
// (u − kOff) · a, so the same bits; ggml's AVX2 q6_K dot takes its offset the same way). VNNI: two groups a
// register, u times a by `vpdpbusd` (|lane| ≤ 4 · 63 · 127 < 2^15, so a lane is its own low int16)
// times its 16's scale by `vpmaddwd` against (scale, 0), the groups' lanes summed (sums8_512), and
// kOff · Σa of each 16 times its scale taken off per block from A's sums of 16 (QuantA::qsum16) by
// one `vpmaddwd`.
template <int kOff, int MR>
MOEKIT_I8_ATTR inline void scaled_block([[maybe_unused]] const QuantA& qa, [[maybe_unused]] std::int64_t m,
                                        std::int64_t g, const __m256i (&c)[8], __m128i sc8,
                                        const std::int8_t* const (&a0)[MR], __m256i (&S)[MR]) {
  static_assert(std::has_single_bit(unsigned{kOff}), "the offset taken off by a shift");
#if MOEKIT_I8_VNNI
  const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
  const __m512i s32 = _mm512_cvtepu16_epi32(sc16);  // (scale, 0) per 16
  const __m512i quarter = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
  __m512i x[4][MR];
  for (int p = 0; p < 4; ++p) {
    const __m512i cz = _mm512_inserti64x4(_mm512_castsi256_si512(c[2 * p]), c[2 * p + 1], 1);
    const __m512i scale = _mm512_permutexvar_epi32(_mm512_add_epi32(quarter, _mm512_set1_epi32(4 * p)), s32);
    for (int i = 0; i < MR; ++i)
      x[p][i] = _mm512_madd_epi16(
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), cz, _mm512_loadu_si512(a0[i] + 32 * (g + 2 * p))), scale);
  }
  for (int i = 0; i < MR; ++i) {
    S[i] = sums8_512<true>(x[0][i], x[1][i], x[2][i], x[3][i]);
    const auto* sums = qa.qsum16.data() + (m + i) * (qa.K / 16) + 2 * g;  // group g's first 16
    const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
    S[i] = _mm256_sub_epi32(S[i], _mm256_slli_epi32(off, std::countr_zero(unsigned{kOff})));
  }
#else
  // The 16 scales as int16, each 128-bit half holding all eight of its half's; group j's pair
  // (scale 2j in the low half, 2j + 1 in the high) picked by one byte shuffle.
  const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
  const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)};
  __m256i x[8][MR];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const short e0 = static_cast<short>((2 * j) % 8), e1 = static_cast<short>((2 * j + 1) % 8);
    const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(((2 * e1 + 1) << 8) | (2 * e1))),
                                          _mm_set1_epi16(static_cast<short>(((2 * e0 + 1) << 8) | (2 * e0))));
    const __m256i scale = _mm256_shuffle_epi8(halves[j / 4], pick);
    for (int i = 0; i < MR; ++i)
      x[j][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(c[j], load256(a0[i] + 32 * (g + j))), scale);
  }
  sums8<MR>(x, S);
  for (int i = 0; i < MR; ++i) {
    const auto* sums = qa.qsum16.data() + (m + i) * (qa.K / 16) + 2 * g;  // group g's first 16
    const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
    S[i] = _mm256_sub_epi32(S[i], _mm256_slli_epi32(off, std::countr_zero(unsigned{kOff})));
  }
#endif
}

// q6_K: codes q − 32 (signed 6-bit; scaled_block takes q), int8 scales per 16, ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void chunk_k(formats::q6_k::Type, [[maybe_unused]] const QuantA& qa,
                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                   const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::q6_k::Type::kBytes;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
  __m256i c[8];
  for (int n = 0; n < 2; ++n) {
    const __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32);
    const __m256i qh = load256(b + 128 + 32 * n);
    c[4 * n] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
    c[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
    c[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
    c[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
  }
  scaled_block<32, MR>(qa, m, g, c, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)), a0, S);
  ws = _mm256_set1_ps(half(b + 208));
  wb = _mm256_setzero_ps();
}

// q3_K: codes (2 low bits + 4 · the hmask bit) − 4 (scaled_block takes them plus 4), scales per 16 minus 32,
// ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void chunk_k(formats::q3_k::Type, [[maybe_unused]] const QuantA& qa,
                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                   const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::q3_k::Type::kBytes;
  const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = load256(b);
  __m256i c[8];
  for (int n = 0; n < 2; ++n) {
    const __m256i qs = load256(b + 32 + 32 * n);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * n + t;  // the group within the block; hmask bit j
      const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), low2);
      const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, j), one), 2);
      c[j] = _mm256_or_si256(low, high);
    }
  }
  const auto sw = formats::q3_k::Type::Words(b);  // the scales in registers, minus 32
  const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(sw.w[0]), static_cast<int>(sw.w[1]),
                                                  static_cast<int>(sw.w[2]), static_cast<int>(sw.w[3])),
                                   _mm_set1_epi8(32));
  scaled_block<4, MR>(qa, m, g, c, sc8, a0, S);
  ws = _mm256_set1_ps(half(b + 108));
  wb = _mm256_setzero_ps();
}

// iq4_xs: eight iq4_nl-like sub-blocks, each with a 6-bit scale minus 32 (times its group's sum),
// ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void chunk_k(formats::iq4_xs::Type, [[maybe_unused]] const QuantA& qa,
                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                   const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::iq4_xs::Type::kBytes;
  std::uint16_t high;
  std::memcpy(&high, b + 2, 2);
  alignas(32) std::int32_t ls[8];
  for (int j = 0; j < 8; ++j) ls[j] = (((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((high >> (2 * j)) & 3) << 4)) - 32;
  __m256i h[MR][4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m256i c0 = lookup(formats::ggml::kIq4Values, nibbles32(b + 8 + 32 * p));
    const __m256i c1 = lookup(formats::ggml::kIq4Values, nibbles32(b + 8 + 32 * p + 16));
    for (int i = 0; i < MR; ++i) {
      const std::int8_t* a = a0[i] + 32 * g + 64 * p;
      h[i][p] = _mm256_hadd_epi32(sdot(c0, load256(a)), sdot(c1, load256(a + 32)));
    }
  }
  const __m256i scale = _mm256_load_si256(reinterpret_cast<const __m256i*>(ls));
  for (int i = 0; i < MR; ++i) {
    const __m256i sums = group_sums8<1>(h[i]);
    S[i] = _mm256_mullo_epi32(sums, scale);
  }
  ws = _mm256_set1_ps(half(b));
  wb = _mm256_setzero_ps();
}

// q2_K: 2-bit codes (u8 0..3) times the activations by `vpmaddubsw`, each 16's pair sums times
// their 4-bit scale by `vpmaddwd` (S); the 4-bit mins times the rows' sums of 16 activations
// (QuantA::qsum16, computed once per call, not per row of B) by one `vpmaddwd` per block (Mn,
// lane j group j); ws = d, wm = −dmin.
template <int MR>
MOEKIT_I8_ATTR inline void chunk_q2k(const QuantA& qa, std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                     const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256i (&Mn)[MR],
                                     __m256& ws, __m256& wm) {
  const std::uint8_t* b = row + g / 8 * formats::q2_k::Type::kBytes;
  const __m256i low2 = _mm256_set1_epi8(3);
  __m256i x[8][MR];
  for (int n = 0; n < 2; ++n) {
    const __m256i q = load256(b + 16 + 32 * n);
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * n + s;  // the group within the block; scales 2j, 2j + 1
      const __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2);
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(b[2 * j + 1] & 0xF)),
                                             _mm_set1_epi16(static_cast<short>(b[2 * j] & 0xF)));
      for (int i = 0; i < MR; ++i)
        x[j][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(c, load256(a0[i] + 32 * (g + j))), scale);
    }
  }
  sums8<MR>(x, S);
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
  for (int i = 0; i < MR; ++i) {
    const auto* sums = qa.qsum16.data() + (m + i) * (qa.K / 16) + 2 * g;  // group g's first 16
    Mn[i] = _mm256_madd_epi16(mins, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  }
  ws = _mm256_set1_ps(half(b + 80));
  wm = _mm256_set1_ps(-half(b + 82));
}

// MR (1 or 2) rows of A from row m against one row of B (`row`, T's blocks).
template <class T, int MR>
MOEKIT_I8_ATTR void ggml_row_dot(const QuantA& qa, std::int64_t m, const std::uint8_t* row, float* out) {
  using Tr = GgmlInt8<T>;
  const std::int8_t* a[MR];
  for (int i = 0; i < MR; ++i) a[i] = qa.q8.data() + (m + i) * qa.K;
  __m256 acc[MR], bacc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = bacc[i] = _mm256_setzero_ps();
  for (std::int64_t g = 0; g < qa.groups; g += 8) {
    __m256i S[MR];
    [[maybe_unused]] __m256i Mn[MR];
    __m256 ws, wb;
    if constexpr (T::kBlock == 32) {
      chunk32<T, MR>(qa, m, row, g, qa.groups, a, S, ws, wb);
    } else if constexpr (Tr::kMin16) {
      chunk_q2k<MR>(qa, m, row, g, a, S, Mn, ws, wb);  // wb: wm
    } else {
      chunk_k<MR>(T{}, qa, m, row, g, a, S, ws, wb);
    }
    for (int i = 0; i < MR; ++i) {
      const std::size_t gi = static_cast<std::size_t>((m + i) * qa.gstride + g);
      if constexpr (Tr::kOffset != 0) {
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.qsum.data() + gi));
        S[i] = _mm256_sub_epi32(S[i], _mm256_mullo_epi32(qs, _mm256_set1_epi32(Tr::kOffset)));
      }
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(ws, _mm256_loadu_ps(qa.d.data() + gi)), acc[i]);
      if constexpr (Tr::kBias) bacc[i] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(qa.xsum.data() + gi), bacc[i]);
      if constexpr (Tr::kMin16)
        bacc[i] =
            _mm256_fmadd_ps(wb, _mm256_mul_ps(_mm256_cvtepi32_ps(Mn[i]), _mm256_loadu_ps(qa.d.data() + gi)), bacc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) out[i] = reduce8(Tr::kAdd ? _mm256_add_ps(acc[i], bacc[i]) : acc[i]);
}

// Every row of A (at most kInt8MaxRows) against B's rows [0, N), B's rows in address order, A's
// rows two at a time against each.
template <class T>
MOEKIT_I8_ATTR void ggml_rows(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
                              std::int64_t N) {
  const auto* base = static_cast<const std::uint8_t*>(B.data);
  const std::int64_t stride = row_stride_bytes(B);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::uint8_t* row = base + n * stride;
    // The bytes 2 KB on, one row's worth, into L1 while this row computes: at one or two rows of
    // A a row of B takes too little time for the hardware prefetcher alone to keep DRAM busy
    // (docs/performance.md: q4_K at T = 1, 1.04–1.28 ms without, 0.85–0.99 with 1.5 or 3 KB).
    // A hint: past the matrix it is ignored.
    for (std::int64_t o = 0; o < stride; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(row) + kGgmlPrefetchBytes + o, _MM_HINT_T0);
    float out[2];
    std::int64_t m = 0;
    for (; m + 2 <= M; m += 2) {
      ggml_row_dot<T, 2>(qa, m, row, out);
      store(C, m, n, out[0]);
      store(C, m + 1, n, out[1]);
    }
    if (m < M) {
      ggml_row_dot<T, 1>(qa, m, row, out);
      store(C, m, n, out[0]);
    }
  }
}
