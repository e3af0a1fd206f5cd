// quantize_checkpoint: float checkpoint folder -> mlx-lm's quantized folder layout. What mlx-lm
// does per family (its sanitize and quant/cast predicates) is data in `rules_for`; the rest is
// one pass over the tensors: plan every output tensor and its shard first (sizes follow from the
// shapes), then produce them one at a time from slabs of the source, so memory holds one packed
// tensor and a bounded float slab, never the model.
#include "moekit/quantize.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "kernels/quantize.hpp"
#include "moekit/config.hpp"
#include "moekit/safetensors.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("[moekit::quantize_checkpoint] " + what);
}

// mlx-lm's per-family behaviour (mlx_lm/models/<family>.py): whether the router is an nn.Linear
// (DeepSeek's and GLM's MoEGate is a bare parameter and never quantized), the suffix its
// quant_predicate sends to 8 bits / group 64, whether cast_predicate keeps the selection bias
// in f32, and which decoder layer index and above sanitize drops (multi-token prediction).
struct FamilyRules {
  bool router_linear = true;
  std::string router_8bit_suffix;  // empty: none
  bool keep_selection_bias_f32 = false;
  bool drop_mtp = false;
  // A parameter held by a module that has children: mlx_lm.utils.get_total_parameters counts
  // only leaf modules' parameters, so the index's total_parameters leaves it out.
  std::string uncounted_suffix;
  // DeepSeek-V3's attention: sanitize splits `self_attn.kv_b_proj` [H·(nope + v), R] into the
  // per-head MultiLinear weights `embed_q` [H, R, nope] (transposed) and `unembed_out` [H, v, R].
  bool mla_split = false;
  // GPT-OSS: Hugging Face's fused `experts.gate_up_proj` [E, D, 2F] (gate = even columns, up =
  // odd), `gate_up_proj_bias` [E, 2F], transposed `down_proj` [E, F, D] and `down_proj_bias`
  // become mlx-lm's stacked `experts.{gate,up,down}_proj.{weight,bias}` ([E, out, in], [E, out]).
  bool fused_gpt_oss = false;
};

FamilyRules rules(bool router_linear, std::string router_8bit_suffix, bool keep_f32, bool drop_mtp,
                  std::string uncounted = "", bool mla_split = false) {
  FamilyRules r;
  r.router_linear = router_linear;
  r.router_8bit_suffix = std::move(router_8bit_suffix);
  r.keep_selection_bias_f32 = keep_f32;
  r.drop_mtp = drop_mtp;
  r.uncounted_suffix = std::move(uncounted);
  r.mla_split = mla_split;
  return r;
}

FamilyRules gpt_oss_rules() {
  FamilyRules r = rules(true, "router", false, false, "self_attn.sinks");
  r.fused_gpt_oss = true;
  return r;
}

const std::map<std::string, FamilyRules>& family_rules() {
  static const std::map<std::string, FamilyRules> kRules = {
      {"qwen3_moe", rules(true, "mlp.gate", false, false)},
      {"qwen2_moe", rules(true, "", false, false)},
      {"mixtral", rules(true, "", false, false)},
      {"olmoe", rules(true, "", false, false)},
      {"minimax", rules(true, "block_sparse_moe.gate", true, false, "block_sparse_moe.e_score_correction_bias")},
      {"deepseek_v2", rules(false, "", false, false)},
      {"glm4_moe", rules(false, "", true, true)},
      {"deepseek_v3", rules(false, "", true, true, "", true)},
      {"gpt_oss", gpt_oss_rules()},
  };
  return kRules;
}

const FamilyRules& rules_for(const std::string& model_type) {
  const auto& r = family_rules();
  // mlx_lm.utils.MODEL_REMAPPING: these model types load with another family's class.
  static const std::map<std::string, std::string> kAlias = {{"kimi_k2", "deepseek_v3"}, {"minimax_m2", "minimax"}};
  const auto alias = kAlias.find(model_type);
  const auto it = r.find(alias != kAlias.end() ? alias->second : model_type);
  if (it != r.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : r) known += (known.empty() ? "" : ", ") + k;
  if (model_type == "deepseek_v32")
    bad(model_type + ": not written yet: mlx-lm's deepseek_v32 layout (its attention indexer) is not laid out by "
                     "moekit quantize (families written: " + known + ", kimi_k2, minimax_m2)");
  if (model_type == "llama4" || model_type == "llama4_text")
    bad(model_type + ": not written yet: mlx-lm's Llama-4 is a multimodal wrapper (language_model.*, vision "
                     "tower dropped) that moekit quantize does not lay out (families written: " + known + ")");
  bad(model_type + ": moekit quantize does not write this family (families written: " + known +
      ", kimi_k2, minimax_m2)");
}

struct Recipe {
  int low = 0, high = 0;
};
const std::map<std::string, Recipe>& recipes() {
  static const std::map<std::string, Recipe> kRecipes = {
      {"mixed_2_6", {2, 6}}, {"mixed_3_4", {3, 4}}, {"mixed_3_6", {3, 6}}, {"mixed_4_6", {4, 6}}};
  return kRecipes;
}

std::string replace_layer(std::string pattern, std::int64_t layer) {
  const auto pos = pattern.find("{L}");
  if (pos != std::string::npos) pattern.replace(pos, 3, std::to_string(layer));
  return pattern;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Names ordered with their numeric parts compared as numbers ("layers.2" before "layers.10").
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      std::size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      const std::string na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::optional<DType> float_dtype_named(const std::string& s) {
  if (s == "float32") return DType::f32;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  return std::nullopt;
}

bool is_float_name(const std::string& n) { return n == "F32" || n == "BF16" || n == "F16"; }

// One module or tensor of the output: its sources (one tensor, or E per-expert tensors stacked
// on a new leading axis), and how it is written.
struct Job {
  std::string out;                   // output tensor name (for a quantized module: "<path>.weight")
  std::vector<std::string> sources;  // source tensor names
  Shape shape;                       // output float shape (stacked shape for experts)
  std::string src_dtype;             // as the file spells it
  std::optional<DType> cast;         // float output / quantization dtype; nullopt: raw copy
  int bits = 0, group = 0;           // bits != 0: quantized
  // MLA split of kv_b_proj (FamilyRules::mla_split): 1 = embed_q, 2 = unembed_out.
  int mla = 0;
  std::int64_t nope = 0, vdim = 0, rank = 0;
  // GPT-OSS re-layout (FamilyRules::fused_gpt_oss) of a source [E, P, Q]: `pick` 0 = transpose
  // to [E, Q, P]; 1 / 2 = the even / odd columns transposed, [E, Q / 2, P]; for a bias
  // [E, Q] (P = 1): 1 / 2 = its even / odd elements.
  bool fused = false;
  int pick = 0;
  std::int64_t fp = 0, fq = 0;
};

struct OutEntry {
  std::size_t job;
  SafetensorsWriter::Entry entry;
};

// Element count of `s`.
std::int64_t numel(const Shape& s) { return shape_numel(s); }

float round_to(float v, DType d) {
  if (d == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (d == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Elements [offset, offset + count) of source tensor `name` as f32, rounded to `cast` first (as
// mlx-lm casts before it quantizes).
void read_source(const Checkpoint& ck, const std::string& name, std::int64_t offset, std::int64_t count, DType cast,
                 float* out) {
  const TensorView all = ck.view(name);
  convert(all.reshaped({all.numel()}).slice_rows(offset, offset + count), TensorView(out, {count}, DType::f32));
  if (cast != DType::f32)
    for (std::int64_t i = 0; i < count; ++i) out[i] = round_to(out[i], cast);
}

// Slabs of a shape: its leading dimension (1 for a scalar) and the elements of each.
std::int64_t lead_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
std::int64_t inner_of(const Shape& s) { return lead_of(s) > 0 ? numel(s) / lead_of(s) : 0; }

// The f32 values of output slabs [l0, l1) of a job (slab = one index of the output's leading
// dimension: an expert of a stacked projection, a head of an MLA split, a row of a matrix). Each
// slab comes from one slab of the source: a whole per-expert tensor, or the same share of the
// single source tensor, re-laid out for a split. Memory: the slabs asked for, never the model.
std::vector<float> read_values(const Checkpoint& ck, const Job& j, std::int64_t l0, std::int64_t l1) {
  const std::int64_t lead = lead_of(j.shape), inner = inner_of(j.shape);
  if (lead <= 0 || l1 <= l0) return {};
  const std::int64_t src_inner = j.sources.size() > 1 ? numel(ck.info(j.sources[0]).shape)
                                                      : numel(ck.info(j.sources[0]).shape) / lead;
  std::vector<float> out(static_cast<std::size_t>((l1 - l0) * inner));
  std::vector<float> slab(static_cast<std::size_t>(src_inner));
  for (std::int64_t l = l0; l < l1; ++l) {
    float* dst = out.data() + (l - l0) * inner;
    const bool multi = j.sources.size() > 1;
    float* src = (j.mla || j.fused) ? slab.data() : dst;
    read_source(ck, multi ? j.sources[static_cast<std::size_t>(l)] : j.sources[0], multi ? 0 : l * src_inner,
                src_inner, *j.cast, src);
    if (j.mla) {  // this head's rows v[d, r] = src[d·R + r], d < nope + vdim
      const std::int64_t R = j.rank;
      for (std::int64_t r = 0; r < R; ++r) {
        if (j.mla == 1)
          for (std::int64_t n = 0; n < j.nope; ++n) dst[r * j.nope + n] = src[n * R + r];
        else
          for (std::int64_t d = 0; d < j.vdim; ++d) dst[d * R + r] = src[(j.nope + d) * R + r];
      }
    } else if (j.fused) {  // this expert's [P, Q] source -> [Q / step, P]
      const std::int64_t step = j.pick ? 2 : 1, off = j.pick == 2 ? 1 : 0, Q = j.fq / step;
      for (std::int64_t q = 0; q < Q; ++q)
        for (std::int64_t p = 0; p < j.fp; ++p) dst[q * j.fp + p] = src[p * j.fq + q * step + off];
    }
  }
  return out;
}

std::vector<std::uint8_t> encode(std::vector<float> v, DType d) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(d));
  const Shape n{static_cast<std::int64_t>(v.size())};
  convert(TensorView(v.data(), n, DType::f32), TensorView(out.data(), n, d));
  return out;
}


// Copies the tokenizer, generation and code files mlx_lm.convert carries over.
void copy_side_files(const fs::path& from, const fs::path& to) {
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    const bool keep = n.rfind("tokenizer", 0) == 0 || n == "special_tokens_map.json" || n == "added_tokens.json" ||
                      n == "generation_config.json" || n == "chat_template.json" || n == "chat_template.jinja" ||
                      n.rfind("vocab", 0) == 0 || n == "merges.txt" || ext == ".tiktoken" || ext == ".py";
    if (keep) fs::copy_file(e.path(), to / n, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

std::string quantize_recipes() {
  std::string out;
  for (const auto& [k, v] : recipes()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

QuantizeReport quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                                   const QuantizeOptions& opt) {
  // --- options -----------------------------------------------------------------------------
  const std::set<int> kBits = {2, 3, 4, 5, 6, 8};
  if (!kBits.count(opt.bits)) bad(MOEKIT_MSG("bits " << opt.bits << " unsupported (2, 3, 4, 5, 6 or 8)"));
  if (opt.group_size != 32 && opt.group_size != 64 && opt.group_size != 128)
    bad(MOEKIT_MSG("group size " << opt.group_size << " unsupported (32, 64 or 128)"));
  if (opt.router_bits != -1 && opt.router_bits != 0 && !kBits.count(opt.router_bits))
    bad(MOEKIT_MSG("router bits " << opt.router_bits << " unsupported (0 = float, 2, 3, 4, 5, 6 or 8)"));
  std::optional<Recipe> recipe;
  if (!opt.recipe.empty()) {
    const auto it = recipes().find(opt.recipe);
    if (it == recipes().end()) bad("unknown recipe '" + opt.recipe + "' (recipes: " + quantize_recipes() + ")");
    if (opt.router_bits != -1) bad("--router-bits and a recipe both decide the router's bits: give one");
    recipe = it->second;
  }
  if (!opt.dtype.empty() && !float_dtype_named(opt.dtype))
    bad("dtype '" + opt.dtype + "' unsupported (float16, bfloat16 or float32)");
  if (opt.max_shard_bytes <= 0) bad("the shard size limit must be positive");
  if (opt.slab_values <= 0) bad("the slab size must be positive");

  const fs::path src(model_dir), dst(out_dir);
  std::error_code ec;
  if (!fs::is_directory(src, ec)) bad(model_dir + " is not a folder");
  if (fs::exists(dst, ec) && !(fs::is_directory(dst, ec) && fs::is_empty(dst, ec)))
    bad(out_dir + " already exists and is not an empty folder; moekit quantize never overwrites");

  // --- the source -------------------------------------------------------------------------
  std::ifstream cin(src / "config.json", std::ios::binary);
  if (!cin) throw std::runtime_error("[moekit::quantize_checkpoint] cannot open " + (src / "config.json").string());
  std::stringstream text;
  text << cin.rdbuf();
  json config;
  try {
    config = json::parse(text.str());
  } catch (const json::exception& e) {
    bad((src / "config.json").string() + ": invalid JSON: " + e.what());
  }
  if (!config.is_object()) bad((src / "config.json").string() + ": not a JSON object");
  for (const char* key : {"quantization", "quantization_config"})
    if (config.contains(key))
      bad(MOEKIT_MSG((src / "config.json").string() << " has '" << key
                                                    << "': the checkpoint is already quantized; moekit quantize "
                                                       "needs a float checkpoint"));
  const MoeConfig cfg = load_hf_config(model_dir);
  const FamilyRules& rules = rules_for(cfg.model_type);
  const auto ck = Checkpoint::open(model_dir);

  std::optional<DType> target;
  if (!opt.dtype.empty()) {
    target = float_dtype_named(opt.dtype);
  } else {
    const json* tc = config.contains("text_config") && config["text_config"].is_object() ? &config["text_config"] : nullptr;
    if (config.contains("torch_dtype") && config["torch_dtype"].is_string())
      target = float_dtype_named(config["torch_dtype"].get<std::string>());
    else if (tc && tc->contains("dtype") && (*tc)["dtype"].is_string())
      target = float_dtype_named((*tc)["dtype"].get<std::string>());
  }
  const bool tie = config.contains("tie_word_embeddings") && config["tie_word_embeddings"].is_boolean() &&
                   config["tie_word_embeddings"].get<bool>();

  // --- plan ---------------------------------------------------------------------------------
  QuantizeReport report;
  report.model_type = cfg.model_type;
  std::set<std::string> consumed;
  std::vector<Job> jobs;
  for (const std::string& name : ck->names()) {
    const TensorInfo& info = ck->info(name);
    if (ends_with(name, "_blocks"))
      bad(MOEKIT_MSG(info.file << ": tensor '" << name
                               << "' is MXFP4-packed (OpenAI's GPT-OSS release); moekit quantize needs float weights "
                                  "(the bf16 checkpoint)"));
    if (ends_with(name, ".scales") || ends_with(name, "weight_scale_inv") || ends_with(name, "weight_scale") ||
        !(is_float_name(info.dtype_name) || info.dtype_name.rfind("I", 0) == 0 || info.dtype_name.rfind("U", 0) == 0 ||
          info.dtype_name == "BOOL"))
      bad(MOEKIT_MSG(info.file << ": tensor '" << name << "' (" << info.dtype_name
                               << ") marks a quantized checkpoint; moekit quantize needs float weights"));
  }

  // Stacked experts of every MoE layer.
  const std::int64_t E = cfg.router.num_experts;
  const std::vector<std::pair<std::string, std::string>> projs = {
      {cfg.names.gate_proj, "gate_proj"}, {cfg.names.up_proj, "up_proj"}, {cfg.names.down_proj, "down_proj"}};
  for (const std::int64_t L : cfg.moe_layer_indices()) {
    const std::string block = replace_layer(cfg.names.block, L);
    const std::string ex = block + "." + cfg.names.experts + ".";
    if (rules.fused_gpt_oss && ck->contains(ex + "gate_up_proj")) {
      const std::int64_t D = cfg.hidden_size, F = cfg.expert_width;
      const auto want = [&](const std::string& n, const Shape& shape) {
        if (!ck->contains(n)) bad(MOEKIT_MSG(ck->path() << ": missing tensor '" << n << "', expected " << shape_str(shape)));
        const TensorInfo& info = ck->info(n);
        if (info.shape != shape || !is_float_name(info.dtype_name))
          bad(MOEKIT_MSG(info.file << ": tensor '" << n << "' is " << info.dtype_name << " " << shape_str(info.shape)
                                   << ", expected float " << shape_str(shape)));
        consumed.insert(n);
        return info.dtype_name;
      };
      const std::string gu = ex + "gate_up_proj", gub = ex + "gate_up_proj_bias", dn = ex + "down_proj",
                        dnb = ex + "down_proj_bias";
      want(gu, {E, D, 2 * F});
      want(gub, {E, 2 * F});
      want(dn, {E, F, D});
      want(dnb, {E, D});
      const auto add = [&](const std::string& out, const std::string& from, Shape shape, int pick, std::int64_t P,
                           std::int64_t Q, bool fused) {
        Job j;
        j.out = out;
        j.sources = {from};
        j.shape = std::move(shape);
        j.src_dtype = ck->info(from).dtype_name;
        j.fused = fused;
        j.pick = pick;
        j.fp = P;
        j.fq = Q;
        jobs.push_back(std::move(j));
      };
      add(ex + "gate_proj.weight", gu, {E, F, D}, 1, D, 2 * F, true);
      add(ex + "up_proj.weight", gu, {E, F, D}, 2, D, 2 * F, true);
      add(ex + "down_proj.weight", dn, {E, D, F}, 0, F, D, true);
      add(ex + "gate_proj.bias", gub, {E, F}, 1, 1, 2 * F, true);
      add(ex + "up_proj.bias", gub, {E, F}, 2, 1, 2 * F, true);
      add(ex + "down_proj.bias", dnb, {E, D}, 0, 1, D, false);
    }
    for (const auto& [proj, mlx_proj] : projs) {
      if (!ck->contains(ex + "0." + proj + ".weight")) continue;
      Job j;
      j.out = block + ".switch_mlp." + mlx_proj + ".weight";
      for (std::int64_t e = 0; e < E; ++e) {
        const std::string n = ex + std::to_string(e) + "." + proj + ".weight";
        if (!ck->contains(n)) bad(MOEKIT_MSG(ck->path() << ": missing tensor '" << n << "' (expert " << e << " of " << E
                                                        << "; stacking " << j.out << ")"));
        const TensorInfo& info = ck->info(n);
        const TensorInfo& first = ck->info(ex + "0." + proj + ".weight");
        if (info.shape != first.shape || info.dtype_name != first.dtype_name || info.shape.size() != 2)
          bad(MOEKIT_MSG(info.file << ": tensor '" << n << "' is " << info.dtype_name << " " << shape_str(info.shape)
                                   << ", expert 0's is " << first.dtype_name << " " << shape_str(first.shape)
                                   << " (experts stack only if all are one rank-2 shape and dtype)"));
        j.sources.push_back(n);
        consumed.insert(n);
      }
      const TensorInfo& first = ck->info(j.sources[0]);
      j.shape = {E, first.shape[0], first.shape[1]};
      j.src_dtype = first.dtype_name;
      jobs.push_back(std::move(j));
    }
    // Anything else under the experts prefix is a layout this writer does not know.
    for (const std::string& n : ck->names())
      if (n.rfind(ex, 0) == 0 && !consumed.count(n) &&
          !(rules.fused_gpt_oss && n.find("_blocks") == std::string::npos && n.find("_scales") == std::string::npos &&
            (ends_with(n, "_proj.weight") || ends_with(n, "_proj.bias"))))  // mlx-lm's own GPT-OSS names
        bad(MOEKIT_MSG(ck->info(n).file << ": tensor '" << n
                                        << "' is not part of the per-expert layout moekit quantize stacks ("
                                        << ex << "{e}.{" << cfg.names.gate_proj << "," << cfg.names.up_proj << ","
                                        << cfg.names.down_proj << "}.weight)"));
  }

  // DeepSeek-V3's kv_b_proj, split per head as mlx-lm's sanitize splits it.
  if (rules.mla_split) {
    const auto dim = [&](const char* key) {
      if (!config.contains(key) || !config[key].is_number_integer() || config[key].get<std::int64_t>() <= 0)
        bad(MOEKIT_MSG((src / "config.json").string() << ": '" << key << "' must be a positive integer (the attention's "
                                                      << "kv_b_proj split needs it)"));
      return config[key].get<std::int64_t>();
    };
    for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
      const std::string base = MOEKIT_MSG("model.layers." << l << ".self_attn.");
      const std::string name = base + "kv_b_proj.weight";
      if (!ck->contains(name)) continue;
      const std::int64_t H = dim("num_attention_heads"), nope = dim("qk_nope_head_dim"), vd = dim("v_head_dim"),
                         R = dim("kv_lora_rank");
      const TensorInfo& info = ck->info(name);
      if (info.shape != Shape{H * (nope + vd), R} || !is_float_name(info.dtype_name))
        bad(MOEKIT_MSG(info.file << ": tensor '" << name << "' is " << info.dtype_name << " " << shape_str(info.shape)
                                 << ", expected float [" << H * (nope + vd) << ", " << R
                                 << "] (num_attention_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank)"));
      consumed.insert(name);
      for (int part = 1; part <= 2; ++part) {
        Job j;
        j.out = base + (part == 1 ? "embed_q.weight" : "unembed_out.weight");
        j.sources = {name};
        j.shape = part == 1 ? Shape{H, R, nope} : Shape{H, vd, R};
        j.src_dtype = info.dtype_name;
        j.mla = part;
        j.nope = nope;
        j.vdim = vd;
        j.rank = R;
        jobs.push_back(std::move(j));
      }
    }
  }

  // Every other tensor passes through by name, unless mlx-lm's sanitize drops it.
  const std::string mtp_prefix = MOEKIT_MSG("model.layers." << cfg.num_layers << ".");
  for (const std::string& name : ck->names()) {
    if (consumed.count(name)) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos || (rules.drop_mtp && name.rfind(mtp_prefix, 0) == 0) ||
        (tie && name == "lm_head.weight")) {
      ++report.tensors_dropped;
      continue;
    }
    const TensorInfo& info = ck->info(name);
    Job j;
    j.out = name;
    j.sources = {name};
    j.shape = info.shape;
    j.src_dtype = info.dtype_name;
    jobs.push_back(std::move(j));
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return natural_less(a.out, b.out); });

  // Casting and the quantization predicate (mlx_lm.utils.quantize_model's wrapped_predicate).
  std::set<std::string> routers;
  for (const std::int64_t L : cfg.moe_layer_indices())
    routers.insert(replace_layer(cfg.names.block, L) + "." + cfg.names.router);
  if (opt.router_bits > 0 && !rules.router_linear)
    bad(cfg.model_type + "'s router is not a linear layer in mlx-lm (MoEGate) and is never quantized: drop --router-bits");
  const std::int64_t num_layers = cfg.num_layers;
  json qconfig = {{"group_size", opt.group_size}, {"bits", opt.bits}, {"mode", "affine"}};
  for (Job& j : jobs) {
    if (!is_float_name(j.src_dtype)) continue;  // integer tensors are copied as they are
    const DType stored = j.src_dtype == "F32" ? DType::f32 : j.src_dtype == "BF16" ? DType::bf16 : DType::f16;
    const bool cast_ok = !(rules.keep_selection_bias_f32 && j.out.find("e_score_correction_bias") != std::string::npos);
    j.cast = target && cast_ok ? *target : stored;
    if (!ends_with(j.out, ".weight")) continue;
    const std::string path = j.out.substr(0, j.out.size() - 7);
    // Rank 3: stacked experts (SwitchLinear) and MLA's per-head MultiLinear.
    const bool stacked = j.shape.size() == 3 && (j.out.find(".switch_mlp.") != std::string::npos || j.mla ||
                                                 (rules.fused_gpt_oss && j.out.find(".experts.") != std::string::npos));
    if (!(j.shape.size() == 2 || stacked)) continue;
    if (routers.count(path) && !rules.router_linear) continue;
    if (j.shape.back() % opt.group_size != 0) continue;
    int bits = opt.bits, group = opt.group_size;
    json entry;  // null: no per-module entry
    if (recipe) {
      // mlx_lm.convert.mixed_quant_predicate_builder: the layer index is the path's first number.
      std::int64_t index = 0;
      const auto parts_at = path.find("layers.");
      if (parts_at != std::string::npos) index = std::atoll(path.c_str() + parts_at + 7);
      const std::int64_t n8 = num_layers / 8;
      const bool more = index < n8 || index >= 7 * num_layers / 8 || (((index - n8) % 3) + 3) % 3 == 2;
      bits = recipe->low;
      if ((path.find("v_proj") != std::string::npos || path.find("v_a_proj") != std::string::npos ||
           path.find("v_b_proj") != std::string::npos) && more)
        bits = recipe->high;
      else if (path.find("down_proj") != std::string::npos && more)
        bits = recipe->high;
      else if (path.find("lm_head") != std::string::npos)
        bits = recipe->high;
      entry = {{"group_size", group}, {"bits", bits}, {"mode", "affine"}};
    } else if (routers.count(path) && opt.router_bits == 0) {
      continue;
    } else if (routers.count(path) && opt.router_bits > 0) {
      bits = opt.router_bits;
      entry = {{"group_size", group}, {"bits", bits}};
    } else if (!rules.router_8bit_suffix.empty() && ends_with(path, rules.router_8bit_suffix)) {
      bits = 8;
      group = 64;
      entry = {{"group_size", group}, {"bits", bits}};
    }
    if (j.shape.back() % group != 0) continue;
    j.bits = bits;
    j.group = group;
    if (!entry.is_null()) qconfig[path] = entry;
  }

  // Output tensors and their shards (mlx_lm.utils.make_shards: fill in order up to the limit).
  std::vector<OutEntry> outs;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    if (j.bits) {
      const std::string path = j.out.substr(0, j.out.size() - 7);
      Shape codes = j.shape, groups = j.shape;
      codes.back() = j.shape.back() * j.bits / 32;
      groups.back() = j.shape.back() / j.group;
      const std::size_t sb = static_cast<std::size_t>(numel(groups)) * dtype_size(*j.cast);
      outs.push_back({i, {j.out, "U32", codes, static_cast<std::size_t>(numel(codes)) * 4}});
      outs.push_back({i, {path + ".scales", safetensors_dtype_name(*j.cast), groups, sb}});
      outs.push_back({i, {path + ".biases", safetensors_dtype_name(*j.cast), groups, sb}});
    } else {
      const std::size_t n = j.cast ? static_cast<std::size_t>(numel(j.shape)) * dtype_size(*j.cast)
                                   : ck->info(j.sources[0]).end - ck->info(j.sources[0]).begin;
      outs.push_back({i, {j.out, j.cast ? safetensors_dtype_name(*j.cast) : j.src_dtype, j.shape, n}});
    }
  }
  std::vector<std::vector<std::size_t>> shards;
  {
    std::size_t size = 0;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const std::size_t nb = outs[k].entry.nbytes;
      if (shards.empty() || size + nb > static_cast<std::size_t>(opt.max_shard_bytes)) {
        shards.emplace_back();
        size = 0;
      }
      shards.back().push_back(k);
      size += nb;
    }
  }

  // --- write ----------------------------------------------------------------------------------
  const fs::path tmp = fs::path(out_dir + ".partial");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw std::runtime_error("[moekit::quantize_checkpoint] cannot create " + tmp.string() + ": " + ec.message());
  try {
    json weight_map = json::object();
    std::int64_t total_size = 0, total_params = 0;
    std::size_t job_done = static_cast<std::size_t>(-1);
    std::vector<std::vector<std::uint8_t>> pending;  // the current job's output tensors, in order
    std::size_t pending_at = 0;
    const auto produce = [&](std::size_t ji) {
      const Job& j = jobs[ji];
      pending.clear();
      pending_at = 0;
      if (!j.cast) {  // raw copy
        const TensorInfo& info = ck->info(j.sources[0]);
        const std::uint8_t* raw = ck->bytes(j.sources[0]);
        pending.emplace_back(raw, raw + (info.end - info.begin));
        report.bytes_in += static_cast<std::int64_t>(info.end - info.begin);
        total_params += numel(j.shape);
        ++report.tensors_kept_float;
        return;
      }
      if (j.mla != 2 && !(j.fused && j.pick == 2))  // the two halves of a split read one tensor
        for (const std::string& s : j.sources)
          report.bytes_in += static_cast<std::int64_t>(ck->info(s).end - ck->info(s).begin);
      // Slabs of opt.slab_values at a time (default 64 Mi values, 256 MB of f32), whatever the tensor.
      const std::int64_t lead = lead_of(j.shape), inner = inner_of(j.shape);
      const std::int64_t step = std::max<std::int64_t>(1, opt.slab_values / std::max<std::int64_t>(1, inner));
      if (!j.bits) {
        std::vector<std::uint8_t> bytes;
        bytes.reserve(static_cast<std::size_t>(numel(j.shape)) * dtype_size(*j.cast));
        for (std::int64_t l0 = 0; l0 < lead; l0 += step) {
          const std::vector<std::uint8_t> part = encode(read_values(*ck, j, l0, std::min(lead, l0 + step)), *j.cast);
          bytes.insert(bytes.end(), part.begin(), part.end());
        }
        pending.push_back(std::move(bytes));
        if (rules.uncounted_suffix.empty() || !ends_with(j.out, rules.uncounted_suffix)) total_params += numel(j.shape);
        ++report.tensors_kept_float;
        return;
      }
      const std::int64_t in = j.shape.back(), rows = numel(j.shape) / in;
      const std::int64_t words = in * j.bits / 32, groups = in / j.group;
      std::vector<std::uint32_t> codes(static_cast<std::size_t>(rows * words));
      std::vector<float> scales(static_cast<std::size_t>(rows * groups)), biases(scales.size());
      struct Err {
        double max_abs = 0, sq = 0, wsq = 0;
      };
      constexpr std::int64_t kTasks = 64;
      std::vector<Err> errs(static_cast<std::size_t>(kTasks));
      const std::int64_t rows_per_lead = inner / in;
      for (std::int64_t l0 = 0; l0 < lead; l0 += step) {
        const std::int64_t l1 = std::min(lead, l0 + step);
        const std::vector<float> w = read_values(*ck, j, l0, l1);
        const std::int64_t base = l0 * rows_per_lead, n_rows = (l1 - l0) * rows_per_lead;
        const std::int64_t chunks = std::min<std::int64_t>(n_rows, kTasks);
        std::vector<std::int64_t> first_bad(static_cast<std::size_t>(chunks), -1);
        detail::parallel_tasks(chunks, [&](std::int64_t c) {
          const std::int64_t r0 = n_rows * c / chunks, r1 = n_rows * (c + 1) / chunks;
          Err& er = errs[static_cast<std::size_t>(c)];
          for (std::int64_t rr = r0; rr < r1; ++rr) {
            const float* row = w.data() + rr * in;
            const std::int64_t r = base + rr;
            bool finite = true;
            for (std::int64_t k = 0; k < in; ++k) finite = finite && std::isfinite(row[k]);
            if (!finite) {
              if (first_bad[static_cast<std::size_t>(c)] < 0) first_bad[static_cast<std::size_t>(c)] = r;
              continue;
            }
            float* sc = scales.data() + r * groups;
            float* bi = biases.data() + r * groups;
            std::uint32_t* q = codes.data() + r * words;
            kernels::quantize_affine_row(row, in, j.bits, j.group, q, sc, bi);
            for (std::int64_t g = 0; g < groups; ++g) {
              sc[g] = round_to(sc[g], *j.cast);
              bi[g] = round_to(bi[g], *j.cast);
            }
            for (std::int64_t k = 0; k < in; ++k) {
              const std::int64_t bit = k * j.bits;
              std::uint64_t pair = q[bit / 32];
              if (bit % 32 + j.bits > 32) pair |= static_cast<std::uint64_t>(q[bit / 32 + 1]) << 32;
              const float code = static_cast<float>((pair >> (bit % 32)) & ((1u << j.bits) - 1u));
              const float deq = std::fma(sc[k / j.group], code, bi[k / j.group]);
              const double d = std::abs(static_cast<double>(deq) - row[k]);
              er.max_abs = std::max(er.max_abs, d);
              er.sq += d * d;
              er.wsq += static_cast<double>(row[k]) * row[k];
            }
          }
        });
        for (std::int64_t c = 0; c < chunks; ++c)
          if (first_bad[static_cast<std::size_t>(c)] >= 0) {
            const std::int64_t r = first_bad[static_cast<std::size_t>(c)];
            const std::int64_t per = j.sources.size() > 1 ? rows_per_lead : rows;  // rows per source tensor
            const std::string where = j.sources.size() > 1 ? j.sources[static_cast<std::size_t>(r / per)] : j.sources[0];
            bad(MOEKIT_MSG(ck->info(where).file << ": tensor '" << where << "' row " << (r % per)
                                                << " holds a NaN or Inf; moekit quantize refuses to encode it"));
          }
      }
      QuantizedTensorReport qr{j.out, j.shape, j.bits, j.group, 0, 0, 0};
      double sq = 0, wsq = 0;
      for (const Err& er : errs) {
        qr.max_abs_error = std::max(qr.max_abs_error, er.max_abs);
        sq += er.sq;
        wsq += er.wsq;
      }
      const double n = static_cast<double>(numel(j.shape));
      qr.rms_error = std::sqrt(sq / n);
      qr.rms_weight = std::sqrt(wsq / n);
      report.quantized.push_back(qr);
      const auto* cb = reinterpret_cast<const std::uint8_t*>(codes.data());
      pending.emplace_back(cb, cb + codes.size() * 4);
      pending.push_back(encode(scales, *j.cast));
      pending.push_back(encode(biases, *j.cast));
      total_params += numel(j.shape);
    };

    const std::string fmt_many = "model-%05d-of-%05d.safetensors";
    for (std::size_t s = 0; s < shards.size(); ++s) {
      std::string file = "model.safetensors";
      if (shards.size() > 1) {
        char buf[64];
        std::snprintf(buf, sizeof buf, fmt_many.c_str(), static_cast<int>(s + 1), static_cast<int>(shards.size()));
        file = buf;
      }
      std::vector<SafetensorsWriter::Entry> entries;
      for (const std::size_t k : shards[s]) entries.push_back(outs[k].entry);
      SafetensorsWriter writer((tmp / file).string(), entries, {{"format", "mlx"}});
      for (const std::size_t k : shards[s]) {
        if (outs[k].job != job_done) {
          produce(outs[k].job);
          job_done = outs[k].job;
        }
        const std::vector<std::uint8_t>& bytes = pending.at(pending_at++);
        writer.write(bytes.data(), bytes.size());
        weight_map[outs[k].entry.name] = file;
        total_size += static_cast<std::int64_t>(bytes.size());
        ++report.tensors_written;
      }
      writer.commit();
    }
    report.shards = static_cast<std::int64_t>(shards.size());
    report.bytes_out = total_size;

    json index = {{"metadata", {{"total_size", total_size}, {"total_parameters", total_params}}},
                  {"weight_map", weight_map}};
    std::ofstream(tmp / "model.safetensors.index.json") << index.dump(4);
    json out_config = config;
    out_config.erase("_name_or_path");
    out_config.erase("vision_config");
    out_config["quantization"] = qconfig;
    out_config["quantization_config"] = qconfig;
    {
      std::ofstream cf(tmp / "config.json");
      cf << out_config.dump(4);
      if (!cf) throw std::runtime_error("[moekit::quantize_checkpoint] cannot write " + (tmp / "config.json").string());
    }
    copy_side_files(src, tmp);
    fs::remove(dst, ec);  // an empty folder, checked above
    fs::rename(tmp, dst);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return report;
}

}  // namespace moekit
