// MLX affine-quantized checkpoints through load_moe_layer and MoeLayer::forward.
//
// The exactness contract (docs/numerics.md): with f32 activations the quantized forward equals
// the f32 forward on the materialised dequantized weights bit for bit — router logits, routing
// and y. Checked on every golden folder (every family, every stored layout): each Linear weight
// of the block whose input dimension the group size divides (router, routed experts, shared
// experts, shared gate) is quantized with bits rotating over 2-8 per projection, written as
// mlx-lm writes it, and compared against a float twin holding the dequantized values. Then the
// named errors for broken quantized files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <cctype>
#include <set>

#include "layer/checkpoint_builder.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/safetensors.hpp"
#include "util/affine.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

using testing::CheckpointBuilder;
using testing::TempDir;

const std::string kGoldens = std::string(MOEKIT_TEST_DATA_DIR) + "/layers";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string block_of(const MoeConfig& c, std::int64_t layer) {
  std::string b = c.names.block;
  b.replace(b.find("{L}"), 3, std::to_string(layer));
  return b;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Bits for a projection: the same for every expert of one projection (experts of a module share
// a format), different across projections.
int bits_for(const std::string& tensor) {
  // The name with expert indices (".<digits>.") replaced by ".*.".
  std::string kind;
  for (std::size_t i = 0; i < tensor.size(); ++i) {
    std::size_t j = i + 1;
    while (tensor[i] == '.' && j < tensor.size() && std::isdigit(static_cast<unsigned char>(tensor[j]))) ++j;
    if (tensor[i] == '.' && j > i + 1 && j < tensor.size() && tensor[j] == '.') {
      kind.push_back('.');
      kind.push_back('*');
      i = j - 1;
    } else {
      kind += tensor[i];
    }
  }
  static const int kBits[] = {4, 8, 2, 3, 5, 6};
  std::size_t h = 0;
  for (char ch : kind) h = h * 31 + static_cast<unsigned char>(ch);
  return kBits[h % 6];
}

struct Twins {
  int quantized_modules = 0;
  std::set<int> bits_used;
};

// Writes `qdir` (quantized as mlx-lm writes it) and `fdir` (the dequantized weights as f32).
Twins write_twins(const std::string& golden, std::int64_t layer, int group, DType scale_dtype,
                  const std::filesystem::path& qdir, const std::filesystem::path& fdir) {
  const std::string dir = kGoldens + "/" + golden;
  nlohmann::json config = read_json(dir + "/config.json");
  const MoeConfig cfg = load_hf_config(dir);
  const std::string block = block_of(cfg, layer);
  const auto ckpt = Checkpoint::open(dir);
  nlohmann::json quant = {{"group_size", group}, {"bits", 4}, {"mode", "affine"}};
  CheckpointBuilder q(config), f(config);
  Twins twins;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo& info = ckpt->info(name);
    const bool in_block = name.find(block + ".") != std::string::npos;
    const bool linear = in_block && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
                        (info.shape.size() == 2 || info.shape.size() == 3) && info.dtype &&
                        (*info.dtype == DType::f32 || *info.dtype == DType::bf16 || *info.dtype == DType::f16);
    if (!linear || info.shape.back() % group != 0) {
      q.add_from(*ckpt, [&](const std::string& n) { return n == name; });
      f.add_from(*ckpt, [&](const std::string& n) { return n == name; });
      continue;
    }
    const Tensor w = to_dtype(ckpt->view(name), DType::f32);
    const std::string module = name.substr(0, name.size() - 7);
    const int bits = bits_for(name);
    const testing::Quantized qw = testing::quantize_affine(w, bits, group, scale_dtype);
    q.add(name, qw.codes);
    q.add(module + ".scales", qw.scales);
    q.add(module + ".biases", qw.biases);
    f.add(name, qw.dequantized);
    if (bits != 4) quant[module] = {{"group_size", group}, {"bits", bits}};
    ++twins.quantized_modules;
    twins.bits_used.insert(bits);
  }
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  q.config() = config;
  q.write(qdir);
  f.write(fdir);
  return twins;
}

struct Case {
  const char* golden;
  std::int64_t layer;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.golden; }

class QuantizedGolden : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedGolden, ForwardEqualsDequantizedFloatForwardBitwise) {
  const Case c = GetParam();
  for (DType sdt : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_name(sdt));
    TempDir tq("quant_q"), tf("quant_f");
    const Twins t = write_twins(c.golden, c.layer, 32, sdt, tq.path(), tf.path());
    ASSERT_GT(t.quantized_modules, 0) << "nothing to quantize in " << c.golden;
    const MoeLayer ql = load_moe_layer(tq.path().string(), c.layer);
    const MoeLayer fl = load_moe_layer(tf.path().string(), c.layer);
    EXPECT_TRUE(ql.weights().experts.up.quantized() || ql.weights().router_quantized.defined());
    const Tensor x = read_npy(kGoldens + "/" + c.golden + "/input.npy");
    ForwardInfo qi, fi;
    const Tensor yq = ql.forward(x, &qi), yf = fl.forward(x, &fi);
    EXPECT_TRUE(same_bits(qi.logits, fi.logits)) << "router logits";
    EXPECT_TRUE(same_bits(qi.routing.ids, fi.routing.ids)) << "ids";
    EXPECT_TRUE(same_bits(qi.routing.weights, fi.routing.weights)) << "weights";
    EXPECT_TRUE(same_bits(yq, yf)) << "y";
    // A single token gives the bits it has inside the batch (decode path vs prefill path).
    const std::int64_t D = x.dim(-1);
    const Tensor x0 = Tensor::from_f32({1, D}, std::vector<float>(x.data_as<const float>(), x.data_as<const float>() + D));
    const Tensor y0 = ql.forward(x0);
    EXPECT_EQ(std::memcmp(y0.data(), yq.data(), static_cast<std::size_t>(D) * 4), 0) << "token 0 alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, QuantizedGolden,
                         // Every golden whose D the smallest group size (32) divides; the others
                         // (D = 40, 48) have nothing mlx-lm would quantize at these sizes.
                         ::testing::Values(Case{"deepseek_v3", 1}, Case{"deepseek_v2", 1}, Case{"qwen3_moe_fused", 3},
                                           Case{"olmoe", 1}, Case{"glm4_moe_sharded", 2}, Case{"gpt_oss", 1},
                                           Case{"minimax_m2", 1}, Case{"qwen3_moe_switch_mlp", 1},
                                           Case{"deepseek_v3_k1_mlx", 1}),
                         [](const auto& p) { return std::string(p.param.golden); });

// A hand-built Qwen-style block where every projection is quantizable (D = 64, F = 32, shared
// expert of 32 and a shared gate): mixed recipe with down at 8 bits, router at 8 bits group 64.
constexpr std::int64_t kE = 4, kD = 64, kF = 32;
const std::string kBlock = "model.layers.0.mlp";

nlohmann::json qwen2_config() {
  return {{"model_type", "qwen2_moe"},
          {"hidden_size", kD},
          {"moe_intermediate_size", kF},
          {"shared_expert_intermediate_size", kF},
          {"intermediate_size", 128},
          {"num_hidden_layers", 1},
          {"num_experts", kE},
          {"num_experts_per_tok", 2},
          {"norm_topk_prob", false},
          {"decoder_sparse_step", 1},
          {"hidden_act", "silu"},
          {"quantization", {{"group_size", 32}, {"bits", 4}, {"mode", "affine"},
                            {kBlock + ".gate", {{"group_size", 64}, {"bits", 8}}},
                            {kBlock + ".switch_mlp.down_proj", {{"group_size", 32}, {"bits", 8}}}}}};
}

struct Built {
  CheckpointBuilder q{qwen2_config()}, f{qwen2_config()};
  void quantized(const std::string& module, Shape shape, int bits, int group, std::uint64_t seed) {
    const Tensor w = testing::random_f32(std::move(shape), seed, 0.2f);
    const testing::Quantized qw = testing::quantize_affine(w, bits, group, DType::bf16);
    q.add(module + ".weight", qw.codes);
    q.add(module + ".scales", qw.scales);
    q.add(module + ".biases", qw.biases);
    f.add(module + ".weight", qw.dequantized);
  }
};

Built qwen2_block() {
  Built b;
  b.quantized(kBlock + ".gate", {kE, kD}, 8, 64, 1);
  b.quantized(kBlock + ".switch_mlp.gate_proj", {kE, kF, kD}, 4, 32, 2);
  b.quantized(kBlock + ".switch_mlp.up_proj", {kE, kF, kD}, 4, 32, 3);
  b.quantized(kBlock + ".switch_mlp.down_proj", {kE, kD, kF}, 8, 32, 4);
  b.quantized(kBlock + ".shared_expert.gate_proj", {kF, kD}, 4, 32, 5);
  b.quantized(kBlock + ".shared_expert.up_proj", {kF, kD}, 4, 32, 6);
  b.quantized(kBlock + ".shared_expert.down_proj", {kD, kF}, 4, 32, 7);
  b.quantized(kBlock + ".shared_expert_gate", {1, kD}, 4, 32, 8);
  return b;
}

TEST(QuantizedLayer, EveryProjectionQuantizedMixedRecipe) {
  Built b = qwen2_block();
  TempDir tq("q2q"), tf("q2f");
  b.q.write(tq.path());
  b.f.config().erase("quantization");
  b.f.write(tf.path());
  const MoeLayer ql = load_moe_layer(tq.path().string(), 0), fl = load_moe_layer(tf.path().string(), 0);
  const MoeWeights& w = ql.weights();
  EXPECT_TRUE(w.router_quantized.defined());
  EXPECT_EQ(w.router_quantized.format.bits, 8);
  EXPECT_EQ(w.router_quantized.format.block_cols, 64);
  EXPECT_EQ(w.experts.down.format.bits, 8);
  EXPECT_EQ(w.experts.up.format.bits, 4);
  EXPECT_TRUE(w.shared.down.quantized());
  EXPECT_TRUE(w.shared_gate_quantized.defined());
  EXPECT_TRUE(w.mapped);
  // Resident expert bytes are the packed bytes: codes + bf16 scales and biases, no float copy.
  const std::size_t want = static_cast<std::size_t>(kE) *
                           (2 * kF * (kD / 8 * 4 + 2 * (kD / 32) * 2) + kD * (kF / 4 * 4 + 2 * (kF / 32) * 2));
  EXPECT_EQ(w.experts.nbytes(), want);
  std::mt19937 rng(3);
  const Tensor x = testing::random_f32({37, kD}, 9);
  ForwardInfo qi, fi;
  const Tensor yq = ql.forward(x, &qi), yf = fl.forward(x, &fi);
  EXPECT_TRUE(same_bits(qi.logits, fi.logits));
  EXPECT_TRUE(same_bits(yq, yf));
  // pack_weights leaves quantized matrices as they are (and keeps the mapping they read).
  MoeLayer packed = load_moe_layer(tq.path().string(), 0);
  packed.pack_weights();
  EXPECT_TRUE(same_bits(packed.forward(x), yq));
}

// Runs `fn`, expecting std::runtime_error or std::invalid_argument with every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

void load_built(const CheckpointBuilder& b) {
  TempDir t("qbad");
  b.write(t.path());
  load_moe_layer(t.path().string(), 0);
}

TEST(QuantizedLayer, BrokenFilesAreNamedErrors) {
  const std::string up = kBlock + ".switch_mlp.up_proj";
  {  // scales of the wrong shape
    Built b = qwen2_block();
    b.q.add(up + ".scales", to_dtype(testing::random_f32({kE, kF, 3}, 1), DType::bf16));
    expect_error([&] { load_built(b.q); }, {up + ".scales'", "(4, 32, 3)", "expected (4, 32, 2)", "4-bit"});
  }
  {  // codes that disagree with the bits (8-bit codes where the config says 4)
    Built b = qwen2_block();
    b.quantized(up, {kE, kF, kD}, 8, 32, 3);
    expect_error([&] { load_built(b.q); }, {up + ".weight'", "(4, 32, 16)", "expected (4, 32, 8)"});
  }
  {  // biases in another dtype than the scales
    Built b = qwen2_block();
    b.q.add(up + ".biases", testing::random_f32({kE, kF, 2}, 1));
    expect_error([&] { load_built(b.q); }, {up + ".biases'", "f32", "bf16"});
  }
  {  // a NaN scale
    Built b = qwen2_block();
    Tensor s = to_dtype(testing::random_f32({kE, kF, 2}, 1), DType::f32);
    s.data_as<float>()[5] = std::nanf("");
    b.q.add(up + ".scales", to_dtype(s, DType::bf16));
    expect_error([&] { load_built(b.q); }, {up + ".scales'", "non-finite", "row 2, group 1"});
  }
  {  // scales present but no quantization in config.json
    Built b = qwen2_block();
    b.q.config().erase("quantization");
    expect_error([&] { load_built(b.q); }, {"no 'quantization' entry"});
  }
  {  // a module the config excludes
    Built b = qwen2_block();
    b.q.config()["quantization"][up] = false;
    expect_error([&] { load_built(b.q); }, {up + ".scales'", "excludes"});
  }
  {  // a mode moekit cannot compute on
    Built b = qwen2_block();
    b.q.config()["quantization"][up] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp6"}};
    expect_error([&] { load_built(b.q); }, {up + ".weight'", "'mxfp6'", "affine, mxfp4, nvfp4, mxfp8"});
  }
  {  // affine tensors (with biases) under a module the config calls mxfp4
    Built b = qwen2_block();
    b.q.config()["quantization"][up] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
    expect_error([&] { load_built(b.q); }, {up + ".biases'", "mxfp4 mode has no biases"});
  }
  {  // input dim not divisible by the group size
    Built b = qwen2_block();
    b.q.config()["quantization"][up] = {{"group_size", 128}, {"bits", 4}};
    expect_error([&] { load_built(b.q); }, {up + ".weight'", "64", "group_size 128"});
  }
  {  // quantized in config but stored as floats
    Built b = qwen2_block();
    b.q.add(up + ".weight", testing::random_f32({kE, kF, kD}, 1));
    b.q.remove(up + ".scales").remove(up + ".biases");
    b.q.config()["quantization"][up] = {{"group_size", 32}, {"bits", 4}};
    expect_error([&] { load_built(b.q); }, {up, "quantized in config.json", "scales' is missing"});
  }
  {  // packed codes not U32
    Built b = qwen2_block();
    b.q.add(up + ".weight", testing::random_f32({kE, kF, 8}, 1));
    expect_error([&] { load_built(b.q); }, {up + ".weight'", "F32", "expected U32"});
  }
  {  // bad config values
    Built b = qwen2_block();
    b.q.config()["quantization"]["bits"] = 7;
    expect_error([&] { load_built(b.q); }, {"quantization", "bits 7"});
  }
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// The fast mode on mlx-lm's own quantized blocks: the routing is the exact one (the router stays
// exact), y stays within a small relative error of the exact forward, and it is deterministic.
TEST(QuantizedLayer, Int8ActivationsKeepRoutingAndStayClose) {
  // MLX affine; e2m1 (mlx's mxfp4 and nvfp4, GPT-OSS's release) and compressed-tensors' int4 take
  // the fast mode too; 3-bit codes and FP8 stay exact.
  for (const char* name : {"qwen3_moe_q4_g64_bf16", "deepseek_v3_q3_g64_bf16", "qwen2_moe_q8_g128_bf16",
                           "mixtral_q4_g32_f16", "qwen3_moe_mxfp4", "qwen3_moe_nvfp4", "../formats/mxfp4_gpt_oss",
                           "../formats/int4_kimi_k2", "../formats/fp8_deepseek_v3"}) {
    const std::string dir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/" + name;
    MoeLayer layer = load_moe_layer(dir, 1);
    const Tensor x = read_npy(dir + "/input.npy");
    ForwardInfo exact_info, fast_info;
    const Tensor exact = layer.forward(x, &exact_info);
    layer.set_int8_activations(true);
    const Tensor fast = layer.forward(x, &fast_info);
    const Tensor again = layer.forward(x);
    EXPECT_EQ(std::memcmp(fast.data(), again.data(), fast.nbytes()), 0) << name;
    EXPECT_EQ(std::memcmp(exact_info.routing.ids.data(), fast_info.routing.ids.data(),
                          exact_info.routing.ids.nbytes()), 0) << name;
    const double rel = testing::relative_rms(fast, exact);
    const bool four_or_eight =
        std::string(name).find("_q3_") == std::string::npos && std::string(name).find("fp8") == std::string::npos;
    if (four_or_eight) {
      EXPECT_GT(rel, 0.0) << name << ": the fast path ran";
      EXPECT_LT(rel, 2e-2) << name;
    } else {
      EXPECT_EQ(rel, 0.0) << name << ": 3-bit codes and FP8 stay on the exact kernel";
    }
    layer.set_int8_activations(false);
    const Tensor back = layer.forward(x);
    EXPECT_EQ(std::memcmp(back.data(), exact.data(), exact.nbytes()), 0) << name;
  }
}

}  // namespace
}  // namespace moekit
