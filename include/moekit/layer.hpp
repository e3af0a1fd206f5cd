// MoeLayer: router + routed experts + shared experts (+ gate), the whole MoE block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "moekit/config.hpp"
#include "moekit/experts.hpp"
#include "moekit/routing.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

/// Everything one MoE block reads. Matrices may point into mapped checkpoint memory; whatever
/// owns it is held in `keep_alive` below (the router, biases and gates) or in the ExpertWeights'
/// own `keep_alive` (the experts).
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
  /// The block's tensor-name prefix in its checkpoint ("model.layers.3.mlp",
  /// "language_model.model.layers.1.feed_forward"); empty for layers not loaded from one.
  std::string block;
  /// For stacked experts (layout "switch_mlp"): the container they sit in, relative to `block`
  /// ("switch_mlp", or "experts" for mlx-lm's GPT-OSS).
  std::string stacked_container;
};

/// What a forward can hand back besides y (a backward will need these).
struct ForwardInfo {
  Tensor logits;  ///< [..., E] f32 router logits
  Routing routing;
};

/// What a training forward keeps for the backward (moekit/train.hpp). Per token, with
/// pre-activations kept: 4·(D + E + 2K) + 16·K (the plan) + 4·K·(2F) (routed; F for a plain MLP)
/// + 4·2·S (shared experts of width S) + 4 (the shared gate's logit) bytes; without them the
/// 4·K·2F and 8·S terms go. nbytes() counts them.
struct SavedForward {
  Shape shape;             ///< x's shape as given
  DType dtype = DType::f32;  ///< x's dtype as given (dx is f32 either way)
  Tensor x;                ///< [T, D] f32 (a copy: the caller may reuse its input)
  Tensor logits;           ///< [T, E] f32, router bias included
  Routing routing;         ///< ids / weights [T, K]
  ExpertTrace routed;      ///< plan + pre-activations of the routed rows, in sorted order
  ExpertTrace shared;      ///< pre-activations of the shared expert(s), token order
  Tensor shared_gate_logits;  ///< [T, 1] f32 when the shared expert is gated
  std::size_t nbytes() const noexcept;
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

  /// A training forward: y exactly as forward() computes it (the same bits), keeping in `saved`
  /// what backward() needs. `keep_pre_activations` false keeps only x, the logits, the routing
  /// and the plan: the backward recomputes the expert pre-activations (one more pass of the
  /// gate/up GEMMs) and gets the same gradients. Const; `saved` is overwritten.
  Tensor forward_train(const TensorView& x, SavedForward& saved, bool keep_pre_activations = true) const;

  /// The routed experts' part of a forward, run by the caller (expert parallelism:
  /// moekit/dist.hpp). `routed(x, routing, y)` gets x [T, D] f32 and the routing and must
  /// overwrite y [T, D] f32 with Σ_k weight · expert(x) as run_experts() computes it; the rest —
  /// the input checks, the router, the routing, the shared experts, the output's shape and dtype
  /// — is forward()'s, so with a `routed` that reproduces run_experts the result is forward()'s,
  /// bit for bit.
  using RoutedExperts = std::function<void(const TensorView& x, const Routing& routing, const TensorView& y)>;
  Tensor forward_with(const TensorView& x, const RoutedExperts& routed, ForwardInfo* info = nullptr) const;
  /// forward_train() with the routed part run by `routed` (as forward_with): `saved` receives all
  /// but saved.routed (x, logits, routing, the shared experts' trace), which stays empty — the
  /// caller keeps what its routed part needs.
  Tensor forward_train_with(const TensorView& x, SavedForward& saved, const RoutedExperts& routed,
                            bool keep_pre_activations = true) const;

  /// Repacks the routed and shared experts into the forward kernel's packed layout (pack_panels
  /// in experts.hpp: panels in the f32 mode; AMX tiles in the bf16 compute mode where it runs on
  /// AMX, so turn that mode on first): faster prefill, the weights' bytes resident in memory
  /// (rounded up to whole panels or tiles) instead of read in place from a mapped file. Not
  /// thread-safe against concurrent forwards; call it once after loading.
  void pack_weights();

  /// The fast mode for quantized experts (routed and shared; the router and the shared-expert
  /// gate stay exact, so the routing is unchanged): with `on`, 4- and 8-bit MLX affine, MXFP4,
  /// NVFP4 and int4 projections multiply int8-quantized activations (one scale per weight group)
  /// with the codes as integers wherever an expert has at most kernels' 8 rows (decode, small
  /// batches), and MLX affine ones for any number of rows on CPUs with AMX-INT8 (group sizes that
  /// are multiples of 64); elsewhere larger groups of rows keep the exact kernel.
  /// |y_fast − y_exact| per element is bounded by Σ_groups (max|x_group| / 254) · Σ|w_group| of
  /// each projection (int4 decoded in bf16 / f16: plus half an ulp of each weight times |x|;
  /// docs/numerics.md). Deterministic for any thread count. No effect on float or FP8 weights.
  /// Not thread-safe against concurrent forwards. set_int8_activations(true) is
  /// set_compute_mode(ComputeMode::int8); false returns an int8 layer to exact (another mode stays).
  void set_int8_activations(bool on);

  /// The bf16 compute mode, as torch and MLX run bf16 models (docs/numerics.md): with `on`, the
  /// routed and shared experts round the rows entering each projection (the input, the activated
  /// intermediate) to bf16 and multiply them with the bf16 weights as exact bf16 × bf16 products
  /// summed in fp32 (AMX or AVX512-BF16 where the CPU has them). The router, the shared-expert
  /// gate, the projections' outputs, the activation and the combine stay fp32. Deterministic for
  /// any thread count. Needs every expert matrix bf16 in rows layout (or AMX tiles), or FP8
  /// (e4m3, as released): FP8 weights are decoded as the release's reference decodes them and
  /// rounded to bf16 — what a framework running the release in bf16 multiplies by — a block of
  /// rows at a time, never the whole matrix. Throws std::invalid_argument naming the first matrix
  /// that is neither (f32/f16 weights, pack_weights()'s panels, other quantized formats). Turning
  /// it off after pack_weights() packed AMX tiles throws too. Not thread-safe against concurrent
  /// forwards. set_bf16_activations(true) is set_compute_mode(ComputeMode::bf16); false returns a
  /// bf16 layer to exact (another mode stays).
  void set_bf16_activations(bool on);
  bool bf16_activations() const noexcept { return mode_ == ComputeMode::bf16; }

  /// The arithmetic of the routed and shared experts' projections (moekit/compute_mode.hpp), the
  /// one value every forward passes down to the kernels: exact (the default), int8
  /// (set_int8_activations says what it computes) or bf16 (set_bf16_activations, which also says
  /// what it needs and throws). The router and the shared-expert gate stay exact in every mode.
  /// Not thread-safe against concurrent forwards.
  void set_compute_mode(ComputeMode mode);
  ComputeMode compute_mode() const noexcept { return mode_; }

  const MoeConfig& config() const noexcept { return config_; }
  const MoeWeights& weights() const noexcept { return weights_; }
  ExpertBody body() const noexcept;         ///< the routed experts' body
  ExpertBody shared_body() const noexcept;  ///< the shared experts' body

 private:
  Tensor forward_impl(const TensorView& x, ForwardInfo* info, SavedForward* saved,
                      const RoutedExperts* routed = nullptr) const;

  MoeConfig config_;
  MoeWeights weights_;
  ComputeMode mode_ = ComputeMode::exact;
};

}  // namespace moekit
