// How far one f32 result is from another, the two measures the tests state their tolerances in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moekit/tensor.hpp"

namespace moekit::testing {

/// max |y − ref| and max |ref| over n elements (a tolerance reads err ≤ tol · ref).
struct MaxDiff {
  double err = 0, ref = 0;
};

inline MaxDiff max_diff(const float* y, const float* ref, std::int64_t n) {
  MaxDiff d;
  for (std::int64_t i = 0; i < n; ++i) {
    d.ref = std::max(d.ref, std::fabs(static_cast<double>(ref[i])));
    d.err = std::max(d.err, std::fabs(static_cast<double>(y[i]) - ref[i]));
  }
  return d;
}
inline MaxDiff max_diff(const TensorView& y, const TensorView& ref) {
  return max_diff(y.data_as<const float>(), ref.data_as<const float>(), y.numel());
}

/// ‖y − ref‖₂ / ‖ref‖₂ over n elements.
inline double relative_rms(const float* y, const float* ref, std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    num += std::pow(static_cast<double>(y[i]) - ref[i], 2);
    den += std::pow(static_cast<double>(ref[i]), 2);
  }
  return std::sqrt(num / den);
}
inline double relative_rms(const TensorView& y, const TensorView& ref) {
  return relative_rms(y.data_as<const float>(), ref.data_as<const float>(), y.numel());
}

}  // namespace moekit::testing
