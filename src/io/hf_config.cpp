// config.json -> MoeConfig. One row of kFamilies per model family: which fields it reads and
// how they map onto RouterConfig knobs (docs/routing.md, "Families"); which model_types belong to
// which family is family.hpp's table. Generic code below never tests a model_type.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "io/family.hpp"
#include "io/release_quant.hpp"
#include "moekit/config.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

using nlohmann::json;

// Typed field access with messages that name the field.
struct Fields {
  const json& j;
  std::string model_type;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }

  [[noreturn]] void bad(const char* key, const char* want) const {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": field '" << key
                                                                        << "' must be " << want << ", got "
                                                                        << (has(key) ? j.at(key).dump() : "nothing")));
  }
  std::int64_t integer(const char* key) const {
    if (!has(key)) bad(key, "an integer (required)");
    const json& v = j.at(key);
    if (!v.is_number_integer()) bad(key, "an integer");
    return v.get<std::int64_t>();
  }
  std::int64_t integer(const char* key, std::int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  // The first present key of several aliases.
  std::int64_t integer_any(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return integer(k);
    std::string names;
    for (const char* k : keys) names += (names.empty() ? "" : " | ") + std::string(k);
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": missing required field "
                                                                        << names));
  }
  double number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_number()) bad(key, "a number");
    return j.at(key).get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_boolean()) bad(key, "true or false");
    return j.at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_string()) bad(key, "a string");
    return j.at(key).get<std::string>();
  }
  std::vector<std::int64_t> int_list(const char* key) const {
    std::vector<std::int64_t> out;
    if (!has(key)) return out;
    if (!j.at(key).is_array()) bad(key, "a list of integers");
    for (const json& v : j.at(key)) {
      if (!v.is_number_integer()) bad(key, "a list of integers");
      out.push_back(v.get<std::int64_t>());
    }
    return out;
  }
};

[[noreturn]] void unsupported(const std::string& model_type, const char* field, const std::string& value,
                              const char* supported) {
  throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": unsupported " << field
                                                                      << " '" << value << "' (supported: " << supported
                                                                      << ")"));
}

BodyKind body_from_act(const Fields& f, bool gated) {
  const std::string act = f.string("hidden_act", "silu");
  if (gated) {
    if (act == "silu" || act == "swish") return BodyKind::swiglu;
    if (act == "gelu") return BodyKind::geglu;
    if (act == "gelu_pytorch_tanh" || act == "gelu_new") return BodyKind::geglu_tanh;
    unsupported(f.model_type, "hidden_act", act, "silu, swish, gelu, gelu_pytorch_tanh, gelu_new");
  }
  if (act == "relu") return BodyKind::mlp_relu;
  if (act == "relu2") return BodyKind::mlp_relu2;
  if (act == "silu") return BodyKind::mlp_silu;
  unsupported(f.model_type, "hidden_act", act, "relu, relu2, silu");
}

// --- the families -------------------------------------------------------------------------

void deepseek_v2(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer("n_routed_experts");
  c.expert_width = f.integer("moe_intermediate_size");
  const std::string scoring = f.string("scoring_func", "softmax");
  if (scoring != "softmax") unsupported(f.model_type, "scoring_func", scoring, "softmax");
  c.router.score_func = ScoreFunc::softmax;
  const std::string method = f.string("topk_method", "greedy");
  if (method == "group_limited_greedy") {
    c.router.group_mode = GroupMode::max;
    c.router.n_group = f.integer("n_group");
    c.router.topk_group = f.integer("topk_group");
  } else if (method != "greedy") {
    unsupported(f.model_type, "topk_method", method, "greedy, group_limited_greedy");
  }
  // DeepSeek's own modeling code: renormalise only when norm_topk_prob and K > 1, and then do
  // not scale (HF and mlx-lm always scale; identical for every shipped checkpoint, which has
  // norm_topk_prob = false).
  if (f.boolean("norm_topk_prob", false)) {
    c.router.renorm = Renorm::sum_eps;
    c.router.renorm_only_if_k_gt_1 = true;
    c.router.scale_only_without_renorm = true;
  }
  c.router.routed_scaling_factor = static_cast<float>(f.number("routed_scaling_factor", 1.0));
  c.shared_width = f.integer("n_shared_experts", 0) * c.expert_width;
  c.first_k_dense_replace = f.integer("first_k_dense_replace", 0);
  c.moe_layer_freq = f.integer("moe_layer_freq", 1);
  c.names.block = "model.layers.{L}.mlp";
}

void deepseek_v3(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer("n_routed_experts");
  c.expert_width = f.integer("moe_intermediate_size");
  const std::string scoring = f.string("scoring_func", "sigmoid");
  if (scoring == "sigmoid") {
    c.router.score_func = ScoreFunc::sigmoid;
  } else if (scoring == "sqrtsoftplus") {
    c.router.score_func = ScoreFunc::sqrt_softplus;
  } else {
    unsupported(f.model_type, "scoring_func", scoring, "sigmoid, sqrtsoftplus");
  }
  const std::string method = f.string("topk_method", "noaux_tc");
  if (method != "noaux_tc") unsupported(f.model_type, "topk_method", method, "noaux_tc");
  c.router.has_selection_bias = true;
  c.router.group_mode = GroupMode::top2_sum;
  c.router.n_group = f.integer("n_group", 1);
  c.router.topk_group = f.integer("topk_group", 1);
  // DeepSeek-V3's reference and HF renormalise with +1e-20 also when K = 1 (mlx-lm: K > 1 only).
  if (f.boolean("norm_topk_prob", true)) c.router.renorm = Renorm::sum_eps;
  c.router.routed_scaling_factor = static_cast<float>(f.number("routed_scaling_factor", 1.0));
  c.shared_width = f.integer("n_shared_experts", 0) * c.expert_width;
  c.first_k_dense_replace = f.integer("first_k_dense_replace", 0);
  c.moe_layer_freq = f.integer("moe_layer_freq", 1);
  // GLM-4.7-Flash (glm4_moe_lite): a "dense" or "sparse" entry per layer, which wins where given
  if (f.has("mlp_layer_types")) {
    if (!f.j.at("mlp_layer_types").is_array()) f.bad("mlp_layer_types", "a list of \"dense\" / \"sparse\"");
    std::int64_t layer = 0;
    for (const json& t : f.j.at("mlp_layer_types")) {
      if (!t.is_string() || (t.get<std::string>() != "dense" && t.get<std::string>() != "sparse"))
        f.bad("mlp_layer_types", "a list of \"dense\" / \"sparse\"");
      if (t.get<std::string>() == "sparse") c.moe_layers.push_back(layer);
      ++layer;
    }
  }
  c.names.block = "model.layers.{L}.mlp";
}

void mixtral(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer("num_local_experts");
  c.expert_width = f.integer("intermediate_size");
  c.router.score_func = ScoreFunc::softmax;
  c.router.renorm = Renorm::sum;  // softmax over all, then / sum of the K == softmax of the K logits
  c.names.block = "model.layers.{L}.block_sparse_moe";
  c.names.gate_proj = "w1";
  c.names.up_proj = "w3";
  c.names.down_proj = "w2";
}

void qwen_like(const Fields& f, MoeConfig& c, const char* width_key) {
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts (its attribute_map
  // aliases num_experts to it); checkpoints on the hub say num_experts.
  c.router.num_experts = f.integer_any({"num_experts", "num_local_experts"});
  c.expert_width = f.integer(width_key);
  c.router.score_func = ScoreFunc::softmax;
  // Read the field; HF's class default is false (Qwen3 checkpoints set true).
  if (f.boolean("norm_topk_prob", false)) c.router.renorm = Renorm::sum;
  c.decoder_sparse_step = f.integer("decoder_sparse_step", 1);
  c.mlp_only_layers = f.int_list("mlp_only_layers");
  c.names.block = "model.layers.{L}.mlp";
}

void qwen2_moe(const Fields& f, MoeConfig& c) {
  qwen_like(f, c, "moe_intermediate_size");
  c.shared_width = f.integer("shared_expert_intermediate_size", 0);
  c.shared_gated = c.shared_width > 0;
  c.names.shared = "shared_expert";
  c.names.shared_gate = "shared_expert_gate";
}

void qwen3_moe(const Fields& f, MoeConfig& c) { qwen_like(f, c, "moe_intermediate_size"); }

void olmoe(const Fields& f, MoeConfig& c) {
  qwen_like(f, c, "intermediate_size");
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
}

void gpt_oss(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer_any({"num_local_experts", "num_experts"});
  c.router.top_k = f.integer_any({"num_experts_per_tok", "experts_per_token"});
  c.expert_width = f.integer("intermediate_size");
  c.router.score_func = ScoreFunc::softmax_selected;
  c.router.has_router_bias = true;
  c.body = BodyKind::swiglu_clamped;
  c.expert_bias = true;
  c.swiglu_limit = static_cast<float>(f.number("swiglu_limit", 7.0));
  c.names.block = "model.layers.{L}.mlp";
  c.names.router = "router";
  c.names.fused_transposed = true;
  c.names.fused_interleaved = true;
}

void llama4(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer("num_local_experts");
  c.expert_width = f.integer("intermediate_size");
  c.router.score_func = ScoreFunc::sigmoid_selected;
  c.router.weight_on_input = true;
  c.shared_width = c.expert_width;  // one always-on shared expert of the same width
  c.interleave_moe_layer_step = f.integer("interleave_moe_layer_step", 1);
  c.moe_layers = f.int_list("moe_layers");
  c.names.block = "model.layers.{L}.feed_forward";
  c.names.router = "router";
  c.names.shared = "shared_expert";
  c.names.fused_transposed = true;
}

void minimax_m2(const Fields& f, MoeConfig& c) {
  c.router.num_experts = f.integer("num_local_experts");
  c.expert_width = f.integer("intermediate_size");
  const std::string scoring = f.string("scoring_func", "sigmoid");
  if (scoring != "sigmoid") unsupported(f.model_type, "scoring_func", scoring, "sigmoid");
  c.router.score_func = ScoreFunc::sigmoid;
  c.router.has_selection_bias = f.boolean("use_routing_bias", true);
  c.router.renorm = Renorm::sum_eps;
  c.names.block = "model.layers.{L}.block_sparse_moe";
  c.names.selection_bias = "e_score_correction_bias";
  c.names.gate_proj = "w1";
  c.names.up_proj = "w3";
  c.names.down_proj = "w2";
}

// --- presets: the same fields written back, for blocks trained from scratch ---------------

// Shared experts: how a family states them, and how many it ships with.
enum class SharedKind { none, count, width, one };

struct Preset {
  const char* experts_key;  // field of E
  const char* width_key;    // field of F
  SharedKind shared;
  std::int64_t default_shared;  // shared experts when the caller does not say
  json fixed;               // the family's routing fields as a from-scratch block uses them
};

using detail::HfFamily;

struct Family {
  HfFamily family;  // the model_types it reads: family.hpp's kModelTypes
  std::function<void(const Fields&, MoeConfig&)> read;
  Preset preset;
};

const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {HfFamily::deepseek_v2,
       deepseek_v2,
       {"n_routed_experts", "moe_intermediate_size", SharedKind::count, 2,
        {{"topk_method", "greedy"}, {"norm_topk_prob", false}, {"routed_scaling_factor", 1.0}}}},
      {HfFamily::deepseek_v3,
       deepseek_v3,
       {"n_routed_experts", "moe_intermediate_size", SharedKind::count, 1,
        {{"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}, {"n_group", 1}, {"topk_group", 1},
         {"norm_topk_prob", true}, {"routed_scaling_factor", 1.0}}}},
      {HfFamily::mixtral, mixtral, {"num_local_experts", "intermediate_size", SharedKind::none, 0, json::object()}},
      {HfFamily::qwen2_moe,
       qwen2_moe,
       {"num_experts", "moe_intermediate_size", SharedKind::width, 1, {{"norm_topk_prob", false}}}},
      {HfFamily::qwen3_moe,
       qwen3_moe,
       {"num_experts", "moe_intermediate_size", SharedKind::none, 0, {{"norm_topk_prob", true}}}},
      {HfFamily::olmoe, olmoe, {"num_experts", "intermediate_size", SharedKind::none, 0, {{"norm_topk_prob", false}}}},
      {HfFamily::gpt_oss,
       gpt_oss,
       {"num_local_experts", "intermediate_size", SharedKind::none, 0, {{"swiglu_limit", 7.0}}}},
      {HfFamily::llama4,
       llama4,
       {"num_local_experts", "intermediate_size", SharedKind::one, 1, {{"interleave_moe_layer_step", 1}}}},
      {HfFamily::minimax_m2,
       minimax_m2,
       {"num_local_experts", "intermediate_size", SharedKind::none, 0,
        {{"scoring_func", "sigmoid"}, {"use_routing_bias", true}}}},
  };
  return kFamilies;
}

// The family row of `model_type`, or nullptr.
const Family* find_family(const std::string& model_type) {
  const detail::ModelType* type = detail::find_model_type(model_type);
  if (type == nullptr) return nullptr;
  for (const Family& fam : families())
    if (fam.family == type->family) return &fam;
  return nullptr;
}

}  // namespace

std::string supported_model_types() {
  std::string out;
  for (const detail::ModelType& t : detail::kModelTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

namespace {

// One `quantization` entry: {"bits": b, "group_size": g|null, "mode": m} (missing bits / group
// size take mlx's defaults for affine: 4 and 64), or true / false.
QuantParams quant_entry(const json& j, const std::string& model_type, const std::string& where,
                        const QuantParams& defaults) {
  const auto bad = [&](const std::string& what) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": quantization" << where
                                                                        << ": " << what << ", got " << j.dump()));
  };
  if (j.is_boolean()) return j.get<bool>() ? defaults : QuantParams{};
  if (!j.is_object()) bad("must be an object or a boolean");
  QuantParams q;
  q.mode = "affine";
  if (j.contains("mode") && !j.at("mode").is_null()) {
    if (!j.at("mode").is_string()) bad("'mode' must be a string");
    q.mode = j.at("mode").get<std::string>();
  }
  const auto int_field = [&](const char* key, int dflt) {
    if (!j.contains(key) || j.at(key).is_null()) return dflt;
    if (!j.at(key).is_number_integer()) bad(std::string("'") + key + "' must be an integer");
    return j.at(key).get<int>();
  };
  q.bits = int_field("bits", 4);
  q.group_size = int_field("group_size", 64);
  if (q.mode == "affine") {
    if (q.bits != 2 && q.bits != 3 && q.bits != 4 && q.bits != 5 && q.bits != 6 && q.bits != 8)
      bad(MOEKIT_MSG("bits " << q.bits << " is not one of 2, 3, 4, 5, 6, 8"));
    if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
      bad(MOEKIT_MSG("group_size " << q.group_size << " is not one of 32, 64, 128"));
  }
  return q;
}

QuantConfig parse_quantization(const json& root, const std::string& model_type) {
  QuantConfig qc;
  const json* q = nullptr;
  for (const char* key : {"quantization", "quantization_config"})
    if (q == nullptr && root.contains(key) && root.at(key).is_object() &&
        (std::string(key) == "quantization" || root.at(key).contains("bits")))
      q = &root.at(key);
  if (root.contains("quantization_config") && root.at("quantization_config").is_object()) {
    const json& hf = root.at("quantization_config");
    if (hf.contains("quant_method") && !hf.at("quant_method").is_null()) {
      if (!hf.at("quant_method").is_string())
        throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type
                                                                            << ": quantization_config.quant_method "
                                                                               "must be a string, got "
                                                                            << hf.at("quant_method").dump()));
      qc.method = hf.at("quant_method").get<std::string>();
      qc.release = detail::parse_release_quant(hf, qc.method, model_type);
    }
  }
  if (q == nullptr) return qc;
  qc.present = true;
  qc.defaults = quant_entry(*q, model_type, "", QuantParams{});
  for (const auto& [key, value] : q->items())
    if (value.is_object() || value.is_boolean())
      qc.modules[key] = quant_entry(value, model_type, "['" + key + "']", qc.defaults);
  return qc;
}

}  // namespace

QuantParams QuantConfig::of(const std::string& path) const {
  if (!present) return {};
  const auto it = modules.find(path);
  return it != modules.end() ? it->second : defaults;
}

MoeConfig parse_hf_config(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] invalid JSON: " << e.what()));
  }
  if (!root.is_object()) throw std::invalid_argument("[moekit::parse_hf_config] config.json must be a JSON object");
  // Multimodal wrappers (Llama-4) keep the language model's fields in text_config.
  const json* cfg = &root;
  if (root.contains("text_config") && root.at("text_config").is_object()) cfg = &root.at("text_config");
  std::string model_type;
  for (const json* j : std::initializer_list<const json*>{cfg, &root}) {
    if (j->contains("model_type") && j->at("model_type").is_string()) {
      model_type = j->at("model_type").get<std::string>();
      break;
    }
  }
  if (model_type.empty())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] missing 'model_type' (supported: "
                                           << supported_model_types() << ")"));
  const Family* family = find_family(model_type);
  if (family == nullptr)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] unknown model_type '"
                                           << model_type << "' (supported: " << supported_model_types() << ")"));

  const Fields f{*cfg, model_type};
  MoeConfig c;
  c.model_type = model_type;
  c.hidden_size = f.integer("hidden_size");
  c.num_layers = f.integer("num_hidden_layers");
  c.router.top_k = f.integer_any({"num_experts_per_tok", "experts_per_token"});
  c.body = body_from_act(f, true);
  family->read(f, c);
  c.quantization = parse_quantization(root, model_type);
  // moekit's own extension: a selection bias for loss-free balancing on a family without one
  // (written by `moekit train`; docs/formats.md), stored beside the router.
  if (f.boolean("moekit_selection_bias", false) && !c.router.has_selection_bias) {
    c.router.has_selection_bias = true;
    c.names.selection_bias = c.names.router + ".e_score_correction_bias";
  }

  const auto positive = [&](const char* what, std::int64_t v) {
    if (v < 1)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": " << what << " (" << v
                                                                          << ") must be >= 1"));
  };
  positive("hidden_size", c.hidden_size);
  positive("expert width", c.expert_width);
  positive("num_hidden_layers", c.num_layers);
  if (c.num_layers > kMaxLayers)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": num_hidden_layers ("
                                                                        << c.num_layers << ") is above moekit's limit "
                                                                        << kMaxLayers));
  positive("moe_layer_freq", c.moe_layer_freq);
  positive("decoder_sparse_step", c.decoder_sparse_step);
  positive("interleave_moe_layer_step", c.interleave_moe_layer_step);
  if (c.shared_width < 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": shared expert width ("
                                                                        << c.shared_width << ") must be >= 0"));
  try {
    validate(c.router);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": " << e.what()));
  }
  return c;
}

MoeConfig load_hf_config(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
    if (!std::filesystem::is_regular_file(file, ec))
      throw std::runtime_error(MOEKIT_MSG("[moekit::load_hf_config] no config.json in " << path));
  } else if (!std::filesystem::is_regular_file(path, ec)) {
    throw std::runtime_error(MOEKIT_MSG("[moekit::load_hf_config] " << path << " is neither a folder nor a file"));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(MOEKIT_MSG("[moekit::load_hf_config] cannot open " << file));
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return parse_hf_config(ss.str());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(MOEKIT_MSG(e.what() << " (in " << file << ")"));
  }
}

bool MoeConfig::is_moe_layer(std::int64_t layer) const {
  if (layer < 0 || layer >= num_layers)
    throw std::out_of_range(MOEKIT_MSG("[moekit::MoeConfig::is_moe_layer] layer " << layer << " outside [0, "
                                                                                 << num_layers << ")"));
  if (!moe_layers.empty()) return std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end();
  if (layer < first_k_dense_replace) return false;
  if (layer % moe_layer_freq != 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  if ((layer + 1) % decoder_sparse_step != 0) return false;
  if ((layer + 1) % interleave_moe_layer_step != 0) return false;
  return true;
}

std::vector<std::int64_t> MoeConfig::moe_layer_indices() const {
  std::vector<std::int64_t> out;
  for (std::int64_t l = 0; l < num_layers; ++l)
    if (is_moe_layer(l)) out.push_back(l);
  return out;
}

std::string compact_ranges(const std::vector<std::int64_t>& values) {
  if (values.empty()) return "none";
  std::ostringstream os;
  std::size_t i = 0;
  while (i < values.size()) {
    std::size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (i > 0) os << ", ";
    os << values[i];
    if (j > i) os << "-" << values[j];
    i = j + 1;
  }
  return os.str();
}

std::string format_bytes(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  std::ostringstream os;
  os << bytes << " bytes";
  if (unit > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " (%.1f %s)", v, kUnits[unit]);
    os << buf;
  }
  return os.str();
}

const char* body_name(BodyKind kind) noexcept {
  switch (kind) {
    case BodyKind::swiglu:
      return "swiglu";
    case BodyKind::swiglu_clamped:
      return "swiglu_clamped";
    case BodyKind::geglu:
      return "geglu";
    case BodyKind::geglu_tanh:
      return "geglu_tanh";
    case BodyKind::mlp_relu:
      return "mlp_relu";
    case BodyKind::mlp_relu2:
      return "mlp_relu2";
    case BodyKind::mlp_silu:
      return "mlp_silu";
  }
  return "unknown";
}

std::string preset_config_json(const std::string& model_type, const BlockShape& shape) {
  const Family* family = find_family(model_type);
  if (family == nullptr)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::preset_config_json] unknown family '"
                                           << model_type << "' (supported: " << supported_model_types() << ")"));
  const Preset& p = family->preset;
  const std::int64_t shared = shape.shared_experts < 0 ? p.default_shared : shape.shared_experts;
  if (p.shared == SharedKind::none && shared != 0)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::preset_config_json] " << model_type
                                                                          << " has no shared experts (asked for "
                                                                          << shared << ")"));
  if (p.shared == SharedKind::one && shared != 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::preset_config_json] " << model_type
                                                                          << " always has exactly one shared expert "
                                                                             "(asked for "
                                                                          << shared << ")"));
  if (p.shared == SharedKind::width && shared > 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::preset_config_json] " << model_type
                                                                          << " has at most one shared expert (asked for "
                                                                          << shared << ")"));
  json j = p.fixed;
  j["model_type"] = model_type;
  j["hidden_size"] = shape.hidden_size;
  j["num_hidden_layers"] = shape.num_layers;
  j["num_experts_per_tok"] = shape.top_k;
  j[p.experts_key] = shape.num_experts;
  j[p.width_key] = shape.expert_width;
  if (p.shared == SharedKind::count) {
    j["n_shared_experts"] = shared;
    j["first_k_dense_replace"] = 0;
  }
  if (p.shared == SharedKind::width) j["shared_expert_intermediate_size"] = shared * shape.expert_width;
  if (shape.selection_bias) j["moekit_selection_bias"] = true;
  std::string text = j.dump(2);
  parse_hf_config(text);  // what it writes must read back: sizes and knobs validated here
  return text;
}

}  // namespace moekit
