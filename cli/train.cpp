// `moekit train`: trains the byte-level language model of moekit/lm.hpp, whose feed-forward
// blocks are MoE blocks of any family, with loss-free balancing (or an aux loss, or none);
// progress on the terminal, metrics as CSV, plots through matplotlib, checkpoints that
// `moekit forward` / `inspect` load, bit-identical resume, Ctrl-C saves. `--compare DIR` runs the
// aux-loss-free paper's comparison (docs/training.md).
//
// Every check (flags, data, sizes, output paths, the plotting interpreter) runs before the first
// step; nothing is written before they all pass. The flags and those checks are in
// train_flags.cpp, what a run prints and writes besides checkpoints in train_output.cpp.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "expert_parallel.hpp"
#include "format.hpp"
#include "moekit/moekit.hpp"
#include "train_parts.hpp"

namespace moekit::cli::train {

namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) {
  g_interrupted = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// Runs a step that may fail on one rank only so that every rank fails with it (TrainParallel).
using Together = std::function<void(const std::function<void()>&)>;

// Collective with --expert-parallel: the owners' experts gathered to rank 0, which writes.
void save_checkpoint(const std::string& dir, const std::string& config_json, const LmTrainer& tr,
                     TrainFlags& f, const TextCorpus& corpus, const Together& together) {
  TrainingState st;
  st.step = tr.steps_done();
  st.rng_state = tr.rng_state();
  st.user_json = user_json(f, corpus);
  const LmParams params = tr.whole_params();
  const Optimizer optimizer = tr.whole_optimizer(params);
  together([&] {
    if (!tr.parallel() || tr.parallel()->rank() == 0)
      save_lm_checkpoint(dir, config_json, tr.config(), params, tr.selection_biases(), optimizer,
                         st);
  });
}

// The trainer of the run (its parallel job made first with --expert-parallel), restored from
// --resume's checkpoint.
std::unique_ptr<LmTrainer> build_trainer(const TrainFlags& f, const RunSetup& setup,
                                         const TrainParallel& par, const Together& together) {
  std::shared_ptr<LmParallel> parallel;
  together([&] {
    if (par.make) parallel = par.make(setup.config.block.router.num_experts);
  });
  std::unique_ptr<LmTrainer> trainer;
  try {
    trainer = std::make_unique<LmTrainer>(setup.config, setup.options, setup.corpus.train,
                                          setup.corpus.held_out, parallel);
  } catch (const std::invalid_argument& e) {
    // (With --expert-parallel every rank checks the same arguments, so every rank is here.)
    throw std::invalid_argument(kPrefix + e.what() +
                                " (--data: " + std::to_string(setup.corpus.bytes) + " bytes, " +
                                std::to_string(setup.corpus.train.size()) + " for training)");
  }
  together([&] {
    if (!f.resume.empty()) {
      const Optimizer like = trainer->optimizer();
      LmCheckpoint ck = load_lm_checkpoint(f.resume, like);
      trainer->restore(ck.params, ck.selection_biases, ck.optimizer, ck.state.step,
                       ck.state.rng_state);
    }
  });
  return trainer;
}

// The steps, to the end of the schedule, --stop-at or Ctrl-C: each one's metrics written and
// progress printed, checkpoints every --save-every steps. A failed step ends the run naming the
// last good checkpoint. Returns the summary of the steps (the last evaluation, the speed).
RunSummary run_steps(TrainFlags& f, const RunSetup& setup, LmTrainer& trainer, MetricsFiles& files,
                     const RunPaths& paths, bool quiet, const Together& together) {
  const bool tty = !quiet && isatty(STDOUT_FILENO);
  g_interrupted = 0;
  std::signal(SIGINT, on_sigint);
  RunSummary sum;
  std::vector<double> vb_history;
  double total_s = 0, moe_s = 0, trained_tokens = 0;
  const ProgressPrinter progress(setup.options.steps, trainer.steps_done(), tty);
  std::int64_t last_saved = -1;
  try {
    while (!trainer.done()) {
      const StepResult r = trainer.step();
      together([&] { files.write(r); });
      total_s += r.seconds;
      moe_s += r.moe_seconds;
      trained_tokens += static_cast<double>(setup.options.batch_tokens);
      vb_history.push_back(max_maxvio(r.layers));
      if (r.evaluated) sum.eval = r.eval;
      if (!quiet) progress.step(r, sum.eval, trained_tokens / std::max(total_s, 1e-9));
      if (!paths.save.empty() && f.save_every > 0 && r.step % f.save_every == 0 &&
          !trainer.done()) {
        save_checkpoint(paths.save, setup.config_json, trainer, f, setup.corpus, together);
        last_saved = r.step;
      }
      // Every rank stops at the same step (mpirun passes Ctrl-C to every rank, not at once).
      std::int64_t stop[2] = {g_interrupted ? 1 : 0, f.stop_at > 0 && r.step >= f.stop_at ? 1 : 0};
      if (trainer.parallel()) trainer.parallel()->sum(stop, 2);
      if (stop[0] > 0) g_interrupted = 1;
      if (stop[0] > 0 || stop[1] > 0) break;
    }
  } catch (const std::runtime_error& e) {
    std::signal(SIGINT, SIG_DFL);
    if (tty) std::printf("\n");
    throw std::runtime_error(std::string(e.what()) +
                             (last_saved >= 0 ? "; the last good checkpoint is '" + paths.save +
                                                    "' (step " + std::to_string(last_saved) + ")"
                                              : std::string("; no checkpoint was written")));
  }
  std::signal(SIGINT, SIG_DFL);
  if (tty) std::printf("\n");
  sum.steps = trainer.steps_done();
  sum.interrupted = g_interrupted != 0;
  sum.tokens_per_s = trained_tokens / std::max(total_s, 1e-9);
  sum.moe_share = moe_s / std::max(total_s, 1e-9);
  const std::size_t tail = std::max<std::size_t>(1, vb_history.size() / 10);
  for (std::size_t i = vb_history.size() - std::min(tail, vb_history.size()); i < vb_history.size();
       ++i)
    sum.maxvio_batch_tail += vb_history[i] / static_cast<double>(std::min(tail, vb_history.size()));
  return sum;
}

RunSummary run_training(TrainFlags f, const CLI::App* app, const RunPaths& paths,
                        const std::string& label, const std::string& plot_python, bool quiet,
                        const TrainParallel& par = {}) {
  // With --expert-parallel every rank runs all of this; rank 0 alone prints and writes, and
  // whatever may fail on one rank only runs in together(), which ends every rank with it.
  const bool rank0 = par.rank == 0;
  quiet = quiet || !rank0;
  const Together together = [&](const std::function<void()>& fn) {
    if (par.agreed)
      par.agreed(fn);
    else
      fn();
  };
  // 1. Everything checked before anything is computed or written.
  RunSetup setup;
  together([&] { setup = prepare_run(f, app, paths); });
  const std::unique_ptr<LmTrainer> trainer = build_trainer(f, setup, par, together);
  const LmConfig& config = setup.config;

  // 2. The run.
  const std::int64_t E = config.block.router.num_experts;
  std::unique_ptr<MetricsFiles> files;
  together([&] {
    if (!paths.plot_dir.empty() && rank0) fs::create_directories(paths.plot_dir);
    files = rank0 ? std::make_unique<MetricsFiles>(paths.csv, paths.load, paths.bias,
                                                   config.layers(), E, !f.resume.empty())
                  : std::make_unique<MetricsFiles>("", "", "", config.layers(), E, false);
  });
  if (!quiet) print_run_header(f, setup, *trainer, label);
  RunSummary sum = run_steps(f, setup, *trainer, *files, paths, quiet, together);
  sum.label = label;

  // 3. The last checkpoint, evaluation, summary and plots.
  if (sum.interrupted) {
    const std::string dir =
        paths.save.empty() ? std::string("moekit-train-interrupted") : paths.save;
    save_checkpoint(dir, setup.config_json, *trainer, f, setup.corpus, together);
    std::printf("interrupted at step %lld: checkpoint saved to '%s' (continue with --resume %s)\n",
                static_cast<long long>(sum.steps), dir.c_str(), dir.c_str());
  } else if (!paths.save.empty()) {
    save_checkpoint(paths.save, setup.config_json, *trainer, f, setup.corpus, together);
  }
  if (sum.eval.tokens == 0) sum.eval = trainer->evaluate();
  if (!quiet) print_run_summary(sum, paths);
  if (!paths.plot_dir.empty() && rank0) {
    std::string args = "run --csv " + quote(paths.csv) + " --load " + quote(paths.load) +
                       " --out " + quote(paths.plot_dir) + " --title " +
                       quote(label.empty() ? config.block.model_type : label);
    if (!paths.bias.empty() && config.block.router.has_selection_bias)
      args += " --bias " + quote(paths.bias);
    run_plot_script(plot_python, args + (quiet ? " >/dev/null" : ""));
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// --compare: the aux-loss-free paper's comparison

void run_compare(const TrainFlags& base, const CLI::App* app, const std::string& python) {
  struct Variant {
    std::string label, balance;
    double rate, aux;
    bool collapsed;
  };
  const std::vector<Variant> variants = {
      {"loss_free_sign_u1e-3", "loss_free_sign", 1e-3, 0, false},
      {"loss_free_prop_u1e-2", "loss_free_proportional", 1e-2, 0, false},
      {"loss_free_prop_u1e-3", "loss_free_proportional", 1e-3, 0, false},
      {"loss_free_prop_u1e-4", "loss_free_proportional", 1e-4, 0, false},
      {"aux_a1e-2", "aux", 0, 1e-2, false},
      {"aux_a1e-3", "aux", 0, 1e-3, false},
      {"none", "none", 0, 0, false},
      {"collapsed_loss_free_sign", "loss_free_sign", 1e-3, 0, true},
      {"collapsed_none", "none", 0, 0, true},
  };
  for (const char* flag : {"--balance", "--bias-rate", "--aux-coef", "--init-collapsed", "--resume",
                           "--save", "--csv", "--plot"})
    if (app->count(flag) > 0)
      throw std::invalid_argument(
          kPrefix + std::string(flag) +
          " cannot be given with --compare: the comparison sets it per run");
  fs::create_directories(base.compare);
  std::vector<RunSummary> results;
  std::string compare_args = "compare --out " +
                             quote((fs::path(base.compare) / "maxvio_batch.png").string()) +
                             " --title " + quote("MaxVio_batch by balancing method");
  std::string collapsed_args = "compare --out " +
                               quote((fs::path(base.compare) / "collapsed.png").string()) +
                               " --title " + quote("A router initialised collapsed");
  for (const Variant& v : variants) {
    TrainFlags f = base;
    f.balance = v.balance;
    if (v.rate > 0) f.bias_rate = v.rate;
    if (v.aux > 0) f.aux_coef = v.aux;
    f.init_collapsed = v.collapsed;
    f.plot = (fs::path(base.compare) / v.label).string();
    const auto t0 = std::chrono::steady_clock::now();
    std::printf("[%zu/%zu] %s ...", results.size() + 1, variants.size(), v.label.c_str());
    std::fflush(stdout);
    results.push_back(run_training(f, nullptr, paths_for(f), v.label, python, true));
    const RunSummary& r = results.back();
    const double vg = max_maxvio(r.eval.layers);
    std::printf(" eval ppl %.4f  MaxVio_global %.3f  (%.0f s)\n", r.eval.ppl, vg,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    (v.collapsed ? collapsed_args : compare_args) += " " + quote(v.label + "=" + paths_for(f).csv);
    if (v.label == "loss_free_sign_u1e-3" || v.label == "none")
      collapsed_args += " " + quote(v.label + "=" + paths_for(f).csv);
    if (r.interrupted) break;
  }
  std::ostringstream table;
  table << "| run | eval loss (nats) | eval ppl | bits/byte | MaxVio_global | MaxVio_batch (last "
           "10 % of steps) |\n"
           "|---|---|---|---|---|---|\n";
  for (const RunSummary& r : results) {
    const double vg = max_maxvio(r.eval.layers);
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %.4f | %.4f | %.4f | %.3f | %.3f |\n", r.label.c_str(),
                  r.eval.loss, r.eval.ppl, r.eval.bpb, vg, r.maxvio_batch_tail);
    table << row;
  }
  std::ofstream((fs::path(base.compare) / "compare.md").string()) << table.str();
  std::printf("\n%s\nwrote %s\n", table.str().c_str(),
              (fs::path(base.compare) / "compare.md").string().c_str());
  run_plot_script(python, compare_args);
  run_plot_script(python, collapsed_args);
  if (!results.empty() && results.back().interrupted) throw CLI::RuntimeError(130);
}

// The options of `moekit train`, in --help's order, bound to `f`.
void add_options(CLI::App& cmd, TrainFlags& f) {
  cmd.add_option("--data", f.data,
                 std::string("Text files or folders to train on (default: ") + kDefaultCorpus +
                     ", the licence texts every Debian system ships)");
  // A repeated option takes its last value (scripts append overrides to a base command line).
  cmd.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("--family", f.family, "MoE family preset: " + supported_model_types())
      ->capture_default_str();
  cmd.add_option("--layers", f.layers, "MoE blocks (each a pre-norm residual block)")
      ->capture_default_str();
  cmd.add_option("--dim", f.dim, "Model width D")->capture_default_str();
  cmd.add_option("--experts", f.experts, "Routed experts E per block")->capture_default_str();
  cmd.add_option("--top-k", f.top_k, "Experts per token K")->capture_default_str();
  cmd.add_option("--expert-width", f.expert_width, "Width F of one expert")->capture_default_str();
  cmd.add_option("--shared", f.shared, "Shared experts of width F (-1: the family's default)")
      ->capture_default_str();
  cmd.add_option("--context", f.context,
                 "Tokens the context mixing sees (the current one included)")
      ->capture_default_str();
  cmd.add_option("--steps", f.steps, "Optimizer steps (in total, when resuming)")
      ->capture_default_str();
  cmd.add_option("--batch-tokens", f.batch_tokens, "Tokens per step")->capture_default_str();
  cmd.add_option("--micro-batches", f.micro_batches,
                 "Forward/backward passes per step (gradients accumulated)")
      ->capture_default_str();
  cmd.add_option("--seq-len", f.seq_len, "Tokens per sequence (sequence-wise aux loss, batching)")
      ->capture_default_str();
  cmd.add_option("--lr", f.lr, "Peak learning rate (cosine decay to lr/10)")->capture_default_str();
  cmd.add_option("--warmup", f.warmup, "Linear warm-up steps")->capture_default_str();
  cmd.add_option("--optimizer", f.optimizer, "adamw or sgd")->capture_default_str();
  cmd.add_option("--balance", f.balance,
                 "loss_free_sign, loss_free_proportional, aux, seq_aux or none")
      ->capture_default_str();
  cmd.add_option("--bias-rate", f.bias_rate, "Bias update rate u of loss-free balancing")
      ->capture_default_str();
  cmd.add_option("--bias-freeze-step", f.bias_freeze_step,
                 "Step from which the bias stops moving (-1: never)")
      ->capture_default_str();
  cmd.add_option("--aux-coef", f.aux_coef, "Coefficient alpha of the aux / seq_aux loss")
      ->capture_default_str();
  cmd.add_option("--z-loss", f.z_loss, "Router z-loss coefficient")->capture_default_str();
  cmd.add_option("--clip", f.clip, "Global gradient-norm clip (0: none)")->capture_default_str();
  cmd.add_flag("--init-collapsed", f.init_collapsed,
               "Start every router collapsed onto its first K experts");
  cmd.add_flag("--recompute", f.recompute,
               "Recompute expert pre-activations in the backward (less memory)");
  cmd.add_option("--eval-every", f.eval_every,
                 "Evaluate on the held-out text every N steps (0: at the end)")
      ->capture_default_str();
  cmd.add_option("--eval-tokens", f.eval_tokens, "Held-out tokens per evaluation (at most)")
      ->capture_default_str();
  cmd.add_option("--csv", f.csv, "Write one row of metrics per step");
  cmd.add_option("--plot", f.plot,
                 "Folder for PNG plots (and their data: train.csv, load.csv, bias.csv)");
  cmd.add_option("--save", f.save,
                 "Checkpoint folder, written at the end (and every --save-every steps)");
  cmd.add_option("--save-every", f.save_every, "Also save every N steps (0: only at the end)")
      ->capture_default_str();
  cmd.add_option("--stop-at", f.stop_at,
                 "Stop (and --save) after this step of the --steps schedule, to resume later (0: "
                 "run to the end)")
      ->capture_default_str();
  cmd.add_option("--resume", f.resume, "Continue the run saved in this checkpoint folder");
  cmd.add_option("--compare", f.compare,
                 "Run the aux-loss-free comparison (loss-free sign/proportional, aux losses, none, "
                 "a collapsed "
                 "start) into this folder");
  cmd.add_option("--seed", f.seed, "Seed of the initialisation and the batches")
      ->capture_default_str();
  add_expert_parallel_options(
      cmd, f.ep,
      "data + expert parallel training: each rank trains on its share of every batch's "
      "sequences and holds its own routed experts (and their optimizer state); rank 0 "
      "prints and writes the files and checkpoints (the same format as one process). "
      "At one rank the run is the single-process run bit for bit; at more the losses "
      "equal it to fp32 rounding");
  f.threads_option = add_threads_option(cmd, f.threads);
}

// The flags' own checks and the plotting Python (with --expert-parallel: on every rank, inside
// the job, so that a bad flag is printed once).
std::string prepare(TrainFlags& f) {
  apply_threads_option(f.threads_option, f.threads);
  for (const auto& [name, v] :
       {std::pair{"--layers", f.layers}, std::pair{"--dim", f.dim},
        std::pair{"--experts", f.experts}, std::pair{"--top-k", f.top_k},
        std::pair{"--expert-width", f.expert_width}, std::pair{"--context", f.context}})
    if (v < 1 || v > (std::int64_t{1} << 20))
      throw std::invalid_argument(kPrefix + name + " (" + std::to_string(v) +
                                  ") must be in [1, 1048576]");
  if (f.top_k > f.experts)
    throw std::invalid_argument(kPrefix + "--top-k (" + std::to_string(f.top_k) +
                                ") exceeds --experts (" + std::to_string(f.experts) + ")");
  if (!f.compare.empty() && f.ep.enabled)
    throw std::invalid_argument(
        kPrefix +
        "--compare cannot be given with --expert-parallel (run the variants "
        "one by one)");
  const bool plots = !f.plot.empty() || !f.compare.empty();
  return plots ? find_plot_python() : std::string();
}

// The command: one run, the comparison, or (--expert-parallel) one rank's part of a run.
void run_command(TrainFlags& f, CLI::App& cmd) {
  if (!f.ep.enabled) {
    const std::string python = prepare(f);
    if (!f.compare.empty()) {
      run_compare(f, &cmd, python);
      return;
    }
    const RunSummary r = run_training(f, &cmd, paths_for(f), "", python, false);
    if (r.interrupted) throw CLI::RuntimeError(130);
    return;
  }
#ifdef MOEKIT_HAVE_DIST
  bool interrupted = false;
  run_mpi_job("", [&](const MpiSession& mpi) {
    std::string python;
    agreed([&] { python = prepare(f); });
    TrainParallel par;
    par.rank = mpi.rank;
    par.agreed = agreed;
    par.make = [&](std::int64_t experts) -> std::shared_ptr<LmParallel> {
      return std::make_shared<dist::MpiLmParallel>(
          parse_placement(kPrefix, f.ep.placement, experts, mpi.size), MPI_COMM_WORLD);
    };
    try {
      interrupted = run_training(f, &cmd, paths_for(f), "", python, false, par).interrupted;
    } catch (const dist::RankError&) {
      throw;
    } catch (const std::exception& e) {
      // Every failure reaches every rank together (agreed steps; a step's failure names the
      // rank it began on), so every rank is here: rank 0 prints it once.
      end_failed_job(mpi, e.what());
    }
  });
  if (interrupted) throw CLI::RuntimeError(130);
#else
  throw std::invalid_argument(kPrefix +
                              "--expert-parallel: this moekit was built without MPI "
                              "(-DMOEKIT_WITH_MPI=OFF)");
#endif
}

// `moekit train` and its options (register_train).
void add_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a byte-level language model whose feed-forward blocks "
                                     "are MoE blocks, with loss-free balancing");
  add_options(*cmd, *f);
  cmd->callback([f, cmd] { run_command(*f, *cmd); });
}

}  // namespace

}  // namespace moekit::cli::train

namespace moekit::cli {

void register_train(CLI::App& app) { train::add_command(app); }

}  // namespace moekit::cli
