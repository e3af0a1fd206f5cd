// quantize_checkpoint: float checkpoint folder -> mlx-lm's quantized folder layout. The options
// and folders are checked here; quantize_plan.cpp decides what every output tensor is and
// quantize_write.cpp produces and writes them (quantize_plan.hpp).
#include "moekit/quantize.hpp"

#include <filesystem>
#include <set>
#include <stdexcept>

#include "io/quantize_plan.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

namespace fs = std::filesystem;
using detail::quantize_bad;

void validate_options(const QuantizeOptions& opt) {
  const std::set<int> kBits = {2, 3, 4, 5, 6, 8};
  if (opt.mode != "affine") {
    if (!detail::fp_mode_named(opt.mode))
      quantize_bad("mode '" + opt.mode + "' unsupported (affine, mxfp4, nvfp4 or mxfp8)");
    // Plain names, not a structured binding: clang 14 cannot capture a binding in MOEKIT_MSG's lambda.
    const auto defaults = quantize_mode_defaults(opt.mode);
    const int bits = defaults.first, group = defaults.second;
    if (opt.bits != bits || opt.group_size != group)
      quantize_bad(MOEKIT_MSG("mode " << opt.mode << " is " << bits << " bits in groups of " << group << ", got bits "
                                      << opt.bits << " and group size " << opt.group_size));
    if (!opt.recipe.empty())
      quantize_bad("mixed recipes are affine only (as mlx_lm.convert's): drop --recipe or --q-mode");
    if (opt.router_bits > 0 && group == 16)
      quantize_bad("--router-bits quantizes the routers affine in groups of the mode's 16, which affine does not take");
  } else {
    if (!kBits.count(opt.bits)) quantize_bad(MOEKIT_MSG("bits " << opt.bits << " unsupported (2, 3, 4, 5, 6 or 8)"));
    if (opt.group_size != 32 && opt.group_size != 64 && opt.group_size != 128)
      quantize_bad(MOEKIT_MSG("group size " << opt.group_size << " unsupported (32, 64 or 128)"));
  }
  if (opt.router_bits != -1 && opt.router_bits != 0 && !kBits.count(opt.router_bits))
    quantize_bad(MOEKIT_MSG("router bits " << opt.router_bits
                                           << " unsupported (0 = float, 2, 3, 4, 5, 6 or 8)"));
  if (!opt.recipe.empty()) {
    if (!detail::quantize_recipe_table().count(opt.recipe))
      quantize_bad("unknown recipe '" + opt.recipe + "' (recipes: " + quantize_recipes() + ")");
    if (opt.router_bits != -1)
      quantize_bad("--router-bits and a recipe both decide the router's bits: give one");
  }
  if (!opt.dtype.empty() && !detail::float_dtype_named(opt.dtype))
    quantize_bad("dtype '" + opt.dtype + "' unsupported (float16, bfloat16 or float32)");
  if (opt.max_shard_bytes <= 0) quantize_bad("the shard size limit must be positive");
  if (opt.slab_values <= 0) quantize_bad("the slab size must be positive");
}

}  // namespace

std::pair<int, int> quantize_mode_defaults(const std::string& mode) {
  if (mode == "mxfp4") return {4, 32};
  if (mode == "nvfp4") return {4, 16};
  if (mode == "mxfp8") return {8, 32};
  return {4, 64};
}

std::string quantize_recipes() {
  std::string out;
  for (const auto& [k, v] : detail::quantize_recipe_table()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

QuantizeReport quantize_checkpoint(const std::string& model_dir, const std::string& out_dir,
                                   const QuantizeOptions& opt) {
  validate_options(opt);
  const fs::path src(model_dir), dst(out_dir);
  std::error_code ec;
  if (!fs::is_directory(src, ec)) quantize_bad(model_dir + " is not a folder");
  if (fs::exists(dst, ec) && !(fs::is_directory(dst, ec) && fs::is_empty(dst, ec)))
    quantize_bad(out_dir +
                 " already exists and is not an empty folder; moekit quantize never overwrites");

  const detail::QuantizePlan plan = detail::plan_quantize(src, opt);
  QuantizeReport report;
  report.model_type = plan.model_type;
  report.tensors_dropped = plan.tensors_dropped;

  // Built under <out_dir>.partial and renamed at the end, so a failure leaves nothing behind.
  const fs::path tmp = fs::path(out_dir + ".partial");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    throw std::runtime_error("[moekit::quantize_checkpoint] cannot create " + tmp.string() + ": " +
                             ec.message());
  try {
    detail::write_quantized(plan, opt, src, tmp, report);
    fs::remove(dst, ec);  // an empty folder, checked above
    fs::rename(tmp, dst);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return report;
}

}  // namespace moekit
