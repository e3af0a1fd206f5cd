// Subcommand registration. Each register_* adds a subcommand whose callback does the work;
// exceptions propagate to main(), which prints them as one line and exits with 1.
#pragma once

namespace CLI {
class App;
}

#include <stdexcept>
#include <string>

namespace moekit::cli {

/// `message` with its newlines as spaces: errors print as one line on stderr.
inline std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

/// An error another process already reported (the non-zero ranks of an MPI job, where rank 0
/// prints the one message): main() exits with 1 without printing it.
class ReportedElsewhere : public std::runtime_error {
 public:
  explicit ReportedElsewhere(const std::string& what) : std::runtime_error(what) {}
};

/// `moekit backward`: gradients of one MoE layer of a checkpoint, under its tensor names.
void register_backward(CLI::App& app);
/// `moekit bench`: a llama-bench-like table (shapes x dtypes x tokens x threads) against the
/// machine's limits measured in the same run.
void register_bench(CLI::App& app);
/// `moekit demo`: one DeepSeek-V3-shaped MoE layer on random weights, timed (or, with
/// --routing-only, the routing of every family preset).
void register_demo(CLI::App& app);
/// `moekit forward`: runs one MoE layer of a checkpoint on an .npy input.
void register_forward(CLI::App& app);
/// `moekit generate`: a whole model continues a prompt.
void register_generate(CLI::App& app);
/// `moekit serve`: runs the OpenAI-compatible server (python -m moekit.serve).
void register_serve(CLI::App& app);
/// `moekit chat-template`: prints a conversation rendered by a model's template (python -m moekit.chat).
void register_chat_template(CLI::App& app);
/// `moekit inspect`: what moekit reads from a checkpoint folder.
void register_inspect(CLI::App& app);
/// `moekit tokenize`: text to a model's token ids, or ids to text, with the model's tokenizer.
void register_tokenize(CLI::App& app);
/// `moekit train`: trains a byte-level language model with MoE blocks (loss-free balancing).
void register_train(CLI::App& app);
/// `moekit quantize`: an MLX-affine-quantized copy of a float checkpoint, as mlx_lm.convert writes.
void register_quantize(CLI::App& app);

}  // namespace moekit::cli
