// Random test tensors: one helper for every test file.
#pragma once

#include <random>

#include "moekit/tensor.hpp"

namespace moekit::testing {

/// f32 tensor of `shape` with N(0, scale²) entries drawn from `rng`.
inline Tensor randn(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(std::move(shape), DType::f32);
  std::normal_distribution<float> d(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return t;
}

}  // namespace moekit::testing
