// The parts of `moekit train` (train.cpp runs them): its flags and every check made before a run
// starts (train_flags.cpp), and what a run prints and writes besides checkpoints
// (train_output.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expert_parallel.hpp"
#include "moekit/moekit.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace moekit::cli::train {

inline const std::string kPrefix = "[moekit train] ";

// ---------------------------------------------------------------------------------------------
// Flags (train_flags.cpp)

struct TrainFlags {
  // The model (from the checkpoint when resuming).
  std::string family = "deepseek_v3";
  std::int64_t layers = 2, dim = 128, experts = 16, top_k = 4, expert_width = 64, shared = -1,
               context = 8;
  // The run.
  std::vector<std::string> data;
  std::int64_t steps = 600, batch_tokens = 4096, micro_batches = 1, seq_len = 256;
  double lr = 3e-3;
  std::int64_t warmup = 30;
  std::string optimizer = "adamw";
  std::string balance = "loss_free_sign";
  double bias_rate = 1e-3;
  std::int64_t bias_freeze_step = -1;
  double aux_coef = 1e-3, z_loss = 0, clip = 1.0;
  bool init_collapsed = false, recompute = false;
  std::int64_t eval_every = 50, eval_tokens = 16384, save_every = 0, stop_at = 0;
  std::uint64_t seed = 1;
  // Outputs (never restored from a checkpoint).
  std::string csv, plot, save, resume, compare;
  int threads = 0;
  CLI::Option* threads_option = nullptr;
  ExpertParallelOptions ep;
};

// What run_training needs from `--expert-parallel` (all empty in one process): this rank, a way
// to run a step that every rank fails together (rank 0's file writes, a checkpoint one rank
// cannot read), and the trainer's parallel job for a model of E routed experts.
struct TrainParallel {
  int rank = 0;
  std::function<void(const std::function<void()>&)> agreed;
  std::function<std::shared_ptr<LmParallel>(std::int64_t experts)> make;
};

// A flag saved in the checkpoint and restored on --resume unless given again.
struct Saved {
  std::string flag;
  std::function<nlohmann::json()> get;
  std::function<void(const nlohmann::json&)> set;
};
std::vector<Saved> saved_flags(TrainFlags& f);

// The flags as LmTrainOptions, validated (errors prefixed with kPrefix).
LmTrainOptions train_options(const TrainFlags& f);
// Whether --balance is one of the loss-free modes.
bool loss_free(const std::string& balance);
// The JSON a checkpoint keeps of its run: the saved flags and the data read.
std::string user_json(TrainFlags& f, const TextCorpus& corpus);

// Where a run writes its metrics and checkpoint (empty: not written).
struct RunPaths {
  std::string csv, load, bias, plot_dir, save;
};
RunPaths paths_for(const TrainFlags& f);

// What a run starts from once every check has passed.
struct RunSetup {
  std::string config_json;  // the checkpoint's config.json (lm_config_json)
  LmConfig config;
  LmTrainOptions options;
  TextCorpus corpus;
};
// Checks the flags, the data and the output paths, and reads --resume's config.json (restoring
// the saved flags that `app` was not given into `f`); nothing is written. Throws
// std::invalid_argument prefixed with kPrefix.
RunSetup prepare_run(TrainFlags& f, const CLI::App* app, const RunPaths& paths);

// ---------------------------------------------------------------------------------------------
// Output (train_output.cpp)

// `s` quoted for the shell.
std::string quote(const std::string& s);
// The first interpreter that imports matplotlib: $MOEKIT_PYTHON, /usr/bin/python3, python3.
// Throws std::invalid_argument saying how to get one.
std::string find_plot_python();
// Runs the plot script (tools/plot_train.py, compiled in) with `args`; std::runtime_error if it
// fails.
void run_plot_script(const std::string& python, const std::string& args);
// `v` in 7 significant digits ("nan", "inf", "-inf" when not finite).
std::string num(double v);
// The max over layers of their MaxVio (MaxVio_batch of a step, MaxVio_global of an evaluation).
double max_maxvio(const std::vector<LayerLoad>& layers);

// The per-step CSV and, for plots, the per-expert load and bias files (an empty path: not
// written); appended to when resuming.
class MetricsFiles {
 public:
  MetricsFiles(const std::string& csv, const std::string& load, const std::string& bias,
               std::int64_t layers, std::int64_t experts, bool append);
  void write(const StepResult& r);
  static double tokens_per_s(const StepResult& r);

 private:
  std::int64_t L_;
  std::ofstream csv_, load_, bias_;
};

// The lines printed before the first step: the model, the data, the schedule, the parallel job
// and where the run resumed.
void print_run_header(const TrainFlags& f, const RunSetup& setup, const LmTrainer& trainer,
                      const std::string& label);

// The terminal's progress: on a terminal one bar redrawn every step, elsewhere a line every 5 % of
// the steps and at every evaluation.
class ProgressPrinter {
 public:
  ProgressPrinter(std::int64_t steps, std::int64_t first_step, bool tty);
  // After step `r`: `last_eval` the latest evaluation (tokens 0: none yet), `tokens_per_s` the
  // run's rate so far.
  void step(const StepResult& r, const EvalResult& last_eval, double tokens_per_s) const;

 private:
  std::int64_t steps_, first_step_, report_every_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// What a run ends with.
struct RunSummary {
  std::string label;
  std::int64_t steps = 0;
  EvalResult eval;               // the last evaluation
  double maxvio_batch_tail = 0;  // mean over the last 10 % of steps of the max over layers
  double tokens_per_s = 0, moe_share = 0;
  bool interrupted = false;
};

// The lines printed after the run: the held-out loss, the speed, each layer's load and where
// the checkpoint is.
void print_run_summary(const RunSummary& sum, const RunPaths& paths);

}  // namespace moekit::cli::train
