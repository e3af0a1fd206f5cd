// `moekit bench`, run as a child process on the hidden smoke-test shape (`--shape tiny`, D = 64,
// F = 32, E = 8, K = 2) with a small DRAM buffer so that each run takes a fraction of a second:
// the three output formats carry one row per (dtype, T, threads) and the limits; bad option
// values are exit code 1 with one "moekit: error: " line.
#include <gtest/gtest.h>

#include "cli/run_cli.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace moekit {
namespace {

namespace fs = std::filesystem;

using BenchRun = testing::RunResult;

BenchRun run_bench(const std::vector<std::string>& args) {
  const fs::path dir =
      fs::temp_directory_path() / ("moekit_bench_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> all = {"bench"};
  all.insert(all.end(), args.begin(), args.end());
  BenchRun r = testing::run_cli(all, dir);
  fs::remove_all(dir);
  return r;
}

// The tiny shape, two reps, a 16 MiB "DRAM" buffer: fast, and every code path of a real run.
std::vector<std::string> tiny(std::vector<std::string> more) {
  std::vector<std::string> args = {"--shape", "tiny", "--reps", "2", "--dram-mib", "16"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) parts.push_back(cur);
  return parts;
}

TEST(BenchCli, CsvHasAHeaderAndOneRowPerCombination) {
  const BenchRun r = run_bench(
      tiny({"--dtype", "f32,bf16", "--layout", "panels,rows", "--tokens", "1,128", "--threads", "1,2", "-o", "csv"}));
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<std::string> lines = split(r.out, '\n');
  ASSERT_EQ(lines.size(), 1u + 2 * 2 * 2 * 2) << r.out;
  const std::vector<std::string> header = split(lines[0], ',');
  const std::vector<std::string> expected = {
      "mode",       "shape",     "dtype",       "layout",       "tokens",
      "threads",    "median_ms", "min_ms",      "tokens_per_s", "gflops",
      "weight_gbs", "limit",     "limit_value", "limit_pct",    "saved_bytes_per_token",
      "kernels",    "cpu",       "simd",        "commit"};
  EXPECT_EQ(header, expected);
  std::set<std::tuple<std::string, std::string, std::string, std::string>> combos;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], ',');
    ASSERT_GE(f.size(), expected.size()) << lines[i];  // a CPU name may hold a quoted comma
    EXPECT_EQ(f[0], "forward");
    EXPECT_EQ(f[1], "tiny");
    combos.insert({f[2], f[3], f[4], f[5]});
    for (int c : {6, 7, 8, 9, 10, 12})
      EXPECT_GT(std::stod(f[c]), 0.0) << expected[c] << " in " << lines[i];
    EXPECT_LE(std::stod(f[7]), std::stod(f[6])) << "min > median in " << lines[i];
    EXPECT_EQ(f[11], f[4] == "128" ? "gemm_peak" : "dram_read") << lines[i];
  }
  EXPECT_EQ(combos.size(), 16u) << "a (dtype, layout, T, threads) combination is missing or repeated";
}

TEST(BenchCli, JsonParsesWithLimitsAndResults) {
  const BenchRun r =
      run_bench(tiny({"--dtype", "bf16", "--tokens", "1,2", "--threads", "1", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"commit", "cpu", "hardware_threads", "simd_target", "threads", "reps",
                          "seed", "limits", "shapes", "results"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j["simd_target"].get<std::string>().empty());
  ASSERT_EQ(j["limits"].size(), 2u);  // DRAM read + the GEMM peak at the one thread count
  EXPECT_EQ(j["limits"][0]["name"], "dram_read");
  EXPECT_EQ(j["limits"][1]["name"], "gemm_peak");
  EXPECT_EQ(j["limits"][1]["label"], "moekit GEMM peak (cached)");
  for (const auto& l : j["limits"]) EXPECT_GT(l["value"].get<double>(), 0.0);
  ASSERT_EQ(j["shapes"].size(), 1u);
  EXPECT_EQ(j["shapes"][0]["D"], 64);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["shape"], "tiny");
    EXPECT_EQ(row["dtype"], "bf16");
    EXPECT_EQ(row["layout"], "panels");  // the default
    EXPECT_EQ(row["threads"], 1);
    for (const char* key : {"median_ms", "min_ms", "tokens_per_s", "gflops", "weight_gbs",
                            "limit_value", "limit_pct"})
      EXPECT_GT(row[key].get<double>(), 0.0) << key;
    EXPECT_EQ(row["limit"], "dram_read");
    // The plan the call ran: bf16 panels on the outer-product kernel, the experts with rows counted.
    EXPECT_EQ(row["kernels"].get<std::string>().rfind("outer/", 0), 0u) << row["kernels"];
  }
  EXPECT_EQ(j["results"][0]["tokens"], 1);
  EXPECT_EQ(j["results"][1]["tokens"], 2);
}

TEST(BenchCli, TrainModeTimesAStepAndReportsSavedBytes) {
  const BenchRun r = run_bench(tiny({"--mode", "train", "--dtype", "f32", "--tokens", "3,130", "--threads", "1",
                                     "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["mode"], "train");
    EXPECT_GT(row["gflops"].get<double>(), 0.0);
    EXPECT_GT(row["saved_bytes_per_token"].get<double>(), 0.0);
  }
  const BenchRun q = run_bench(tiny({"--mode", "train", "--dtype", "q4"}));
  EXPECT_EQ(q.exit_code, 1);
  EXPECT_NE(q.err.find("needs float weights"), std::string::npos) << q.err;
  const BenchRun m = run_bench(tiny({"--mode", "sideways"}));
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_NE(m.err.find("--mode 'sideways'"), std::string::npos) << m.err;
}

TEST(BenchCli, MarkdownIsAHeaderTheLimitsAndATable) {
  const BenchRun r = run_bench(tiny({"--dtype", "f32", "--tokens", "1,3,130", "--threads", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("SIMD target: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("machine: "), std::string::npos);
  EXPECT_NE(r.out.find("| DRAM read | 1 |"), std::string::npos);
  EXPECT_NE(r.out.find("| moekit GEMM peak (cached) | 1 |"), std::string::npos);
  EXPECT_NE(r.out.find("| mode | shape | dtype | layout | T | threads | median ms | min ms | tokens/s | GFLOP/s | "
                       "weight GB/s | vs. limit |"),
            std::string::npos)
      << r.out;
  int rows = 0;
  for (const std::string& line : split(r.out, '\n'))
    if (line.rfind("| forward | tiny | f32 | panels |", 0) == 0) {
      ++rows;
      EXPECT_NE(line.find(line.find("| 130 |") != std::string::npos ? "of GEMM peak |"
                                                                    : "of DRAM read |"),
                std::string::npos)
          << line;
    }
  EXPECT_EQ(rows, 3);
}

// --simulate-threads: every forward row carries the replayed schedule: its tasks, the model's
// time, and an efficiency per simulated thread count (1 thread: all of it; more: at most 1).
TEST(BenchCli, SimulatedThreadsReportTheSchedulesEfficiency) {
  const BenchRun r = run_bench(tiny({"--dtype", "f32", "--tokens", "1,64", "--threads", "1",
                                     "--simulate-threads", "1,3,16", "-o", "json"}));
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_GT(row["simulated_tasks"].get<std::int64_t>(), 0) << row;
    EXPECT_GT(row["simulated_model_ms"].get<double>(), 0.0) << row;
    const auto& eff = row["simulated_efficiency"];
    ASSERT_EQ(eff.size(), 3u) << row;
    EXPECT_EQ(eff[0][0].get<int>(), 1);
    EXPECT_NEAR(eff[0][1].get<double>(), 1.0, 1e-12) << row;
    for (const auto& e : eff) {
      EXPECT_GT(e[1].get<double>(), 0.0) << row;
      EXPECT_LE(e[1].get<double>(), 1.0 + 1e-12) << row;
    }
  }
  // T = 64 on the tiny shape (E = 8, K = 2): 128 rows over 8 experts, so more tasks than one
  // row's worth, and 16 threads cannot all be busy.
  EXPECT_GE(j["results"][1]["simulated_tasks"].get<std::int64_t>(), 8);
  const BenchRun md =
      run_bench(tiny({"--tokens", "1", "--threads", "1", "--simulate-threads", "4"}));
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("| efficiency at 4 threads |"), std::string::npos) << md.out;
}

TEST(BenchCli, BadOptionValuesAreOneErrorLineAndExitOne) {
  const std::vector<std::vector<std::string>> bad = {
      {"--shape", "llama"},
      {"--shape", ""},
      {"--dtype", "i8"},
      {"--dtype", "f32,f32"},
      {"--dtype", "fp8-int8"},  // FP8 has no fast mode
      {"--dtype", "bf16-int8"},
      {"--dtype", "-int8"},
      {"--dtype", "int4,int4-int8,int4"},
      {"--layout", "tiles"},
      {"--layout", "rows,rows"},
      {"--layout", ""},
      {"--tokens", "1,,2"},
      {"--tokens", "0"},
      {"--tokens", "abc"},
      {"--tokens", "3x"},
      {"--threads", "0"},
      {"--threads", "1,-2"},
      {"--reps", "0"},
      {"--reps", "many"},
      {"--seed", "-1"},
      {"-o", "xml"},
      {"--simulate-threads", "0"},
      {"--simulate-threads", "2,x"},
      {"--simulate-threads", "4", "--mode", "train"},
      {"--simulate-threads", "4", "--expert-parallel"},
      {"--layers", "2"},  // without --decode
      {"--decode", "--layers", "0"},
      {"--decode", "--mode", "train"},
      {"--decode", "--simulate-threads", "2"},
      {"--decode", "--expert-parallel"},
      {"--model", std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_q4_g64_bf16"},  // without --decode
      {"--decode", "--model", std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_q4_g64_bf16", "--dtype", "f32"},
      {"--decode", "--model", std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_q4_g64_bf16", "--layers", "2"},
      {"--decode", "--model", "/nonexistent/folder"},
      {"--dtype", "q4"},  // group 64 does not divide tiny's F = 32
  };
  for (const auto& args : bad) {
    std::vector<std::string> full = {"--dram-mib", "16"};
    if (args[0] != "--shape" && std::find(args.begin(), args.end(), "--model") == args.end())
      full.insert(full.end(), {"--shape", "tiny"});
    full.insert(full.end(), args.begin(), args.end());
    const BenchRun r = run_bench(full);
    const std::string what = args[0] + " '" + (args.size() > 1 ? args[1] : "") + "'";
    EXPECT_TRUE(r.exited) << what;
    EXPECT_EQ(r.exit_code, 1) << what;
    EXPECT_EQ(r.err.rfind("moekit: error: ", 0), 0u) << what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
    EXPECT_EQ(r.out, "") << what;
  }
}

// A format whose group does not divide the shape: named with the numbers, before anything is built;
// MXFP4 (group 32) runs on the same shape.
TEST(BenchCli, AQuantizedFormatMustDivideTheShape) {
  const BenchRun r = run_bench(tiny({"--dtype", "q4", "--tokens", "1", "--threads", "1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--dtype q4 groups 64 inputs, which shape tiny (D = 64, F = 32) does not divide"),
            std::string::npos)
      << r.err;
  const BenchRun ok = run_bench(tiny({"--dtype", "mxfp4", "--tokens", "1,4", "--threads", "1", "-o", "csv"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find(",tiny,mxfp4,mxfp4,4,"), std::string::npos) << ok.out;
}

// The fast mode of the signed 4-bit formats and FP8 in the bf16 compute mode: their own rows beside
// the exact ones (with the default layouts, panels first: quantized rows run once, in place).
TEST(BenchCli, SignedFormatsHaveFastModeRows) {
  const BenchRun r = run_bench(tiny({"--dtype", "mxfp4,mxfp4-int8,nvfp4-int8,int4-int8,fp8-bf16-act", "--tokens", "1",
                                     "--threads", "1", "-o", "csv"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name :
       {",mxfp4,mxfp4,1,", ",mxfp4-int8,mxfp4-int8,1,", ",nvfp4-int8,nvfp4-int8,1,", ",int4-int8,int4-int8,1,"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name << " in " << r.out;
  // One row each: the fast modes on the int8 row kernel, FP8 in bf16 decoded a block at a time.
  EXPECT_NE(r.out.find("int8_rows/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("+decoded x"), std::string::npos) << r.out;
}

// --decode: one row per (dtype, T, threads) over the layers asked for, with the fields docs/cli.md
// names; the touched bytes are the routing's distinct experts plus the router (tiny: no shared
// experts), so between K and min(T·K, E) experts' bytes.
TEST(BenchCli, DecodeRowsCarryTheTouchedBytesAndTheirShareOfDram) {
  const BenchRun r = run_bench(
      tiny({"--decode", "--layers", "3", "--dtype", "f32,mxfp4", "--tokens", "1,4", "--threads", "1", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "decode");
  EXPECT_GT(j["last_level_cache_bytes"].get<double>(), 0.0);
  ASSERT_EQ(j["results"].size(), 4u);
  const double dram = j["dram_read"]["gbps"].get<double>();
  EXPECT_GT(dram, 0.0);
  for (const auto& row : j["results"]) {
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["layers"], 3);
    const double T = row["tokens"].get<double>(), ms = row["ms_per_layer"].get<double>();
    EXPECT_GT(ms, 0.0);
    EXPECT_LE(row["min_ms"].get<double>(), ms);
    // tiny: D = 64, F = 32, E = 8, K = 2; an expert is 3 · 64 · 32 weights, the router 8 · 64 f32.
    const double bytes_per_weight = row["dtype"] == "f32" ? 4.0 : 4.25 / 8.0;
    const double expert = 3 * 64 * 32 * bytes_per_weight, router = 8 * 64 * 4;
    const double touched = row["touched_bytes"].get<double>();
    EXPECT_GE(touched, 2 * expert + router - 1);
    EXPECT_LE(touched, std::min(T * 2, 8.0) * expert + router + 1);
    EXPECT_NEAR(row["gbps"].get<double>(), touched / (ms * 1e6), 1e-9 * touched);
    EXPECT_NEAR(row["dram_fraction"].get<double>(), row["gbps"].get<double>() / dram, 1e-12);
    EXPECT_NEAR(row["tokens_per_s"].get<double>(), T / (3 * ms / 1e3), 1e-6 * T / ms);
  }
  // The default token list of --decode, and the layers chosen from the cache (at most 64).
  const BenchRun d = run_bench(tiny({"--decode", "--dtype", "bf16", "--threads", "1", "-o", "csv"}));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  std::vector<std::string> lines = split(d.out, '\n');
  ASSERT_EQ(lines.size(), 6u) << d.out;  // header + T = 1, 2, 4, 8, 32
  EXPECT_EQ(split(lines[0], ',')[3], "tokens");
  const std::vector<std::string> tokens = {"1", "2", "4", "8", "32"};
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const auto f = split(lines[i], ',');
    EXPECT_EQ(f[3], tokens[i - 1]);
    EXPECT_EQ(f[5], "64") << "tiny's layers are far below 8x any cache: the cap";
  }
}

// --decode --model: a checkpoint's MoE layers as stored (here mlx-lm's 4-bit Qwen3-MoE golden, one
// MoE layer), the touched bytes from its own experts.
TEST(BenchCli, DecodeTimesACheckpointsOwnLayers) {
  const std::string dir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_q4_g64_bf16";
  const BenchRun r = run_bench({"--decode", "--model", dir, "--tokens", "1,2", "--threads", "1", "--reps", "2",
                                "--dram-mib", "16", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["shape"], "qwen3_moe_q4_g64_bf16");
    EXPECT_EQ(row["layout"], "checkpoint");
    EXPECT_EQ(row["layers"], 1);
    EXPECT_NE(row["dtype"].get<std::string>().find("4-bit affine"), std::string::npos) << row["dtype"];
    EXPECT_GT(row["touched_bytes"].get<double>(), 0.0);
    EXPECT_GT(row["dram_fraction"].get<double>(), 0.0);
    // The exact mode on MLX affine codes: the quantized kernels of the plan.
    EXPECT_EQ(row["kernels"].get<std::string>().rfind("quant_", 0), 0u) << row["kernels"];
  }
}

}  // namespace
}  // namespace moekit
