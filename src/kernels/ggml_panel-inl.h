// The int8 fast mode on ggml's block types for many rows of A (prefill): the panel kernel's tiles
// and driver. int8_panels.cpp includes it twice, after ggml_unpack-inl.h and ggml_pack-inl.h:
// inside namespace avx2 for AVX2 and inside namespace vnni for AVX512-VNNI. `Rows`
// (A's side) is int8_common.hpp's, shared by both.
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
