// The plan of moekit quantize (quantize_plan.hpp): what mlx_lm.convert does to each tensor of a
// float checkpoint, decided from config.json and the tensor headers alone. What mlx-lm does per
// family (its sanitize and quant/cast predicates) is a row of kFamilyRules.
#include "io/quantize_plan.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "io/family.hpp"
#include "io/layer_names.hpp"
#include "moekit/config.hpp"
#include "util/error.hpp"

namespace moekit::detail {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// mlx-lm's per-family behaviour (mlx_lm/models/<module>.py), keyed by family.hpp's mlx_module.
struct FamilyRules {
  std::string_view mlx_module{};
  // Whether the router is an nn.Linear (DeepSeek's and GLM's MoEGate is a bare parameter and
  // never quantized).
  bool router_linear = true;
  // The suffix quant_predicate sends to 8 bits / group 64; empty: none.
  std::string_view router_8bit_suffix{};
  // cast_predicate keeps the selection bias (e_score_correction_bias) in f32.
  bool keep_selection_bias_f32 = false;
  // sanitize drops decoder layer num_hidden_layers and above (multi-token prediction).
  bool drop_mtp = false;
  // A parameter held by a module that has children (Job::counted); empty: none.
  std::string_view uncounted_suffix{};
  // sanitize splits `self_attn.kv_b_proj` [H·(nope + v), R] into the per-head MultiLinear
  // weights `embed_q` [H, R, nope] (transposed) and `unembed_out` [H, v, R].
  bool mla_split = false;
  // Hugging Face's fused `experts.gate_up_proj` [E, D, 2F] (gate = even columns, up = odd),
  // `gate_up_proj_bias` [E, 2F], transposed `down_proj` [E, F, D] and `down_proj_bias` become
  // mlx-lm's stacked `experts.{gate,up,down}_proj.{weight,bias}` ([E, out, in], [E, out]).
  bool fused_gpt_oss = false;
};

constexpr FamilyRules kFamilyRules[] = {
    {.mlx_module = "qwen3_moe", .router_8bit_suffix = "mlp.gate"},
    {.mlx_module = "qwen2_moe"},
    {.mlx_module = "mixtral"},
    {.mlx_module = "olmoe"},
    {.mlx_module = "minimax",
     .router_8bit_suffix = "block_sparse_moe.gate",
     .keep_selection_bias_f32 = true,
     .uncounted_suffix = "block_sparse_moe.e_score_correction_bias"},
    {.mlx_module = "deepseek_v2", .router_linear = false},
    {.mlx_module = "glm4_moe",
     .router_linear = false,
     .keep_selection_bias_f32 = true,
     .drop_mtp = true},
    {.mlx_module = "deepseek_v3",
     .router_linear = false,
     .keep_selection_bias_f32 = true,
     .drop_mtp = true,
     .mla_split = true},
    {.mlx_module = "gpt_oss",
     .router_8bit_suffix = "router",
     .uncounted_suffix = "self_attn.sinks",
     .fused_gpt_oss = true},
};

constexpr const FamilyRules* find_rules(std::string_view mlx_module) {
  for (const FamilyRules& r : kFamilyRules)
    if (r.mlx_module == mlx_module) return &r;
  return nullptr;
}

// Every module family.hpp sends moekit quantize to has its rules.
static_assert([] {
  for (const ModelType& t : kModelTypes)
    if (!t.mlx_module.empty() && find_rules(t.mlx_module) == nullptr) return false;
  return true;
}());

// "deepseek_v2, deepseek_v3, ..., kimi_k2, minimax_m2": the modules written, sorted, then the
// model_types that load with another family's module.
std::string families_written() {
  std::set<std::string_view> modules;
  for (const ModelType& t : kModelTypes)
    if (!t.mlx_module.empty()) modules.insert(t.mlx_module);
  std::string out;
  for (const std::string_view m : modules) out += (out.empty() ? "" : ", ") + std::string(m);
  for (const ModelType& t : kModelTypes)
    if (!t.mlx_module.empty() && t.mlx_module != t.name) out += ", " + std::string(t.name);
  return out;
}

const FamilyRules& rules_for(const std::string& model_type) {
  const ModelType* type = find_model_type(model_type);
  if (type != nullptr && !type->mlx_module.empty()) return *find_rules(type->mlx_module);
  if (type != nullptr)
    quantize_bad(model_type + ": not written yet: " + std::string(type->not_written) +
                 " (families written: " + families_written() + ")");
  quantize_bad(model_type + ": moekit quantize does not write this family (families written: " +
               families_written() + ")");
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Names ordered with their numeric parts compared as numbers ("layers.2" before "layers.10").
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
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

bool is_float_name(const std::string& n) { return n == "F32" || n == "BF16" || n == "F16"; }

// --- reading the source ------------------------------------------------------------------

// config.json as JSON; refused if it says the checkpoint is quantized already.
json read_config(const fs::path& src) {
  const fs::path file = src / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("[moekit::quantize_checkpoint] cannot open " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  json config;
  try {
    config = json::parse(text.str());
  } catch (const json::exception& e) {
    quantize_bad(file.string() + ": invalid JSON: " + e.what());
  }
  if (!config.is_object()) quantize_bad(file.string() + ": not a JSON object");
  for (const char* key : {"quantization", "quantization_config"})
    if (config.contains(key))
      quantize_bad(MOEKIT_MSG(
          file.string() << " has '" << key
                        << "': the checkpoint is already quantized; moekit quantize needs a float "
                           "checkpoint"));
  return config;
}

// The float dtype of everything not quantized: --dtype, else config.json's torch_dtype (or the
// text model's dtype), as mlx_lm.convert; nullopt: each tensor keeps its own.
std::optional<DType> target_dtype(const json& config, const QuantizeOptions& opt) {
  if (!opt.dtype.empty()) return float_dtype_named(opt.dtype);
  const json* tc = config.contains("text_config") && config["text_config"].is_object()
                       ? &config["text_config"]
                       : nullptr;
  if (config.contains("torch_dtype") && config["torch_dtype"].is_string())
    return float_dtype_named(config["torch_dtype"].get<std::string>());
  if (tc && tc->contains("dtype") && (*tc)["dtype"].is_string())
    return float_dtype_named((*tc)["dtype"].get<std::string>());
  return std::nullopt;
}

// Refuses a checkpoint that holds quantized tensors (MXFP4 blocks, FP8 and its scales).
void check_float_tensors(const Checkpoint& ck) {
  for (const std::string& name : ck.names()) {
    const TensorInfo& info = ck.info(name);
    if (ends_with(name, "_blocks"))
      quantize_bad(MOEKIT_MSG(
          info.file << ": tensor '" << name
                    << "' is MXFP4-packed (OpenAI's GPT-OSS release); moekit quantize needs float "
                       "weights (the bf16 checkpoint)"));
    if (ends_with(name, ".scales") || ends_with(name, "weight_scale_inv") ||
        ends_with(name, "weight_scale") ||
        !(is_float_name(info.dtype_name) || info.dtype_name.rfind("I", 0) == 0 ||
          info.dtype_name.rfind("U", 0) == 0 || info.dtype_name == "BOOL"))
      quantize_bad(MOEKIT_MSG(
          info.file << ": tensor '" << name << "' (" << info.dtype_name
                    << ") marks a quantized checkpoint; moekit quantize needs float weights"));
  }
}

// --- what each source tensor becomes --------------------------------------------------------

// The planning state: the source, and the tensors already taken by a job.
struct Planner {
  const MoeConfig& cfg;
  const FamilyRules& rules;
  const Checkpoint& ck;
  const json& config;
  const fs::path& src;
  std::set<std::string> consumed;
  std::vector<Job> jobs;

  void gpt_oss_experts(const std::string& ex);
  void stacked_experts(const std::string& block, const std::string& ex);
  void check_experts_consumed(const std::string& ex) const;
  void mla_split();
  void pass_through(bool tie, std::int64_t& dropped);
};

// GPT-OSS's fused experts of one layer (FamilyRules::fused_gpt_oss), as mlx-lm's sanitize
// re-lays them out.
void Planner::gpt_oss_experts(const std::string& ex) {
  const std::int64_t E = cfg.router.num_experts, D = cfg.hidden_size, F = cfg.expert_width;
  const auto want = [&](const std::string& n, const Shape& shape) {
    if (!ck.contains(n))
      quantize_bad(
          MOEKIT_MSG(ck.path() << ": missing tensor '" << n << "', expected " << shape_str(shape)));
    const TensorInfo& info = ck.info(n);
    if (info.shape != shape || !is_float_name(info.dtype_name))
      quantize_bad(MOEKIT_MSG(info.file << ": tensor '" << n << "' is " << info.dtype_name << " "
                                        << shape_str(info.shape) << ", expected float "
                                        << shape_str(shape)));
    consumed.insert(n);
  };
  const std::string gu = ex + "gate_up_proj", gub = ex + "gate_up_proj_bias", dn = ex + "down_proj",
                    dnb = ex + "down_proj_bias";
  want(gu, {E, D, 2 * F});
  want(gub, {E, 2 * F});
  want(dn, {E, F, D});
  want(dnb, {E, D});
  const auto add = [&](const std::string& out, const std::string& from, Shape shape, int pick,
                       std::int64_t P, std::int64_t Q, bool fused) {
    Job j;
    j.out = out;
    j.sources = {from};
    j.shape = std::move(shape);
    j.src_dtype = ck.info(from).dtype_name;
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

// One layer's per-expert projections stacked into mlx-lm's `switch_mlp` [E, out, in].
void Planner::stacked_experts(const std::string& block, const std::string& ex) {
  const std::int64_t E = cfg.router.num_experts;
  const std::pair<std::string, std::string> projs[] = {{cfg.names.gate_proj, "gate_proj"},
                                                       {cfg.names.up_proj, "up_proj"},
                                                       {cfg.names.down_proj, "down_proj"}};
  for (const auto& [proj, mlx_proj] : projs) {
    if (!ck.contains(ex + "0." + proj + ".weight")) continue;
    Job j;
    j.out = block + ".switch_mlp." + mlx_proj + ".weight";
    const TensorInfo& first = ck.info(ex + "0." + proj + ".weight");
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string n = ex + std::to_string(e) + "." + proj + ".weight";
      if (!ck.contains(n))
        quantize_bad(MOEKIT_MSG(ck.path() << ": missing tensor '" << n << "' (expert " << e
                                          << " of " << E << "; stacking " << j.out << ")"));
      const TensorInfo& info = ck.info(n);
      if (info.shape != first.shape || info.dtype_name != first.dtype_name ||
          info.shape.size() != 2)
        quantize_bad(MOEKIT_MSG(info.file
                                << ": tensor '" << n << "' is " << info.dtype_name << " "
                                << shape_str(info.shape) << ", expert 0's is " << first.dtype_name
                                << " " << shape_str(first.shape)
                                << " (experts stack only if all are one rank-2 shape and dtype)"));
      j.sources.push_back(n);
      consumed.insert(n);
    }
    j.shape = {E, first.shape[0], first.shape[1]};
    j.src_dtype = first.dtype_name;
    jobs.push_back(std::move(j));
  }
}

// Anything else under a layer's experts prefix is a layout this writer does not know.
void Planner::check_experts_consumed(const std::string& ex) const {
  for (const std::string& n : ck.names())
    if (n.rfind(ex, 0) == 0 && !consumed.count(n) &&
        !(rules.fused_gpt_oss && n.find("_blocks") == std::string::npos &&
          n.find("_scales") == std::string::npos &&
          (ends_with(n, "_proj.weight") ||
           ends_with(n, "_proj.bias"))))  // mlx-lm's own GPT-OSS names
      quantize_bad(MOEKIT_MSG(ck.info(n).file
                              << ": tensor '" << n
                              << "' is not part of the per-expert layout moekit quantize stacks ("
                              << ex << "{e}.{" << cfg.names.gate_proj << "," << cfg.names.up_proj
                              << "," << cfg.names.down_proj << "}.weight)"));
}

// DeepSeek-V3's kv_b_proj of every layer, split per head as mlx-lm's sanitize splits it
// (FamilyRules::mla_split).
void Planner::mla_split() {
  const auto dim = [&](const char* key) {
    if (!config.contains(key) || !config[key].is_number_integer() ||
        config[key].get<std::int64_t>() <= 0)
      quantize_bad(MOEKIT_MSG((src / "config.json").string()
                              << ": '" << key << "' must be a positive integer (the attention's "
                              << "kv_b_proj split needs it)"));
    return config[key].get<std::int64_t>();
  };
  for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string base = MOEKIT_MSG("model.layers." << l << ".self_attn.");
    const std::string name = base + "kv_b_proj.weight";
    if (!ck.contains(name)) continue;
    const std::int64_t H = dim("num_attention_heads"), nope = dim("qk_nope_head_dim"),
                       vd = dim("v_head_dim"), R = dim("kv_lora_rank");
    const TensorInfo& info = ck.info(name);
    if (info.shape != Shape{H * (nope + vd), R} || !is_float_name(info.dtype_name))
      quantize_bad(MOEKIT_MSG(
          info.file << ": tensor '" << name << "' is " << info.dtype_name << " "
                    << shape_str(info.shape) << ", expected float [" << H * (nope + vd) << ", " << R
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

// Every other tensor passes through by name, unless mlx-lm's sanitize drops it (rotary
// frequencies, multi-token prediction layers, a tied lm_head).
void Planner::pass_through(bool tie, std::int64_t& dropped) {
  const std::string mtp_prefix = MOEKIT_MSG("model.layers." << cfg.num_layers << ".");
  for (const std::string& name : ck.names()) {
    if (consumed.count(name)) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos ||
        (rules.drop_mtp && name.rfind(mtp_prefix, 0) == 0) || (tie && name == "lm_head.weight")) {
      ++dropped;
      continue;
    }
    const TensorInfo& info = ck.info(name);
    Job j;
    j.out = name;
    j.sources = {name};
    j.shape = info.shape;
    j.src_dtype = info.dtype_name;
    jobs.push_back(std::move(j));
  }
}

// --- how each output tensor is stored ------------------------------------------------------

// The bits mlx_lm.convert.mixed_quant_predicate_builder gives module `path`: the recipe's high
// bits for v / down projections of the first and last eighth of the layers and every third in
// between, and for lm_head; its low bits elsewhere. The layer index is the path's first number.
int mixed_bits(const std::string& path, const Recipe& recipe, std::int64_t num_layers) {
  std::int64_t index = 0;
  const auto parts_at = path.find("layers.");
  if (parts_at != std::string::npos) index = std::atoll(path.c_str() + parts_at + 7);
  const std::int64_t n8 = num_layers / 8;
  const bool more = index < n8 || index >= 7 * num_layers / 8 || (((index - n8) % 3) + 3) % 3 == 2;
  if ((path.find("v_proj") != std::string::npos || path.find("v_a_proj") != std::string::npos ||
       path.find("v_b_proj") != std::string::npos) &&
      more)
    return recipe.high;
  if (path.find("down_proj") != std::string::npos && more) return recipe.high;
  if (path.find("lm_head") != std::string::npos) return recipe.high;
  return recipe.low;
}

// Each job's dtype and quantization (mlx_lm.utils.quantize_model's wrapped_predicate and the
// family's cast_predicate); returns config.json's `quantization` with its per-module entries.
json decide_storage(std::vector<Job>& jobs, const MoeConfig& cfg, const FamilyRules& rules,
                    std::optional<DType> target, const QuantizeOptions& opt) {
  std::optional<Recipe> recipe;
  if (!opt.recipe.empty()) recipe = quantize_recipe_table().at(opt.recipe);
  std::set<std::string> routers;
  for (const std::int64_t L : cfg.moe_layer_indices())
    routers.insert(replace_layer(cfg.names.block, L) + "." + cfg.names.router);
  json qconfig = {{"group_size", opt.group_size}, {"bits", opt.bits}, {"mode", opt.mode}};
  const std::optional<kernels::FpMode> fp = fp_mode_named(opt.mode);
  for (Job& j : jobs) {
    if (!is_float_name(j.src_dtype)) continue;  // integer tensors are copied as they are
    const DType stored = j.src_dtype == "F32"    ? DType::f32
                         : j.src_dtype == "BF16" ? DType::bf16
                                                 : DType::f16;
    const bool cast_ok = !(rules.keep_selection_bias_f32 &&
                           j.out.find("e_score_correction_bias") != std::string::npos);
    j.cast = target && cast_ok ? *target : stored;
    j.counted = rules.uncounted_suffix.empty() || !ends_with(j.out, rules.uncounted_suffix);
    if (!ends_with(j.out, ".weight")) continue;
    const std::string path = j.out.substr(0, j.out.size() - 7);
    // Rank 3: stacked experts (SwitchLinear) and MLA's per-head MultiLinear.
    const bool stacked = j.shape.size() == 3 &&
                         (j.out.find(".switch_mlp.") != std::string::npos || j.mla ||
                          (rules.fused_gpt_oss && j.out.find(".experts.") != std::string::npos));
    if (!(j.shape.size() == 2 || stacked)) continue;
    const bool router = routers.count(path) > 0;
    if (router && !rules.router_linear) continue;
    if (j.shape.back() % opt.group_size != 0) continue;
    int bits = opt.bits, group = opt.group_size;
    json entry;  // null: no per-module entry
    if (recipe) {
      bits = mixed_bits(path, *recipe, cfg.num_layers);
      entry = {{"group_size", group}, {"bits", bits}, {"mode", "affine"}};
    } else if (router && opt.router_bits == 0) {
      continue;
    } else if (router && opt.router_bits > 0) {
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
    // A per-module entry without "mode" (the routers') is affine, mlx's default.
    if (entry.is_null() || entry.contains("mode")) j.fp_mode = fp;
    j.counted = true;
    if (!entry.is_null()) qconfig[path] = entry;
  }
  return qconfig;
}

// Output tensors and their shards (mlx_lm.utils.make_shards: fill in order up to the limit).
void plan_shards(QuantizePlan& plan, std::int64_t max_shard_bytes) {
  for (std::size_t i = 0; i < plan.jobs.size(); ++i) {
    const Job& j = plan.jobs[i];
    if (j.bits) {
      const std::string path = j.out.substr(0, j.out.size() - 7);
      Shape codes = j.shape, groups = j.shape;
      codes.back() = j.shape.back() * j.bits / 32;
      groups.back() = j.shape.back() / j.group;
      plan.outs.push_back(
          {i, {j.out, "U32", codes, static_cast<std::size_t>(shape_numel(codes)) * 4}});
      if (j.fp_mode) {  // uint8 scales (e8m0, or e4m3 for nvfp4), no biases
        plan.outs.push_back({i, {path + ".scales", "U8", groups, static_cast<std::size_t>(shape_numel(groups))}});
        continue;
      }
      const std::size_t sb = static_cast<std::size_t>(shape_numel(groups)) * dtype_size(*j.cast);
      plan.outs.push_back({i, {path + ".scales", safetensors_dtype_name(*j.cast), groups, sb}});
      plan.outs.push_back({i, {path + ".biases", safetensors_dtype_name(*j.cast), groups, sb}});
    } else {
      const TensorInfo& src = plan.ck->info(j.sources[0]);
      const std::size_t n =
          j.cast ? static_cast<std::size_t>(shape_numel(j.shape)) * dtype_size(*j.cast)
                 : src.end - src.begin;
      plan.outs.push_back(
          {i, {j.out, j.cast ? safetensors_dtype_name(*j.cast) : j.src_dtype, j.shape, n}});
    }
  }
  std::size_t size = 0;
  for (std::size_t k = 0; k < plan.outs.size(); ++k) {
    const std::size_t nb = plan.outs[k].entry.nbytes;
    if (plan.shards.empty() || size + nb > static_cast<std::size_t>(max_shard_bytes)) {
      plan.shards.emplace_back();
      size = 0;
    }
    plan.shards.back().push_back(k);
    size += nb;
  }
}

}  // namespace

void quantize_bad(const std::string& what) {
  throw std::invalid_argument("[moekit::quantize_checkpoint] " + what);
}

const std::map<std::string, Recipe>& quantize_recipe_table() {
  static const std::map<std::string, Recipe> kRecipes = {
      {"mixed_2_6", {2, 6}}, {"mixed_3_4", {3, 4}}, {"mixed_3_6", {3, 6}}, {"mixed_4_6", {4, 6}}};
  return kRecipes;
}

std::optional<kernels::FpMode> fp_mode_named(const std::string& name) {
  if (name == "mxfp4") return kernels::FpMode::mxfp4;
  if (name == "nvfp4") return kernels::FpMode::nvfp4;
  if (name == "mxfp8") return kernels::FpMode::mxfp8;
  return std::nullopt;
}

std::optional<DType> float_dtype_named(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16") return DType::f16;
  return std::nullopt;
}

QuantizePlan plan_quantize(const fs::path& src, const QuantizeOptions& opt) {
  QuantizePlan plan;
  plan.config = read_config(src);
  const MoeConfig cfg = load_hf_config(src.string());
  plan.model_type = cfg.model_type;
  const FamilyRules& rules = rules_for(cfg.model_type);
  plan.ck = Checkpoint::open(src.string());
  const std::optional<DType> target = target_dtype(plan.config, opt);
  const json& config = plan.config;
  const bool tie = config.contains("tie_word_embeddings") &&
                   config["tie_word_embeddings"].is_boolean() &&
                   config["tie_word_embeddings"].get<bool>();
  check_float_tensors(*plan.ck);

  Planner p{cfg, rules, *plan.ck, config, src, {}, {}};
  for (const std::int64_t L : cfg.moe_layer_indices()) {
    const std::string block = replace_layer(cfg.names.block, L);
    const std::string ex = block + "." + cfg.names.experts + ".";
    if (rules.fused_gpt_oss && plan.ck->contains(ex + "gate_up_proj")) p.gpt_oss_experts(ex);
    p.stacked_experts(block, ex);
    p.check_experts_consumed(ex);
  }
  if (rules.mla_split) p.mla_split();
  p.pass_through(tie, plan.tensors_dropped);
  plan.jobs = std::move(p.jobs);
  std::sort(plan.jobs.begin(), plan.jobs.end(),
            [](const Job& a, const Job& b) { return natural_less(a.out, b.out); });

  if (opt.router_bits > 0 && !rules.router_linear)
    quantize_bad(cfg.model_type +
                 "'s router is not a linear layer in mlx-lm (MoEGate) and is never quantized: drop "
                 "--router-bits");
  plan.qconfig = decide_storage(plan.jobs, cfg, rules, target, opt);
  plan_shards(plan, opt.max_shard_bytes);
  return plan;
}

}  // namespace moekit::detail
