// `moekit quantize`: a float checkpoint folder -> an MLX-affine-quantized folder mlx-lm loads.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#include "format.hpp"
#include "moekit/quantize.hpp"

namespace moekit::cli {

namespace {

struct QuantizeCliOptions {
  std::string model, out, recipe, dtype, error_csv, mode = "affine";
  int bits = 4, group_size = 64, router_bits = -1, threads = 0;
  const CLI::Option* threads_option = nullptr;
  const CLI::Option *bits_option = nullptr, *group_option = nullptr;
};

void run_quantize(const QuantizeCliOptions& o) {
  apply_threads_option(o.threads_option, o.threads);
  QuantizeOptions q;
  q.mode = o.mode;
  q.bits = o.bits;
  q.group_size = o.group_size;
  // mlx_lm.convert's defaults for the mode when --bits / --group-size are not given.
  const auto [bits, group] = quantize_mode_defaults(o.mode);
  if (o.bits_option->count() == 0) q.bits = bits;
  if (o.group_option->count() == 0) q.group_size = group;
  q.router_bits = o.router_bits;
  q.recipe = o.recipe;
  q.dtype = o.dtype;
  std::ofstream csv;
  if (!o.error_csv.empty()) {  // opened first: a bad path fails before minutes of work
    csv.open(o.error_csv);
    if (!csv) throw std::runtime_error("cannot write --error file " + o.error_csv);
  }
  const QuantizeReport r = quantize_checkpoint(o.model, o.out, q);
  double worst = 0;
  std::string worst_name;
  for (const QuantizedTensorReport& t : r.quantized) {
    const double rel = t.rms_weight > 0 ? t.rms_error / t.rms_weight : 0;
    if (rel >= worst) {
      worst = rel;
      worst_name = t.name;
    }
  }
  std::printf("moekit quantize: %s -> %s (%s)\n", o.model.c_str(), o.out.c_str(), r.model_type.c_str());
  std::printf("  %zu tensors quantized, %lld kept float, %lld dropped as mlx-lm does; %lld shard(s)\n",
              r.quantized.size(), static_cast<long long>(r.tensors_kept_float),
              static_cast<long long>(r.tensors_dropped), static_cast<long long>(r.shards));
  std::printf("  tensor bytes %.1f MB -> %.1f MB (%.2fx smaller)\n", r.bytes_in / 1e6, r.bytes_out / 1e6,
              r.bytes_out > 0 ? static_cast<double>(r.bytes_in) / static_cast<double>(r.bytes_out) : 0.0);
  if (!r.quantized.empty())
    std::printf("  largest relative RMS error %.3g in %s\n", worst, worst_name.c_str());
  if (csv.is_open()) {
    csv << "tensor,shape,bits,group_size,max_abs_error,rms_error,rms_weight,relative_rms_error\n";
    for (const QuantizedTensorReport& t : r.quantized) {
      std::string shape;
      for (std::size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(t.shape[i]);
      char line[256];
      std::snprintf(line, sizeof line, ",%s,%d,%d,%.9g,%.9g,%.9g,%.9g\n", shape.c_str(), t.bits, t.group_size,
                    t.max_abs_error, t.rms_error, t.rms_weight, t.rms_weight > 0 ? t.rms_error / t.rms_weight : 0.0);
      csv << t.name << line;
    }
    if (!csv) throw std::runtime_error("cannot write --error file " + o.error_csv);
  }
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeCliOptions>();
  auto* cmd = app.add_subcommand(
      "quantize", "Write an MLX-quantized copy of a float checkpoint that mlx-lm loads (as mlx_lm.convert -q)");
  cmd->add_option("--model", o->model, "Float checkpoint folder (config.json + *.safetensors)")->required();
  cmd->add_option("--out", o->out, "Output folder (must not exist, or be empty)")->required();
  cmd->add_option("--q-mode", o->mode,
                  "mlx's quantization mode: affine, or mxfp4, nvfp4, mxfp8 (as mlx_lm.convert --q-mode)")
      ->capture_default_str();
  o->bits_option = cmd->add_option("--bits", o->bits, "Bits per weight: 2, 3, 4, 5, 6 or 8 (fp modes: the mode's)")
                       ->capture_default_str();
  o->group_option = cmd->add_option("--group-size", o->group_size,
                                    "Weights per scale/bias group: 32, 64 or 128 (fp modes: the mode's)")
                        ->capture_default_str();
  cmd->add_option("--router-bits", o->router_bits,
                  "Bits of the MoE routers (0 = keep them float); default: mlx-lm's rule for the family "
                  "(Qwen3-MoE and MiniMax routers at 8 bits group 64)");
  cmd->add_option("--recipe", o->recipe, "mlx-lm's mixed recipe: " + quantize_recipes());
  cmd->add_option("--dtype", o->dtype,
                  "float16, bfloat16 or float32 for the unquantized tensors and the scales/biases "
                  "(default: config.json's torch_dtype)");
  cmd->add_option("--error", o->error_csv, "Write each quantized tensor's quantization error to this CSV");
  o->threads_option = add_threads_option(*cmd, o->threads);
  cmd->callback([o] { run_quantize(*o); });
}

}  // namespace moekit::cli
