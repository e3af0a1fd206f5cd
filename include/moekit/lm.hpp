// A small byte-level language model around moekit's MoE blocks: what `moekit train` trains
// (docs/training.md, "The language model"). Every part has its backward here; the GEMMs run
// through the kernel layer, the MoE blocks are ordinary trainable MoeLayers.
//
//   bytes -> embedding E [V, D] -> context mixing: h0 = [E(x_t); E(x_t-1); ...; E(x_t-N+1)] · Pᵀ
//   -> L pre-norm residual blocks h_{l+1} = h_l + MoE_l(RMSNorm(h_l) · g_l)
//   -> logits = (RMSNorm(h_L) · g_f) · Wᵀ -> softmax cross-entropy against the next byte
//
// The context window (N tokens, the current one included) stands in for attention: enough to
// make the MoE blocks learn real statistics of text, cheap enough to train in minutes. The
// projection is computed through per-offset tables Q_j = E · P_jᵀ (V·N·D² instead of T·N·D²
// multiply-adds: the same function, a different summation order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/config.hpp"
#include "moekit/layer.hpp"
#include "moekit/tensor.hpp"
#include "moekit/train.hpp"

namespace moekit {

struct LmConfig {
  MoeConfig block;            ///< every layer's MoE block; block.num_layers = L
  std::int64_t vocab = 256;   ///< V: bytes
  std::int64_t context = 8;   ///< N: tokens the context mixing sees (the current one included)
  float norm_eps = 1e-6f;     ///< RMSNorm's epsilon

  std::int64_t layers() const noexcept { return block.num_layers; }
  std::int64_t dim() const noexcept { return block.hidden_size; }
  /// Throws std::invalid_argument naming the field: V, N, L, D < 1, eps not finite and > 0, a
  /// dense layer in the block schedule, or a block check_trainable refuses.
  void validate() const;
};

/// The LM's trainable tensors (f32), or their gradients with the same shapes.
struct LmParams {
  Tensor embed;               ///< [V, D]
  Tensor context_proj;        ///< [D, N·D]
  std::vector<Tensor> norms;  ///< L × [D], the gain before each MoE block
  Tensor final_norm;          ///< [D]
  Tensor head;                ///< [V, D]
  std::vector<MoeTensors> blocks;  ///< L MoE blocks

  /// Every tensor, named "embed", "context_proj", "layers.{l}.norm", "layers.{l}.<MoeTensors
  /// name>" (layer by layer, norm first), "final_norm", "head"; sharing this storage. A block's
  /// empty members are left out (MoeTensors::for_each), the other members never.
  NamedTensors named() const;
  /// Zeros shaped like `like` (a block's empty members stay empty).
  static LmParams zeros_like(const LmParams& like);

  /// Calls fn(name, tensor, in_block) for every member tensor, empty ones included, in named()'s
  /// order and under its names; `in_block` is a block tensor's kMoeTensorMembers entry, nullptr
  /// for the others. The one list of the members: named(), zeros_like() and LmTrainer's sums
  /// over ranks all walk it, so a member added here is named, zeroed and summed.
  template <class Fn>
  void for_each_member(Fn&& fn) {
    walk(*this, fn);
  }
  template <class Fn>
  void for_each_member(Fn&& fn) const {
    walk(*this, fn);
  }

 private:
  template <class Self, class Fn>
  static void walk(Self& p, Fn& fn);
};

template <class Self, class Fn>
void LmParams::walk(Self& p, Fn& fn) {
  fn(std::string("embed"), p.embed, nullptr);
  fn(std::string("context_proj"), p.context_proj, nullptr);
  for (std::size_t l = 0; l < std::max(p.norms.size(), p.blocks.size()); ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    if (l < p.norms.size()) fn(prefix + "norm", p.norms[l], nullptr);
    if (l < p.blocks.size())
      for (const MoeTensorMember& m : kMoeTensorMembers) fn(prefix + m.name, p.blocks[l].*m.member, &m);
  }
  fn(std::string("final_norm"), p.final_norm, nullptr);
  fn(std::string("head"), p.head, nullptr);
}

/// Fresh parameters from `seed` (splitmix64 + Box-Muller, the same on every platform): E ~ N(0,
/// 1), P ~ N(0, 1/(N·D)), gains 1, W ~ N(0, 1/D), each block as init_parameters (its own
/// stream). Throws as LmConfig::validate.
LmParams init_lm_parameters(const LmConfig& config, std::uint64_t seed);

/// `tokens` positions of text to predict: row t's window holds the current token and the N−1
/// before it (window[t·N + j] = the token j places back, −1 before the text's start) and the
/// target is the next token.
struct LmBatch {
  std::int64_t tokens = 0;
  std::vector<std::int32_t> window;   ///< [tokens, N]
  std::vector<std::int32_t> targets;  ///< [tokens]
  std::vector<std::int64_t> sequence_starts;  ///< first row of each sequence (for seq-wise aux loss)
};

/// Sequences of `seq_len` positions of `text` starting at each of `starts` (each start + seq_len
/// < text.size(), so every position has a next byte). Throws std::invalid_argument otherwise.
LmBatch make_lm_batch(const std::vector<std::uint8_t>& text, const std::vector<std::int64_t>& starts,
                      std::int64_t seq_len, std::int64_t context);

/// What a training forward keeps for the backward.
struct LmSaved {
  std::int64_t tokens = 0;
  std::vector<std::int32_t> window, targets;
  Tensor tables;                  ///< [N, V, D]: Q_j = E · P_jᵀ, the context projection per offset
  std::vector<Tensor> h;          ///< L + 1 × [T, D]: the residual stream before each block, and after the last
  std::vector<Tensor> inv_rms;    ///< L + 1 × [T]: 1 / rms of each h
  std::vector<SavedForward> blocks;
  Tensor f;                       ///< [T, D] the final normalised state
  Tensor probs;                   ///< [T, V] softmax of the logits
  double loss_sum = 0;            ///< Σ_t CE_t in nats
  double moe_seconds = 0;         ///< wall time of the forward spent in the MoE blocks
};

/// How a LanguageModel runs its MoE blocks when they do not run in this process alone: the
/// expert-parallel runner of moekit/dist.hpp (dist::ExpertParallelBlocks) sends each block's
/// rows to the ranks that own their experts. Without one, block l is block(l) run here. A runner
/// sees every block call of the model, in order; its calls are collective where it is.
class MoeBlockRunner {
 public:
  virtual ~MoeBlockRunner() = default;
  /// The inference forward of block `layer` (as MoeLayer::forward; x may have zero rows).
  virtual Tensor forward(std::int64_t layer, const TensorView& x, ForwardInfo* info) = 0;
  /// The training forward (as MoeLayer::forward_train): `saved` receives this process's part.
  virtual Tensor forward_train(std::int64_t layer, const TensorView& x, SavedForward& saved,
                               bool keep) = 0;
  /// The backward of the last forward_train of block `layer` (as moekit::backward): `grads` are
  /// the block's gradients as this process holds them.
  virtual Tensor backward(std::int64_t layer, const SavedForward& saved, const TensorView& dy,
                          MoeTensors& grads, const BackwardOptions& options) = 0;
};

class LanguageModel {
 public:
  /// Computes with `params` in place (an optimizer updating them changes what the model
  /// computes). `selection_biases`: L × [E] f32 for blocks whose router has a selection bias
  /// (empty tensors elsewhere; an empty vector: zeros are created). Throws std::invalid_argument
  /// for a config validate() refuses or parameters of the wrong shapes (naming the tensor).
  LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases = {});
  /// A model holding only the routed experts `local_experts` of every block (one rank of an
  /// expert-parallel run): params.blocks[l].gate/up/down are [E_local, ...]
  /// (make_trainable_layer's overload). It computes only through a block runner that sends the
  /// other experts' rows to their owners (set_block_runner).
  LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases,
                std::vector<std::int64_t> local_experts);

  const LmConfig& config() const noexcept { return config_; }
  const LmParams& params() const noexcept { return params_; }
  const std::vector<Tensor>& selection_biases() const noexcept { return biases_; }
  const MoeLayer& block(std::int64_t l) const { return layers_.at(static_cast<std::size_t>(l)); }

  /// Whether this model holds only some routed experts (the local_experts constructor).
  bool partial() const noexcept { return partial_; }
  /// Runs the MoE blocks through `runner` from now on (nullptr: in this process again). A model
  /// with a runner may hold only some of each block's routed experts (make_trainable_layer's
  /// `local_experts`); the runner must know which.
  void set_block_runner(std::shared_ptr<MoeBlockRunner> runner) { runner_ = std::move(runner); }
  const std::shared_ptr<MoeBlockRunner>& block_runner() const noexcept { return runner_; }

  /// A training forward of `batch`: returns the mean cross-entropy (nats per token) and keeps in
  /// `saved` what backward() needs (buffers reused from call to call). Throws
  /// std::invalid_argument for a token outside [0, V) or non-finite activations (naming the layer).
  double forward_train(const LmBatch& batch, LmSaved& saved, bool keep_pre_activations = true) const;

  /// The gradient of loss_scale · Σ_t CE_t (loss_scale = 1/T for the mean of one batch; 1/T_step
  /// for micro-batches of a step) into `grads` (added when `accumulate`). `router_dlogits`: per
  /// layer [T, E] extra dL/dlogits (aux losses) or empty. Bit-identical for any thread count.
  /// Returns the wall time spent in the MoE blocks' backward (seconds).
  double backward(const LmSaved& saved, double loss_scale, LmParams& grads, bool accumulate,
                const std::vector<Tensor>& router_dlogits = {}) const;

  /// Σ_t CE_t (nats) of `batch` by the inference forward (the same bits as forward_train's);
  /// adds each layer's expert counts to `counts` (L × E) when given.
  double loss_sum(const LmBatch& batch, std::vector<std::vector<std::int64_t>>* counts = nullptr) const;

 private:
  LanguageModel(LmConfig config, LmParams params, std::vector<Tensor> selection_biases,
                std::optional<std::vector<std::int64_t>> local_experts);
  double forward_impl(const LmBatch& batch, LmSaved& saved, bool training, bool keep,
                      std::vector<std::vector<std::int64_t>>* counts) const;

  LmConfig config_;
  LmParams params_;
  std::vector<Tensor> biases_;
  std::vector<MoeLayer> layers_;
  std::shared_ptr<MoeBlockRunner> runner_;
  bool partial_ = false;  ///< holds only some routed experts: runs only through runner_
};

}  // namespace moekit
