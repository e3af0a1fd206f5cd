// GGUF models (llama.cpp) -> MoeConfig and MoeLayer: the architecture's metadata read as
// llama.cpp reads it (src/models/<arch>.cpp: which keys are required, which defaulted and to
// what), the block's tensors under llama.cpp's names (blk.L.ffn_*), used in place from the
// mapping. Architectures are rows of a table; docs/formats.md ("GGUF") lists them.
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "io/gguf_tensors.hpp"
#include "kernels/formats/ggml_types.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "moekit/gguf.hpp"
#include "moekit/model.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

// llama.cpp's llama_expert_gating_func_type (src/llama-hparams.h).
enum class Gating : std::int64_t { none = 0, softmax = 1, sigmoid = 2, softmax_weight = 3, sqrt_softplus = 4 };

// How one architecture's MoE block is read and computed (llama.cpp's load_hparams, create
// tensors and build_moe_ffn arguments for it).
struct Arch {
  std::string_view name;  // general.architecture
  // The routed experts' width: `<arch>.expert_feed_forward_length` required; or optional, 0 or
  // missing meaning feed_forward_length / expert_used_count (Qwen); or feed_forward_length itself.
  enum class Width { expert_key, expert_key_or_ff_over_k, ff } width;
  // norm_w: always, never, or `<arch>.expert_weights_norm` (default false).
  enum class Norm { always, never, key } norm;
  // The gating function: fixed, or `<arch>.expert_gating_func` with a default (none: required).
  std::optional<Gating> gating;                                              // fixed
  Gating gating_default = Gating::none;                                      // when read from the key
  bool scale_key = false;                                                    // `<arch>.expert_weights_scale`
  enum class Bias { none, optional, required } selection_bias = Bias::none;  // exp_probs_b.bias
  // Shared expert: none; sigmoid-gated of width expert_shared_feed_forward_length (or
  // feed_forward_length); ungated of width F × expert_shared_count (required key); ungated of
  // width F.
  enum class Shared { none, gated, count, one } shared = Shared::none;
  enum class Schedule { all, lead_dense, interleave } schedule = Schedule::all;
  bool gpt_oss = false;        // router and expert biases, the clamped SwiGLU, softmax over the selected logits
  bool llama4 = false;         // sigmoid of the selected logits, the weight on the expert's input
  bool gate_optional = false;  // llama: without ffn_gate_exps the experts are silu(up)
};

using W = Arch::Width;
using N = Arch::Norm;
using B = Arch::Bias;
using S = Arch::Shared;
using L = Arch::Schedule;

constexpr Arch kArchs[] = {
    {.name = "qwen3moe", .width = W::expert_key_or_ff_over_k, .norm = N::always, .gating = Gating::softmax},
    {.name = "qwen2moe",
     .width = W::expert_key_or_ff_over_k,
     .norm = N::never,
     .gating = Gating::softmax,
     .shared = S::gated},
    {.name = "deepseek2",
     .width = W::expert_key,
     .norm = N::key,
     .gating = std::nullopt,
     .gating_default = Gating::softmax,  // (sigmoid for GLM-4.7 Lite: see gating_of)
     .scale_key = true,
     .selection_bias = B::optional,
     .shared = S::count,
     .schedule = L::lead_dense},
    {.name = "glm4moe",
     .width = W::expert_key,
     .norm = N::key,
     .gating = std::nullopt,
     .gating_default = Gating::sigmoid,
     .scale_key = true,
     .selection_bias = B::required,
     .shared = S::count,
     .schedule = L::lead_dense},
    {.name = "gpt-oss", .width = W::expert_key, .norm = N::never, .gating = Gating::softmax_weight, .gpt_oss = true},
    {.name = "llama", .width = W::ff, .norm = N::always, .gating = Gating::softmax, .gate_optional = true},
    {.name = "llama4",
     .width = W::expert_key,
     .norm = N::never,
     .gating = Gating::sigmoid,
     .shared = S::one,
     .schedule = L::interleave,
     .llama4 = true},
    {.name = "olmoe", .width = W::ff, .norm = N::never, .gating = Gating::softmax},
    {.name = "minimax-m2", .width = W::ff, .norm = N::always, .gating = std::nullopt, .selection_bias = B::required},
};

std::string supported_archs() {
  std::string out;
  for (const Arch& a : kArchs) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

// llama.cpp's norm_w floor (the smallest normal f16).
constexpr double kNormFloor = 6.103515625e-5;

[[noreturn]] void fail(const GgufModel& m, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::gguf] " << m.path() << ": " << what));
}

// Metadata access with messages naming the key.
class Meta {
 public:
  Meta(const GgufModel& m, std::string arch) : m_(m), arch_(std::move(arch)) {}
  std::string key(const char* k) const { return arch_ + "." + k; }
  bool has(const char* k) const { return m_.has(key(k)); }
  std::int64_t integer(const char* k) const {
    const std::string name = key(k);
    if (!m_.has(name)) fail(m_, "missing metadata '" + name + "', which llama.cpp requires for " + arch_);
    return int_of(name, m_.get(name));
  }
  std::int64_t integer(const char* k, std::int64_t fallback) const { return has(k) ? integer(k) : fallback; }
  double number(const char* k, double fallback) const {
    if (!has(k)) return fallback;
    const GgufValue& v = m_.get(key(k));
    if (!v.is_float() && !v.is_integer()) fail(m_, "metadata '" + key(k) + "' is " + v.describe() + ", not a number");
    return v.as_float();
  }
  bool boolean(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    const GgufValue& v = m_.get(key(k));
    if (v.type() != GgufType::boolean) fail(m_, "metadata '" + key(k) + "' is " + v.describe() + ", not a bool");
    return v.as_bool();
  }
  // A count that may be one value or one per layer (expert_used_count, feed_forward_length):
  // the value for `layer`, or (layer < 0) the first one.
  std::int64_t per_layer(const char* k, std::int64_t layer, std::int64_t layers, std::int64_t fallback) const {
    if (!has(k)) return fallback;
    const std::string name = key(k);
    const GgufValue& v = m_.get(name);
    if (v.type() != GgufType::array) return int_of(name, v);
    if (static_cast<std::int64_t>(v.size()) != layers)
      fail(m_, MOEKIT_MSG("metadata '" << name << "' has " << v.size() << " values for " << layers << " layers"));
    return int_of(name + "[" + std::to_string(std::max<std::int64_t>(layer, 0)) + "]",
                  v.at(static_cast<std::uint64_t>(std::max<std::int64_t>(layer, 0))));
  }

 private:
  std::int64_t int_of(const std::string& name, const GgufValue& v) const {
    if (!v.is_integer()) fail(m_, "metadata '" + name + "' is " + v.describe() + ", not an integer");
    try {
      return v.as_int();
    } catch (const std::invalid_argument& e) {
      fail(m_, "metadata '" + name + "': " + e.what());
    }
  }
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
  fail(m, "architecture '" + name + "' has no MoE block moekit reads (supported: " + supported_archs() + ")");
}

Gating gating_of(const Arch& a, const Meta& meta, const GgufModel& m, std::int64_t n_layer) {
  if (a.gating) return *a.gating;
  std::int64_t g = meta.integer("expert_gating_func", static_cast<std::int64_t>(Gating::none));
  if (g == static_cast<std::int64_t>(Gating::none)) {
    g = static_cast<std::int64_t>(a.gating_default);
    // deepseek2 without the key: llama.cpp takes sigmoid for GLM-4.7 Lite (47 or 48 layers and a
    // 154880-token vocabulary), softmax (DeepSeek-V2 / V2.5) otherwise.
    if (a.name == "deepseek2" && (n_layer == 47 || n_layer == 48) && m.has("tokenizer.ggml.tokens") &&
        m.get("tokenizer.ggml.tokens").size() == 154880)
      g = static_cast<std::int64_t>(Gating::sigmoid);
  }
  switch (static_cast<Gating>(g)) {
    case Gating::softmax:
    case Gating::sigmoid:
    case Gating::softmax_weight:
    case Gating::sqrt_softplus:
      return static_cast<Gating>(g);
    case Gating::none:
      break;
  }
  fail(m, MOEKIT_MSG("metadata '" << meta.key("expert_gating_func") << "' is "
                                  << (meta.has("expert_gating_func") ? std::to_string(g) : std::string("missing"))
                                  << "; llama.cpp's " << a.name
                                  << " needs 1 (softmax), 2 (sigmoid), 3 (softmax_weight) or 4 (sqrt_softplus)"));
}

// The config, with top_k for `layer` (expert_used_count may be per layer; layer < 0: the first).
MoeConfig config_of(const GgufModel& m, std::int64_t layer) {
  const Arch& a = arch_of(m);
  const Meta meta(m, std::string(a.name));
  MoeConfig c;
  c.model_type = std::string(a.name);
  const std::int64_t layers = meta.integer("block_count");
  if (layers < 1 || layers > kMaxLayers)
    fail(m, MOEKIT_MSG("metadata '" << meta.key("block_count") << "' is " << layers << " (expected 1 to " << kMaxLayers
                                    << ")"));
  c.num_layers = layers;
  c.hidden_size = meta.integer("embedding_length");
  const std::int64_t E = meta.integer("expert_count", 0);
  if (E < 1)
    fail(m, "metadata '" + meta.key("expert_count") + "' is " +
                (meta.has("expert_count") ? std::to_string(E) : "missing") + ": the model has no experts");
  const std::int64_t K = meta.per_layer("expert_used_count", layer, layers, 0);
  if (K < 1 || K > E)
    fail(m, MOEKIT_MSG("metadata '" << meta.key("expert_used_count") << "' is " << K << ", outside [1, " << E << "]"));
  const std::int64_t n_ff = meta.per_layer("feed_forward_length", layer, layers, 0);
  switch (a.width) {
    case W::expert_key:
      c.expert_width = meta.integer("expert_feed_forward_length");
      break;
    case W::expert_key_or_ff_over_k:
      c.expert_width = meta.integer("expert_feed_forward_length", 0);
      if (c.expert_width == 0) c.expert_width = n_ff / K;
      break;
    case W::ff:
      c.expert_width = n_ff;
      break;
  }
  if (c.hidden_size < 1 || c.expert_width < 1)
    fail(m, MOEKIT_MSG("hidden size " << c.hidden_size << " and expert width " << c.expert_width
                                      << " (from the metadata) must be positive"));
  RouterConfig& r = c.router;
  r.num_experts = E;
  r.top_k = K;
  const Gating g = gating_of(a, meta, m, layers - meta.integer("nextn_predict_layers", 0));
  r.score_func = a.llama4                      ? ScoreFunc::sigmoid_selected
                 : g == Gating::softmax        ? ScoreFunc::softmax
                 : g == Gating::sigmoid        ? ScoreFunc::sigmoid
                 : g == Gating::softmax_weight ? ScoreFunc::softmax_selected
                                               : ScoreFunc::sqrt_softplus;
  r.weight_on_input = a.llama4;
  r.has_router_bias = a.gpt_oss;
  r.has_selection_bias = a.selection_bias == B::required;  // optional: below, and per layer at load
  // llama.cpp routes within groups whenever expert_group_count > 1, by the sum of each group's two
  // best (biased) scores, for every architecture.
  const std::int64_t groups = meta.integer("expert_group_count", 0);
  if (groups > 1) {
    r.group_mode = GroupMode::top2_sum;
    r.n_group = groups;
    r.topk_group = meta.integer("expert_group_used_count", 0);
  }
  const bool norm = a.norm == N::always || (a.norm == N::key && meta.boolean("expert_weights_norm", false));
  if (norm) {
    r.renorm = Renorm::sum_floor;
    r.renorm_eps = kNormFloor;
  }
  if (a.scale_key) {
    const double s = meta.number("expert_weights_scale", 0.0);
    if (s != 0.0 && s != 1.0) r.routed_scaling_factor = static_cast<float>(s);
  }
  c.body = a.gpt_oss ? BodyKind::swiglu_clamped : BodyKind::swiglu;
  c.expert_bias = a.gpt_oss;
  c.swiglu_limit = 7.0f;  // llama.cpp's SWIGLU_OAI_MOE constants
  c.swiglu_alpha = 1.702f;
  switch (a.shared) {
    case S::none:
      break;
    case S::gated:
      c.shared_width = meta.integer("expert_shared_feed_forward_length", 0);
      if (c.shared_width == 0) c.shared_width = n_ff;
      c.shared_gated = true;
      break;
    case S::count:
      c.shared_width = c.expert_width * meta.integer("expert_shared_count");
      break;
    case S::one:
      c.shared_width = c.expert_width;
      break;
  }
  switch (a.schedule) {
    case L::all:
      break;
    case L::lead_dense:
      c.first_k_dense_replace = meta.integer("leading_dense_block_count", 0);
      break;
    case L::interleave:
      c.interleave_moe_layer_step = meta.integer("interleave_moe_layer_step");
      if (c.interleave_moe_layer_step < 1)
        fail(m, MOEKIT_MSG("metadata '" << meta.key("interleave_moe_layer_step") << "' is "
                                        << c.interleave_moe_layer_step));
      break;
  }
  if (a.selection_bias == B::optional) {  // deepseek2: as the first MoE layer has it
    const std::vector<std::int64_t> moe = c.moe_layer_indices();
    r.has_selection_bias = !moe.empty() && m.find(MOEKIT_MSG("blk." << moe.front() << ".exp_probs_b.bias")) != nullptr;
  }
  c.names.block = "blk.{L}";
  c.names.router = "ffn_gate_inp";
  c.names.experts = "ffn_{gate,up,down}_exps";
  c.names.selection_bias = "exp_probs_b.bias";
  c.names.shared = "ffn_{gate,up,down}_shexp";
  if (c.shared_gated) c.names.shared_gate = "ffn_gate_inp_shexp";
  try {
    validate(r);
  } catch (const std::invalid_argument& e) {
    fail(m, std::string("the metadata gives an invalid routing: ") + e.what());
  }
  return c;
}

// Rows [first, first + rows) of every expert of `m` as a view (the halves of a fused gate_up).
ExpertMatrix row_range(const ExpertMatrix& m, std::int64_t first, std::int64_t rows) {
  ExpertMatrix v = m;
  v.rows = rows;
  const std::size_t step = static_cast<std::size_t>(first * m.row_stride) * dtype_size(m.dtype);
  for (const void*& p : v.experts) p = static_cast<const std::uint8_t*>(p) + step;
  return v;
}

}  // namespace

MoeConfig gguf_config(const GgufModel& model) { return config_of(model, -1); }

MoeLayer load_moe_layer(std::shared_ptr<const GgufModel> model, const MoeConfig& given, std::int64_t layer) {
  if (!model) throw std::invalid_argument("[moekit::load_moe_layer] no GGUF model");
  if (layer < 0 || layer >= given.num_layers)
    throw std::out_of_range(
        MOEKIT_MSG("[moekit::load_moe_layer] layer " << layer << " outside [0, " << given.num_layers << ")"));
  if (!given.is_moe_layer(layer))
    throw std::invalid_argument(MOEKIT_MSG("[moekit::load_moe_layer] layer "
                                           << layer << " is dense, not MoE (" << given.model_type
                                           << "; MoE layers: " << compact_ranges(given.moe_layer_indices()) << ")"));
  const GgufModel& m = *model;
  const Arch& a = arch_of(m);
  MoeConfig c = given;
  // expert_used_count may differ per layer; the caller's routing knobs stay as given.
  c.router.top_k = Meta(m, std::string(a.name)).per_layer("expert_used_count", layer, c.num_layers, c.router.top_k);
  const detail::GgufTensors r(m, "blk." + std::to_string(layer) + ".");
  const std::int64_t E = c.router.num_experts, D = c.hidden_size, F = c.expert_width;
  if (!r.find("ffn_gate_inp.weight")) {
    if (a.name == "llama")  // llama.cpp: a llama layer is MoE iff it has a router
      throw std::invalid_argument(MOEKIT_MSG("[moekit::load_moe_layer] " << m.path() << ": layer " << layer
                                                                         << " has no 'blk." << layer
                                                                         << ".ffn_gate_inp.weight': a dense layer"));
    r.get("ffn_gate_inp.weight", {D, E});  // the named error
  }
  if (a.selection_bias == B::optional) c.router.has_selection_bias = r.find("exp_probs_b.bias") != nullptr;

  MoeWeights w;
  w.keep_alive.push_back(model);
  w.block = "blk." + std::to_string(layer);
  w.layout = "gguf";
  w.mapped = true;
  const ExpertMatrix router = r.matrix("ffn_gate_inp.weight", 0, E, D);
  if (router.quantized()) {
    w.router_quantized = router;
  } else if (router.dtype == DType::f16) {
    auto t = std::make_shared<Tensor>(to_dtype(TensorView(router.experts.front(), {E, D}, DType::f16), DType::f32));
    w.keep_alive.push_back(t);
    w.router = t->view();
  } else {
    w.router = TensorView(router.experts.front(), {E, D}, router.dtype);
  }
  if (c.router.has_router_bias) w.router_bias = r.f32("ffn_gate_inp.bias", {E});
  if (c.router.has_selection_bias) w.selection_bias = r.f32("exp_probs_b.bias", {E});

  ExpertWeights& ex = w.experts;
  ex.keep_alive.push_back(model);
  if (r.find("ffn_gate_up_exps.weight")) {
    const ExpertMatrix gu = r.matrix("ffn_gate_up_exps.weight", E, 2 * F, D);
    ex.gate = row_range(gu, 0, F);
    ex.up = row_range(gu, F, F);
    w.layout = "gguf_fused_gate_up";
  } else {
    if (!(a.gate_optional && !r.find("ffn_gate_exps.weight"))) ex.gate = r.matrix("ffn_gate_exps.weight", E, F, D);
    ex.up = r.matrix("ffn_up_exps.weight", E, F, D);
  }
  ex.down = r.matrix("ffn_down_exps.weight", E, D, F);
  if (!ex.gate.defined()) c.body = BodyKind::mlp_silu;  // llama without ffn_gate_exps: silu(up)
  if (c.expert_bias) {
    ex.gate_bias = r.f32("ffn_gate_exps.bias", {F, E});
    ex.up_bias = r.f32("ffn_up_exps.bias", {F, E});
    ex.down_bias = r.f32("ffn_down_exps.bias", {D, E});
    ex.gate_bias.reshape({E, F});  // ne {F, E}: expert e's F values are row e
    ex.up_bias.reshape({E, F});
    ex.down_bias.reshape({E, D});
  }
  if (c.shared_width > 0) {
    const std::int64_t Sw = c.shared_width;
    ExpertWeights& sh = w.shared;
    sh.keep_alive.push_back(model);
    sh.gate = r.matrix("ffn_gate_shexp.weight", 0, Sw, D);
    sh.up = r.matrix("ffn_up_shexp.weight", 0, Sw, D);
    sh.down = r.matrix("ffn_down_shexp.weight", 0, D, Sw);
    if (c.shared_gated) {
      const ExpertMatrix g = r.matrix("ffn_gate_inp_shexp.weight", 0, 1, D);
      if (g.quantized()) {
        w.shared_gate_quantized = g;
      } else {
        auto t = std::make_shared<Tensor>(to_dtype(TensorView(g.experts.front(), {1, D}, g.dtype), DType::f32));
        w.keep_alive.push_back(t);
        w.shared_gate = t->view();
      }
    }
  }
  return MoeLayer(c, std::move(w));
}

MoeConfig load_config(const std::string& path) {
  return is_gguf_path(path) ? gguf_config(*GgufModel::open(path)) : load_hf_config(path);
}

}  // namespace moekit
