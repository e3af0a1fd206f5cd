// Synthetic MoE layers: the reference shapes moekit is measured at, and layers of any config
// with random weights, built in memory. One home for what `moekit demo`, `moekit bench`,
// bench/moe_bench.cpp and tests need to make a layer without a checkpoint. Internal.
//
// Random values come from splitmix64 in chunks with a seed per chunk, so they depend on
// (stream, index) only: the same on every platform, standard library and thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moekit/config.hpp"
#include "moekit/experts.hpp"
#include "moekit/layer.hpp"
#include "moekit/tensor.hpp"

namespace moekit::synth {

/// A reference MoE layer shape, as the config.json its family ships (one MoE layer).
struct ReferenceShape {
  const char* name;         ///< what `moekit bench --shape` takes
  const char* description;  ///< the model it stands for
  std::int64_t D, F, E, K;  ///< hidden size, expert width, routed experts, experts per token
  std::int64_t shared;      ///< shared experts, each of width F
  const char* config_json;
};

/// qwen3 (Qwen3-30B-A3B), deepseek (DeepSeek-style: sigmoid, selection bias, groups 8/4, two
/// shared experts), mixtral (Mixtral-8x7B) and tiny (smoke tests), in that order.
std::span<const ReferenceShape> reference_shapes();

/// The reference shape called `name`, or nullptr.
const ReferenceShape* find_reference_shape(const std::string& name);

/// `shape`'s config parsed (parse_hf_config), checked against the shape's own dimensions.
MoeConfig config_of(const ReferenceShape& shape);

/// How the random weights of a layer are stored and drawn.
struct WeightSpec {
  DType dtype = DType::f32;  ///< f32, bf16 or f16 (when bits == 0)
  int bits = 0;              ///< 2..8: MLX affine codes (u32 words), bf16 scales and biases
  int group = 64;            ///< the affine group size
  /// With bits != 0: the quantized format (affine; e2m1: MXFP4, bits 4, group 32, or NVFP4 with
  /// group 16; e4m3: FP8, bits 8, 128 × 128 blocks with f32 scales; int4: compressed-tensors,
  /// bf16 scales per `group`).
  Element element = Element::affine;
  /// Standard deviation of the weights; <= 0: 1/sqrt(fan-in), which keeps activations at unit
  /// scale through the block.
  float stddev = 0.02f;
  float bias_stddev = 0.01f;  ///< router and selection biases, where the config has them
  bool quantized() const { return bits != 0; }
};

/// Uniform values with mean 0 and standard deviation `stddev` into an f32, bf16 or f16 tensor,
/// the values a function of (`stream`, index) only. Runs on moekit's thread pool.
void fill_uniform(const Tensor& t, float stddev, std::uint64_t stream);

/// A stacked [n, out, in] projection in `spec`'s format: float weights, or random codes with
/// constant small bf16 scales and biases around zero (values of the same spread as the float
/// weights). Consumes streams from `stream`; the tensors go into `keep`.
ExpertMatrix random_matrix(const WeightSpec& spec, std::int64_t n, std::int64_t out, std::int64_t in,
                           std::uint64_t& stream, std::vector<std::shared_ptr<const void>>& keep);

/// n experts' gate, up and down projections of width F over hidden size D.
ExpertWeights random_experts(const WeightSpec& spec, std::int64_t n, std::int64_t F, std::int64_t D,
                             std::uint64_t& stream);

/// An f32 router, and its selection and router biases where `cfg` has them.
MoeWeights random_router(const MoeConfig& cfg, const WeightSpec& spec, std::uint64_t& stream);

/// Every weight of `cfg`'s block: router, routed experts and shared experts, drawn from streams
/// seed * 1000 + 1, + 2, ... in that order.
MoeWeights random_weights(const MoeConfig& cfg, const WeightSpec& spec, std::uint64_t seed);

}  // namespace moekit::synth
