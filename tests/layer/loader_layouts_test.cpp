// load_moe_layer across checkpoint layouts: the same weights written in every layout the loader
// recognises (docs/routing.md, "Checkpoint names") load with the expected MoeWeights::layout / mapped and give the
// same forward output, bit for bit. Also sharding, bf16 storage, foreign tensors elsewhere in the
// file and unaligned data.
//
// Why bitwise: every layout ends up as the same per-expert [out, in] values handed to the same
// GEMM kernels (only base pointers and strides differ, and strides are equal to cols in all of
// them), the routing reads the same router values, and the combine order is fixed. Nothing in the
// computation depends on where the weights live, so any difference is a loader bug.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "layer/checkpoint_builder.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/safetensors.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

using testing::CheckpointBuilder;
using testing::ExpertLayout;
using testing::ExpertSet;
using testing::PerExpertNames;
using testing::TempDir;

const std::string kGoldens = std::string(MOEKIT_TEST_DATA_DIR) + "/layers";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::string block_of(const MoeConfig& c, std::int64_t layer) {
  std::string b = c.names.block;
  b.replace(b.find("{L}"), 3, std::to_string(layer));
  return b;
}

// One golden folder: its config, the canonical f32 experts of its MoE block, and everything else.
struct Golden {
  std::string dir;
  std::int64_t layer = 0;
  nlohmann::json config;
  MoeConfig cfg;
  std::string block;
  PerExpertNames names;
  ExpertSet experts;
  Tensor x, y_ref;
  std::shared_ptr<const Checkpoint> ckpt;

  // True for the routed experts' tensors of the block (what a layout rewrite replaces).
  bool is_expert_tensor(const std::string& name) const {
    return name.rfind(block + "." + names.experts + ".", 0) == 0 ||
           name.rfind(block + ".switch_mlp.", 0) == 0;
  }
  // The golden's tensors other than the routed experts (router, biases, shared, distractors).
  CheckpointBuilder rest() const {
    CheckpointBuilder b(config);
    b.add_from(*ckpt, [&](const std::string& n) { return !is_expert_tensor(n); });
    return b;
  }
};

Golden golden(const std::string& name, std::int64_t layer, ExpertLayout stored) {
  Golden g;
  g.dir = kGoldens + "/" + name;
  g.layer = layer;
  g.config = read_json(g.dir + "/config.json");
  g.cfg = load_hf_config(g.dir);
  g.block = block_of(g.cfg, layer);
  g.names = PerExpertNames{g.cfg.names.experts, g.cfg.names.gate_proj, g.cfg.names.up_proj,
                           g.cfg.names.down_proj};
  g.ckpt = Checkpoint::open(g.dir);
  g.experts = testing::read_expert_set(*g.ckpt, stored, g.block, g.cfg.router.num_experts,
                                       g.cfg.expert_bias, g.names);
  g.x = read_npy(g.dir + "/input.npy");
  g.y_ref = read_npy(g.dir + "/output.npy");
  return g;
}

::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "shape/dtype " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  if (std::memcmp(a.data(), b.data(), a.nbytes()) == 0) return ::testing::AssertionSuccess();
  double max_diff = 0;
  std::int64_t first = -1;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]);
    if (d > 0 && first < 0) first = i;
    max_diff = std::max(max_diff, d);
  }
  return ::testing::AssertionFailure()
         << "not bitwise equal: first difference at " << first << ", max |a - b| = " << max_diff;
}

// max|y - y_ref| <= 1e-4 max|y_ref| (docs/layer_goldens.md): the rewritten folder still is the
// golden.
void expect_close_to_reference(const Tensor& y, const Tensor& y_ref) {
  ASSERT_EQ(y.shape(), y_ref.shape());
  const testing::MaxDiff d = testing::max_diff(y, y_ref);
  EXPECT_LE(d.err, 1e-4 * d.ref);
}

struct Variant {
  ExpertLayout layout;
  const char* expected_layout;
  bool mapped;
};

// Rewrites g's experts into each variant, loads it and compares the forward with the golden's own.
void check_variants(const Golden& g, const std::vector<Variant>& variants,
                    DType dtype = DType::f32) {
  const MoeLayer original = load_moe_layer(g.dir, g.layer);
  const Tensor y0 = original.forward(g.x);
  expect_close_to_reference(y0, g.y_ref);
  TempDir tmp("layouts");
  int i = 0;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.expected_layout);
    const std::string dir = tmp.file(std::to_string(i++));
    CheckpointBuilder b = g.rest();
    b.add(testing::expert_entries(g.experts, v.layout, g.block, dtype, g.names));
    b.write(dir);
    const MoeLayer layer = load_moe_layer(dir, g.layer);
    EXPECT_EQ(layer.weights().layout, v.expected_layout);
    EXPECT_EQ(layer.weights().mapped, v.mapped);
    EXPECT_EQ(layer.weights().experts.num_experts(), g.cfg.router.num_experts);
    EXPECT_EQ(layer.weights().experts.width(), g.cfg.expert_width);
    EXPECT_TRUE(bitwise_equal(layer.forward(g.x), y0));
  }
}

const Variant kPerExpert{ExpertLayout::per_expert, "per_expert", true};
const Variant kFused{ExpertLayout::fused_gate_up, "fused_gate_up", true};
const Variant kSwitch{ExpertLayout::switch_mlp, "switch_mlp", true};
const Variant kTransposed{ExpertLayout::fused_gate_up_transposed, "fused_gate_up_transposed",
                          false};
const Variant kInterleaved{ExpertLayout::fused_gate_up_transposed_interleaved,
                           "fused_gate_up_transposed_interleaved", false};

TEST(LoaderLayouts, DeepSeekV3SameWeightsInEveryUntransposedLayout) {
  const Golden g = golden("deepseek_v3", 1, ExpertLayout::per_expert);
  check_variants(g, {kPerExpert, kFused, kSwitch});
}

TEST(LoaderLayouts, Qwen3FusedGoldenRewrittenPerExpertAndSwitchMlp) {
  const Golden g = golden("qwen3_moe_fused", 3, ExpertLayout::fused_gate_up);
  check_variants(g, {kFused, kPerExpert, kSwitch});
}

TEST(LoaderLayouts, MixtralW1W3W2UnderBlockSparseMoe) {
  const Golden g = golden("mixtral", 1, ExpertLayout::per_expert);
  ASSERT_EQ(g.block, "model.layers.1.block_sparse_moe");
  ASSERT_EQ(g.names.gate, "w1");
  check_variants(g, {kPerExpert, kFused, kSwitch});
  // The w1/w3/w2 names really are the ones read: gate_proj/up_proj/down_proj do not load as
  // Mixtral.
  TempDir tmp("mixtral_hf_names");
  CheckpointBuilder b = g.rest();
  b.add(testing::expert_entries(g.experts, ExpertLayout::per_expert, g.block));
  b.write(tmp.path());
  EXPECT_THROW(load_moe_layer(tmp.path().string(), 1), std::runtime_error);
}

TEST(LoaderLayouts, Llama4TransposedPerExpertAndSwitchMlp) {
  const Golden g = golden("llama4_text", 1, ExpertLayout::fused_gate_up_transposed);
  check_variants(g, {kTransposed, kPerExpert, kSwitch});
}

// Llama4ForConditionalGeneration: config {"model_type": "llama4", "text_config": {...}} and every
// language-model tensor under "language_model.".
TEST(LoaderLayouts, Llama4MultimodalWrapper) {
  const Golden g = golden("llama4_text", 1, ExpertLayout::fused_gate_up_transposed);
  const Tensor y0 = load_moe_layer(g.dir, g.layer).forward(g.x);
  nlohmann::json text_without_type = g.config;
  text_without_type.erase("model_type");
  const std::vector<nlohmann::json> configs = {
      {{"model_type", "llama4"},
       {"text_config", g.config}},  // as shipped: text_config says llama4_text
      {{"model_type", "llama4"},
       {"text_config", text_without_type}},  // only the wrapper names the family
  };
  TempDir tmp("llama4_wrapper");
  int i = 0;
  for (const nlohmann::json& config : configs)
    for (const Variant& v : {kTransposed, kPerExpert}) {
      SCOPED_TRACE(config.dump().substr(0, 80) + " " + v.expected_layout);
      CheckpointBuilder b(config);
      std::vector<testing::SafetensorsEntry> entries = g.rest().tensors();
      const auto experts =
          testing::expert_entries(g.experts, v.layout, g.block, DType::f32, g.names);
      entries.insert(entries.end(), experts.begin(), experts.end());
      for (testing::SafetensorsEntry& e : entries) {
        e.name = "language_model." + e.name;
        b.add(std::move(e));
      }
      b.add(testing::raw_entry("vision_model.patch_embedding.linear.weight", "BF16", {8, 12},
                               8 * 12 * 2));
      b.add(testing::raw_entry("multi_modal_projector.linear_1.weight", "F8_E4M3", {8, 8}, 64));
      const std::string dir = tmp.file(std::to_string(i++));
      b.write(dir);
      const MoeLayer layer = load_moe_layer(dir, 1);
      EXPECT_EQ(layer.config().hidden_size, g.cfg.hidden_size);
      EXPECT_EQ(layer.weights().layout, v.expected_layout);
      EXPECT_EQ(layer.weights().mapped, v.mapped);
      EXPECT_TRUE(bitwise_equal(layer.forward(g.x), y0));
    }
}

TEST(LoaderLayouts, GptOssInterleavedTransposedWithBiasesAndPerExpert) {
  const Golden g = golden("gpt_oss", 1, ExpertLayout::fused_gate_up_transposed_interleaved);
  ASSERT_TRUE(g.experts.has_bias());
  check_variants(g, {kInterleaved, kPerExpert});
  // Biases are really read: perturbing one expert's down bias changes that expert's tokens.
  TempDir tmp("gpt_oss_bias");
  ExpertSet changed = g.experts;
  changed.down_bias = g.experts.down_bias.clone();
  for (std::int64_t i = 0; i < changed.down_bias.numel(); ++i)
    changed.down_bias.data_as<float>()[i] += 1.0f;
  CheckpointBuilder b = g.rest();
  b.add(testing::expert_entries(changed, ExpertLayout::fused_gate_up_transposed_interleaved,
                                g.block));
  b.write(tmp.path());
  const Tensor y0 = load_moe_layer(g.dir, 1).forward(g.x);
  EXPECT_FALSE(bitwise_equal(load_moe_layer(tmp.path().string(), 1).forward(g.x), y0));
}

TEST(LoaderLayouts, ThreeShardsEqualOneFile) {
  const Golden g = golden("deepseek_v3", 1, ExpertLayout::per_expert);
  TempDir tmp("shards");
  CheckpointBuilder b = g.rest();
  b.add(testing::expert_entries(g.experts, ExpertLayout::per_expert, g.block));
  b.write(tmp.path() / "one");
  b.write(tmp.path() / "three", 3);
  ASSERT_TRUE(std::filesystem::exists(tmp.path() / "three" / "model.safetensors.index.json"));
  ASSERT_TRUE(std::filesystem::exists(tmp.path() / "three" / CheckpointBuilder::shard_name(3, 3)));
  const auto ck = Checkpoint::open((tmp.path() / "three").string());
  ASSERT_EQ(ck->files().size(), 3u);
  // The experts really are split: expert 0 and expert 15 live in different shards.
  EXPECT_NE(ck->info(g.block + ".experts.0.up_proj.weight").file,
            ck->info(g.block + ".experts.15.up_proj.weight").file);
  const MoeLayer one = load_moe_layer((tmp.path() / "one").string(), 1);
  const MoeLayer three = load_moe_layer((tmp.path() / "three").string(), 1);
  EXPECT_EQ(three.weights().layout, "per_expert");
  EXPECT_TRUE(three.weights().mapped);
  EXPECT_TRUE(bitwise_equal(three.forward(g.x), one.forward(g.x)));

  // And the other way round: the sharded golden (glm4_moe) rewritten into one file.
  const Golden s = golden("glm4_moe_sharded", 2, ExpertLayout::per_expert);
  CheckpointBuilder u = s.rest();
  u.add(testing::expert_entries(s.experts, ExpertLayout::per_expert, s.block));
  u.write(tmp.path() / "glm_one");
  EXPECT_TRUE(bitwise_equal(load_moe_layer((tmp.path() / "glm_one").string(), 2).forward(s.x),
                            load_moe_layer(s.dir, 2).forward(s.x)));
}

// A bf16 checkpoint computes in fp32 on the bf16 values: the same as an f32 checkpoint holding
// those values (bf16 -> f32 widening is exact, and the kernels accumulate in fp32 in the same
// order whatever the storage type).
TEST(LoaderLayouts, Bf16EqualsF32OfTheRoundedWeights) {
  const Golden g = golden("deepseek_v3_bf16", 1, ExpertLayout::per_expert);
  // Every layout of the bf16 weights, stored bf16, is mapped and identical.
  check_variants(g, {kPerExpert, kFused, kSwitch}, DType::bf16);

  const MoeLayer bf16 = load_moe_layer(g.dir, 1);
  EXPECT_EQ(bf16.weights().experts.down.dtype, DType::bf16);
  EXPECT_EQ(bf16.weights().router.dtype(), DType::bf16);
  TempDir tmp("bf16_as_f32");
  CheckpointBuilder b(g.config);
  for (const std::string& name : g.ckpt->names()) {
    const TensorView v = g.ckpt->view(name);
    b.add(name, to_dtype(v, DType::f32));  // exact widening
  }
  b.write(tmp.path());
  const MoeLayer f32 = load_moe_layer(tmp.path().string(), 1);
  EXPECT_EQ(f32.weights().experts.down.dtype, DType::f32);
  EXPECT_TRUE(f32.weights().mapped);
  EXPECT_TRUE(bitwise_equal(f32.forward(g.x), bf16.forward(g.x)));

  // Same property on the f32 deepseek_v3 golden rounded to bf16 by the test itself.
  const Golden h = golden("deepseek_v3", 1, ExpertLayout::per_expert);
  CheckpointBuilder as_bf16(h.config), as_f32(h.config);
  for (const std::string& name : h.ckpt->names()) {
    const TensorView v = h.ckpt->view(name);
    const bool keep_f32 =
        name.find("e_score_correction_bias") != std::string::npos;  // stays F32 in real files
    as_bf16.add(testing::entry_as(name, v, keep_f32 ? DType::f32 : DType::bf16));
    as_f32.add(name, keep_f32 ? to_dtype(v, DType::f32) : testing::bf16_rounded(v));
  }
  as_bf16.write(tmp.path() / "r_bf16");
  as_f32.write(tmp.path() / "r_f32");
  const MoeLayer rb = load_moe_layer((tmp.path() / "r_bf16").string(), 1);
  EXPECT_TRUE(rb.weights().mapped);
  EXPECT_TRUE(bitwise_equal(rb.forward(h.x),
                            load_moe_layer((tmp.path() / "r_f32").string(), 1).forward(h.x)));
}

// Tensors outside the block are never read, whatever their dtype.
TEST(LoaderLayouts, ForeignTensorsElsewhereAreIgnored) {
  const Golden g = golden("deepseek_v3", 1, ExpertLayout::per_expert);
  const Tensor y0 = load_moe_layer(g.dir, 1).forward(g.x);
  TempDir tmp("foreign");
  CheckpointBuilder b = g.rest();
  b.add(testing::expert_entries(g.experts, ExpertLayout::per_expert, g.block));
  // FP8 attention with its scales, as DeepSeek-V3's own checkpoints have it.
  b.add(
      testing::raw_entry("model.layers.1.self_attn.q_a_proj.weight", "F8_E4M3", {24, 32}, 24 * 32));
  b.add(testing::raw_entry("model.layers.1.self_attn.q_a_proj.weight_scale_inv", "F32", {1, 1}, 4));
  // The dense layer 0 stored FP8 (replaces the golden's f32 distractors in place).
  for (const char* p : {"gate_proj", "up_proj"})
    b.add(testing::raw_entry(std::string("model.layers.0.mlp.") + p + ".weight", "F8_E4M3",
                             {32, 32}, 32 * 32));
  b.add(testing::raw_entry("model.layers.0.mlp.down_proj.weight", "F8_E5M2", {32, 32}, 32 * 32));
  // Integer and odd types elsewhere.
  b.add(testing::raw_entry("model.embed_tokens.weight", "I64", {64, 32}, 64 * 32 * 8));
  b.add(testing::raw_entry("model.layers.1.self_attn.rotary_emb.inv_freq", "F64", {4}, 32));
  b.add(testing::raw_entry("model.layers.1.attention_mask", "BOOL", {8}, 8));
  b.add(testing::raw_entry("lm_head.weight", "F4", {64, 32}, 64 * 32 / 2));
  // Another MoE layer's experts in a dtype moekit cannot compute on.
  b.add(testing::raw_entry("model.layers.2.mlp.experts.0.gate_proj.weight", "F8_E4M3", {16, 32},
                           16 * 32));
  b.add(testing::raw_entry("model.layers.2.mlp.gate.weight", "I32", {16, 32}, 16 * 32 * 4));
  // An expert beyond E in this block and a quantization scale beside the experts: not read.
  b.add(testing::raw_entry(g.block + ".experts.16.gate_proj.weight", "F8_E4M3", {16, 32}, 16 * 32));
  b.write(tmp.path());
  const MoeLayer layer = load_moe_layer(tmp.path().string(), 1);
  EXPECT_EQ(layer.weights().layout, "per_expert");
  EXPECT_TRUE(layer.weights().mapped);
  EXPECT_TRUE(bitwise_equal(layer.forward(g.x), y0));
}

// A file image whose data buffer starts at byte 8 + N with (8 + N) % 8 == misalign: every tensor
// (sizes are multiples of 8 bytes here) is then misaligned for its dtype, so the loader must copy.
std::vector<std::uint8_t> misaligned_image(const std::vector<testing::SafetensorsEntry>& entries,
                                           std::size_t misalign) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<std::uint8_t> data;
  for (const testing::SafetensorsEntry& e : entries) {
    const std::size_t begin = data.size();
    data.insert(data.end(), e.bytes.begin(), e.bytes.end());
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != misalign) text.push_back(' ');
  std::vector<std::uint8_t> out(8 + text.size());
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(text.size() >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST(LoaderLayouts, UnalignedDataIsCopiedAndGivesTheSameOutput) {
  struct Case {
    const char* golden;
    ExpertLayout stored, written;
    const char* layout;
    DType dtype;
    std::size_t misalign;
  };
  const std::vector<Case> cases = {
      {"deepseek_v3", ExpertLayout::per_expert, ExpertLayout::per_expert, "per_expert", DType::f32,
       2},
      {"deepseek_v3", ExpertLayout::per_expert, ExpertLayout::switch_mlp, "switch_mlp", DType::f32,
       6},
      {"qwen3_moe_fused", ExpertLayout::fused_gate_up, ExpertLayout::fused_gate_up, "fused_gate_up",
       DType::f32, 2},
      {"deepseek_v3_bf16", ExpertLayout::per_expert, ExpertLayout::switch_mlp, "switch_mlp",
       DType::bf16, 1},
  };
  TempDir tmp("unaligned");
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.golden) + " " + c.layout + " misaligned by " +
                 std::to_string(c.misalign));
    const std::int64_t layer = std::string(c.golden) == "qwen3_moe_fused" ? 3 : 1;
    const Golden g = golden(c.golden, layer, c.stored);
    CheckpointBuilder b = g.rest();
    b.add(testing::expert_entries(g.experts, c.written, g.block, c.dtype, g.names));
    const std::string dir = tmp.file(std::to_string(i++));
    std::filesystem::create_directories(dir);
    testing::write_text(dir + "/config.json", g.config.dump());
    testing::write_file(dir + "/model.safetensors", misaligned_image(b.tensors(), c.misalign));
    // The file really is misaligned where the experts are.
    const auto ck = Checkpoint::open(dir);
    const std::string probe =
        c.written == ExpertLayout::per_expert   ? g.block + ".experts.0.up_proj.weight"
        : c.written == ExpertLayout::switch_mlp ? g.block + ".switch_mlp.up_proj.weight"
                                                : g.block + ".experts.gate_up_proj";
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(ck->view(probe).data()) % dtype_size(c.dtype), 0u);
    const MoeLayer layer_u = load_moe_layer(dir, layer);
    EXPECT_EQ(layer_u.weights().layout, c.layout);
    EXPECT_FALSE(layer_u.weights().mapped);
    EXPECT_EQ(layer_u.weights().experts.down.dtype, c.dtype);
    EXPECT_TRUE(bitwise_equal(layer_u.forward(g.x), load_moe_layer(g.dir, layer).forward(g.x)));
  }
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// mlx-lm keeps GPT-OSS experts stacked under "experts" (not "switch_mlp") with stacked biases
// [E, out]: the same weights as the golden give the same bits.
TEST(LoaderLayouts, GptOssMlxStackedUnderExpertsWithBiases) {
  const Golden g = golden("gpt_oss", 1, ExpertLayout::fused_gate_up_transposed_interleaved);
  TempDir tmp("gpt_oss_mlx");
  CheckpointBuilder b = g.rest();
  const std::string ex = g.block + ".experts.";
  b.add({testing::entry_of(ex + "gate_proj.weight", g.experts.gate), testing::entry_of(ex + "up_proj.weight", g.experts.up),
         testing::entry_of(ex + "down_proj.weight", g.experts.down),
         testing::entry_of(ex + "gate_proj.bias", g.experts.gate_bias),
         testing::entry_of(ex + "up_proj.bias", g.experts.up_bias),
         testing::entry_of(ex + "down_proj.bias", g.experts.down_bias)});
  b.write(tmp.path());
  const MoeLayer layer = load_moe_layer(tmp.path().string(), 1);
  EXPECT_EQ(layer.weights().layout, "switch_mlp");
  EXPECT_TRUE(layer.weights().mapped);
  EXPECT_TRUE(bitwise_equal(layer.forward(g.x), load_moe_layer(g.dir, 1).forward(g.x)));
}

}  // namespace
}  // namespace moekit
