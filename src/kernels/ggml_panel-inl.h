// The int8 fast mode on ggml's block types for many rows of A (prefill): the panel kernel.
// gemm_affine_int8.cpp includes it twice, after ggml_int8-inl.h (whose per-type code helpers it
// uses): inside namespace panel_avx2 in its AVX2 section and inside namespace panel_vnni in its
// AVX512-VNNI section. `Rows` (A's side) is the file's own, shared by both.
//
// Per kW rows of B (16 with VNNI, 8 with AVX2): each block is turned once into u8 codes and
// per-group float terms, the kW rows' codes transposed into a panel — 4 inputs × kW rows per
// 4 · kW bytes, the layout `vpdpbusd` (VNNI) or `vpmaddubsw` (AVX2) multiplies one register of —
// and then every row of A (its int8 codes broadcast 4 at a time) runs over the panel, 12 (AVX2:
// 4) rows at once. So a block is decoded once per call, not once per row or two of A as in the
// row kernel. With VNNI, q4_K and q6_K go straight from the 16 rows into the panel (their packed
// bytes transposed — q4_K's nibbles then kept packed, split in the tile; q6_K's split at once —
// their scales gathered for 16 rows at once); with AVX2 q4_K and q5_K (their nibbles transposed
// as stored, then split 8 rows at a time). At both widths so do the 32-block types whose codes
// are bytes or a nibble pair (q8_0, q4_0, q4_1, iq4_nl, MXFP4: their code bytes transposed as
// stored, then made codes kW rows at a time). Other blocks are unpacked a row at a time into a
// stage, then transposed. Per row m and group g of kG inputs
// (Traits<T>::kG, 32 or 16):
//   t   = Σ_k u_k · a_k                              (exact int32, u the u8 code)
//   acc = fma(float(t − off·Σa), ws · d[m,g], acc)   (off: the codes' shift into u8)
//   acc = fma(wb, d[m,g]·Σa, acc)                     (types with a min or bias)
// the weights being w = ws · (u − off) + wb per group: the integer form of ggml_common.hpp with
// the sub-block scale folded into ws (an f16 times a small integer: exact in f32). AVX2's
// `vpmaddubsw` sums pairs of products in int16 with saturation, so there the signed types (codes
// up to 255 with their offset of 128) multiply |q| by a carrying q's sign, which is t − off·Σa
// directly; every other type's products are added in int16 only as many times as cannot
// saturate (Traits::kSum16). Both give the same exact t, so the two widths give the same bits.
// The error bound is the row kernel's (docs/numerics.md); the bits are not the row kernel's (the
// sums run in another order), which is why the choice of kernel is made on the whole call.
// No include guard: included twice, on purpose (above).

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
    *ws = MOEKIT_I8_NAME(half)(b);
  }
  if constexpr (Traits<T>::kBias) *wb = MOEKIT_I8_NAME(half)(b + 2);
}

// One block of T as kBlock u8 codes and its kBlock / kG terms ws, wb.
template <class T>
MOEKIT_I8_ATTR inline void unpack(T, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  static_assert(T::kBlock == 32, "the 32-block types; the K-quants have their own");
  __m256i c = MOEKIT_I8_NAME(codes32)(T{}, b);
  if constexpr (GgmlInt8<T>::kSigned) c = _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80)));
  put(u, c);
  terms32(T{}, b, ws, wb);
}

// q4_K's and q5_K's eight terms: ws = d · scale, wb = −dmin · min.
MOEKIT_I8_ATTR inline void k45_terms(const std::uint8_t* b, float* ws, float* wb) {
  alignas(8) std::uint8_t sc[8], m[8];
  formats::ggml::scales_mins_k4(b + 4, sc, m);
  _mm256_storeu_ps(ws, _mm256_mul_ps(_mm256_set1_ps(MOEKIT_I8_NAME(half)(b)), widen8(sc)));
  _mm256_storeu_ps(wb, _mm256_mul_ps(_mm256_set1_ps(-MOEKIT_I8_NAME(half)(b + 2)), widen8(m)));  // −(dmin · m)
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
    MOEKIT_I8_NAME(k45_codes)<kFifth>(b, p, lo, hi);
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
    const __m256i l0 = MOEKIT_I8_NAME(load256)(b + 64 * n), l1 = MOEKIT_I8_NAME(load256)(b + 64 * n + 32);
    const __m256i qh = MOEKIT_I8_NAME(load256)(b + 128 + 32 * n);
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
  const float d = MOEKIT_I8_NAME(half)(b + 208);
  for (int h = 0; h < 16; ++h) ws[h] = d * static_cast<float>(sc[h]);
}

// q3_K: codes 2 low bits + 4 · the hmask bit (offset 4), scales per 16 minus 32: ws = d · scale.
MOEKIT_I8_ATTR inline void unpack(formats::q3_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float*) {
  const __m256i low2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = MOEKIT_I8_NAME(load256)(b);
  for (int n = 0; n < 2; ++n) {
    const __m256i qs = MOEKIT_I8_NAME(load256)(b + 32 + 32 * n);
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * n + t;  // hmask bit j
      const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * t), low2);
      const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, j), one), 2);
      put(u + 32 * j, _mm256_or_si256(low, high));
    }
  }
  std::int8_t sc[16];
  formats::q3_k::Type::Scales(b, sc);
  const float d = MOEKIT_I8_NAME(half)(b + 108);
  for (int h = 0; h < 16; ++h) ws[h] = d * static_cast<float>(sc[h] - 32);
}

// q2_K: 2-bit codes, a 4-bit scale and min per 16: ws = d · scale, wb = −dmin · min.
MOEKIT_I8_ATTR inline void unpack(formats::q2_k::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float* wb) {
  const __m256i low2 = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i q = MOEKIT_I8_NAME(load256)(b + 16 + 32 * n);
    for (int s = 0; s < 4; ++s) put(u + 128 * n + 32 * s, _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), low2));
  }
  const float d = MOEKIT_I8_NAME(half)(b + 80), dmin = MOEKIT_I8_NAME(half)(b + 82);
  for (int h = 0; h < 16; ++h) {
    ws[h] = d * static_cast<float>(b[h] & 0xF);
    wb[h] = -(dmin * static_cast<float>(b[h] >> 4));
  }
}

// iq4_xs: iq4_nl's values (offset 128) per 32, a 6-bit scale minus 32 each: ws = d · scale.
MOEKIT_I8_ATTR inline void unpack(formats::iq4_xs::Type, const std::uint8_t* b, std::uint8_t* u, float* ws, float*) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < 8; ++j)
    put(u + 32 * j,
        _mm256_xor_si256(MOEKIT_I8_NAME(lookup)(formats::ggml::kIq4Values, MOEKIT_I8_NAME(nibbles32)(b + 8 + 16 * j)),
                         flip));
  std::uint16_t high;
  std::memcpy(&high, b + 2, 2);
  const float d = MOEKIT_I8_NAME(half)(b);
  for (int j = 0; j < 8; ++j)
    ws[j] = d * static_cast<float>((((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((high >> (2 * j)) & 3) << 4)) - 32);
}

// Rows of B decoded for one panel, before the transpose: kW rows of u8 codes (row r at r · Kp,
// inputs past K zero) and of terms (row r at r · gp, gp the groups rounded up to 16), rows past
// the matrix zero.
struct Stage {
  std::vector<std::uint8_t> codes;
  std::vector<float> ws, wb;
};

// The panel: codes as [K / 4][kW rows][4 inputs], terms as [groups][kW rows].
struct Panel {
  std::vector<std::uint8_t> codes;
  std::vector<float> ws, wb;
};

#if MOEKIT_I8_VNNI
// 16 rows of 16 dwords transposed in registers: afterwards v[j] holds dword j of rows 0 .. 15.
MOEKIT_I8_ATTR inline void transpose16(__m512i (&v)[16]) {
  __m512i w[16];
  for (int r = 0; r < 16; r += 2) {
    w[r] = _mm512_unpacklo_epi32(v[r], v[r + 1]);
    w[r + 1] = _mm512_unpackhi_epi32(v[r], v[r + 1]);
  }
  for (int r = 0; r < 16; r += 4) {
    v[r] = _mm512_unpacklo_epi64(w[r], w[r + 2]);
    v[r + 1] = _mm512_unpackhi_epi64(w[r], w[r + 2]);
    v[r + 2] = _mm512_unpacklo_epi64(w[r + 1], w[r + 3]);
    v[r + 3] = _mm512_unpackhi_epi64(w[r + 1], w[r + 3]);
  }
  // v[4q + c], 128-bit lane L: rows 4q .. 4q + 3 of dword 4L + c. Two rounds of lane shuffles
  // gather lane L of the four row groups: dword 4L + c of rows 0 .. 15.
  for (int q = 0; q < 4; q += 2)
    for (int c = 0; c < 4; ++c) {
      w[4 * q + c] = _mm512_shuffle_i32x4(v[4 * q + c], v[4 * q + 4 + c], 0x88);      // L0, L2 of two groups
      w[4 * q + 4 + c] = _mm512_shuffle_i32x4(v[4 * q + c], v[4 * q + 4 + c], 0xDD);  // L1, L3
    }
  for (int c = 0; c < 4; ++c) {
    v[0 + c] = _mm512_shuffle_i32x4(w[c], w[8 + c], 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(w[4 + c], w[12 + c], 0x88);
    v[8 + c] = _mm512_shuffle_i32x4(w[c], w[8 + c], 0xDD);
    v[12 + c] = _mm512_shuffle_i32x4(w[4 + c], w[12 + c], 0xDD);
  }
}

// kW rows of kW dwords (row r at src + r · stride bytes) transposed: dword j of row r to dst's
// dword j · kW + r.
MOEKIT_I8_ATTR inline void transpose_rows(const void* src, std::int64_t stride, void* dst) {
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  __m512i v[16];
  for (int r = 0; r < 16; ++r) v[r] = _mm512_loadu_si512(in + r * stride);
  transpose16(v);
  for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + j * 64, v[j]);
}

// q4_K's codes straight from the 16 rows into the panel (Traits::kNibbles), packed as stored:
// each 64 bytes of a block's nibbles (sub-blocks 4pp .. 4pp + 3) transposed as they are — dword
// j's low nibbles are quad j % 8 of sub-block 4pp + 2 (j / 8), its high nibbles the same quad of
// the next sub-block — so the panel's vector 8 · s + j holds quad j of sub-blocks 2s (low) and
// 2s + 1 (high) for 16 rows, 32 bytes per row and block: the block's own 128 bytes, in order.
MOEKIT_I8_ATTR inline void q4k_codes(const std::uint8_t* const (&row)[16], std::int64_t blk, std::uint8_t* codes) {
  for (int pp = 0; pp < 2; ++pp) {
    __m512i v[16];
    for (int r = 0; r < 16; ++r) v[r] = _mm512_loadu_si512(row[r] + blk * 144 + 16 + 64 * pp);
    transpose16(v);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(codes + (blk * 32 + 16 * pp + j) * 64, v[j]);
  }
}

// Block blk of 16 rows straight into the panel (Traits::kDirect): row[r] the rows (a zero row
// past the matrix), base + at[r] the same rows for gathers, `live` the rows that exist.
MOEKIT_I8_ATTR inline void direct(formats::q4_k::Type, const std::uint8_t* const (&row)[16], const std::uint8_t* base,
                                  __m512i at, __mmask16 live, std::int64_t blk, Panel& p) {
  q4k_codes(row, blk, p.codes.data());
  k45_terms16(base + blk * 144, at, live, p.ws.data() + 8 * blk * 16, p.wb.data() + 8 * blk * 16);
}

// Bits shift, shift + 1 of each byte of q, at bits 4 and 5 (q6_K's high bits).
MOEKIT_I8_ATTR inline __m512i q6k_high(__m512i q, int shift) {
  return _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(q, shift), _mm512_set1_epi8(3)), 4);
}

// q6_K: per half n of the block, ql's 64 bytes (l0 | l1) and qh's 32 transposed as they are
// (qh of both halves in one transpose); quad j of the four 32-element runs is then
//   (l0 & 15) | (qh & 3) << 4,  (l1 & 15) | (qh >> 2 & 3) << 4,
//   (l0 >> 4) | (qh >> 4 & 3) << 4,  (l1 >> 4) | (qh >> 6 & 3) << 4
// (ggml_q6_k.hpp's order); the 16 int8 scales and d gathered a dword per row (d as the top half
// of the block's last whole dword: no byte past the block is read), ws = d · scale.
MOEKIT_I8_ATTR inline void direct(formats::q6_k::Type, const std::uint8_t* const (&row)[16], const std::uint8_t* base,
                                  __m512i at, __mmask16 live, std::int64_t blk, Panel& p) {
  const std::int64_t off = blk * 210;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i h[16];
  for (int r = 0; r < 16; ++r) h[r] = _mm512_loadu_si512(row[r] + off + 128);
  transpose16(h);
  for (int n = 0; n < 2; ++n) {
    __m512i l[16];
    for (int r = 0; r < 16; ++r) l[r] = _mm512_loadu_si512(row[r] + off + 64 * n);
    transpose16(l);
    for (int j = 0; j < 8; ++j) {
      const __m512i l0 = l[j], l1 = l[8 + j], q = h[8 * n + j];
      std::uint8_t* c = p.codes.data() + (blk * 256 + 128 * n + 4 * j) * 16;  // quad j of run 0
      _mm512_storeu_si512(c, _mm512_or_si512(_mm512_and_si512(l0, low4), q6k_high(q, 0)));
      _mm512_storeu_si512(c + 32 * 16, _mm512_or_si512(_mm512_and_si512(l1, low4), q6k_high(q, 2)));
      _mm512_storeu_si512(c + 64 * 16,
                          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l0, 4), low4), q6k_high(q, 4)));
      _mm512_storeu_si512(c + 96 * 16,
                          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(l1, 4), low4), q6k_high(q, 6)));
    }
  }
  const __m512i zero = _mm512_setzero_si512();
  const std::uint8_t* b = base + off;
  const __m512 d = _mm512_cvtph_ps(
      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_i32gather_epi32(zero, live, at, b + 206, 1), 16)));
  float* ws = p.ws.data() + 16 * blk * 16;
  for (int w = 0; w < 4; ++w) {
    const __m512i sc = _mm512_mask_i32gather_epi32(zero, live, at, b + 192 + 4 * w, 1);
    for (int i = 0; i < 4; ++i) {  // scale 4w + i: byte i, sign-extended
      const __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(sc, 24 - 8 * i), 24);
      _mm512_storeu_ps(ws + 16 * (4 * w + i), _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
    }
  }
}

// A 32-block type's codes as unpack() makes them, from 16 rows' raw bytes at once: q8_0's bytes
// (moved into u8 by their offset of 128), or a nibble type's low and high nibbles through its
// table (NibblePairs). `v` holds one dword of 16 rows; the nibble types give two code dwords.
template <class T>
MOEKIT_I8_ATTR inline __m512i signed_to_u8(__m512i v) {
  return GgmlInt8<T>::kSigned ? _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))) : v;
}
template <class T>
MOEKIT_I8_ATTR inline __m512i nibble_codes16(__m512i nibbles) {
  if constexpr (NibblePairs<T>::kHasTable) {
    const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(NibblePairs<T>::kTable)));
    nibbles = _mm512_shuffle_epi8(t, nibbles);
  }
  return signed_to_u8<T>(nibbles);
}

// A 32-block type's per-block terms for 16 rows from a dword gathered at each block's start
// (rows outside `live` 0): ws the f16 scale (MXFP4: its e8m0, T::Scale's bits), wb the f16 bias
// of the types with one (their second half-word).
template <class T>
MOEKIT_I8_ATTR inline void terms32x16(__m512i h, __mmask16 live, float* ws, float* wb) {
  __m512 d;
  if constexpr (T::kInt8Facts.e8m0_scale) {
    const __m512i e = _mm512_and_si512(h, _mm512_set1_epi32(0xFF));
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);  // e < 2: subnormal
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 is_normal = _mm512_cmpge_epu32_mask(e, _mm512_set1_epi32(2));
    d = _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, small, normal));
  } else {
    d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
  }
  _mm512_storeu_ps(ws, _mm512_maskz_mov_ps(live, d));
  if constexpr (Traits<T>::kBias)
    _mm512_storeu_ps(wb, _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)))));
}

// Every block of 16 rows of a 32-block type straight into the panel (Traits::kDirect32): the rows'
// code bytes transposed as they are, a dword of each row per vector — q8_0's 32 bytes of two
// blocks per row, a nibble type's 16 bytes of four — then made codes on the 16 rows at once
// (a q8_0 dword is 4 inputs; a nibble dword i holds inputs 4i .. 4i + 3 low and 16 + 4i .. high),
// the terms gathered a dword per row and block. Blocks past the row's last read nothing.
template <class T>
MOEKIT_I8_ATTR inline void direct32(const std::uint8_t* const (&row)[16], const std::uint8_t* base, __m512i at,
                                    __mmask16 live, std::int64_t blocks, Panel& p) {
  constexpr bool kQ8 = T::kInt8Facts.byte_codes;
  constexpr int kPer = kQ8 ? 2 : 4;  // blocks per transpose
  constexpr int kQs = Traits<T>::kCodesAt;
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    terms32x16<T>(_mm512_mask_i32gather_epi32(zero, live, at, base + blk * T::kBytes, 1), live, p.ws.data() + blk * 16,
                  p.wb.data() + blk * 16);
  for (std::int64_t blk = 0; blk < blocks; blk += kPer) {
    const int n = static_cast<int>(std::min<std::int64_t>(kPer, blocks - blk));
    __m512i v[16];
    for (int r = 0; r < 16; ++r) {
      const std::uint8_t* b = row[r] + blk * T::kBytes + kQs;
      if constexpr (kQ8) {
        const __m256i hi = n > 1 ? MOEKIT_I8_NAME(load256)(b + T::kBytes) : _mm256_setzero_si256();
        v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(MOEKIT_I8_NAME(load256)(b)), hi, 1);
      } else {
        v[r] = _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
        for (int k = 1; k < n; ++k) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k * T::kBytes));
          v[r] = k == 1   ? _mm512_inserti32x4(v[r], q, 1)
                 : k == 2 ? _mm512_inserti32x4(v[r], q, 2)
                          : _mm512_inserti32x4(v[r], q, 3);
        }
      }
    }
    transpose16(v);
    std::uint8_t* c = p.codes.data() + blk * 8 * 64;  // step blk · 8: 4 inputs × 16 rows each
    if constexpr (kQ8) {
      for (int j = 0; j < 8 * n; ++j) _mm512_storeu_si512(c + j * 64, signed_to_u8<T>(v[j]));
    } else {
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      for (int j = 0; j < 4 * n; ++j) {  // block j / 4, dword i = j % 4
        std::uint8_t* s = c + (j / 4 * 8 + j % 4) * 64;
        _mm512_storeu_si512(s, nibble_codes16<T>(_mm512_and_si512(v[j], low4)));
        _mm512_storeu_si512(s + 4 * 64, nibble_codes16<T>(_mm512_and_si512(_mm512_srli_epi32(v[j], 4), low4)));
      }
    }
  }
}

#else
// 8 rows of 8 dwords transposed in registers: afterwards v[j] holds dword j of rows 0 .. 7.
MOEKIT_I8_ATTR inline void transpose8(__m256i (&v)[8]) {
  __m256i w[8];
  for (int r = 0; r < 8; r += 2) {
    w[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);
    w[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);
  }
  for (int r = 0; r < 8; r += 4) {
    v[r] = _mm256_unpacklo_epi64(w[r], w[r + 2]);
    v[r + 1] = _mm256_unpackhi_epi64(w[r], w[r + 2]);
    v[r + 2] = _mm256_unpacklo_epi64(w[r + 1], w[r + 3]);
    v[r + 3] = _mm256_unpackhi_epi64(w[r + 1], w[r + 3]);
  }
  // v[4q + c], 128-bit lane L: rows 4q .. 4q + 3 of dword 4L + c.
  for (int c = 0; c < 4; ++c) {
    w[c] = _mm256_permute2x128_si256(v[c], v[4 + c], 0x20);
    w[4 + c] = _mm256_permute2x128_si256(v[c], v[4 + c], 0x31);
  }
  for (int j = 0; j < 8; ++j) v[j] = w[j];
}

// kW rows of kW dwords (row r at src + r · stride bytes) transposed: dword j of row r to dst's
// dword j · kW + r.
MOEKIT_I8_ATTR inline void transpose_rows(const void* src, std::int64_t stride, void* dst) {
  const auto* in = static_cast<const char*>(src);
  auto* out = static_cast<char*>(dst);
  __m256i v[8];
  for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + r * stride));
  transpose8(v);
  for (int j = 0; j < 8; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * j), v[j]);
}

// A 32-block type's codes as unpack() makes them, from 8 rows' raw bytes at once (the VNNI
// section's signed_to_u8 and nibble_codes16 at this width).
template <class T>
MOEKIT_I8_ATTR inline __m256i signed_to_u8(__m256i v) {
  return GgmlInt8<T>::kSigned ? _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))) : v;
}
template <class T>
MOEKIT_I8_ATTR inline __m256i nibble_codes8(__m256i nibbles) {
  // (clang-format would space a macro-named template's call as a comparison.)
  // clang-format off
  return signed_to_u8<T>(MOEKIT_I8_NAME(nibble_codes)<T>(nibbles));
  // clang-format on
}

// q4_K's and q5_K's blocks of 8 rows straight into the panel (Traits::kDirect): each 32 bytes of
// nibbles (sub-blocks 2p and 2p + 1) transposed as stored, a dword of 8 rows per vector — its low
// nibbles quad j of sub-block 2p, its high ones quad j of 2p + 1 (k45_codes' order), q5_K's fifth
// bits from its 32 bytes of qh transposed alike — and each row's eight terms (k45_terms)
// transposed 8 × 8. row[r] the rows, a zero row past the matrix.
template <bool kFifth>
MOEKIT_I8_ATTR inline void direct_k45(const std::uint8_t* const (&row)[8], std::int64_t blocks, Panel& p) {
  constexpr int kBytes = kFifth ? formats::q5_k::Type::kBytes : formats::q4_k::Type::kBytes, kQs = kFifth ? 48 : 16;
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    __m256i qh[8];
    if constexpr (kFifth) {
      for (int r = 0; r < 8; ++r) qh[r] = MOEKIT_I8_NAME(load256)(row[r] + blk * kBytes + 16);
      transpose8(qh);
    }
    for (int pp = 0; pp < 4; ++pp) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = MOEKIT_I8_NAME(load256)(row[r] + blk * kBytes + kQs + 32 * pp);
      transpose8(v);
      std::uint8_t* c = p.codes.data() + (blk * 64 + 16 * pp) * 32;  // step of quad 0 of sub-block 2pp
      for (int j = 0; j < 8; ++j) {
        __m256i lo = _mm256_and_si256(v[j], low4), hi = _mm256_and_si256(_mm256_srli_epi16(v[j], 4), low4);
        if constexpr (kFifth) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[j], 2 * pp), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[j], 2 * pp + 1), one), 4));
        }
        put(c + j * 32, lo);
        put(c + (8 + j) * 32, hi);
      }
    }
    alignas(32) float ws[8][8], wb[8][8];
    for (int r = 0; r < 8; ++r) k45_terms(row[r] + blk * kBytes, ws[r], wb[r]);
    for (float(*t)[8] : {ws, wb}) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(t[r]));
      transpose8(v);
      float* out = (t == ws ? p.ws.data() : p.wb.data()) + blk * 8 * 8;  // groups blk · 8 .. + 7
      for (int j = 0; j < 8; ++j) put(reinterpret_cast<std::uint8_t*>(out + 8 * j), v[j]);
    }
  }
}

// Every block of 8 rows of a 32-block type straight into the panel (Traits::kDirect32): the
// rows' code bytes transposed as they are — q8_0's 32 bytes of a block per row, a nibble type's
// 16 bytes of two — then made codes on the 8 rows at once (as the VNNI direct32), the terms
// read a row at a time (unpack's). row[r] the rows, a zero row past the matrix (whose terms are
// then 0 as the stage's).
template <class T>
MOEKIT_I8_ATTR inline void direct32(const std::uint8_t* const (&row)[8], std::int64_t rows, std::int64_t blocks,
                                    Panel& p) {
  constexpr bool kQ8 = T::kInt8Facts.byte_codes;
  constexpr int kPer = kQ8 ? 1 : 2;  // blocks per transpose
  constexpr int kQs = Traits<T>::kCodesAt;
  for (std::int64_t blk = 0; blk < blocks; ++blk)
    for (std::int64_t r = 0; r < 8; ++r) {
      float* ws = p.ws.data() + blk * 8 + r;
      float* wb = p.wb.data() + blk * 8 + r;
      if (r >= rows) {
        *ws = *wb = 0.0f;
        continue;
      }
      *wb = 0.0f;
      terms32(T{}, row[r] + blk * T::kBytes, ws, wb);
    }
  for (std::int64_t blk = 0; blk < blocks; blk += kPer) {
    const int n = static_cast<int>(std::min<std::int64_t>(kPer, blocks - blk));
    __m256i v[8];
    for (int r = 0; r < 8; ++r) {
      const std::uint8_t* b = row[r] + blk * T::kBytes + kQs;
      if constexpr (kQ8) {
        v[r] = MOEKIT_I8_NAME(load256)(b);
      } else {
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
        v[r] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(lo),
            n > 1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + T::kBytes)) : _mm_setzero_si128(), 1);
      }
    }
    transpose8(v);
    std::uint8_t* c = p.codes.data() + blk * 8 * 32;  // step blk · 8: 4 inputs × 8 rows each
    if constexpr (kQ8) {
      for (int j = 0; j < 8; ++j) put(c + j * 32, signed_to_u8<T>(v[j]));
    } else {
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int j = 0; j < 4 * n; ++j) {  // block j / 4, dword i = j % 4
        std::uint8_t* s = c + (j / 4 * 8 + j % 4) * 32;
        put(s, nibble_codes8<T>(_mm256_and_si256(v[j], low4)));
        put(s + 4 * 32, nibble_codes8<T>(_mm256_and_si256(_mm256_srli_epi32(v[j], 4), low4)));
      }
    }
  }
}
#endif

// Rows [n0, n0 + rows) of B (rows ≤ kW) into `p`: straight from the rows (Traits::kDirect; with
// VNNI while 15 row strides fit the gathers' int32 offsets), else each row's blocks unpacked into
// the stage, then codes and terms transposed kW × kW dwords at a time.
template <class T>
MOEKIT_I8_ATTR void pack(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, Stage& s,
                         Panel& p) {
  constexpr int kG = Traits<T>::kG;
  const std::int64_t groups = K / kG, blocks = K / T::kBlock;
  const std::int64_t Kp = (K + 63) / 64 * 64, gp = (groups + 15) / 16 * 16;
  p.codes.resize(static_cast<std::size_t>(kW * Kp));
  p.ws.resize(static_cast<std::size_t>(kW * gp));
  p.wb.resize(p.ws.size());
  const std::int64_t stride = row_stride_bytes(B);
  if constexpr (Traits<T>::kDirect) {
    // Rows past the matrix read a zero row (codes 0) and no terms (0).
    thread_local std::vector<std::uint8_t> zero;
    zero.assign(static_cast<std::size_t>(stride), 0);
    const std::uint8_t* row[kW];
    for (std::int64_t r = 0; r < kW; ++r)
      row[r] = r < rows ? static_cast<const std::uint8_t*>(B.data) + (n0 + r) * stride : zero.data();
#if MOEKIT_I8_VNNI
    if (15 * stride > std::numeric_limits<std::int32_t>::max()) {
      // The packed nibbles still straight from the rows (the tile reads no other layout); the
      // terms, which the gathers cannot reach, through the stage below.
      if constexpr (Traits<T>::kNibbles)
        for (std::int64_t blk = 0; blk < blocks; ++blk) q4k_codes(row, blk, p.codes.data());
    } else {
      const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(static_cast<int>(stride)));
      const auto live = static_cast<__mmask16>((1u << rows) - 1u);
      const auto* base = static_cast<const std::uint8_t*>(B.data) + n0 * stride;
      if constexpr (Traits<T>::kDirect32) {
        direct32<T>(row, base, at, live, blocks, p);
      } else {
        for (std::int64_t blk = 0; blk < blocks; ++blk) direct(T{}, row, base, at, live, blk, p);
      }
      return;
    }
#else
    if constexpr (Traits<T>::kDirect32) {
      direct32<T>(row, rows, blocks, p);
    } else {
      direct_k45<T::kBits == 5>(row, blocks, p);  // q4_K or q5_K (Traits::kDirect)
    }
    return;
#endif
  }
  constexpr bool kCodes = !Traits<T>::kNibbles;  // the codes through the stage too
  s.codes.resize(static_cast<std::size_t>(kW * Kp));
  s.ws.resize(p.ws.size());
  s.wb.resize(p.ws.size());
  for (std::int64_t r = 0; r < kW; ++r) {
    std::uint8_t* u = s.codes.data() + r * Kp;
    float* ws = s.ws.data() + r * gp;
    float* wb = s.wb.data() + r * gp;
    const std::int64_t from = r < rows ? K : 0, gfrom = r < rows ? groups : 0;
    std::memset(u + from, 0, static_cast<std::size_t>(Kp - from));
    std::fill(ws + gfrom, ws + gp, 0.0f);
    std::fill(wb + gfrom, wb + gp, 0.0f);
    if (r >= rows) continue;
    const std::uint8_t* row = static_cast<const std::uint8_t*>(B.data) + (n0 + r) * stride;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t g = blk * (T::kBlock / kG);
      unpack(T{}, row + blk * T::kBytes, u + blk * T::kBlock, ws + g, wb + g);
    }
  }
  if constexpr (kCodes)
    for (std::int64_t k = 0; k < Kp; k += 4 * kW) transpose_rows(s.codes.data() + k, Kp, p.codes.data() + k * kW);
  for (std::int64_t g = 0; g < gp; g += kW) {
    transpose_rows(s.ws.data() + g, gp * 4, p.ws.data() + g * kW);
    if (Traits<T>::kBias) transpose_rows(s.wb.data() + g, gp * 4, p.wb.data() + g * kW);
  }
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

// A tile's accumulators zeroed; with a scale per block of groups (kSb > 1) its output too, which
// then takes each block's sums times d.
template <int MR, int kSb>
MOEKIT_I8_ATTR inline void tile_start(Vec::F (&acc)[MR], float* out) {
  for (int i = 0; i < MR; ++i) acc[i] = Vec::zero();
  if constexpr (kSb > 1)
    for (int i = 0; i < MR; ++i) Vec::store(out + kW * i, acc[i]);
}

// Group g's float step for MR rows of A from row m (docs/numerics.md), t the group's exact int32
// sums t = Σ u·a − off·Σa (the tile starts them at Rows::t0): acc = fma(float(t), ws · d, acc),
// then acc = fma(wb, d · Σa, acc) for types with a min or bias; with a scale per block (kSb > 1) d
// is left out (xs is then Σa) and the block's sums go into out times d after its last group.
template <int MR, bool kBias, int kSb>
MOEKIT_I8_ATTR inline void group_step(const Rows& a, std::int64_t m, const Panel& p, std::int64_t g,
                                      const Vec::I (&t)[MR], Vec::F (&acc)[MR], float* out) {
  const Vec::F ws = Vec::load(p.ws.data() + g * kW);
  const Vec::F wb = kBias ? Vec::load(p.wb.data() + g * kW) : Vec::zero();
  const float* d = a.d + g * a.Mp + m;
  const float* xs = a.xs + g * a.Mp + m;
  for (int i = 0; i < MR; ++i) {
    if constexpr (kSb > 1) {  // the block's sums in acc, d after its last group
      acc[i] = Vec::fmadd(Vec::cvt(t[i]), ws, acc[i]);
    } else {
      acc[i] = Vec::fmadd(Vec::cvt(t[i]), Vec::mul(ws, Vec::set1(d[i])), acc[i]);
    }
    if constexpr (kBias) acc[i] = Vec::fmadd(wb, Vec::set1(xs[i]), acc[i]);
  }
  if constexpr (kSb > 1) {
    if ((g + 1) % kSb == 0)
      for (int i = 0; i < MR; ++i) {
        Vec::store(out + kW * i, Vec::fmadd(acc[i], Vec::set1(d[i]), Vec::load(out + kW * i)));
        acc[i] = Vec::zero();
      }
  }
}

// The tile's result into out (with a scale per block it is there already).
template <int MR, int kSb>
MOEKIT_I8_ATTR inline void tile_end(const Vec::F (&acc)[MR], float* out) {
  if constexpr (kSb == 1)
    for (int i = 0; i < MR; ++i) Vec::store(out + kW * i, acc[i]);
}

#if MOEKIT_I8_VNNI
// A register zeroed by the xor idiom, which Intel's renamer resolves without an execution port.
// Left to itself GCC copies one register it keeps at zero, a 512-bit move per sum and group on
// the ports the `vpdpbusd` need (docs/performance.md).
MOEKIT_I8_ATTR inline __m512i zeroed() {
  __m512i z;
  asm volatile("vpxord %0, %0, %0" : "=v"(z));  // volatile: not merged into one register
  return z;
}

// Group g of a tile (below): its int32 sums, then its float step. kOdd, for packed nibbles:
// its codes are the high ones. The steps address the codes and A from per-group bases with
// constant offsets, so the loop holds no index arithmetic (scalar ops that would take the vector
// ports' slots).
template <int MR, int kG, bool kOff, bool kBias, int kSb, bool kNibbles, bool kOdd>
MOEKIT_I8_ATTR inline void tile_group(const Rows& a, std::int64_t m, const Panel& p,
                                      const std::int8_t* const (&q)[MR / 4], std::int64_t g, __m512 (&acc)[MR],
                                      float* out, const char* pf, const char* pf_end) {
  for (int l = 0; l < kPrefetchLines; ++l)
    if (pf + 64 * (kPrefetchLines * g + l) < pf_end) _mm_prefetch(pf + 64 * (kPrefetchLines * g + l), _MM_HINT_T0);
  __m512i t[MR];  // from −off·Σa: the offset's share taken by a broadcast load, not an ALU op
  const std::int32_t* t0 = a.t0 + g * a.Mp + m;
  for (int i = 0; i < MR; ++i) t[i] = kOff ? _mm512_set1_epi32(t0[i]) : zeroed();
  // The group's 64-byte code vectors (packed nibbles: the pair's, which the other group shares)
  // and its 16 bytes of A per row block and step.
  const std::uint8_t* cg = p.codes.data() + (kNibbles ? g / 2 * 8 : g * (kG / 4)) * 64;
  const std::int8_t* ag[MR / 4];
  for (int b = 0; b < MR / 4; ++b) ag[b] = q[b] + g * kG * 4;
#pragma GCC unroll 8
  for (int j = 0; j < kG / 4; ++j) {
    __m512i u = _mm512_loadu_si512(cg + j * 64);
    if constexpr (kNibbles) u = _mm512_and_si512(kOdd ? _mm512_srli_epi32(u, 4) : u, _mm512_set1_epi8(0x0F));
    for (int i = 0; i < MR; ++i) {
      std::int32_t x;
      std::memcpy(&x, ag[i / 4] + j * 16 + 4 * (i % 4), 4);
      t[i] = _mm512_dpbusd_epi32(t[i], u, _mm512_set1_epi32(x));
    }
  }
  group_step<MR, kBias, kSb>(a, m, p, g, t, acc, out);
}

// MR rows of A from row m (a multiple of 4) against one panel: out[i] the 16 columns of row
// m + i; meanwhile the lines of [pf, pf_end) fetched, kPrefetchLines per group. Packed nibbles:
// even groups the low ones, odd groups the high (K / 32 is even), a pair per iteration.
template <int MR, int kG, bool kOff, bool kBias, int kSb, bool kNibbles>
MOEKIT_I8_ATTR void tile(const Rows& a, std::int64_t m, const Panel& p, std::int64_t K, float* out, const char* pf,
                         const char* pf_end) {
  static_assert(!kNibbles || kG == 32, "packed nibbles: a sub-block of 32 per group");
  __m512 acc[MR];
  tile_start<MR, kSb>(acc, out);
  const std::int8_t* q[MR / 4];
  for (int b = 0; b < MR / 4; ++b) q[b] = a.q + (m + 4 * b) * K;
  for (std::int64_t g = 0; g < K / kG; g += kNibbles ? 2 : 1) {
    tile_group<MR, kG, kOff, kBias, kSb, kNibbles, false>(a, m, p, q, g, acc, out, pf, pf_end);
    if constexpr (kNibbles)
      tile_group<MR, kG, kOff, kBias, kSb, kNibbles, true>(a, m, p, q, g + 1, acc, out, pf, pf_end);
  }
  tile_end<MR, kSb>(acc, out);
}
#else
// MR rows of A from row m (a multiple of 4) against one panel of 8: out[i] the 8 columns of row
// m + i; meanwhile the lines of [pf, pf_end) fetched, kPrefetchLines per group. Per group, two
// rows at a time, each 4 inputs: `vpmaddubsw` of the codes and each row's 4 int8 (for the signed
// types |q| and a with q's sign), kSum16 of those added in int16, then widened and added in
// int32 by `vpmaddwd` with ones. (All four rows at once, the compiler keeps 16 int16 sums live
// and spills: 5-10 % slower, docs/performance.md.)
template <int MR, int kG, bool kOff, bool kBias, int kSb, bool kSigned, int kSum16>
MOEKIT_I8_ATTR void tile(const Rows& a, std::int64_t m, const Panel& p, std::int64_t K, float* out, const char* pf,
                         const char* pf_end) {
  static_assert(MR == 4 && (kG / 4) % kSum16 == 0, "one block of 4 rows of A; whole int16 runs per group");
  constexpr int kPair = 2;
  __m256 acc[MR];
  tile_start<MR, kSb>(acc, out);
  const std::int8_t* q = a.q + m * K;
  const std::uint8_t* codes = p.codes.data();
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (std::int64_t g = 0; g < K / kG; ++g) {
    for (int l = 0; l < kPrefetchLines; ++l)
      if (pf + 64 * (kPrefetchLines * g + l) < pf_end) _mm_prefetch(pf + 64 * (kPrefetchLines * g + l), _MM_HINT_T0);
    __m256i t[MR];  // from −off·Σa (as the VNNI tile)
    const std::int32_t* t0 = a.t0 + g * a.Mp + m;
    for (int i = 0; i < MR; ++i) t[i] = kOff ? _mm256_set1_epi32(t0[i]) : _mm256_setzero_si256();
    for (int i0 = 0; i0 < MR; i0 += kPair) {
      for (int j0 = 0; j0 < kG / 4; j0 += kSum16) {
        __m256i s16[kPair];
        for (int r = 0; r < kPair; ++r) s16[r] = _mm256_setzero_si256();
        for (int j = j0; j < j0 + kSum16; ++j) {
          const std::int64_t at = g * kG / 4 + j;  // the 4-input step
          __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * at));
          const __m256i sq = kSigned ? _mm256_xor_si256(u, flip) : u;  // the signed codes
          if constexpr (kSigned) u = _mm256_abs_epi8(sq);
          for (int r = 0; r < kPair; ++r) {
            std::int32_t x;
            std::memcpy(&x, q + 16 * at + 4 * (i0 + r), 4);
            __m256i av = _mm256_set1_epi32(x);
            if constexpr (kSigned) av = _mm256_sign_epi8(av, sq);
            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(u, av));
          }
        }
        for (int r = 0; r < kPair; ++r) t[i0 + r] = _mm256_add_epi32(t[i0 + r], _mm256_madd_epi16(s16[r], ones));
      }
    }
    group_step<MR, kBias, kSb>(a, m, p, g, t, acc, out);
  }
  tile_end<MR, kSb>(acc, out);
}
#endif

// `rows` ≤ kW outputs of row m of C from v[0, rows), columns n, n + 1, ..: store()'s arithmetic
// (times the row's scale, plus what C holds when it accumulates), kW at a time.
MOEKIT_I8_ATTR inline void store_row(const Output& C, std::int64_t m, std::int64_t n, std::int64_t rows,
                                     const float* v) {
  float* c = C.data + m * C.ld + n;
  Vec::F x = Vec::load_n(v, rows);
  if (C.row_scale) x = Vec::mul(x, Vec::set1(C.row_scale[m]));
  if (C.accumulate) x = Vec::add(Vec::load_n(c, rows), x);
  Vec::store_n(c, x, rows);
}

// Every row of A (a.q has Mp ≥ M rows, a multiple of 4) against B's rows [n0, n1), a panel of
// kW at a time, rows of A 12 (then 8 or 4; AVX2: 4) at a time.
template <class T>
MOEKIT_I8_ATTR void run(const Rows& a, std::int64_t M, std::int64_t Mp, const WeightMatrix& B, const Output& C,
                        std::int64_t n0, std::int64_t n1, std::int64_t K) {
  using Tr = Traits<T>;
  // AVX2's signed types multiply |q| by a with q's sign: t is then Σ q · a itself, no offset.
  constexpr bool kSigned = !MOEKIT_I8_VNNI && Tr::kOff == 128;
  constexpr bool kOff = Tr::kOff != 0 && !kSigned;
  thread_local Stage stage;
  thread_local Panel panel;
  alignas(64) float out[12 * kW];
  for (std::int64_t n = n0; n < n1; n += kW) {
    const std::int64_t rows = std::min<std::int64_t>(kW, n1 - n);
    pack<T>(B, n, rows, K, stage, panel);
    // The next two panels' bytes (B's rows are contiguous), fetched while this one computes,
    // kPrefetchLines lines per group of each tile: the pack otherwise waits on DRAM for every
    // row, and all at once they overflow the miss buffers.
    const std::int64_t stride = row_stride_bytes(B);
    const char* next = static_cast<const char*>(B.data) + (n + kW) * stride;
    const char* next_end = static_cast<const char*>(B.data) + std::min(n1, n + 3 * kW) * stride;
    for (std::int64_t m = 0; m < Mp;) {
      std::int64_t mr = 0;
#if MOEKIT_I8_VNNI
      mr = Mp - m >= 12 ? 12 : Mp - m >= 8 ? 8 : 4;
      if (mr == 12)
        tile<12, Tr::kG, kOff, Tr::kBias, Tr::kSb, Tr::kNibbles>(a, m, panel, K, out, next, next_end);
      else if (mr == 8)
        tile<8, Tr::kG, kOff, Tr::kBias, Tr::kSb, Tr::kNibbles>(a, m, panel, K, out, next, next_end);
      else
        tile<4, Tr::kG, kOff, Tr::kBias, Tr::kSb, Tr::kNibbles>(a, m, panel, K, out, next, next_end);
#else
      mr = 4;
      tile<4, Tr::kG, kOff, Tr::kBias, Tr::kSb, kSigned, Tr::kSum16>(a, m, panel, K, out, next, next_end);
#endif
      for (std::int64_t i = 0; i < mr && m + i < M; ++i) store_row(C, m + i, n, rows, out + kW * i);
      m += mr;
    }
  }
}
