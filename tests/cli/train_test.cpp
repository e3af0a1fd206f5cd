// `moekit train`: a tiny run end to end (CSV, plots, a checkpoint that forward/inspect load),
// bit-identical resume, a collapsed router recovering under loss-free balancing, and every bad
// input a named error with nothing written. Each run takes about a second.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_cli.hpp"
#include "util/sanitizers.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;
using testing::slurp;

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moekit_train_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // 60 KB of real English text (the GPL's opening repeated would be too easy): generated
    // here so that the test does not depend on the machine's files.
    std::ostringstream text;
    const char* words[] = {"the",    "license", "program", "software", "you",   "may",  "copy",   "and",
                           "modify", "under",   "terms",   "of",       "this",  "work", "source", "code",
                           "free",   "to",      "any",     "version",  "other", "use",  "or",     "with"};
    std::uint64_t s = 12345;
    for (int i = 0; i < 12000; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      text << words[(s >> 33) % 24] << ((s >> 40) % 11 == 0 ? ".\n" : " ");
    }
    std::ofstream(dir_ / "text.txt") << text.str();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> tiny(std::vector<std::string> extra) const {
    std::vector<std::string> a = {"train",        "--data",    (dir_ / "text.txt").string(), "--dim", "16",
                                  "--experts",    "4",         "--top-k",                    "2",     "--expert-width",
                                  "16",           "--layers",  "2",                          "--batch-tokens", "256",
                                  "--seq-len",    "64",        "--eval-tokens",              "512",   "--threads",
                                  "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  testing::RunResult run(const std::vector<std::string>& args) const { return run_cli(args, dir_); }
  static bool have_matplotlib() { return std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0; }

  fs::path dir_;
};

std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream ls(line);
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    rows.push_back(cells);
  }
  return rows;
}

int column(const std::vector<std::string>& header, const std::string& name) {
  for (std::size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return static_cast<int>(i);
  ADD_FAILURE() << "no column " << name;
  return 0;
}

TEST_F(TrainCli, TinyRunWritesCsvPlotsAndALoadableCheckpoint) {
  const bool plots = have_matplotlib();
  if (!plots) std::printf("[ SKIPPED  ] the plots part: /usr/bin/python3 has no matplotlib\n");
  std::vector<std::string> extra = {"--steps", "30", "--eval-every", "10", "--csv", (dir_ / "m.csv").string(),
                                    "--save", (dir_ / "ck").string()};
  // --plot A/B creates A as well.
  if (plots) extra.insert(extra.end(), {"--plot", (dir_ / "out" / "plots").string()});
  const auto r = run(tiny(extra));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("done: 30 steps"), std::string::npos) << r.out;
  const auto rows = read_csv(dir_ / "m.csv");
  ASSERT_EQ(rows.size(), 31u);
  const auto& h = rows[0];
  for (const char* c : {"step", "tokens", "train_loss", "eval_loss", "eval_ppl", "maxvio_batch", "maxvio_global",
                        "dead_experts", "aux_loss", "z_loss", "lr", "bias_rate", "bias_min", "bias_max", "tokens_per_s",
                        "maxvio_batch_l0", "maxvio_batch_l1", "maxvio_global_l1"})
    column(h, c);
  const int eval = column(h, "eval_loss"), loss = column(h, "train_loss"), step = column(h, "step");
  for (std::size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), h.size()) << "row " << i;
    EXPECT_EQ(std::stoll(rows[i][step]), static_cast<long long>(i));
    EXPECT_TRUE(std::isfinite(std::stod(rows[i][loss])));
    EXPECT_EQ(rows[i][eval].empty(), i % 10 != 0) << "row " << i;  // evaluations at steps 10, 20, 30
  }
  EXPECT_LT(std::stod(rows[30][loss]), std::stod(rows[1][loss]) - 1.0);  // it learns
  // The saved blocks are an ordinary checkpoint.
  const auto ins = run({"inspect", "--model", (dir_ / "ck").string()});
  EXPECT_EQ(ins.exit_code, 0) << ins.err;
  EXPECT_NE(ins.out.find("family: deepseek_v3"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("MoE layers: 0-1"), std::string::npos) << ins.out;
  if (plots) {
    for (const char* png : {"loss.png", "maxvio.png", "load_l0.png", "load_l1.png", "bias.png"}) {
      const std::string bytes = slurp(dir_ / "out" / "plots" / png);
      EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << png;
    }
    EXPECT_EQ(read_csv(dir_ / "out" / "plots" / "load.csv").size(), 1u + 30u * 2u);
  }
}

TEST_F(TrainCli, ResumeIsBitIdentical) {
  const auto whole = run(tiny({"--steps", "20", "--eval-every", "5", "--csv", (dir_ / "a.csv").string(), "--save",
                               (dir_ / "a").string()}));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto first = run(tiny({"--steps", "20", "--eval-every", "5", "--stop-at", "10", "--csv",
                               (dir_ / "b.csv").string(), "--save", (dir_ / "b").string()}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // The flags of the run come back from the checkpoint; only outputs are given again.
  const auto rest = run({"train", "--resume", (dir_ / "b").string(), "--csv", (dir_ / "b.csv").string(), "--save",
                         (dir_ / "c").string(), "--threads", "1"});
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_NE(rest.out.find("resumed from"), std::string::npos) << rest.out;
  EXPECT_EQ(slurp(dir_ / "a" / "model.safetensors"), slurp(dir_ / "c" / "model.safetensors"));
  EXPECT_EQ(slurp(dir_ / "a" / "training_state.moekit").size(), slurp(dir_ / "c" / "training_state.moekit").size());
  const auto a = read_csv(dir_ / "a.csv"), b = read_csv(dir_ / "b.csv");
  ASSERT_EQ(a.size(), 21u);
  ASSERT_EQ(b.size(), 21u);
  const int tps = column(a[0], "tokens_per_s");
  for (std::size_t i = 1; i < a.size(); ++i)
    for (std::size_t c = 0; c < a[i].size(); ++c)
      if (static_cast<int>(c) != tps) {
        EXPECT_EQ(a[i][c], b[i][c]) << "row " << i << " column " << a[0][c];
      }
  // Model flags cannot change under --resume.
  const auto bad = run({"train", "--resume", (dir_ / "b").string(), "--dim", "32"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--dim cannot be given with --resume"), std::string::npos) << bad.err;
}

TEST_F(TrainCli, CollapsedRouterRecoversOnlyWithLossFreeBalancing) {
  // Two 150-step runs of the training code TinyRunWritesCsvPlotsAndALoadableCheckpoint runs on 2
  // threads, with loss-free balancing too; 90 s under TSan.
  if (testing::kThreadSanitizer || testing::kAddressSanitizer) GTEST_SKIP() << testing::kLongerTwinUnderSanitizers;
  const auto tail_maxvio = [&](const std::string& balance) {
    const fs::path csv = dir_ / (balance + ".csv");
    const auto r = run({"train", "--data", (dir_ / "text.txt").string(), "--dim", "32", "--experts", "8", "--top-k", "2",
                        "--expert-width", "16", "--layers", "1", "--steps", "150", "--batch-tokens", "1024",
                        "--seq-len", "128", "--eval-every", "0", "--eval-tokens", "512", "--init-collapsed",
                        "--balance", balance, "--bias-rate", "0.01", "--csv", csv.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto rows = read_csv(csv);
    const int c = column(rows[0], "maxvio_batch");
    double first = std::stod(rows[1][static_cast<std::size_t>(c)]), tail = 0;
    for (std::size_t i = rows.size() - 20; i < rows.size(); ++i) tail += std::stod(rows[i][static_cast<std::size_t>(c)]) / 20;
    EXPECT_GT(first, 2.0) << balance << ": the router starts collapsed (MaxVio 3 = all on K of 8)";
    return tail;
  };
  EXPECT_LE(tail_maxvio("loss_free_sign"), 0.3);
  EXPECT_GE(tail_maxvio("none"), 2.0);
}

TEST_F(TrainCli, BadInputsAreNamedErrorsWithNothingWritten) {
  std::ofstream(dir_ / "empty.txt").close();
  {
    std::ofstream bin(dir_ / "bin.dat", std::ios::binary);
    const char b[] = {'\x7f', 'E', 'L', 'F', 0, 1, 2, 3};
    bin.write(b, sizeof b);
  }
  std::ofstream(dir_ / "small.txt") << "far too little text for one batch\n";
  const std::string csv = (dir_ / "out.csv").string(), save = (dir_ / "out_ck").string();
  const auto expect_error = [&](std::vector<std::string> args, const std::string& message) {
    args.insert(args.end(), {"--csv", csv, "--save", save});
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 1) << message << "\n" << r.out;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("\n"), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_FALSE(fs::exists(csv)) << message;
    EXPECT_FALSE(fs::exists(save)) << message;
  };
  const std::string text = (dir_ / "text.txt").string();
  expect_error({"train", "--data", (dir_ / "empty.txt").string()}, "empty.txt' is empty");
  expect_error({"train", "--data", (dir_ / "bin.dat").string()}, "bin.dat' is binary");
  expect_error({"train", "--data", (dir_ / "missing").string()}, "missing' does not exist");
  expect_error({"train", "--data", (dir_ / "small.txt").string()}, "less than one batch");
  expect_error(tiny({"--family", "gpt5"}), "unknown family 'gpt5'");
  expect_error(tiny({"--family", "mixtral", "--shared", "1"}), "mixtral has no shared experts");
  expect_error(tiny({"--top-k", "9"}), "--top-k (9) exceeds --experts (4)");
  expect_error(tiny({"--balance", "magic"}), "unknown balance mode 'magic'");
  expect_error(tiny({"--optimizer", "lion"}), "--optimizer 'lion'");
  expect_error(tiny({"--micro-batches", "3"}), "cannot be split into micro_batches = 3");
  expect_error(tiny({"--lr", "-1"}), "lr -1");
  expect_error(tiny({"--family", "qwen3_moe", "--top-k", "1"}), "never get a gradient");
  expect_error({"train", "--resume", (dir_ / "nowhere").string()}, "no config.json there");
  expect_error(tiny({"--plot", (dir_ / "text.txt" / "plots").string()}), "text.txt' is not a folder");
  const auto r = run(tiny({"--csv", (dir_ / "no_such_dir" / "m.csv").string()}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
}

TEST_F(TrainCli, NonFiniteLossStopsNamingTheStepAndKeepsTheLastCheckpoint) {
  const fs::path ck = dir_ / "ck";
  const auto r = run(tiny({"--steps", "20", "--lr", "1e30", "--warmup", "0", "--clip", "0", "--save", ck.string(),
                           "--save-every", "1"}));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("step "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the last good checkpoint is"), std::string::npos) << r.err;
  // The checkpoint left behind is complete and loads.
  const auto ins = run({"inspect", "--model", ck.string()});
  EXPECT_EQ(ins.exit_code, 0) << ins.err;
}

}  // namespace
}  // namespace moekit
