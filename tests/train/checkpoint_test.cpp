// Training checkpoints: save -> load -> forward is bit-identical for every layout; resuming
// continues an uninterrupted run bit for bit; failed saves keep the last good checkpoint;
// truncated or foreign state files are named errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moekit/checkpoint.hpp"
#include "moekit/npy.hpp"
#include "util/random.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
const std::string kGoldens = std::string(MOEKIT_TEST_DATA_DIR) + "/layers";

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& name) : path(fs::temp_directory_path() / name) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// One training step of `layer` (computing on `p`) on batch `step` of a fixed stream.
void train_step(const MoeLayer& layer, MoeTensors& p, Optimizer& opt, LoadBalancer& lb, Tensor& bias,
                std::int64_t step) {
  std::mt19937 rng(static_cast<unsigned>(1000 + step));
  const std::int64_t D = layer.config().hidden_size;
  const Tensor x = testing::randn({24, D}, rng), dy = testing::randn({24, D}, rng);
  SavedForward saved;
  layer.forward_train(x, saved);
  lb.count(saved);
  MoeTensors g;
  backward(layer, saved, dy, g);
  clip_grad_norm({&g}, 1.0);
  opt.step(p, g, 1e-3);
  if (bias.numel() > 0) lb.update(bias, step);
}

TEST(Checkpoint, SaveLoadForwardIsBitIdenticalForEveryLayout) {
  TmpDir tmp("moekit_ckpt_layouts");
  for (const char* name : {"deepseek_v3", "qwen3_moe_fused", "gpt_oss", "llama4_text", "mixtral",
                           "qwen3_moe_switch_mlp", "qwen2_moe"}) {
    SCOPED_TRACE(name);
    const std::string src = kGoldens + "/" + name;
    const MoeConfig cfg = load_hf_config(src);
    std::int64_t L = -1;
    const nlohmann::json manifest = nlohmann::json::parse(slurp(kGoldens + "/manifest.json"));
    for (const auto& c : manifest["cases"])
      if (c["name"].get<std::string>() == name) L = c["layer"].get<std::int64_t>();
    const MoeLayer loaded = load_moe_layer(src, cfg, L);
    MoeTensors p = trainable_parameters(loaded);
    Tensor bias = loaded.weights().selection_bias.numel() ? loaded.weights().selection_bias.clone() : Tensor();
    const MoeLayer layer = make_trainable_layer(cfg, p, bias);
    Optimizer opt = Optimizer::adamw();
    LoadBalancer lb(cfg.router.num_experts, BalanceRule::sign, RateSchedule{});
    train_step(layer, p, opt, lb, bias, 0);  // moved away from the file's values
    const std::string dir = (tmp.path / name).string();
    save_block_checkpoint(dir, slurp(src + "/config.json"), cfg, stored_layout(loaded), p, bias);
    const MoeLayer back = load_moe_layer(dir, cfg, L);
    const Tensor x = read_npy(src + "/input.npy");
    EXPECT_TRUE(same_bits(back.forward(x), layer.forward(x)));
    EXPECT_EQ(back.weights().layout, loaded.weights().layout);
  }
}

TEST(Checkpoint, ResumeIsBitIdenticalToAnUninterruptedRun) {
  TmpDir tmp("moekit_ckpt_resume");
  const std::string src = kGoldens + "/deepseek_v3";  // sigmoid + groups + selection bias + shared expert
  const MoeConfig cfg = load_hf_config(src);
  const MoeLayer loaded = load_moe_layer(src, cfg, 1);
  const auto run = [&](std::int64_t from, std::int64_t to, MoeTensors& p, Optimizer& opt, LoadBalancer& lb,
                       Tensor& bias) {
    const MoeLayer layer = make_trainable_layer(cfg, p, bias);
    for (std::int64_t s = from; s < to; ++s) train_step(layer, p, opt, lb, bias, s);
  };
  // Uninterrupted: 6 steps.
  MoeTensors pa = trainable_parameters(loaded);
  Tensor ba = loaded.weights().selection_bias.clone();
  Optimizer oa = Optimizer::adamw();
  LoadBalancer la(cfg.router.num_experts, BalanceRule::proportional, RateSchedule{});
  run(0, 6, pa, oa, la, ba);
  // Interrupted at 3, saved, loaded into fresh objects, continued.
  MoeTensors pb = trainable_parameters(loaded);
  Tensor bb = loaded.weights().selection_bias.clone();
  Optimizer ob = Optimizer::adamw();
  LoadBalancer lbb(cfg.router.num_experts, BalanceRule::proportional, RateSchedule{});
  run(0, 3, pb, ob, lbb, bb);
  const std::string dir = (tmp.path / "step3").string();
  BlockTrainingState ts{&ob, &lbb, bb, {3, 0x1234567890abcdefull, R"({"data_offset": 72})"}};
  save_block_checkpoint(dir, slurp(src + "/config.json"), cfg, stored_layout(loaded), pb, bb, &ts);
  const MoeLayer reloaded = load_moe_layer(dir, cfg, 1);
  MoeTensors pc = trainable_parameters(reloaded);
  Optimizer oc = Optimizer::adamw();
  LoadBalancer lc(cfg.router.num_experts, BalanceRule::proportional, RateSchedule{});
  Tensor bc;
  TrainingState st;
  load_training_state(dir, pc, oc, &lc, bc, st);
  EXPECT_EQ(st.step, 3);
  EXPECT_EQ(st.rng_state, 0x1234567890abcdefull);
  EXPECT_EQ(st.user_json, R"({"data_offset": 72})");
  EXPECT_EQ(oc.steps(), 3);
  ASSERT_TRUE(same_bits(bc, bb));
  run(3, 6, pc, oc, lc, bc);
  for (const auto& [a, c] : {std::pair{&pa.router, &pc.router}, std::pair{&pa.up, &pc.up},
                             std::pair{&pa.down, &pc.down}, std::pair{&pa.shared_gate_proj, &pc.shared_gate_proj}})
    EXPECT_TRUE(same_bits(*a, *c));
  EXPECT_TRUE(same_bits(ba, bc));
}

TEST(Checkpoint, FailedSaveKeepsTheLastGoodOne) {
  TmpDir tmp("moekit_ckpt_atomic");
  const std::string src = kGoldens + "/olmoe";
  const MoeConfig cfg = load_hf_config(src);
  const MoeLayer loaded = load_moe_layer(src, cfg, 1);
  MoeTensors p = trainable_parameters(loaded);
  const std::string dir = (tmp.path / "ckpt").string();
  save_block_checkpoint(dir, slurp(src + "/config.json"), cfg, stored_layout(loaded), p, Tensor());
  const std::string before = slurp(dir + "/model.safetensors");
  Optimizer opt = Optimizer::adamw();
  BlockTrainingState bad{&opt, nullptr, Tensor(), {1, 0, "{not json"}};
  EXPECT_THROW(save_block_checkpoint(dir, "{}", cfg, stored_layout(loaded), p, Tensor(), &bad), std::invalid_argument);
  MoeTensors wrong = p;
  wrong.up = Tensor({2, 2}, DType::f32);
  EXPECT_THROW(save_block_checkpoint(dir, "{}", cfg, stored_layout(loaded), wrong, Tensor()), std::invalid_argument);
  EXPECT_EQ(slurp(dir + "/model.safetensors"), before);
  EXPECT_FALSE(fs::exists(dir + ".partial"));
  EXPECT_FALSE(fs::exists(dir + ".old"));
  // A second good save replaces the first and leaves nothing beside it.
  save_block_checkpoint(dir, slurp(src + "/config.json"), cfg, stored_layout(loaded), p, Tensor());
  EXPECT_FALSE(fs::exists(dir + ".old"));
  EXPECT_NO_THROW(load_moe_layer(dir, cfg, 1));
}

TEST(Checkpoint, TruncatedOrForeignStateIsANamedError) {
  TmpDir tmp("moekit_ckpt_state_errors");
  const std::string src = kGoldens + "/olmoe";
  const MoeConfig cfg = load_hf_config(src);
  const MoeLayer loaded = load_moe_layer(src, cfg, 1);
  MoeTensors p = trainable_parameters(loaded);
  Optimizer opt = Optimizer::sgd();
  MoeTensors g = MoeTensors::zeros_like(loaded);
  opt.step(p, g, 0.1);
  const std::string dir = (tmp.path / "ckpt").string();
  BlockTrainingState ts{&opt, nullptr, Tensor(), {}};
  save_block_checkpoint(dir, slurp(src + "/config.json"), cfg, stored_layout(loaded), p, Tensor(), &ts);
  const std::string state = dir + "/" + kTrainingStateFile;
  Tensor bias;
  TrainingState st;
  const auto expect = [&](Optimizer o, const std::string& needle) {
    try {
      load_training_state(dir, p, o, nullptr, bias, st);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect(Optimizer::adamw(), "saved with optimizer 'sgd'");
  const std::string bytes = slurp(state);
  {
    std::ofstream out(state, std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() / 2);
  }
  expect(Optimizer::sgd(), state);  // truncated: the safetensors reader names the file
  fs::copy_file(dir + "/model.safetensors", state, fs::copy_options::overwrite_existing);
  expect(Optimizer::sgd(), "not a moekit training state");
  fs::remove(state);
  expect(Optimizer::sgd(), "does not exist");
}

}  // namespace
}  // namespace moekit
