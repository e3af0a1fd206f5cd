// Gathered, scaled rows of A for the kernel tests: an index list and per-row factors, as the MoE
// block hands its routed rows to the GEMMs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/gemm.hpp"
#include "moekit/tensor.hpp"

namespace moekit::testing {

struct Gathered {
  std::vector<std::int32_t> index;
  std::vector<float> scale;
  kernels::RowSource source(const Tensor& src, bool gather, bool scaled) const {
    return {src.data_as<const float>(), src.dim(1), gather ? index.data() : nullptr, scaled ? scale.data() : nullptr};
  }
};

/// `rows` random indices into `n_src` source rows, each with a factor in [0.1, 1.5).
inline Gathered make_gather(std::int64_t rows, std::int64_t n_src, std::mt19937& rng) {
  Gathered g;
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(n_src - 1));
  std::uniform_real_distribution<float> w(0.1f, 1.5f);
  for (std::int64_t i = 0; i < rows; ++i) {
    g.index.push_back(pick(rng));
    g.scale.push_back(w(rng));
  }
  return g;
}

}  // namespace moekit::testing
