// Conformance of the backward: every family's whole MoE block, loaded from a checkpoint folder
// moekit has never seen, against torch autograd of the Hugging Face-style module
// (tools/gen_grad_goldens.py), gradients compared under the checkpoint's own tensor names and
// layouts; and `moekit backward` writing the same file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/run_cli.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "util/golden_knobs.hpp"
#include "moekit/train.hpp"

namespace moekit {
namespace {

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/layers";
// The bar: ≤ 1e-4 relative per tensor (max|g − g_ref| ≤ 1e-4 · max|g_ref|).
constexpr double kTolerance = 1e-4;

nlohmann::json manifest() {
  std::ifstream in(kDir + "/manifest.json");
  return nlohmann::json::parse(in);
}

using testing::apply_overrides;

// f32 contents of a (possibly unaligned) mapped tensor.
std::vector<float> floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& info = f.info(name);
  std::int64_t n = 1;
  for (auto d : info.shape) n *= d;
  std::vector<float> v(static_cast<std::size_t>(n));
  std::memcpy(v.data(), f.bytes(name), v.size() * 4);
  return v;
}

// Every tensor of `got` against the golden file: the same names, shapes, and values within the
// tolerance.
void expect_matches(const std::vector<std::pair<std::string, Tensor>>& got, const SafetensorsFile& ref) {
  std::set<std::string> want_names;
  for (const std::string& n : ref.names()) want_names.insert(n);
  std::set<std::string> got_names;
  for (const auto& [name, t] : got) {
    got_names.insert(name);
    if (!ref.contains(name)) continue;
    SCOPED_TRACE(name);
    ASSERT_EQ(t.shape(), ref.info(name).shape);
    const std::vector<float> want = floats(ref, name);
    double err = 0, mx = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(t.data_as<const float>()[i]) - want[i]));
      mx = std::max(mx, std::fabs(static_cast<double>(want[i])));
    }
    // An expert no token chose has an all-zero golden: moekit's must be exactly zero too.
    EXPECT_LE(err, kTolerance * mx) << "max err " << err << " of max " << mx;
    if (std::getenv("MOEKIT_PRINT_ERRORS")) std::printf("%s %.3g\n", name.c_str(), mx > 0 ? err / mx : err);
  }
  EXPECT_EQ(got_names, want_names);
}

TEST(GradGolden, EveryFamilyMatchesTorchAutograd) {
  const nlohmann::json m = manifest();
  ASSERT_GE(m["cases"].size(), 10u);
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"], dir = kDir + "/" + c["dir"].get<std::string>();
    SCOPED_TRACE(name);
    MoeConfig cfg = load_hf_config(dir);
    apply_overrides(cfg.router, c["overrides"]);
    const MoeLayer layer = load_moe_layer(dir, cfg, c["layer"].get<std::int64_t>());
    const Tensor x = read_npy(dir + "/input.npy");
    const Tensor dy = read_npy(dir + "/grad/grad_output.npy");
    const auto ref = SafetensorsFile::open(dir + "/grad/grads.safetensors");
    for (const bool keep : {true, false}) {
      SCOPED_TRACE(keep ? "pre-activations kept" : "recomputed");
      SavedForward saved;
      layer.forward_train(x, saved, keep);
      MoeTensors g;
      const Tensor dx = backward(layer, saved, dy, g);
      std::vector<std::pair<std::string, Tensor>> got = stored_tensors(cfg, stored_layout(layer), g);
      got.emplace_back("dx", dx);
      expect_matches(got, *ref);
    }
  }
}

TEST(GradGolden, BackwardCommandWritesTheSameFile) {
  const nlohmann::json m = manifest();
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "moekit_backward_cli";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"], dir = kDir + "/" + c["dir"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string out = (tmp / (name + ".safetensors")).string();
    std::vector<std::string> args = {"backward", "--model", dir, "--layer", std::to_string(c["layer"].get<int>()),
                                     "--input", dir + "/input.npy", "--grad-output", dir + "/grad/grad_output.npy",
                                     "--output", out};
    for (const auto& [key, v] : c["overrides"].items()) {
      args.push_back("--router");
      args.push_back(key + "=" + (v.is_string() ? v.get<std::string>() : v.dump()));
    }
    const testing::RunResult r = testing::run_cli(args, tmp);
    ASSERT_TRUE(r.exited && r.exit_code == 0) << r.err;
    const auto got_file = SafetensorsFile::open(out);
    std::vector<std::pair<std::string, Tensor>> got;
    for (const std::string& n : got_file->names()) {
      const std::vector<float> v = floats(*got_file, n);
      got.emplace_back(n, Tensor::from_f32(got_file->info(n).shape, v));
    }
    expect_matches(got, *SafetensorsFile::open(dir + "/grad/grads.safetensors"));
  }
  std::filesystem::remove_all(tmp);
}

TEST(GradGolden, BackwardCommandErrors) {
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "moekit_backward_cli_errors";
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  const std::string dir = kDir + "/olmoe";
  const std::string out = (tmp / "g.safetensors").string();
  Tensor wrong({3, 5}, DType::f32);
  write_npy((tmp / "wrong.npy").string(), wrong);
  const auto run = [&](const std::string& x, const std::string& dy, const std::string& o) {
    return testing::run_cli({"backward", "--model", dir, "--layer", "1", "--input", x, "--grad-output", dy, "--output", o},
                            tmp);
  };
  testing::RunResult r = run(dir + "/input.npy", (tmp / "wrong.npy").string(), out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("grad-output"), std::string::npos) << r.err;
  Tensor x = read_npy(dir + "/input.npy");
  Tensor short_dy({x.dim(0) - 1, x.dim(1)}, DType::f32);
  write_npy((tmp / "short.npy").string(), short_dy);
  r = run(dir + "/input.npy", (tmp / "short.npy").string(), out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("shaped like x"), std::string::npos) << r.err;
  r = run(dir + "/input.npy", dir + "/grad/grad_output.npy", (tmp / "missing" / "g.safetensors").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written on any failure
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace moekit
