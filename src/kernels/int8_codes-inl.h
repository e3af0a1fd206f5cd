// The small pieces every int8 kernel of one instruction set uses (int8_rows.cpp, int8_panels.cpp,
// formats/ggml_decode.cpp): lane reductions, `dot4` (the u8 × int8 products of a lane: `vpdpbusd`
// with VNNI, `vpmaddubsw` + `vpmaddwd` with AVX2), the eight groups' sums, and a ggml block's codes
// in a register (its nibbles, fifth bits, table, q8_0's bytes, q4_K's and q5_K's sub-blocks).
//   MOEKIT_I8_ATTR  the functions' target attribute
//   MOEKIT_I8_VNNI  1: AVX512-VNNI
// No include guard: included once per instruction set, on purpose.

// The 8 lanes of v summed pairwise in a fixed order.
MOEKIT_I8_ATTR inline float reduce8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

MOEKIT_I8_ATTR inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// isum plus, in each int32 lane, the four products of its bytes: u (u8) times a (int8). VNNI:
// `vpdpbusd`; AVX2: `vpmaddubsw` + `vpmaddwd`, whose int16 pair sums are exact only for small u
// (4-bit codes: affine ≤ 15, signed w + c ≤ 24), the only ones it is given.
MOEKIT_I8_ATTR inline __m256i dot4(__m256i isum, __m256i u, __m256i a) {
#if MOEKIT_I8_VNNI
  return _mm256_dpbusd_epi32(isum, u, a);
#else
  return _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)));
#endif
}

// Eight groups' exact int32 sums in order, as one vector, from the lane vectors of the units
// that hold them (each lane a partial sum of one group), paired by `vphaddd`: h[p] = hadd(unit
// 2p, unit 2p + 1). kSub groups per unit: 1 (8 units; a unit's 8 lanes one group), 2 (4 units;
// lanes 0-3 the first group, 4-7 the second: a 64-chunk of groups of 32) or 4 (2 units; lanes
// {0, 1}, {2, 3}, {4, 5}, {6, 7}: groups of 16).
template <int kSub>
MOEKIT_I8_ATTR inline __m256i group_sums8(const __m256i (&h)[4]) {
  if constexpr (kSub == 1) {
    // t0's 128-bit halves: groups 0-3's sums of lanes 0-3 and of lanes 4-7; t1: groups 4-7's.
    const __m256i t0 = _mm256_hadd_epi32(h[0], h[1]), t1 = _mm256_hadd_epi32(h[2], h[3]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
  } else if constexpr (kSub == 2) {
    // t: groups 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high one.
    const __m256i t = _mm256_hadd_epi32(h[0], h[1]);
    const __m128i even = _mm256_castsi256_si128(t), odd = _mm256_extracti128_si256(t, 1);
    return _mm256_set_m128i(_mm_unpackhi_epi32(even, odd), _mm_unpacklo_epi32(even, odd));
  } else {
    // h[0]: groups 0, 1, 4, 5 in the low half, 2, 3, 6, 7 in the high one.
    return _mm256_permute4x64_epi64(h[0], 0xD8);
  }
}

// The f16 at p, widened (exact; `vcvtph2ps`, where ggml::half calls out of line).
MOEKIT_I8_ATTR inline float half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 signed codes times 32 activations: 8 int32 lanes, lane l the sum of elements 4l .. 4l + 3.
MOEKIT_I8_ATTR inline __m256i sdot(__m256i w, __m256i a) {
  return dot4(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

// A 32-block's 16 bytes of nibbles as 32 codes in element order (byte j: element j low, j + 16
// high).
MOEKIT_I8_ATTR inline __m256i nibbles32(const std::uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

// The fifth bits of a q5 block (`qh`, 32 bits: bit j for element j) as 0x10 in byte j.
MOEKIT_I8_ATTR inline __m256i fifth_bits(const std::uint8_t* qh) {
  std::uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}

// A nibble table (16 int8 values) applied to 32 codes.
MOEKIT_I8_ATTR inline __m256i lookup(const std::int8_t* table, __m256i codes) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm256_shuffle_epi8(t, codes);
}

// A nibble type's (NibblePairs) split nibbles as its codes: through its table where it has one.
template <class T>
MOEKIT_I8_ATTR inline __m256i nibble_codes(__m256i nibbles) {
  if constexpr (NibblePairs<T>::kHasTable) {
    return lookup(NibblePairs<T>::kTable, nibbles);
  } else {
    return nibbles;
  }
}

// The 32 codes of a 32-block type's block `b` in element order (GgmlInt8<T>::kSigned: int8
// values, else u8 ≤ 31). q4_0, q4_1, iq4_nl and MXFP4 from NibblePairs (MXFP4's table gives
// twice the e2m1 value plus 12); q5_0, q5_1 and q8_0 below.
template <class T, std::enable_if_t<NibblePairs<T>::kYes, int> = 0>
MOEKIT_I8_ATTR inline __m256i codes32(T, const std::uint8_t* b) {
  return nibble_codes<T>(nibbles32(b + NibblePairs<T>::kQs));
}
MOEKIT_I8_ATTR inline __m256i codes32(formats::q5_0::Type, const std::uint8_t* b) {
  return _mm256_or_si256(nibbles32(b + 6), fifth_bits(b + 2));
}
MOEKIT_I8_ATTR inline __m256i codes32(formats::q5_1::Type, const std::uint8_t* b) {
  return _mm256_or_si256(nibbles32(b + 8), fifth_bits(b + 4));
}
MOEKIT_I8_ATTR inline __m256i codes32(formats::q8_0::Type, const std::uint8_t* b) { return load256(b + 2); }

// q4_K / q5_K block b's sub-blocks 2p and 2p + 1 as codes: the low and high nibbles of 32 bytes
// (q5_K: plus the fifth bits, bits 2p and 2p + 1 of its 32 qh bytes, as 16).
template <bool kFifth>
MOEKIT_I8_ATTR inline void k45_codes(const std::uint8_t* b, int p, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i v = load256(b + (kFifth ? 48 : 16) + 32 * p);
  lo = _mm256_and_si256(v, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  if constexpr (kFifth) {
    const __m256i qh = load256(b + 16);
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
  }
}
