// MoeLayer: router + routed experts + shared experts (+ gate), the whole MoE block.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moekit/config.hpp"
#include "moekit/experts.hpp"
#include "moekit/routing.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

/// Everything one MoE block reads. Matrices may point into mapped checkpoint memory; whatever
/// owns it is held in keep_alive (of the ExpertWeights) or router_keep_alive.
struct MoeWeights {
  TensorView router;       ///< [E, D] f32 or bf16; undefined when router_quantized is set
  /// The router as one [E, D] affine-quantized matrix (mlx-lm quantizes it as any nn.Linear);
  /// its logits equal those of the dequantized router bit for bit.
  ExpertMatrix router_quantized;
  Tensor router_bias;      ///< [E] f32 when config.router.has_router_bias
  Tensor selection_bias;   ///< [E] f32 when config.router.has_selection_bias
  ExpertWeights experts;   ///< E routed experts
  ExpertWeights shared;    ///< E = 1 holding all shared experts side by side (width = shared_width); or empty
  TensorView shared_gate;  ///< [1, D] when config.shared_gated (and not quantized)
  ExpertMatrix shared_gate_quantized;  ///< [1, D] affine-quantized, instead of shared_gate
  std::vector<std::shared_ptr<const void>> keep_alive;
  /// Where the routed experts came from (e.g. "per_expert", "fused_gate_up", "switch_mlp"),
  /// and whether they are used in place from the mapped file ("mapped") or were copied.
  std::string layout;
  bool mapped = false;
};

/// What a forward can hand back besides y (a backward will need these).
struct ForwardInfo {
  Tensor logits;  ///< [..., E] f32 router logits
  Routing routing;
};

class MoeLayer {
 public:
  /// Validates `weights` against `config` (shapes, dtypes, presence of biases and shared
  /// parts) and throws std::invalid_argument naming the part and the expected shape.
  MoeLayer(MoeConfig config, MoeWeights weights);

  /// y = MoE(x). x [..., D] f32 or bf16; y has x's shape and dtype. `info`, when given,
  /// receives the logits and routing used. Const and safe to call from several threads at once.
  /// Throws std::invalid_argument for a wrong shape/dtype or non-finite logits.
  Tensor forward(const TensorView& x, ForwardInfo* info = nullptr) const;

  /// Repacks the routed and shared experts into the forward kernel's panel layout (pack_panels
  /// in experts.hpp): faster prefill, the weights' bytes resident in memory (rounded up to
  /// whole panels) instead of read in place from a mapped file. Not thread-safe against
  /// concurrent forwards; call it once after loading.
  void pack_weights();

  /// The fast mode for MLX-affine-quantized experts (routed and shared; the router and the
  /// shared-expert gate stay exact, so the routing is unchanged): with `on`, 4- and 8-bit
  /// projections multiply int8-quantized activations (one scale per weight group) with the codes
  /// as integers wherever an expert has at most kernels' 8 rows (decode, small batches); larger
  /// groups of rows keep the exact kernel. |y_fast − y_exact| per element is bounded by
  /// Σ_groups (max|x_group| / 254) · Σ|w_group| of each projection (docs/numerics.md).
  /// Deterministic for any thread count. No effect on float weights. Not thread-safe against
  /// concurrent forwards.
  void set_int8_activations(bool on);

  const MoeConfig& config() const noexcept { return config_; }
  const MoeWeights& weights() const noexcept { return weights_; }
  ExpertBody body() const noexcept;         ///< the routed experts' body
  ExpertBody shared_body() const noexcept;  ///< the shared experts' body

 private:
  MoeConfig config_;
  MoeWeights weights_;
};

}  // namespace moekit
