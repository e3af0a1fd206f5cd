// `moekit train`: trains the byte-level language model of moekit/lm.hpp, whose feed-forward
// blocks are MoE blocks of any family, with loss-free balancing (or an aux loss, or none);
// progress on the terminal, metrics as CSV, plots through matplotlib, checkpoints that
// `moekit forward` / `inspect` load, bit-identical resume, Ctrl-C saves. `--compare DIR` runs the
// aux-loss-free paper's comparison (docs/training.md).
//
// Every check (flags, data, sizes, output paths, the plotting interpreter) runs before the first
// step; nothing is written before they all pass.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "expert_parallel.hpp"
#include "format.hpp"
#include "moekit/moekit.hpp"
#include "plot_script.hpp"

namespace moekit::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPrefix = "[moekit train] ";

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) {
  g_interrupted = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// ---------------------------------------------------------------------------------------------
// Options

struct TrainFlags {
  // The model (from the checkpoint when resuming).
  std::string family = "deepseek_v3";
  std::int64_t layers = 2, dim = 128, experts = 16, top_k = 4, expert_width = 64, shared = -1, context = 8;
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
  std::function<json()> get;
  std::function<void(const json&)> set;
};

template <class T>
void bind_flag(std::vector<Saved>& out, const std::string& flag, T& var) {
  out.push_back({flag, [&var] { return json(var); }, [&var](const json& j) { var = j.get<T>(); }});
}

std::vector<Saved> saved_flags(TrainFlags& f) {
  std::vector<Saved> s;
  bind_flag(s, "data", f.data);
  bind_flag(s, "steps", f.steps);
  bind_flag(s, "batch-tokens", f.batch_tokens);
  bind_flag(s, "micro-batches", f.micro_batches);
  bind_flag(s, "seq-len", f.seq_len);
  bind_flag(s, "lr", f.lr);
  bind_flag(s, "warmup", f.warmup);
  bind_flag(s, "optimizer", f.optimizer);
  bind_flag(s, "balance", f.balance);
  bind_flag(s, "bias-rate", f.bias_rate);
  bind_flag(s, "bias-freeze-step", f.bias_freeze_step);
  bind_flag(s, "aux-coef", f.aux_coef);
  bind_flag(s, "z-loss", f.z_loss);
  bind_flag(s, "clip", f.clip);
  bind_flag(s, "init-collapsed", f.init_collapsed);
  bind_flag(s, "recompute", f.recompute);
  bind_flag(s, "eval-every", f.eval_every);
  bind_flag(s, "eval-tokens", f.eval_tokens);
  bind_flag(s, "save-every", f.save_every);
  bind_flag(s, "seed", f.seed);
  return s;
}

const char* const kModelFlags[] = {"--family", "--layers", "--dim", "--experts", "--top-k", "--expert-width",
                                   "--shared", "--context"};

LmTrainOptions train_options(const TrainFlags& f) {
  LmTrainOptions o;
  o.steps = f.steps;
  o.batch_tokens = f.batch_tokens;
  o.seq_len = f.seq_len;
  o.micro_batches = f.micro_batches;
  o.lr.lr = f.lr;
  o.lr.warmup = f.warmup;
  o.lr.total_steps = f.steps;
  o.lr.min_lr = f.lr / 10;
  o.lr.decay = f.steps > f.warmup ? LrSchedule::Decay::cosine : LrSchedule::Decay::constant;
  if (f.optimizer == "adamw") {
    o.optimizer = Optimizer::Kind::adamw;
  } else if (f.optimizer == "sgd") {
    o.optimizer = Optimizer::Kind::sgd;
  } else {
    throw std::invalid_argument(kPrefix + "--optimizer '" + f.optimizer + "' is not one of adamw, sgd");
  }
  try {
    o.balance = parse_balance_mode(f.balance);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + "--balance: " + e.what());
  }
  o.bias_rate.rate = f.bias_rate;
  o.bias_rate.freeze_step = f.bias_freeze_step;
  o.aux_coef = f.aux_coef;
  o.z_coef = f.z_loss;
  o.clip = f.clip;
  o.init_collapsed = f.init_collapsed;
  o.keep_pre_activations = !f.recompute;
  o.eval_every = f.eval_every;
  o.eval_tokens = f.eval_tokens;
  o.seed = f.seed;
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + e.what());
  }
  return o;
}

bool loss_free(const std::string& balance) { return balance.rfind("loss_free", 0) == 0; }

// The block's config.json for the model flags (a selection bias added for loss-free balancing).
std::string block_json(const TrainFlags& f) {
  BlockShape s;
  s.hidden_size = f.dim;
  s.num_experts = f.experts;
  s.top_k = f.top_k;
  s.expert_width = f.expert_width;
  s.shared_experts = f.shared;
  s.num_layers = f.layers;
  s.selection_bias = loss_free(f.balance);
  try {
    return preset_config_json(f.family, s);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(kPrefix + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Output helpers

std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The first interpreter that imports matplotlib: $MOEKIT_PYTHON, /usr/bin/python3, python3.
std::string find_plot_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MOEKIT_PYTHON")) candidates.emplace_back(env);
  candidates.emplace_back("/usr/bin/python3");
  candidates.emplace_back("python3");
  for (const std::string& py : candidates)
    if (std::system((quote(py) + " -c 'import matplotlib, numpy' >/dev/null 2>&1").c_str()) == 0) return py;
  throw std::invalid_argument(kPrefix + "--plot needs python3 with matplotlib (Debian: apt-get install "
                              "python3-matplotlib; or set MOEKIT_PYTHON to an interpreter that has it)");
}

void run_plot_script(const std::string& python, const std::string& args) {
  const std::string cmd = quote(python) + " - " + args;
  std::FILE* p = popen(cmd.c_str(), "w");
  if (!p) throw std::runtime_error(kPrefix + "cannot start " + python + " for the plots");
  const std::string script = kPlotScript;
  std::fwrite(script.data(), 1, script.size(), p);
  const int status = pclose(p);
  if (status != 0) throw std::runtime_error(kPrefix + "the plot script failed (" + cmd + ")");
}

void check_parent_exists(const std::string& path, const char* option) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw std::invalid_argument(kPrefix + option + " '" + path + "': folder '" + parent.string() + "' does not exist");
  if (fs::is_directory(path, ec) && std::string(option) == "--csv")
    throw std::invalid_argument(kPrefix + "--csv '" + path + "' is a folder");
}

// A folder that is created with its missing parents when the run starts: what exists of its
// path must be folders.
void check_folder_creatable(const std::string& path, const char* option) {
  std::error_code ec;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec))
        throw std::invalid_argument(kPrefix + option + " '" + path + "': '" + p.string() + "' is not a folder");
      return;
    }
    if (p == p.parent_path()) return;
  }
}

std::string num(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  std::ostringstream s;
  s.precision(7);
  s << v;
  return s.str();
}

std::string hms(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

// The max over layers of their MaxVio (MaxVio_batch of a step, MaxVio_global of an evaluation).
double max_maxvio(const std::vector<LayerLoad>& layers) {
  double v = 0;
  for (const LayerLoad& l : layers) v = std::max(v, l.load.max_violation);
  return v;
}

// The per-step CSV and, for plots, the per-expert load and bias files.
class MetricsFiles {
 public:
  MetricsFiles(const std::string& csv, const std::string& load, const std::string& bias, std::int64_t layers,
               std::int64_t experts, bool append)
      : L_(layers) {
    const auto open = [&](std::ofstream& f, const std::string& path, const std::string& header) {
      if (path.empty()) return;
      const bool exists = fs::exists(path);
      f.open(path, append && exists ? std::ios::app : std::ios::trunc);
      if (!f) throw std::runtime_error(kPrefix + "cannot write '" + path + "'");
      if (!(append && exists)) f << header << "\n";
    };
    std::string h =
        "step,tokens,train_loss,eval_loss,eval_ppl,eval_bpb,maxvio_batch,maxvio_global,dead_experts,aux_loss,z_loss,"
        "lr,bias_rate,bias_min,bias_max,grad_norm,tokens_per_s";
    for (const char* k : {"maxvio_batch_l", "maxvio_global_l", "dead_experts_l"})
      for (std::int64_t l = 0; l < layers; ++l) {
        h += ',';
        h += k;
        h += std::to_string(l);
      }
    open(csv_, csv, h);
    std::string e = "step,layer";
    for (std::int64_t i = 0; i < experts; ++i) {
      e += ",e";
      e += std::to_string(i);
    }
    open(load_, load, e);
    open(bias_, bias, e);
  }

  void write(const StepResult& r) {
    if (csv_.is_open()) {
      const double vb = max_maxvio(r.layers), vg = r.evaluated ? max_maxvio(r.eval.layers) : 0.0;
      double bmin = 0, bmax = 0;
      std::int64_t dead = 0;
      bool has_bias = false;
      for (const LayerLoad& l : r.layers) {
        dead += l.load.dead_experts;
        for (const float b : l.bias) {
          bmin = has_bias ? std::min<double>(bmin, b) : b;
          bmax = has_bias ? std::max<double>(bmax, b) : b;
          has_bias = true;
        }
      }
      csv_ << r.step << "," << r.tokens << "," << num(r.train_loss) << ","
           << (r.evaluated ? num(r.eval.loss) : "") << "," << (r.evaluated ? num(r.eval.ppl) : "") << ","
           << (r.evaluated ? num(r.eval.bpb) : "") << "," << num(vb) << "," << (r.evaluated ? num(vg) : "") << ","
           << dead << "," << num(r.aux_loss) << "," << num(r.z_loss) << "," << num(r.lr) << "," << num(r.bias_rate)
           << "," << (has_bias ? num(bmin) : "") << "," << (has_bias ? num(bmax) : "") << "," << num(r.grad_norm)
           << "," << num(tokens_per_s(r));
      for (const LayerLoad& l : r.layers) csv_ << "," << num(l.load.max_violation);
      for (std::int64_t l = 0; l < L_; ++l)
        csv_ << "," << (r.evaluated ? num(r.eval.layers[static_cast<std::size_t>(l)].load.max_violation) : "");
      for (const LayerLoad& l : r.layers) csv_ << "," << l.load.dead_experts;
      csv_ << "\n";
      csv_.flush();
    }
    for (std::size_t l = 0; l < r.layers.size(); ++l) {
      if (load_.is_open()) {
        load_ << r.step << "," << l;
        for (const double v : r.layers[l].relative) load_ << "," << num(v);
        load_ << "\n";
      }
      if (bias_.is_open() && !r.layers[l].bias.empty()) {
        bias_ << r.step << "," << l;
        for (const float v : r.layers[l].bias) bias_ << "," << num(v);
        bias_ << "\n";
      }
    }
    load_.flush();
    bias_.flush();
  }

  static double tokens_per_s(const StepResult& r) {
    const double T = static_cast<double>(r.tokens) / static_cast<double>(r.step);
    return r.seconds > 0 ? T / r.seconds : 0.0;
  }

 private:
  std::int64_t L_;
  std::ofstream csv_, load_, bias_;
};

// ---------------------------------------------------------------------------------------------
// One run

struct RunSummary {
  std::string label;
  std::int64_t steps = 0;
  EvalResult eval;                 // the last evaluation
  double maxvio_batch_tail = 0;    // mean over the last 10 % of steps of the max over layers
  double tokens_per_s = 0, moe_share = 0;
  bool interrupted = false;
};

struct RunPaths {
  std::string csv, load, bias, plot_dir, save;
};

std::string user_json(TrainFlags& f, const TextCorpus& corpus) {
  json j;
  json opts;
  for (const Saved& s : saved_flags(f)) opts[s.flag] = s.get();
  j["flags"] = opts;
  j["data_files"] = corpus.files;
  j["data_bytes"] = corpus.bytes;
  return j.dump();
}

// Collective with --expert-parallel: the owners' experts gathered to rank 0, which writes.
void save_checkpoint(const std::string& dir, const std::string& config_json, const LmTrainer& tr,
                     TrainFlags& f, const TextCorpus& corpus,
                     const std::function<void(const std::function<void()>&)>& together) {
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

std::string load_line(const LayerLoad& l) {
  std::ostringstream s;
  s.precision(2);
  s << std::fixed;
  for (std::size_t e = 0; e < l.relative.size(); ++e) s << (e ? " " : "") << l.relative[e];
  return s.str();
}

RunSummary run_training(TrainFlags f, const CLI::App* app, const RunPaths& paths,
                        const std::string& label, const std::string& plot_python, bool quiet,
                        const TrainParallel& par = {}) {
  // With --expert-parallel every rank runs all of this; rank 0 alone prints and writes, and
  // whatever may fail on one rank only runs in together(), which ends every rank with it.
  const bool rank0 = par.rank == 0;
  quiet = quiet || !rank0;
  const auto together = [&](const std::function<void()>& fn) {
    if (par.agreed)
      par.agreed(fn);
    else
      fn();
  };
  // 1. Everything checked before anything is computed or written.
  std::string config_json;
  LmConfig config;
  LmTrainOptions options;
  TextCorpus corpus;
  together([&] {
    if (!f.resume.empty()) {
      for (const char* flag : kModelFlags)
        if (app && app->count(flag) > 0)
          throw std::invalid_argument(kPrefix + std::string(flag) +
                                      " cannot be given with --resume: the model comes "
                                      "from the checkpoint's config.json");
      std::ifstream in(fs::path(f.resume) / "config.json");
      if (!in)
        throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': no config.json there");
      const std::string text((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      const json saved_user = [&] {
        // The flags of the run that wrote the checkpoint, restored unless given again.
        const std::string state_path = (fs::path(f.resume) / kTrainingStateFile).string();
        if (!fs::exists(state_path))
          throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': no " +
                                      kTrainingStateFile + " there");
        const auto file = SafetensorsFile::open(state_path);
        const auto it = file->metadata().find("user");
        if (it == file->metadata().end() || !json::accept(it->second))
          throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': " +
                                      kTrainingStateFile + " holds no flags of moekit train");
        return json::parse(it->second);
      }();
      if (!saved_user.contains("flags") || !saved_user.at("flags").is_object())
        throw std::invalid_argument(kPrefix + "--resume '" + f.resume +
                                    "': not written by moekit train");
      for (const Saved& s : saved_flags(f))
        if ((!app || app->count("--" + s.flag) == 0) && saved_user.at("flags").contains(s.flag)) {
          try {
            s.set(saved_user.at("flags").at(s.flag));
          } catch (const json::exception&) {
            throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': saved flag --" +
                                        s.flag + " is malformed");
          }
        }
      config_json = text;
      try {
        config = parse_lm_config(text);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(kPrefix + "--resume '" + f.resume + "': " + e.what());
      }
    }
    options = train_options(f);
    if (f.resume.empty()) {
      const std::string bj = block_json(f);
      config.block = parse_hf_config(bj);
      config.vocab = 256;
      config.context = f.context;
      try {
        config.validate();
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(kPrefix + e.what());
      }
      config_json = lm_config_json(config, bj);
    }
    if (f.data.empty()) f.data = {kDefaultCorpus};
    try {
      corpus = load_text_corpus(f.data);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          kPrefix + "--data: " + e.what() +
          (f.data.size() == 1 && f.data[0] == kDefaultCorpus
               ? std::string(" (the default text; pass --data FILE_OR_FOLDER)")
               : std::string()));
    }
    if (!paths.plot_dir.empty()) check_folder_creatable(paths.plot_dir, "--plot");
    if (!paths.csv.empty() && fs::path(paths.csv).parent_path() != fs::path(paths.plot_dir))
      check_parent_exists(paths.csv, "--csv");
    if (!paths.save.empty()) check_parent_exists(paths.save, "--save");
  });
  std::shared_ptr<LmParallel> parallel;
  together([&] {
    if (par.make) parallel = par.make(config.block.router.num_experts);
  });
  std::unique_ptr<LmTrainer> trainer;
  try {
    trainer = std::make_unique<LmTrainer>(config, options, corpus.train, corpus.held_out, parallel);
  } catch (const std::invalid_argument& e) {
    // (With --expert-parallel every rank checks the same arguments, so every rank is here.)
    throw std::invalid_argument(kPrefix + e.what() + " (--data: " + std::to_string(corpus.bytes) + " bytes, " +
                                std::to_string(corpus.train.size()) + " for training)");
  }
  together([&] {
    if (!f.resume.empty()) {
      const Optimizer like = trainer->optimizer();
      LmCheckpoint ck = load_lm_checkpoint(f.resume, like);
      trainer->restore(ck.params, ck.selection_biases, ck.optimizer, ck.state.step,
                       ck.state.rng_state);
    }
  });

  // 2. The run.
  const std::int64_t E = config.block.router.num_experts;
  std::unique_ptr<MetricsFiles> files_owned;
  together([&] {
    if (!paths.plot_dir.empty() && rank0) fs::create_directories(paths.plot_dir);
    files_owned = rank0 ? std::make_unique<MetricsFiles>(paths.csv, paths.load, paths.bias,
                                                         config.layers(), E, !f.resume.empty())
                        : std::make_unique<MetricsFiles>("", "", "", config.layers(), E, false);
  });
  MetricsFiles& files = *files_owned;
  const bool tty = !quiet && isatty(STDOUT_FILENO);
  if (!quiet) {
    std::printf("moekit train%s: %s  L=%lld D=%lld E=%lld K=%lld F=%lld shared=%lld  context %lld  (%d threads)\n",
                label.empty() ? "" : (" [" + label + "]").c_str(), config.block.model_type.c_str(),
                static_cast<long long>(config.layers()), static_cast<long long>(config.dim()),
                static_cast<long long>(E), static_cast<long long>(config.block.router.top_k),
                static_cast<long long>(config.block.expert_width),
                static_cast<long long>(config.block.shared_width / std::max<std::int64_t>(1, config.block.expert_width)),
                static_cast<long long>(config.context), num_threads());
    std::printf("  data: %zu files, %lld bytes (%zu train, %zu held out)%s%s\n", corpus.files.size(),
                static_cast<long long>(corpus.bytes), corpus.train.size(), corpus.held_out.size(),
                f.data.size() == 1 && f.data[0] == kDefaultCorpus ? " from " : "",
                f.data.size() == 1 && f.data[0] == kDefaultCorpus ? kDefaultCorpus : "");
    if (!corpus.skipped.empty()) std::printf("  skipped %zu binary or empty files\n", corpus.skipped.size());
    std::printf("  %lld steps of %lld tokens (%lld micro-batches), %s lr %g, balance %s%s\n",
                static_cast<long long>(options.steps), static_cast<long long>(options.batch_tokens),
                static_cast<long long>(options.micro_batches), f.optimizer.c_str(), f.lr, f.balance.c_str(),
                loss_free(f.balance) ? (" u=" + num(f.bias_rate)).c_str()
                : (f.balance == "aux" || f.balance == "seq_aux") ? (" alpha=" + num(f.aux_coef)).c_str()
                                                                  : "");
    if (parallel)
      std::printf(
          "  expert parallel: %d ranks (rank 0 holds %lld of the %lld routed experts per block; "
          "--placement %s), %d threads per rank\n",
          parallel->size(), static_cast<long long>(trainer->local_experts().size()),
          static_cast<long long>(E), f.ep.placement.c_str(), num_threads());
    if (!f.resume.empty()) std::printf("  resumed from %s at step %lld\n", f.resume.c_str(), static_cast<long long>(trainer->steps_done()));
    std::fflush(stdout);
  }
  g_interrupted = 0;
  std::signal(SIGINT, on_sigint);
  RunSummary sum;
  sum.label = label;
  std::vector<double> vb_history;
  double total_s = 0, moe_s = 0, trained_tokens = 0;
  const auto t_run = std::chrono::steady_clock::now();
  const std::int64_t first_step = trainer->steps_done();
  const std::int64_t report_every = std::max<std::int64_t>(1, options.steps / 20);
  std::int64_t last_saved = -1;
  const std::string interrupted_dir = paths.save.empty() ? std::string("moekit-train-interrupted") : paths.save;
  try {
    while (!trainer->done()) {
      const StepResult r = trainer->step();
      together([&] { files.write(r); });
      total_s += r.seconds;
      moe_s += r.moe_seconds;
      trained_tokens += static_cast<double>(options.batch_tokens);
      const double vb = max_maxvio(r.layers);
      vb_history.push_back(vb);
      if (r.evaluated) sum.eval = r.eval;
      if (!quiet) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
        const double per_step = elapsed / static_cast<double>(r.step - first_step);
        const double eta = per_step * static_cast<double>(options.steps - r.step);
        const double tps = trained_tokens / std::max(total_s, 1e-9);
        if (tty) {
          const int width = 24;
          const int filled = static_cast<int>(width * r.step / options.steps);
          std::printf("\r[%s%s] %lld/%lld loss %.3f%s MaxVio %.2f  %.1fk tok/s  ETA %s   ",
                      std::string(static_cast<std::size_t>(filled), '#').c_str(),
                      std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                      static_cast<long long>(r.step), static_cast<long long>(options.steps), r.train_loss,
                      sum.eval.tokens > 0 ? (" eval " + num(std::round(sum.eval.loss * 1000) / 1000)).c_str() : "",
                      vb, tps / 1000, hms(eta).c_str());
          if (r.evaluated) std::printf("\n");
        } else if (r.step % report_every == 0 || r.evaluated || r.step == options.steps) {
          std::printf("step %lld/%lld  loss %.4f%s  MaxVio_batch %.3f%s  lr %.2e  %.0f tok/s  ETA %s\n",
                      static_cast<long long>(r.step), static_cast<long long>(options.steps), r.train_loss,
                      r.evaluated ? ("  eval " + num(r.eval.loss) + " (ppl " + num(r.eval.ppl) + ")").c_str() : "", vb,
                      r.evaluated ? ("  MaxVio_global " + num(max_maxvio(r.eval.layers))).c_str() : "",
                      r.lr, tps, hms(eta).c_str());
        }
        std::fflush(stdout);
      }
      if (!paths.save.empty() && f.save_every > 0 && r.step % f.save_every == 0 && !trainer->done()) {
        save_checkpoint(paths.save, config_json, *trainer, f, corpus, together);
        last_saved = r.step;
      }
      // Every rank stops at the same step (mpirun passes Ctrl-C to every rank, not at once).
      std::int64_t stop[2] = {g_interrupted ? 1 : 0, f.stop_at > 0 && r.step >= f.stop_at ? 1 : 0};
      if (parallel) parallel->sum(stop, 2);
      if (stop[0] > 0) g_interrupted = 1;
      if (stop[0] > 0 || stop[1] > 0) break;
    }
  } catch (const std::runtime_error& e) {
    std::signal(SIGINT, SIG_DFL);
    if (tty) std::printf("\n");
    throw std::runtime_error(std::string(e.what()) +
                             (last_saved >= 0 ? "; the last good checkpoint is '" + paths.save + "' (step " +
                                                    std::to_string(last_saved) + ")"
                                              : std::string("; no checkpoint was written")));
  }
  std::signal(SIGINT, SIG_DFL);
  if (tty) std::printf("\n");
  sum.steps = trainer->steps_done();
  sum.interrupted = g_interrupted != 0;
  sum.tokens_per_s = trained_tokens / std::max(total_s, 1e-9);
  sum.moe_share = moe_s / std::max(total_s, 1e-9);
  const std::size_t tail = std::max<std::size_t>(1, vb_history.size() / 10);
  for (std::size_t i = vb_history.size() - std::min(tail, vb_history.size()); i < vb_history.size(); ++i)
    sum.maxvio_batch_tail += vb_history[i] / static_cast<double>(std::min(tail, vb_history.size()));
  if (sum.interrupted) {
    save_checkpoint(interrupted_dir, config_json, *trainer, f, corpus, together);
    std::printf("interrupted at step %lld: checkpoint saved to '%s' (continue with --resume %s)\n",
                static_cast<long long>(sum.steps), interrupted_dir.c_str(), interrupted_dir.c_str());
  } else if (!paths.save.empty()) {
    save_checkpoint(paths.save, config_json, *trainer, f, corpus, together);
  }
  if (sum.eval.tokens == 0) sum.eval = trainer->evaluate();
  if (!quiet) {
    const double vg = max_maxvio(sum.eval.layers);
    std::printf("done: %lld steps, eval loss %.4f nats (ppl %.3f, %.3f bits/byte), MaxVio_global %.3f, "
                "%.0f tokens/s (%.0f%% in the MoE blocks)\n",
                static_cast<long long>(sum.steps), sum.eval.loss, sum.eval.ppl, sum.eval.bpb, vg, sum.tokens_per_s,
                100 * sum.moe_share);
    for (std::size_t l = 0; l < sum.eval.layers.size(); ++l)
      std::printf("  layer %zu load / mean (held-out): %s\n", l, load_line(sum.eval.layers[l]).c_str());
    if (!paths.save.empty() && !sum.interrupted)
      std::printf("  checkpoint: %s (moekit inspect %s; moekit forward --model %s --layer 0 ...)\n",
                  paths.save.c_str(), paths.save.c_str(), paths.save.c_str());
  }
  if (!paths.plot_dir.empty() && rank0) {
    std::string args = "run --csv " + quote(paths.csv) + " --load " + quote(paths.load) + " --out " +
                       quote(paths.plot_dir) + " --title " + quote(label.empty() ? config.block.model_type : label);
    if (!paths.bias.empty() && config.block.router.has_selection_bias) args += " --bias " + quote(paths.bias);
    run_plot_script(plot_python, args + (quiet ? " >/dev/null" : ""));
  }
  return sum;
}

RunPaths paths_for(const TrainFlags& f) {
  RunPaths p;
  p.csv = f.csv;
  p.save = f.save;
  if (!f.plot.empty()) {
    p.plot_dir = f.plot;
    if (p.csv.empty()) p.csv = (fs::path(f.plot) / "train.csv").string();
    p.load = (fs::path(f.plot) / "load.csv").string();
    p.bias = (fs::path(f.plot) / "bias.csv").string();
  }
  return p;
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
  for (const char* flag : {"--balance", "--bias-rate", "--aux-coef", "--init-collapsed", "--resume", "--save", "--csv",
                           "--plot"})
    if (app->count(flag) > 0)
      throw std::invalid_argument(kPrefix + std::string(flag) + " cannot be given with --compare: the comparison sets it per run");
  fs::create_directories(base.compare);
  std::vector<RunSummary> results;
  std::string compare_args = "compare --out " + quote((fs::path(base.compare) / "maxvio_batch.png").string()) +
                             " --title " + quote("MaxVio_batch by balancing method");
  std::string collapsed_args = "compare --out " + quote((fs::path(base.compare) / "collapsed.png").string()) +
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
  table << "| run | eval loss (nats) | eval ppl | bits/byte | MaxVio_global | MaxVio_batch (last 10 % of steps) |\n"
           "|---|---|---|---|---|---|\n";
  for (const RunSummary& r : results) {
    const double vg = max_maxvio(r.eval.layers);
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %.4f | %.4f | %.4f | %.3f | %.3f |\n", r.label.c_str(), r.eval.loss,
                  r.eval.ppl, r.eval.bpb, vg, r.maxvio_batch_tail);
    table << row;
  }
  std::ofstream((fs::path(base.compare) / "compare.md").string()) << table.str();
  std::printf("\n%s\nwrote %s\n", table.str().c_str(), (fs::path(base.compare) / "compare.md").string().c_str());
  run_plot_script(python, compare_args);
  run_plot_script(python, collapsed_args);
  if (!results.empty() && results.back().interrupted) throw CLI::RuntimeError(130);
}

}  // namespace

void register_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a byte-level language model whose feed-forward blocks are MoE blocks, with loss-free balancing");
  cmd->add_option("--data", f->data,
                  std::string("Text files or folders to train on (default: ") + kDefaultCorpus +
                      ", the licence texts every Debian system ships)");
  // A repeated option takes its last value (scripts append overrides to a base command line).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--family", f->family, "MoE family preset: " + supported_model_types())->capture_default_str();
  cmd->add_option("--layers", f->layers, "MoE blocks (each a pre-norm residual block)")->capture_default_str();
  cmd->add_option("--dim", f->dim, "Model width D")->capture_default_str();
  cmd->add_option("--experts", f->experts, "Routed experts E per block")->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Experts per token K")->capture_default_str();
  cmd->add_option("--expert-width", f->expert_width, "Width F of one expert")->capture_default_str();
  cmd->add_option("--shared", f->shared, "Shared experts of width F (-1: the family's default)")->capture_default_str();
  cmd->add_option("--context", f->context, "Tokens the context mixing sees (the current one included)")->capture_default_str();
  cmd->add_option("--steps", f->steps, "Optimizer steps (in total, when resuming)")->capture_default_str();
  cmd->add_option("--batch-tokens", f->batch_tokens, "Tokens per step")->capture_default_str();
  cmd->add_option("--micro-batches", f->micro_batches, "Forward/backward passes per step (gradients accumulated)")
      ->capture_default_str();
  cmd->add_option("--seq-len", f->seq_len, "Tokens per sequence (sequence-wise aux loss, batching)")->capture_default_str();
  cmd->add_option("--lr", f->lr, "Peak learning rate (cosine decay to lr/10)")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "Linear warm-up steps")->capture_default_str();
  cmd->add_option("--optimizer", f->optimizer, "adamw or sgd")->capture_default_str();
  cmd->add_option("--balance", f->balance, "loss_free_sign, loss_free_proportional, aux, seq_aux or none")
      ->capture_default_str();
  cmd->add_option("--bias-rate", f->bias_rate, "Bias update rate u of loss-free balancing")->capture_default_str();
  cmd->add_option("--bias-freeze-step", f->bias_freeze_step, "Step from which the bias stops moving (-1: never)")
      ->capture_default_str();
  cmd->add_option("--aux-coef", f->aux_coef, "Coefficient alpha of the aux / seq_aux loss")->capture_default_str();
  cmd->add_option("--z-loss", f->z_loss, "Router z-loss coefficient")->capture_default_str();
  cmd->add_option("--clip", f->clip, "Global gradient-norm clip (0: none)")->capture_default_str();
  cmd->add_flag("--init-collapsed", f->init_collapsed, "Start every router collapsed onto its first K experts");
  cmd->add_flag("--recompute", f->recompute, "Recompute expert pre-activations in the backward (less memory)");
  cmd->add_option("--eval-every", f->eval_every, "Evaluate on the held-out text every N steps (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-tokens", f->eval_tokens, "Held-out tokens per evaluation (at most)")->capture_default_str();
  cmd->add_option("--csv", f->csv, "Write one row of metrics per step");
  cmd->add_option("--plot", f->plot, "Folder for PNG plots (and their data: train.csv, load.csv, bias.csv)");
  cmd->add_option("--save", f->save, "Checkpoint folder, written at the end (and every --save-every steps)");
  cmd->add_option("--save-every", f->save_every, "Also save every N steps (0: only at the end)")->capture_default_str();
  cmd->add_option("--stop-at", f->stop_at,
                  "Stop (and --save) after this step of the --steps schedule, to resume later (0: run to the end)")
      ->capture_default_str();
  cmd->add_option("--resume", f->resume, "Continue the run saved in this checkpoint folder");
  cmd->add_option("--compare", f->compare,
                  "Run the aux-loss-free comparison (loss-free sign/proportional, aux losses, none, a collapsed "
                  "start) into this folder");
  cmd->add_option("--seed", f->seed, "Seed of the initialisation and the batches")->capture_default_str();
  add_expert_parallel_options(
      *cmd, f->ep,
      "data + expert parallel training: each rank trains on its share of every batch's "
      "sequences and holds its own routed experts (and their optimizer state); rank 0 "
      "prints and writes the files and checkpoints (the same format as one process). "
      "At one rank the run is the single-process run bit for bit; at more the losses "
      "equal it to fp32 rounding");
  f->threads_option = add_threads_option(*cmd, f->threads);
  // The flags' own checks and the plotting Python (with --expert-parallel: on every rank, inside
  // the job, so that a bad flag is printed once).
  const auto prepare = [f] {
    apply_threads_option(f->threads_option, f->threads);
    for (const auto& [name, v] : {std::pair{"--layers", f->layers}, std::pair{"--dim", f->dim},
                                  std::pair{"--experts", f->experts}, std::pair{"--top-k", f->top_k},
                                  std::pair{"--expert-width", f->expert_width}, std::pair{"--context", f->context}})
      if (v < 1 || v > (std::int64_t{1} << 20))
        throw std::invalid_argument(kPrefix + name + " (" + std::to_string(v) + ") must be in [1, 1048576]");
    if (f->top_k > f->experts)
      throw std::invalid_argument(kPrefix + "--top-k (" + std::to_string(f->top_k) + ") exceeds --experts (" +
                                  std::to_string(f->experts) + ")");
    if (!f->compare.empty() && f->ep.enabled)
      throw std::invalid_argument(
          kPrefix +
          "--compare cannot be given with --expert-parallel (run the variants "
          "one by one)");
    const bool plots = !f->plot.empty() || !f->compare.empty();
    return plots ? find_plot_python() : std::string();
  };
  cmd->callback([f, cmd, prepare] {
    if (!f->ep.enabled) {
      const std::string python = prepare();
      if (!f->compare.empty()) {
        run_compare(*f, cmd, python);
        return;
      }
      const RunSummary r = run_training(*f, cmd, paths_for(*f), "", python, false);
      if (r.interrupted) throw CLI::RuntimeError(130);
      return;
    }
#ifdef MOEKIT_HAVE_DIST
    bool interrupted = false;
    run_mpi_job("", [&](const MpiSession& mpi) {
      std::string python;
      agreed([&] { python = prepare(); });
      TrainParallel par;
      par.rank = mpi.rank;
      par.agreed = agreed;
      par.make = [&](std::int64_t experts) -> std::shared_ptr<LmParallel> {
        return std::make_shared<dist::MpiLmParallel>(
            parse_placement(kPrefix, f->ep.placement, experts, mpi.size), MPI_COMM_WORLD);
      };
      try {
        interrupted = run_training(*f, cmd, paths_for(*f), "", python, false, par).interrupted;
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
  });
}

}  // namespace moekit::cli
