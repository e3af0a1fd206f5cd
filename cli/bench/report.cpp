// `moekit bench`'s output: a markdown table (with the limits and, for --simulate-threads, the
// schedule model), CSV or JSON (field names in docs/cli.md).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/bench.hpp"
#include "experts/expert_rows.hpp"
#include "format.hpp"
#include "kernels/gemm.hpp"

namespace moekit::cli::bench {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

const char* limit_label(const std::string& limit) {
  if (limit == "bf16_peak") return "bf16 GEMM peak";
  return limit == "gemm_peak" ? "GEMM peak" : "DRAM read";
}

std::string join_ints(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

}  // namespace

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Three significant digits, at least one decimal below 100 ("0.412", "14.8", "196").
std::string sig3(double v) {
  if (v >= 100.0) return fmt("%.0f", v);
  if (v >= 10.0) return fmt("%.1f", v);
  if (v >= 1.0) return fmt("%.2f", v);
  return fmt("%.3f", v);
}

void print_md_header(const char* title, const Header& h) {
  std::printf("%s (commit %s)\n\n", title, h.commit.c_str());
  std::printf("- machine: %s, %u hardware threads\n", h.cpu.c_str(), h.hardware_threads);
  std::printf("- SIMD target: %s\n", h.simd.c_str());
}

nlohmann::json header_json(const Header& h) {
  return {{"commit", h.commit},    {"cpu", h.cpu},         {"hardware_threads", h.hardware_threads},
          {"simd_target", h.simd}, {"threads", h.threads}, {"reps", h.reps},
          {"seed", h.seed}};
}

void print_md(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
              const std::vector<Row>& rows) {
  print_md_header("moekit bench", h);
  std::printf("- threads: %s; %d timed calls per row after one warm-up (median and min)\n",
              join_ints(h.threads).c_str(), h.reps);
  for (const BenchShape* s : shapes)
    std::printf("- %s: %s, D = %lld, F = %lld, E = %lld, K = %lld%s\n", s->name, s->description,
                static_cast<long long>(s->D), static_cast<long long>(s->F),
                static_cast<long long>(s->E), static_cast<long long>(s->K),
                s->shared ? (", " + std::to_string(s->shared) + " shared").c_str() : "");
  std::printf("\n| limit (same run) | threads | value | how |\n|---|---|---|---|\n");
  std::printf("| DRAM read | %d | %.1f GB/s | streaming sum over %s, best of 3 |\n", l.dram_threads,
              l.dram_gbs, format_bytes(l.dram_bytes).c_str());
  for (const auto& [t, v] : l.gemm_peak)
    std::printf(
        "| moekit GEMM peak (cached) | %d | %.1f GFLOP/s | gemm_nt f32 on panels, M = %lld, N = %lld, K = "
        "%lld, best of 3 |\n",
        t, v, static_cast<long long>(kPeakM), static_cast<long long>(kPeakN),
        static_cast<long long>(kPeakK));
  for (const auto& [t, v] : l.bf16_peak)
    std::printf(
        "| moekit bf16 GEMM peak (cached) | %d | %.1f GFLOP/s | gemm_nt_bf16 (%s), rounding included, M = %lld, N = "
        "%lld, K = %lld, best of 3 |\n",
        t, v, kernels::bf16_path_name(kernels::bf16_path()), static_cast<long long>(kPeakM),
        static_cast<long long>(kPeakN), static_cast<long long>(kPeakK));
  std::printf(
      "\n| mode | shape | dtype | layout | T | threads | median ms | min ms | tokens/s | GFLOP/s | weight GB/s | "
      "vs. limit | kernels (up projections x experts) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %lld | %d | %s | %s | %s | %s | %s | %.0f %% of %s | %s |\n", r.mode.c_str(),
                r.shape.c_str(), r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                sig3(r.median_ms).c_str(), sig3(r.min_ms).c_str(), fmt("%.0f", r.tokens_per_s).c_str(),
                sig3(r.gflops).c_str(), sig3(r.weight_gbs).c_str(), r.limit_pct, limit_label(r.limit),
                r.kernels.c_str());
  std::printf(
      "\nGFLOP/s = 2*3*T*(K + shared)*D*F per call / median; weight GB/s = bytes of the experts "
      "the "
      "call's routing touched (+ shared) / median; vs. limit: T >= 128 GFLOP/s against the GEMM "
      "peak "
      "at the row's threads (bf16-act: the bf16 GEMM peak), T < 128 weight GB/s against DRAM read. train: one step = forward_train + "
      "backward, 3x the forward's FLOPs.\n");
  bool simulated = false;
  for (const Row& r : rows) simulated = simulated || !r.sim_efficiency.empty();
  if (simulated) {
    std::printf(
        "\n| shape | dtype | layout | T | threads | tasks | model ms (routed experts) | measured "
        "ms |");
    for (const auto& [p, e] : rows.front().sim_efficiency)
      std::printf(" efficiency at %d threads |", p);
    std::printf("\n|---|---|---|---|---|---|---|---|");
    for (std::size_t i = 0; i < rows.front().sim_efficiency.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (const Row& r : rows) {
      std::printf("| %s | %s | %s | %lld | %d | %lld | %s | %s |", r.shape.c_str(), r.dtype.c_str(),
                  r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                  static_cast<long long>(r.sim_tasks), sig3(r.sim_model_ms).c_str(),
                  sig3(r.median_ms).c_str());
      for (const auto& [p, e] : r.sim_efficiency) std::printf(" %.0f %% |", 100.0 * e);
      std::printf("\n");
    }
    std::printf(
        "\nSimulated schedule (--simulate-threads): the last timed call's routed rows cut into\n"
        "the layer's tasks (expert, <= %lld rows), each costing its expert's weight bytes at one\n"
        "thread's share of the DRAM limit plus its FLOPs at one thread's share of the GEMM peak,\n"
        "run in order by workers that take the next task when free (fewer tasks than threads:\n"
        "each GEMM split evenly). Efficiency = total task time / (threads x finish time): the "
        "load\n"
        "balance only; the shared DRAM of a bigger machine is not modelled.\n",
        static_cast<long long>(kTaskRows));
  }
  for (const Row& r : rows)
    if (r.mode == "train")
      std::printf("- train %s T = %lld: the training forward keeps %s per token for the backward\n", r.shape.c_str(),
                  static_cast<long long>(r.tokens), format_bytes(static_cast<std::size_t>(r.saved_bytes_per_token)).c_str());
}

void print_csv(const Header& h, const std::vector<Row>& rows) {
  std::printf(
      "mode,shape,dtype,layout,tokens,threads,median_ms,min_ms,tokens_per_s,gflops,weight_gbs,limit,limit_"
      "value,"
      "limit_pct,saved_bytes_per_token,kernels,cpu,simd,commit\n");
  for (const Row& r : rows)
    std::printf("%s,%s,%s,%s,%lld,%d,%.4f,%.4f,%.2f,%.3f,%.3f,%s,%.3f,%.2f,%.0f,%s,%s,%s,%s\n", r.mode.c_str(),
                r.shape.c_str(), r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                r.median_ms, r.min_ms, r.tokens_per_s, r.gflops, r.weight_gbs, r.limit.c_str(), r.limit_value,
                r.limit_pct, r.saved_bytes_per_token, csv_field(r.kernels).c_str(), csv_field(h.cpu).c_str(),
                csv_field(h.simd).c_str(), csv_field(h.commit).c_str());
}

void print_json(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
                const std::vector<Row>& rows) {
  nlohmann::json j = header_json(h);
  j["limits"] = nlohmann::json::array();
  j["limits"].push_back({{"name", "dram_read"},
                         {"unit", "GB/s"},
                         {"threads", l.dram_threads},
                         {"bytes", l.dram_bytes},
                         {"value", l.dram_gbs}});
  const auto peaks = [&](const std::vector<std::pair<int, double>>& values, const char* name,
                         const std::string& label) {
    for (const auto& [t, v] : values)
      j["limits"].push_back({{"name", name},
                             {"label", label},
                             {"unit", "GFLOP/s"},
                             {"threads", t},
                             {"M", kPeakM},
                             {"N", kPeakN},
                             {"K", kPeakK},
                             {"value", v}});
  };
  peaks(l.gemm_peak, "gemm_peak", "moekit GEMM peak (cached)");
  peaks(l.bf16_peak, "bf16_peak",
        std::string("moekit bf16 GEMM peak (cached, ") + kernels::bf16_path_name(kernels::bf16_path()) + ")");
  j["shapes"] = nlohmann::json::array();
  for (const BenchShape* s : shapes)
    j["shapes"].push_back({{"name", s->name},
                           {"description", s->description},
                           {"D", s->D},
                           {"F", s->F},
                           {"E", s->E},
                           {"K", s->K},
                           {"shared", s->shared}});
  j["results"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["results"].push_back({{"mode", r.mode},
                            {"saved_bytes_per_token", r.saved_bytes_per_token},
                            {"shape", r.shape},
                            {"dtype", r.dtype},
                            {"layout", r.layout},
                            {"tokens", r.tokens},
                            {"threads", r.threads},
                            {"median_ms", r.median_ms},
                            {"min_ms", r.min_ms},
                            {"tokens_per_s", r.tokens_per_s},
                            {"gflops", r.gflops},
                            {"weight_gbs", r.weight_gbs},
                            {"limit", r.limit},
                            {"limit_value", r.limit_value},
                            {"limit_pct", r.limit_pct},
                            {"simulated_tasks", r.sim_tasks},
                            {"simulated_model_ms", r.sim_model_ms},
                            {"simulated_efficiency", r.sim_efficiency},
                            {"kernels", r.kernels}});
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace moekit::cli::bench
