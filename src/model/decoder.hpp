// The decoder as data: what one whole model is made of, read from its file by a reader
// (gguf_reader.cpp) and run by one forward (decoder.cpp). Internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moekit/causal_lm.hpp"
#include "moekit/experts.hpp"
#include "moekit/layer.hpp"
#include "moekit/tensor.hpp"

namespace moekit::model {

/// Which elements of a head RoPE rotates together: neox (rotate-half: i and i + n/2, transformers'
/// layout) or interleaved (2i and 2i + 1: llama.cpp's "norm" rope, which its converter reaches by
/// permuting llama-architecture Q/K rows).
enum class RopeLayout { neox, interleaved };

struct Rope {
  RopeLayout layout = RopeLayout::neox;
  std::int64_t dims = 0;          ///< rotated elements of each head (partial rotary: fewer than head_dim)
  std::vector<float> inv_freq;    ///< dims / 2 frequencies, scaling applied (YaRN, llama3, linear, rope_freqs)
  float attention_factor = 1.0f;  ///< multiplies cos and sin (YaRN's mscale)
};

/// The frequencies of a RoPE of `dims` dimensions and base `theta`, as transformers computes them
/// (float32 powers).
std::vector<float> rope_frequencies(double theta, std::int64_t dims);

/// YaRN (transformers' _compute_yarn_parameters): the frequencies blended between extrapolation
/// and interpolation by `factor` over [beta_slow, beta_fast] rotations of `original_ctx`;
/// `truncate` rounds the correction range outwards (transformers' default; GPT-OSS turns it off).
/// Returns the attention factor (0.1 ln(factor) + 1 unless given > 0).
float apply_yarn(std::vector<float>& inv_freq, double theta, std::int64_t dims, double factor, double original_ctx,
                 double beta_fast, double beta_slow, bool truncate, double attention_factor);

/// Query/key normalisation.
enum class QkNorm {
  none,
  per_head,  ///< RMSNorm over each head's head_dim elements, one weight [head_dim] (Qwen3, GLM-4.5)
  whole,     ///< RMSNorm over the whole projection [heads · head_dim] (OLMoE, MiniMax-M2)
  l2,        ///< L2 normalisation of each head without weight (Llama-4's rope layers)
};

/// A projection y = x Wᵀ (+ b): W [out, in] in its stored format, b f32 [out] or undefined.
struct Linear {
  ExpertMatrix w;
  Tensor bias;
};

/// DeepSeek's Multi-head Latent Attention (DeepseekV2Attention / DeepseekV3Attention). Each token
/// caches one latent row [c (kv_lora, RMS-normed) ‖ k_pe (rope, rotated)] shared by every head. It
/// runs in the absorbed form: a head's query nope part is multiplied through its slice of kv_b_proj
/// into the latent space (q_lat = W_kᵀ q_nope), so scores are [q_lat ‖ q_pe] · [c ‖ k_pe] (one
/// key head, as MQA), the attention output stays latent (Σ p c) and each head's value slice of
/// kv_b_proj lifts it to v_head_dim. Mathematically transformers' expanded form (k_nope = W_k c,
/// v = W_v c), without expanding the cache.
struct Mla {
  std::int64_t q_lora = 0;  ///< q LoRA rank (0: q is one projection, `Attention::q`)
  std::int64_t kv_lora = 0, nope = 0, rope = 0, v = 0;
  Linear q_a, q_b;   ///< q_lora > 0: q = q_b(RMSNorm(q_a x))
  Tensor q_a_norm;   ///< f32 [q_lora]
  Linear kv_a;       ///< [kv_lora + rope, D]: the latent and the shared rope key
  Tensor kv_a_norm;  ///< f32 [kv_lora]
  ExpertMatrix k_b;  ///< one "expert" per head: [kv_lora, nope] (kv_b_proj's key rows, transposed)
  ExpertMatrix v_b;  ///< one per head: [v, kv_lora] (kv_b_proj's value rows)
  std::int64_t row() const { return kv_lora + rope; }  ///< cache floats per token
};

struct Attention {
  Linear q, k, v, o;
  std::unique_ptr<Mla> mla;  ///< set: MLA (q is used only without a q LoRA; k, v unused)
  QkNorm qk_norm = QkNorm::none;
  Tensor q_norm, k_norm;    ///< f32 weights (per_head: [head_dim]; whole: [heads · head_dim])
  Tensor sinks;             ///< [heads] f32: one extra logit per head in the softmax (GPT-OSS)
  bool rope = true;         ///< false: a NoPE layer (Llama-4)
  std::int64_t window = 0;  ///< sliding window: a query sees the last `window` positions, itself included
  std::int64_t chunk = 0;   ///< chunked local attention: a query sees its own chunk of `chunk` positions
  bool temperature_tuning =
      false;  ///< Llama-4's NoPE layers: q scaled by log(floor((p + 1) / floor_scale) + 1) · scale + 1
};

struct Layer {
  Tensor attn_norm, ffn_norm;  ///< f32 [D]
  Attention attn;
  std::unique_ptr<MoeLayer> moe;  ///< the MoE block, or null for a dense layer
  ExpertWeights dense;            ///< a dense layer's MLP (E = 1)
  ExpertBody dense_body;
};

struct Decoder {
  LmInfo info;
  /// MLA models: KV = 1, head_dim = kv_lora + rope, v_head_dim = kv_lora (the cache's rows and the
  /// latent attention's output per head; LmInfo gives the model's own head dims).
  std::int64_t D = 0, H = 0, KV = 0, head_dim = 0, v_head_dim = 0, vocab = 0;
  double rms_eps = 1e-6;
  float attn_scale = 1.0f;  ///< the softmax scale (head_dim^-1/2)
  Rope rope;
  double temp_floor_scale = 8192, temp_attn_scale = 0.1;  ///< Llama-4's temperature tuning
  ExpertMatrix embed;                                     ///< [vocab, D]
  Tensor output_norm;                                     ///< f32 [D]
  ExpertMatrix head;                                      ///< [vocab, D] (the embedding when tied)
  std::vector<Layer> layers;
  std::vector<std::shared_ptr<const void>> keep_alive;
  std::shared_ptr<const Tokenizer> tokenizer;
};

/// Reads a GGUF model (gguf_reader.cpp).
Decoder read_gguf(const std::string& path, const LmOptions& options);
/// Reads a Hugging Face / mlx-lm checkpoint folder (hf_reader.cpp).
Decoder read_hf(const std::string& path, const LmOptions& options);
/// A small Qwen3-MoE-shaped model with random f32 weights (random_model.cpp).
Decoder random_decoder(std::uint64_t seed, const LmOptions& options);
/// Sets d.tokenizer from `read` and d.info.tokenizer to its description; a tokenizer moekit cannot
/// read leaves the model without one (generation from ids still works) and says why in
/// d.info.tokenizer.
void attach_tokenizer(Decoder& d, const std::function<std::shared_ptr<const Tokenizer>()>& read);

/// After an MLA model's layers are read: the cache's rows become one latent "head" of kv_lora + rope
/// floats, read as kv_lora values (d.KV = 1, head_dim, v_head_dim; info.num_kv_heads = 1). LmInfo's
/// head dims keep the model's own.
void use_latent_cache(Decoder& d, const Mla& m);

/// Sets m.k_b and m.v_b from kv_b_proj [H · (nope + v), kv_lora] in any stored format: decoded to
/// f32 (k_b transposed per head), owned by `keep`. (A GGUF written by llama.cpp's converter stores
/// them split, attn_k_b / attn_v_b, and is used in place instead.)
void split_kv_b(const ExpertMatrix& kv_b, std::int64_t H, Mla& m, std::vector<std::shared_ptr<const void>>& keep);

/// The KV cache's bytes per token over all layers (f32 keys and values; MLA: the latent rows).
std::int64_t cache_bytes_per_token(const Decoder& d);

/// "qk-norm per head, sinks, window 128 on layers 0, 2", ... (LmInfo::attention).
std::string describe_attention(const Decoder& d);

/// One sequence's tokens in a pass through the layers: rows [t0, t0 + n) of the pass, at positions
/// [p0, p0 + n) of the sequence whose per-layer caches are k, v (v unused for MLA).
struct Segment {
  std::vector<Tensor>* k = nullptr;
  std::vector<Tensor>* v = nullptr;
  std::int64_t p0 = 0, t0 = 0, n = 0;
};

/// Runs a pass's tokens ids[0, T) through the layers, segment by segment (each a sequence's tokens
/// at its positions, appended to its caches), in `mode`; leaves the final hidden states (before
/// the final norm) in x [T, D] and adds the time per part to `stats`.
void run_layers(const Decoder& d, ComputeMode mode, const std::int32_t* ids, std::int64_t T,
                const std::vector<Segment>& segs, Tensor& x, LmStats& stats);

/// The final norm and the head on rows [first, first + rows) of x, into out [rows, vocab].
void head(const Decoder& d, ComputeMode mode, const Tensor& x, std::int64_t first, std::int64_t rows, float* out);

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t);

/// RMSNorm of n elements: y = x / sqrt(mean(x²) + eps) · w (w null: no weight), sums in double.
void rms_norm(const float* x, const float* w, std::int64_t n, double eps, float* y);

/// Rotates `x` (one head, `rope.dims` leading elements) to position `pos`.
void apply_rope(const Rope& rope, std::int64_t pos, float* x);

}  // namespace moekit::model
