// Unsigned codes of b bits packed little-endian into a byte stream, one row at a time (element 0
// in the lowest bits of byte 0; 3-, 5- and 6-bit codes straddle bytes): MLX affine codes (affine),
// e2m1 nibbles (e2m1), and any later format stored the same way unpack here, a vector of lanes at a
// time in registers, or to one byte per code. Per-target Highway header.
#if defined(MOEKIT_KERNELS_FORMATS_CODES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MOEKIT_KERNELS_FORMATS_CODES_INL_H_
#undef MOEKIT_KERNELS_FORMATS_CODES_INL_H_
#else
#define MOEKIT_KERNELS_FORMATS_CODES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "kernels/outer-inl.h"  // DF

HWY_BEFORE_NAMESPACE();
namespace moekit::kernels::HWY_NAMESPACE {

using DU = hn::RebindToUnsigned<DF>;

// A decoded weight rounded to `dtype` as the format's reference rounds it (WeightFormat::
// decode_dtype): f32 unchanged; bf16 to nearest even (f32_to_bf16's rule); f16 to nearest even
// through the target's f32 -> f16 conversion (f32_to_f16's rule).
HWY_INLINE hn::Vec<DF> RoundTo(DF df, hn::Vec<DF> v, DType dtype) {
  if (dtype == DType::bf16) return hn::BitCast(df, hn::And(RoundedBf16Bits(DU(), v), hn::Set(DU(), 0xffff0000u)));
  if (dtype == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> d16;
    return hn::PromoteTo(df, hn::DemoteTo(d16, v));
  }
  return v;
}

// Lanes of this target, when known at compile time (0 on scalable targets).
#if HWY_HAVE_SCALABLE
constexpr int kLanes = 0;
#else
constexpr int kLanes = static_cast<int>(HWY_MAX_BYTES / sizeof(float));
#endif

// Whether codes of kBits bits are unpacked in registers on this target: a vector's codes must be
// whole bytes and fit one 64-bit load (3, 5, 6 bits: eight lanes, two words).
template <int kBits>
constexpr bool kUnpacks = kLanes > 0 &&
                          (kBits == 8 ||
                           ((kBits == 2 || kBits == 4) && kLanes * kBits % 8 == 0 && kLanes * kBits <= 64) ||
                           ((kBits == 3 || kBits == 5 || kBits == 6) && kLanes == 8));

// Codes k .. k + lanes - 1 of a row of K codes (k a multiple of the lane count), one per u32
// lane. Where kUnpacks<kBits> is false this is never called (it returns zeros).
template <int kBits>
HWY_INLINE hn::Vec<DU> CodeBits(const std::uint8_t* bytes, int64_t k, int64_t K) {
  (void)K;  // only the 3-, 5- and 6-bit loads need the row length
  const DU du;
  if constexpr (kBits == 8) {
    const hn::Rebind<std::uint8_t, DF> d8;
    return hn::PromoteTo(du, hn::LoadU(d8, bytes + k));
  } else if constexpr (kBits == 3 || kBits == 5 || kBits == 6) {
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kLanes != 8) return hn::Zero(du);  // not reached: kUnpacks is false there
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
    HWY_ALIGN static constexpr std::uint32_t kShift[8] = {0,   kBits,       2 * kBits,       3 * kBits,
                                                          kHi, kHi + kBits, kHi + 2 * kBits, kHi + 3 * kBits};
    const auto words = hn::ConcatLowerLower(du, hn::Set(du, hi), hn::Set(du, lo));
    return hn::And(hn::Shr(words, hn::Load(du, kShift)), hn::Set(du, (1u << kBits) - 1u));
#else
    return hn::Zero(du);  // not reached: kUnpacks is false here
#endif
  } else {
    constexpr int kBytes = kLanes * kBits / 8;
    constexpr int kPerWord = 32 / kBits;
    const auto lane = hn::Iota(du, 0);
    const auto shift = hn::Mul(hn::And(lane, hn::Set(du, kPerWord - 1)), hn::Set(du, kBits));
    hn::Vec<DU> words = hn::Zero(du);
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
    return hn::And(hn::Shr(words, shift), hn::Set(du, (1u << kBits) - 1u));
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

}  // namespace moekit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MOEKIT_KERNELS_FORMATS_CODES_INL_H_
