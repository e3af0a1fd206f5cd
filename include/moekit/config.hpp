// MoeConfig: everything moekit needs to know about one model's MoE blocks, read from a
// Hugging Face config.json. Families are rows of a table (src/io/hf_config.cpp), not branches.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/routing.hpp"

namespace moekit {

/// The expert body (docs/routing.md, "Families").
enum class BodyKind : std::uint8_t {
  swiglu,         ///< down(silu(gate x) * up x)
  swiglu_clamped, ///< GPT-OSS: g = min(gate, L), u = clamp(up, -L, L), down(g * sigmoid(alpha g) * (u + 1))
  geglu,          ///< down(gelu(gate x) * up x), exact (erf) gelu
  geglu_tanh,     ///< down(gelu_tanh(gate x) * up x), the tanh approximation
  mlp_relu,       ///< down(relu(up x))
  mlp_relu2,      ///< down(relu(up x)^2)
  mlp_silu,       ///< down(silu(up x))
};

/// Whether the body has a gate projection (the GLU kinds: gate, up and down) or is a plain MLP
/// (up and down only).
constexpr bool is_gated(BodyKind kind) noexcept {
  return kind == BodyKind::swiglu || kind == BodyKind::swiglu_clamped || kind == BodyKind::geglu ||
         kind == BodyKind::geglu_tanh;
}

/// Lower-case name of a body ("swiglu", "swiglu_clamped", ...).
const char* body_name(BodyKind kind) noexcept;

/// "1-3, 5" for {1, 2, 3, 5}; "none" for an empty list. Values must be sorted.
std::string compact_ranges(const std::vector<std::int64_t>& values);

/// "98304 bytes (96.0 KiB)" (inspect reports, messages).
std::string format_bytes(std::size_t bytes);

/// Where the weights of one MoE block live in a checkpoint (docs/routing.md, "Checkpoint names"). `{L}` stands for
/// the layer index.
struct WeightNames {
  std::string block;              ///< e.g. "model.layers.{L}.mlp"
  std::string router = "gate";    ///< router linear, relative to block ("gate", "router")
  std::string experts = "experts";
  std::string gate_proj = "gate_proj", up_proj = "up_proj", down_proj = "down_proj";  ///< per-expert names
  std::string selection_bias = "gate.e_score_correction_bias";  ///< relative to block
  std::string shared = "shared_experts";  ///< shared expert module, relative to block
  std::string shared_gate;                ///< e.g. "shared_expert_gate" (Qwen2-MoE); empty if none
  /// Fused `experts.gate_up_proj` is stored [E, D, 2F] (Llama-4, GPT-OSS) instead of [E, 2F, D].
  bool fused_transposed = false;
  /// In the fused tensor gate and up alternate (GPT-OSS: gate = 0, 2, 4, ...) instead of gate
  /// being the first half.
  bool fused_interleaved = false;
};

/// One module's quantization as config.json states it (mlx-lm's `quantization`).
struct QuantParams {
  int bits = 0;        ///< 0: the module is not quantized
  int group_size = 0;  ///< elements per scale/bias group
  std::string mode = "affine";  ///< only "affine" can be computed on
};

/// How a Hugging Face release's `quantization_config` says its quantized modules are stored, as
/// far as moekit reads it (docs/formats.md, "Released formats"): quant_method "fp8" (fine-grained
/// FP8: `weight` F8_E4M3 and `weight_scale_inv`) or "compressed-tensors" (`float-quantized`:
/// `weight` F8_E4M3 and `weight_scale`; `pack-quantized`: `weight_packed` I32, `weight_scale`,
/// `weight_shape`). GPT-OSS's "mxfp4" needs nothing here.
struct ReleaseQuant {
  std::string element;  ///< "e4m3" or "int4"; empty: the release quantizes nothing moekit reads this way
  /// The block one scale covers, [rows, cols] of weights; 0 stands for the whole dimension (a scale
  /// per row is {1, 0}, one per tensor {0, 0}). fp8: weight_block_size; compressed-tensors: the
  /// strategy (block: block_structure, group: {1, group_size}, channel, tensor).
  int block_rows = 0, block_cols = 0;
  std::string scale_suffix;  ///< "weight_scale_inv" (fp8) or "weight_scale" (compressed-tensors)
  bool symmetric = true;     ///< compressed-tensors: false adds `weight_zero_point`
  /// compressed-tensors decodes in the scale's dtype (value × scale rounded to bf16 / f16).
  bool round_to_scale_dtype = false;
  /// Modules stored unquantized: modules_to_not_convert / ignored_layers (fp8), ignore
  /// (compressed-tensors; "re:" entries are regular expressions matched from the name's start).
  std::vector<std::string> exclude;

  bool quantizes() const noexcept { return !element.empty(); }
  /// Whether `module` (a path without `.weight`) is in `exclude`: equal to an entry, an entry's
  /// dotted suffix or prefix, or matched by an "re:" entry.
  bool excludes(const std::string& module) const;
};

/// config.json's `quantization` (or its mirror `quantization_config`), as mlx-lm writes it:
/// top-level bits / group_size / mode, and per-module entries keyed by module path (the tensor
/// name without `.weight`) that override them (`false`: that module is not quantized; a
/// `group_size` of null means 64, as mlx's QuantizedLinear defaults).
struct QuantConfig {
  bool present = false;
  /// `quantization_config.quant_method` of a Hugging Face release ("mxfp4": GPT-OSS as OpenAI ships
  /// it); empty for mlx-lm's configs. The loader refuses a method it does not read, naming it.
  std::string method;
  /// quant_method "fp8" / "compressed-tensors": how its modules are stored.
  ReleaseQuant release;
  QuantParams defaults;
  std::map<std::string, QuantParams> modules;

  /// The parameters for module `path`: its entry, else the defaults; bits == 0 if none apply.
  QuantParams of(const std::string& path) const;
};

/// The most decoder layers a config may declare (config.json's num_hidden_layers, GGUF's
/// block_count): far above any released model, and a bound on what listing the layers costs.
inline constexpr std::int64_t kMaxLayers = 1 << 16;

struct MoeConfig {
  std::string model_type;       ///< as in config.json ("deepseek_v3", "mixtral", ...)
  std::int64_t hidden_size = 0;  ///< D
  std::int64_t expert_width = 0; ///< F of one routed expert
  RouterConfig router;

  BodyKind body = BodyKind::swiglu;
  bool expert_bias = false;     ///< per-expert biases on gate/up/down (GPT-OSS)
  float swiglu_limit = 7.0f;    ///< L of swiglu_clamped
  float swiglu_alpha = 1.702f;  ///< alpha of swiglu_clamped

  std::int64_t shared_width = 0;  ///< total width of the shared expert(s); 0 = none
  bool shared_gated = false;      ///< y += sigmoid(x · w_sg) * shared(x)

  // Layer schedule (which decoder layers have an MoE block).
  std::int64_t num_layers = 0;             ///< at most kMaxLayers
  std::int64_t first_k_dense_replace = 0;  ///< DeepSeek: layers below are dense
  std::int64_t moe_layer_freq = 1;         ///< DeepSeek: MoE iff layer % freq == 0
  std::int64_t decoder_sparse_step = 1;    ///< Qwen: MoE iff (layer + 1) % step == 0
  std::vector<std::int64_t> mlp_only_layers;  ///< Qwen: always dense
  std::int64_t interleave_moe_layer_step = 1; ///< Llama-4: MoE iff (layer + 1) % step == 0
  std::vector<std::int64_t> moe_layers;       ///< explicit list (Llama-4 `moe_layers`); wins if set

  WeightNames names;
  QuantConfig quantization;  ///< present for mlx-quantized checkpoints

  /// True if decoder layer `layer` has an MoE block. Throws std::out_of_range if layer is not in
  /// [0, num_layers).
  bool is_moe_layer(std::int64_t layer) const;
  /// The decoder layers with an MoE block, ascending.
  std::vector<std::int64_t> moe_layer_indices() const;
};

/// The model_type values parse_hf_config accepts, comma separated (for messages and --help).
std::string supported_model_types();

/// Parses a Hugging Face config.json text. Reads every field the family defines; nested
/// `text_config` (Llama-4) is followed. Throws std::invalid_argument on bad JSON, an unknown
/// model_type or an unsupported topk_method / scoring_func (listing what is supported), a missing
/// or ill-typed required field (naming it), or a RouterConfig that fails validate().
MoeConfig parse_hf_config(std::string_view json_text);

/// The sizes of a block built from a family's preset (training from scratch).
struct BlockShape {
  std::int64_t hidden_size = 0;   ///< D
  std::int64_t num_experts = 0;   ///< E
  std::int64_t top_k = 0;         ///< K
  std::int64_t expert_width = 0;  ///< F
  std::int64_t shared_experts = -1;  ///< shared experts of width F; -1: the family's own default
  std::int64_t num_layers = 1;    ///< decoder layers, every one an MoE block
  /// Adds moekit's `moekit_selection_bias` field (a selection bias for loss-free balancing) to a
  /// family without one; no effect on families that have one.
  bool selection_bias = false;
};

/// A config.json text for family `model_type` (any parse_hf_config accepts) with these sizes and
/// the family's routing as a from-scratch block uses it (DeepSeek: one group, scaling factor 1;
/// every layer an MoE block). parse_hf_config reads it back to exactly these sizes. Throws
/// std::invalid_argument for an unknown family, a shared-expert count the family cannot have,
/// or sizes parse_hf_config refuses (naming the field).
std::string preset_config_json(const std::string& model_type, const BlockShape& shape);

/// Reads and parses `path` (a config.json file or a folder holding one). Throws
/// std::runtime_error if it cannot be read, else as parse_hf_config (message names the file).
MoeConfig load_hf_config(const std::string& path);

}  // namespace moekit
