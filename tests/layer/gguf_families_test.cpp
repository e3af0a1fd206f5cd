// GGUF models of every llama.cpp MoE architecture moekit reads (tests/goldens/gguf/<arch>.gguf,
// written by make_gguf_goldens.py with llama.cpp's gguf-py, weights quantized by ggml): the block
// of layer 1 loads from metadata and tensors alone, chooses the experts the float64 reference
// (llama.cpp's build_moe_ffn semantics on ggml's dequantization) chooses, in the same order, and
// computes its output within fp32 rounding of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "moekit/model.hpp"

namespace moekit {
namespace {

std::string golden(const std::string& arch) { return std::string(MOEKIT_TEST_DATA_DIR) + "/gguf/" + arch + ".gguf"; }

TensorView tensor_of(const GgufModel& m, const std::string& name, DType dtype) {
  const GgufTensorInfo* t = m.find(name);
  if (t == nullptr) throw std::runtime_error("golden lacks " + name);
  return TensorView(t->data, {t->ne[1], t->ne[0]}, dtype);
}

class GgufFamilies : public ::testing::TestWithParam<const char*> {};

// An architecture's golden: its block of layer 1, the input, the reference's experts and output.
struct Golden {
  std::shared_ptr<const GgufModel> model;
  MoeConfig cfg;
  MoeLayer layer;
  TensorView x, ids, y_ref;
  explicit Golden(const std::string& arch)
      : model(GgufModel::open(golden(arch))),
        cfg(gguf_config(*model)),
        layer(load_moe_layer(model, cfg, 1)),
        x(tensor_of(*model, "moekit.x", DType::f32)),
        ids(tensor_of(*model, "moekit.ids", DType::i32)),
        y_ref(tensor_of(*model, "moekit.y", DType::f32)) {}
};

TEST_P(GgufFamilies, ForwardMatchesTheFloat64Reference) {
  const Golden g(GetParam());
  EXPECT_EQ(g.cfg.model_type, GetParam());
  EXPECT_TRUE(g.cfg.is_moe_layer(1));
  const MoeLayer& layer = g.layer;
  const TensorView &x = g.x, &ids = g.ids, &y_ref = g.y_ref;
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  ASSERT_EQ(info.routing.ids.shape(), ids.shape());
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    EXPECT_EQ(info.routing.ids.data_as<const std::int32_t>()[i], ids.data_as<const std::int32_t>()[i])
        << GetParam() << " slot " << i;
  float scale = 0.0f, err = 0.0f;
  for (std::int64_t i = 0; i < y_ref.numel(); ++i) {
    scale = std::max(scale, std::fabs(y_ref.data_as<const float>()[i]));
    err = std::max(err, std::fabs(y.data_as<const float>()[i] - y_ref.data_as<const float>()[i]));
  }
  EXPECT_LT(err, 2e-5f * scale) << GetParam() << ": max |y - y_ref| " << err << " of max |y_ref| " << scale;
  // Used in place: the experts' bytes are the file's.
  EXPECT_EQ(stored_layout(layer).layout, "gguf");
}

// The int8 fast mode (--int8) on the same block: the router stays exact, so the same experts; y
// within the fast mode's error (activations rounded to int8 per 32 inputs: about 0.4 % of each
// product, docs/numerics.md) of the float64 reference, and not the exact mode's output.
TEST_P(GgufFamilies, FastModeChoosesTheSameExpertsAndStaysNearTheReference) {
  Golden g(GetParam());
  MoeLayer& layer = g.layer;
  const TensorView &x = g.x, &ids = g.ids, &y_ref = g.y_ref;
  const Tensor exact = layer.forward(x);
  layer.set_int8_activations(true);
  ForwardInfo info;
  const Tensor y = layer.forward(x, &info);
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    EXPECT_EQ(info.routing.ids.data_as<const std::int32_t>()[i], ids.data_as<const std::int32_t>()[i])
        << GetParam() << " slot " << i;
  float scale = 0.0f, err = 0.0f, moved = 0.0f;
  for (std::int64_t i = 0; i < y_ref.numel(); ++i) {
    const float r = y_ref.data_as<const float>()[i], v = y.data_as<const float>()[i];
    scale = std::max(scale, std::fabs(r));
    err = std::max(err, std::fabs(v - r));
    moved = std::max(moved, std::fabs(v - exact.data_as<const float>()[i]));
  }
  EXPECT_LT(err, 2e-2f * scale) << GetParam() << ": max |y - y_ref| " << err << " of max |y_ref| " << scale;
  EXPECT_GT(moved, 0.0f) << GetParam() << ": the fast mode gave the exact mode's output";
}

// The same with the tokens repeated 8 times (64 tokens): each chosen expert gets 8 or more
// rows, which the panel kernel takes where the CPU has AVX512-VNNI (ggml_panel-inl.h), else the
// exact mode; every copy of a token gets the reference's experts and output within the same error.
TEST_P(GgufFamilies, FastModeOnManyRowsStaysNearTheReference) {
  Golden g(GetParam());
  MoeLayer& layer = g.layer;
  const TensorView &x = g.x, &ids = g.ids, &y_ref = g.y_ref;
  constexpr std::int64_t kCopies = 8;
  const std::int64_t T = x.shape()[0], D = x.shape()[1], K = ids.shape()[1];
  Tensor xs = Tensor::uninitialized({kCopies * T, D}, DType::f32);
  for (std::int64_t c = 0; c < kCopies; ++c)
    std::copy(x.data_as<const float>(), x.data_as<const float>() + T * D, xs.data_as<float>() + c * T * D);
  layer.set_int8_activations(true);
  ForwardInfo info;
  const Tensor y = layer.forward(xs, &info);
  float scale = 0.0f, err = 0.0f;
  for (std::int64_t c = 0; c < kCopies; ++c) {
    for (std::int64_t i = 0; i < T * K; ++i)
      EXPECT_EQ(info.routing.ids.data_as<const std::int32_t>()[c * T * K + i], ids.data_as<const std::int32_t>()[i])
          << GetParam() << " copy " << c << " slot " << i;
    for (std::int64_t i = 0; i < T * D; ++i) {
      const float r = y_ref.data_as<const float>()[i];
      scale = std::max(scale, std::fabs(r));
      err = std::max(err, std::fabs(y.data_as<const float>()[c * T * D + i] - r));
    }
  }
  EXPECT_LT(err, 2e-2f * scale) << GetParam() << ": max |y - y_ref| " << err << " of max |y_ref| " << scale;
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufFamilies,
                         ::testing::Values("qwen3moe", "qwen2moe", "deepseek2", "glm4moe", "gpt-oss", "llama", "llama4",
                                           "olmoe", "minimax-m2"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace moekit
