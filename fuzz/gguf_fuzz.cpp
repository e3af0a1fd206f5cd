// libFuzzer target: untrusted bytes into the GGUF reader (moekit/gguf.hpp), and every image that
// parses into the GGUF loader (the architecture's metadata -> MoeConfig, the block's tensors in
// ggml's types) and a forward of what loads, exact and in the int8 fast mode. Any input must
// either parse / load or throw a std::exception; a crash, sanitizer report, leak or any other
// exception type is a bug. Run through scripts/fuzz.sh, which first writes valid images as seeds
// (MOEKIT_FUZZ_WRITE_GGUF_SEEDS = folder; see LLVMFuzzerInitialize): a Qwen3-MoE block in q8_0 /
// q4_0 / f16 with a q4_K shared expert's worth of K-quant bytes, and a GPT-OSS block in MXFP4
// with its biases.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf_writer.hpp"
#include "moekit/gguf.hpp"
#include "moekit/model.hpp"

namespace {

using moekit::testing::GgufImage;

constexpr std::int64_t kD = 256, kE = 2, kF = 32;

// Bytes counting up (every code, scales of all magnitudes); f16 scales patched to small finite
// values every `block` bytes at `scale_at` so a forward stays finite.
std::vector<std::uint8_t> blocks(std::size_t n, std::size_t block, std::size_t scale_at) {
  std::vector<std::uint8_t> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(i * 37u + 11u);
  for (std::size_t i = scale_at; i + 1 < n; i += block) b[i] = 0x00, b[i + 1] = 0x20;  // f16 ~ 0.0078
  return b;
}

std::vector<std::uint8_t> qwen3_seed() {
  GgufImage g;
  g.str("general.architecture", "qwen3moe").u32("qwen3moe.block_count", 1).u32("qwen3moe.embedding_length", kD);
  g.u32("qwen3moe.expert_count", kE).u32("qwen3moe.expert_used_count", 1);
  g.u32("qwen3moe.expert_feed_forward_length", kF);
  g.f32_tensor("blk.0.ffn_gate_inp.weight", {kD, kE}, std::vector<float>(kD * kE, 0.01f));
  g.tensor("blk.0.ffn_gate_exps.weight", {kD, kF, kE}, 8, blocks(kE * kF * kD / 32 * 34, 34, 0));    // q8_0
  g.tensor("blk.0.ffn_up_exps.weight", {kD, kF, kE}, 12, blocks(kE * kF * kD / 256 * 144, 144, 0));  // q4_K
  g.tensor("blk.0.ffn_down_exps.weight", {kF, kD, kE}, 2, blocks(kE * kD * kF / 32 * 18, 18, 0));    // q4_0
  return g.image();
}

std::vector<std::uint8_t> gpt_oss_seed() {
  GgufImage g;
  g.str("general.architecture", "gpt-oss").u32("gpt-oss.block_count", 1).u32("gpt-oss.embedding_length", kD);
  g.u32("gpt-oss.expert_count", kE).u32("gpt-oss.expert_used_count", 1).u32("gpt-oss.expert_feed_forward_length", kF);
  g.f32_tensor("blk.0.ffn_gate_inp.weight", {kD, kE}, std::vector<float>(kD * kE, 0.01f));
  g.f32_tensor("blk.0.ffn_gate_inp.bias", {kE}, std::vector<float>(kE, 0.0f));
  std::vector<std::uint8_t> mx = blocks(kE * kF * kD / 32 * 17, 17, 1000000);
  for (std::size_t i = 0; i < mx.size(); i += 17) mx[i] = 120;  // e8m0 exponents near 2^-8
  g.tensor("blk.0.ffn_gate_exps.weight", {kD, kF, kE}, 39, mx);
  g.tensor("blk.0.ffn_up_exps.weight", {kD, kF, kE}, 39, mx);
  g.tensor("blk.0.ffn_down_exps.weight", {kF, kD, kE}, 39, mx);
  for (const char* p : {"gate", "up"})
    g.f32_tensor(std::string("blk.0.ffn_") + p + "_exps.bias", {kF, kE}, std::vector<float>(kF * kE, 0.01f));
  g.f32_tensor("blk.0.ffn_down_exps.bias", {kD, kE}, std::vector<float>(kD * kE, -0.01f));
  return g.image();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("MOEKIT_FUZZ_WRITE_GGUF_SEEDS")) {
    for (const auto& [name, img] :
         {std::pair{"qwen3moe.gguf", qwen3_seed()}, std::pair{"gpt-oss.gguf", gpt_oss_seed()}})
      std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::shared_ptr<const moekit::GgufFile> f;
  try {
    f = moekit::GgufFile::from_bytes(std::vector<std::uint8_t>(data, data + size), "fuzz.gguf");
  } catch (const std::exception&) {
    return 0;
  }
  // Touch every accepted tensor's first and last byte so ASan checks they lie inside the image,
  // and every metadata value (arrays element by element, as far as 64).
  volatile std::uint8_t sink = 0;
  for (const moekit::GgufTensorInfo& t : f->tensors())
    if (t.nbytes > 0) sink = static_cast<std::uint8_t>(sink ^ t.data[0] ^ t.data[t.nbytes - 1]);
  for (const std::string& key : f->keys()) {
    const moekit::GgufValue& v = f->get(key);
    (void)v.describe();
    if (v.type() == moekit::GgufType::array)
      for (std::uint64_t i = 0; i < v.size() && i < 64; ++i) (void)v.at(i).describe();
  }
  (void)sink;
  try {
    const auto model = moekit::GgufModel::from_file(f);
    const moekit::MoeConfig cfg = moekit::gguf_config(*model);
    if (cfg.hidden_size > 4096) return 0;  // a forward's buffers, not the reader, would be the test
    std::vector<float> x(static_cast<std::size_t>(cfg.hidden_size));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    for (const std::int64_t layer : cfg.moe_layer_indices()) {
      if (layer > 2) break;
      try {
        moekit::MoeLayer l = moekit::load_moe_layer(model, cfg, layer);
        const moekit::TensorView input(x.data(), {1, cfg.hidden_size}, moekit::DType::f32);
        (void)l.forward(input);
        l.set_int8_activations(true);  // the fast mode's kernels on the same blocks
        (void)l.forward(input);
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}
