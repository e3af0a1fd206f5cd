// `moekit bench --e2e --model M`: a whole model timed as llama-bench times one — pp<p>: a prompt of
// p random tokens in a fresh sequence, one forward; tg<n>: n tokens one at a time from an empty
// sequence; with --parallel, tg<n> xB: B sequences decoding together, one pass a step (aggregate
// tokens/s) — with the share of the time outside the MoE blocks.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "bench.hpp"
#include "format.hpp"
#include "moekit/causal_lm.hpp"

namespace moekit::cli::bench {

namespace {

struct E2eRow {
  std::string test;
  int threads = 0;
  std::vector<double> tokens_per_s;
  LmStats stats;  // summed over the timed reps
  double mean() const {
    double s = 0;
    for (double v : tokens_per_s) s += v;
    return s / static_cast<double>(tokens_per_s.size());
  }
  double stddev() const {
    const double m = mean();
    double s = 0;
    for (double v : tokens_per_s) s += (v - m) * (v - m);
    return tokens_per_s.size() > 1 ? std::sqrt(s / static_cast<double>(tokens_per_s.size() - 1)) : 0.0;
  }
  double outside_moe() const {
    const double all = stats.moe_ms + stats.dense_ffn_ms + stats.attention_ms + stats.head_ms;
    return all > 0 ? 1.0 - stats.moe_ms / all : 0.0;
  }
};

// One run of the test: seconds.
double run_once(const CausalLm& lm, bool prompt, std::int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(lm.info().vocab_size - 1));
  std::unique_ptr<Sequence> seq = lm.new_sequence();
  const Clock::time_point t0 = Clock::now();
  if (prompt) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (std::int32_t& id : ids) id = pick(rng);
    lm.forward(*seq, ids);
  } else {
    for (std::int64_t i = 0; i < n; ++i) lm.forward(*seq, {pick(rng)});
  }
  return seconds_since(t0);
}

// n decode steps of B sequences together from empty sequences: seconds.
double run_batched(const CausalLm& lm, std::int64_t B, std::int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(lm.info().vocab_size - 1));
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Sequence*> batch;
  for (std::int64_t b = 0; b < B; ++b) {
    seqs.push_back(lm.new_sequence());
    batch.push_back(seqs.back().get());
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B));
  const Clock::time_point t0 = Clock::now();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int32_t& id : ids) id = pick(rng);
    lm.decode(batch, ids);
  }
  return seconds_since(t0);
}

}  // namespace

void run_e2e(const Options& o) {
  if (o.model.empty()) throw std::invalid_argument("--e2e needs --model (a GGUF file or checkpoint folder)");
  const std::int64_t p = parse_int(o.prompt_tokens, "-p", 0, 1 << 20);
  const std::int64_t n = parse_int(o.gen_tokens, "-n", 0, 1 << 20);
  const std::int64_t reps = parse_int(o.reps, "--reps", 1, 1000);
  const std::vector<std::int64_t> threads = parse_int_list(o.threads, "--threads", 1, 1024);
  const std::vector<std::int64_t> parallel =
      o.parallel.empty() ? std::vector<std::int64_t>{} : parse_int_list(o.parallel, "--parallel", 1, 256);
  LmOptions lo;
  if (o.int8) lo.mode = ComputeMode::int8;
  if (o.exact) lo.mode = ComputeMode::exact;
  lo.ctx = std::max<std::int64_t>({p, n, 1});
  lo.prefill_chunk = std::max<std::int64_t>(p, 1);
  const std::shared_ptr<CausalLm> lm = CausalLm::open(o.model, lo);
  std::mt19937 rng(static_cast<std::uint32_t>(parse_int(o.seed, "--seed", 0, INT32_MAX)));
  std::vector<E2eRow> rows;
  for (const std::int64_t t : threads) {
    set_num_threads(static_cast<int>(t));
    for (const bool prompt : {true, false}) {
      const std::int64_t count = prompt ? p : n;
      if (count == 0) continue;
      E2eRow row;
      row.test = (prompt ? "pp" : "tg") + std::to_string(count);
      row.threads = static_cast<int>(t);
      run_once(*lm, prompt, prompt ? count : std::min<std::int64_t>(count, 4), rng);  // warm-up
      lm->reset_stats();
      for (std::int64_t r = 0; r < reps; ++r)
        row.tokens_per_s.push_back(static_cast<double>(count) / run_once(*lm, prompt, count, rng));
      row.stats = lm->stats();
      rows.push_back(row);
    }
    for (const std::int64_t B : n > 0 ? parallel : std::vector<std::int64_t>{}) {
      E2eRow row;
      row.test = "tg" + std::to_string(n) + " x" + std::to_string(B);
      row.threads = static_cast<int>(t);
      run_batched(*lm, B, std::min<std::int64_t>(n, 4), rng);  // warm-up
      lm->reset_stats();
      for (std::int64_t r = 0; r < reps; ++r)
        row.tokens_per_s.push_back(static_cast<double>(B * n) / run_batched(*lm, B, n, rng));
      row.stats = lm->stats();
      rows.push_back(row);
    }
  }
  const LmInfo& info = lm->info();
  if (o.output == "json") {
    nlohmann::json j;
    j["model"] = info.path;
    j["arch"] = info.arch;
    j["layers"] = info.num_layers;
    j["attention"] = info.attention;
    j["cache_bytes_per_token"] = info.cache_bytes_per_token;
    j["cpu"] = cpu_model();
    j["mode"] = compute_mode_name(*lm->options().mode);
    j["reps"] = reps;
    for (const E2eRow& r : rows)
      j["results"].push_back({{"test", r.test},
                              {"threads", r.threads},
                              {"tokens_per_s", r.mean()},
                              {"stddev", r.stddev()},
                              {"samples", r.tokens_per_s},
                              {"outside_moe", r.outside_moe()},
                              {"ms",
                               {{"moe", r.stats.moe_ms},
                                {"dense_ffn", r.stats.dense_ffn_ms},
                                {"attention", r.stats.attention_ms},
                                {"head", r.stats.head_ms}}}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("- model: %s (%s, %lld layers, %s mode); cpu: %s; %lld reps after a warm-up\n\n", info.path.c_str(),
                info.arch.c_str(), static_cast<long long>(info.num_layers), compute_mode_name(*lm->options().mode),
                cpu_model().c_str(), static_cast<long long>(reps));
    std::printf("- attention: %s; KV cache %lld bytes per token (f32)\n\n", info.attention.c_str(),
                static_cast<long long>(info.cache_bytes_per_token));
    std::printf("| test | threads | tokens/s | outside the MoE blocks |\n|---|---:|---:|---:|\n");
    for (const E2eRow& r : rows)
      std::printf("| %s | %d | %.2f ± %.2f | %.1f %% |\n", r.test.c_str(), r.threads, r.mean(), r.stddev(),
                  100.0 * r.outside_moe());
  }
  std::fflush(stdout);
}

}  // namespace moekit::cli::bench
