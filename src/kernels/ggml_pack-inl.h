// The panel kernel's pack (ggml_panel-inl.h): kW rows of B turned into one panel of u8 codes
// (4 inputs × kW rows per register) and per-group terms, a block at a time — straight from the
// rows for the types Traits<T>::kDirect names, else a row at a time through a stage. Included once
// per instruction set after ggml_unpack-inl.h, inside namespace avx2 or vnni
// (int8_panels.cpp).
// No include guard: included twice, on purpose.

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
        const __m256i hi = n > 1 ? load256(b + T::kBytes) : _mm256_setzero_si256();
        v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(b)), hi, 1);
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
  return signed_to_u8<T>(nibble_codes<T>(nibbles));
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
      for (int r = 0; r < 8; ++r) qh[r] = load256(row[r] + blk * kBytes + 16);
      transpose8(qh);
    }
    for (int pp = 0; pp < 4; ++pp) {
      __m256i v[8];
      for (int r = 0; r < 8; ++r) v[r] = load256(row[r] + blk * kBytes + kQs + 32 * pp);
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
        v[r] = load256(b);
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
