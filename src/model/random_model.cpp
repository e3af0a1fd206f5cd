// CausalLm::random: a small Qwen3-MoE-shaped model with random weights built in memory, for the
// demo, tests and benchmarks that need a whole model without a file (moekit/causal_lm.hpp).
#include <cmath>
#include <stdexcept>

#include "model/decoder.hpp"
#include "moekit/config.hpp"
#include "synth/random_layer.hpp"
#include "util/error.hpp"

namespace moekit::model {

Decoder random_decoder(std::uint64_t seed, const LmOptions& options) {
  if (options.mode.value_or(ComputeMode::exact) != ComputeMode::exact)
    throw std::invalid_argument("[moekit::CausalLm::random] the random model's weights are f32: the exact mode only");
  constexpr std::int64_t kLayers = 4, kD = 256, kHeads = 8, kKvHeads = 2, kHeadDim = 32, kVocab = 4096;
  const MoeConfig cfg = parse_hf_config(
      R"({"model_type":"qwen3_moe","hidden_size":256,"num_hidden_layers":4,"num_experts":32,
          "num_experts_per_tok":4,"moe_intermediate_size":128,"norm_topk_prob":true})");
  Decoder d;
  d.D = kD;
  d.H = kHeads;
  d.KV = kKvHeads;
  d.head_dim = d.v_head_dim = kHeadDim;
  d.vocab = kVocab;
  d.rms_eps = 1e-6;
  d.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  d.rope.dims = kHeadDim;
  d.rope.inv_freq = rope_frequencies(1e6, kHeadDim);
  LmInfo& info = d.info;
  info.arch = "qwen3moe (random weights)";
  info.path = "(in memory)";
  info.tokenizer = "none: a random model has no vocabulary";
  info.train_ctx = 4096;
  info.ctx = options.ctx > 0 ? options.ctx : 4096;
  info.rope = "neox, 32 of 32 dims, theta 1e+06";
  synth::WeightSpec spec;
  spec.stddev = 0.0f;  // 1/sqrt(fan-in): unit-scale activations
  std::uint64_t stream = seed * 1000 + 500;
  const auto norm = [&](std::int64_t n) {
    Tensor t({n}, DType::f32);
    synth::fill_uniform(t, 0.1f, stream++);
    for (std::int64_t i = 0; i < n; ++i) t.data_as<float>()[i] += 1.0f;
    return t;
  };
  const auto linear = [&](std::int64_t out, std::int64_t in) {
    Linear l;
    l.w = synth::random_matrix(spec, 1, out, in, stream, d.keep_alive);
    return l;
  };
  synth::WeightSpec embed = spec;
  embed.stddev = 1.0f;
  d.embed = synth::random_matrix(embed, 1, kVocab, kD, stream, d.keep_alive);
  d.head = synth::random_matrix(spec, 1, kVocab, kD, stream, d.keep_alive);
  d.output_norm = norm(kD);
  for (std::int64_t l = 0; l < kLayers; ++l) {
    Layer layer;
    layer.attn_norm = norm(kD);
    layer.ffn_norm = norm(kD);
    layer.attn.q = linear(kHeads * kHeadDim, kD);
    layer.attn.k = linear(kKvHeads * kHeadDim, kD);
    layer.attn.v = linear(kKvHeads * kHeadDim, kD);
    layer.attn.o = linear(kD, kHeads * kHeadDim);
    layer.attn.qk_norm = QkNorm::per_head;
    layer.attn.q_norm = norm(kHeadDim);
    layer.attn.k_norm = norm(kHeadDim);
    layer.moe =
        std::make_unique<MoeLayer>(cfg, synth::random_weights(cfg, spec, seed * 7 + static_cast<std::uint64_t>(l)));
    info.moe_layers.push_back(l);
    d.layers.push_back(std::move(layer));
  }
  info.num_layers = kLayers;
  info.hidden_size = kD;
  info.vocab_size = kVocab;
  info.num_heads = kHeads;
  info.num_kv_heads = kKvHeads;
  info.head_dim = info.value_head_dim = kHeadDim;
  return d;
}

}  // namespace moekit::model
