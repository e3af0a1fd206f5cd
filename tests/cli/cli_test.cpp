// The `moekit` command line, run as a child process: outputs equal the in-process library bit
// for bit, and every failure is exit code 1, one "moekit: error: " line on stderr and no
// output file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_cli.hpp"
#include "io/safetensors_writer.hpp"
#include "moekit/moekit.hpp"
#include "util/compare.hpp"
#include "util/mlx_tiny_models.hpp"
#include "util/sanitizers.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using testing::SafetensorsEntry;
using testing::TempDir;

// A DeepSeek-V3-shaped checkpoint small enough to write in microseconds: layer 0 dense,
// layer 1 MoE with D = 8, E = 4 (2 groups of 2, 1 kept), K = 2, F = 4, one shared expert.
constexpr std::int64_t kD = 8, kE = 4, kK = 2, kF = 4;
constexpr const char* kConfig =
    R"({"model_type":"deepseek_v3","hidden_size":8,"intermediate_size":16,
  "moe_intermediate_size":4,"num_hidden_layers":2,"n_routed_experts":4,"num_experts_per_tok":2,
  "n_shared_experts":1,"routed_scaling_factor":2.5,"topk_method":"noaux_tc","n_group":2,"topk_group":1,
  "scoring_func":"sigmoid","norm_topk_prob":true,"first_k_dense_replace":1,"moe_layer_freq":1})";

// Deterministic values in [-scale, scale) (an LCG: no dependence on <random>'s distributions).
std::vector<float> values(std::int64_t n, std::uint32_t seed, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = (static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
  return v;
}

SafetensorsEntry f32_entry(const std::string& name, Shape shape, std::uint32_t seed, float scale) {
  return {name, "F32", shape, testing::to_bytes(values(shape_numel(shape), seed, scale))};
}

void write_tiny_checkpoint(const fs::path& dir) {
  std::vector<SafetensorsEntry> e;
  std::uint32_t seed = 1;
  for (const char* p : {"gate_proj", "up_proj"})
    e.push_back(
        f32_entry(std::string("model.layers.0.mlp.") + p + ".weight", {16, kD}, seed++, 0.3f));
  e.push_back(f32_entry("model.layers.0.mlp.down_proj.weight", {kD, 16}, seed++, 0.3f));
  const std::string b = "model.layers.1.mlp.";
  e.push_back(f32_entry(b + "gate.weight", {kE, kD}, seed++, 0.5f));
  e.push_back(f32_entry(b + "gate.e_score_correction_bias", {kE}, seed++, 0.05f));
  for (std::int64_t x = 0; x < kE; ++x) {
    const std::string p = b + "experts." + std::to_string(x) + ".";
    e.push_back(f32_entry(p + "gate_proj.weight", {kF, kD}, seed++, 0.4f));
    e.push_back(f32_entry(p + "up_proj.weight", {kF, kD}, seed++, 0.4f));
    e.push_back(f32_entry(p + "down_proj.weight", {kD, kF}, seed++, 0.5f));
  }
  e.push_back(f32_entry(b + "shared_experts.gate_proj.weight", {kF, kD}, seed++, 0.4f));
  e.push_back(f32_entry(b + "shared_experts.up_proj.weight", {kF, kD}, seed++, 0.4f));
  e.push_back(f32_entry(b + "shared_experts.down_proj.weight", {kD, kF}, seed++, 0.5f));
  testing::write_safetensors(dir / "model.safetensors", e);
  testing::write_text(dir / "config.json", kConfig);
}

using testing::RunResult;

// Runs the built binary with `args`, capturing through files in `scratch`.
RunResult run_cli(const std::vector<std::string>& args, const TempDir& scratch) {
  return testing::run_cli(args, scratch.path());
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Exit code 1 (not a signal), exactly one "moekit: error: " line, and nothing left in `dir`
// except the files that were there before.
void expect_clean_failure(const RunResult& r, const fs::path& dir,
                          const std::vector<std::string>& files_before) {
  EXPECT_TRUE(r.exited) << "killed by a signal";
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(starts_with(r.err, "moekit: error: ")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  std::vector<std::string> now;
  for (const auto& entry : fs::directory_iterator(dir))
    now.push_back(entry.path().filename().string());
  std::sort(now.begin(), now.end());
  EXPECT_EQ(now, files_before) << "an output (or a staged file) was left behind";
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = std::make_unique<TempDir>("cli_model");
    write_tiny_checkpoint(model_->path());
  }
  static void TearDownTestSuite() { model_.reset(); }

  void SetUp() override {
    // tests/CMakeLists.txt does not make moekit_tests depend on moekit_cli.
    ASSERT_TRUE(fs::exists(MOEKIT_CLI_PATH))
        << MOEKIT_CLI_PATH << " not built: build the moekit_cli target (or everything)";
    scratch_ = std::make_unique<TempDir>("cli_run");
  }

  std::string model() const { return model_->path().string(); }
  std::string file(const std::string& name) const { return scratch_->file(name); }
  const fs::path& dir() const { return scratch_->path(); }
  RunResult run(const std::vector<std::string>& args) const { return run_cli(args, *scratch_); }

  /// X [2, 3, D] written as f32 .npy; returns the tensor.
  Tensor write_input(const std::string& name, Shape shape = {2, 3, kD}) const {
    Tensor x = Tensor::from_f32(shape, values(shape_numel(shape), 99, 1.5f));
    write_npy(file(name), x);
    return x;
  }

  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir()))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  /// Runs `forward --output y.npy` with `extra` (and `--model` the tiny checkpoint unless `extra`
  /// names one), expecting a clean failure; returns stderr.
  std::string forward_fails(const std::vector<std::string>& extra) const {
    const auto before = listing();
    std::vector<std::string> args = {"forward", "--output", file("y.npy")};
    if (std::find(extra.begin(), extra.end(), "--model") == extra.end()) {
      args.push_back("--model");
      args.push_back(model());
    }
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run(args);
    expect_clean_failure(r, dir(), before);
    return r.err;
  }

  static std::unique_ptr<TempDir> model_;
  std::unique_ptr<TempDir> scratch_;
};

std::unique_ptr<TempDir> Cli::model_;

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST_F(Cli, DemoRunsAndPrintsMaxVio) {
  const RunResult r = run({"demo", "--tokens", "64", "--runs", "2", "--threads", "2"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("MaxVio"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum: sum(y) = "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bit-identical across runs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(2 threads)"), std::string::npos) << r.out;
}

TEST_F(Cli, DemoShowsLossFreeBalancingEvenTheLoad) {
  // The default demo: the code DemoRunsAndPrintsMaxVio runs on the same 2 threads, with more
  // tokens; 80 s under TSan.
  if (testing::kThreadSanitizer || testing::kAddressSanitizer) GTEST_SKIP() << testing::kLongerTwinUnderSanitizers;
  const RunResult r = run({"demo", "--runs", "1", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto maxvio_after = [&](const std::string& label) {
    const auto at = r.out.find(label);
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? -1.0 : std::stod(r.out.substr(r.out.find("(MaxVio ", at) + 8));
  };
  EXPECT_GT(maxvio_after("held-out load per expert before"), 2.0) << r.out;
  EXPECT_LT(maxvio_after("held-out load per expert after"), 0.5) << r.out;
}

TEST_F(Cli, DemoChecksumDoesNotDependOnThreads) {
  auto checksum = [](const std::string& out) {
    const auto at = out.find("checksum:");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('(', at) - at);
  };
  const RunResult one = run({"demo", "--tokens", "32", "--runs", "1", "--threads", "1"});
  const RunResult two = run({"demo", "--tokens", "32", "--runs", "1", "--threads", "2"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_FALSE(checksum(one.out).empty());
  EXPECT_EQ(checksum(one.out), checksum(two.out));
}

TEST_F(Cli, DemoRoutingOnlyPrintsEveryFamily) {
  const RunResult r = run({"demo", "--routing-only", "--tokens", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* family : {"DeepSeek-V3", "Mixtral", "GPT-OSS", "MiniMax-M2"})
    EXPECT_NE(r.out.find(family), std::string::npos) << family;
  EXPECT_NE(r.out.find("MaxVio"), std::string::npos);
}

TEST_F(Cli, ForwardMatchesInProcessBitForBit) {
  const Tensor x = write_input("x.npy");
  const RunResult r = run({"forward", "--model", model(), "--layer", "1", "--input", file("x.npy"),
                           "--output", file("y.npy"), "--ids-out", file("ids.npy"), "--weights-out",
                           file("w.npy"), "--threads", "1"});
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;

  const MoeLayer layer = load_moe_layer(model(), 1);
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  const Tensor y_cli = read_npy(file("y.npy"));
  const Tensor ids_cli = read_npy(file("ids.npy"));
  const Tensor w_cli = read_npy(file("w.npy"));
  EXPECT_EQ(y_cli.shape(), (Shape{2, 3, kD}));
  EXPECT_EQ(ids_cli.shape(), (Shape{2, 3, kK}));
  EXPECT_EQ(ids_cli.dtype(), DType::i32);
  EXPECT_EQ(w_cli.shape(), (Shape{2, 3, kK}));
  EXPECT_TRUE(same_bytes(y_cli, y));
  EXPECT_TRUE(same_bytes(ids_cli, info.routing.ids));
  EXPECT_TRUE(same_bytes(w_cli, info.routing.weights));
  EXPECT_EQ(listing(), (std::vector<std::string>{"ids.npy", "w.npy", "x.npy", "y.npy"}));
}

TEST_F(Cli, ForwardConvertsF16Input) {
  const Tensor x16 = to_dtype(write_input("unused.npy", {5, kD}), DType::f16);
  write_npy(file("x16.npy"), x16);
  const RunResult r = run({"forward", "--model", model(), "--layer", "1", "--input",
                           file("x16.npy"), "--output", file("y.npy")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor y = load_moe_layer(model(), 1).forward(to_dtype(x16, DType::f32));
  EXPECT_TRUE(same_bytes(read_npy(file("y.npy")), y));
}

TEST_F(Cli, ForwardMissingModelDirFails) {
  write_input("x.npy");
  forward_fails(
      {"--model", (dir() / "no_such_model").string(), "--layer", "1", "--input", file("x.npy")});
}

TEST_F(Cli, ForwardDenseLayerFails) {
  write_input("x.npy");
  const std::string err = forward_fails({"--layer", "0", "--input", file("x.npy")});
  EXPECT_NE(err.find("dense"), std::string::npos) << err;
}

TEST_F(Cli, ForwardLayerOutOfRangeFails) {
  write_input("x.npy");
  forward_fails({"--layer", "2", "--input", file("x.npy")});
}

TEST_F(Cli, ForwardWrongHiddenSizeNamesBoth) {
  write_input("x.npy", {3, kD - 1});
  const std::string err = forward_fails({"--layer", "1", "--input", file("x.npy")});
  EXPECT_NE(err.find("D = 7"), std::string::npos) << err;
  EXPECT_NE(err.find("D = 8"), std::string::npos) << err;
}

TEST_F(Cli, ForwardNanInputNamesTheIndex) {
  std::vector<float> v = values(2 * 3 * kD, 5, 1.0f);
  v[(1 * 3 + 2) * kD + 4] = std::numeric_limits<float>::quiet_NaN();
  v[(1 * 3 + 2) * kD + 6] = std::numeric_limits<float>::infinity();
  write_npy(file("x.npy"), Tensor::from_f32({2, 3, kD}, v));
  const std::string err = forward_fails({"--layer", "1", "--input", file("x.npy")});
  EXPECT_NE(err.find("[1, 2, 4]"), std::string::npos) << err;
}

TEST_F(Cli, ForwardInt32InputFails) {
  write_npy(file("x.npy"), Tensor::from_i32({2, kD}, std::vector<std::int32_t>(2 * kD, 1)));
  const std::string err = forward_fails({"--layer", "1", "--input", file("x.npy")});
  EXPECT_NE(err.find("i32"), std::string::npos) << err;
}

TEST_F(Cli, ForwardUnreadableInputFails) {
  testing::write_text(dir() / "x.npy", "this is not an npy file");
  forward_fails({"--layer", "1", "--input", file("x.npy")});
  forward_fails({"--layer", "1", "--input", file("missing.npy")});
}

TEST_F(Cli, ForwardOutputIntoMissingDirectoryFails) {
  write_input("x.npy");
  const auto before = listing();
  const RunResult r = run({"forward", "--model", model(), "--layer", "1", "--input", file("x.npy"),
                           "--output", (dir() / "no_such_dir" / "y.npy").string()});
  expect_clean_failure(r, dir(), before);
}

TEST_F(Cli, ForwardFailingSecondOutputLeavesNoFirstOutput) {
  write_input("x.npy");
  const std::string err = forward_fails({"--layer", "1", "--input", file("x.npy"), "--ids-out",
                                         (dir() / "nope" / "ids.npy").string()});
  EXPECT_NE(err.find("--ids-out"), std::string::npos) << err;
  // The same output path twice would overwrite one with the other.
  forward_fails({"--layer", "1", "--input", file("x.npy"), "--weights-out", file("y.npy")});
}

TEST_F(Cli, InspectPrintsFamilyAndMoeLayers) {
  const RunResult r = run({"inspect", "--model", model()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line :
       {"family: deepseek_v3\n", "layers: 2\n", "MoE layers: 1\n", "dense layers: 0\n", "D: 8 ", "E: 4 ", "K: 2 ",
        "F: 4 ", "routing: E=4 K=2 score=sigmoid", "shared experts: width 4, not gated", "expert body: swiglu",
        "layer 1:", "layout: per_expert",
        // The kernel plan: f32 weights read in place run the dot product in
        // every row count; no int8 or bf16 lines for f32 weights.
        "kernel plan, routed experts", "    exact up: dot/", "    exact down: dot/"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_NE(r.out.find(std::to_string(3 * kE * kF * kD * 4) + " bytes"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("int8 up:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("bf16 up:"), std::string::npos) << r.out;
}

TEST_F(Cli, InspectDenseLayerFails) {
  const RunResult r = run({"inspect", "--model", model(), "--layer", "0"});
  expect_clean_failure(r, dir(), listing());
  EXPECT_NE(r.err.find("dense"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// A command line that does not parse is an error like any other: exit 1, one "moekit: error: "
// line (every kind, for every subcommand: cli_errors_test.cpp); `moekit` alone exits 1 too.
TEST_F(Cli, ParseErrorsAreOneErrorLineAndExitOne) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"no_such_command"},
           {"forward", "--model", model()},
           {"demo", "--threads", "-1"},
           {"forward", "--model", model(), "--layer", "x", "--input", "a", "--output", "b"}}) {
    const RunResult r = run(args);
    EXPECT_TRUE(r.exited);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_TRUE(starts_with(r.err, "moekit: error: ")) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  EXPECT_EQ(run({}).exit_code, 1);
  const RunResult help = run({"forward", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--ids-out"), std::string::npos);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// `--router` reproduces mlx-lm's DeepSeek-V3 quirks on the golden that mlx-lm produced
// (deepseek_v3_k1_mlx: no renorm at K = 1, legacy 0.0 mask); without it the weights differ.
TEST_F(Cli, ForwardRouterKnobsReproduceTheMlxGolden) {
  const std::string golden = std::string(MOEKIT_TEST_DATA_DIR) + "/layers/deepseek_v3_k1_mlx";
  const std::vector<std::string> base = {"forward", "--model", golden, "--layer", "1", "--input",
                                         golden + "/input.npy", "--output", file("y.npy")};
  std::vector<std::string> with_knobs = base;
  for (const char* kv : {"mask_fill=legacy_zero", "renorm=sum", "renorm_only_if_k_gt_1=true"}) {
    with_knobs.push_back("--router");
    with_knobs.push_back(kv);
  }
  const RunResult r = run(with_knobs);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Tensor y = read_npy(file("y.npy")), y_ref = read_npy(golden + "/output.npy");
  const testing::MaxDiff d = testing::max_diff(y, y_ref);
  EXPECT_LE(d.err, 1e-4 * d.ref);

  ASSERT_EQ(run(base).exit_code, 0);
  const Tensor y_plain = read_npy(file("y.npy"));
  EXPECT_FALSE(same_bytes(y_plain, y)) << "the knobs must change the result";

  std::vector<std::string> bad = base;
  bad.insert(bad.end(), {"--router", "mask_fill=zero"});
  const RunResult rb = run(bad);
  EXPECT_EQ(rb.exit_code, 1);
  EXPECT_NE(rb.err.find("mask_fill = 'zero' (accepted: neg_inf, legacy_zero)"), std::string::npos) << rb.err;
  bad = base;
  bad.insert(bad.end(), {"--router", "renorm"});
  EXPECT_NE(run(bad).err.find("--router expects KEY=VALUE"), std::string::npos);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

TEST_F(Cli, QuantizeWritesAnMlxFolderForwardLoads) {
  const nlohmann::json c = testing::case_named("qwen3_moe_q4_g64");
  const fs::path src = fs::path(dir()) / "hf";
  fs::create_directories(src);
  testing::write_source(c, src);
  testing::write_text(src / "tokenizer.json", "{}");
  const std::string out = file("q4");
  const RunResult r = run({"quantize", "--model", src.string(), "--out", out, "--bits", "4", "--group-size", "64",
                           "--error", file("err.csv")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tensors quantized"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(out) / "tokenizer.json"));
  const std::string csv = testing::slurp(file("err.csv"));
  EXPECT_EQ(csv.rfind("tensor,shape,bits,group_size,", 0), 0u) << csv;
  EXPECT_NE(csv.find("model.layers.1.mlp.gate.weight,4x128,8,64,"), std::string::npos) << csv;
  // moekit forward reads what moekit quantize wrote, and matches mlx-lm's module.
  const std::string gdir = testing::kQuantizeDir + "/qwen3_moe_q4_g64";
  const RunResult f = run({"forward", "--model", out, "--layer", "1", "--input", gdir + "/input.npy", "--output",
                           file("y.npy")});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const Tensor y = read_npy(file("y.npy")), want = read_npy(gdir + "/output.npy");
  const testing::MaxDiff d = testing::max_diff(y, want);
  EXPECT_LE(d.err, 1e-5 * d.ref);
}

TEST_F(Cli, QuantizeFailuresAreOneLineAndLeaveNothing) {
  const auto before = listing();
  RunResult r = run({"quantize", "--model", file("missing"), "--out", file("q"), "--bits", "4"});
  expect_clean_failure(r, dir(), before);
  EXPECT_NE(r.err.find("is not a folder"), std::string::npos) << r.err;
  r = run({"quantize", "--model", model(), "--out", file("q"), "--bits", "7"});
  expect_clean_failure(r, dir(), before);
  EXPECT_NE(r.err.find("bits 7"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

TEST_F(Cli, ForwardInt8KeepsTheRoutingOfTheExactRun) {
  const std::string dir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_q4_g64_bf16";
  const RunResult a = run({"forward", "--model", dir, "--layer", "1", "--input", dir + "/input.npy", "--output",
                           file("y.npy"), "--ids-out", file("ids.npy")});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const RunResult b = run({"forward", "--model", dir, "--layer", "1", "--input", dir + "/input.npy", "--output",
                           file("y8.npy"), "--ids-out", file("ids8.npy"), "--int8"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const Tensor ids = read_npy(file("ids.npy")), ids8 = read_npy(file("ids8.npy"));
  EXPECT_TRUE(same_bytes(ids, ids8));
  const Tensor y = read_npy(file("y.npy")), y8 = read_npy(file("y8.npy"));
  EXPECT_FALSE(same_bytes(y, y8)) << "the fast mode ran";
  EXPECT_LT(testing::relative_rms(y8, y), 2e-2);
}

}  // namespace
}  // namespace moekit
