#include "kernels/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

}  // namespace moekit::kernels
