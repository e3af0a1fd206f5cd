// Checkpoint weights are mapped, not copied: loading a ~100 MB MoE block barely moves the
// process's resident set, and a forward of a few tokens makes resident only the experts it reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "layer/checkpoint_builder.hpp"
#include "moekit/model.hpp"
#include "util/sanitizers.hpp"

namespace moekit {
namespace {

using testing::TempDir;

// Resident set size in bytes (second field of /proc/self/statm, in pages).
std::size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// Writes a qwen3_moe checkpoint with per-expert f32 weights straight to disk, a chunk at a time,
// so that writing it does not itself make ~100 MB resident. `fp8`: the experts as DeepSeek-style
// FP8 releases store them instead (F8_E4M3 bytes, an F32 weight_scale_inv per 128 × 128 block).
void write_big_checkpoint(const std::filesystem::path& dir, std::int64_t E, std::int64_t D, std::int64_t F,
                          bool fp8 = false) {
  nlohmann::json config = {{"model_type", "qwen3_moe"}, {"hidden_size", D},       {"moe_intermediate_size", F},
                           {"intermediate_size", F},    {"num_hidden_layers", 1}, {"num_experts", E},
                           {"num_experts_per_tok", 2},  {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
                           {"hidden_act", "silu"}};
  if (fp8) config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  testing::write_text(dir / "config.json", config.dump());
  struct Item {
    std::string name;
    Shape shape;
    std::string dtype = "F32";
  };
  std::vector<Item> items = {{"model.layers.0.mlp.gate.weight", {E, D}}};
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    for (const auto& [name, out, in] :
         {std::tuple{"gate_proj", F, D}, std::tuple{"up_proj", F, D}, std::tuple{"down_proj", D, F}}) {
      items.push_back({p + name + ".weight", {out, in}, fp8 ? "F8_E4M3" : "F32"});
      if (fp8) items.push_back({p + name + ".weight_scale_inv", {(out + 127) / 128, (in + 127) / 128}});
    }
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::size_t offset = 0;
  for (const Item& it : items) {
    const std::size_t n = static_cast<std::size_t>(shape_numel(it.shape)) * (it.dtype == "F32" ? 4 : 1);
    header[it.name] = {{"dtype", it.dtype}, {"shape", it.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const std::uint64_t len = text.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>(len >> (8 * i));
  out.write(len_bytes, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  // Uniform in [-a, a] with a = sqrt(3 / fan_in) (unit-variance outputs), from a xorshift.
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  std::vector<float> chunk(1 << 16);
  std::vector<std::uint8_t> bytes(1 << 16);
  for (const Item& it : items) {
    const float a = std::sqrt(3.0f / static_cast<float>(it.shape[1]));
    std::int64_t left = shape_numel(it.shape);
    if (it.dtype == "F8_E4M3") {  // random e4m3 but the NaNs; the scales: 2^-14
      while (left > 0) {
        const std::int64_t n = std::min<std::int64_t>(left, static_cast<std::int64_t>(bytes.size()));
        for (std::int64_t i = 0; i < n; ++i) {
          state ^= state << 13, state ^= state >> 7, state ^= state << 17;
          const auto b = static_cast<std::uint8_t>(state >> 32);
          bytes[static_cast<std::size_t>(i)] = (b & 0x7F) == 0x7F ? static_cast<std::uint8_t>(b ^ 1) : b;
        }
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
        left -= n;
      }
      continue;
    }
    if (fp8 && it.name.find("weight_scale_inv") != std::string::npos) {
      const std::vector<float> s(static_cast<std::size_t>(left), 0x1p-14f);
      out.write(reinterpret_cast<const char*>(s.data()), static_cast<std::streamsize>(left * 4));
      continue;
    }
    while (left > 0) {
      const std::int64_t n = std::min<std::int64_t>(left, static_cast<std::int64_t>(chunk.size()));
      for (std::int64_t i = 0; i < n; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        chunk[static_cast<std::size_t>(i)] =
            a * (static_cast<float>(state >> 40) / 8388608.0f - 1.0f);
      }
      out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 4));
      left -= n;
    }
  }
  if (!out) throw std::runtime_error("write_big_checkpoint: cannot write " + dir.string());
}

TEST(MappedMemory, LoadingMapsAndAForwardTouchesOnlyItsExperts) {
  // Sanitizers keep shadow memory beside every touched page: RSS then says nothing about mapping.
  if (testing::kAddressSanitizer || testing::kThreadSanitizer)
    GTEST_SKIP() << "RSS is not meaningful under a sanitizer (shadow memory, quarantine)";
  // 3 x 64 x 512 x 256 x 4 B = 96 MiB of expert weights; one expert is 1.5 MiB.
  constexpr std::int64_t E = 64, D = 512, F = 256, T = 4;
  TempDir tmp("mapped_memory");
  write_big_checkpoint(tmp.path(), E, D, F);
  const Tensor x = testing::random_f32({T, D}, 5);
  const std::size_t rss0 = resident_bytes();

  const MoeLayer layer = load_moe_layer(tmp.path().string(), 0);
  const std::size_t rss1 = resident_bytes();
  const std::size_t nbytes = layer.weights().experts.nbytes();
  ASSERT_EQ(nbytes, static_cast<std::size_t>(3 * E * D * F * 4));
  EXPECT_EQ(layer.weights().layout, "per_expert");
  EXPECT_TRUE(layer.weights().mapped);
  const double load_growth = static_cast<double>(rss1) - static_cast<double>(rss0);
  EXPECT_LT(load_growth, 0.10 * static_cast<double>(nbytes));

  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  const std::size_t rss2 = resident_bytes();
  std::set<std::int32_t> touched(
      info.routing.ids.data_as<const std::int32_t>(),
      info.routing.ids.data_as<const std::int32_t>() + info.routing.ids.numel());
  const double touched_bytes =
      static_cast<double>(touched.size()) * static_cast<double>(nbytes) / E;
  const double fwd_growth = static_cast<double>(rss2) - static_cast<double>(rss0);
  // What the forward reads (touched experts + the router) plus scratch and thread stacks; far
  // below the whole block.
  EXPECT_LT(fwd_growth, touched_bytes + 0.10 * static_cast<double>(nbytes));
  EXPECT_LT(fwd_growth, 0.25 * static_cast<double>(nbytes));
  for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isfinite(y.data_as<float>()[i]));

  std::printf(
      "[ RSS      ] weights %.1f MiB; after load +%.2f MiB; after forward (T=%lld, %zu experts = "
      "%.1f MiB "
      "touched) +%.2f MiB\n",
      mib(static_cast<double>(nbytes)), mib(load_growth), static_cast<long long>(T), touched.size(),
      mib(touched_bytes), mib(fwd_growth));
  RecordProperty("rss_load_growth_bytes", std::to_string(static_cast<long long>(load_growth)));
  RecordProperty("rss_forward_growth_bytes", std::to_string(static_cast<long long>(fwd_growth)));
}

// An FP8 release is used in place too (issue target: resident memory at most 1.1 × the packed
// bytes of the experts a forward touches, plus O(T · D)): loading adds next to nothing, and a
// forward of a few tokens adds the touched experts' FP8 bytes, the router and the decode scratch.
TEST(MappedMemory, Fp8ReleaseTouchesOnlyItsExpertsBytes) {
  // Sanitizers keep shadow memory beside every touched page: RSS then says nothing about mapping.
  if (testing::kAddressSanitizer || testing::kThreadSanitizer)
    GTEST_SKIP() << "RSS is not meaningful under a sanitizer (shadow memory, quarantine)";
  // 3 x 64 x 1024 x 512 B = 96 MiB of FP8 experts; one expert is 1.5 MiB.
  constexpr std::int64_t E = 64, D = 1024, F = 512, T = 4;
  TempDir tmp("mapped_memory_fp8");
  write_big_checkpoint(tmp.path(), E, D, F, true);
  const Tensor x = testing::random_f32({T, D}, 5);
  const MoeLayer warm = load_moe_layer(tmp.path().string(), 0);  // thread pool and scratch, once
  (void)warm.forward(x);
  const std::size_t rss0 = resident_bytes();
  const MoeLayer layer = load_moe_layer(tmp.path().string(), 0);
  const std::size_t rss1 = resident_bytes();
  const std::size_t nbytes = layer.weights().experts.nbytes();
  ASSERT_EQ(layer.weights().experts.up.format, WeightFormat::fp8(128, 128, DType::f32));
  EXPECT_TRUE(layer.weights().mapped);
  const double load_growth = static_cast<double>(rss1) - static_cast<double>(rss0);
  EXPECT_LT(load_growth, 0.02 * static_cast<double>(nbytes));
  ForwardInfo info;
  const Tensor x2 = testing::random_f32({T, D}, 6);  // another routing than the warm-up's
  (void)layer.forward(x2, &info);
  const double fwd_growth = static_cast<double>(resident_bytes()) - static_cast<double>(rss0);
  std::set<std::int32_t> touched(info.routing.ids.data_as<const std::int32_t>(),
                                 info.routing.ids.data_as<const std::int32_t>() + info.routing.ids.numel());
  const double touched_bytes = static_cast<double>(touched.size()) * static_cast<double>(nbytes) / E;
  // The touched experts' bytes (the warm-up's pages of the same file count where they overlap),
  // the router's E · D f32 and the activations: within 1.1 × the touched bytes + 1 MiB.
  EXPECT_LT(fwd_growth, 1.1 * touched_bytes + static_cast<double>(E * D * 4 + (1 << 20)));
  std::printf(
      "[ RSS      ] FP8 experts %.1f MiB; after load +%.2f MiB; after forward (T=%lld, %zu experts = %.2f MiB "
      "touched) +%.2f MiB (%.2f x touched)\n",
      mib(static_cast<double>(nbytes)), mib(load_growth), static_cast<long long>(T), touched.size(), mib(touched_bytes),
      mib(fwd_growth), fwd_growth / touched_bytes);
  RecordProperty("rss_forward_growth_bytes", std::to_string(static_cast<long long>(fwd_growth)));
}

// [begin, end) of every mapping of `file` in this process (from /proc/self/maps).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> mappings_of(const std::string& file) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> out;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < file.size() ||
        line.compare(line.size() - file.size(), file.size(), file) != 0)
      continue;
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) out.emplace_back(lo, hi);
  }
  return out;
}

// `mapped` means what it says: every expert matrix points into the file's mapping (and nowhere
// else for layouts that are copied).
TEST(MappedMemory, ExpertPointersLieInTheMappedFile) {
  using testing::ExpertLayout;
  const nlohmann::json config = {
      {"model_type", "qwen3_moe"}, {"hidden_size", 32},      {"moe_intermediate_size", 16},
      {"intermediate_size", 16},   {"num_hidden_layers", 1}, {"num_experts", 8},
      {"num_experts_per_tok", 2},  {"norm_topk_prob", true}, {"hidden_act", "silu"}};
  const testing::ExpertSet experts = testing::ExpertSet::random(8, 16, 32, 1);
  for (const ExpertLayout layout :
       {ExpertLayout::per_expert, ExpertLayout::fused_gate_up, ExpertLayout::switch_mlp}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      TempDir tmp("pointers");
      testing::CheckpointBuilder b(config);
      b.add("model.layers.0.mlp.gate.weight", testing::random_f32({8, 32}, 2));
      b.add(testing::expert_entries(experts, layout, "model.layers.0.mlp", dtype));
      b.write(tmp.path());
      const MoeLayer layer = load_moe_layer(tmp.path().string(), 0);
      SCOPED_TRACE(layer.weights().layout + " " + dtype_name(dtype));
      ASSERT_TRUE(layer.weights().mapped);
      const auto maps = mappings_of(tmp.file("model.safetensors"));
      ASSERT_FALSE(maps.empty());
      const auto inside = [&](const void* p, std::size_t n) {
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        for (const auto& [lo, hi] : maps)
          if (a >= lo && a + n <= hi) return true;
        return false;
      };
      const ExpertWeights& w = layer.weights().experts;
      for (const ExpertMatrix* m : {&w.gate, &w.up, &w.down})
        for (const void* p : m->experts)
          EXPECT_TRUE(
              inside(p, static_cast<std::size_t>(m->rows * m->row_stride) * dtype_size(m->dtype)));
    }
  }
  // A transposed layout is copied: its matrices live outside the file.
  TempDir tmp("pointers_t");
  nlohmann::json l4 = {{"model_type", "llama4_text"}, {"hidden_size", 32},
                       {"intermediate_size", 16},     {"num_hidden_layers", 1},
                       {"num_local_experts", 8},      {"num_experts_per_tok", 1}};
  testing::CheckpointBuilder b(l4);
  b.add("model.layers.0.feed_forward.router.weight", testing::random_f32({8, 32}, 2));
  b.add(testing::expert_entries(experts, ExpertLayout::fused_gate_up_transposed,
                                "model.layers.0.feed_forward"));
  for (const char* p : {"gate_proj", "up_proj"})
    b.add(std::string("model.layers.0.feed_forward.shared_expert.") + p + ".weight",
          testing::random_f32({16, 32}, 3));
  b.add("model.layers.0.feed_forward.shared_expert.down_proj.weight",
        testing::random_f32({32, 16}, 4));
  b.write(tmp.path());
  const MoeLayer layer = load_moe_layer(tmp.path().string(), 0);
  EXPECT_FALSE(layer.weights().mapped);
  const auto maps = mappings_of(tmp.file("model.safetensors"));
  for (const void* p : layer.weights().experts.up.experts)
    for (const auto& [lo, hi] : maps)
      EXPECT_FALSE(reinterpret_cast<std::uintptr_t>(p) >= lo &&
                   reinterpret_cast<std::uintptr_t>(p) < hi);
}

// The layer holds its mapping: removing the folder after loading changes nothing.
TEST(MappedMemory, LayerOutlivesItsFolder) {
  const nlohmann::json config = {
      {"model_type", "qwen3_moe"}, {"hidden_size", 32},      {"moe_intermediate_size", 16},
      {"intermediate_size", 16},   {"num_hidden_layers", 1}, {"num_experts", 8},
      {"num_experts_per_tok", 2},  {"norm_topk_prob", true}, {"hidden_act", "silu"}};
  const Tensor x = testing::random_f32({6, 32}, 9);
  std::unique_ptr<MoeLayer> layer;
  Tensor y0;
  {
    TempDir tmp("outlive");
    testing::CheckpointBuilder b(config);
    b.add("model.layers.0.mlp.gate.weight", testing::random_f32({8, 32}, 2));
    b.add(testing::expert_entries(testing::ExpertSet::random(8, 16, 32, 1),
                                  testing::ExpertLayout::per_expert, "model.layers.0.mlp"));
    b.write(tmp.path());
    layer = std::make_unique<MoeLayer>(load_moe_layer(tmp.path().string(), 0));
    y0 = layer->forward(x);
  }
  const Tensor y1 = layer->forward(x);
  EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.nbytes()), 0);
}

}  // namespace
}  // namespace moekit
