// A Hugging Face / mlx-lm checkpoint folder -> the decoder's data (decoder.hpp): config.json read as
// transformers reads it for the family (rope_parameters or rope_theta + rope_scaling, partial
// rotary, layer_types, Llama-4's NoPE / chunked layers), the tensors under transformers' names
// (model.embed_tokens, model.layers.L.self_attn.*, input_layernorm, post_attention_layernorm,
// model.norm, lm_head) in every format the MoE block reads, used in place. What a file shows by
// its tensors (biases, QK-norm and its width, sinks, dense or MoE feed-forward, a tied head) is
// read from the tensors.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "io/block_reader.hpp"
#include "model/decoder.hpp"
#include "moekit/model.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/tokenizer.hpp"
#include "util/error.hpp"

namespace moekit::model {

namespace {

using nlohmann::json;

// What transformers does differently per model_type, beyond what config.json and the tensors say.
struct HfArch {
  std::string_view model_type;
  RopeLayout rope = RopeLayout::neox;
  bool llama4 = false;
  bool mla = false;  // DeepSeek's MLA; rope interleaved unless config.json's rope_interleave is false
};

constexpr HfArch kHfArchs[] = {
    {.model_type = "qwen3_moe"},
    {.model_type = "qwen2_moe"},
    {.model_type = "mixtral"},
    {.model_type = "olmoe"},
    {.model_type = "glm4_moe"},
    {.model_type = "gpt_oss"},
    {.model_type = "minimax_m2"},
    {.model_type = "minimax"},
    {.model_type = "llama4", .rope = RopeLayout::interleaved, .llama4 = true},
    {.model_type = "llama4_text", .rope = RopeLayout::interleaved, .llama4 = true},
    {.model_type = "deepseek_v2", .rope = RopeLayout::interleaved, .mla = true},
    {.model_type = "deepseek_v3", .rope = RopeLayout::interleaved, .mla = true},
    {.model_type = "kimi_k2", .rope = RopeLayout::interleaved, .mla = true},
    {.model_type = "glm4_moe_lite", .rope = RopeLayout::interleaved, .mla = true},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::CausalLm] " << file << ": " << what));
}

// A field of config.json, with messages naming it.
class Config {
 public:
  Config(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}
  const json& raw() const { return j_; }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  std::int64_t integer(const char* k) const {
    if (!has(k) || !j_[k].is_number_integer()) fail(file_, std::string("config.json needs an integer '") + k + "'");
    return j_[k].get<std::int64_t>();
  }
  std::int64_t integer(const char* k, std::int64_t fallback) const { return has(k) ? integer(k) : fallback; }
  double number(const json& obj, const char* k, double fallback) const {
    if (!obj.contains(k) || obj[k].is_null()) return fallback;
    if (!obj[k].is_number()) fail(file_, std::string("config.json's '") + k + "' is not a number");
    const double v = obj[k].get<double>();
    if (!std::isfinite(v)) fail(file_, std::string("config.json's '") + k + "' is not finite");
    return v;
  }
  double number(const char* k, double fallback) const { return number(j_, k, fallback); }
  bool boolean(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) fail(file_, std::string("config.json's '") + k + "' is not a bool");
    return j_[k].get<bool>();
  }
  const std::string& file() const { return file_; }

 private:
  json j_;
  std::string file_;
};

// RoPE as transformers' ROPE_INIT_FUNCTIONS compute it: default, linear, yarn, llama3.
Rope rope_of(const Config& c, const HfArch& a, std::int64_t head_dim, std::string& describe, double* mla_scale) {
  const json& j = c.raw();
  json params =
      j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : json::object();
  if (params.empty() && j.contains("rope_scaling") && j["rope_scaling"].is_object()) params = j["rope_scaling"];
  const double theta = c.number(params, "rope_theta", c.number("rope_theta", 10000.0));
  double partial = c.number(params, "partial_rotary_factor", c.number("partial_rotary_factor", 1.0));
  Rope rope;
  rope.layout = a.rope;
  if (a.mla && !c.boolean("rope_interleave", true)) rope.layout = RopeLayout::neox;
  rope.dims = c.has("rotary_dim") ? c.integer("rotary_dim") : static_cast<std::int64_t>(head_dim * partial);
  if (rope.dims < 2 || rope.dims > head_dim || rope.dims % 2 != 0)
    fail(c.file(), MOEKIT_MSG("rotary dims " << rope.dims << " (of head_dim " << head_dim
                                             << ") must be even and in [2, head_dim]"));
  if (theta <= 1.0) fail(c.file(), MOEKIT_MSG("rope_theta " << theta));
  rope.inv_freq = rope_frequencies(theta, rope.dims);
  describe = MOEKIT_MSG((rope.layout == RopeLayout::neox ? "neox" : "interleaved")
                        << ", " << rope.dims << " of " << head_dim << " dims, theta " << theta);
  std::string type = "default";
  if (params.contains("rope_type") && params["rope_type"].is_string())
    type = params["rope_type"].get<std::string>();
  else if (params.contains("type") && params["type"].is_string())
    type = params["type"].get<std::string>();
  const double factor = c.number(params, "factor", 1.0);
  const double orig = c.number(params, "original_max_position_embeddings", c.number("max_position_embeddings", 0.0));
  if (type == "default") return rope;
  if (type == "linear") {
    if (factor <= 0.0) fail(c.file(), MOEKIT_MSG("linear rope factor " << factor));
    for (float& f : rope.inv_freq) f = static_cast<float>(f / factor);
    describe += MOEKIT_MSG(", linear x" << factor);
  } else if (type == "yarn") {
    if (factor <= 1.0 || orig <= 0.0)
      fail(c.file(), MOEKIT_MSG("yarn needs factor > 1 and original_max_position_embeddings > 0, got "
                                << factor << " and " << orig));
    const bool truncate =
        !params.contains("truncate") || !params["truncate"].is_boolean() || params["truncate"].get<bool>();
    // transformers: attention_factor, else mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    // where both are given and non-zero, else mscale(factor) (apply_yarn's default).
    const auto mscale = [&](double m) { return 0.1 * m * std::log(factor) + 1.0; };
    const double ms = c.number(params, "mscale", 0.0), ms_all = c.number(params, "mscale_all_dim", 0.0);
    double attention_factor = c.number(params, "attention_factor", 0.0);
    if (attention_factor <= 0.0 && ms != 0.0 && ms_all != 0.0) attention_factor = mscale(ms) / mscale(ms_all);
    rope.attention_factor =
        apply_yarn(rope.inv_freq, theta, rope.dims, factor, orig, c.number(params, "beta_fast", 32.0),
                   c.number(params, "beta_slow", 1.0), truncate, attention_factor);
    // MLA (yarn_apply_mscale): the softmax scale times mscale(factor, mscale_all_dim)².
    if (mla_scale && ms_all != 0.0) *mla_scale = mscale(ms_all) * mscale(ms_all);
    describe += MOEKIT_MSG(", yarn x" << factor << " of " << orig);
  } else if (type == "llama3") {
    const double low = c.number(params, "low_freq_factor", 1.0), high = c.number(params, "high_freq_factor", 4.0);
    if (factor <= 0.0 || orig <= 0.0 || high <= low)
      fail(c.file(),
           "llama3 rope needs factor > 0, original_max_position_embeddings > 0, high_freq_factor > low_freq_factor");
    const double pi = 3.14159265358979323846;
    const double low_wavelen = orig / low, high_wavelen = orig / high;
    for (float& f : rope.inv_freq) {
      const double wavelen = 2.0 * pi / f;
      double v = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (orig / wavelen - low) / (high - low);
        v = (1.0 - smooth) * v / factor + smooth * v;
      }
      f = static_cast<float>(v);
    }
    describe += MOEKIT_MSG(", llama3 x" << factor);
  } else {
    fail(c.file(), "rope_type '" + type + "' is not one moekit runs (default, linear, yarn, llama3)");
  }
  return rope;
}

Linear linear(const detail::BlockReader& r, const std::string& name, std::int64_t out, std::int64_t in,
              std::vector<std::shared_ptr<const void>>& keep) {
  bool copied = false;
  Linear l;
  l.w = r.matrix(name, 0, out, in, keep, copied, /*projection=*/false);
  if (r.has(name + ".bias")) l.bias = r.get_f32(name + ".bias", {out});
  return l;
}

}  // namespace

Decoder read_hf(const std::string& path, const LmOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail(path, "no such file or folder (a model is a GGUF file or a folder with config.json)");
  const std::string dir = fs::is_directory(path) ? path : fs::path(path).parent_path().string();
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ifstream in(cfg_path);
  if (!in) fail(cfg_path, "cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(cfg_path, std::string("is not JSON: ") + e.what());
  }
  if (!j.is_object()) fail(cfg_path, "is not a JSON object");
  const MoeConfig moe_config = load_hf_config(dir);
  const json text = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : j;
  const Config c(text, cfg_path);
  const std::string model_type = j.value("model_type", std::string());
  const HfArch* arch = nullptr;
  for (const HfArch& a : kHfArchs)
    if (a.model_type == model_type) arch = &a;
  if (!arch) {
    std::string list;
    for (const HfArch& a : kHfArchs) list += (list.empty() ? "" : ", ") + std::string(a.model_type);
    fail(cfg_path, "model_type '" + model_type + "' is not a model moekit runs whole (supported: " + list + ")");
  }
  const std::shared_ptr<const Checkpoint> ckpt = Checkpoint::open(dir);
  Decoder d;
  d.keep_alive.push_back(ckpt);
  LmInfo& info = d.info;
  info.arch = model_type;
  info.path = path;
  const std::int64_t L = c.integer("num_hidden_layers");
  d.D = c.integer("hidden_size");
  d.H = c.integer("num_attention_heads");
  d.KV = c.integer("num_key_value_heads", d.H);
  if (d.D < 1 || d.H < 1 || d.KV < 1 || d.H % d.KV != 0 || L < 1 || L > kMaxLayers)
    fail(cfg_path, MOEKIT_MSG("hidden_size " << d.D << ", num_attention_heads " << d.H << ", num_key_value_heads "
                                             << d.KV << ", num_hidden_layers " << L
                                             << ": expected positive values, heads a multiple of kv heads"));
  d.head_dim = c.integer("head_dim", d.D / d.H);
  d.v_head_dim = d.head_dim;
  if (d.head_dim < 2 || d.head_dim > 1024) fail(cfg_path, MOEKIT_MSG("head_dim " << d.head_dim));
  d.rms_eps = c.number("rms_norm_eps", 1e-6);
  if (!(d.rms_eps > 0.0) || d.rms_eps > 1.0) fail(cfg_path, MOEKIT_MSG("rms_norm_eps " << d.rms_eps));
  d.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  info.train_ctx = c.integer("max_position_embeddings", 4096);
  info.ctx = options.ctx > 0 ? options.ctx : std::min<std::int64_t>(info.train_ctx, 4096);
  if (info.ctx < 1 || info.ctx > (std::int64_t{1} << 24))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm] context " << info.ctx << " outside [1, 2^24]"));
  std::unique_ptr<Mla> mla;
  double mla_scale = 1.0;
  if (arch->mla) {
    mla = std::make_unique<Mla>();
    mla->q_lora = c.integer("q_lora_rank", 0);
    mla->kv_lora = c.integer("kv_lora_rank");
    mla->nope = c.integer("qk_nope_head_dim");
    mla->rope = c.integer("qk_rope_head_dim");
    mla->v = c.integer("v_head_dim");
    if (mla->q_lora < 0 || mla->kv_lora < 1 || mla->kv_lora > 8192 || mla->nope < 1 || mla->rope < 2 ||
        mla->rope % 2 != 0 || mla->v < 1 || mla->nope + mla->rope > 1024 || mla->v > 1024)
      fail(cfg_path, MOEKIT_MSG("MLA dims: q_lora_rank " << mla->q_lora << ", kv_lora_rank " << mla->kv_lora
                                                         << ", qk_nope_head_dim " << mla->nope << ", qk_rope_head_dim "
                                                         << mla->rope << ", v_head_dim " << mla->v));
    d.head_dim = mla->nope + mla->rope;
    d.v_head_dim = mla->v;
  }
  d.rope = rope_of(c, *arch, mla ? mla->rope : d.head_dim, info.rope, &mla_scale);
  if (mla) d.attn_scale = static_cast<float>(mla_scale / std::sqrt(static_cast<double>(d.head_dim)));

  // The layers' prefix: the MoE block's ("model.layers.{L}.mlp") up to the layer index.
  const std::string& block = moe_config.names.block;
  const std::size_t at_l = block.find("{L}");
  if (at_l == std::string::npos) fail(cfg_path, "the family's block name has no layer index: " + block);
  const std::string layers_prefix = block.substr(0, at_l);  // "model.layers."
  const std::string mlp = block.substr(at_l + 3);           // ".mlp"
  const std::string model_prefix = layers_prefix.substr(0, layers_prefix.size() - std::string("layers.").size());
  std::vector<std::shared_ptr<const void>>& keep = d.keep_alive;
  const detail::BlockReader top(ckpt, model_prefix.empty() ? "" : model_prefix.substr(0, model_prefix.size() - 1),
                                moe_config.quantization);
  const std::string embed = "embed_tokens";
  if (!top.has(embed + ".weight")) top.fail(embed + ".weight", "is missing");
  d.vocab = c.integer("vocab_size");
  bool copied = false;
  d.embed = top.matrix(embed, 0, d.vocab, d.D, keep, copied, false);
  d.output_norm = top.get_f32("norm.weight", {d.D});
  // lm_head sits beside `model.` (its parent's prefix: "" or "language_model.").
  const std::string outer = model_prefix.size() > 6 ? model_prefix.substr(0, model_prefix.size() - 6) : "";
  const detail::BlockReader head(ckpt, outer.empty() ? "" : outer.substr(0, outer.size() - 1), moe_config.quantization);
  d.head = head.has("lm_head.weight") || head.has("lm_head.scales")
               ? head.matrix("lm_head", 0, d.vocab, d.D, keep, copied, false)
               : d.embed;

  std::vector<std::string> layer_types;
  if (text.contains("layer_types") && text["layer_types"].is_array())
    for (const json& t : text["layer_types"]) layer_types.push_back(t.is_string() ? t.get<std::string>() : "");
  if (!layer_types.empty() && static_cast<std::int64_t>(layer_types.size()) != L)
    fail(cfg_path, MOEKIT_MSG("layer_types has " << layer_types.size() << " entries for " << L << " layers"));
  const std::int64_t window = c.integer("sliding_window", 0);
  std::vector<std::int64_t> no_rope;
  if (arch->llama4 && text.contains("no_rope_layers") && text["no_rope_layers"].is_array())
    for (const json& v : text["no_rope_layers"]) no_rope.push_back(v.is_number_integer() ? v.get<std::int64_t>() : 1);
  if (arch->llama4) {
    d.temp_floor_scale = c.number("floor_scale", 8192.0);
    d.temp_attn_scale = c.number("attn_scale", 0.1);
  }
  for (std::int64_t l = 0; l < L; ++l) {
    const detail::BlockReader r(ckpt, layers_prefix + std::to_string(l), moe_config.quantization);
    Layer layer;
    layer.attn_norm = r.get_f32("input_layernorm.weight", {d.D});
    layer.ffn_norm = r.get_f32("post_attention_layernorm.weight", {d.D});
    Attention& at = layer.attn;
    if (mla) {
      at.mla = std::make_unique<Mla>(*mla);
      Mla& m = *at.mla;
      if (m.q_lora > 0) {
        m.q_a = linear(r, "self_attn.q_a_proj", m.q_lora, d.D, keep);
        m.q_a_norm = r.get_f32("self_attn.q_a_layernorm.weight", {m.q_lora});
        m.q_b = linear(r, "self_attn.q_b_proj", d.H * d.head_dim, m.q_lora, keep);
      } else {
        at.q = linear(r, "self_attn.q_proj", d.H * d.head_dim, d.D, keep);
      }
      m.kv_a = linear(r, "self_attn.kv_a_proj_with_mqa", m.row(), d.D, keep);
      m.kv_a_norm = r.get_f32("self_attn.kv_a_layernorm.weight", {m.kv_lora});
      split_kv_b(r.matrix("self_attn.kv_b_proj", 0, d.H * (m.nope + m.v), m.kv_lora, keep, copied, false), d.H, m,
                 keep);
    } else {
      at.q = linear(r, "self_attn.q_proj", d.H * d.head_dim, d.D, keep);
      at.k = linear(r, "self_attn.k_proj", d.KV * d.head_dim, d.D, keep);
      at.v = linear(r, "self_attn.v_proj", d.KV * d.v_head_dim, d.D, keep);
    }
    at.o = linear(r, "self_attn.o_proj", d.D, d.H * d.v_head_dim, keep);
    if (r.has("self_attn.q_norm.weight")) {
      const bool per_head = ckpt->info(r.full("self_attn.q_norm.weight")).shape == Shape{d.head_dim};
      at.qk_norm = per_head ? QkNorm::per_head : QkNorm::whole;
      at.q_norm = r.get_f32("self_attn.q_norm.weight", {per_head ? d.head_dim : d.H * d.head_dim});
      at.k_norm = r.get_f32("self_attn.k_norm.weight", {per_head ? d.head_dim : d.KV * d.head_dim});
    }
    if (r.has("self_attn.sinks")) at.sinks = r.get_f32("self_attn.sinks", {d.H});
    const std::string type = layer_types.empty() ? std::string() : layer_types[static_cast<std::size_t>(l)];
    if (type == "sliding_attention") at.window = window;
    if (model_type == "mixtral" && window > 0) at.window = window;  // MixtralAttention: every layer
    if (arch->llama4) {
      at.rope = no_rope.empty() ? (l + 1) % 4 != 0 : no_rope[static_cast<std::size_t>(l % no_rope.size())] != 0;
      if (type == "chunked_attention" || (type.empty() && at.rope)) at.chunk = c.integer("attention_chunk_size", 8192);
      if (at.rope && c.boolean("use_qk_norm", true)) at.qk_norm = QkNorm::l2;
      at.temperature_tuning = !at.rope && c.boolean("attn_temperature_tuning", true);
    }
    if (moe_config.is_moe_layer(l)) {
      layer.moe = std::make_unique<MoeLayer>(load_moe_layer(ckpt, moe_config, l));
      layer.moe->set_compute_mode(options.mode.value_or(ComputeMode::exact));
      info.moe_layers.push_back(l);
    } else {
      const std::string base = mlp.substr(1);  // "mlp", "feed_forward"
      const std::string up = base + ".up_proj.weight";
      if (!r.has(up) && !r.has(base + ".up_proj.scales")) r.fail(up, "is missing: the layer is dense but has no MLP");
      const std::string which = r.has(up) ? up : base + ".up_proj.scales";
      const std::int64_t F = ckpt->info(r.full(which)).shape.front();
      layer.dense.gate = r.matrix(base + ".gate_proj", 0, F, d.D, keep, copied, false);
      layer.dense.up = r.matrix(base + ".up_proj", 0, F, d.D, keep, copied, false);
      layer.dense.down = r.matrix(base + ".down_proj", 0, d.D, F, keep, copied, false);
      layer.dense.keep_alive.push_back(ckpt);
      layer.dense_body.kind = BodyKind::swiglu;
    }
    d.layers.push_back(std::move(layer));
  }
  info.num_layers = L;
  for (std::int64_t l = L; l < L + std::max<std::int64_t>(c.integer("num_nextn_predict_layers", 0), 0); ++l) {
    const detail::BlockReader r(ckpt, layers_prefix + std::to_string(l), moe_config.quantization);
    if (r.has("eh_proj.weight") || r.has("input_layernorm.weight")) info.mtp_layers.push_back(l);
  }
  info.hidden_size = d.D;
  info.vocab_size = d.vocab;
  info.num_heads = d.H;
  info.num_kv_heads = d.KV;
  info.head_dim = d.head_dim;
  info.value_head_dim = d.v_head_dim;
  if (mla) use_latent_cache(d, *mla);
  if (fs::exists(fs::path(dir) / "tokenizer.json"))
    attach_tokenizer(d, [&] { return Tokenizer::from_folder(dir); });
  else
    info.tokenizer = "none: no tokenizer.json in " + dir;
  return d;
}

}  // namespace moekit::model
