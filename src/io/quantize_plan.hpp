// moekit quantize in two phases. The plan (quantize_plan.cpp) reads config.json and the tensor
// headers and decides what every output tensor is: which sources it comes from, its shape, and
// whether it is quantized (bits, group), cast, copied raw or dropped, then which shard holds it
// (sizes follow from the shapes). The write phase (quantize_write.cpp) produces the tensors one
// at a time from slabs of the source and streams them into the shards, so memory holds one
// packed tensor and a bounded float slab, never the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/quantize.hpp"
#include "moekit/quantize.hpp"
#include "moekit/safetensors.hpp"

namespace moekit::detail {

/// Throws std::invalid_argument("[moekit::quantize_checkpoint] " + what).
[[noreturn]] void quantize_bad(const std::string& what);

/// An mlx-lm mixed recipe (mlx_lm.convert.mixed_quant_predicate_builder): `high` bits for the
/// layers and modules it singles out, `low` for the rest.
struct Recipe {
  int low = 0, high = 0;
};
/// The recipes by name ("mixed_3_6", ...).
const std::map<std::string, Recipe>& quantize_recipe_table();

/// "mxfp4" / "nvfp4" / "mxfp8" as mlx spells them; nullopt for anything else ("affine" included).
std::optional<kernels::FpMode> fp_mode_named(const std::string& name);

/// float32 / bfloat16 / float16 as config.json and --dtype spell them; nullopt for anything else.
std::optional<DType> float_dtype_named(const std::string& name);

/// One module or tensor of the output: its sources (one tensor, or E per-expert tensors stacked
/// on a new leading axis), and how it is written.
struct Job {
  std::string out;                   // output tensor name (for a quantized module: "<path>.weight")
  std::vector<std::string> sources;  // source tensor names
  Shape shape;                       // output float shape (stacked shape for experts)
  std::string src_dtype;             // as the file spells it
  std::optional<DType> cast;         // float output / quantization dtype; nullopt: raw copy
  int bits = 0, group = 0;           // bits != 0: quantized
  std::optional<kernels::FpMode> fp_mode;  // quantized in an fp mode (codes + uint8 scales); else affine
  // Counted in the index's total_parameters: mlx_lm.utils.get_total_parameters counts only leaf
  // modules' parameters, so a parameter held by a module with children is left out.
  bool counted = true;
  // MLA split of DeepSeek-V3's kv_b_proj [H·(nope + v), R]: 1 = embed_q [H, R, nope]
  // (transposed), 2 = unembed_out [H, v, R].
  int mla = 0;
  std::int64_t nope = 0, vdim = 0, rank = 0;
  // GPT-OSS re-layout of a source [E, P, Q]: `pick` 0 = transpose to [E, Q, P]; 1 / 2 = the
  // even / odd columns transposed, [E, Q / 2, P]; for a bias [E, Q] (P = 1): 1 / 2 = its even /
  // odd elements.
  bool fused = false;
  int pick = 0;
  std::int64_t fp = 0, fq = 0;
};

/// One tensor of a shard and the job that produces it (an affine-quantized job produces three:
/// codes, scales, biases; an fp-mode one two: codes, scales).
struct OutTensor {
  std::size_t job;
  SafetensorsWriter::Entry entry;
};

struct QuantizePlan {
  std::string model_type;
  nlohmann::json config;  // the source's config.json
  std::shared_ptr<const Checkpoint> ck;
  std::vector<Job> jobs;                         // by output name, numbers compared as numbers
  std::vector<OutTensor> outs;                   // in file order
  std::vector<std::vector<std::size_t>> shards;  // indices into outs, one list per file
  nlohmann::json qconfig;                        // config.json's `quantization`
  std::int64_t tensors_dropped = 0;
};

/// The plan for the float checkpoint folder `src` under options `opt` (already validated).
/// Throws std::invalid_argument for an already-quantized checkpoint, a family moekit quantize
/// does not lay out, a missing or mis-shaped expert or attention tensor, --router-bits on a
/// family whose router is not a linear layer; std::runtime_error if config.json cannot be read.
QuantizePlan plan_quantize(const std::filesystem::path& src, const QuantizeOptions& opt);

/// Writes the planned folder into `tmp` (which exists and is empty): the shards, the index,
/// config.json with its `quantization`, and the side files of `src`. Fills `report`'s counts,
/// byte totals and quantization errors. Throws std::invalid_argument for a non-finite weight
/// (naming tensor and row), std::runtime_error for I/O failures.
void write_quantized(const QuantizePlan& plan, const QuantizeOptions& opt,
                     const std::filesystem::path& src, const std::filesystem::path& tmp,
                     QuantizeReport& report);

}  // namespace moekit::detail
