// gemm_nt on MLX affine-quantized weights (Highway, dynamic dispatch per CPU target).
//
// C[M, N] (+)= A[M, K] · Bᵀ with B [N, K] stored as mlx-lm writes it (kernels/gemm.hpp,
// AffineQuant): packed codes read in place, per-group scales and biases. Every weight is
// dequantized to w = fma(scale, q, bias) and enters the dot-product kernel's order (gemm_nt.cpp):
// each C element owns one vector accumulator whose lane j sums k ≡ j (mod lanes) with FMA, reduced
// by SumOfLanes. Two paths compute that same order, so the result never depends on M:
//  - few rows of A (decode, M ≤ kFusedRows): the codes are unpacked and dequantized in
//    registers, one pass over the packed stream, where the target can (kInRegisters: 2, 4 and
//    8 bits on FMA targets, 3, 5 and 6 too on 8-lane ones; groups whole vectors);
//  - many rows (prefill), or codes the target does not unpack in registers: a block of B's rows
//    is dequantized once into a per-thread f32 scratch (a thread_local vector of ≈ 256 KB,
//    L2-resident) and gemm_nt's f32 kernel runs every row of A over it, so the unpacking is
//    amortised over the rows.
// On targets without a fused multiply-add the dequantization is scalar std::fma, so the values
// are the same on every target.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemm_affine.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "kernels/outer-inl.h"  // ARows, LoadA, StoreDotTile, DF

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DU = hn::RebindToUnsigned<DF>;

// Lanes of this target, when known at compile time (0 on scalable targets).
#if HWY_HAVE_SCALABLE
constexpr int kLanes = 0;
#else
constexpr int kLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));
#endif

// Whether codes of kBits bits are unpacked in registers on this target: a vector's codes must be
// whole bytes and fit one 64-bit load (3, 5, 6 bits: eight lanes, two words), and the
// dequantization must be a fused multiply-add.
template <int kBits>
constexpr bool kInRegisters =
    HWY_NATIVE_FMA && kLanes > 0 &&
    (kBits == 8 || ((kBits == 2 || kBits == 4) && kLanes * kBits % 8 == 0 && kLanes * kBits <= 64) ||
     ((kBits == 3 || kBits == 5 || kBits == 6) && kLanes == 8));

// Codes k .. k + lanes - 1 of a row of K codes (k a multiple of the lane count) as f32.
template <int kBits>
HWY_INLINE hn::Vec<DF> Codes(DF df, const std::uint32_t* row, int64_t k, int64_t K) {
  (void)K;  // only the 3-, 5- and 6-bit loads need the row length
  const DU du;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(row);
  // Codes are < 2^8, so they convert as signed integers: one instruction, where an unsigned
  // conversion has none on AVX2 and Highway emulates it with three more.
  const hn::RebindToSigned<DF> di;
  if constexpr (kBits == 8) {
    const hn::Rebind<std::uint8_t, DF> d8;
    return hn::ConvertTo(df, hn::BitCast(di, hn::PromoteTo(du, hn::LoadU(d8, bytes + k))));
  } else if constexpr (kBits == 3 || kBits == 5 || kBits == 6) {
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kLanes != 8) return hn::Zero(df);  // not reached: kInRegisters is false there
    // Eight codes are kBits bytes. Lanes 0-3 (bits 0 .. 4·kBits) shift out of the word at byte 0,
    // lanes 4-7 out of the word at byte kBits / 2, where they start at bit 4 (3, 5 bits) or 0
    // (6 bits) and end by bit 24. Both words lie inside the row's codes except for the row's last
    // eight codes, whose bytes are copied first so nothing past the row is read.
    const std::uint8_t* p = bytes + k / 8 * kBits;
    std::uint8_t buf[8] = {};
    if (k + 8 >= K) {
      std::memcpy(buf, p, kBits);
      p = buf;
    }
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + kBits / 2, 4);
    constexpr std::uint32_t kHi = 4 * kBits - 8 * (kBits / 2);
    HWY_ALIGN static constexpr std::uint32_t kShift[8] = {0, kBits, 2 * kBits, 3 * kBits,
                                                         kHi, kHi + kBits, kHi + 2 * kBits, kHi + 3 * kBits};
    const auto words = hn::ConcatLowerLower(du, hn::Set(du, hi), hn::Set(du, lo));
    const auto q = hn::And(hn::Shr(words, hn::Load(du, kShift)), hn::Set(du, (1u << kBits) - 1u));
    return hn::ConvertTo(df, hn::BitCast(di, q));
#else
    return hn::Zero(df);  // not reached: kInRegisters is false here
#endif
  } else {
    constexpr int kBytes = kLanes * kBits / 8;
    constexpr int kPerWord = 32 / kBits;
    const auto lane = hn::Iota(du, 0);
    const auto shift = hn::Mul(hn::And(lane, hn::Set(du, kPerWord - 1)), hn::Set(du, kBits));
    hn::Vec<DU> words;
    if constexpr (kBytes <= 4) {
      std::uint32_t w = 0;
      std::memcpy(&w, bytes + k * kBits / 8, kBytes);
      words = hn::Set(du, w);
    } else {
#if HWY_TARGET != HWY_SCALAR
      // Lanes 0 .. 32/bits - 1 take the first word, the rest the second (AVX-512, 4 bits).
      std::uint32_t w[2];
      std::memcpy(w, bytes + k * kBits / 8, 8);
      words = hn::ConcatLowerLower(du, hn::Set(du, w[1]), hn::Set(du, w[0]));
#endif
    }
    const auto q = hn::And(hn::Shr(words, shift), hn::Set(du, (1u << kBits) - 1u));
    return hn::ConvertTo(df, hn::BitCast(di, q));
  }
}

// The scale and bias of row n's group containing column k.
HWY_INLINE void GroupOf(const WeightMatrix& B, int64_t n, int64_t k, float& s, float& b) {
  const AffineQuant& q = B.affine;
  const int64_t g = n * q.scale_ld + k / q.group_size;
  s = load_f32(q.scales, q.scale_dtype, g);
  b = load_f32(q.biases, q.scale_dtype, g);
}

HWY_INLINE const std::uint32_t* RowOf(const WeightMatrix& B, int64_t n) {
  return static_cast<const std::uint32_t*>(B.data) + n * B.ld;
}

// One MR x NR tile over the full K, dequantizing B's rows in registers: gemm_nt.cpp's Tile with
// the weight vector computed instead of loaded (same accumulators, same order, same reduction).
template <bool kScaled, int MR, int NR, int kBits>
HWY_INLINE void QTile(const ARows<MR>& a_rows, const WeightMatrix& B, const Output& C, int64_t m, int64_t n,
                      int64_t K) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t gs = B.affine.group_size;
  const std::uint32_t* rows[NR];
  for (int j = 0; j < NR; ++j) rows[j] = RowOf(B, n + j);
  hn::Vec<DF> acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = hn::Zero(df);
  for (int64_t g0 = 0; g0 < K; g0 += gs) {
    float s[NR], b[NR];
    for (int j = 0; j < NR; ++j) GroupOf(B, n + j, g0, s[j], b[j]);
    // This group of the next tile's rows (NR rows on), a tile ahead of use: a row's codes are
    // too short a stream for the hardware prefetcher, and decode otherwise waits on DRAM latency
    // row after row. A hint only: past the matrix it is ignored.
    for (int j = 0; j < NR; ++j) hwy::Prefetch(reinterpret_cast<const std::uint8_t*>(rows[j] + NR * B.ld) + g0 * kBits / 8);
    for (int64_t k = g0; k < g0 + gs; k += L) {
      hn::Vec<DF> a[MR];
      for (int i = 0; i < MR; ++i) a[i] = LoadA<kScaled>(df, a_rows, i, a_rows.p[i] + k);
      for (int j = 0; j < NR; ++j) {
        const auto w = hn::MulAdd(hn::Set(df, s[j]), Codes<kBits>(df, rows[j], k, K), hn::Set(df, b[j]));
        for (int i = 0; i < MR; ++i) acc[i][j] = hn::MulAdd(a[i], w, acc[i][j]);
      }
    }
  }
  StoreDotTile(df, acc, C, m, n);
}

template <bool kScaled, int MR, int kBits>
HWY_INLINE void QStrip(const ARows<MR>& a, const WeightMatrix& B, const Output& C, int64_t m, int64_t N,
                       int64_t K) {
  int64_t n = 0;
  if constexpr (MR == 1) {
    for (; n + 8 <= N; n += 8) QTile<kScaled, 1, 8, kBits>(a, B, C, m, n, K);
  }
  for (; n + 4 <= N; n += 4) QTile<kScaled, MR, 4, kBits>(a, B, C, m, n, K);
  for (; n < N; ++n) QTile<kScaled, MR, 1, kBits>(a, B, C, m, n, K);  // as gemm_nt.cpp's RowStrip
}

template <int MR, int kBits>
HWY_INLINE void QStripOf(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t m, int64_t N,
                         int64_t K) {
  const auto a = ARows<MR>::Of(A, m);
  if (A.scale) {
    QStrip<true, MR, kBits>(a, B, C, m, N, K);
  } else {
    QStrip<false, MR, kBits>(a, B, C, m, N, K);
  }
}

// Rows of A the in-register path takes, one strip per row: beyond them every strip would unpack
// the codes again, and the scratch path's single dequantization is cheaper.
constexpr int kFusedRows = 3;

template <int kBits>
void FusedRows(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  switch (M) {
    case 1:
      return QStripOf<1, kBits>(A, B, C, 0, N, K);
    case 2:
      return QStripOf<2, kBits>(A, B, C, 0, N, K);
    default:
      return QStripOf<3, kBits>(A, B, C, 0, N, K);
  }
}

// Codes of any width as one byte each. Eight codes of b bits are exactly b bytes of the stream:
// one load of b bytes, eight shifts (K is a multiple of the group size, itself of 16, so there
// is no tail).
template <int kBits>
HWY_INLINE void UnpackToBytesOf(const std::uint8_t* bytes, int64_t K, std::uint8_t* out) {
  constexpr std::uint64_t kMask = (std::uint64_t{1} << kBits) - 1;
  for (int64_t i = 0; i < K; i += 8) {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes + i / 8 * kBits, kBits);
    for (int t = 0; t < 8; ++t) out[i + t] = static_cast<std::uint8_t>((v >> (t * kBits)) & kMask);
  }
}

HWY_INLINE void UnpackToBytes(const std::uint32_t* row, int64_t K, int bits, std::uint8_t* out) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(row);
  switch (bits) {
    case 3:
      return UnpackToBytesOf<3>(bytes, K, out);
    case 5:
      return UnpackToBytesOf<5>(bytes, K, out);
    case 6:
      return UnpackToBytesOf<6>(bytes, K, out);
    case 2:
      return UnpackToBytesOf<2>(bytes, K, out);
    case 4:
      return UnpackToBytesOf<4>(bytes, K, out);
    default:
      return UnpackToBytesOf<8>(bytes, K, out);
  }
}

// Dequantizes one row of codes [K] into dst with the registers path's values; `row` is B's row n
// (or, with kBits = 8, its codes unpacked to bytes).
template <int kBits>
HWY_INLINE void DequantRowSimd(const WeightMatrix& B, int64_t n, int64_t K, float* dst,
                               const std::uint32_t* row) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t g0 = 0; g0 < K; g0 += B.affine.group_size) {
    float s, b;
    GroupOf(B, n, g0, s, b);
    const auto sv = hn::Set(df, s), bv = hn::Set(df, b);
    for (int64_t k = g0; k < g0 + B.affine.group_size; k += L)
      hn::StoreU(hn::MulAdd(sv, Codes<kBits>(df, row, k, K), bv), df, dst + k);
  }
}

void DequantRows(const WeightMatrix& B, int64_t n0, int64_t rows, int64_t K, float* dst) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const bool aligned_groups = B.affine.group_size % L == 0;
  thread_local std::vector<std::uint32_t> unpacked;  // K codes as bytes, word-aligned
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * K;
    const int64_t n = n0 + r;
    const int bits = B.affine.bits;
    if (aligned_groups && bits == 4 && kInRegisters<4>) {
      DequantRowSimd<4>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && bits == 8 && kInRegisters<8>) {
      DequantRowSimd<8>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && bits == 2 && kInRegisters<2>) {
      DequantRowSimd<2>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && bits == 3 && kInRegisters<3>) {
      DequantRowSimd<3>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && bits == 5 && kInRegisters<5>) {
      DequantRowSimd<5>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && bits == 6 && kInRegisters<6>) {
      DequantRowSimd<6>(B, n, K, d, RowOf(B, n));
    } else if (aligned_groups && kInRegisters<8>) {
      // 3, 5, 6 bits: unpacked to bytes first, then the 8-bit path (the codes are the same).
      unpacked.resize(static_cast<size_t>((K + 3) / 4));
      UnpackToBytes(RowOf(B, n), K, bits, reinterpret_cast<std::uint8_t*>(unpacked.data()));
      DequantRowSimd<8>(B, n, K, d, unpacked.data());
    } else {
      for (int64_t k = 0; k < K; ++k) d[k] = ref::affine_value(B, n, k);
    }
  }
}

void GemmNtAffine(const RowSource& A, const WeightMatrix& B, const Output& C, int64_t M, int64_t N, int64_t K) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  if (M <= kFusedRows && B.affine.group_size % L == 0) {
    if (B.affine.bits == 4 && kInRegisters<4>) return FusedRows<4>(A, B, C, M, N, K);
    if (B.affine.bits == 8 && kInRegisters<8>) return FusedRows<8>(A, B, C, M, N, K);
    if (B.affine.bits == 2 && kInRegisters<2>) return FusedRows<2>(A, B, C, M, N, K);
    if (B.affine.bits == 3 && kInRegisters<3>) return FusedRows<3>(A, B, C, M, N, K);
    if (B.affine.bits == 5 && kInRegisters<5>) return FusedRows<5>(A, B, C, M, N, K);
    if (B.affine.bits == 6 && kInRegisters<6>) return FusedRows<6>(A, B, C, M, N, K);
  }
  // A block of B's rows as f32, reused by every row of A while it sits in L2.
  const int64_t block = std::max<int64_t>(4, (256 * 1024 / (K * 4)) / 4 * 4);
  thread_local std::vector<float> scratch;
  const int64_t nb = std::min(block, N);
  if (scratch.size() < static_cast<size_t>(nb * K)) scratch.resize(static_cast<size_t>(nb * K));
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t r = std::min(nb, N - n0);
    DequantRows(B, n0, r, K, scratch.data());
    Output c = C;
    c.data += n0;
    detail::gemm_nt_kernel(A, {scratch.data(), DType::f32, K}, c, M, r, K);
  }
}

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace moekit::kernels {

HWY_EXPORT(GemmNtAffine);
HWY_EXPORT(DequantRows);

void dequantize_rows(const WeightMatrix& B, std::int64_t n0, std::int64_t rows, std::int64_t K, float* dst) {
  if (rows <= 0 || K <= 0) return;
  HWY_DYNAMIC_DISPATCH(DequantRows)(B, n0, rows, K, dst);
}

void detail::gemm_nt_affine_kernel(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                                   std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(GemmNtAffine)(A, B, C, M, N, K);
}

}  // namespace moekit::kernels
#endif  // HWY_ONCE
