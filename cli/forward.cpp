// `moekit forward`: y = MoE_L(x) for one MoE layer of a checkpoint folder, .npy in and out.
//
// All-or-nothing outputs: the layer is loaded, the input read and checked and the forward run
// before any output is touched; each output is then written beside its destination under a
// staging name (write_npy is itself atomic) and renamed into place only once all were written.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "expert_parallel.hpp"
#include "format.hpp"
#include "layer_io.hpp"
#include "moekit/moekit.hpp"

namespace moekit::cli {

namespace {

namespace fs = std::filesystem;

struct ForwardOptions {
  std::string model;
  std::int64_t layer = -1;
  std::string input, output, ids_out, weights_out;
  std::vector<std::string> router_knobs;  // KEY=VALUE
  bool pack = false;
  bool int8 = false;
  bool bf16_activations = false;
  ExpertParallelOptions ep;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

std::string fail_prefix() { return "[moekit forward] "; }

struct Output {
  std::string path;
  TensorView tensor;
  std::string staged;
};

// Writes every output under a staging name, then renames them all into place. On a failure the
// staged files are removed and no destination is touched (a rename failing halfway, which needs
// the directory to change under us, is the one case that can leave earlier outputs in place).
void write_all(std::vector<Output>& outputs) {
  const std::string suffix = ".moekit-staged-" + std::to_string(::getpid());
  auto discard = [&] {
    std::error_code ec;
    for (const Output& o : outputs)
      if (!o.staged.empty()) fs::remove(o.staged, ec);
  };
  try {
    for (Output& o : outputs) {
      o.staged = o.path + suffix;
      write_npy(o.staged, o.tensor);
    }
    for (Output& o : outputs) {
      std::error_code ec;
      fs::rename(o.staged, o.path, ec);
      if (ec)
        throw std::runtime_error(fail_prefix() + "cannot move output into place at '" + o.path +
                                 "': " + ec.message());
      o.staged.clear();
    }
  } catch (...) {
    discard();
    throw;
  }
}

void check_outputs(const ForwardOptions& opt) {
  std::vector<std::pair<std::string, const char*>> outs = {{opt.output, "--output"}};
  if (!opt.ids_out.empty()) outs.emplace_back(opt.ids_out, "--ids-out");
  if (!opt.weights_out.empty()) outs.emplace_back(opt.weights_out, "--weights-out");
  std::set<std::string> seen;
  for (const auto& [path, option] : outs) {
    check_output_path(fail_prefix(), path, option);
    if (!seen.insert(fs::absolute(path).lexically_normal().string()).second)
      throw std::invalid_argument(fail_prefix() + option + " '" + path +
                                  "' is also another output");
  }
}

MoeLayer load(const ForwardOptions& opt) {
  MoeLayer layer = load_layer_with_knobs(fail_prefix(), opt.model, opt.layer, opt.router_knobs);
  // The bf16 mode first: packing then takes its layout (AMX tiles, where the mode runs on AMX).
  if (opt.bf16_activations) layer.set_bf16_activations(true);
  if (opt.pack) layer.pack_weights();
  if (opt.int8) layer.set_int8_activations(true);
  return layer;
}

void write_results(const ForwardOptions& opt, const Tensor& y, const ForwardInfo& info) {
  std::vector<Output> outputs = {{opt.output, y.view(), {}}};
  if (!opt.ids_out.empty()) outputs.push_back({opt.ids_out, info.routing.ids.view(), {}});
  if (!opt.weights_out.empty())
    outputs.push_back({opt.weights_out, info.routing.weights.view(), {}});
  write_all(outputs);
}

void run_forward(const ForwardOptions& opt) {
  check_outputs(opt);
  apply_threads_option(opt.threads_option, opt.threads);
  const MoeLayer layer = load(opt);
  const Tensor x = read_activation(fail_prefix(), "input", opt.input, layer.config().hidden_size, opt.model, opt.layer);
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  write_results(opt, y, info);
}

#ifdef MOEKIT_HAVE_DIST
// Every rank loads the layer (mapped: a rank touches only its own experts' pages); rank 0 reads
// x and hands each rank a consecutive slice of its rows; the outputs come back to rank 0, which
// writes them. Every failure is agreed on (dist::agree), so every rank exits with 1 and rank 0
// alone prints the message.
void run_forward_expert_parallel(const MpiSession& mpi, const ForwardOptions& opt) {
  std::shared_ptr<MoeLayer> layer;
  dist::ExpertPlacement placement;
  Tensor x;
  agreed([&] {
    if (mpi.rank == 0) check_outputs(opt);
    apply_threads_option(opt.threads_option, opt.threads);
    layer = std::make_shared<MoeLayer>(load(opt));
    placement = parse_placement(fail_prefix(), opt.ep.placement, layer->config().router.num_experts, mpi.size);
    if (mpi.rank == 0)
      x = read_activation(fail_prefix(), "input", opt.input, layer->config().hidden_size, opt.model, opt.layer);
  });
  const std::int64_t D = layer->config().hidden_size, K = layer->config().router.top_k;
  const TokenSplit split(mpi, x, fail_prefix());
  const Tensor slice = split.scatter(x, D);
  const dist::ExpertParallelLayer ep(layer, placement, MPI_COMM_WORLD);
  ForwardInfo part;
  const Tensor y_part = ep.forward(slice, &part);
  const Tensor y = split.gather(y_part, D, DType::f32);
  ForwardInfo info;
  info.routing.ids = split.gather(part.routing.ids, K, DType::i32);
  info.routing.weights = split.gather(part.routing.weights, K, DType::f32);
  agreed([&] {
    if (mpi.rank == 0) write_results(opt, y, info);
  });
}
#endif

}  // namespace

void register_forward(CLI::App& app) {
  auto opt = std::make_shared<ForwardOptions>();
  auto* cmd = app.add_subcommand("forward", "Run one MoE layer of a checkpoint on an .npy input");
  cmd->add_option("--model", opt->model,
                  "Checkpoint folder (config.json + *.safetensors) or GGUF file (*.gguf; a split model from any part)")
      ->required();
  cmd->add_option("--layer", opt->layer, "Decoder layer index (must be an MoE layer)")->required();
  cmd->add_option("--input", opt->input, "X: .npy, f32 (or f16) [..., D]")->required();
  cmd->add_option("--output", opt->output, "Y: .npy, f32, X's shape")->required();
  cmd->add_option("--ids-out", opt->ids_out, "Expert ids: .npy, int32 [..., K]");
  cmd->add_option("--weights-out", opt->weights_out, "Routing weights: .npy, f32 [..., K]");
  cmd->add_option("--router", opt->router_knobs,
                  "Override a routing knob, KEY=VALUE (repeatable), e.g. mask_fill=legacy_zero to reproduce "
                  "mlx-lm; see docs/routing.md");
  cmd->add_flag("--pack", opt->pack,
                "Repack the experts into the forward kernel's packed layout first (faster prefill; the expert "
                "bytes become resident instead of read in place from the mapped file): panels, or with "
                "--bf16-activations AMX tiles (CPUs with AMX only; the same bytes out as without --pack)");
  CLI::Option* int8 =
      cmd->add_flag("--int8", opt->int8,
                    "The fast mode for MLX-quantized experts: int8 activations and integer dot products for 4- and "
                    "8-bit codes where an expert has few rows (error bound: docs/numerics.md); the router stays exact");
  cmd->add_flag("--bf16-activations", opt->bf16_activations,
                "The bf16 compute mode for bf16 checkpoints, as torch and MLX run them: the experts' input rows "
                "and intermediate rounded to bf16, bf16 x bf16 products summed in fp32 (AMX or AVX512-BF16 where "
                "the CPU has them); the router stays fp32 (docs/numerics.md)")
      ->excludes(int8);
  add_expert_parallel_options(*cmd, opt->ep,
                              "rank 0 reads the input and writes the outputs, which equal the single-process run "
                              "byte for byte");
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] {
    if (!opt->ep.enabled) return run_forward(*opt);
#ifdef MOEKIT_HAVE_DIST
    run_mpi_job("", [&](const MpiSession& mpi) { run_forward_expert_parallel(mpi, *opt); });
#else
    throw std::invalid_argument(fail_prefix() + "--expert-parallel: this moekit was built without MPI "
                                "(-DMOEKIT_WITH_MPI=OFF)");
#endif
  });
}

}  // namespace moekit::cli
