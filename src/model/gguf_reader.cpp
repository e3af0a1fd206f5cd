// A GGUF file -> the decoder's data (decoder.hpp): the metadata read as llama.cpp reads it for
// the architecture, every tensor under llama.cpp's names (token_embd, blk.L.attn_*, ffn_*,
// output_norm, output) mapped in place. What differs between families is a row of kArchs; what a
// file shows by its tensors (biases, QK-norm and its width, sinks, dense or MoE feed-forward) is
// read from the tensors themselves.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string_view>

#include "io/gguf_tensors.hpp"
#include "model/decoder.hpp"
#include "moekit/gguf.hpp"
#include "moekit/model.hpp"
#include "moekit/tokenizer.hpp"
#include "util/error.hpp"

namespace moekit::model {

namespace {

// What llama.cpp does differently per architecture, beyond what the tensors show.
struct Arch {
  std::string_view name;  // general.architecture
  RopeLayout rope = RopeLayout::neox;
  bool swa_even_layers = false;  // sliding-window attention on layers 0, 2, 4, ... (GPT-OSS)
  bool yarn_truncate = true;     // transformers' YaRN `truncate` (GPT-OSS's releases: false)
  bool llama4 = false;           // NoPE layers, chunked attention, L2 QK-norm, temperature tuning
  bool nextn = false;            // the last `nextn_predict_layers` blocks are MTP layers, not run
  bool mla = false;              // DeepSeek's MLA (attn_q_a / attn_kv_a_mqa / attn_k_b / attn_v_b)
};

constexpr Arch kArchs[] = {
    {.name = "qwen3moe"},
    {.name = "qwen2moe"},
    {.name = "llama", .rope = RopeLayout::interleaved},  // Mixtral; the converter permuted Q/K rows
    {.name = "olmoe"},
    {.name = "glm4moe", .nextn = true},
    {.name = "gpt-oss", .swa_even_layers = true, .yarn_truncate = false},
    {.name = "minimax-m2"},
    {.name = "llama4", .rope = RopeLayout::interleaved, .llama4 = true},
    // DeepSeek-V2 / V3 / R1, Kimi-K2, GLM-4.7-Flash: the rope pairs are interleaved as released
    {.name = "deepseek2", .rope = RopeLayout::interleaved, .nextn = true, .mla = true},
};

std::string supported() {
  std::string s;
  for (const Arch& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

[[noreturn]] void fail(const GgufModel& m, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::gguf] " << m.path() << ": " << what));
}

class Meta {
 public:
  Meta(const GgufModel& m, std::string_view arch) : m_(m), arch_(arch) {}
  std::string key(const std::string& k) const { return arch_ + "." + k; }
  bool has(const std::string& k) const { return m_.has(key(k)); }
  std::int64_t integer(const std::string& k) const {
    if (!has(k)) fail(m_, "missing metadata '" + key(k) + "', which llama.cpp requires for " + arch_);
    const GgufValue& v = m_.get(key(k));
    if (v.type() == GgufType::array) {  // one value per layer: moekit runs one value for all
      const std::vector<std::int64_t> all = v.as_ints();
      if (all.empty() || std::any_of(all.begin(), all.end(), [&](std::int64_t x) { return x != all.front(); }))
        fail(m_, "metadata '" + key(k) + "' differs between layers, which moekit does not run");
      return all.front();
    }
    if (!v.is_integer()) fail(m_, "metadata '" + key(k) + "' is " + v.describe() + ", not an integer");
    return v.as_int();
  }
  std::int64_t integer(const std::string& k, std::int64_t fallback) const { return has(k) ? integer(k) : fallback; }
  double number(const std::string& k, double fallback) const {
    if (!has(k)) return fallback;
    const GgufValue& v = m_.get(key(k));
    if (!v.is_float() && !v.is_integer()) fail(m_, "metadata '" + key(k) + "' is " + v.describe() + ", not a number");
    const double x = v.as_float();
    if (!std::isfinite(x)) fail(m_, "metadata '" + key(k) + "' is not finite");
    return x;
  }
  std::string text(const std::string& k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    const GgufValue& v = m_.get(key(k));
    if (v.type() != GgufType::string) fail(m_, "metadata '" + key(k) + "' is " + v.describe() + ", not a string");
    return v.as_string();
  }

 private:
  const GgufModel& m_;
  std::string arch_;
};

const Arch& arch_of(const GgufModel& m) {
  if (!m.has("general.architecture")) fail(m, "missing metadata 'general.architecture'");
  const GgufValue& v = m.get("general.architecture");
  if (v.type() != GgufType::string) fail(m, "metadata 'general.architecture' is " + v.describe() + ", not a string");
  const std::string name = v.as_string();
  for (const Arch& a : kArchs)
    if (a.name == name) return a;
  fail(m, "architecture '" + name + "' is not a model moekit runs whole (supported: " + supported() + ")");
}

Linear linear(const detail::GgufTensors& r, const std::string& name, std::int64_t out, std::int64_t in) {
  Linear l;
  l.w = r.matrix(name + ".weight", 0, out, in);
  if (r.find(name + ".bias")) l.bias = r.f32(name + ".bias", {out});
  return l;
}

// RoPE of the file: base, rotated dims, scaling (linear, YaRN; llama3-style factors are the
// rope_freqs tensor llama.cpp's converter writes).
Rope rope_of(const GgufModel& m, const Arch& a, const Meta& meta, std::int64_t head_dim, std::string& describe) {
  Rope rope;
  rope.layout = a.rope;
  rope.dims = meta.integer("rope.dimension_count", head_dim);
  if (rope.dims < 2 || rope.dims > head_dim || rope.dims % 2 != 0)
    fail(m, MOEKIT_MSG("metadata '" << meta.key("rope.dimension_count") << "' is " << rope.dims
                                    << ", expected an even number in [2, " << head_dim << "]"));
  const double theta = meta.number("rope.freq_base", 10000.0);
  if (theta <= 1.0) fail(m, MOEKIT_MSG("metadata '" << meta.key("rope.freq_base") << "' is " << theta));
  rope.inv_freq = rope_frequencies(theta, rope.dims);
  describe = MOEKIT_MSG((a.rope == RopeLayout::neox ? "neox" : "interleaved")
                        << ", " << rope.dims << " of " << head_dim << " dims, theta " << theta);
  const std::string type = meta.text("rope.scaling.type", "none");
  const double factor = meta.number("rope.scaling.factor", 1.0);
  if (type == "yarn") {
    const double orig = meta.number("rope.scaling.original_context_length", 0.0);
    if (factor <= 1.0 || orig <= 0.0)
      fail(m, MOEKIT_MSG("YaRN needs 'rope.scaling.factor' > 1 and 'rope.scaling.original_context_length' > 0, got "
                         << factor << " and " << orig));
    const double beta_fast = meta.number("rope.scaling.yarn_beta_fast", 32.0);
    const double beta_slow = meta.number("rope.scaling.yarn_beta_slow", 1.0);
    // deepseek2 with yarn_log_multiplier (0.1 · mscale_all_dim): llama.cpp scales cos and sin by
    // mscale(factor, mscale) / mscale(factor, mscale_all_dim) = 1 (it takes mscale = mscale_all_dim,
    // as DeepSeek's configs have them) and the softmax by mscale(factor, mscale_all_dim)².
    const double given = a.mla && meta.has("rope.scaling.yarn_log_multiplier") ? 1.0 : 0.0;
    rope.attention_factor =
        apply_yarn(rope.inv_freq, theta, rope.dims, factor, orig, beta_fast, beta_slow, a.yarn_truncate, given);
    describe += MOEKIT_MSG(", yarn x" << factor << " of " << orig);
  } else if (type == "linear") {
    if (factor <= 0.0) fail(m, MOEKIT_MSG("metadata 'rope.scaling.factor' is " << factor));
    for (float& f : rope.inv_freq) f = static_cast<float>(f / factor);
    describe += MOEKIT_MSG(", linear x" << factor);
  } else if (type != "none") {
    fail(m, "rope scaling '" + type + "' is not one moekit runs (none, linear, yarn)");
  }
  if (const GgufTensorInfo* ff = m.find("rope_freqs.weight")) {
    const detail::GgufTensors r(m, "");
    const Tensor f = r.f32("rope_freqs.weight", {rope.dims / 2});
    for (std::int64_t i = 0; i < rope.dims / 2; ++i) {
      const float d = f.data_as<float>()[i];
      if (!(d > 0.0f)) r.fail("rope_freqs.weight", MOEKIT_MSG("has factor " << d << " at " << i));
      rope.inv_freq[static_cast<std::size_t>(i)] /= d;
    }
    (void)ff;
    describe += ", rope_freqs";
  }
  return rope;
}

// One layer's MLA tensors as llama.cpp's converter writes them: attn_q (V2-Lite) or attn_q_a,
// attn_q_a_norm, attn_q_b; attn_kv_a_mqa, attn_kv_a_norm; kv_b_proj split per head into attn_k_b
// ({nope, kv_lora, H}: already transposed for the absorption) and attn_v_b ({kv_lora, v, H}), used
// in place; or an older file's unsplit attn_kv_b, decoded (split_kv_b).
void read_mla(const detail::GgufTensors& r, Decoder& d, const Mla& dims, Attention& at) {
  at.mla = std::make_unique<Mla>(dims);
  Mla& m = *at.mla;
  const std::int64_t qk = m.nope + m.rope;
  if (m.q_lora > 0) {
    m.q_a = linear(r, "attn_q_a", m.q_lora, d.D);
    m.q_a_norm = r.f32("attn_q_a_norm.weight", {m.q_lora});
    m.q_b = linear(r, "attn_q_b", d.H * qk, m.q_lora);
  } else {
    at.q = linear(r, "attn_q", d.H * qk, d.D);
  }
  m.kv_a = linear(r, "attn_kv_a_mqa", m.row(), d.D);
  m.kv_a_norm = r.f32("attn_kv_a_norm.weight", {m.kv_lora});
  if (r.find("attn_k_b.weight")) {
    m.k_b = r.matrix("attn_k_b.weight", d.H, m.kv_lora, m.nope);
    m.v_b = r.matrix("attn_v_b.weight", d.H, m.v, m.kv_lora);
  } else {
    split_kv_b(r.matrix("attn_kv_b.weight", 0, d.H * (m.nope + m.v), m.kv_lora), d.H, m, d.keep_alive);
  }
}

}  // namespace

Decoder read_gguf(const std::string& path, const LmOptions& options) {
  std::shared_ptr<const GgufModel> file = GgufModel::open(path);
  const GgufModel& m = *file;
  const Arch& a = arch_of(m);
  const Meta meta(m, a.name);
  Decoder d;
  d.keep_alive.push_back(file);
  LmInfo& info = d.info;
  info.arch = std::string(a.name);
  info.path = path;
  const std::int64_t blocks = meta.integer("block_count");
  const std::int64_t nextn = a.nextn ? meta.integer("nextn_predict_layers", 0) : 0;
  if (blocks < 1 || nextn < 0 || nextn >= blocks)
    fail(m, MOEKIT_MSG("block_count " << blocks << " with " << nextn << " next-n layers"));
  const std::int64_t L = blocks - nextn;
  d.D = meta.integer("embedding_length");
  d.H = meta.integer("attention.head_count");
  d.KV = meta.integer("attention.head_count_kv", d.H);
  if (d.D < 1 || d.H < 1 || d.KV < 1 || d.H % d.KV != 0)
    fail(m, MOEKIT_MSG("embedding_length " << d.D << ", head_count " << d.H << ", head_count_kv " << d.KV
                                           << ": expected positive values, head_count a multiple of head_count_kv"));
  d.head_dim = meta.integer(a.mla ? "attention.key_length_mla" : "attention.key_length",
                            meta.integer("attention.key_length", d.D / d.H));
  d.v_head_dim = meta.integer(a.mla ? "attention.value_length_mla" : "attention.value_length",
                              meta.integer("attention.value_length", d.head_dim));
  if (d.head_dim < 2 || d.v_head_dim < 1 || d.head_dim > 1024 || d.v_head_dim > 1024)
    fail(m, MOEKIT_MSG("head dims " << d.head_dim << " / " << d.v_head_dim << " outside [2, 1024]"));
  d.rms_eps = meta.number("attention.layer_norm_rms_epsilon", 1e-6);
  if (!(d.rms_eps > 0.0) || d.rms_eps > 1.0) fail(m, MOEKIT_MSG("rms epsilon " << d.rms_eps));
  d.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  info.train_ctx = meta.integer("context_length", 4096);
  info.ctx = options.ctx > 0 ? options.ctx : std::min<std::int64_t>(info.train_ctx, 4096);
  if (info.ctx < 1 || info.ctx > (std::int64_t{1} << 24))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm] context " << info.ctx << " outside [1, 2^24]"));
  std::unique_ptr<Mla> mla;
  if (a.mla) {
    mla = std::make_unique<Mla>();
    mla->q_lora = meta.integer("attention.q_lora_rank", 0);
    mla->kv_lora = meta.integer("attention.kv_lora_rank");
    mla->rope = meta.integer("rope.dimension_count");
    mla->nope = d.head_dim - mla->rope;
    mla->v = d.v_head_dim;
    if (mla->q_lora < 0 || mla->kv_lora < 1 || mla->kv_lora > 8192 || mla->rope < 2 || mla->nope < 1)
      fail(m, MOEKIT_MSG("MLA dims: q_lora_rank " << mla->q_lora << ", kv_lora_rank " << mla->kv_lora << ", rope "
                                                  << mla->rope << " of key_length_mla " << d.head_dim));
  }
  d.rope = rope_of(m, a, meta, a.mla ? mla->rope : d.head_dim, info.rope);
  if (a.mla) {
    // The softmax scale: (qk head dim)^-1/2, times mscale(factor, mscale_all_dim)² under YaRN.
    const double log_mul = meta.number("rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    const double factor = meta.number("rope.scaling.factor", 1.0);
    const double ms = meta.text("rope.scaling.type", "none") == "yarn" && log_mul != 0.0 && factor > 1.0
                          ? 0.1 * log_mul * std::log(factor) + 1.0
                          : 1.0;
    d.attn_scale = static_cast<float>(ms * ms / std::sqrt(static_cast<double>(d.head_dim)));
  }

  const detail::GgufTensors top(m, "");
  const GgufTensorInfo* emb = m.find("token_embd.weight");
  if (!emb || emb->ne.size() != 2) fail(m, "missing tensor 'token_embd.weight' [vocab, embedding_length]");
  d.vocab = emb->ne[1];
  d.embed = top.matrix("token_embd.weight", 0, d.vocab, d.D);
  d.output_norm = top.f32("output_norm.weight", {d.D});
  d.head = m.find("output.weight") ? top.matrix("output.weight", 0, d.vocab, d.D) : d.embed;

  // The MoE blocks: their config as the block loader reads it, its schedule deciding which
  // layers are MoE (a llama layer is MoE iff it has a router).
  const bool has_experts = meta.integer("expert_count", 0) > 0;
  MoeConfig moe_config;
  if (has_experts) moe_config = gguf_config(m);
  const std::int64_t window = meta.integer("attention.sliding_window", 0);
  for (std::int64_t l = 0; l < L; ++l) {
    const detail::GgufTensors r(m, "blk." + std::to_string(l) + ".");
    Layer layer;
    layer.attn_norm = r.f32("attn_norm.weight", {d.D});
    const char* ffn_norm = r.find("ffn_norm.weight") ? "ffn_norm.weight" : "post_attention_norm.weight";
    layer.ffn_norm = r.f32(ffn_norm, {d.D});
    Attention& at = layer.attn;
    if (mla) {
      read_mla(r, d, *mla, at);
    } else {
      at.q = linear(r, "attn_q", d.H * d.head_dim, d.D);
      at.k = linear(r, "attn_k", d.KV * d.head_dim, d.D);
      at.v = linear(r, "attn_v", d.KV * d.v_head_dim, d.D);
    }
    at.o = linear(r, "attn_output", d.D, d.H * d.v_head_dim);
    if (const GgufTensorInfo* qn = r.find("attn_q_norm.weight")) {
      const bool per_head = qn->numel() == d.head_dim;
      at.qk_norm = per_head ? QkNorm::per_head : QkNorm::whole;
      at.q_norm = r.f32("attn_q_norm.weight", {per_head ? d.head_dim : d.H * d.head_dim});
      at.k_norm = r.f32("attn_k_norm.weight", {per_head ? d.head_dim : d.KV * d.head_dim});
    }
    if (r.find("attn_sinks.weight")) at.sinks = r.f32("attn_sinks.weight", {d.H});
    if (a.swa_even_layers && l % 2 == 0) at.window = window;
    if (a.llama4) {
      // llama.cpp's llama4: without a sliding_window key of 0, every 4th layer is NoPE with full
      // attention and temperature tuning, the others chunked (8192) with the L2 QK-norm, except
      // on the 128-expert model (Maverick); the constants are Llama-4's release values, which
      // llama.cpp's converter does not store.
      const bool all_rope = meta.has("attention.sliding_window") && window == 0;
      at.rope = all_rope || (l + 1) % 4 != 0;
      if (!all_rope && at.rope) {
        at.chunk = 8192;
        if (meta.integer("expert_count", 0) != 128) at.qk_norm = QkNorm::l2;
      }
      at.temperature_tuning = !all_rope && !at.rope;
    }
    const bool moe = has_experts && r.find("ffn_gate_inp.weight") != nullptr;
    if (moe) {
      layer.moe = std::make_unique<MoeLayer>(load_moe_layer(file, moe_config, l));
      layer.moe->set_compute_mode(options.mode.value_or(ComputeMode::exact));
      info.moe_layers.push_back(l);
    } else {
      const GgufTensorInfo* up = r.find("ffn_up.weight");
      if (!up || up->ne.size() != 2) r.fail("ffn_up.weight", "is missing: the layer has neither experts nor an MLP");
      const std::int64_t F = up->ne[1];
      layer.dense.gate = r.matrix("ffn_gate.weight", 0, F, d.D);
      layer.dense.up = r.matrix("ffn_up.weight", 0, F, d.D);
      layer.dense.down = r.matrix("ffn_down.weight", 0, d.D, F);
      layer.dense.keep_alive.push_back(file);
      layer.dense_body.kind = BodyKind::swiglu;
    }
    d.layers.push_back(std::move(layer));
  }
  info.num_layers = L;
  for (std::int64_t l = L; l < blocks; ++l) {  // those the file holds (a trunk-only file has none)
    const std::string b = "blk." + std::to_string(l) + ".";
    if (m.find(b + "nextn.eh_proj.weight") || m.find(b + "attn_norm.weight")) info.mtp_layers.push_back(l);
  }
  info.hidden_size = d.D;
  info.vocab_size = d.vocab;
  info.num_heads = d.H;
  info.num_kv_heads = d.KV;
  info.head_dim = d.head_dim;
  info.value_head_dim = d.v_head_dim;
  if (mla) use_latent_cache(d, *mla);
  attach_tokenizer(d, [&] { return Tokenizer::from_gguf(m.first()); });
  return d;
}

}  // namespace moekit::model
