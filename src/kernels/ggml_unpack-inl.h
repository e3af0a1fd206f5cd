// ggml's block types in vectors, per block: its u8 codes and per-group float terms (unpack), the
// panel kernel's facts of a type (Traits), and the exact mode's decode built on them (dequant:
// formats/ggml_decode.cpp). Included once per instruction set after int8_codes-inl.h, inside
// namespace avx2 or vnni (int8_panels.cpp, formats/ggml_decode.cpp); ggml_panel-inl.h
// says how the panel kernel uses the codes and terms.
// No include guard: included twice, on purpose.

// Rows of B per panel: one register of 4-input dwords.
constexpr int kW = MOEKIT_I8_VNNI ? 16 : 8;

// What the panel needs of a type: its group of inputs per scale (16 for the K-quants with a
// scale per 16 weights), the offset in its u8 codes, whether it has a bias term.
template <class T>
struct Traits {
  static constexpr bool kPer16 = T::kInt8Facts.per16;
  static constexpr int kG = kPer16 ? 16 : 32;
  static constexpr int kOff = T::kInt8Facts.panel_offset;
  static constexpr bool kBias = T::kInt8Facts.bias || T::kInt8Facts.min16;
  // Groups sharing one activation scale (A's scale per block: 256 inputs for the K-quants, q8_K's;
  // a 32-block type's group is its block): with more than one the tile applies d once per block.
  static constexpr int kSb = T::kBlock / kG;
  // The 32-block types whose codes are bytes or a nibble pair (q8_0, q4_0, q4_1, iq4_nl, MXFP4),
  // which pack takes straight from the rows at both widths (direct32), and where their code bytes
  // start in the block.
  static constexpr bool kDirect32 = T::kBlock == 32 && (T::kInt8Facts.byte_codes || NibblePairs<T>::kYes);
  static constexpr int kCodesAt = T::kInt8Facts.codes_at;
  // Whether pack takes its blocks straight from the kW rows rather than a row at a time through
  // the stage: those types; q4_K and q6_K with VNNI (direct), q4_K and q5_K with AVX2 (direct_k45).
  static constexpr bool kDirect =
      kDirect32 || (MOEKIT_I8_VNNI && T::kInt8Facts.direct_vnni) || (!MOEKIT_I8_VNNI && T::kInt8Facts.k45);
  // Whether the panel keeps the packed nibbles as stored (q4_K with VNNI: a dword's low nibbles
  // are 4 inputs of a sub-block, its high nibbles the same 4 of the next one), split in the tile:
  // half the bytes stored by the pack and read by the tiles, and a panel that stays in L1.
  static constexpr bool kNibbles = MOEKIT_I8_VNNI && T::kInt8Facts.k45 && T::kBits == 4;
  // The largest u8 code (AVX2's int16 budget): the signed types' |q| (their offset of 128).
  static constexpr int kMaxCode = T::kInt8Facts.max_code;
  // Per group, how many vpmaddubsw results (pairs, each ≤ 2 · kMaxCode · 127) are added in int16
  // before they widen: the most that cannot reach 32767, a power of two dividing kG / 4.
  static constexpr int kSum16 = [] {
    int n = 1;
    while (2 * n <= kG / 4 && 2 * n * 2 * kMaxCode * 127 <= 32767) n *= 2;
    return n;
  }();
};

MOEKIT_I8_ATTR inline void put(std::uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// Lines of B's next two panels each tile fetches per group of inputs (docs/performance.md).
constexpr int kPrefetchLines = 4;

// Eight u8 as floats.
MOEKIT_I8_ATTR inline __m256 widen8(const std::uint8_t* v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v))));
}

// A 32-block type's terms: ws its f16 scale (MXFP4: its e8m0), wb its f16 bias where it has one.
template <class T>
MOEKIT_I8_ATTR inline void terms32(T, const std::uint8_t* b, float* ws, float* wb) {
  if constexpr (T::kInt8Facts.e8m0_scale) {
    *ws = T::Scale(b[0]);
  } else {
    *ws = half(b);
  }
  if constexpr (Traits<T>::kBias) *wb = half(b + 2);
}

// One block of T as kBlock u8 codes and its kBlock / kG terms ws, wb.
template <class T>
MOEKIT_I8_ATTR inline void unpack(T, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  static_assert(T::kBlock == 32, "the 32-block types; the K-quants have their own");
  __m256i c = codes32(T{}, b);
  if constexpr (GgmlInt8<T>::kSigned) c = _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80)));
  put(u, c);
  terms32(T{}, b, ws, wb);
}

// q4_K's and q5_K's eight terms: ws = d · scale, wb = −dmin · min.
MOEKIT_I8_ATTR inline void k45_terms(const std::uint8_t* b, float* ws, float* wb) {
  alignas(8) std::uint8_t sc[8], m[8];
  formats::ggml::scales_mins_k4(b + 4, sc, m);
  _mm256_storeu_ps(ws, _mm256_mul_ps(_mm256_set1_ps(half(b)), widen8(sc)));
  _mm256_storeu_ps(wb, _mm256_mul_ps(_mm256_set1_ps(-half(b + 2)), widen8(m)));  // −(dmin · m)
}

#if MOEKIT_I8_VNNI
// k45_terms for 16 rows at once, straight into the panel's [group][16 rows] layout: the blocks'
// first 16 bytes (d, dmin, the 12 bytes of scales and mins) gathered a dword per row, the 6-bit
// fields taken apart lane by lane (ggml::scales_mins_k4's steps). Rows outside `live` give 0.
MOEKIT_I8_ATTR inline void k45_terms16(const std::uint8_t* b, __m512i at, __mmask16 live, float* ws, float* wb) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i h = _mm512_mask_i32gather_epi32(zero, live, at, b, 1);
  const __m512i u0 = _mm512_mask_i32gather_epi32(zero, live, at, b + 4, 1);
  const __m512i u1 = _mm512_mask_i32gather_epi32(zero, live, at, b + 8, 1);
  const __m512i u2 = _mm512_mask_i32gather_epi32(zero, live, at, b + 12, 1);
  const __m512i low6 = _mm512_set1_epi32(0x3F3F3F3F), low4 = _mm512_set1_epi32(0x0F0F0F0F);
  const __m512i top2 = _mm512_set1_epi32(0x03030303);
  const __m512i sc[2] = {_mm512_and_si512(u0, low6),
                         _mm512_or_si512(_mm512_and_si512(u2, low4),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), top2), 4))};
  const __m512i mn[2] = {_mm512_and_si512(u1, low6),
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), low4),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), top2), 4))};
  const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
  const __m512 nd =
      _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))));
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int j = 0; j < 8; ++j) {
    const int shift = 8 * (j % 4);
    const __m512 s = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(sc[j / 4], shift), byte));
    const __m512 m = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(mn[j / 4], shift), byte));
    _mm512_storeu_ps(ws + 16 * j, _mm512_mul_ps(d, s));
    _mm512_storeu_ps(wb + 16 * j, _mm512_mul_ps(nd, m));  // −(dmin · m)
  }
}

#endif

// q4_K / q5_K: the codes as the row kernel takes them (k45_codes), ws = d · scale, wb = −dmin · min.
template <bool kFifth>
MOEKIT_I8_ATTR inline void unpack_k45(const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  for (int p = 0; p < 4; ++p) {
    __m256i lo, hi;
    k45_codes<kFifth>(b, p, lo, hi);
    put(u + 64 * p, lo);
    put(u + 64 * p + 32, hi);
  }
  k45_terms(b, ws, wb);
}

MOEKIT_I8_ATTR inline void unpack(formats::q4_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  unpack_k45<false>(b, u, ws, wb);
}
MOEKIT_I8_ATTR inline void unpack(formats::q5_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  unpack_k45<true>(b, u, ws, wb);
}

// q6_K: 6-bit codes (offset 32), an int8 scale per 16: ws = d · scale.
MOEKIT_I8_ATTR inline void unpack(formats::q6_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float*) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32);
    const __m256i qh = load256(b + 128 + 32 * n);
    std::uint8_t* o = u + 128 * n;
    put(o, _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4)));
    put(o + 32, _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4)));
    put(o + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4)));
    put(o + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4)));
  }
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int h = 0; h < 16; ++h) ws[h] = d * static_cast<float>(sc[h]);
}

// q3_K: codes 2 low bits + 4 · the hmask bit (offset 4), scales per 16 minus 32: ws = d · scale.
MOEKIT_I8_ATTR inline void unpack(formats::q3_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float*) {
  const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = load256(b);
  for (int n = 0; n < 2; ++n) {
    const __m256i qs = load256(b + 32 + 32 * n);
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * n + t;  // hmask bit j
      const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), low2);
      const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, j), one), 2);
      put(u + 32 * j, _mm256_or_si256(low, high));
    }
  }
  std::int8_t sc[16];
  formats::q3_k::Type::Scales(b, sc);
  const float d = half(b + 108);
  for (int h = 0; h < 16; ++h) ws[h] = d * static_cast<float>(sc[h] - 32);
}

// q2_K: 2-bit codes, a 4-bit scale and min per 16: ws = d · scale, wb = −dmin · min.
MOEKIT_I8_ATTR inline void unpack(formats::q2_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  const __m256i low2 = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i q = load256(b + 16 + 32 * n);
    for (int s = 0; s < 4; ++s) put(u + 128 * n + 32 * s, _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2));
  }
  const float d = half(b + 80), dmin = half(b + 82);
  for (int h = 0; h < 16; ++h) {
    ws[h] = d * static_cast<float>(b[h] & 0xF);
    wb[h] = -(dmin * static_cast<float>(b[h] >> 4));
  }
}

// iq4_xs: iq4_nl's values (offset 128) per 32, a 6-bit scale minus 32 each: ws = d · scale.
MOEKIT_I8_ATTR inline void unpack(formats::iq4_xs::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float*) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < 8; ++j)
    put(u + 32 * j, _mm256_xor_si256(lookup(formats::ggml::kIq4Values, nibbles32(b + 8 + 16 * j)), flip));
  std::uint16_t high;
  std::memcpy(&high, b + 2, 2);
  const float d = half(b);
  for (int j = 0; j < 8; ++j)
    ws[j] = d * static_cast<float>((((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((high >> (2 * j)) & 3) << 4)) - 32);
}

// kW float (F) and int32 (I) lanes: the few operations the tiles' float steps, their output
// rows and the exact decode take, at this include's width, so both widths share those steps
// (dequant, tile_start, group_step, tile_end, store_row).
struct Vec {
#if MOEKIT_I8_VNNI
  using F = __m512;
  using I = __m512i;
  MOEKIT_I8_ATTR static F zero() { return _mm512_setzero_ps(); }
  MOEKIT_I8_ATTR static F set1(float v) { return _mm512_set1_ps(v); }
  MOEKIT_I8_ATTR static I set1(std::int32_t v) { return _mm512_set1_epi32(v); }
  MOEKIT_I8_ATTR static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  MOEKIT_I8_ATTR static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  MOEKIT_I8_ATTR static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  MOEKIT_I8_ATTR static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  MOEKIT_I8_ATTR static F load(const float* p) { return _mm512_loadu_ps(p); }
  MOEKIT_I8_ATTR static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  MOEKIT_I8_ATTR static F add(F a, F b) { return _mm512_add_ps(a, b); }
  MOEKIT_I8_ATTR static I widen(const std::uint8_t* p) {  // kW u8 as int32
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // The first n ≤ kW lanes, the others 0 (not read) / not written.
  MOEKIT_I8_ATTR static __mmask16 first(std::int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  MOEKIT_I8_ATTR static F load_n(const float* p, std::int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  MOEKIT_I8_ATTR static void store_n(float* p, F v, std::int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }
#else
  using F = __m256;
  using I = __m256i;
  MOEKIT_I8_ATTR static F zero() { return _mm256_setzero_ps(); }
  MOEKIT_I8_ATTR static F set1(float v) { return _mm256_set1_ps(v); }
  MOEKIT_I8_ATTR static I set1(std::int32_t v) { return _mm256_set1_epi32(v); }
  MOEKIT_I8_ATTR static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  MOEKIT_I8_ATTR static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  MOEKIT_I8_ATTR static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  MOEKIT_I8_ATTR static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  MOEKIT_I8_ATTR static F load(const float* p) { return _mm256_loadu_ps(p); }
  MOEKIT_I8_ATTR static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  MOEKIT_I8_ATTR static F add(F a, F b) { return _mm256_add_ps(a, b); }
  MOEKIT_I8_ATTR static I widen(const std::uint8_t* p) {  // kW u8 as int32
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // The first n ≤ kW lanes, the others 0 (not read) / not written.
  MOEKIT_I8_ATTR static I first(std::int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  MOEKIT_I8_ATTR static F load_n(const float* p, std::int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  MOEKIT_I8_ATTR static void store_n(float* p, F v, std::int64_t n) { _mm256_maskstore_ps(p, first(n), v); }
#endif
};

// The exact mode's decode of `blocks` blocks of one row into y (detail::ggml_dequant_rows): each
// block unpacked as for a panel, then per group w = ws · float(u − off) (+ wb), kW weights a step:
// ggml's dequantize_row_* rounds the same product and sum (its scale · code, minus its min), with
// ws and wb the same f32 products of the block's fields (unpack's terms), so the same bits.
template <class T>
MOEKIT_I8_ATTR void dequant(const std::uint8_t* row, std::int64_t blocks, float* y) {
  using Tr = Traits<T>;
  constexpr int kG = Tr::kG, kGroups = T::kBlock / kG;
  alignas(32) std::uint8_t u[T::kBlock];
  alignas(32) float ws[kGroups < 8 ? 8 : kGroups], wb[kGroups < 8 ? 8 : kGroups];
  for (std::int64_t blk = 0; blk < blocks; ++blk, y += T::kBlock) {
    unpack(T{}, row + blk * T::kBytes, u, ws, wb);
    for (int g = 0; g < kGroups; ++g)
      for (int k = g * kG; k < g * kG + kG; k += kW) {
        Vec::F w = Vec::mul(Vec::cvt(Vec::sub(Vec::widen(u + k), Vec::set1(Tr::kOff))), Vec::set1(ws[g]));
        if constexpr (Tr::kBias) w = Vec::add(w, Vec::set1(wb[g]));
        Vec::store(y + k, w);
      }
  }
}
