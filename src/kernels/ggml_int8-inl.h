// The x86 row kernels of the int8 fast mode on ggml's 32-block types (int8_rows.cpp), included
// once per instruction set after int8_codes-inl.h, whose dot4, group_sums8 and reduce8 they use:
// AVX2 and AVX512-VNNI on 256-bit vectors. A's rows come quantized per 32 inputs in natural
// order (QuantA with groups of 32, int8); B's blocks are read in place and turned into int8 codes
// in registers, one block at a time, for every row of A in the pair.
//
// Per eight groups of 32 inputs (one K-quant block, or eight 32-blocks) each row of A gets the
// eight exact integer sums S_g = Σ_h qs16_h Σ_k q_k · a_k (ggml_common.hpp's integer form), then
//   acc = fma(float(S), ws · d, acc),   bacc = fma(wb, d·Σa, bacc)   (eight lanes)
// and at the end reduce8(acc + bacc) — the portable kernel's steps lane by lane, so every path
// gives the same bits (tested). Codes in [0, 31] go to dot4 as u8; signed codes w as |w| times
// the activation with w's sign (`vpsignb`), |w| ≤ 128, so AVX2's int16 pair sums cannot saturate.
// No include guard: included twice on purpose.

// One 32-block (group g of the row) against MR rows of A: x[i] its 8 lanes of products; zero
// lanes where the row has no block g.
template <class T, int MR>
MOEKIT_I8_ATTR inline void block32(const std::uint8_t* row, std::int64_t g, bool present,
                                   const std::int8_t* const (&a)[MR], __m256i (&x)[MR]) {
  if (!present) {
    for (int i = 0; i < MR; ++i) x[i] = _mm256_setzero_si256();
    return;
  }
  const std::uint8_t* b = row + g * T::kBytes;
  const __m256i c = codes32(T{}, b);
  for (int i = 0; i < MR; ++i) {
    const __m256i av = load256(a[i] + 32 * g);
    x[i] = GgmlInt8<T>::kSigned ? sdot(c, av) : dot4(_mm256_setzero_si256(), c, av);
  }
}

// The 16-bit field at byte `at` of blocks g .. g + 7 (0 past the row's `groups`) as one vector,
// built in registers: eight scalar stores read back as one vector would wait for the stores to
// drain (no store forwarding) on every chunk.
template <class T>
MOEKIT_I8_ATTR inline __m128i fields8(const std::uint8_t* row, std::int64_t g, std::int64_t groups, int at) {
  const auto f = [&](int k) -> short {
    if (g + k >= groups) return 0;
    std::uint16_t v;
    std::memcpy(&v, row + (g + k) * T::kBytes + at, 2);
    return static_cast<short>(v);
  };
  return _mm_setr_epi16(f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7));
}

// Two neighbouring 32-blocks of a nibble type (NibblePairs) against MR rows of A in the pair
// order (pair_order): their 2 × 16 packed bytes in one register, split once — lo the low nibbles
// (elements 0-15 of block k, then of block k + 1), hi the high ones (16-31) — through the type's
// table; z[i] lanes 0-3 block k's partial sums, 4-7 block k + 1's. A lone last block (`second`
// false) reads only its own bytes and its activations in natural order, the upper lanes zero.
template <class T, int MR>
MOEKIT_I8_ATTR inline void pair32(const std::uint8_t* b, bool second, const std::int8_t* const (&a)[MR], std::int64_t k,
                                  __m256i (&z)[MR]) {
  constexpr int kQs = NibblePairs<T>::kQs;
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
  const __m256i v =
      second ? _mm256_inserti128_si256(_mm256_castsi128_si256(first),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + T::kBytes + kQs)), 1)
             : _mm256_zextsi128_si256(first);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  lo = nibble_codes<T>(lo);
  hi = nibble_codes<T>(hi);
  for (int i = 0; i < MR; ++i) {
    const std::int8_t* x = a[i] + 32 * k;
    __m256i alo, ahi;
    if (second) {
      alo = load256(x);
      ahi = load256(x + 32);
    } else {
      alo = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
      ahi = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
    }
    if constexpr (GgmlInt8<T>::kSigned) {
      z[i] = _mm256_add_epi32(sdot(lo, alo), sdot(hi, ahi));
    } else {
      z[i] = dot4(dot4(_mm256_setzero_si256(), lo, alo), hi, ahi);
    }
  }
}

#if MOEKIT_I8_VNNI
// Four neighbouring 32-blocks of an unsigned nibble type (QuadNibbles) against MR rows of A in
// the quad order (quad_order): the four blocks' 16 bytes of nibbles in one zmm, block j in
// 128-bit lane j, split once — lo the low nibbles (elements 0-15), hi the high ones (16-31) —
// through the type's table; C[i] lane j block j's four partial sums.
template <class T, int MR>
MOEKIT_I8_ATTR inline void quad32(const std::uint8_t* b, const std::int8_t* const (&a)[MR], std::int64_t k,
                                  __m512i (&C)[MR]) {
  constexpr int kQs = NibblePairs<T>::kQs, kB = T::kBytes;
  const auto field = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j * kB + kQs)); };
  // Two 256-bit inserts and one 512-bit: cheaper than three 512-bit ones.
  const __m256i f01 = _mm256_inserti128_si256(_mm256_castsi128_si256(field(0)), field(1), 1);
  const __m256i f23 = _mm256_inserti128_si256(_mm256_castsi128_si256(field(2)), field(3), 1);
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(f01), f23, 1);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  if constexpr (NibblePairs<T>::kHasTable) {
    const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(NibblePairs<T>::kTable)));
    lo = _mm512_shuffle_epi8(t, lo);
    hi = _mm512_shuffle_epi8(t, hi);
  }
  for (int i = 0; i < MR; ++i) {
    const std::int8_t* x = a[i] + 32 * k;
    C[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x)), hi,
                               _mm512_loadu_si512(x + 64));
  }
}

// Two quad32 results (blocks 0-3 in c's 128-bit lanes, 4-7 in d's) as the eight blocks' sums,
// lane j block j.
MOEKIT_I8_ATTR inline __m256i quad_sums8(__m512i c, __m512i d) {
  const __m512i h = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));  // c02 d02 c13 d13
  const __m512i s = _mm512_add_epi32(h, _mm512_unpackhi_epi64(h, h));                            // lane j: c_j, d_j
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, s));
}

// The 16-bit field at byte kAt of eight neighbouring blocks (fields8 for a whole chunk), from
// z0 and z1, the 64 bytes from the first and the fifth block on: block j's field lies in 128-bit
// lane j of its half (j · kBytes + kAt + 2 ≤ 16 (j + 1) for the nibble types' 17 to 20 bytes),
// moved to the lane's first word and the four lanes' words of both halves gathered.
template <class T, int kAt>
MOEKIT_I8_ATTR inline __m128i quad_fields8(__m512i z0, __m512i z1) {
  static_assert(3 * (T::kBytes - 16) + kAt + 2 <= 16, "block j's field in lane j");
  alignas(64) static constexpr auto kToWord0 = [] {
    std::array<std::int8_t, 64> idx{};
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 16; ++b)
        idx[16 * j + b] = static_cast<std::int8_t>(b < 2 ? j * (T::kBytes - 16) + kAt + b : -128);
    return idx;
  }();
  const __m512i to_word0 = _mm512_load_si512(kToWord0.data());
  const __m512i words = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 56, 48,
                                         40, 32, 24, 16, 8, 0);
  return _mm512_castsi512_si128(
      _mm512_permutex2var_epi16(_mm512_shuffle_epi8(z0, to_word0), words, _mm512_shuffle_epi8(z1, to_word0)));
}

// Four vpdpbusd results of a K-quant block, eight int32 lanes per group of 32, as the eight
// groups' sums (lane j group j): x0 holds groups 0 and 2, x1 1 and 3, x2 4 and 6, x3 5 and 7
// (q4_K's nibbles, kPairs false), or x_p groups 2p and 2p + 1 (kPairs).
template <bool kPairs>
MOEKIT_I8_ATTR inline __m256i sums8_512(__m512i x0, __m512i x1, __m512i x2, __m512i x3) {
  // p, q: per 128-bit lane two partial sums of each input's lanes, interleaved.
  const __m512i p = _mm512_add_epi32(_mm512_unpacklo_epi32(x0, x1), _mm512_unpackhi_epi32(x0, x1));
  const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi32(x2, x3), _mm512_unpackhi_epi32(x2, x3));
  // r's lanes 0 and 1: the low halves of x0 .. x3 (half their lanes each); lanes 2 and 3: the high.
  const __m512i r = _mm512_add_epi32(_mm512_unpacklo_epi64(p, q), _mm512_unpackhi_epi64(p, q));
  const __m512i t = _mm512_add_epi32(r, _mm512_shuffle_i32x4(r, r, _MM_SHUFFLE(2, 3, 0, 1)));
  // t's dwords 0-3: x0 .. x3's low halves, 8-11: their high halves.
  const __m512i order = kPairs ? _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0)
                               : _mm512_setr_epi32(0, 1, 8, 9, 2, 3, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, t));
}

// q8_0's whole chunk of eight blocks against MR rows of A, two blocks a register: the signed codes
// plus 128 (u8) by `vpdpbusd` (|lane| ≤ 4 · 255 · 127), then 128 · Σa of each block taken off
// (QuantA::qsum): S[i] the eight blocks' Σ q · a, lane j block j.
template <int MR>
MOEKIT_I8_ATTR inline void q8_wide8(const QuantA& qa, std::int64_t m, const std::uint8_t* row, std::int64_t g,
                                    const std::int8_t* const (&a)[MR], __m256i (&S)[MR]) {
  constexpr int kB = formats::q8_0::Type::kBytes;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i x[4][MR];
  for (int p = 0; p < 4; ++p) {
    const std::uint8_t* b = row + (g + 2 * p) * kB + 2;  // the codes behind the f16 scale
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kB));
    const __m512i u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), flip);
    for (int i = 0; i < MR; ++i)
      x[p][i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(a[i] + 32 * (g + 2 * p)));
  }
  for (int i = 0; i < MR; ++i) {
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa.qsum.data() + (m + i) * qa.gstride + g));
    S[i] = _mm256_sub_epi32(sums8_512<true>(x[0][i], x[1][i], x[2][i], x[3][i]), _mm256_slli_epi32(qs, 7));
  }
}
#endif

// Groups [g, g + 8) of a nibble type's row (NibblePairs) a pair of blocks at a time (pair32: one
// split for two blocks, and half the horizontal adds): S[i] the eight integer sums.
template <class T, int MR>
MOEKIT_I8_ATTR inline void pairs8(const std::uint8_t* row, std::int64_t g, std::int64_t groups,
                                  const std::int8_t* const (&a)[MR], __m256i (&S)[MR]) {
  __m256i z[4][MR];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const std::int64_t k = g + 2 * p;
    if (k < groups) {
      pair32<T, MR>(row + k * T::kBytes, k + 1 < groups, a, k, z[p]);
    } else {
      for (int i = 0; i < MR; ++i) z[p][i] = _mm256_setzero_si256();
    }
  }
  // hadd(z0, z1): blocks 0 and 2 in the low half, 1 and 3 in the high one, two partial sums
  // each; group_sums8<2> finishes them (blocks 0, 2, 4, 6 low, 1, 3, 5, 7 high).
  for (int i = 0; i < MR; ++i) {
    const __m256i h[4] = {_mm256_hadd_epi32(z[0][i], z[1][i]), _mm256_hadd_epi32(z[2][i], z[3][i]),
                          _mm256_setzero_si256(), _mm256_setzero_si256()};
    S[i] = group_sums8<2>(h);
  }
}

// Whether groups [g, g + 8) of a nibble type's row went four blocks at a time (quad32, S[i] the
// eight integer sums): with VNNI, an unsigned nibble type (QuadNibbles), a whole chunk.
template <class T, int MR>
MOEKIT_I8_ATTR inline bool quad8([[maybe_unused]] const std::uint8_t* row, [[maybe_unused]] std::int64_t g,
                                 [[maybe_unused]] std::int64_t groups,
                                 [[maybe_unused]] const std::int8_t* const (&a)[MR], [[maybe_unused]] __m256i (&S)[MR],
                                 [[maybe_unused]] __m128i& scales, [[maybe_unused]] __m128i& biases) {
#if MOEKIT_I8_VNNI
  if constexpr (QuadNibbles<T>::kYes)
    if (g + 8 <= groups) {
      const std::uint8_t* b = row + g * T::kBytes;
      __m512i c[MR], d[MR];
      quad32<T, MR>(b, a, g, c);
      quad32<T, MR>(b + 4 * T::kBytes, a, g + 4, d);
      for (int i = 0; i < MR; ++i) S[i] = quad_sums8(c[i], d[i]);
      const __m512i z0 = _mm512_loadu_si512(b), z1 = _mm512_loadu_si512(b + 4 * T::kBytes);  // within the chunk
      scales = quad_fields8<T, 0>(z0, z1);
      if constexpr (GgmlInt8<T>::kBias) biases = quad_fields8<T, 2>(z0, z1);
      return true;
    }
#endif
  return false;
}

// Whether groups [g, g + 8) of q8_0's row went two blocks a register (q8_wide8, S[i] the eight
// integer sums): with VNNI, a whole chunk.
template <class T, int MR>
MOEKIT_I8_ATTR inline bool wide8([[maybe_unused]] const QuantA& qa, [[maybe_unused]] std::int64_t m,
                                 [[maybe_unused]] const std::uint8_t* row, [[maybe_unused]] std::int64_t g,
                                 [[maybe_unused]] std::int64_t groups,
                                 [[maybe_unused]] const std::int8_t* const (&a)[MR],
                                 [[maybe_unused]] __m256i (&S)[MR]) {
#if MOEKIT_I8_VNNI
  if constexpr (T::kInt8Facts.byte_codes)
    if (g + 8 <= groups) {
      q8_wide8<MR>(qa, m, row, g, a, S);
      return true;
    }
#endif
  return false;
}

// Groups [g, g + 8) of a 32-block type's row (`groups` in all): S[i] the eight integer sums
// (before the offset), ws and wb the eight blocks' scales and biases (0 past the row). The nibble
// types go four blocks (quad8) or a pair (pairs8) at a time, the others a block at a time.
template <class T, int MR>
MOEKIT_I8_ATTR inline void chunk32([[maybe_unused]] const QuantA& qa, [[maybe_unused]] std::int64_t m,
                                   const std::uint8_t* row, std::int64_t g, std::int64_t groups,
                                   const std::int8_t* const (&a)[MR], __m256i (&S)[MR], __m256& ws, __m256& wb) {
  __m128i scales = _mm_setzero_si128(), biases = _mm_setzero_si128();
  const bool quad = quad8<T, MR>(row, g, groups, a, S, scales, biases);  // S, scales, biases
  const bool sums = quad || wide8<T, MR>(qa, m, row, g, groups, a, S);   // S
  if (sums) {
    // nothing more to sum
  } else if constexpr (NibblePairs<T>::kYes) {
    pairs8<T, MR>(row, g, groups, a, S);
  } else {
    __m256i h[MR][4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m256i x[MR], y[MR];
      block32<T, MR>(row, g + 2 * p, g + 2 * p < groups, a, x);
      block32<T, MR>(row, g + 2 * p + 1, g + 2 * p + 1 < groups, a, y);
      for (int i = 0; i < MR; ++i) h[i][p] = _mm256_hadd_epi32(x[i], y[i]);
    }
    for (int i = 0; i < MR; ++i) S[i] = group_sums8<1>(h[i]);
  }
  if (!quad) {
    scales = fields8<T>(row, g, groups, 0);
    if constexpr (GgmlInt8<T>::kBias) biases = fields8<T>(row, g, groups, 2);
  }
  if constexpr (T::kInt8Facts.e8m0_scale) {
    // e8m0 (the low byte; blocks past the row 0): 2^(e − 128), half the e8m0 scale since the codes
    // are twice the e2m1 value, as ggml_mxfp4::Scale writes it:
    // (e − 1) << 23 from e = 2, 0x00200000 << e below; past the row 0.
    const __m256i e = _mm256_and_si256(_mm256_cvtepu16_epi32(scales), _mm256_set1_epi32(0xFF));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i bits = _mm256_blendv_epi8(tiny, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1)));
    if (quad) {  // a whole chunk
      ws = _mm256_castsi256_ps(bits);
    } else {
      const __m256i live =
          _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<std::int64_t>(8, groups - g))),
                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      ws = _mm256_castsi256_ps(_mm256_and_si256(bits, live));
    }
  } else {
    ws = _mm256_cvtph_ps(scales);
  }
  if constexpr (GgmlInt8<T>::kBias) {
    wb = _mm256_cvtph_ps(biases);
  } else {
    wb = _mm256_setzero_ps();
  }
}
