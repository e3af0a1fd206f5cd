// Loading MoE layers from Hugging Face / mlx-lm checkpoint folders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moekit/config.hpp"
#include "moekit/gguf.hpp"
#include "moekit/layer.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/train.hpp"

namespace moekit {

/// Loads the MoE block of decoder layer `layer` from `path` (a folder with config.json and
/// model.safetensors, sharded model-*.safetensors + model.safetensors.index.json, or *.safetensors;
/// or a GGUF file, read as the GGUF overload below reads it).
///
/// Expert layouts recognised (docs/routing.md, "Checkpoint names"), tried in this order:
///  - "switch_mlp":   `<block>.switch_mlp.{gate,up,down}_proj.weight` stacked [E, out, in] (mlx-lm)
///  - "fused_gate_up": `<block>.experts.gate_up_proj` [E, 2F, D] (gate rows first) + `down_proj` [E, D, F]
///  - "fused_gate_up_transposed": `<block>.experts.gate_up_proj` [E, D, 2F] + `down_proj` [E, F, D]
///    (Llama-4: gate = first F columns; GPT-OSS: gate = even columns, up = odd, with
///    `gate_up_proj_bias` [E, 2F] and `down_proj_bias` [E, D])
///  - "per_expert":   `<block>.experts.{e}.{gate,up,down}` names of the family (gate_proj/up_proj/
///    down_proj, Mixtral/MiniMax w1/w3/w2) with `.weight` [F, D] / [D, F]
/// Non-transposed layouts are used in place from the mapped file (no copy) when their dtype is
/// f32/bf16/f16 and the data is aligned; transposed ones are copied once into [E, out, in].
/// Router, biases and shared experts come from the family's names (MoeConfig::names).
/// Tensors outside this block are never read.
///
/// Throws std::out_of_range if `layer` is outside [0, num_hidden_layers), std::invalid_argument
/// if that layer is dense ("layer 0 is dense: ..."), std::runtime_error naming the file and
/// tensor for a missing tensor (with the names tried) or a mis-shaped one (with the expected
/// shape), plus everything load_hf_config and Checkpoint::open throw.
MoeLayer load_moe_layer(const std::string& path, std::int64_t layer);

/// The config of the model at `path`: load_hf_config for a checkpoint folder (or its
/// config.json), gguf_config for a GGUF file (a path ending in ".gguf"; a split model from any
/// of its parts).
MoeConfig load_config(const std::string& path);

/// The MoeConfig of a GGUF model's MoE blocks, read from its metadata as llama.cpp reads it for
/// its architecture (`general.architecture`: qwen3moe, qwen2moe, deepseek2, glm4moe, gpt-oss,
/// llama with experts, llama4, olmoe, minimax-m2; docs/formats.md, "GGUF"): keys llama.cpp
/// requires are required (a missing one is named), the others defaulted as llama.cpp defaults
/// them. Throws std::runtime_error naming the file and key.
MoeConfig gguf_config(const GgufModel& model);

/// Loads the MoE block of layer `layer` of a GGUF model: `blk.L.ffn_gate_inp`, the stacked
/// `ffn_{gate,up,down}_exps` (or a fused `ffn_gate_up_exps`, gate rows first), shared experts
/// `ffn_*_shexp`, `ffn_gate_inp_shexp`, `exp_probs_b.bias` and GPT-OSS's biases, used in place
/// from the mapping (f32, f16, bf16 and the ggml block types of kernels/formats/; any other
/// type is a named error listing those). Only these tensors and the metadata are read.
MoeLayer load_moe_layer(std::shared_ptr<const GgufModel> model, const MoeConfig& config, std::int64_t layer);

/// As load_moe_layer with an already-parsed config (e.g. after overriding router knobs).
MoeLayer load_moe_layer(const std::string& path, const MoeConfig& config, std::int64_t layer);

/// As load_moe_layer on an already-opened checkpoint (in-memory images, fuzzing).
MoeLayer load_moe_layer(std::shared_ptr<const Checkpoint> checkpoint, const MoeConfig& config, std::int64_t layer);

/// A human-readable report of what moekit reads from the checkpoint folder `path`: the config
/// as moekit understands it (family, layer schedule, D/E/K/F, routing knobs, shared experts,
/// body), then MoE layer `layer` (default, -1: the first MoE layer) loaded for real: its layout,
/// mapped or copied, dtypes and shapes, expert bytes and the bytes resident once packed. Throws
/// what load_hf_config and load_moe_layer throw; nothing is returned half-built.
std::string inspect_report(const std::string& path, std::int64_t layer = -1);

/// How one block's tensors are named and laid out in a checkpoint: the block prefix and one of
/// load_moe_layer's expert layouts ("per_expert", "fused_gate_up", "fused_gate_up_transposed",
/// "fused_gate_up_transposed_interleaved", "switch_mlp" with its container).
struct StoredLayout {
  std::string block;   ///< e.g. "model.layers.3.mlp"
  std::string layout;
  std::string stacked_container = "switch_mlp";
};

/// The layout `layer` was loaded from (its MoeWeights). Throws std::invalid_argument for a layer
/// that was not loaded from a checkpoint.
StoredLayout stored_layout(const MoeLayer& layer);

/// `t` (a block's parameters, or their gradients: MoeTensors shapes) under the checkpoint's own
/// tensor names, each shaped and laid out as stored there: per-expert tensors split out, gate
/// and up fused (gate rows first) or fused transposed (Llama-4: gate columns first; GPT-OSS:
/// interleaved, with the fused bias), mlx `switch_mlp` stacks, the family's router, shared
/// expert and shared-gate names. The inverse of load_moe_layer's reading; the selection bias is
/// not among them. Sorted by name. Throws std::invalid_argument for an unknown layout or a
/// tensor of the wrong shape.
std::vector<std::pair<std::string, Tensor>> stored_tensors(const MoeConfig& config, const StoredLayout& where,
                                                           const MoeTensors& t);

}  // namespace moekit
