// `moekit bench`: a llama-bench-like table of the MoE layer at the reference shapes of
// docs/performance.md, for each weight format, token count and thread count, against the
// machine's limits measured in the same run with moekit's own means (limits.cpp).
//
// Each layer is built once per (shape, format) with random weights (synth::random_weights). Routing
// is random and fresh per call: 8 pre-drawn input batches are cycled, so no call reuses the
// previous call's experts by construction. Weight GB/s counts the bytes of the experts a call
// actually touched (distinct experts in its routing, plus the shared experts) over its time.
#include "bench/bench.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "experts/expert_rows.hpp"
#include "experts/weight_matrix.hpp"
#include "format.hpp"
#include "git_commit.hpp"  // MOEKIT_GIT_COMMIT, generated at build time (cli/CMakeLists.txt)
#include "kernels/gemm.hpp"
#include "kernels/plan.hpp"
#include "util/error.hpp"
#include "util/schedule.hpp"

namespace moekit::cli {

namespace bench {
namespace {

// What one row's timed calls saw.
struct Timing {
  std::vector<double> secs;
  double touched = 0;      // expert bytes the calls' routings touched, summed over the calls
  double saved_bytes = 0;  // train: what the training forward keeps, per token
  Tensor last_ids;         // forward: the last timed call's routing
  std::vector<std::int64_t> last_counts;  // the last timed call's rows per expert
};

}  // namespace

// Throws where `copies` times the layer's weight bytes, plus 256 MB to spare, exceed `avail`
// (MemAvailable; -1 where unknown: no check).
void check_memory(const BenchShape& s, const WeightFormat& format, int copies, double avail) {
  const double needed = layer_weight_bytes(s, format);
  if (avail >= 0 && needed * copies + 256e6 > avail)
    throw std::runtime_error("out of memory: " + std::string(s.name) + " " + format.name() + " needs " + gb(needed) +
                             " of weights but only " + gb(avail) + " is available");
}

std::unique_ptr<MoeLayer> build_checked(const BenchShape& s, const WeightFormat& format, bool panels,
                                        std::uint64_t seed, bool progress) {
  const double needed = layer_weight_bytes(s, format);
  check_memory(s, format, 1, available_memory());
  if (progress)
    std::fprintf(stderr, "moekit bench: building %s %s (%s)...\n", s.name, format.name().c_str(), gb(needed).c_str());
  try {
    return build_layer(s, format, panels, seed);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory building " + std::string(s.name) + " " + format.name() + " (" +
                             gb(needed) + " of weights)");
  }
}

namespace {

// Adds the expert bytes a call touched: the experts with rows in its routing (`counts` per
// expert) plus the shared experts.
void add_touched(Timing& t, const std::vector<std::int64_t>& counts, const BenchShape& s, double per_expert) {
  std::int64_t active = 0;
  for (const std::int64_t c : counts) active += c > 0;
  t.touched += per_expert * static_cast<double>(active + s.shared);
}

// Inference: one warm-up call, then `reps` timed calls on the cycled inputs.
Timing time_forward(MoeLayer& layer, const std::vector<Tensor>& inputs, int reps, const BenchShape& s,
                    double per_expert) {
  Timing t;
  std::size_t next = 0;
  Tensor y = layer.forward(inputs[next++ % inputs.size()]);  // warm-up
  for (int r = 0; r < reps; ++r) {
    ForwardInfo info;
    const auto t0 = Clock::now();
    y = layer.forward(inputs[next++ % inputs.size()], &info);
    t.secs.push_back(seconds_since(t0));
    t.last_ids = info.routing.ids;
    t.last_counts = expert_counts(info.routing.ids, s.E);
    add_touched(t, t.last_counts, s, per_expert);
  }
  return t;
}

// One training step per call: forward_train + backward into gradient buffers kept between steps
// (as a training loop keeps them), dy a fixed random tensor; one warm-up step.
Timing time_train(MoeLayer& layer, const std::vector<Tensor>& inputs, int reps, const BenchShape& s,
                  double per_expert, std::int64_t T, std::uint64_t seed) {
  Timing t;
  std::size_t next = 0;
  Tensor dy = Tensor::uninitialized({T, s.D}, DType::f32);
  synth::fill_uniform(dy, 1.0f, seed * 1000 + 7);
  MoeTensors grads = MoeTensors::zeros_like(layer);
  SavedForward saved;  // reused step after step, as a training loop does
  for (int r = -1; r < reps; ++r) {
    const auto t0 = Clock::now();
    layer.forward_train(inputs[next++ % inputs.size()], saved);
    backward(layer, saved, dy, grads);
    const double dt = seconds_since(t0);
    if (r < 0) continue;
    t.secs.push_back(dt);
    t.saved_bytes = static_cast<double>(saved.nbytes()) / static_cast<double>(T);
    t.last_counts = saved.routed.plan.counts;
    add_touched(t, t.last_counts, s, per_expert);
  }
  return t;
}

}  // namespace

std::string planned_kernels(const MoeLayer& layer, const std::vector<std::int64_t>& counts, std::int64_t T) {
  const ExpertMatrix& up = layer.weights().experts.up;
  const ComputeMode mode = layer.compute_mode();
  std::vector<std::pair<std::string, std::int64_t>> seen;  // in order of first use
  for (std::size_t e = 0; e < counts.size() && static_cast<std::int64_t>(e) < up.num_experts(); ++e) {
    if (counts[e] == 0) continue;
    const std::string k = kernels::describe(
        kernels::plan_gemm_nt(weight_matrix(up, static_cast<std::int64_t>(e)), mode, counts[e], up.cols));
    const auto at = std::find_if(seen.begin(), seen.end(), [&](const auto& x) { return x.first == k; });
    if (at == seen.end()) {
      seen.emplace_back(k, 1);
    } else {
      ++at->second;
    }
  }
  std::string out;
  for (const auto& [k, n] : seen) out += (out.empty() ? "" : " + ") + k + " x" + std::to_string(n);
  const ExpertMatrix& shared = layer.weights().shared.up;
  if (shared.defined())
    out += " + shared " + kernels::describe(kernels::plan_gemm_nt(weight_matrix(shared, 0), mode, T, shared.cols));
  return out;
}

namespace {

// The timing as a row, held against its limit: T >= 128 GFLOP/s against the GEMM peak at the
// row's threads, T < 128 the weight bytes' GB/s against the DRAM read bandwidth.
Row make_row(const BenchShape& s, const WeightFormat& format, const std::string& layout, std::int64_t T,
             std::int64_t nt, const Timing& t, const Limits& limits, bool train) {
  Row row;
  row.mode = train ? "train" : "forward";
  row.saved_bytes_per_token = t.saved_bytes;
  row.shape = s.name;
  row.dtype = format.name();
  row.layout = format.quantized() && format.element != Element::affine ? format.name()
               : format.quantized()                                    ? "affine"
               : format.bf16_act && layout == "panels"                 ? "amx_tiles"
                                                                       : layout;
  row.tokens = T;
  row.threads = static_cast<int>(nt);
  const double med = median_of(t.secs);
  row.median_ms = med * 1e3;
  row.min_ms = *std::min_element(t.secs.begin(), t.secs.end()) * 1e3;
  row.tokens_per_s = static_cast<double>(T) / med;
  row.gflops = (train ? 3.0 : 1.0) * 2.0 * 3.0 * static_cast<double>(T) * static_cast<double>(s.K + s.shared) *
               static_cast<double>(s.D) * static_cast<double>(s.F) / med * 1e-9;
  row.weight_gbs = t.touched / static_cast<double>(t.secs.size()) / med * 1e-9;
  if (T >= 128) {
    row.limit = format.bf16_act ? "bf16_peak" : "gemm_peak";
    row.limit_value = format.bf16_act ? Limits::at(limits.bf16_peak, row.threads) : limits.peak_for(row.threads);
    row.limit_pct = row.limit_value > 0 ? 100.0 * row.gflops / row.limit_value : 0.0;
  } else {
    row.limit = "dram_read";
    row.limit_value = limits.dram_gbs;
    row.limit_pct = row.limit_value > 0 ? 100.0 * row.weight_gbs / row.limit_value : 0.0;
  }
  return row;
}

// --simulate-threads: the last call's routed rows cut into the layer's tasks, each costing its
// expert's weight bytes at one thread's share of the DRAM read limit, then its FLOPs at one
// thread's share of the GEMM peak (streaming and compute not overlapped; shared experts, router
// and combine not modelled), replayed by the pool's list schedule at each thread count.
void simulate_schedule(Row& row, const BenchShape& s, double per_expert, const Limits& limits, const Tensor& last_ids,
                       const std::vector<std::int64_t>& simulate, bool bf16_act) {
  const double gemm_peak = bf16_act ? Limits::at(limits.bf16_peak, row.threads) : limits.peak_for(row.threads);
  const double bw = limits.dram_gbs * 1e9 / std::max(1, limits.dram_threads);
  const double peak = gemm_peak * 1e9 / static_cast<double>(row.threads);
  if (simulate.empty() || last_ids.numel() == 0 || bw <= 0 || peak <= 0) return;
  std::vector<double> costs;
  double sum = 0;
  for (const ExpertTask& t : expert_tasks(plan_dispatch(last_ids, s.E).offsets)) {
    costs.push_back(per_expert / bw + 6.0 * static_cast<double>(s.D * s.F * t.count) / peak);
    sum += costs.back();
  }
  row.sim_tasks = static_cast<std::int64_t>(costs.size());
  // Where run_sorted_rows splits each GEMM over the pool instead of running tasks side by side
  // (split_gemms), modelled as an even split.
  const auto makespan = [&](std::int64_t p) {
    return split_gemms(row.sim_tasks, p) ? sum / static_cast<double>(p)
                                         : detail::list_schedule_makespan(costs, static_cast<int>(p));
  };
  row.sim_model_ms = makespan(row.threads) * 1e3;
  for (const std::int64_t p : simulate)
    row.sim_efficiency.emplace_back(static_cast<int>(p), sum / (static_cast<double>(p) * makespan(p)));
}

}  // namespace

Header make_header(const Plan& p) {
  Header h;
  h.commit = MOEKIT_GIT_COMMIT;
  h.cpu = cpu_model();
  h.hardware_threads = std::thread::hardware_concurrency();
  h.simd =
      std::string(kernels::simd_target_name()) + "; bf16 products: " + kernels::bf16_path_name(kernels::bf16_path());
  h.threads = p.threads;
  h.reps = p.reps;
  h.seed = p.seed;
  return h;
}

bool runs_layout(const WeightFormat& d, const std::string& layout, const std::vector<std::string>& layouts) {
  // Quantized experts have one layout (read in place): run them once.
  if (d.quantized()) return layout == layouts.front();
  // The bf16 compute mode packs AMX tiles on the amx path ("panels" then means them) and reads
  // rows on its other paths.
  return !d.bf16_act || layout == "rows" || kernels::bf16_path() == kernels::Bf16Path::amx;
}

Plan check_options(const Options& o) {
  Plan p;
  p.shapes = parse_shapes(o.shape);
  p.dtypes = parse_dtypes(o.dtype);
  p.layouts = parse_layouts(o.layout);
  p.decode = o.decode;
  p.tokens =
      parse_int_list(o.tokens.empty() ? (o.decode ? "1,2,4,8,32" : "1,32,512") : o.tokens, "--tokens", 1, 1 << 20);
  if (!o.layers.empty()) {
    if (!o.decode) throw std::invalid_argument("--layers sets the layers of --decode; it does nothing without it");
    p.layers = parse_int(o.layers, "--layers", 1, 4096);
  }
  if (!o.model.empty() && !o.decode)
    throw std::invalid_argument("--model times a checkpoint's layers with --decode; add --decode");
  if (o.int8 && o.model.empty())
    throw std::invalid_argument(
        "--int8 runs a --model checkpoint in the fast mode; for --dtype name it as q4-int8, ...");
  if (o.decode && o.mode != "forward") throw std::invalid_argument("--decode times the forward only (--mode forward)");
  if (o.decode && !o.simulate_threads.empty())
    throw std::invalid_argument("--simulate-threads models one layer's task schedule; it does not go with --decode");
  p.threads = parse_int_list(o.threads, "--threads", 1, 4096);
  p.reps = static_cast<int>(parse_int(o.reps, "--reps", 1, 1000));
  p.seed = static_cast<std::uint64_t>(parse_int(o.seed, "--seed", 0, INT64_MAX));
  p.dram_mib = parse_int(o.dram_mib, "--dram-mib", 1, 1 << 20);
  if (o.mode != "forward" && o.mode != "train")
    throw std::invalid_argument("--mode '" + o.mode + "' is not a mode (expected forward or train)");
  p.train = o.mode == "train";
  if (!o.simulate_threads.empty()) p.simulate = parse_int_list(o.simulate_threads, "--simulate-threads", 1, 1 << 16);
  if (!p.simulate.empty() && p.train)
    throw std::invalid_argument("--simulate-threads models the forward's tasks; it does not go with --mode train");
  if (p.train)
    for (const WeightFormat& d : p.dtypes)
      if (d.quantized()) throw std::invalid_argument("--mode train needs float weights; " + d.name() + " has no gradient");
  for (const WeightFormat& d : p.dtypes) {
    const int group = d.spec().group;
    for (const BenchShape* s : p.shapes)
      if (d.quantized() && d.element != Element::e4m3 && (s->D % group != 0 || s->F % group != 0))  // FP8: ragged ok
        throw std::invalid_argument(MOEKIT_MSG("--dtype " << d.name() << " groups " << group << " inputs, which shape "
                                                          << s->name << " (D = " << s->D << ", F = " << s->F
                                                          << ") does not divide"));
    if (d.bf16_act && p.train)
      throw std::invalid_argument("--mode train trains f32 parameters; " + d.name() + " is forward only");
    if (d.bf16_act && !d.quantized() && kernels::bf16_path() != kernels::Bf16Path::amx &&
        std::find(p.layouts.begin(), p.layouts.end(), "rows") == p.layouts.end())
      throw std::invalid_argument(std::string("--dtype bf16-act needs --layout rows on this CPU: the bf16 compute mode "
                                              "packs (AMX tiles) on the amx path only, and it runs ") +
                                  kernels::bf16_path_name(kernels::bf16_path()) +
                                  " here; with other layouts listed too it runs in rows only");
  }
  if (o.output != "md" && o.output != "csv" && o.output != "json")
    throw std::invalid_argument("-o '" + o.output + "' is not an output format (expected md, csv or json)");
  const double avail = available_memory();
  if (o.model.empty())  // --model maps the checkpoint's own layers instead
    for (const BenchShape* s : p.shapes)
      for (const WeightFormat& d : p.dtypes) check_memory(*s, d, p.train ? 3 : 1, avail);
  return p;
}

Limits measure_limits(const Plan& p, bool progress) {
  Limits limits;
  limits.dram_threads = static_cast<int>(*std::max_element(p.threads.begin(), p.threads.end()));
  limits.dram_bytes = static_cast<std::size_t>(p.dram_mib) << 20;
  if (progress) std::fprintf(stderr, "moekit bench: measuring the limits...\n");
  limits.dram_gbs = measure_dram_read(limits.dram_threads, limits.dram_bytes);
  if (p.decode) return limits;  // decode rows are held against DRAM only
  for (const std::int64_t t : p.threads)
    limits.gemm_peak.emplace_back(static_cast<int>(t), measure_gemm_peak(static_cast<int>(t)));
  if (std::any_of(p.dtypes.begin(), p.dtypes.end(), [](const WeightFormat& d) { return d.bf16_act; }))
    for (const std::int64_t t : p.threads)
      limits.bf16_peak.emplace_back(static_cast<int>(t), measure_bf16_peak(static_cast<int>(t)));
  return limits;
}

namespace {

// Every (T, threads) row of one layer.
std::vector<Row> run_shape(const BenchShape& s, const WeightFormat& format, const std::string& layout, const Plan& p,
                           const Limits& limits, bool progress) {
  const std::unique_ptr<MoeLayer> layer = build_checked(s, format, layout == "panels", p.seed, progress);
  const double per_expert = expert_bytes(s, format);
  std::vector<Row> rows;
  for (const std::int64_t T : p.tokens) {
    constexpr int kBatches = 8;
    std::vector<Tensor> inputs;
    for (int i = 0; i < kBatches; ++i) {
      inputs.push_back(Tensor::uninitialized({T, s.D}, DType::f32));
      synth::fill_uniform(inputs.back(), 1.0f, p.seed * 1000 + 100 + static_cast<std::uint64_t>(T) * kBatches + i);
    }
    for (const std::int64_t nt : p.threads) {
      if (progress)
        std::fprintf(stderr, "moekit bench: %s %s T=%lld threads=%lld\n", s.name, format.name().c_str(),
                     static_cast<long long>(T), static_cast<long long>(nt));
      set_num_threads(static_cast<int>(nt));
      const Timing t = p.train ? time_train(*layer, inputs, p.reps, s, per_expert, T, p.seed)
                               : time_forward(*layer, inputs, p.reps, s, per_expert);
      Row row = make_row(s, format, layout, T, nt, t, limits, p.train);
      row.kernels = planned_kernels(*layer, t.last_counts, T);
      simulate_schedule(row, s, per_expert, limits, t.last_ids, p.simulate, format.bf16_act);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

void run_bench(const Options& o) {
  if (o.expert_parallel && !o.simulate_threads.empty())
    throw std::invalid_argument(
        "--simulate-threads models one process's task schedule; it does not go with --expert-parallel");
  if (o.expert_parallel) {
    if (o.decode) throw std::invalid_argument("--decode runs in one process; it does not go with --expert-parallel");
    return run_expert_parallel(o);
  }
  if (o.e2e) {
    if (o.decode || o.expert_parallel)
      throw std::invalid_argument("--e2e goes with neither --decode nor --expert-parallel");
    return run_e2e(o);
  }
  if (o.decode) return run_decode(o);
  const Plan p = check_options(o);
  const bool progress = isatty(STDERR_FILENO) != 0;
  const Header h = make_header(p);
  const Limits limits = measure_limits(p, progress);

  std::vector<Row> rows;
  for (const BenchShape* s : p.shapes)
    for (const WeightFormat& d : p.dtypes)
      for (const std::string& lay : p.layouts)
        if (runs_layout(d, lay, p.layouts))
          for (Row& r : run_shape(*s, d, lay, p, limits, progress)) rows.push_back(std::move(r));

  if (o.output == "md")
    print_md(h, limits, p.shapes, rows);
  else if (o.output == "csv")
    print_csv(h, rows);
  else
    print_json(h, limits, p.shapes, rows);
  std::fflush(stdout);
}

}  // namespace
}  // namespace bench

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<bench::Options>();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  opt->threads = hw > 1 ? "1," + std::to_string(hw) : "1";
  auto* cmd = app.add_subcommand(
      "bench",
      "A table of the MoE layer at reference shapes x dtypes x tokens x threads, against "
      "the machine's limits measured in the same run");
  auto* shape = cmd->add_option("--shape", opt->shape,
                                "qwen3, deepseek, mixtral (5.6 GB of f32 weights: only when named) or all "
                                "(= qwen3,deepseek); a comma list is accepted (default all)");
  auto* dtype = cmd->add_option(
      "--dtype", opt->dtype, std::string("Weight formats, comma list of ") + bench::kDtypeList + " (default f32,bf16)");
  cmd->add_option("--layout", opt->layout,
                  "Expert weight layouts, comma list of panels (repacked at load for the outer-product "
                  "kernel; for bf16-act on AMX: AMX tiles) and rows (as stored, read in place: mapped "
                  "checkpoints) (default panels)");
  cmd->add_option("--mode", opt->mode,
                  "forward (inference) or train (one training step: forward_train + backward, against 3x the "
                  "forward's FLOPs) (default forward)");
  cmd->add_option("--tokens", opt->tokens, "Token counts T, comma list (default 1,32,512; with --decode 1,2,4,8,32)");
  cmd->add_flag("--decode", opt->decode,
                "Decode at the memory limit: L distinct layers, each call a fresh routing on the next layer, so "
                "the experts come from DRAM; per row ms per layer, the bytes touched (experts, router, shared), "
                "GB/s, the fraction of the DRAM read limit and tokens/s for a model of L layers (docs/cli.md)");
  auto* model = cmd->add_option("--model", opt->model,
                                "With --decode: a checkpoint folder whose MoE layers (all, or the first --layers) are "
                                "timed as stored, in place of --shape and --dtype");
  cmd->add_flag("--e2e", opt->e2e,
                "Time a whole model (--model: GGUF file or checkpoint folder) as llama-bench measures one: pp<p> (a "
                "prompt of -p random tokens) and tg<n> (-n tokens one at a time), tokens/s and the share of time "
                "outside the MoE blocks");
  cmd->add_option("-p,--prompt-tokens", opt->prompt_tokens,
                  "--e2e: prompt tokens of the pp test (default 512; 0: none)");
  cmd->add_option("-n,--gen-tokens", opt->gen_tokens, "--e2e: tokens of the tg test (default 128; 0: none)");
  cmd->add_option("--parallel", opt->parallel,
                  "--e2e: also tg rows of N sequences decoding together (comma list, e.g. 1,4,8): "
                  "each step one pass over N tokens (CausalLm::decode), tokens/s summed over the sequences");
  cmd->add_flag("--int8", opt->int8,
                "With --model: the checkpoint's quantized layers in the int8 fast mode (int8 activations; "
                "docs/numerics.md)");
  cmd->add_flag("--exact", opt->exact,
                "--e2e: the exact mode (default: the file's own arithmetic, int8 for a GGUF as ggml computes)")
      ->excludes("--int8");
  cmd->add_option("--layers", opt->layers,
                  "--decode's distinct layers (default: enough that their experts are at least 8x the last-level "
                  "cache, at most 64 and what memory holds)");
  cmd->add_option("--threads", opt->threads,
                  "Thread counts, comma list (default 1 and the hardware thread count)");
  cmd->add_option("--reps", opt->reps, "Timed calls per row after one warm-up (default 5)");
  cmd->add_option(
      "--simulate-threads", opt->simulate_threads,
      "Thread counts, comma list: forward rows also report how evenly the layer's task schedule "
      "would fill that many threads, replayed on a cost model calibrated by this run's limits "
      "(docs/performance.md)");
  cmd->add_option("--seed", opt->seed, "Random seed of weights and inputs (default 0)");
  cmd->add_option("-o,--output", opt->output, "Output format: md, csv or json (default md)");
  cmd->add_flag("--expert-parallel", opt->expert_parallel,
                "Under mpirun: the layer expert-parallel over the ranks (docs/distributed.md): the exchange's "
                "latency and bandwidth, then per shape, dtype and T per rank the time of each phase (route, "
                "exchange out, experts, exchange back, combine), rows and bytes sent per rank, resident memory");
  // For smoke tests: a smaller DRAM buffer (the limit is then not a DRAM figure).
  cmd->add_option("--dram-mib", opt->dram_mib, "DRAM read buffer in MiB (default 1024)")->group("");
  cmd->callback([opt, model, shape, dtype] {
    try {
      if (model->count() > 0 && !opt->e2e && !opt->decode)
        throw std::invalid_argument("--model goes with --decode (its MoE layers) or --e2e (the whole model)");
      if (model->count() > 0 && (shape->count() > 0 || dtype->count() > 0))
        throw std::invalid_argument("--model times the checkpoint's own layers as stored: drop --shape and --dtype");
      bench::run_bench(*opt);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error("[moekit bench] out of memory");
    } catch (const ReportedElsewhere&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("[moekit bench] ") + e.what());
    }
  });
}

}  // namespace moekit::cli
