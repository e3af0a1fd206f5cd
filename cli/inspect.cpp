// `moekit inspect`: prints inspect_report (model.hpp) for a checkpoint folder.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "moekit/moekit.hpp"

namespace moekit::cli {

namespace {

struct InspectOptions {
  std::string model;
  std::int64_t layer = -1;
};

}  // namespace

void register_inspect(CLI::App& app) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Print what moekit reads from a checkpoint folder");
  cmd->add_option("--model", opt->model,
                  "Checkpoint folder (config.json + *.safetensors) or GGUF file (*.gguf; a split model from any part)")
      ->required();
  cmd->add_option("--layer", opt->layer, "MoE layer to load (default: the first MoE layer)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([opt] { std::cout << inspect_report(opt->model, opt->layer) << std::flush; });
}

}  // namespace moekit::cli
