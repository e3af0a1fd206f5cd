// GGUF models written by llama.cpp's own tools (tests/goldens/gguf/conv/, from
// make_converted_goldens.py: a tiny random transformers model per architecture, converted by
// llama.cpp's convert_hf_to_gguf model classes to f32 and to q8_0; and one with rows of 256,
// converted to f32 and quantized by llama-quantize as Q4_K_M, cut down to the MoE layer), against
// transformers' own MoE block of that model in float64. The converter's metadata and tensor names
// alone must give transformers' block: f32 within fp32 rounding, q8_0 and Q4_K_M within their
// quantization error, their int8 fast mode within that and the activations' rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
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

// The block of each run's file (conv/<name>.<type>.gguf) against tensor `y_name` of its reference
// (<reference>.ref.gguf), in the exact mode or the int8 fast mode, within the run's tolerance.
struct Run {
  const char* type;
  bool int8;
  double tol;
};

void expect_reference(const Case& c, const std::string& reference, const char* y_name, std::initializer_list<Run> runs,
                      const std::function<void(const GgufModel&)>& check_types = {}) {
  const auto ref = GgufFile::open(conv(reference + ".ref.gguf"));
  const std::int64_t L = ref->get("moekit.layer").as_int();
  EXPECT_EQ(ref->get("moekit.architecture").as_string(), c.arch);
  const GgufTensorInfo* x = ref->find("x");
  const GgufTensorInfo* y_ref = ref->find(y_name);
  ASSERT_TRUE(x && y_ref);
  const TensorView input(x->data, {x->ne[1], x->ne[0]}, DType::f32);
  for (const Run& run : runs) {
    const auto model = GgufModel::open(conv(std::string(c.name) + "." + run.type + ".gguf"));
    if (check_types) check_types(*model);
    const MoeConfig cfg = gguf_config(*model);
    EXPECT_EQ(cfg.model_type, c.arch);
    ASSERT_TRUE(cfg.is_moe_layer(L)) << c.name << " layer " << L;
    MoeLayer layer = load_moe_layer(model, cfg, L);
    if (run.int8) layer.set_int8_activations(true);
    const Tensor y = layer.forward(input);
    ASSERT_EQ(y.numel(), y_ref->numel());
    const double err = relative_error(y, *y_ref);
    std::printf("[ converted ] %-10s %-6s%s: max |out - %s| / max |%s| = %.2e\n", c.name, run.type,
                run.int8 ? " --int8" : "       ", y_name, y_name, err);
    EXPECT_LT(err, run.tol) << c.name << " " << run.type << (run.int8 ? " --int8" : "")
                            << ": max |y - y_ref| / max |y_ref|";
  }
}

// f32: fp32 rounding of a float64 reference; q8_0: its weights' rounding (≈ 0.4 % per weight);
// q8_0 in the int8 fast mode: that and the activations' (the same size again).
TEST_P(GgufConverted, ForwardMatchesTransformersInFloat64) {
  const Case& c = GetParam();
  expect_reference(c, c.name, "y", {{"f32", false, 2e-5}, {"q8_0", false, 2e-2}, {"q8_0", true, 4e-2}});
}

// llama-quantize's Q4_K_M: the experts' weights in q4_K and q6_K as llama-quantize chose them
// (each checked to be a K-quant: rows of 256, no fallback), the router left f32. Against
// transformers' block on the same weights (y_dequantized: each weight as gguf-py dequantizes the
// file's bytes): the exact mode within fp32 rounding, the int8 fast mode within the activations'
// rounding. Against the block on the original weights (y) the 4-bit codes move the output by
// 9–12 % of max |y| (make_converted_goldens.py prints it): both modes within 15 %.
TEST_P(GgufConverted, LlamaQuantizeQ4KMMatchesTransformersInFloat64) {
  const Case& c = GetParam();
  const auto k_quants = [&](const GgufModel& model) {
    int experts = 0;
    for (const GgufTensorInfo* t : model.tensors()) {
      const bool expert =
          (t->name.find("_exps.weight") != std::string::npos || t->name.find("_shexp.weight") != std::string::npos) &&
          t->name.find("gate_inp") == std::string::npos;  // the shared expert's gate: f32
      if (!expert) continue;
      ++experts;
      const std::string type = ggml_type_info(t->type)->name;
      EXPECT_TRUE(type == "q4_K" || type == "q5_K" || type == "q6_K") << c.name << " " << t->name << ": " << type;
    }
    EXPECT_GE(experts, 2) << c.name;
  };
  const std::string ref = std::string(c.name) + ".q4_k_m";
  expect_reference(c, ref, "y_dequantized", {{"q4_k_m", false, 2e-5}, {"q4_k_m", true, 3e-2}}, k_quants);
  expect_reference(c, ref, "y", {{"q4_k_m", false, 0.15}, {"q4_k_m", true, 0.15}});
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
