// RoPE frequencies and rotation, RMSNorm: the decoder's small element-wise pieces, computed as
// transformers computes them (decoder.hpp).
#include <algorithm>
#include <cmath>

#include "model/decoder.hpp"

namespace moekit::model {

namespace {

// transformers' pos_freqs: base ** (arange(0, dim, 2) / dim), in float32.
float rope_power(double theta, std::int64_t i, std::int64_t dims) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(dims);
  return static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e)));
}

}  // namespace

std::vector<float> rope_frequencies(double theta, std::int64_t dims) {
  std::vector<float> f(static_cast<std::size_t>(dims / 2));
  for (std::int64_t i = 0; i < dims / 2; ++i) f[static_cast<std::size_t>(i)] = 1.0f / rope_power(theta, i, dims);
  return f;
}

float apply_yarn(std::vector<float>& inv_freq, double theta, std::int64_t dims, double factor, double original_ctx,
                 double beta_fast, double beta_slow, bool truncate, double attention_factor) {
  const double pi = 3.14159265358979323846;
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dims) * std::log(original_ctx / (rotations * 2.0 * pi)) / (2.0 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dims - 1));
  if (low == high) high += 0.001;  // no singularity
  const std::size_t half = inv_freq.size();
  for (std::size_t i = 0; i < half; ++i) {
    // transformers computes the ramp and the blend in float32
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // the share kept at the original frequency
    const float power = rope_power(theta, static_cast<std::int64_t>(i), dims);
    const float extra = 1.0f / power;
    const float inter = 1.0f / (static_cast<float>(factor) * power);
    inv_freq[i] = inter * (1.0f - extrapolation) + extra * extrapolation;
  }
  if (attention_factor > 0.0) return static_cast<float>(attention_factor);
  return static_cast<float>(0.1 * std::log(factor) + 1.0);
}

void apply_rope(const Rope& rope, std::int64_t pos, float* x) {
  const std::int64_t half = rope.dims / 2;
  const float p = static_cast<float>(pos);
  for (std::int64_t i = 0; i < half; ++i) {
    const float angle = rope.inv_freq[static_cast<std::size_t>(i)] * p;
    const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * rope.attention_factor;
    const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * rope.attention_factor;
    float* a = rope.layout == RopeLayout::neox ? x + i : x + 2 * i;
    float* b = rope.layout == RopeLayout::neox ? x + i + half : x + 2 * i + 1;
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x1 * c + x0 * s;
  }
}

void rms_norm(const float* x, const float* w, std::int64_t n, double eps, float* y) {
  double ss = 0.0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i] * r);
    y[i] = w ? w[i] * v : v;
  }
}

}  // namespace moekit::model
