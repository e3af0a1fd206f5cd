// The x86 kernels of the int8 fast mode on ggml's block types (gemm_affine_int8.cpp), included
// once per instruction set after affine_int8-inl.h, whose dot4, group_sums8 and reduce8 they use:
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

// The f16 at p, widened (exact; `vcvtph2ps`, where ggml::half calls out of line).
MOEKIT_I8_ATTR inline float MOEKIT_I8_NAME(half)(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 signed codes times 32 activations: 8 int32 lanes, lane l the sum of elements 4l .. 4l + 3.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(sdot)(__m256i w, __m256i a) {
  return MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

// A 32-block's 16 bytes of nibbles as 32 codes in element order (byte j: element j low, j + 16
// high).
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(nibbles32)(const std::uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

// The fifth bits of a q5 block (`qh`, 32 bits: bit j for element j) as 0x10 in byte j.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(fifth_bits)(const std::uint8_t* qh) {
  std::uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}

// A nibble table (16 int8 values) applied to 32 codes.
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(lookup)(const std::int8_t* table, __m256i codes) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm256_shuffle_epi8(t, codes);
}

// A nibble type's (NibblePairs) split nibbles as its codes: through its table where it has one.
template <class T>
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(nibble_codes)(__m256i nibbles) {
  if constexpr (NibblePairs<T>::kHasTable) {
    return MOEKIT_I8_NAME(lookup)(NibblePairs<T>::kTable, nibbles);
  } else {
    return nibbles;
  }
}

// The 32 codes of a 32-block type's block `b` in element order (GgmlInt8<T>::kSigned: int8
// values, else u8 ≤ 31). q4_0, q4_1, iq4_nl and MXFP4 from NibblePairs (MXFP4's table gives
// twice the e2m1 value plus 12); q5_0, q5_1 and q8_0 below.
template <class T, std::enable_if_t<NibblePairs<T>::kYes, int> = 0>
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(codes32)(T, const std::uint8_t* b) {
  return MOEKIT_I8_NAME(nibble_codes)<T>(MOEKIT_I8_NAME(nibbles32)(b + NibblePairs<T>::kQs));
}
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(codes32)(formats::q5_0::Type, const std::uint8_t* b) {
  return _mm256_or_si256(MOEKIT_I8_NAME(nibbles32)(b + 6), MOEKIT_I8_NAME(fifth_bits)(b + 2));
}
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(codes32)(formats::q5_1::Type, const std::uint8_t* b) {
  return _mm256_or_si256(MOEKIT_I8_NAME(nibbles32)(b + 8), MOEKIT_I8_NAME(fifth_bits)(b + 4));
}
MOEKIT_I8_ATTR inline __m256i MOEKIT_I8_NAME(codes32)(formats::q8_0::Type, const std::uint8_t* b) {
  return MOEKIT_I8_NAME(load256)(b + 2);
}

// One 32-block (group g of the row) against MR rows of A: x[i] its 8 lanes of products; zero
// lanes where the row has no block g.
template <class T, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(block32)(const std::uint8_t* row, std::int64_t g, bool present,
                                                   const std::int8_t* const (&a)[MR], __m256i (&x)[MR]) {
  if (!present) {
    for (int i = 0; i < MR; ++i) x[i] = _mm256_setzero_si256();
    return;
  }
  const std::uint8_t* b = row + g * T::kBytes;
  const __m256i c = MOEKIT_I8_NAME(codes32)(T{}, b);
  for (int i = 0; i < MR; ++i) {
    const __m256i av = MOEKIT_I8_NAME(load256)(a[i] + 32 * g);
    x[i] = GgmlInt8<T>::kSigned ? MOEKIT_I8_NAME(sdot)(c, av) : MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), c, av);
  }
}

// The 16-bit field at byte `at` of blocks g .. g + 7 (0 past the row's `groups`) as one vector,
// built in registers: eight scalar stores read back as one vector would wait for the stores to
// drain (no store forwarding) on every chunk.
template <class T>
MOEKIT_I8_ATTR inline __m128i MOEKIT_I8_NAME(fields8)(const std::uint8_t* row, std::int64_t g, std::int64_t groups,
                                                      int at) {
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
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(pair32)(const std::uint8_t* b, bool second, const std::int8_t* const (&a)[MR],
                                                  std::int64_t k, __m256i (&z)[MR]) {
  constexpr int kQs = NibblePairs<T>::kQs;
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
  const __m256i v =
      second ? _mm256_inserti128_si256(_mm256_castsi128_si256(first),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + T::kBytes + kQs)), 1)
             : _mm256_zextsi128_si256(first);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  lo = MOEKIT_I8_NAME(nibble_codes)<T>(lo);
  hi = MOEKIT_I8_NAME(nibble_codes)<T>(hi);
  for (int i = 0; i < MR; ++i) {
    const std::int8_t* x = a[i] + 32 * k;
    __m256i alo, ahi;
    if (second) {
      alo = MOEKIT_I8_NAME(load256)(x);
      ahi = MOEKIT_I8_NAME(load256)(x + 32);
    } else {
      alo = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
      ahi = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 16)));
    }
    if constexpr (GgmlInt8<T>::kSigned) {
      z[i] = _mm256_add_epi32(MOEKIT_I8_NAME(sdot)(lo, alo), MOEKIT_I8_NAME(sdot)(hi, ahi));
    } else {
      z[i] = MOEKIT_I8_NAME(dot4)(MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), lo, alo), hi, ahi);
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
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(pairs8)(const std::uint8_t* row, std::int64_t g, std::int64_t groups,
                                                  const std::int8_t* const (&a)[MR], __m256i (&S)[MR]) {
  __m256i z[4][MR];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const std::int64_t k = g + 2 * p;
    if (k < groups) {
      MOEKIT_I8_NAME(pair32)<T, MR>(row + k * T::kBytes, k + 1 < groups, a, k, z[p]);
    } else {
      for (int i = 0; i < MR; ++i) z[p][i] = _mm256_setzero_si256();
    }
  }
  // hadd(z0, z1): blocks 0 and 2 in the low half, 1 and 3 in the high one, two partial sums
  // each; group_sums8<2> finishes them (blocks 0, 2, 4, 6 low, 1, 3, 5, 7 high).
  for (int i = 0; i < MR; ++i) {
    const __m256i h[4] = {_mm256_hadd_epi32(z[0][i], z[1][i]), _mm256_hadd_epi32(z[2][i], z[3][i]),
                          _mm256_setzero_si256(), _mm256_setzero_si256()};
    S[i] = MOEKIT_I8_NAME(group_sums8)<2>(h);
  }
}

// Whether groups [g, g + 8) of a nibble type's row went four blocks at a time (quad32, S[i] the
// eight integer sums): with VNNI, an unsigned nibble type (QuadNibbles), a whole chunk.
template <class T, int MR>
MOEKIT_I8_ATTR inline bool MOEKIT_I8_NAME(quad8)([[maybe_unused]] const std::uint8_t* row,
                                                 [[maybe_unused]] std::int64_t g, [[maybe_unused]] std::int64_t groups,
                                                 [[maybe_unused]] const std::int8_t* const (&a)[MR],
                                                 [[maybe_unused]] __m256i (&S)[MR], [[maybe_unused]] __m128i& scales,
                                                 [[maybe_unused]] __m128i& biases) {
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
MOEKIT_I8_ATTR inline bool MOEKIT_I8_NAME(wide8)([[maybe_unused]] const QuantA& qa, [[maybe_unused]] std::int64_t m,
                                                 [[maybe_unused]] const std::uint8_t* row,
                                                 [[maybe_unused]] std::int64_t g, [[maybe_unused]] std::int64_t groups,
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
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk32)([[maybe_unused]] const QuantA& qa, [[maybe_unused]] std::int64_t m,
                                                   const std::uint8_t* row, std::int64_t g, std::int64_t groups,
                                                   const std::int8_t* const (&a)[MR], __m256i (&S)[MR], __m256& ws,
                                                   __m256& wb) {
  __m128i scales = _mm_setzero_si128(), biases = _mm_setzero_si128();
  const bool quad = MOEKIT_I8_NAME(quad8)<T, MR>(row, g, groups, a, S, scales, biases);  // S, scales, biases
  const bool sums = quad || MOEKIT_I8_NAME(wide8)<T, MR>(qa, m, row, g, groups, a, S);   // S
  if (sums) {
    // nothing more to sum
  } else if constexpr (NibblePairs<T>::kYes) {
    MOEKIT_I8_NAME(pairs8)<T, MR>(row, g, groups, a, S);
  } else {
    __m256i h[MR][4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m256i x[MR], y[MR];
      MOEKIT_I8_NAME(block32)<T, MR>(row, g + 2 * p, g + 2 * p < groups, a, x);
      MOEKIT_I8_NAME(block32)<T, MR>(row, g + 2 * p + 1, g + 2 * p + 1 < groups, a, y);
      for (int i = 0; i < MR; ++i) h[i][p] = _mm256_hadd_epi32(x[i], y[i]);
    }
    for (int i = 0; i < MR; ++i) S[i] = MOEKIT_I8_NAME(group_sums8)<1>(h[i]);
  }
  if (!quad) {
    scales = MOEKIT_I8_NAME(fields8)<T>(row, g, groups, 0);
    if constexpr (GgmlInt8<T>::kBias) biases = MOEKIT_I8_NAME(fields8)<T>(row, g, groups, 2);
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

// q4_K / q5_K: a block's eight sub-block scales times their groups' sums (S, lane j group j), ws = d,
// wb = −dmin·m.
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(k_epilogue)(const std::uint8_t* b, __m256i (&S)[MR], __m256& ws, __m256& wb) {
  alignas(8) std::uint8_t sc[8], m[8];
  formats::ggml::scales_mins_k4(b + 4, sc, m);
  const __m256i scv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
  const __m256 mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))));
  for (int i = 0; i < MR; ++i) S[i] = _mm256_mullo_epi32(S[i], scv);
  ws = _mm256_set1_ps(MOEKIT_I8_NAME(half)(b));
  wb = _mm256_mul_ps(_mm256_set1_ps(-MOEKIT_I8_NAME(half)(b + 2)), mv);
}

// q4_K / q5_K block b's sub-blocks 2p and 2p + 1 as codes: the low and high nibbles of 32 bytes
// (q5_K: plus the fifth bits, bits 2p and 2p + 1 of its 32 qh bytes, as 16).
template <bool kFifth>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(k45_codes)(const std::uint8_t* b, int p, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i v = MOEKIT_I8_NAME(load256)(b + (kFifth ? 48 : 16) + 32 * p);
  lo = _mm256_and_si256(v, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  if constexpr (kFifth) {
    const __m256i qh = MOEKIT_I8_NAME(load256)(b + 16);
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
  }
}

#if MOEKIT_I8_VNNI
// 16-bit lanes: c0 in the low 256 bits, c1 in the high (per-half shift counts).
MOEKIT_I8_ATTR inline __m512i halves16(int c0, int c1) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(c0)), _mm256_set1_epi16(static_cast<short>(c1)), 1);
}
#endif

// q4_K / q5_K: sub-blocks 2p and 2p + 1 against MR rows (k45_codes).
template <bool kFifth, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k45)(const std::uint8_t* b, std::int64_t g,
                                                     const std::int8_t* const (&a0)[MR], __m256i (&S)[MR], __m256& ws,
                                                     __m256& wb) {
#if MOEKIT_I8_VNNI
  {  // 64 bytes of nibbles a register, A in the k4 order (k4_order)
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i x[4][MR];
    // q5_K: the 32 bytes of fifth bits in both halves; sub-block j's bit to bit 4 of each byte by
    // a 16-bit shift (no bit crosses into bit 4 of the other byte), merged into the nibbles.
    [[maybe_unused]] __m512i qh2, bit4;
    if constexpr (kFifth) {
      qh2 = _mm512_broadcast_i64x4(MOEKIT_I8_NAME(load256)(b + 16));
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
    MOEKIT_I8_NAME(k_epilogue)<MR>(b, S, ws, wb);
    return;
  }
#endif
  __m256i h[MR][4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    __m256i lo, hi;
    MOEKIT_I8_NAME(k45_codes)<kFifth>(b, p, lo, hi);
    for (int i = 0; i < MR; ++i) {
      const std::int8_t* a = a0[i] + 32 * g + 64 * p;
      h[i][p] = _mm256_hadd_epi32(MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), lo, MOEKIT_I8_NAME(load256)(a)),
                                  MOEKIT_I8_NAME(dot4)(_mm256_setzero_si256(), hi, MOEKIT_I8_NAME(load256)(a + 32)));
    }
  }
  for (int i = 0; i < MR; ++i) S[i] = MOEKIT_I8_NAME(group_sums8)<1>(h[i]);
  MOEKIT_I8_NAME(k_epilogue)<MR>(b, S, ws, wb);
}

template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k)(formats::q4_k::Type, [[maybe_unused]] const QuantA& qa,
                                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row,
                                                   std::int64_t g, const std::int8_t* const (&a0)[MR], __m256i (&S)[MR],
                                                   __m256& ws, __m256& wb) {
  MOEKIT_I8_NAME(chunk_k45)<false, MR>(row + g / 8 * formats::q4_k::Type::kBytes, g, a0, S, ws, wb);
}

template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k)(formats::q5_k::Type, [[maybe_unused]] const QuantA& qa,
                                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row,
                                                   std::int64_t g, const std::int8_t* const (&a0)[MR], __m256i (&S)[MR],
                                                   __m256& ws, __m256& wb) {
  MOEKIT_I8_NAME(chunk_k45)<true, MR>(row + g / 8 * formats::q5_k::Type::kBytes, g, a0, S, ws, wb);
}

// The eight groups' lanes x[j] of a K-quant block summed per group (S[i], lane j group j).
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(sums8)(const __m256i (&x)[8][MR], __m256i (&S)[MR]) {
  for (int i = 0; i < MR; ++i) {
    __m256i h[4];
    for (int p = 0; p < 4; ++p) h[p] = _mm256_hadd_epi32(x[2 * p][i], x[2 * p + 1][i]);
    S[i] = MOEKIT_I8_NAME(group_sums8)<1>(h);
  }
}

// A K-quant block with a scale per 16 weights against MR rows of A from input 32 · g: c[j] group
// j's 32 codes as u8 (the signed code plus kOff, u ≤ 63), sc8 the 16 scales (int8); S[i]
// lane j group j's Σ_h scale_h Σ_k (u_k − kOff) · a_k. AVX2: the signed codes w = u − kOff
// (|w| ≤ 32), |w| times a with w's sign by `vpmaddubsw` (|pair| ≤ 2 · 32 · 127: no saturation),
// the pairs times the scale by `vpmaddwd`, the groups' lanes summed (sums8). VNNI: two groups a
// register, u times a by `vpdpbusd` (|lane| ≤ 4 · 63 · 127 < 2^15, so a lane is its own low int16)
// times its 16's scale by `vpmaddwd` against (scale, 0), the groups' lanes summed (sums8_512), and
// kOff · Σa of each 16 times its scale taken off per block from A's sums of 16 (QuantA::qsum16) by
// one `vpmaddwd`.
template <int kOff, int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(scaled_block)([[maybe_unused]] const QuantA& qa,
                                                        [[maybe_unused]] std::int64_t m, std::int64_t g,
                                                        const __m256i (&c)[8], __m128i sc8,
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
  alignas(16) std::int8_t sc[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(sc), sc8);
  __m256i x[8][MR];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i w = _mm256_sub_epi8(c[j], _mm256_set1_epi8(kOff)), aw = _mm256_abs_epi8(w);
    const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(sc[2 * j + 1])),
                                           _mm_set1_epi16(static_cast<short>(sc[2 * j])));
    for (int i = 0; i < MR; ++i)
      x[j][i] = _mm256_madd_epi16(
          _mm256_maddubs_epi16(aw, _mm256_sign_epi8(MOEKIT_I8_NAME(load256)(a0[i] + 32 * (g + j)), w)), scale);
  }
  MOEKIT_I8_NAME(sums8)<MR>(x, S);
#endif
}

// q6_K: codes q − 32 (signed 6-bit; scaled_block takes q), int8 scales per 16, ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k)(formats::q6_k::Type, [[maybe_unused]] const QuantA& qa,
                                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row,
                                                   std::int64_t g, const std::int8_t* const (&a0)[MR], __m256i (&S)[MR],
                                                   __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::q6_k::Type::kBytes;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
  __m256i c[8];
  for (int n = 0; n < 2; ++n) {
    const __m256i l0 = MOEKIT_I8_NAME(load256)(b + 64 * n), l1 = MOEKIT_I8_NAME(load256)(b + 64 * n + 32);
    const __m256i qh = MOEKIT_I8_NAME(load256)(b + 128 + 32 * n);
    c[4 * n] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
    c[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
    c[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
    c[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
  }
  MOEKIT_I8_NAME(scaled_block)<32, MR>(qa, m, g, c, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)), a0, S);
  ws = _mm256_set1_ps(MOEKIT_I8_NAME(half)(b + 208));
  wb = _mm256_setzero_ps();
}

// q3_K: codes (2 low bits + 4 · the hmask bit) − 4 (scaled_block takes them plus 4), scales per 16 minus 32,
// ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k)(formats::q3_k::Type, [[maybe_unused]] const QuantA& qa,
                                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row,
                                                   std::int64_t g, const std::int8_t* const (&a0)[MR], __m256i (&S)[MR],
                                                   __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::q3_k::Type::kBytes;
  const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = MOEKIT_I8_NAME(load256)(b);
  __m256i c[8];
  for (int n = 0; n < 2; ++n) {
    const __m256i qs = MOEKIT_I8_NAME(load256)(b + 32 + 32 * n);
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
  MOEKIT_I8_NAME(scaled_block)<4, MR>(qa, m, g, c, sc8, a0, S);
  ws = _mm256_set1_ps(MOEKIT_I8_NAME(half)(b + 108));
  wb = _mm256_setzero_ps();
}

// iq4_xs: eight iq4_nl-like sub-blocks, each with a 6-bit scale minus 32 (times its group's sum),
// ws = d.
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_k)(formats::iq4_xs::Type, [[maybe_unused]] const QuantA& qa,
                                                   [[maybe_unused]] std::int64_t m, const std::uint8_t* row,
                                                   std::int64_t g, const std::int8_t* const (&a0)[MR], __m256i (&S)[MR],
                                                   __m256& ws, __m256& wb) {
  const std::uint8_t* b = row + g / 8 * formats::iq4_xs::Type::kBytes;
  std::uint16_t high;
  std::memcpy(&high, b + 2, 2);
  alignas(32) std::int32_t ls[8];
  for (int j = 0; j < 8; ++j) ls[j] = (((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((high >> (2 * j)) & 3) << 4)) - 32;
  __m256i h[MR][4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m256i c0 = MOEKIT_I8_NAME(lookup)(formats::ggml::kIq4Values, MOEKIT_I8_NAME(nibbles32)(b + 8 + 32 * p));
    const __m256i c1 =
        MOEKIT_I8_NAME(lookup)(formats::ggml::kIq4Values, MOEKIT_I8_NAME(nibbles32)(b + 8 + 32 * p + 16));
    for (int i = 0; i < MR; ++i) {
      const std::int8_t* a = a0[i] + 32 * g + 64 * p;
      h[i][p] = _mm256_hadd_epi32(MOEKIT_I8_NAME(sdot)(c0, MOEKIT_I8_NAME(load256)(a)),
                                  MOEKIT_I8_NAME(sdot)(c1, MOEKIT_I8_NAME(load256)(a + 32)));
    }
  }
  const __m256i scale = _mm256_load_si256(reinterpret_cast<const __m256i*>(ls));
  for (int i = 0; i < MR; ++i) {
    const __m256i sums = MOEKIT_I8_NAME(group_sums8)<1>(h[i]);
    S[i] = _mm256_mullo_epi32(sums, scale);
  }
  ws = _mm256_set1_ps(MOEKIT_I8_NAME(half)(b));
  wb = _mm256_setzero_ps();
}

// q2_K: 2-bit codes (u8 0..3) times the activations by `vpmaddubsw`, each 16's pair sums times
// their 4-bit scale by `vpmaddwd` (S); the 4-bit mins times the rows' sums of 16 activations
// (QuantA::qsum16, computed once per call, not per row of B) by one `vpmaddwd` per block (Mn,
// lane j group j); ws = d, wm = −dmin.
template <int MR>
MOEKIT_I8_ATTR inline void MOEKIT_I8_NAME(chunk_q2k)(const QuantA& qa, std::int64_t m, const std::uint8_t* row,
                                                     std::int64_t g, const std::int8_t* const (&a0)[MR],
                                                     __m256i (&S)[MR], __m256i (&Mn)[MR], __m256& ws, __m256& wm) {
  const std::uint8_t* b = row + g / 8 * formats::q2_k::Type::kBytes;
  const __m256i low2 = _mm256_set1_epi8(3);
  __m256i x[8][MR];
  for (int n = 0; n < 2; ++n) {
    const __m256i q = MOEKIT_I8_NAME(load256)(b + 16 + 32 * n);
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * n + s;  // the group within the block; scales 2j, 2j + 1
      const __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2);
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(b[2 * j + 1] & 0xF)),
                                             _mm_set1_epi16(static_cast<short>(b[2 * j] & 0xF)));
      for (int i = 0; i < MR; ++i)
        x[j][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(c, MOEKIT_I8_NAME(load256)(a0[i] + 32 * (g + j))), scale);
    }
  }
  MOEKIT_I8_NAME(sums8)<MR>(x, S);
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
  for (int i = 0; i < MR; ++i) {
    const auto* sums = qa.qsum16.data() + (m + i) * (qa.K / 16) + 2 * g;  // group g's first 16
    Mn[i] = _mm256_madd_epi16(mins, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  }
  ws = _mm256_set1_ps(MOEKIT_I8_NAME(half)(b + 80));
  wm = _mm256_set1_ps(-MOEKIT_I8_NAME(half)(b + 82));
}

// MR (1 or 2) rows of A from row m against one row of B (`row`, T's blocks).
template <class T, int MR>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(ggml_row_dot)(const QuantA& qa, std::int64_t m, const std::uint8_t* row,
                                                 float* out) {
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
      MOEKIT_I8_NAME(chunk32)<T, MR>(qa, m, row, g, qa.groups, a, S, ws, wb);
    } else if constexpr (Tr::kMin16) {
      MOEKIT_I8_NAME(chunk_q2k)<MR>(qa, m, row, g, a, S, Mn, ws, wb);  // wb: wm
    } else {
      MOEKIT_I8_NAME(chunk_k)<MR>(T{}, qa, m, row, g, a, S, ws, wb);
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
  for (int i = 0; i < MR; ++i) out[i] = MOEKIT_I8_NAME(reduce8)(Tr::kAdd ? _mm256_add_ps(acc[i], bacc[i]) : acc[i]);
}

// Every row of A (at most kInt8MaxRows) against B's rows [0, N), B's rows in address order, A's
// rows two at a time against each.
template <class T>
MOEKIT_I8_ATTR void MOEKIT_I8_NAME(ggml_rows)(const QuantA& qa, const WeightMatrix& B, const Output& C, std::int64_t M,
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
      MOEKIT_I8_NAME(ggml_row_dot)<T, 2>(qa, m, row, out);
      store(C, m, n, out[0]);
      store(C, m + 1, n, out[1]);
    }
    if (m < M) {
      MOEKIT_I8_NAME(ggml_row_dot)<T, 1>(qa, m, row, out);
      store(C, m, n, out[0]);
    }
  }
}
