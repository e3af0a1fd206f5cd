// moekit quantize against mlx and mlx-lm (tools/gen_quantize_goldens.py):
//  - the row quantizer gives mlx.core.quantize's codes, scales and biases bit for bit;
//  - quantize_checkpoint on a whole tiny model of each family writes what mlx_lm.convert writes
//    (same tensors, same bytes, same `quantization` entries, same index metadata), and moekit's
//    forward on its own output equals mlx-lm's MoE module on mlx-lm's output;
//  - bad options and bad checkpoints are named errors that leave nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors_writer.hpp"
#include "kernels/quantize.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/quantize.hpp"
#include "moekit/safetensors.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantize";

json manifest() {
  std::ifstream in(kDir + "/manifest.json");
  return json::parse(in);
}

std::uint64_t fnv1a64(const std::uint8_t* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// The generator's values(): splitmix64 of (fnv1a64(name) + i·golden), top 24 bits as u in [0, 1),
// offset + 2^amp_log2 · (2u − 1); every step exact in f32.
std::vector<float> draw(const std::string& name, std::int64_t n, int amp_log2, float offset) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(name.data());
  const std::uint64_t base = fnv1a64(bytes, name.size());
  std::vector<float> out(static_cast<std::size_t>(n));
  const float amp = std::ldexp(1.0f, amp_log2);
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint64_t z = base + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) / 16777216.0f;
    out[static_cast<std::size_t>(i)] = offset + amp * (2.0f * u - 1.0f);
  }
  return out;
}

// Rebuilds the case's float checkpoint (Hugging Face layout) in `dir`.
void write_source(const json& c, const fs::path& dir) {
  std::vector<testing::SafetensorsEntry> entries;
  for (const json& t : c.at("inputs")) {
    const Shape shape = t.at("shape").get<Shape>();
    const std::string dt = t.at("dtype").get<std::string>();
    const std::vector<float> v = draw(t.at("name").get<std::string>(), shape_numel(shape), t.at("amp_log2").get<int>(),
                                      t.at("offset").get<float>());
    std::vector<std::uint8_t> bytes;
    if (dt == "BF16") {
      std::vector<std::uint16_t> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      bytes = testing::to_bytes(h);
    } else {
      bytes = testing::to_bytes(v);
    }
    entries.push_back({t.at("name").get<std::string>(), dt, shape, std::move(bytes)});
  }
  testing::write_safetensors(dir / "model.safetensors", entries);
  testing::write_text(dir / "config.json", c.at("config").dump(2));
}

QuantizeOptions options_of(const json& c) {
  QuantizeOptions o;
  o.bits = c.at("bits").get<int>();
  o.group_size = c.at("group_size").get<int>();
  const json& x = c.at("options");
  if (x.contains("recipe")) o.recipe = x.at("recipe").get<std::string>();
  if (x.contains("router_bits")) o.router_bits = x.at("router_bits").get<int>();
  if (x.contains("dtype")) o.dtype = x.at("dtype").get<std::string>();
  return o;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

TEST(QuantizeRow, MatchesMlxCoreQuantize) {
  const auto f = SafetensorsFile::open(kDir + "/quantize_vectors.safetensors");
  for (const std::string src : {"f32", "bf16"}) {
    const TensorView w = f->view("w." + src);
    const Tensor w32 = to_dtype(w, DType::f32);
    const std::int64_t rows = w.dim(0), in = w.dim(1);
    for (const int bits : {2, 3, 4, 5, 6, 8})
      for (const int group : {32, 64, 128}) {
        const std::string key = src + ".b" + std::to_string(bits) + ".g" + std::to_string(group);
        const std::uint8_t* want_codes = f->bytes(key + ".codes");
        const Tensor want_s = to_dtype(f->view(key + ".scales"), DType::f32);
        const Tensor want_b = to_dtype(f->view(key + ".biases"), DType::f32);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t words = in * bits / 32, groups = in / group;
          std::vector<std::uint32_t> codes(static_cast<std::size_t>(words));
          std::vector<float> s(static_cast<std::size_t>(groups)), b(s.size());
          kernels::quantize_affine_row(w32.data_as<const float>() + r * in, in, bits, group, codes.data(), s.data(),
                                       b.data());
          EXPECT_EQ(std::memcmp(codes.data(), want_codes + r * words * 4, static_cast<std::size_t>(words) * 4), 0)
              << key << " row " << r;
          for (std::int64_t g = 0; g < groups; ++g) {
            const float ss = src == "bf16" ? bf16_to_f32(f32_to_bf16(s[g])) : s[g];
            const float bb = src == "bf16" ? bf16_to_f32(f32_to_bf16(b[g])) : b[g];
            EXPECT_EQ(ss, want_s.data_as<const float>()[r * groups + g]) << key << " row " << r << " group " << g;
            EXPECT_EQ(bb, want_b.data_as<const float>()[r * groups + g]) << key << " row " << r << " group " << g;
          }
        }
      }
  }
}

json case_named(const std::string& name) {
  const json m = manifest();
  for (const json& c : m.at("cases"))
    if (c.at("name") == name) return c;
  throw std::runtime_error("no case " + name);
}

class QuantizeAsMlxLm : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeAsMlxLm, WritesWhatMlxLmConvertWrites) {
  const json c = case_named(GetParam());
  testing::TempDir tmp("quantize");
  const fs::path src = tmp.path() / "hf", dst = tmp.path() / "mlx";
  fs::create_directories(src);
  write_source(c, src);
  const QuantizeReport report = quantize_checkpoint(src.string(), dst.string(), options_of(c));
  EXPECT_FALSE(fs::exists(dst.string() + ".partial"));

  // The same tensors, byte for byte.
  const auto out = Checkpoint::open(dst.string());
  std::vector<std::string> want_names;
  for (const json& t : c.at("outputs")) {
    const std::string name = t.at("name").get<std::string>();
    want_names.push_back(name);
    ASSERT_TRUE(out->contains(name)) << name;
    const TensorInfo& info = out->info(name);
    EXPECT_EQ(info.dtype_name, t.at("dtype").get<std::string>()) << name;
    EXPECT_EQ(info.shape, t.at("shape").get<Shape>()) << name;
    const std::uint8_t* raw = nullptr;
    for (const auto& f : out->files())
      if (f->contains(name)) raw = f->bytes(name);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(fnv1a64(raw, info.end - info.begin)));
    EXPECT_EQ(hex, t.at("fnv1a64").get<std::string>()) << name << " differs from mlx_lm's bytes";
  }
  std::sort(want_names.begin(), want_names.end());
  EXPECT_EQ(out->names(), want_names);
  EXPECT_EQ(report.tensors_written, static_cast<std::int64_t>(want_names.size()));

  // The same config entries and index metadata.
  const json cfg = read_json(dst / "config.json");
  EXPECT_EQ(cfg.at("quantization"), c.at("quantization"));
  EXPECT_EQ(cfg.at("quantization_config"), c.at("quantization"));
  const json index = read_json(dst / "model.safetensors.index.json");
  EXPECT_EQ(index.at("metadata"), c.at("index_metadata"));

  // moekit's forward on its own output equals mlx-lm's module on mlx-lm's output.
  const std::string gdir = kDir + "/" + c.at("name").get<std::string>();
  const MoeLayer layer = load_moe_layer(dst.string(), c.at("layer").get<std::int64_t>());
  EXPECT_TRUE(layer.weights().experts.up.quantized());
  const Tensor x = read_npy(gdir + "/input.npy");
  const Tensor want = read_npy(gdir + "/output.npy");
  const Tensor y = layer.forward(x);
  ASSERT_EQ(y.shape(), want.shape());
  double max_ref = 0, max_err = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want.data_as<float>()[i])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(y.data_as<float>()[i]) - want.data_as<float>()[i]));
  }
  EXPECT_LE(max_err, 1e-5 * max_ref) << "max |y - y_mlx| = " << max_err << ", max |y_mlx| = " << max_ref;
}

std::vector<std::string> case_names() {
  std::vector<std::string> out;
  const json m = manifest();
  for (const json& c : m.at("cases")) out.push_back(c.at("name").get<std::string>());
  return out;
}

INSTANTIATE_TEST_SUITE_P(MlxLm, QuantizeAsMlxLm, ::testing::ValuesIn(case_names()),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace moekit
