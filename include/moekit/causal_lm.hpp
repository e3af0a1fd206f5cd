// Whole models: a decoder-only MoE language model opened from its file — embeddings, each layer's
// attention (RoPE, a KV cache) and feed-forward block (moekit's MoE block, or a dense MLP), the
// final norm and the head — with sampling, for `moekit generate` (docs/models.md).
//
// A model is data: one decoder, each family a row of what differs (rope layout and scaling,
// QK-norm, biases, sinks, sliding windows, NoPE layers, dense and MoE layers). The weights are
// used in place from the mapped file, in every format the MoE block reads; nothing is expanded
// to float.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "moekit/compute_mode.hpp"
#include "moekit/config.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

class Tokenizer;

/// How a model is opened.
struct LmOptions {
  /// Context length of the sequences it serves (prompt + generated tokens). 0: the model's own
  /// training context, capped at 4096 (a larger one is asked for explicitly).
  std::int64_t ctx = 0;
  /// The compute mode of every projection of the model: attention, dense and MoE layers, head.
  /// Unset: the arithmetic of the file's own ecosystem — int8 for a GGUF (ggml multiplies its
  /// block types against int8 activations, as llama.cpp computes; float weights stay exact) and
  /// exact for a release folder. options() gives the mode chosen.
  std::optional<ComputeMode> mode;
  /// Prompts run through the model this many tokens at a time (the last chunk may be shorter).
  std::int64_t prefill_chunk = 256;
};

/// What a model is, as moekit read it (inspect, messages, `generate -o json`).
struct LmInfo {
  std::string arch;  ///< "qwen3moe", "llama", "gpt-oss", ...
  std::string path;
  std::int64_t num_layers = 0;  ///< decoder layers run (MTP / next-n layers excluded)
  std::int64_t hidden_size = 0;
  std::int64_t vocab_size = 0;
  std::int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, value_head_dim = 0;
  std::int64_t train_ctx = 0;            ///< the model's own context length
  std::int64_t ctx = 0;                  ///< the context its sequences have here
  std::vector<std::int64_t> moe_layers;  ///< the layers whose feed-forward block is MoE
  /// Multi-token-prediction (next-n) layers the file holds after the decoder's (DeepSeek-V3,
  /// GLM-4.x): not run, not loaded.
  std::vector<std::int64_t> mtp_layers;
  std::int64_t cache_bytes_per_token = 0;  ///< KV cache bytes one token takes over all layers
  std::string rope;                        ///< "neox, 64 of 128 dims, theta 10000, yarn x32", ...
  std::string attention;  ///< per-family features: "qk-norm per head, sinks, window 128 on even layers", ...
  /// Tokenizer::describe() of the model's tokenizer, or "none: " and why (a file without one, or
  /// one moekit does not read: the reason names the key or component).
  std::string tokenizer;
};

class CausalLm;

/// One sequence's state: its KV cache (f32, per layer [ctx, kv_heads, head_dim] keys and values)
/// and the number of tokens it holds. Made by CausalLm::new_sequence; used with that model only.
class Sequence {
 public:
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;
  std::int64_t size() const noexcept { return n_; }  ///< tokens in the cache
  std::int64_t capacity() const noexcept { return ctx_; }
  /// Forgets the tokens from `n` on (n <= size()); 0 empties the sequence.
  void truncate(std::int64_t n);
  /// Bytes the cache holds.
  std::size_t nbytes() const noexcept;

 private:
  friend class CausalLm;
  Sequence() = default;
  std::int64_t n_ = 0, ctx_ = 0;
  std::vector<Tensor> k_, v_;  // per layer [ctx, kv_heads, head_dim]
};

/// Sampling (llama.cpp's order: repetition penalty, top-k, top-p, min-p, temperature). The
/// default is greedy.
struct SamplingParams {
  double temperature = 0.0;         ///< 0: greedy (argmax; the lowest id wins a tie)
  std::int64_t top_k = 0;           ///< 0: off
  double top_p = 1.0;               ///< 1: off
  double min_p = 0.0;               ///< 0: off
  double repetition_penalty = 1.0;  ///< 1: off; over the last repeat_last_n tokens of the sequence
  std::int64_t repeat_last_n = 64;
  std::uint64_t seed = 0;  ///< the same seed, the same tokens
};

/// Checks the parameters' ranges; throws std::invalid_argument naming the one out of range.
void validate(const SamplingParams& p);

/// Draws tokens from logits as SamplingParams says. Deterministic for a seed.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  /// The next token given logits [V] and the tokens so far (for the repetition penalty).
  std::int32_t sample(const float* logits, std::int64_t V, const std::vector<std::int32_t>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, std::int32_t>> scratch_;
};

/// Timings of one generate() call.
struct GenerateTimings {
  std::int64_t prompt_tokens = 0, generated_tokens = 0;
  double prefill_ms = 0, decode_ms = 0;
};

/// Where a model's forward time went since the last reset (wall time on the calling thread).
struct LmStats {
  double moe_ms = 0;        ///< the MoE blocks (routing, experts, shared experts)
  double dense_ffn_ms = 0;  ///< dense layers' MLPs
  double attention_ms = 0;  ///< projections, QK-norm, RoPE, the cache and the softmax
  double head_ms = 0;       ///< embeddings, final norm and the head (the output projection)
  std::int64_t tokens = 0;
};

/// Called with each generated token as it is made; return false to stop.
using TokenCallback = std::function<bool(std::int32_t id)>;

/// A whole model opened from its file.
class CausalLm {
 public:
  /// Opens a GGUF model (split files from any part): its config from the metadata as llama.cpp
  /// reads it for the architecture, every tensor mapped and checked (name, shape, a type moekit
  /// computes on). Throws std::runtime_error naming the file and the key or tensor; an
  /// architecture moekit does not run is named with those it does.
  static std::shared_ptr<CausalLm> open(const std::string& path, const LmOptions& options = {});
  /// A small Qwen3-MoE-shaped model (4 layers, hidden 256, 8 heads over 2 KV heads, 32 experts
  /// top-4, vocabulary 4096, no tokenizer) with random f32 weights drawn from `seed`, built in
  /// memory: for demos, tests and benchmarks that need a whole model without a file.
  static std::shared_ptr<CausalLm> random(std::uint64_t seed, const LmOptions& options = {});
  ~CausalLm();

  const LmInfo& info() const noexcept;
  const LmOptions& options() const noexcept;
  /// The model's tokenizer, or nullptr when its file has none moekit reads.
  std::shared_ptr<const Tokenizer> tokenizer() const noexcept;
  /// A new empty sequence of options().ctx tokens.
  std::unique_ptr<Sequence> new_sequence() const;

  /// Runs `ids` at the end of `seq` (appending them to its cache) and returns their logits:
  /// [ids.size(), V] with `all_logits`, else [1, V] for the last token only. Prompts longer than
  /// options().prefill_chunk run in chunks. Throws std::invalid_argument for an id outside the
  /// vocabulary or a sequence that would pass its capacity (nothing appended then).
  Tensor forward(Sequence& seq, const std::vector<std::int32_t>& ids, bool all_logits = false) const;

  /// One decode step of several sequences together: ids[i] at the end of *seqs[i], each appended to
  /// its own cache, in one pass through the layers — every projection, dense layer and MoE block
  /// over the B rows at once (a MoE block reads each expert the B tokens chose once), attention per
  /// sequence. Returns logits [B, V]. In the exact mode row i is the bits forward(*seqs[i], {ids[i]})
  /// gives, whatever runs beside it (batch invariance); in the int8 mode the kernels' rounding
  /// depends on the number of rows (docs/models.md). Throws std::invalid_argument for no sequences,
  /// a count of ids that differs, a sequence given twice, a full one, one of another model or an id
  /// outside the vocabulary (nothing appended then).
  Tensor decode(const std::vector<Sequence*>& seqs, const std::vector<std::int32_t>& ids) const;

  /// One pass over several sequences, each given its next tokens: one while it decodes, a chunk of
  /// its prompt while it is prefilled — continuous batching's step, where a prompt's chunk shares
  /// the pass (and each MoE block's expert reads) with the other sequences' decode tokens. ids[i]
  /// go at the end of *seqs[i], appended to its cache. Returns logits [B, V]: row i for the last of
  /// ids[i]. In the exact mode row i is the bits forward(*seqs[i], ids[i]) gives alone, whatever
  /// runs beside it and however a prompt is cut into chunks; decode() is step() with one token
  /// each. The caller bounds the rows of a pass (activations are O(rows · hidden)). Throws
  /// std::invalid_argument as decode() does, and for an empty list (nothing appended then).
  Tensor step(const std::vector<Sequence*>& seqs, const std::vector<std::vector<std::int32_t>>& ids) const;

  /// Greedy or sampled continuation of `prompt` in a fresh sequence: up to `max_tokens` tokens,
  /// stopping after an end-of-generation token of the tokenizer (included) or when `on_token`
  /// returns false. Returns the generated ids.
  std::vector<std::int32_t> generate(const std::vector<std::int32_t>& prompt, std::int64_t max_tokens,
                                     const SamplingParams& sampling, const TokenCallback& on_token = {},
                                     GenerateTimings* timings = nullptr) const;

  /// Time per part of every forward and decode since the last reset_stats() (or open), summed
  /// over the calls (concurrent ones included: each adds its own when it ends).
  LmStats stats() const;
  void reset_stats() const;

  struct Impl;

 private:
  CausalLm() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit
