// What `moekit train` prints and writes besides its checkpoints: the metrics files, the lines
// before, during and after a run, and the plots (the script tools/plot_train.py, compiled in).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "plot_script.hpp"
#include "train_parts.hpp"

namespace moekit::cli::train {

namespace {

namespace fs = std::filesystem;

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

std::string load_line(const LayerLoad& l) {
  std::ostringstream s;
  s.precision(2);
  s << std::fixed;
  for (std::size_t e = 0; e < l.relative.size(); ++e) s << (e ? " " : "") << l.relative[e];
  return s.str();
}

}  // namespace

std::string quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string find_plot_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MOEKIT_PYTHON")) candidates.emplace_back(env);
  candidates.emplace_back("/usr/bin/python3");
  candidates.emplace_back("python3");
  for (const std::string& py : candidates)
    if (std::system((quote(py) + " -c 'import matplotlib, numpy' >/dev/null 2>&1").c_str()) == 0)
      return py;
  throw std::invalid_argument(
      kPrefix +
      "--plot needs python3 with matplotlib (Debian: apt-get install "
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

std::string num(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  std::ostringstream s;
  s.precision(7);
  s << v;
  return s.str();
}

double max_maxvio(const std::vector<LayerLoad>& layers) {
  double v = 0;
  for (const LayerLoad& l : layers) v = std::max(v, l.load.max_violation);
  return v;
}

MetricsFiles::MetricsFiles(const std::string& csv, const std::string& load, const std::string& bias,
                           std::int64_t layers, std::int64_t experts, bool append)
    : L_(layers) {
  const auto open = [&](std::ofstream& f, const std::string& path, const std::string& header) {
    if (path.empty()) return;
    const bool exists = fs::exists(path);
    f.open(path, append && exists ? std::ios::app : std::ios::trunc);
    if (!f) throw std::runtime_error(kPrefix + "cannot write '" + path + "'");
    if (!(append && exists)) f << header << "\n";
  };
  std::string h =
      "step,tokens,train_loss,eval_loss,eval_ppl,eval_bpb,maxvio_batch,maxvio_global,dead_experts,"
      "aux_loss,z_loss,"
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

void MetricsFiles::write(const StepResult& r) {
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
         << (r.evaluated ? num(r.eval.loss) : "") << "," << (r.evaluated ? num(r.eval.ppl) : "")
         << "," << (r.evaluated ? num(r.eval.bpb) : "") << "," << num(vb) << ","
         << (r.evaluated ? num(vg) : "") << "," << dead << "," << num(r.aux_loss) << ","
         << num(r.z_loss) << "," << num(r.lr) << "," << num(r.bias_rate) << ","
         << (has_bias ? num(bmin) : "") << "," << (has_bias ? num(bmax) : "") << ","
         << num(r.grad_norm) << "," << num(tokens_per_s(r));
    for (const LayerLoad& l : r.layers) csv_ << "," << num(l.load.max_violation);
    for (std::int64_t l = 0; l < L_; ++l)
      csv_ << ","
           << (r.evaluated ? num(r.eval.layers[static_cast<std::size_t>(l)].load.max_violation)
                           : "");
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

double MetricsFiles::tokens_per_s(const StepResult& r) {
  const double T = static_cast<double>(r.tokens) / static_cast<double>(r.step);
  return r.seconds > 0 ? T / r.seconds : 0.0;
}

void print_run_header(const TrainFlags& f, const RunSetup& setup, const LmTrainer& trainer,
                      const std::string& label) {
  const LmConfig& config = setup.config;
  const LmTrainOptions& options = setup.options;
  const TextCorpus& corpus = setup.corpus;
  const std::int64_t E = config.block.router.num_experts;
  std::printf(
      "moekit train%s: %s  L=%lld D=%lld E=%lld K=%lld F=%lld shared=%lld  context %lld  (%d "
      "threads)\n",
      label.empty() ? "" : (" [" + label + "]").c_str(), config.block.model_type.c_str(),
      static_cast<long long>(config.layers()), static_cast<long long>(config.dim()),
      static_cast<long long>(E), static_cast<long long>(config.block.router.top_k),
      static_cast<long long>(config.block.expert_width),
      static_cast<long long>(config.block.shared_width /
                             std::max<std::int64_t>(1, config.block.expert_width)),
      static_cast<long long>(config.context), num_threads());
  std::printf("  data: %zu files, %lld bytes (%zu train, %zu held out)%s%s\n", corpus.files.size(),
              static_cast<long long>(corpus.bytes), corpus.train.size(), corpus.held_out.size(),
              f.data.size() == 1 && f.data[0] == kDefaultCorpus ? " from " : "",
              f.data.size() == 1 && f.data[0] == kDefaultCorpus ? kDefaultCorpus : "");
  if (!corpus.skipped.empty())
    std::printf("  skipped %zu binary or empty files\n", corpus.skipped.size());
  std::printf(
      "  %lld steps of %lld tokens (%lld micro-batches), %s lr %g, balance %s%s\n",
      static_cast<long long>(options.steps), static_cast<long long>(options.batch_tokens),
      static_cast<long long>(options.micro_batches), f.optimizer.c_str(), f.lr, f.balance.c_str(),
      loss_free(f.balance)                             ? (" u=" + num(f.bias_rate)).c_str()
      : (f.balance == "aux" || f.balance == "seq_aux") ? (" alpha=" + num(f.aux_coef)).c_str()
                                                       : "");
  if (trainer.parallel())
    std::printf(
        "  expert parallel: %d ranks (rank 0 holds %lld of the %lld routed experts per block; "
        "--placement %s), %d threads per rank\n",
        trainer.parallel()->size(), static_cast<long long>(trainer.local_experts().size()),
        static_cast<long long>(E), f.ep.placement.c_str(), num_threads());
  if (!f.resume.empty())
    std::printf("  resumed from %s at step %lld\n", f.resume.c_str(),
                static_cast<long long>(trainer.steps_done()));
  std::fflush(stdout);
}

ProgressPrinter::ProgressPrinter(std::int64_t steps, std::int64_t first_step, bool tty)
    : steps_(steps),
      first_step_(first_step),
      report_every_(std::max<std::int64_t>(1, steps / 20)),
      tty_(tty),
      start_(std::chrono::steady_clock::now()) {}

void ProgressPrinter::step(const StepResult& r, const EvalResult& last_eval, double tps) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double per_step = elapsed / static_cast<double>(r.step - first_step_);
  const double eta = per_step * static_cast<double>(steps_ - r.step);
  const double vb = max_maxvio(r.layers);
  if (tty_) {
    const int width = 24;
    const int filled = static_cast<int>(width * r.step / steps_);
    std::printf("\r[%s%s] %lld/%lld loss %.3f%s MaxVio %.2f  %.1fk tok/s  ETA %s   ",
                std::string(static_cast<std::size_t>(filled), '#').c_str(),
                std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                static_cast<long long>(r.step), static_cast<long long>(steps_), r.train_loss,
                last_eval.tokens > 0
                    ? (" eval " + num(std::round(last_eval.loss * 1000) / 1000)).c_str()
                    : "",
                vb, tps / 1000, hms(eta).c_str());
    if (r.evaluated) std::printf("\n");
  } else if (r.step % report_every_ == 0 || r.evaluated || r.step == steps_) {
    std::printf(
        "step %lld/%lld  loss %.4f%s  MaxVio_batch %.3f%s  lr %.2e  %.0f tok/s  ETA %s\n",
        static_cast<long long>(r.step), static_cast<long long>(steps_), r.train_loss,
        r.evaluated ? ("  eval " + num(r.eval.loss) + " (ppl " + num(r.eval.ppl) + ")").c_str()
                    : "",
        vb, r.evaluated ? ("  MaxVio_global " + num(max_maxvio(r.eval.layers))).c_str() : "", r.lr,
        tps, hms(eta).c_str());
  }
  std::fflush(stdout);
}

void print_run_summary(const RunSummary& sum, const RunPaths& paths) {
  const double vg = max_maxvio(sum.eval.layers);
  std::printf(
      "done: %lld steps, eval loss %.4f nats (ppl %.3f, %.3f bits/byte), MaxVio_global %.3f, "
      "%.0f tokens/s (%.0f%% in the MoE blocks)\n",
      static_cast<long long>(sum.steps), sum.eval.loss, sum.eval.ppl, sum.eval.bpb, vg,
      sum.tokens_per_s, 100 * sum.moe_share);
  for (std::size_t l = 0; l < sum.eval.layers.size(); ++l)
    std::printf("  layer %zu load / mean (held-out): %s\n", l,
                load_line(sum.eval.layers[l]).c_str());
  if (!paths.save.empty() && !sum.interrupted)
    std::printf("  checkpoint: %s (moekit inspect %s; moekit forward --model %s --layer 0 ...)\n",
                paths.save.c_str(), paths.save.c_str(), paths.save.c_str());
}

}  // namespace moekit::cli::train
