// libFuzzer target: untrusted bytes into the safetensors and .npy parsers, and every image that
// parses into the MoE loader's quantized paths — an MLX affine-quantized Qwen3-MoE block (codes,
// scales, biases, quantized router), a GPT-OSS block in MXFP4 as OpenAI ships it (blocks, e8m0
// scales, biases), and Qwen3-MoE blocks as FP8 releases (F8_E4M3 + weight_scale_inv) and
// compressed-tensors int4 (weight_packed, weight_scale, weight_shape) store them — and one forward
// of what loads. Any input must either parse / load or throw a
// std::exception; a crash, sanitizer report, leak or any other exception type is a bug. Run
// through scripts/fuzz.sh, which first writes a valid image of each as a seed
// (MOEKIT_FUZZ_WRITE_SEED, MOEKIT_FUZZ_WRITE_MXFP4_SEED, MOEKIT_FUZZ_WRITE_FP8_SEED,
// MOEKIT_FUZZ_WRITE_INT4_SEED = path; see LLVMFuzzerInitialize).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <cstdlib>
#include <fstream>

#include "io/safetensors_writer.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/safetensors.hpp"

namespace {

constexpr std::int64_t kE = 2, kD = 32, kF = 32;

// Qwen3-MoE, 4-bit group 32 experts and an 8-bit router, as mlx-lm's convert writes it.
const moekit::MoeConfig& quantized_config() {
  static const moekit::MoeConfig c = moekit::parse_hf_config(R"({
    "model_type": "qwen3_moe", "hidden_size": 32, "moe_intermediate_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_experts": 2, "num_experts_per_tok": 1, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "hidden_act": "silu",
    "quantization": {"group_size": 32, "bits": 4, "mode": "affine",
                     "model.layers.0.mlp.gate": {"group_size": 32, "bits": 8}}})");
  return c;
}

// GPT-OSS with MXFP4 experts (quant_method mxfp4), the same small dimensions.
const moekit::MoeConfig& mxfp4_config() {
  static const moekit::MoeConfig c = moekit::parse_hf_config(R"({
    "model_type": "gpt_oss", "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_local_experts": 2, "num_experts_per_tok": 1, "quantization_config": {"quant_method": "mxfp4"}})");
  return c;
}

// Qwen3-MoE as released in FP8 (quant_method fp8, 128 × 128 blocks: one ragged block per matrix
// here) and in compressed-tensors int4 (group 32), the same small dimensions.
const char* const kQwen3Release = R"("model_type": "qwen3_moe", "hidden_size": 32, "moe_intermediate_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_experts": 2, "num_experts_per_tok": 1,
    "norm_topk_prob": true, "decoder_sparse_step": 1, "hidden_act": "silu")";
const moekit::MoeConfig& fp8_config() {
  static const moekit::MoeConfig c = moekit::parse_hf_config(
      std::string("{") + kQwen3Release +
      R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}})");
  return c;
}
const moekit::MoeConfig& int4_config() {
  static const moekit::MoeConfig c = moekit::parse_hf_config(std::string("{") + kQwen3Release + R"(,
    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["re:.*mlp.gate$"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
        "symmetric": true, "strategy": "group", "group_size": 32}}}}})");
  return c;
}

// Valid images of them: FP8 bytes / packed nibbles counting up, f32 / bf16 scales, an f32 router.
std::vector<std::uint8_t> release_seed_image(bool int4) {
  using moekit::testing::SafetensorsEntry;
  std::vector<SafetensorsEntry> es;
  const std::string b = "model.layers.0.mlp.";
  es.push_back({b + "gate.weight", "F32", {kE, kD}, moekit::testing::to_bytes(std::vector<float>(kE * kD, 0.03f))});
  for (std::int64_t e = 0; e < kE; ++e)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string m = b + "experts." + std::to_string(e) + "." + p;
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(int4 ? kF * kD / 2 : kF * kD));
      for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>((i * 37u + 11u) % 0x7Fu);
      if (int4) {
        es.push_back({m + ".weight_packed", "I32", {kF, kD / 8}, bytes});
        es.push_back({m + ".weight_scale",
                      "BF16",
                      {kF, kD / 32},
                      moekit::testing::to_bytes(std::vector<std::uint16_t>(kF * kD / 32, 0x3c00))});
        es.push_back({m + ".weight_shape", "I32", {2}, moekit::testing::to_bytes(std::vector<std::int32_t>{kF, kD})});
      } else {
        es.push_back({m + ".weight", "F8_E4M3", {kF, kD}, bytes});
        es.push_back({m + ".weight_scale_inv", "F32", {1, 1}, moekit::testing::to_bytes(std::vector<float>{0.01f})});
      }
    }
  return moekit::testing::safetensors_image(es);
}

// A valid image of it: blocks of counting bytes (every e2m1 value), e8m0 scales around 2^-6,
// f32 router and biases.
std::vector<std::uint8_t> mxfp4_seed_image() {
  using moekit::testing::SafetensorsEntry;
  std::vector<SafetensorsEntry> es;
  const std::string b = "model.layers.0.mlp.";
  const auto floats = [](std::size_t n, float v) { return moekit::testing::to_bytes(std::vector<float>(n, v)); };
  const auto mx = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(kE * out * in / 2));
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::uint8_t>(i * 37u + 11u);
    es.push_back({name + "_blocks", "U8", {kE, out, in / 32, 16}, blocks});
    es.push_back({name + "_scales", "U8", {kE, out, in / 32}, std::vector<std::uint8_t>(blocks.size() / 16, 121)});
  };
  es.push_back({b + "router.weight", "F32", {kE, kD}, floats(kE * kD, 0.03f)});
  es.push_back({b + "router.bias", "F32", {kE}, floats(kE, 0.0f)});
  mx(b + "experts.gate_up_proj", 2 * kF, kD);
  es.push_back({b + "experts.gate_up_proj_bias", "F32", {kE, 2 * kF}, floats(kE * 2 * kF, 0.01f)});
  mx(b + "experts.down_proj", kD, kF);
  es.push_back({b + "experts.down_proj_bias", "F32", {kE, kD}, floats(kE * kD, -0.01f)});
  return moekit::testing::safetensors_image(es);
}

// A valid image of that block: codes of counting bytes, scales and biases as bf16 (0x3c00 ~ 0.0078).
std::vector<std::uint8_t> seed_image() {
  using moekit::testing::SafetensorsEntry;
  std::vector<SafetensorsEntry> es;
  const auto add = [&](const std::string& module, moekit::Shape lead, std::int64_t out, std::int64_t in, int bits) {
    moekit::Shape w = lead, g = lead;
    w.insert(w.end(), {out, in * bits / 32});
    g.insert(g.end(), {out, in / 32});
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(moekit::shape_numel(w) * 4));
    for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 29u + 7u);
    const std::size_t n = static_cast<std::size_t>(moekit::shape_numel(g));
    es.push_back({module + ".weight", "U32", w, codes});
    es.push_back({module + ".scales", "BF16", g, moekit::testing::to_bytes(std::vector<std::uint16_t>(n, 0x3c00))});
    es.push_back({module + ".biases", "BF16", g, moekit::testing::to_bytes(std::vector<std::uint16_t>(n, 0xbc00))});
  };
  const std::string b = "model.layers.0.mlp.";
  add(b + "gate", {}, kE, kD, 8);
  add(b + "switch_mlp.gate_proj", {kE}, kF, kD, 4);
  add(b + "switch_mlp.up_proj", {kE}, kF, kD, 4);
  add(b + "switch_mlp.down_proj", {kE}, kD, kF, 4);
  return moekit::testing::safetensors_image(es);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto write = [](const char* path, const std::vector<std::uint8_t>& img) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
  };
  if (const char* path = std::getenv("MOEKIT_FUZZ_WRITE_SEED")) write(path, seed_image());
  if (const char* path = std::getenv("MOEKIT_FUZZ_WRITE_MXFP4_SEED")) write(path, mxfp4_seed_image());
  if (const char* path = std::getenv("MOEKIT_FUZZ_WRITE_FP8_SEED")) write(path, release_seed_image(false));
  if (const char* path = std::getenv("MOEKIT_FUZZ_WRITE_INT4_SEED")) write(path, release_seed_image(true));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto f = moekit::SafetensorsFile::from_bytes(std::vector<std::uint8_t>(data, data + size),
                                                       "fuzz.safetensors");
    // Touch every accepted tensor so ASan checks its byte range lies inside the image.
    volatile std::uint8_t sink = 0;
    for (const std::string& name : f->names()) {
      const moekit::TensorInfo& info = f->info(name);
      const std::uint8_t* p = f->bytes(name);
      if (info.end > info.begin)
        sink = static_cast<std::uint8_t>(sink ^ p[0] ^ p[info.end - info.begin - 1]);
      try {
        (void)f->view(name);
      } catch (const std::exception&) {
      }
    }
    (void)sink;
    std::vector<float> x(kD);
    for (std::int64_t i = 0; i < kD; ++i) x[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    for (const moekit::MoeConfig* config : {&quantized_config(), &mxfp4_config(), &fp8_config(), &int4_config()}) {
      try {
        const moekit::MoeLayer layer = moekit::load_moe_layer(moekit::Checkpoint::from_file(f), *config, 0);
        (void)layer.forward(moekit::TensorView(x.data(), {1, kD}, moekit::DType::f32));
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
  try {
    const moekit::Tensor t = moekit::parse_npy(data, size, "fuzz.npy");
    (void)t;
  } catch (const std::exception&) {
  }
  return 0;
}
