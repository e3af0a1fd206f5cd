// moekit quantize against mlx and mlx-lm (tools/gen_quantize_goldens.py):
//  - the row quantizer gives mlx.core.quantize's codes, scales and biases bit for bit;
//  - quantize_checkpoint on a whole tiny model of each family writes what mlx_lm.convert writes
//    (same tensors, same bytes, same `quantization` entries, same index metadata), and moekit's
//    forward on its own output equals mlx-lm's MoE module on mlx-lm's output;
//  - bad options and bad checkpoints are named errors that leave nothing behind.
#include "kernels/quantize.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/family.hpp"
#include "io/safetensors_writer.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/quantize.hpp"
#include "moekit/safetensors.hpp"
#include "util/compare.hpp"
#include "util/mlx_tiny_models.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::case_named;
using testing::draw;
using testing::fnv1a64;
using testing::kQuantizeDir;
using testing::manifest;
using testing::write_source;
const std::string kDir = kQuantizeDir;

QuantizeOptions options_of(const json& c) {
  QuantizeOptions o;
  o.bits = c.at("bits").get<int>();
  o.group_size = c.at("group_size").get<int>();
  const json& x = c.at("options");
  if (x.contains("recipe")) o.recipe = x.at("recipe").get<std::string>();
  if (x.contains("router_bits")) o.router_bits = x.at("router_bits").get<int>();
  if (x.contains("dtype")) o.dtype = x.at("dtype").get<std::string>();
  if (x.contains("mode")) o.mode = x.at("mode").get<std::string>();
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

// mlx's fp modes: the codes and scale bytes mx.quantize(..., mode=M) returns for f32, bf16 and f16
// weights (its CPU quantizer computes in the weights' dtype), byte for byte, on rows that hit the
// edge cases (zeros, constants, tiny values whose scales underflow, a spike, wide ranges).
TEST(QuantizeFpRow, MatchesMlxQuantizeByteForByte) {
  const auto f = SafetensorsFile::open(kDir + "/quantize_vectors.safetensors");
  for (const auto& [src, dtype] :
       {std::pair{"f32", DType::f32}, std::pair{"bf16", DType::bf16}, std::pair{"f16", DType::f16}}) {
    const Tensor w32 = to_dtype(f->view(std::string("wfp.") + src), DType::f32);
    const std::int64_t rows = w32.dim(0), in = w32.dim(1);
    for (const auto& [name, mode, group, bits] :
         {std::tuple{"mxfp4", kernels::FpMode::mxfp4, 32, 4}, std::tuple{"nvfp4", kernels::FpMode::nvfp4, 16, 4},
          std::tuple{"mxfp8", kernels::FpMode::mxfp8, 32, 8}}) {
      const std::string key = std::string(src) + "." + name;
      const std::uint8_t* want_codes = f->bytes(key + ".codes");
      const std::uint8_t* want_scales = f->bytes(key + ".scales");
      const std::int64_t words = in * bits / 32, groups = in / group;
      for (std::int64_t r = 0; r < rows; ++r) {
        // Rows that overflow f16 are not weights moekit quantize accepts (it refuses non-finite rows).
        const float* row = w32.data_as<const float>() + r * in;
        if (!std::all_of(row, row + in, [](float v) { return std::isfinite(v); })) continue;
        std::vector<std::uint32_t> codes(static_cast<std::size_t>(words));
        std::vector<std::uint8_t> scales(static_cast<std::size_t>(groups));
        kernels::quantize_fp_row(w32.data_as<const float>() + r * in, in, mode, dtype, codes.data(), scales.data());
        EXPECT_EQ(std::memcmp(scales.data(), want_scales + r * groups, scales.size()), 0) << key << " row " << r;
        for (std::int64_t i = 0; i < words; ++i) {
          std::uint32_t want;
          std::memcpy(&want, want_codes + (r * words + i) * 4, 4);
          EXPECT_EQ(codes[static_cast<std::size_t>(i)], want) << key << " row " << r << " word " << i;
          if (codes[static_cast<std::size_t>(i)] != want) break;
        }
      }
    }
  }
}

class QuantizeAsMlxLm : public ::testing::TestWithParam<std::string> {};

// `dst`, quantized from case `c`'s source, holds what mlx_lm.convert wrote: the same tensors byte
// for byte, the same `quantization` entries and index metadata, and a layer whose forward equals
// mlx-lm's module on mlx-lm's output.
void expect_written_as_mlx_lm(const json& c, const fs::path& dst, const QuantizeReport& report) {
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
    const std::uint8_t* raw = out->bytes(name);
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
  const testing::MaxDiff d = testing::max_diff(y, want);
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_mlx| = " << d.err << ", max |y_mlx| = " << d.ref;
}

TEST_P(QuantizeAsMlxLm, WritesWhatMlxLmConvertWrites) {
  const json c = case_named(GetParam());
  testing::TempDir tmp("quantize");
  const fs::path src = tmp.path() / "hf", dst = tmp.path() / "mlx";
  fs::create_directories(src);
  write_source(c, src);
  QuantizeOptions opt = options_of(c);
  opt.slab_values = 3000;  // many slabs per tensor (one expert, head or a few rows each): the same bytes
  const QuantizeReport report = quantize_checkpoint(src.string(), dst.string(), opt);
  EXPECT_FALSE(fs::exists(dst.string() + ".partial"));
  expect_written_as_mlx_lm(c, dst, report);
}

// A model_type that loads with another family's mlx-lm module (family.hpp's table) is written as
// that family: the same bytes as the family's own golden.
TEST(Quantize, AliasesWriteAsTheirFamily) {
  for (const auto& [name, alias] : {std::pair{"deepseek_v3_q4_g32", "kimi_k2"},
                                    std::pair{"minimax_q4_g128_router_float", "minimax_m2"}}) {
    SCOPED_TRACE(alias);
    json c = case_named(name);
    testing::TempDir tmp("quantize_alias");
    const fs::path src = tmp.path() / "hf", dst = tmp.path() / "mlx";
    fs::create_directories(src);
    write_source(c, src);
    json cfg = c.at("config");
    cfg["model_type"] = alias;
    testing::write_text(src / "config.json", cfg.dump(2));
    const QuantizeReport report = quantize_checkpoint(src.string(), dst.string(), options_of(c));
    EXPECT_EQ(report.model_type, alias);
    EXPECT_EQ(read_json(dst / "config.json").at("model_type"), alias);
    expect_written_as_mlx_lm(c, dst, report);
  }
}

// The cases' names are their folders' (each holds the case's input and mlx-lm's output): listing a
// folder costs nothing beside parsing the 250 KB manifest, and this runs as each test process starts.
std::vector<std::string> case_names() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kDir, ec))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every case of the manifest has its folder, and every folder is a case.
TEST(Quantize, EveryManifestCaseHasItsFolder) {
  const json m = manifest();
  std::vector<std::string> names;
  for (const json& c : m.at("cases")) names.push_back(c.at("name").get<std::string>());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, case_names());
  EXPECT_FALSE(names.empty());
}

INSTANTIATE_TEST_SUITE_P(MlxLm, QuantizeAsMlxLm, ::testing::ValuesIn(case_names()),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// A valid source folder (the first golden case's model), for breaking one thing at a time.
struct Source {
  testing::TempDir tmp{"quantize_err"};
  fs::path src = tmp.path() / "hf";
  json c = case_named("qwen3_moe_q4_g64");
  Source() {
    fs::create_directories(src);
    write_source(c, src);
  }
  std::string out() const { return (tmp.path() / "out").string(); }
};

// The call throws std::invalid_argument whose message contains every one of `needles`, and
// leaves neither the output folder nor its .partial sibling behind.
void expect_refused(const Source& s, const QuantizeOptions& o, const std::vector<std::string>& needles) {
  try {
    quantize_checkpoint(s.src.string(), s.out(), o);
    ADD_FAILURE() << "no error; expected one containing '" << needles.at(0) << "'";
  } catch (const std::invalid_argument& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(s.out() + ".partial"));
}

TEST(Quantize, BadOptionsAreNamed) {
  Source s;
  QuantizeOptions o;
  o.bits = 7;
  expect_refused(s, o, {"bits 7"});
  o = {};
  o.group_size = 48;
  expect_refused(s, o, {"group size 48"});
  o = {};
  o.router_bits = 1;
  expect_refused(s, o, {"router bits 1"});
  o = {};
  o.recipe = "mixed_9_9";
  expect_refused(s, o, {"unknown recipe 'mixed_9_9'", "mixed_3_6"});
  o = {};
  o.recipe = "mixed_3_6";
  o.router_bits = 8;
  expect_refused(s, o, {"--router-bits"});
  o = {};
  o.dtype = "float64";
  expect_refused(s, o, {"dtype 'float64'"});
  o = {};
  o.mode = "mxfp6";
  expect_refused(s, o, {"mode 'mxfp6'", "affine, mxfp4, nvfp4 or mxfp8"});
  o = {};
  o.mode = "mxfp4";  // bits 4 group 64: not the mode's group
  expect_refused(s, o, {"mode mxfp4 is 4 bits in groups of 32", "group size 64"});
  o = {};
  o.mode = "mxfp8";
  o.bits = 8;
  o.group_size = 32;
  o.recipe = "mixed_3_6";
  expect_refused(s, o, {"mixed recipes are affine only"});
  EXPECT_FALSE(fs::exists(s.out()));
}

TEST(Quantize, NeverOverwrites) {
  Source s;
  fs::create_directories(s.out());
  testing::write_text(fs::path(s.out()) / "keep.txt", "mine");
  expect_refused(s, {}, {"already exists"});
  std::ifstream in(fs::path(s.out()) / "keep.txt");
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "mine");
}

TEST(Quantize, RefusesQuantizedAndUnknownCheckpoints) {
  {
    Source s;  // already quantized: config.json says so
    json cfg = s.c.at("config");
    cfg["quantization"] = {{"bits", 4}, {"group_size", 64}};
    testing::write_text(s.src / "config.json", cfg.dump());
    expect_refused(s, {}, {"already quantized"});
  }
  {
    Source s;  // a family this writer does not lay out
    json cfg = s.c.at("config");
    cfg["model_type"] = "llama4_text";
    testing::write_text(s.src / "config.json", cfg.dump());
    EXPECT_THROW(quantize_checkpoint(s.src.string(), s.out(), {}), std::exception);
    EXPECT_FALSE(fs::exists(s.out()));
  }
  {
    Source s;
    json cfg = s.c.at("config");
    cfg["model_type"] = "deepseek_v32";
    cfg["n_routed_experts"] = 4;
    cfg["n_group"] = 1;
    cfg["topk_group"] = 1;
    testing::write_text(s.src / "config.json", cfg.dump());
    expect_refused(s, {}, {"deepseek_v32", "not written yet"});
  }
}

// Every model_type of family.hpp's table that moekit quantize does not lay out is refused with
// the row's reason and the families it does write, aliases included.
TEST(Quantize, RefusesFamiliesNotWritten) {
  int refused = 0;
  for (const detail::ModelType& t : detail::kModelTypes) {
    if (!t.mlx_module.empty()) continue;
    Source s;
    json cfg = s.c.at("config");
    cfg["model_type"] = std::string(t.name);
    // The fields every family's reader needs, so the config parses and quantize decides.
    cfg["n_routed_experts"] = 4;
    cfg["num_local_experts"] = 4;
    cfg["n_group"] = 1;
    cfg["topk_group"] = 1;
    testing::write_text(s.src / "config.json", cfg.dump());
    expect_refused(s, {}, {std::string(t.name) + ": not written yet: " + std::string(t.not_written),
                           "(families written: deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, minimax, mixtral, olmoe, "
                           "qwen2_moe, qwen3_moe, kimi_k2, minimax_m2)"});
    EXPECT_FALSE(fs::exists(s.out()));
    ++refused;
  }
  EXPECT_EQ(refused, 4);  // deepseek_v32, glm4_moe_lite, llama4, llama4_text
}

// Rewrites the source with one tensor changed by `edit` (name -> entry, or erased if it returns false).
void rewrite(Source& s, const std::function<bool(testing::SafetensorsEntry&)>& edit) {
  const auto f = SafetensorsFile::open((s.src / "model.safetensors").string());
  std::vector<testing::SafetensorsEntry> entries;
  for (const std::string& n : f->names()) {
    const TensorInfo& i = f->info(n);
    testing::SafetensorsEntry e{n, i.dtype_name, i.shape, {f->bytes(n), f->bytes(n) + (i.end - i.begin)}};
    if (edit(e)) entries.push_back(std::move(e));
  }
  testing::write_safetensors(s.src / "model.safetensors.new", entries);
  fs::rename(s.src / "model.safetensors.new", s.src / "model.safetensors");
}

TEST(Quantize, BadTensorsAreNamed) {
  {
    Source s;  // a missing expert
    rewrite(s, [](auto& e) { return e.name != "model.layers.1.mlp.experts.2.up_proj.weight"; });
    expect_refused(s, {}, {"model.layers.1.mlp.experts.2.up_proj.weight", "expert 2 of 4"});
  }
  {
    Source s;  // an expert of another shape
    rewrite(s, [](auto& e) {
      if (e.name == "model.layers.0.mlp.experts.3.gate_proj.weight") {
        e.shape = {32, 128};
        e.bytes.resize(32 * 128 * 2);
      }
      return true;
    });
    expect_refused(s, {}, {"model.layers.0.mlp.experts.3.gate_proj.weight", "(32, 128)"});
  }
  {
    Source s;  // a NaN in a weight: named with its row
    rewrite(s, [](auto& e) {
      if (e.name == "model.layers.1.mlp.experts.1.down_proj.weight") {
        const std::uint16_t nan = 0x7fc0;
        std::memcpy(e.bytes.data() + (5 * 64 + 3) * 2, &nan, 2);
      }
      return true;
    });
    expect_refused(s, {}, {"model.layers.1.mlp.experts.1.down_proj.weight", "row 5", "NaN"});
  }
  {
    Source s;  // a stray tensor under the experts prefix
    rewrite(s, [](auto& e) {
      if (e.name == "model.layers.0.mlp.experts.0.up_proj.weight") e.name = "model.layers.0.mlp.experts.gate_up_proj";
      return true;
    });
    expect_refused(s, {}, {"model.layers.0.mlp.experts"});
  }
  {
    Source s;  // MXFP4 blocks (OpenAI's GPT-OSS release)
    rewrite(s, [](auto& e) {
      if (e.name == "model.layers.0.self_attn.o_proj.weight") {
        e.name = "model.layers.0.self_attn.o_proj_blocks";
        e.dtype = "U8";
        e.bytes.resize(e.bytes.size() / 2);
      }
      return true;
    });
    expect_refused(s, {}, {"model.layers.0.self_attn.o_proj_blocks", "MXFP4"});
  }
  {
    Source s;  // FP8 weights
    rewrite(s, [](auto& e) {
      if (e.name == "model.layers.0.self_attn.q_proj.weight") {
        e.dtype = "F8_E4M3";
        e.bytes.resize(e.bytes.size() / 2);
      }
      return true;
    });
    expect_refused(s, {}, {"model.layers.0.self_attn.q_proj.weight", "F8_E4M3"});
  }
}

TEST(Quantize, ShardsAndErrorReport) {
  Source s;
  QuantizeOptions o;
  o.max_shard_bytes = 64 * 1024;  // forces several shards, named and indexed as mlx-lm names them
  const QuantizeReport r = quantize_checkpoint(s.src.string(), s.out(), o);
  EXPECT_GT(r.shards, 1);
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", static_cast<int>(r.shards));
  EXPECT_TRUE(fs::exists(fs::path(s.out()) / first));
  const json index = read_json(fs::path(s.out()) / "model.safetensors.index.json");
  EXPECT_EQ(index.at("weight_map").size(), static_cast<std::size_t>(r.tensors_written));
  const auto ck = Checkpoint::open(s.out());
  EXPECT_EQ(ck->names().size(), static_cast<std::size_t>(r.tensors_written));
  // The same bytes as one shard: every tensor as mlx-lm wrote it.
  for (const json& t : s.c.at("outputs")) EXPECT_TRUE(ck->contains(t.at("name").get<std::string>()));
  // The error report: weights in ±1/8 (a group spans at most 1/4) stay within one code step.
  ASSERT_FALSE(r.quantized.empty());
  for (const QuantizedTensorReport& q : r.quantized) {
    EXPECT_GT(q.rms_error, 0) << q.name;
    EXPECT_LT(q.rms_error, 0.1 * q.rms_weight * (q.bits == 4 ? 1.0 : 0.2)) << q.name;
    // mlx moves the step so the group's larger endpoint is exact: within one step, not half.
    EXPECT_LE(q.max_abs_error, 0.25 / ((1 << q.bits) - 1) * 1.01) << q.name;
  }
}

}  // namespace
}  // namespace moekit
