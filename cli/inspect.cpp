// `moekit inspect`: prints inspect_report (model.hpp) for a checkpoint folder.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/moekit.hpp"

namespace moekit::cli {

namespace {

struct InspectOptions {
  std::string model;
  std::int64_t layer = -1;
};

// What `moekit generate` would run: the decoder around the MoE blocks, or why the file does not run
// whole.
std::string whole_model_report(const std::string& path) {
  std::ostringstream out;
  out << "\nwhole model: ";
  try {
    const std::shared_ptr<CausalLm> lm = CausalLm::open(path);
    const LmInfo& i = lm->info();
    out << i.arch << ", " << i.num_layers << " decoder layers (MoE " << compact_ranges(i.moe_layers) << ")";
    if (!i.mtp_layers.empty())
      out << "; MTP / next-n layers " << compact_ranges(i.mtp_layers) << " in the file, skipped";
    out << "\n  attention: " << i.num_heads << " heads, " << i.attention << "\n  rope: " << i.rope
        << "\n  KV cache: " << i.cache_bytes_per_token << " bytes per token (f32), context " << i.ctx << " of "
        << i.train_ctx << "\n  compute mode: " << compute_mode_name(*lm->options().mode)
        << "\n  tokenizer: " << i.tokenizer << "\n";
  } catch (const std::exception& e) {
    out << "not run whole: " << e.what() << "\n";
  }
  return out.str();
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Print what moekit reads from a checkpoint folder");
  cmd->add_option("--model", opt->model,
                  "Checkpoint folder (config.json + *.safetensors) or GGUF file (*.gguf; a split model from any part)")
      ->required();
  cmd->add_option("--layer", opt->layer, "MoE layer to load (default: the first MoE layer)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([opt] {
    std::cout << inspect_report(opt->model, opt->layer);
    std::cout << whole_model_report(opt->model) << std::flush;
  });
}

}  // namespace moekit::cli
