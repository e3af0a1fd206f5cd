// Loading MoE layers from Hugging Face / mlx-lm checkpoint folders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moekit/config.hpp"
#include "moekit/layer.hpp"
#include "moekit/safetensors.hpp"

namespace moekit {

/// Loads the MoE block of decoder layer `layer` from `path` (a folder with config.json and
/// model.safetensors, sharded model-*.safetensors + model.safetensors.index.json, or *.safetensors).
///
/// Expert layouts recognised (SEMANTICS.md §3), tried in this order:
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

/// As load_moe_layer with an already-parsed config (e.g. after overriding router knobs).
MoeLayer load_moe_layer(const std::string& path, const MoeConfig& config, std::int64_t layer);

/// As load_moe_layer on an already-opened checkpoint (in-memory images, fuzzing).
MoeLayer load_moe_layer(std::shared_ptr<const Checkpoint> checkpoint, const MoeConfig& config, std::int64_t layer);

}  // namespace moekit
