// Seeded random numbers that are the same on every platform, standard library and thread count
// (std::normal_distribution is implementation-defined). Internal.
#pragma once

#include <cmath>
#include <cstdint>

#include "moekit/tensor.hpp"

namespace moekit::detail {

/// splitmix64: the next number of the stream whose state is `state`.
inline std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform integer in [0, n) (n >= 1), by the 128-bit multiply (no modulo bias worth noting
/// at the sizes moekit draws).
inline std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(splitmix(state)) * n) >> 64);
}

/// Fills f32 `t` with N(mean, std_dev^2) values by Box-Muller from 53-bit uniforms, in index order.
inline void fill_normal(const Tensor& t, double std_dev, std::uint64_t& state, double mean = 0.0) {
  float* p = t.data_as<float>();
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(splitmix(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(splitmix(state) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    p[i] = static_cast<float>(mean + std_dev * r * std::cos(a));
    if (i + 1 < n) p[i + 1] = static_cast<float>(mean + std_dev * r * std::sin(a));
  }
}

}  // namespace moekit::detail
