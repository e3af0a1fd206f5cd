// moekit quantize: a float checkpoint folder -> an MLX-quantized folder (affine, or the mxfp4 /
// nvfp4 / mxfp8 modes) that mlx-lm's own `load` reads, laid out as `mlx_lm.convert --quantize`
// writes it (docs/formats.md, "Writing").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

struct QuantizeOptions {
  /// mlx's quantization mode: "affine" (codes, scales and biases), or the floating-point modes
  /// "mxfp4" (bits 4, group 32), "nvfp4" (bits 4, group 16), "mxfp8" (bits 8, group 32): codes
  /// and uint8 scales, as `mlx_lm.convert -q --q-mode M` writes them (bits and group_size must
  /// then be the mode's).
  std::string mode = "affine";
  int bits = 4;         ///< 2, 3, 4, 5, 6 or 8
  int group_size = 64;  ///< 32, 64 or 128
  /// The MoE routers' bits: -1 keeps mlx-lm's rule for the family (Qwen3-MoE and MiniMax
  /// routers at 8 bits group 64, others at `bits`); 0 leaves the routers in float; else this
  /// many bits at `group_size`.
  int router_bits = -1;
  /// mlx-lm's mixed recipes: "" (none), "mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6".
  std::string recipe;
  /// Float dtype of everything not quantized and of the scales/biases: "" = config.json's
  /// torch_dtype (as mlx_lm.convert), else "float16", "bfloat16" or "float32".
  std::string dtype;
  std::int64_t max_shard_bytes = std::int64_t{5} << 30;  ///< mlx-lm's 5 GiB
  /// Float values read from the source at a time (whole experts / heads / rows; at least one):
  /// bounds the memory beside the packed output tensor.
  std::int64_t slab_values = std::int64_t{64} << 20;
};

/// Quantization error of one quantized tensor, against the float values it was made from.
struct QuantizedTensorReport {
  std::string name;  ///< the module's `.weight`
  Shape shape;       ///< the float shape [..., out, in]
  int bits = 0, group_size = 0;
  double max_abs_error = 0, rms_error = 0, rms_weight = 0;
};

struct QuantizeReport {
  std::string model_type;
  std::vector<QuantizedTensorReport> quantized;
  std::int64_t tensors_written = 0, tensors_kept_float = 0, tensors_dropped = 0, shards = 0;
  std::int64_t bytes_in = 0, bytes_out = 0;  ///< tensor bytes read / written
};

/// The bits and group size of mlx's quantization `mode` (mlx_lm's defaults: affine 4 / 64,
/// mxfp4 4 / 32, nvfp4 4 / 16, mxfp8 8 / 32); affine's for a name that is none of them.
std::pair<int, int> quantize_mode_defaults(const std::string& mode);

/// The mixed recipes QuantizeOptions::recipe accepts, comma separated.
std::string quantize_recipes();

/// Writes `out_dir` (which must not exist or be empty) from the float checkpoint `model_dir`.
/// Every Linear/Embedding weight whose input dimension divides by the group size is quantized
/// (mlx-lm's rule), per-expert tensors are stacked into `switch_mlp` as mlx-lm's sanitize does,
/// config.json gains `quantization` and `quantization_config`, tokenizer and generation files
/// are copied. The folder is built under `<out_dir>.partial` and renamed at the end, so a failure
/// leaves nothing behind. Families: qwen3_moe, qwen2_moe, mixtral, olmoe, deepseek_v2, glm4_moe,
/// deepseek_v3 (and kimi_k2), gpt_oss, minimax (and minimax_m2), as src/io/family.hpp lists them;
/// others throw std::invalid_argument naming what is missing and the families written. Throws
/// std::invalid_argument for bad options, an already-quantized or FP8 checkpoint, a missing or
/// mis-shaped expert tensor, a non-finite weight (naming tensor and row); std::runtime_error for
/// I/O failures; plus what load_hf_config and Checkpoint::open throw.
QuantizeReport quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                                   const QuantizeOptions& options);

}  // namespace moekit
