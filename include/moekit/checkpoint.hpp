// Training checkpoints: a trained block saved as a checkpoint folder that load_moe_layer (and
// HF transformers / mlx-lm, by tensor name) reads, and the training state beside it.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/lm.hpp"
#include "moekit/model.hpp"
#include "moekit/train.hpp"

namespace moekit {

/// The file inside a checkpoint folder that holds the training state. It is a safetensors
/// file, named so that a folder scan for *.safetensors shards never picks it up.
inline constexpr const char* kTrainingStateFile = "training_state.moekit";

/// What a caller adds to the state: the step, its RNG state, and any JSON text of its own
/// (hyperparameters, data position), stored verbatim.
struct TrainingState {
  std::int64_t step = 0;
  std::uint64_t rng_state = 0;
  std::string user_json = "{}";
};

/// Everything one block's training carries between steps.
struct BlockTrainingState {
  const Optimizer* optimizer = nullptr;  ///< required
  const LoadBalancer* balancer = nullptr;  ///< optional
  Tensor selection_bias;                  ///< [E] f32 or empty
  TrainingState state;
};

/// Writes folder `dir`: config.json (`config_json` verbatim: the family's HF config), and
/// model.safetensors holding `params` (f32) under `where`'s names and layout plus the selection
/// bias under the family's name when the family has one; with `training` also the training state
/// (kTrainingStateFile: optimizer moments, balancer counts, the selection bias, step, RNG state,
/// user JSON). Atomic: everything is written under `<dir>.partial` first; an existing `dir` is
/// moved to `<dir>.old`, the new folder renamed into place, then `<dir>.old` removed; a crash or
/// full disk at any point leaves the last complete checkpoint under `dir` or `<dir>.old`.
/// Throws std::runtime_error naming the path on any I/O failure (the old checkpoint intact).
void save_block_checkpoint(const std::string& dir, const std::string& config_json, const MoeConfig& config,
                           const StoredLayout& where, const MoeTensors& params, const Tensor& selection_bias,
                           const BlockTrainingState* training = nullptr);

/// Reads `<dir>/training_state.moekit` into `optimizer` (its kind must match the file's),
/// `balancer` (optional; its expert count must match), `selection_bias` (filled when the file
/// has one) and `state`, validating everything before anything changes: a missing, truncated
/// or foreign file (not written by save_block_checkpoint, another format version, another
/// optimizer) is a std::runtime_error / std::invalid_argument naming the file and the reason.
void load_training_state(const std::string& dir, const MoeTensors& params, Optimizer& optimizer,
                         LoadBalancer* balancer, Tensor& selection_bias, TrainingState& state);

// ---------------------------------------------------------------------------------------------
// The language model of lm.hpp as a checkpoint folder (`moekit train --save`): every MoE block
// loads with load_moe_layer / `moekit forward` / `moekit inspect` like any checkpoint's.

/// config.json of an LM: `block_config_json` (the family's config, preset_config_json) with an
/// added "moekit_lm" object {"vocab", "context", "norm_eps", "tokenizer": "bytes"}.
std::string lm_config_json(const LmConfig& config, const std::string& block_config_json);
/// The LmConfig of such a config.json text. Throws std::invalid_argument for a config without
/// "moekit_lm" (not a moekit LM) or with bad fields (naming them), else as parse_hf_config.
LmConfig parse_lm_config(const std::string& config_json);

/// How a from-scratch block is stored: the family's HF layout (per-expert tensors; fused
/// transposed for Llama-4, fused transposed interleaved for GPT-OSS) at layer `layer`'s prefix.
StoredLayout natural_layout(const MoeConfig& config, std::int64_t layer);

/// An LM's tensors under their checkpoint names: "model.embed_tokens.weight",
/// "model.context_proj.weight", "model.layers.{l}.post_attention_layernorm.weight", every
/// block's tensors (stored_tensors, natural_layout) and selection bias under the family's names,
/// "model.norm.weight", "lm_head.weight".
std::vector<std::pair<std::string, Tensor>> lm_stored_tensors(const LmConfig& config, const LmParams& params,
                                                              const std::vector<Tensor>& selection_biases);

/// Writes folder `dir` (atomically, as save_block_checkpoint): config.json (`config_json`
/// verbatim, from lm_config_json), model.safetensors (lm_stored_tensors) and the training state
/// (optimizer moments, step, RNG state, `state.user_json`). Throws std::runtime_error naming the
/// path on an I/O failure, the previous checkpoint intact.
void save_lm_checkpoint(const std::string& dir, const std::string& config_json, const LmConfig& config,
                        const LmParams& params, const std::vector<Tensor>& selection_biases,
                        const Optimizer& optimizer, const TrainingState& state);

struct LmCheckpoint {
  LmConfig config;
  std::string config_json;
  LmParams params;
  std::vector<Tensor> selection_biases;
  Optimizer optimizer;   ///< a copy of the given one with the saved state loaded
  TrainingState state;
};

/// Reads a folder save_lm_checkpoint wrote, restoring the optimizer state into a copy of
/// `optimizer` (its kind must match). Throws std::runtime_error / std::invalid_argument naming
/// the file and what is missing, mis-shaped or foreign.
LmCheckpoint load_lm_checkpoint(const std::string& dir, const Optimizer& optimizer);

}  // namespace moekit
