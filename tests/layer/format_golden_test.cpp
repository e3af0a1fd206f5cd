// Released weight formats, decoded by the references' own code (tools/gen_format_goldens.py,
// tests/goldens/formats/): moekit loads each folder as released, its decode of every weight is the
// reference's bit for bit (the scalar reference and the kernels' own decoding), and the block's
// forward matches the reference to 1e-5 relative. Then each way a file can be wrong, one named
// error each.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/run_cli.hpp"
#include "experts/weight_matrix.hpp"
#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/threading.hpp"
#include "moekit/train.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/formats";
const std::string kMxfp4 = kDir + "/mxfp4_gpt_oss";
const std::string kExperts = "model.layers.1.mlp.experts";

TEST(Mxfp4Golden, LoadsInPlaceAndMatchesTransformers) {
  const MoeLayer layer = load_moe_layer(kMxfp4, 1);
  const ExpertWeights& ex = layer.weights().experts;
  for (const ExpertMatrix* m : {&ex.gate, &ex.up, &ex.down}) {
    EXPECT_EQ(m->format, WeightFormat::mxfp4());
    EXPECT_EQ(m->describe(), "mxfp4 (e2m1, group 32, f8_e8m0 scales)");
  }
  EXPECT_TRUE(layer.weights().mapped) << "MXFP4 experts are used in place";
  EXPECT_EQ(layer.weights().layout, "mxfp4_interleaved");
  // Codes and scales only: 4.25 bits per weight.
  const std::int64_t E = 8, D = 64, F = 32;
  EXPECT_EQ(ex.nbytes(), static_cast<std::size_t>(3 * E * F * D / 2 + 3 * E * F * D / 32));
  const Tensor x = read_npy(kMxfp4 + "/input.npy");
  const Tensor want = read_npy(kMxfp4 + "/output.npy");
  const Tensor y = layer.forward(x);
  ASSERT_EQ(y.shape(), want.shape());
  const testing::MaxDiff d = testing::max_diff(y, want);
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
  RecordProperty("rel_err", std::to_string(d.err / d.ref));
}

// One expert's [rows, cols] decoded by the format's scalar reference and by the kernels, each
// compared bit for bit (−0 included) with the reference's rows `first, first + step, ...`.
void expect_decoded(const ExpertMatrix& m, std::int64_t e, const TensorView& ref, std::int64_t first, std::int64_t step,
                    const char* what) {
  const std::int64_t rows = m.rows, cols = m.cols;
  const kernels::WeightMatrix w = weight_matrix(m, e);
  std::vector<float> scalar(static_cast<std::size_t>(rows * cols)), simd(scalar.size());
  kernels::ref::dequantize(w, rows, cols, scalar.data());
  kernels::dequantize_rows(w, 0, rows, cols, simd.data());
  const float* r = ref.data_as<const float>() + e * ref.dim(1) * cols;
  for (std::int64_t n = 0; n < rows; ++n) {
    const float* want = r + (first + n * step) * cols;
    ASSERT_EQ(std::memcmp(scalar.data() + n * cols, want, static_cast<std::size_t>(cols) * 4), 0)
        << what << " expert " << e << " row " << n << ": scalar decode differs from the reference";
    ASSERT_EQ(std::memcmp(simd.data() + n * cols, want, static_cast<std::size_t>(cols) * 4), 0)
        << what << " expert " << e << " row " << n << ": the kernels' decode differs from the reference";
  }
}

TEST(Mxfp4Golden, DecodesEveryWeightAsTransformersDoes) {
  const MoeLayer layer = load_moe_layer(kMxfp4, 1);
  const ExpertWeights& ex = layer.weights().experts;
  const auto decoded = Checkpoint::open(kMxfp4 + "/decoded.safetensors");
  const TensorView gate_up = decoded->view(kExperts + ".gate_up_proj");  // [E, 2F, D], gate/up interleaved
  const TensorView down = decoded->view(kExperts + ".down_proj");        // [E, D, F]
  for (std::int64_t e = 0; e < ex.num_experts(); ++e) {
    expect_decoded(ex.gate, e, gate_up, 0, 2, "gate");
    expect_decoded(ex.up, e, gate_up, 1, 2, "up");
    expect_decoded(ex.down, e, down, 0, 1, "down");
  }
}

// Fine-tuning from the release: trainable_parameters widens the MXFP4 experts to exactly the
// reference's decoded values, and a layer built from them computes the same bits as the MXFP4 layer
// (the quantized kernels multiply the decoded values in the f32 rows kernel's order).
TEST(Mxfp4Golden, WidensExactlyForTraining) {
  const MoeLayer layer = load_moe_layer(kMxfp4, 1);
  const MoeTensors p = trainable_parameters(layer);
  const auto decoded = Checkpoint::open(kMxfp4 + "/decoded.safetensors");
  const TensorView gate_up = decoded->view(kExperts + ".gate_up_proj");  // [E, 2F, D]
  const std::int64_t E = 8, F = 32, D = 64;
  ASSERT_EQ(p.gate.shape(), (Shape{E, F, D}));
  for (std::int64_t e = 0; e < E; ++e)
    for (std::int64_t f = 0; f < F; ++f) {
      const float* want_gate = gate_up.data_as<const float>() + (e * 2 * F + 2 * f) * D;
      const float* want_up = want_gate + D;
      ASSERT_EQ(std::memcmp(p.gate.data_as<const float>() + (e * F + f) * D, want_gate, D * 4), 0) << e << " " << f;
      ASSERT_EQ(std::memcmp(p.up.data_as<const float>() + (e * F + f) * D, want_up, D * 4), 0) << e << " " << f;
    }
  const MoeLayer trainable = make_trainable_layer(layer.config(), p);
  const Tensor x = read_npy(kMxfp4 + "/input.npy");
  const Tensor y = layer.forward(x), y_trainable = trainable.forward(x);
  ASSERT_EQ(std::memcmp(y.data(), y_trainable.data(), y.nbytes()), 0) << "the widened layer computes other bits";
}

// ---- FP8 -------------------------------------------------------------------------------------

const std::string kFp8Block = kDir + "/fp8_deepseek_v3";      // quant_method fp8, 128 × 128, F32 scale_inv
const std::string kFp8Channel = kDir + "/fp8_channel_qwen3";  // compressed-tensors, a BF16 scale per row

// Every routed and shared projection of `dir` decoded bit for bit as the reference decoded it
// (reference/decoded.safetensors holds its decode under each stored name).
void expect_release_decoded(const std::string& dir, const MoeLayer& layer) {
  const auto decoded = Checkpoint::open(dir + "/reference/decoded.safetensors");
  const MoeWeights& w = layer.weights();
  const char* names[] = {"gate_proj", "up_proj", "down_proj"};
  const auto check = [&](const ExpertWeights& ex, const std::string& prefix, bool per_expert) {
    const ExpertMatrix* m[] = {&ex.gate, &ex.up, &ex.down};
    for (std::int64_t e = 0; e < ex.num_experts(); ++e)
      for (int p = 0; p < 3; ++p) {
        const std::string name =
            w.block + "." + prefix + (per_expert ? std::to_string(e) + "." : "") + names[p] + ".weight";
        const TensorView ref = decoded->view(name);
        const TensorView as_one(ref.data(), {1, ref.dim(0), ref.dim(1)}, DType::f32);
        expect_decoded(m[p]->select({e}), 0, as_one, 0, 1, name.c_str());
        if (::testing::Test::HasFatalFailure()) return;
      }
  };
  check(w.experts, "experts.", true);
  if (w.shared.down.defined() && w.shared.down.quantized()) check(w.shared, "shared_experts.", false);
}

TEST(Fp8Golden, BlockScaledLoadsInPlaceAndMatchesTheReference) {
  const MoeLayer layer = load_moe_layer(kFp8Block, 1);
  const MoeWeights& w = layer.weights();
  for (const ExpertWeights* ex : {&w.experts, &w.shared})
    for (const ExpertMatrix* m : {&ex->gate, &ex->up, &ex->down}) {
      EXPECT_EQ(m->format, WeightFormat::fp8(128, 128, DType::f32));
      EXPECT_EQ(m->describe(), "fp8 e4m3, 128 × 128 blocks, f32 scales");
    }
  EXPECT_TRUE(w.mapped) << "FP8 experts are used in place";
  // D = 160, F = 96: [96, 160] has 1 × 2 blocks, [160, 96] 2 × 1 (ragged edges); 1 byte per weight.
  const std::int64_t E = 8, D = 160, F = 96;
  EXPECT_EQ(w.experts.nbytes(), static_cast<std::size_t>(3 * E * F * D + 3 * E * 2 * 4));
  const Tensor x = read_npy(kFp8Block + "/input.npy");
  const Tensor want = read_npy(kFp8Block + "/output.npy");
  const Tensor y = layer.forward(x);
  ASSERT_EQ(y.shape(), want.shape());
  const testing::MaxDiff d = testing::max_diff(y, want);
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
  RecordProperty("rel_err", std::to_string(d.err / d.ref));
  for (const int t : {1, 2}) {  // a thread's share starting inside a 128-row block computes the same bits
    set_num_threads(t);
    const Tensor yt = layer.forward(x);
    EXPECT_EQ(std::memcmp(yt.data(), y.data(), y.nbytes()), 0) << t << " threads";
  }
}

TEST(Fp8Golden, BlockScaledDecodesAsTransformers) {
  const MoeLayer layer = load_moe_layer(kFp8Block, 1);
  expect_release_decoded(kFp8Block, layer);
}

TEST(Fp8Golden, PerChannelMatchesCompressedTensors) {
  const MoeLayer layer = load_moe_layer(kFp8Channel, 1);
  WeightFormat want = WeightFormat::fp8(1, 64, DType::bf16);
  want.decode_dtype = DType::bf16;  // compressed-tensors multiplies in the scale's dtype
  EXPECT_EQ(layer.weights().experts.gate.format, want);
  EXPECT_EQ(layer.weights().experts.down.format.block_cols, 32);
  expect_release_decoded(kFp8Channel, layer);
  const Tensor x = read_npy(kFp8Channel + "/input.npy");
  const Tensor want_y = read_npy(kFp8Channel + "/output.npy");
  const testing::MaxDiff d = testing::max_diff(layer.forward(x), want_y);
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
}

// Fine-tuning from an FP8 release: the fp32 copy holds exactly the reference's decoded weights.
TEST(Fp8Golden, WidensExactlyForTraining) {
  const MoeLayer layer = load_moe_layer(kFp8Block, 1);
  const MoeTensors p = trainable_parameters(layer);
  const auto decoded = Checkpoint::open(kFp8Block + "/reference/decoded.safetensors");
  const std::int64_t F = 96, D = 160;
  for (const std::int64_t e : {0, 7}) {
    const TensorView down = decoded->view("model.layers.1.mlp.experts." + std::to_string(e) + ".down_proj.weight");
    ASSERT_EQ(std::memcmp(p.down.data_as<const float>() + e * D * F, down.data(), D * F * 4), 0) << e;
  }
  const MoeLayer trainable = make_trainable_layer(layer.config(), p, layer.weights().selection_bias);
  const Tensor x = read_npy(kFp8Block + "/input.npy");
  const Tensor y = layer.forward(x), y_trainable = trainable.forward(x);
  ASSERT_EQ(std::memcmp(y.data(), y_trainable.data(), y.nbytes()), 0) << "the widened layer computes other bits";
}

// ---- int4 (compressed-tensors pack-quantized) ------------------------------------------------

const std::string kInt4 = kDir + "/int4_kimi_k2";         // routed experts int4 group 32 BF16; shared BF16 (ignored)
const std::string kInt4Asym = kDir + "/int4_asym_qwen3";  // asymmetric: zero points, F16 scales

TEST(Int4Golden, LoadsInPlaceAndMatchesCompressedTensors) {
  const MoeLayer layer = load_moe_layer(kInt4, 1);
  const MoeWeights& w = layer.weights();
  for (const ExpertMatrix* m : {&w.experts.gate, &w.experts.up, &w.experts.down}) {
    EXPECT_EQ(m->format, WeightFormat::int4(32, DType::bf16));
    EXPECT_EQ(m->describe(), "int4 (symmetric, group 32, bf16 scales, decoded in bf16)");
  }
  EXPECT_FALSE(w.shared.down.quantized()) << "the shared experts are in the ignore list (re:.*shared_experts.*)";
  EXPECT_TRUE(w.mapped) << "int4 experts are used in place";
  const std::int64_t E = 8, D = 128, F = 64;  // 4 bits per weight + a bf16 scale per 32
  EXPECT_EQ(w.experts.nbytes(), static_cast<std::size_t>(3 * E * F * D / 2 + 3 * E * F * D / 32 * 2));
  expect_release_decoded(kInt4, layer);
  const Tensor x = read_npy(kInt4 + "/input.npy");
  const testing::MaxDiff d = testing::max_diff(layer.forward(x), read_npy(kInt4 + "/output.npy"));
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
  const MoeTensors p = trainable_parameters(layer);
  const MoeLayer trainable = make_trainable_layer(layer.config(), p, w.selection_bias);
  const Tensor y = layer.forward(x), y_trainable = trainable.forward(x);
  EXPECT_EQ(std::memcmp(y.data(), y_trainable.data(), y.nbytes()), 0) << "the widened layer computes other bits";
}

// compressed-tensors' asymmetric int4: a zero point per group (packed along the rows, unpacked at
// load beside the scales), F16 scales and the weights decoded in f16; ragged last groups and
// zero-point words of fewer than 8 rows. The fast mode stays exact on it (no bias term there).

TEST(Int4Golden, AsymmetricDecodesAsCompressedTensors) {
  MoeLayer layer = load_moe_layer(kInt4Asym, 1);
  const MoeWeights& w = layer.weights();
  for (const ExpertMatrix* m : {&w.experts.gate, &w.experts.up, &w.experts.down}) {
    EXPECT_EQ(m->format, WeightFormat::int4(32, DType::f16, true));
    EXPECT_EQ(m->describe(), "int4 (asymmetric, group 32, f16 scales, decoded in f16)");
  }
  EXPECT_TRUE(w.mapped) << "the codes are used in place";
  expect_release_decoded(kInt4Asym, layer);
  const Tensor x = read_npy(kInt4Asym + "/input.npy");
  const Tensor y = layer.forward(x);
  const testing::MaxDiff d = testing::max_diff(y, read_npy(kInt4Asym + "/output.npy"));
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
  const MoeTensors p = trainable_parameters(layer);
  const MoeLayer trainable = make_trainable_layer(layer.config(), p, w.selection_bias);
  const Tensor y_trainable = trainable.forward(x);
  EXPECT_EQ(std::memcmp(y.data(), y_trainable.data(), y.nbytes()), 0) << "the widened layer computes other bits";
  layer.set_int8_activations(true);
  const Tensor y_fast = layer.forward(x);
  EXPECT_EQ(std::memcmp(y.data(), y_fast.data(), y.nbytes()), 0) << "asymmetric int4 stays on the exact kernels";
}

// ---- bad files -----------------------------------------------------------------------------

// A copy of the golden folder with its config and tensors changed by `edit_config` / `edit`
// (which may change a tensor's bytes, shape or dtype, or drop it by clearing its name).
struct Stored {
  std::string name, dtype;
  Shape shape;
  std::vector<std::uint8_t> bytes;
};

std::string mutated(const std::string& tag, const std::function<void(nlohmann::json&)>& edit_config,
                    const std::function<void(Stored&)>& edit, const std::string& source = kMxfp4) {
  const fs::path dir = fs::temp_directory_path() / ("moekit_mxfp4_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(source + "/config.json"));
  edit_config(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const auto ckpt = Checkpoint::open(source + "/model.safetensors");
  std::vector<Stored> tensors;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo& info = ckpt->info(name);
    const std::uint8_t* p = ckpt->bytes(name);
    Stored s{name, info.dtype_name, info.shape, std::vector<std::uint8_t>(p, p + (info.end - info.begin))};
    edit(s);
    if (!s.name.empty()) tensors.push_back(std::move(s));
  }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const Stored& s : tensors) entries.push_back({s.name, s.dtype, s.shape, s.bytes.size()});
  SafetensorsWriter out((dir / "model.safetensors").string(), entries);
  for (const Stored& s : tensors) out.write(s.bytes.data(), s.bytes.size());
  out.commit();
  return dir.string();
}

void expect_error(const std::string& dir, const std::vector<std::string>& parts) {
  try {
    load_moe_layer(dir, 1);
    FAIL() << "loaded " << dir;
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

const auto kKeepConfig = [](nlohmann::json&) {};
const auto kKeepTensors = [](Stored&) {};

TEST(Mxfp4Errors, NanScaleIsNamedWithItsPosition) {
  const std::string dir = mutated("nan_scale", kKeepConfig, [](Stored& s) {
    if (s.name == kExperts + ".down_proj_scales") s.bytes[5] = 0xFF;
  });
  expect_error(dir, {"down_proj_scales", "e8m0 NaN (0xFF)", "flat index 5", "expert 0, row 5"});
}

TEST(Mxfp4Errors, MisShapedBlocksOrScales) {
  expect_error(mutated("blocks_shape", kKeepConfig,
                       [](Stored& s) {
                         if (s.name == kExperts + ".gate_up_proj_blocks") s.shape = {8, 64, 4, 8};
                       }),
               {"gate_up_proj_blocks", "has shape (8, 64, 4, 8), expected (8, 64, 2, 16)"});
  expect_error(mutated("scales_missing", kKeepConfig,
                       [](Stored& s) {
                         if (s.name == kExperts + ".down_proj_scales") s.name.clear();
                       }),
               {"down_proj_scales", "is missing", "U8 (8, 64, 1)"});
  expect_error(mutated("scales_dtype", kKeepConfig,
                       [](Stored& s) {
                         if (s.name == kExperts + ".down_proj_scales") {
                           s.dtype = "BF16";
                           s.shape = {8, 64, 1};
                           s.bytes.resize(s.bytes.size() * 2);
                         }
                       }),
               {"down_proj_scales", "has dtype BF16, expected U8"});
}

TEST(Mxfp4Errors, ConfigAndTensorsMustAgree) {
  expect_error(
      mutated(
          "unknown_method", [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "gptq"; }, kKeepTensors),
      {"quant_method 'gptq'", "supported: mxfp4"});
  expect_error(mutated(
                   "no_method", [](nlohmann::json& c) { c.erase("quantization_config"); }, kKeepTensors),
               {"gate_up_proj_blocks", "holds MXFP4 blocks", "no quant_method 'mxfp4'"});
  expect_error(mutated("no_blocks", kKeepConfig,
                       [](Stored& s) {
                         if (s.name.find("gate_up_proj_blocks") != std::string::npos) s.name.clear();
                       }),
               {"quant_method mxfp4", "gate_up_proj_blocks' is missing"});
}

// mlx's mxfp4 mode (tests/goldens/quantized/*_mxfp4, written by mlx itself and matched there to
// mlx-lm's modules): what config.json and the tensors must agree on.
TEST(MlxMxfp4Errors, ConfigAndTensorsMustAgree) {
  const std::string src = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_mxfp4";
  const std::string up = "model.layers.1.mlp.switch_mlp.up_proj";
  const auto load_err = [](const std::string& dir, const std::vector<std::string>& parts) {
    try {
      load_moe_layer(dir, 1);
      FAIL() << "loaded " << dir;
    } catch (const std::exception& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
    }
  };
  load_err(mutated(
               "mlx_group", [](nlohmann::json& c) { c["quantization"]["group_size"] = 64; }, kKeepTensors, src),
           {"switch_mlp", "mxfp4 with bits 4 and group_size 64", "mxfp4 is 4 bits, group 32"});
  load_err(mutated(
               "mlx_biases", kKeepConfig,
               [&](Stored& s) {
                 if (s.name == up + ".scales") s.name = up + ".biases";  // scales renamed: biases, no scales
               },
               src),
           {"up_proj"});
  load_err(mutated(
               "mlx_scale_nan", kKeepConfig,
               [&](Stored& s) {
                 if (s.name == up + ".scales") s.bytes[3] = 0xFF;
               },
               src),
           {"up_proj.scales", "e8m0 NaN (0xFF)", "flat index 3"});
  load_err(mutated(
               "mlx_mode", [](nlohmann::json& c) { c["quantization"]["mode"] = "mxfp6"; }, kKeepTensors, src),
           {"quantization mode 'mxfp6'", "supported: affine, mxfp4, nvfp4, mxfp8"});
  // mxfp4's tensors under a config that says nvfp4: its group of 16 does not match.
  load_err(mutated(
               "mlx_nvfp4", [](nlohmann::json& c) { c["quantization"]["mode"] = "nvfp4"; }, kKeepTensors, src),
           {"is nvfp4 with bits 4 and group_size 32", "nvfp4 is 4 bits, group 16"});
  const std::string nv = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized/qwen3_moe_nvfp4";
  load_err(mutated(
               "mlx_nvfp4_nan", kKeepConfig,
               [&](Stored& s) {
                 if (s.name == up + ".scales") s.bytes[6] = 0x7F;
               },
               nv),
           {"up_proj.scales", "e4m3 NaN (0x7F / 0xFF)", "flat index 6", "group 6"});
}

TEST(Fp8Errors, ScalesMustBeThereWithTheirShapeDtypeAndValues) {
  const std::string down = "model.layers.1.mlp.experts.3.down_proj";
  expect_error(mutated(
                   "fp8_no_scale", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == down + ".weight_scale_inv") s.name.clear();
                   },
                   kFp8Block),
               {down + ".weight_scale_inv", "is missing", "(2, 1)", "128 × 128 blocks of [160, 96]"});
  expect_error(mutated(
                   "fp8_scale_shape", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == down + ".weight_scale_inv") s.shape = {1, 2};
                   },
                   kFp8Block),
               {down + ".weight_scale_inv", "has shape (1, 2), expected (2, 1)"});
  expect_error(mutated(
                   "fp8_scale_dtype", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == down + ".weight_scale_inv") s.dtype = "I32";
                   },
                   kFp8Block),
               {down + ".weight_scale_inv", "has dtype I32", "F32, BF16, F16 or F8_E8M0"});
  expect_error(mutated(
                   "fp8_scale_nan", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == down + ".weight_scale_inv") {
                       const float inf = std::numeric_limits<float>::infinity();
                       std::memcpy(s.bytes.data() + 4, &inf, 4);
                     }
                   },
                   kFp8Block),
               {down + ".weight_scale_inv", "non-finite scale inf", "flat index 1", "block row 1, column 0"});
  expect_error(mutated(
                   "fp8_weight_shape", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == down + ".weight") s.shape = {96, 160};
                   },
                   kFp8Block),
               {down + ".weight", "has shape (96, 160), expected (160, 96)"});
}

// MiniMax-M2's release spells the element torch's way; it is the same format.
TEST(Fp8Spelling, MiniMaxsFloat8E4m3fnLoadsAsE4m3) {
  const std::string dir = mutated(
      "fp8_e4m3fn", [](nlohmann::json& c) { c["quantization_config"]["fmt"] = "float8_e4m3fn"; }, kKeepTensors,
      kFp8Block);
  const MoeLayer spelled = load_moe_layer(dir, 1);
  const MoeLayer plain = load_moe_layer(kFp8Block, 1);
  Tensor x({3, plain.config().hidden_size}, DType::f32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor a = spelled.forward(x), b = plain.forward(x);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
}

TEST(Fp8Errors, ConfigAndTensorsMustAgree) {
  expect_error(mutated(
                   "fp8_no_method", [](nlohmann::json& c) { c.erase("quantization_config"); }, kKeepTensors, kFp8Block),
               {"holds FP8 (F8_E4M3) weights", "has no quant_method (expected fp8 or compressed-tensors)"});
  const auto load_config_err = [](const std::function<void(nlohmann::json&)>& edit, const std::string& tag,
                                  const std::vector<std::string>& parts) {
    try {
      load_moe_layer(mutated(tag, edit, kKeepTensors, kFp8Block), 1);
      FAIL() << tag << " loaded";
    } catch (const std::exception& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
    }
  };
  load_config_err([](nlohmann::json& c) { c["quantization_config"]["fmt"] = "e5m2"; }, "fp8_fmt",
                  {"quantization_config", "fmt 'e5m2'", "supported: e4m3"});
  load_config_err([](nlohmann::json& c) { c["quantization_config"]["scale_fmt"] = "e4m3"; }, "fp8_scale_fmt",
                  {"scale_fmt 'e4m3'", "supported: float, ue8m0"});
  load_config_err([](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {128}; }, "fp8_block",
                  {"weight_block_size", "two positive integers"});
  // A block the scales do not match.
  load_config_err(
      [](nlohmann::json& c) {
        c["quantization_config"]["weight_block_size"] = {64, 128};
      },
      "fp8_block_64", {"weight_scale_inv", "expected (2, 2)", "64 × 128 blocks of [96, 160]"});
  // An expert projection stored as float in an FP8 release, not excluded.
  const std::string up = "model.layers.1.mlp.experts.5.up_proj";
  const auto widen = [&](Stored& s) {
    if (s.name == up + ".weight") {
      std::vector<std::uint8_t> f32(s.bytes.size() * 4);
      s.dtype = "F32";
      s.bytes = f32;
    }
    if (s.name == up + ".weight_scale_inv") s.name.clear();
  };
  expect_error(mutated("fp8_float_module", kKeepConfig, widen, kFp8Block),
               {up + ".weight", "is F32", "quant_method fp8", "expected F8_E4M3 with 'weight_scale_inv'"});
  // Listed in modules_to_not_convert, it is read as float, and then differs from its siblings.
  expect_error(mutated(
                   "fp8_excluded",
                   [&](nlohmann::json& c) {
                     c["quantization_config"]["modules_to_not_convert"] = {"lm_head", "experts.5.up_proj"};
                   },
                   widen, kFp8Block),
               {"up mixes formats across experts", "expert 5: f32"});
}

TEST(Int4Errors, TensorsMustAgreeWithTheScheme) {
  const std::string up = "model.layers.1.mlp.experts.2.up_proj";
  expect_error(mutated(
                   "int4_shape", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == up + ".weight_shape") s.bytes[0] = 65;
                   },
                   kInt4),
               {up + ".weight_shape", "holds [65, 128], expected [64, 128]"});
  expect_error(mutated(
                   "int4_packed", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == up + ".weight_packed") s.shape = {128, 8};
                   },
                   kInt4),
               {up + ".weight_packed", "has shape (128, 8), expected (64, 16)"});
  expect_error(mutated(
                   "int4_no_scale", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == up + ".weight_scale") s.name.clear();
                   },
                   kInt4),
               {up + ".weight_scale", "is missing", "(64, 4)", "group 32 of 128 inputs"});
  expect_error(mutated(
                   "int4_zero_point", kKeepConfig,
                   [&](Stored& s) {
                     if (s.name == up + ".weight_shape") {
                       s.name = up + ".weight_zero_point";
                     }
                   },
                   kInt4),
               {up + ".weight_zero_point", "is present", "symmetric (no zero points)"});
  // The asymmetric scheme needs every quantized module's zero points, packed along the rows.
  const auto asymmetric = [](nlohmann::json& c) {
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  };
  expect_error(mutated("int4_asym_no_zero_point", asymmetric, kKeepTensors, kInt4),
               {".weight_zero_point", "is missing", "(8, 4)", "group 32 of 128 inputs"});
  expect_error(mutated(
                   "int4_asym_zero_point_shape", asymmetric,
                   [&](Stored& s) {
                     if (s.name == up + ".weight_shape") {
                       s.name = up + ".weight_zero_point";  // [2] I32: not [ceil(64 / 8), 4]
                     }
                   },
                   kInt4),
               {".weight_zero_point", "expected"});
  expect_error(
      mutated(
          "int4_not_ignored", [](nlohmann::json& c) { c["quantization_config"]["ignore"] = {"lm_head"}; }, kKeepTensors,
          kInt4),
      {"shared_experts.gate_proj.weight", "is BF16", "quant_method compressed-tensors", "expected 'weight_packed'"});
  expect_error(
      mutated(
          "int4_bits",
          [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8; },
          kKeepTensors, kInt4),
      {"pack-quantized int 8-bit weights are not supported", "supported: int 4-bit"});
  // An `re:` pattern whose matching would take exponential time is refused before it runs.
  expect_error(mutated(
                   "int4_redos", [](nlohmann::json& c) { c["quantization_config"]["ignore"] = {"re:(a+)+$"}; },
                   kKeepTensors, kInt4),
               {"ignore entry 're:(a+)+$'", "repeats a group that repeats"});
  expect_error(mutated(
                   "int4_bad_re", [](nlohmann::json& c) { c["quantization_config"]["ignore"] = {"re:(unclosed"}; },
                   kKeepTensors, kInt4),
               {"ignore entry 're:(unclosed'", "not a valid regular expression"});
}

// A float folder holding release `src`'s reference-decoded weights at `flt`: quantized tensors
// (codes, scales, packed words, shapes) replaced by the decoded `.weight` — rounded to bf16 and
// stored as BF16 with `bf16` — every other tensor copied as stored.
void write_decoded_folder(const std::string& src, const fs::path& flt, bool bf16) {
  fs::create_directories(flt);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg.erase("quantization_config");
  std::ofstream(flt / "config.json") << cfg.dump(2);
  const auto stored = Checkpoint::open(src + "/model.safetensors");
  const auto decoded = Checkpoint::open(src + "/reference/decoded.safetensors");
  std::vector<Stored> tensors;
  const auto ends_with = [](const std::string& a, const std::string& b) {
    return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  };
  for (const auto* ck : {&stored, &decoded})
    for (const std::string& name : (*ck)->names()) {
      const TensorInfo& info = (*ck)->info(name);
      if (ck == &stored && (decoded->contains(name) || ends_with(name, "_scale_inv") || ends_with(name, "_scale") ||
                            ends_with(name, "_packed") || ends_with(name, "_shape") || ends_with(name, "_zero_point")))
        continue;
      const std::uint8_t* p = (*ck)->bytes(name);
      Stored t{name, info.dtype_name, info.shape, std::vector<std::uint8_t>(p, p + (info.end - info.begin))};
      if (bf16 && ck == &decoded) {
        ASSERT_EQ(info.dtype_name, "F32") << name;
        std::vector<std::uint8_t> out(t.bytes.size() / 2);
        for (std::size_t i = 0; i < out.size() / 2; ++i) {
          float v;
          std::memcpy(&v, t.bytes.data() + 4 * i, 4);
          const std::uint16_t h = f32_to_bf16(v);
          std::memcpy(out.data() + 2 * i, &h, 2);
        }
        t.dtype = "BF16";
        t.bytes = std::move(out);
      }
      tensors.push_back(std::move(t));
    }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const Stored& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  SafetensorsWriter out((flt / "model.safetensors").string(), entries);
  for (const Stored& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  out.commit();
}

// `moekit backward` on a release in a quantized format writes the gradients of the decoded
// weights under the stored modules' names: the same file, byte for byte, as on a float folder
// holding the reference's decoded weights (the float path is held to torch autograd by
// GradGolden).
TEST(ReleaseBackward, GradientsOfTheDecodedWeightsUnderTheStoredNames) {
  const fs::path tmp = fs::temp_directory_path() / "moekit_release_backward";
  fs::remove_all(tmp);
  for (const std::string& src : {kFp8Block, kInt4, kFp8Channel, kInt4Asym}) {
    SCOPED_TRACE(src);
    const fs::path flt = tmp / fs::path(src).filename();
    write_decoded_folder(src, flt, false);
    const auto run = [&](const std::string& model, const std::string& file) {
      const testing::RunResult r =
          testing::run_cli({"backward", "--model", model, "--layer", "1", "--input", src + "/input.npy",
                            "--grad-output", src + "/output.npy", "--output", (tmp / file).string()},
                           tmp);
      EXPECT_TRUE(r.exited && r.exit_code == 0) << r.err;
    };
    run(src, "quantized.safetensors");
    run(flt.string(), "float.safetensors");
    const auto q = SafetensorsFile::open((tmp / "quantized.safetensors").string());
    const auto f = SafetensorsFile::open((tmp / "float.safetensors").string());
    ASSERT_EQ(q->names(), f->names());
    EXPECT_TRUE(q->contains("model.layers.1.mlp.experts.3.down_proj.weight"));
    for (const std::string& name : q->names()) {
      const TensorInfo &a = q->info(name), &b = f->info(name);
      ASSERT_EQ(a.shape, b.shape) << name;
      EXPECT_EQ(std::memcmp(q->bytes(name), f->bytes(name), a.end - a.begin), 0) << name;
    }
  }
  fs::remove_all(tmp);
}

// FP8 releases in the bf16 compute mode: the bits of the bf16 mode on a bf16 folder holding the
// reference's decoded weights rounded to bf16 (what a framework running the release in bf16
// multiplies by), on 1 and 2 threads; close to the exact forward, with its routing.
TEST(Fp8Golden, Bf16ComputeModeIsTheBf16RoundedRelease) {
  const fs::path tmp = fs::temp_directory_path() / "moekit_fp8_bf16_mode";
  fs::remove_all(tmp);
  const int before = num_threads();
  for (const std::string& src : {kFp8Block, kFp8Channel}) {
    SCOPED_TRACE(src);
    const fs::path flt = tmp / fs::path(src).filename();
    write_decoded_folder(src, flt, true);
    MoeLayer fp8 = load_moe_layer(src, 1), bf16 = load_moe_layer(flt.string(), 1);
    const Tensor x = read_npy(src + "/input.npy");
    ForwardInfo exact_info, info;
    const Tensor exact = fp8.forward(x, &exact_info);
    fp8.set_bf16_activations(true);
    bf16.set_bf16_activations(true);
    const Tensor want = bf16.forward(x);
    for (const int t : {1, 2}) {
      set_num_threads(t);
      const Tensor got = fp8.forward(x, &info);
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << "threads " << t;
    }
    EXPECT_EQ(std::memcmp(info.routing.ids.data(), exact_info.routing.ids.data(), info.routing.ids.nbytes()), 0);
    const double rel = testing::relative_rms(want, exact);
    EXPECT_GT(rel, 0.0) << "the bf16 mode ran";
    EXPECT_LT(rel, 2e-2);
  }
  set_num_threads(before);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace moekit
