// GCC 12 warns, wrongly, that std::regex's NFA copies an uninitialised std::function when it
// inlines <regex> at -O1 (the ASan build; GCC bug 105562). Set before any header: the warning
// points into <functional>.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "io/release_quant.hpp"

#include <regex>
#include <stdexcept>
#include <vector>

#include "util/error.hpp"

namespace moekit {

using nlohmann::json;

bool ReleaseQuant::excludes(const std::string& module) const {
  for (const std::string& e : exclude) {
    if (e.rfind("re:", 0) == 0) {
      try {
        if (std::regex_search(module, std::regex(e.substr(3)), std::regex_constants::match_continuous)) return true;
      } catch (const std::regex_error&) {
        throw std::invalid_argument(MOEKIT_MSG("[moekit::load_moe_layer] quantization_config's ignore entry '"
                                               << e << "' is not a valid regular expression"));
      }
      continue;
    }
    if (e.empty()) continue;
    const std::string dotted = "." + e;
    if (module == e || module.rfind(e + ".", 0) == 0 ||
        (module.size() > dotted.size() && module.compare(module.size() - dotted.size(), dotted.size(), dotted) == 0) ||
        module.find(dotted + ".") != std::string::npos)
      return true;
  }
  return false;
}

namespace detail {

namespace {

// Fails naming the model type and the field.
struct Fields {
  const json& j;
  std::string model_type, where;

  [[noreturn]] void bad(const std::string& what) const {
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::parse_hf_config] " << model_type << ": quantization_config" << where << ": " << what));
  }
  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_string()) bad(MOEKIT_MSG("'" << key << "' must be a string, got " << j.at(key).dump()));
    return j.at(key).get<std::string>();
  }
  int integer(const char* key, int dflt) const {
    if (!has(key)) return dflt;
    if (!j.at(key).is_number_integer() || j.at(key).get<long long>() <= 0 || j.at(key).get<long long>() > 1 << 20)
      bad(MOEKIT_MSG("'" << key << "' must be a positive integer, got " << j.at(key).dump()));
    return j.at(key).get<int>();
  }
  // [rows, cols] of two positive integers, or null.
  bool pair(const char* key, int& rows, int& cols) const {
    if (!has(key)) return false;
    const json& v = j.at(key);
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
        v[0].get<long long>() <= 0 || v[1].get<long long>() <= 0 || v[0].get<long long>() > 1 << 20 ||
        v[1].get<long long>() > 1 << 20)
      bad(MOEKIT_MSG("'" << key << "' must be [rows, cols] of two positive integers, got " << v.dump()));
    rows = v[0].get<int>();
    cols = v[1].get<int>();
    return true;
  }
  std::vector<std::string> strings(const char* key) const {
    std::vector<std::string> out;
    if (!has(key)) return out;
    if (!j.at(key).is_array()) bad(MOEKIT_MSG("'" << key << "' must be a list of strings, got " << j.at(key).dump()));
    for (const json& e : j.at(key)) {
      if (!e.is_string()) bad(MOEKIT_MSG("'" << key << "' must be a list of strings, got " << j.at(key).dump()));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
};

// Why an `re:` pattern from an untrusted config is refused, or "": one that does not compile, is
// longer than 512 characters, or repeats a group that itself holds a repetition ("(a+)+"), the
// shape whose backtracking is exponential — std::regex would hang on it. The releases' patterns
// (".*mlp\\.(gate|up)_proj.*") have none.
std::string unsafe_pattern(const std::string& re) {
  if (re.size() > 512) return "is longer than 512 characters";
  std::vector<bool> inner;  // per open group: whether it holds a quantifier
  for (std::size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\') {
      ++i;
      continue;
    }
    const bool quant = c == '*' || c == '+' || c == '{' || c == '?';
    if (c == '(') inner.push_back(false);
    if (quant && !inner.empty()) inner.back() = true;
    if (c == ')' && !inner.empty()) {
      const bool held = inner.back();
      inner.pop_back();
      const char next = i + 1 < re.size() ? re[i + 1] : '\0';
      if (held && (next == '*' || next == '+' || next == '{'))
        return "repeats a group that repeats (exponential matching)";
      if (held && !inner.empty()) inner.back() = true;
    }
  }
  try {
    (void)std::regex(re);
  } catch (const std::regex_error&) {
    return "is not a valid regular expression";
  }
  return {};
}

// Fine-grained FP8 (transformers' FineGrainedFP8Config; DeepSeek-V3, Qwen3-FP8, MiniMax-M2).
ReleaseQuant fp8(const Fields& f) {
  ReleaseQuant r;
  // DeepSeek-V3 writes "e4m3", MiniMax-M2 torch's dtype name "float8_e4m3fn": the same format.
  const std::string fmt = f.string("fmt", "e4m3");
  if (fmt != "e4m3" && fmt != "float8_e4m3fn")
    f.bad("fmt '" + fmt + "' is not supported (supported: e4m3, float8_e4m3fn)");
  const std::string scale_fmt = f.string("scale_fmt", "float");
  if (scale_fmt != "float" && scale_fmt != "ue8m0")
    f.bad("scale_fmt '" + scale_fmt + "' is not supported (supported: float, ue8m0)");
  const std::string experts = f.string("expert_dtype", "fp8");
  if (experts != "fp8") f.bad("expert_dtype '" + experts + "' is not supported (supported: fp8)");
  const std::string act = f.string("activation_scheme", "dynamic");
  if (act != "dynamic" && act != "static")
    f.bad("activation_scheme '" + act + "' is not supported (supported: dynamic, static)");
  r.element = "e4m3";
  // transformers' default block; null means one scale per tensor.
  r.block_rows = r.block_cols = 128;
  if (f.j.contains("weight_block_size") && f.j.at("weight_block_size").is_null()) r.block_rows = r.block_cols = 0;
  f.pair("weight_block_size", r.block_rows, r.block_cols);
  r.scale_suffix = "weight_scale_inv";
  r.exclude = f.strings("modules_to_not_convert");
  if (r.exclude.empty()) r.exclude = f.strings("ignored_layers");  // MiniMax-M2's name for it
  return r;
}

// compressed-tensors: the one weights scheme of its config groups that targets Linear layers.
ReleaseQuant compressed_tensors(const Fields& f) {
  ReleaseQuant r;
  const std::string format = f.string("format", "");
  if (!f.has("config_groups") || !f.j.at("config_groups").is_object() || f.j.at("config_groups").empty())
    f.bad("'config_groups' must be a non-empty object");
  const json* weights = nullptr;
  std::string group_format = format, group_name;
  for (const auto& [name, group] : f.j.at("config_groups").items()) {
    const Fields g{group, f.model_type, f.where + ".config_groups." + name};
    if (!group.is_object() || !g.has("weights")) continue;
    if (weights != nullptr && group.at("weights") != *weights)
      g.bad("a second weights scheme (moekit reads one per release: '" + group_name + "' has " + weights->dump() + ")");
    weights = &group.at("weights");
    group_name = name;
    group_format = g.string("format", format);
  }
  if (weights == nullptr || !weights->is_object()) f.bad("no config group has a 'weights' scheme");
  const Fields w{*weights, f.model_type, f.where + ".config_groups." + group_name + ".weights"};
  const std::string type = w.string("type", "int"), strategy = w.string("strategy", "tensor");
  const int bits = w.integer("num_bits", 8);
  if (group_format == "float-quantized" || group_format == "naive-quantized") {
    if (type != "float" || bits != 8)
      w.bad(MOEKIT_MSG("format " << group_format << " with " << type << " " << bits
                                 << "-bit weights is not supported (supported: float 8-bit, e4m3)"));
    r.element = "e4m3";
  } else if (group_format == "pack-quantized") {
    if (type != "int" || bits != 4)
      w.bad(MOEKIT_MSG("pack-quantized " << type << " " << bits
                                         << "-bit weights are not supported (supported: int 4-bit)"));
    r.element = "int4";
  } else {
    f.bad("format '" + group_format +
          "' is not supported (supported: float-quantized, naive-quantized, pack-quantized)");
  }
  if (w.has("symmetric") && !w.j.at("symmetric").is_boolean())
    w.bad("'symmetric' must be true or false, got " + w.j.at("symmetric").dump());
  r.symmetric = !w.has("symmetric") || w.j.at("symmetric").get<bool>();
  if (!r.symmetric && r.element == "e4m3") w.bad("asymmetric float weights are not supported");
  if (strategy == "channel") {
    r.block_rows = 1;
  } else if (strategy == "group") {
    r.block_rows = 1;
    r.block_cols = w.integer("group_size", 0);
    if (r.block_cols == 0) w.bad("strategy 'group' needs 'group_size'");
  } else if (strategy == "block") {
    if (!w.pair("block_structure", r.block_rows, r.block_cols)) w.bad("strategy 'block' needs 'block_structure'");
  } else if (strategy != "tensor") {
    w.bad("strategy '" + strategy + "' is not supported (supported: tensor, channel, group, block)");
  }
  if (r.element == "int4" && r.block_cols == 0 && strategy != "channel")
    w.bad("int4 weights need a scale per row or per group");
  r.scale_suffix = "weight_scale";
  r.round_to_scale_dtype = true;
  r.exclude = f.strings("ignore");
  for (const std::string& e : r.exclude)
    if (e.rfind("re:", 0) == 0)
      if (const std::string why = unsafe_pattern(e.substr(3)); !why.empty()) f.bad("ignore entry '" + e + "' " + why);
  return r;
}

}  // namespace

ReleaseQuant parse_release_quant(const json& qc, const std::string& method, const std::string& model_type) {
  const Fields f{qc, model_type, ""};
  if (method == "fp8") return fp8(f);
  if (method == "compressed-tensors") return compressed_tensors(f);
  return {};
}

}  // namespace detail
}  // namespace moekit
