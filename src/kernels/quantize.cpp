#include "kernels/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/formats/table.hpp"

namespace moekit::kernels {

void quantize_affine_row(const float* w, std::int64_t in, int bits, int group, std::uint32_t* codes, float* scales,
                         float* biases) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const std::int64_t words = in * bits / 32;
  std::memset(codes, 0, static_cast<std::size_t>(words) * sizeof(std::uint32_t));
  for (std::int64_t g = 0; g < in / group; ++g) {
    const float* p = w + g * group;
    float w_min = std::numeric_limits<float>::infinity();
    float w_max = -w_min;
    for (int j = 0; j < group; ++j) {
      w_max = std::max(w_max, p[j]);
      w_min = std::min(w_min, p[j]);
    }
    const bool mask = std::abs(w_min) > std::abs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    for (int j = 0; j < group; ++j) {
      float q = std::rint((p[j] - bias) / scale);
      q = std::min(std::max(q, 0.0f), n_bins);
      const auto code = static_cast<std::uint64_t>(q);
      // Bit position of element (g·group + j) in the row's stream; a code may straddle two words.
      const std::int64_t bit = (g * group + j) * bits;
      const std::int64_t word = bit / 32;
      const int shift = static_cast<int>(bit % 32);
      const std::uint64_t placed = code << shift;
      codes[word] |= static_cast<std::uint32_t>(placed);
      if (shift + bits > 32) codes[word + 1] |= static_cast<std::uint32_t>(placed >> 32);
    }
    scales[g] = scale;
    biases[g] = bias;
  }
}

std::uint8_t f32_to_e4m3_saturating(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const std::uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  std::uint8_t result;
  if (bits >= 543u << 21) {  // |x| >= 464 (and NaN): saturate
    result = 0x7E;
  } else if (bits < 121u << 23) {  // below 2^-6: the subnormal range, rounded by an f32 add
    const float denorm = [] {
      const std::uint32_t b = 141u << 23;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }();
    float f;
    std::memcpy(&f, &bits, 4);
    f += denorm;
    std::uint32_t low;
    std::memcpy(&low, &f, 4);
    result = static_cast<std::uint8_t>(low - (141u << 23));
  } else {  // normal: rebias the exponent, round the 20 dropped mantissa bits to nearest even
    const std::uint32_t odd = (bits >> 20) & 1u;
    result = static_cast<std::uint8_t>((bits + ((static_cast<std::uint32_t>(7 - 127) << 23) + 0x7FFFFu) + odd) >> 20);
  }
  return static_cast<std::uint8_t>(result | (sign >> 24));
}

namespace {

// An array op of `dtype` stores its result rounded to that dtype: formats::round_to.
using formats::round_to;

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The nearest e2m1 value's index, the first on a tie (argmin over |v − lut|, the difference and
// its magnitude in `dtype`).
std::uint32_t nearest_e2m1(float v, DType dtype) {
  std::uint32_t best = 0;
  float best_d = 0.0f;
  for (std::uint32_t i = 0; i < 16; ++i) {
    const float d = std::abs(round_to(v - kE2m1[i], dtype));
    if (i == 0 || d < best_d) {
      best = i;
      best_d = d;
    }
  }
  return best;
}

}  // namespace

void quantize_fp_row(const float* w, std::int64_t in, FpMode mode, DType dtype, std::uint32_t* codes,
                     std::uint8_t* scales) {
  const int bits = mode == FpMode::mxfp8 ? 8 : 4;
  const std::int64_t group = mode == FpMode::nvfp4 ? 16 : 32;
  const float maxval = bits == 4 ? 6.0f : 448.0f;
  std::memset(codes, 0, static_cast<std::size_t>(in * bits / 32) * sizeof(std::uint32_t));
  auto* code_bytes = reinterpret_cast<std::uint8_t*>(codes);
  for (std::int64_t g = 0; g < in / group; ++g) {
    const float* p = w + g * group;
    float m = 0.0f;
    for (std::int64_t j = 0; j < group; ++j) m = std::max(m, std::abs(p[j]));
    const float s = round_to(m / maxval, dtype);
    float divisor;
    DType q_dtype = dtype;  // the dtype the scaled weights are in
    if (mode == FpMode::nvfp4) {
      scales[g] = f32_to_e4m3_saturating(s);  // s · 1.0f (an f32 scale_encode): f32
      divisor = round_to(e4m3_to_f32(scales[g]), dtype);
    } else {
      // e = ceil(log2 s) (0 where s = 0): the smallest power of two that keeps every |w| / 2^e
      // within the element's range (mlx 0.32.4; its earlier releases rounded to nearest). The
      // logarithm is taken in f32, the scale byte e + 127 cast to uint8 as mlx casts it.
      const float e = s == 0.0f ? 0.0f : std::ceil(std::log2(s));
      scales[g] = static_cast<std::uint8_t>(static_cast<std::int32_t>(round_to(e + 127.0f, dtype)));
      divisor = round_to(std::pow(2.0f, e), dtype);
    }
    for (std::int64_t j = 0; j < group; ++j) {
      float v = round_to(p[j] / divisor, dtype);
      if (mode == FpMode::nvfp4) q_dtype = DType::f32;  // times the f32 scale_encode: f32 from here
      const std::int64_t k = g * group + j;
      if (bits == 8) {
        code_bytes[k] = f32_to_e4m3_saturating(v);
      } else {
        codes[k / 8] |= nearest_e2m1(v, q_dtype) << (4 * (k % 8));
      }
    }
  }
}

}  // namespace moekit::kernels
