// Every config.json model_type moekit reads, one row each: the family whose fields it has
// (parse_hf_config's reader and preset in hf_config.cpp) and the mlx-lm model module moekit
// quantize lays it out as (the rule row in quantize_plan.cpp). An alias of a family is one more
// row; a family moekit quantize does not lay out says why in the row instead.
#pragma once

#include <cstdint>
#include <string_view>

namespace moekit::detail {

/// How a config.json is read: one reader and preset per value (hf_config.cpp's kFamilies).
enum class HfFamily : std::uint8_t {
  deepseek_v2,
  deepseek_v3,
  mixtral,
  qwen2_moe,
  qwen3_moe,
  olmoe,
  gpt_oss,
  llama4,
  minimax_m2,
};

struct ModelType {
  std::string_view name{};  ///< config.json's model_type
  HfFamily family{};
  /// The mlx_lm/models/<module>.py that loads it (mlx_lm.utils.MODEL_REMAPPING sends some model
  /// types to another family's module) and the key of moekit quantize's layout rules; empty:
  /// moekit quantize does not lay it out.
  std::string_view mlx_module{};
  /// Why moekit quantize does not lay it out (with an empty mlx_module).
  std::string_view not_written{};
};

// Shared by Llama-4's wrapper and its text model.
inline constexpr std::string_view kLlama4NotWritten =
    "mlx-lm's Llama-4 is a multimodal wrapper (language_model.*, vision tower dropped) that "
    "moekit quantize does not lay out";

/// In the order supported_model_types() lists them.
inline constexpr ModelType kModelTypes[] = {
    {.name = "deepseek_v2", .family = HfFamily::deepseek_v2, .mlx_module = "deepseek_v2"},
    {.name = "deepseek_v3", .family = HfFamily::deepseek_v3, .mlx_module = "deepseek_v3"},
    {.name = "deepseek_v32",
     .family = HfFamily::deepseek_v3,
     .not_written = "mlx-lm's deepseek_v32 layout (its attention indexer) is not laid out by moekit quantize"},
    {.name = "kimi_k2", .family = HfFamily::deepseek_v3, .mlx_module = "deepseek_v3"},
    {.name = "glm4_moe", .family = HfFamily::deepseek_v3, .mlx_module = "glm4_moe"},
    {.name = "glm4_moe_lite",
     .family = HfFamily::deepseek_v3,
     .not_written = "GLM-4.7-Flash's mlx-lm layout (glm4_moe_lite) is not laid out by moekit quantize"},
    {.name = "mixtral", .family = HfFamily::mixtral, .mlx_module = "mixtral"},
    {.name = "qwen2_moe", .family = HfFamily::qwen2_moe, .mlx_module = "qwen2_moe"},
    {.name = "qwen3_moe", .family = HfFamily::qwen3_moe, .mlx_module = "qwen3_moe"},
    {.name = "olmoe", .family = HfFamily::olmoe, .mlx_module = "olmoe"},
    {.name = "gpt_oss", .family = HfFamily::gpt_oss, .mlx_module = "gpt_oss"},
    {.name = "llama4", .family = HfFamily::llama4, .not_written = kLlama4NotWritten},
    {.name = "llama4_text", .family = HfFamily::llama4, .not_written = kLlama4NotWritten},
    {.name = "minimax_m2", .family = HfFamily::minimax_m2, .mlx_module = "minimax"},
    {.name = "minimax", .family = HfFamily::minimax_m2, .mlx_module = "minimax"},
};

/// The row of `model_type`, or nullptr.
constexpr const ModelType* find_model_type(std::string_view model_type) {
  for (const ModelType& t : kModelTypes)
    if (t.name == model_type) return &t;
  return nullptr;
}

// Every row either names the module moekit quantize writes or says why it does not.
static_assert([] {
  for (const ModelType& t : kModelTypes)
    if (t.mlx_module.empty() == t.not_written.empty()) return false;
  return true;
}());

}  // namespace moekit::detail
