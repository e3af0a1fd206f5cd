// GGUF models written by llama.cpp's own converter (tests/goldens/gguf/conv/, from
// make_converted_goldens.py: a tiny random transformers model per architecture, converted by
// llama.cpp's convert_hf_to_gguf model classes to f32 and to q8_0), against transformers' own MoE
// block of that model in float64. The converter's metadata and tensor names alone must give
// transformers' block: f32 within fp32 rounding, q8_0 within its quantization error, the q8_0
// file's int8 fast mode within that and the activations' rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "moekit/model.hpp"

namespace moekit {
namespace {

std::string conv(const std::string& file) { return std::string(MOEKIT_TEST_DATA_DIR) + "/gguf/conv/" + file; }

struct Case {
  const char* name;  // the golden's file stem
  const char* arch;  // general.architecture the converter writes
};

class GgufConverted : public ::testing::TestWithParam<Case> {};

// max |y - y_ref| / max |y_ref|.
double relative_error(const Tensor& y, const GgufTensorInfo& ref) {
  const auto* r = reinterpret_cast<const float*>(ref.data);
  double scale = 0.0, err = 0.0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(r[i])));
    err = std::max(err, std::fabs(static_cast<double>(y.data_as<const float>()[i]) - r[i]));
  }
  return err / scale;
}

TEST_P(GgufConverted, ForwardMatchesTransformersInFloat64) {
  const Case& c = GetParam();
  const auto ref = GgufFile::open(conv(std::string(c.name) + ".ref.gguf"));
  const std::int64_t L = ref->get("moekit.layer").as_int();
  EXPECT_EQ(ref->get("moekit.architecture").as_string(), c.arch);
  const GgufTensorInfo* x = ref->find("x");
  const GgufTensorInfo* y_ref = ref->find("y");
  ASSERT_TRUE(x && y_ref);
  const TensorView input(x->data, {x->ne[1], x->ne[0]}, DType::f32);
  // f32: fp32 rounding of a float64 reference; q8_0: its weights' rounding (≈ 0.4 % per weight);
  // q8_0 in the int8 fast mode: that and the activations' (the same size again).
  const struct {
    const char* type;
    bool int8;
    double tol;
  } runs[] = {{"f32", false, 2e-5}, {"q8_0", false, 2e-2}, {"q8_0", true, 4e-2}};
  for (const auto& run : runs) {
    const auto model = GgufModel::open(conv(std::string(c.name) + "." + run.type + ".gguf"));
    const MoeConfig cfg = gguf_config(*model);
    EXPECT_EQ(cfg.model_type, c.arch);
    ASSERT_TRUE(cfg.is_moe_layer(L)) << c.name << " layer " << L;
    MoeLayer layer = load_moe_layer(model, cfg, L);
    if (run.int8) layer.set_int8_activations(true);
    const Tensor y = layer.forward(input);
    ASSERT_EQ(y.numel(), y_ref->numel());
    const double err = relative_error(y, *y_ref);
    std::printf("[ converted ] %-10s %-4s%s: max |y - y_ref| / max |y_ref| = %.2e\n", c.name, run.type,
                run.int8 ? " --int8" : "       ", err);
    EXPECT_LT(err, run.tol) << c.name << " " << run.type << (run.int8 ? " --int8" : "")
                            << ": max |y - y_ref| / max |y_ref|";
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufConverted,
                         ::testing::Values(Case{"qwen3moe", "qwen3moe"}, Case{"qwen2moe", "qwen2moe"},
                                           Case{"deepseek2", "deepseek2"}, Case{"glm4moe", "glm4moe"},
                                           Case{"gpt-oss", "gpt-oss"}, Case{"mixtral", "llama"},
                                           Case{"llama4", "llama4"}, Case{"olmoe", "olmoe"},
                                           Case{"minimax-m2", "minimax-m2"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string s = i.param.name;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace moekit
