// `moekit backward`: the gradients of L = Σ y·dy for one MoE layer of a checkpoint, written
// under the checkpoint's own tensor names and shapes (for checking against other frameworks).
//
// Nothing is written until the layer is loaded, both inputs read and checked and the backward
// run; the safetensors file is written under a temporary name and renamed into place.
#include <CLI/CLI.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
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
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

const std::string kPrefix = "[moekit backward] ";

void run_backward(const BackwardCliOptions& opt) {
  check_output_path(kPrefix, opt.output, "--output");
  apply_threads_option(opt.threads_option, opt.threads);
  const MoeLayer layer = load_layer_with_knobs(kPrefix, opt.model, opt.layer, opt.router_knobs);
  if (layer.weights().router_quantized.defined() || layer.weights().experts.up.quantized())
    throw std::invalid_argument(kPrefix + "layer " + std::to_string(opt.layer) + " of '" + opt.model +
                                "' is quantized: its stored tensors are codes, which have no gradient "
                                "(backward needs a float checkpoint)");
  const std::int64_t D = layer.config().hidden_size;
  const Tensor x = read_activation(kPrefix, "input", opt.input, D, opt.model, opt.layer);
  const Tensor dy = read_activation(kPrefix, "grad-output", opt.grad_output, D, opt.model, opt.layer);
  if (dy.shape() != x.shape())
    throw std::invalid_argument(kPrefix + "grad-output '" + opt.grad_output + "' has shape " + shape_str(dy.shape()) +
                                " but input '" + opt.input + "' has " + shape_str(x.shape()) +
                                "; dL/dy is shaped like y, which is shaped like x");
  SavedForward saved;
  layer.forward_train(x, saved, !opt.recompute);
  MoeTensors grads;
  const Tensor dx = backward(layer, saved, dy, grads);
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

}  // namespace

void register_backward(CLI::App& app) {
  auto opt = std::make_shared<BackwardCliOptions>();
  auto* cmd = app.add_subcommand(
      "backward", "Gradients of one MoE layer of a checkpoint for L = sum(y * dy), under the checkpoint's names");
  cmd->add_option("--model", opt->model, "Checkpoint folder (config.json + *.safetensors), float weights")->required();
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
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] { run_backward(*opt); });
}

}  // namespace moekit::cli
