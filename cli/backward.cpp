// `moekit backward`: the gradients of L = Σ y·dy for one MoE layer of a checkpoint, written
// under the checkpoint's own tensor names and shapes (for checking against other frameworks).
//
// Nothing is written until the layer is loaded, both inputs read and checked and the backward
// run; the safetensors file is written under a temporary name and renamed into place (by rank 0
// under --expert-parallel, once every rank's part arrived).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
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

struct BackwardCliOptions {
  std::string model;
  std::int64_t layer = -1;
  std::string input, grad_output, output;
  std::vector<std::string> router_knobs;
  bool recompute = false;
  ExpertParallelOptions ep;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

const std::string kPrefix = "[moekit backward] ";

// The layer as the checkpoint stores it (its names and layout name the gradients) and the layer
// the gradients are computed on: the same layer for float weights. Quantized weights (MLX affine,
// MXFP4, FP8, int4, ...) have no gradient as codes; the gradients are those of the decoded weights,
// computed on an fp32 copy holding exactly those values (trainable_parameters), which computes the
// same forward bits (tested on every format's golden), and written under the stored modules' names.
struct BackwardLayers {
  std::shared_ptr<const MoeLayer> stored;
  std::shared_ptr<MoeLayer> compute;
};

BackwardLayers load_layers(const BackwardCliOptions& opt) {
  auto stored = std::make_shared<MoeLayer>(load_layer_with_knobs(kPrefix, opt.model, opt.layer, opt.router_knobs));
  const MoeWeights& w = stored->weights();
  const bool quantized = w.router_quantized.defined() || w.shared_gate_quantized.defined() ||
                         w.experts.up.quantized() || w.experts.down.quantized() || w.shared.down.quantized();
  if (!quantized) return {stored, stored};
  auto compute = std::make_shared<MoeLayer>(
      make_trainable_layer(stored->config(), trainable_parameters(*stored), w.selection_bias));
  return {stored, compute};
}

struct Inputs {
  Tensor x, dy;
};

Inputs read_inputs(const BackwardCliOptions& opt, std::int64_t D) {
  Inputs in{read_activation(kPrefix, "input", opt.input, D, opt.model, opt.layer),
            read_activation(kPrefix, "grad-output", opt.grad_output, D, opt.model, opt.layer)};
  if (in.dy.shape() != in.x.shape())
    throw std::invalid_argument(kPrefix + "grad-output '" + opt.grad_output + "' has shape " +
                                shape_str(in.dy.shape()) + " but input '" + opt.input + "' has " +
                                shape_str(in.x.shape()) + "; dL/dy is shaped like y, which is shaped like x");
  return in;
}

// dx and the gradients of the whole block ([E, ...] expert members) under the checkpoint's names.
void write_gradients(const BackwardCliOptions& opt, const MoeLayer& layer, const Tensor& dx, const MoeTensors& grads) {
  std::vector<std::pair<std::string, Tensor>> tensors = stored_tensors(layer.config(), stored_layout(layer), grads);
  tensors.insert(tensors.begin(), {"dx", dx});
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, "F32", t.shape(), t.nbytes()});
  SafetensorsWriter writer(opt.output, entries,
                           {{"format", "pt"},
                            {"moekit", "gradients of L = sum(y * dy) for layer " + std::to_string(opt.layer)}});
  for (const auto& [name, t] : tensors) writer.write(t.data(), t.nbytes());
  writer.commit();
}

void run_backward(const BackwardCliOptions& opt) {
  check_output_path(kPrefix, opt.output, "--output");
  apply_threads_option(opt.threads_option, opt.threads);
  const BackwardLayers layers = load_layers(opt);
  const MoeLayer& layer = *layers.compute;
  const Inputs in = read_inputs(opt, layer.config().hidden_size);
  SavedForward saved;
  layer.forward_train(in.x, saved, !opt.recompute);
  MoeTensors grads;
  const Tensor dx = backward(layer, saved, in.dy, grads);
  write_gradients(opt, *layers.stored, dx, grads);
}

#ifdef MOEKIT_HAVE_DIST
// Rank 0 gets every routed expert's gradient from its owner (dist::gather_experts); the other
// members (router, shared experts) already hold the same bits on every rank. Collective.
MoeTensors gather_expert_grads(const dist::ExpertPlacement& placement, MoeTensors grads) {
  for (Tensor MoeTensors::*member : {&MoeTensors::gate, &MoeTensors::up, &MoeTensors::down, &MoeTensors::gate_bias,
                                     &MoeTensors::up_bias, &MoeTensors::down_bias}) {
    const Tensor local = grads.*member;  // [E_r, ...]; no dimensions where the layer has no such member
    if (local.rank() == 0) continue;
    grads.*member = dist::gather_experts(MPI_COMM_WORLD, placement, local);
  }
  return grads;
}

// As forward --expert-parallel: every rank loads the layer, rank 0 reads x and dy and scatters
// the same consecutive slices of both; every rank runs forward_train + backward on its slice;
// rank 0 gathers dx and the experts' gradients and writes the file the single-process command
// writes (dx and the expert gradients the same bytes; router and shared-expert gradients summed
// over the ranks in rank order, docs/distributed.md). Failures are agreed on by every rank.
void run_backward_expert_parallel(const MpiSession& mpi, const BackwardCliOptions& opt) {
  BackwardLayers layers;
  std::shared_ptr<MoeLayer> layer;
  dist::ExpertPlacement placement;
  Inputs in;
  agreed([&] {
    if (mpi.rank == 0) check_output_path(kPrefix, opt.output, "--output");
    apply_threads_option(opt.threads_option, opt.threads);
    layers = load_layers(opt);
    layer = layers.compute;
    placement = parse_placement(kPrefix, opt.ep.placement, layer->config().router.num_experts, mpi.size);
    if (mpi.rank == 0) in = read_inputs(opt, layer->config().hidden_size);
  });
  const std::int64_t D = layer->config().hidden_size;
  const TokenSplit split(mpi, in.x, kPrefix);
  const Tensor x = split.scatter(in.x, D), dy = split.scatter(in.dy, D);
  const dist::ExpertParallelLayer ep(layer, placement, MPI_COMM_WORLD);
  dist::DistSavedForward saved;
  ep.forward_train(x, saved, !opt.recompute);
  MoeTensors grads;
  const Tensor dx = split.gather(ep.backward(saved, dy, grads), D, DType::f32);
  grads = gather_expert_grads(placement, std::move(grads));
  agreed([&] {
    if (mpi.rank == 0) write_gradients(opt, *layers.stored, dx, grads);
  });
}
#endif

}  // namespace

void register_backward(CLI::App& app) {
  auto opt = std::make_shared<BackwardCliOptions>();
  auto* cmd = app.add_subcommand(
      "backward", "Gradients of one MoE layer of a checkpoint for L = sum(y * dy), under the checkpoint's names");
  cmd->add_option("--model", opt->model,
                  "Checkpoint folder (config.json + *.safetensors) or GGUF file (*.gguf); quantized weights get the "
                  "gradient of their "
                  "decoded values")
      ->required();
  cmd->add_option("--layer", opt->layer, "Decoder layer index (must be an MoE layer)")->required();
  cmd->add_option("--input", opt->input, "X: .npy, f32 (or f16) [..., D]")->required();
  cmd->add_option("--grad-output", opt->grad_output, "dL/dy: .npy, f32 (or f16), X's shape")->required();
  cmd->add_option("--output", opt->output,
                  "G: .safetensors, f32: 'dx' [..., D] and the gradient of every tensor of the block under its "
                  "stored name and shape (no selection bias: it gets none)")
      ->required();
  cmd->add_option("--router", opt->router_knobs, "Override a routing knob, KEY=VALUE (repeatable), as for forward");
  cmd->add_flag("--recompute", opt->recompute,
                "Keep only the routing in the forward and recompute the expert pre-activations in the backward "
                "(less memory, the same gradients)");
  add_expert_parallel_options(*cmd, opt->ep,
                              "rank 0 reads the inputs and writes the file: dx and the routed experts' gradients "
                              "equal the single-process run byte for byte, the router and shared-expert gradients "
                              "(sums over the ranks' tokens) to fp32 rounding");
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] {
    if (!opt->ep.enabled) return run_backward(*opt);
#ifdef MOEKIT_HAVE_DIST
    run_mpi_job("", [&](const MpiSession& mpi) { run_backward_expert_parallel(mpi, *opt); });
#else
    throw std::invalid_argument(kPrefix + "--expert-parallel: this moekit was built without MPI "
                                "(-DMOEKIT_WITH_MPI=OFF)");
#endif
  });
}

}  // namespace moekit::cli
