// mlx-lm's own quantized MoE modules (tools/gen_quant_goldens.py): every family, 2-8 bits,
// group 32/64/128, bf16/f16/f32 scales, mixed recipes. moekit loads each folder as mlx-lm wrote
// it and its forward matches the module's output to 1e-5 relative (max|y - y_mlx| <=
// 1e-5 · max|y_mlx|); every module the generator quantized is quantized in moekit too.
#include <gtest/gtest.h>

#include "util/json_print.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/quantized";

std::vector<nlohmann::json> cases() {
  std::ifstream in(kDir + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  return {m.at("cases").begin(), m.at("cases").end()};
}

class QuantizedMlxGolden : public ::testing::TestWithParam<nlohmann::json> {};

TEST_P(QuantizedMlxGolden, MatchesMlxLmModule) {
  const nlohmann::json& c = GetParam();
  const std::string dir = kDir + "/" + c.at("name").get<std::string>();
  const MoeLayer layer = load_moe_layer(dir, c.at("layer").get<std::int64_t>());
  const MoeWeights& w = layer.weights();
  for (const auto& m : c.at("quantized_modules")) {
    const std::string mod = m.get<std::string>();
    const bool router = mod == "gate" || mod == "router";
    if (router) {
      EXPECT_TRUE(w.router_quantized.defined()) << mod;
    }
    if (mod.find("up_proj") != std::string::npos && mod.find("shared") == std::string::npos) {
      EXPECT_TRUE(w.experts.up.quantized()) << mod;
    }
    if (mod.find("shared_expert") != std::string::npos && mod.find("gate_proj") != std::string::npos) {
      EXPECT_TRUE(w.shared.gate.quantized()) << mod;
    }
    if (mod == "shared_expert_gate") {
      EXPECT_TRUE(w.shared_gate_quantized.defined());
    }
  }
  EXPECT_TRUE(w.mapped);
  const Tensor x = read_npy(dir + "/input.npy");
  const Tensor want = read_npy(dir + "/output.npy");
  const Tensor y = layer.forward(x);
  ASSERT_EQ(y.shape(), want.shape());
  const testing::MaxDiff d = testing::max_diff(y, want);
  EXPECT_LE(d.err, 1e-5 * d.ref) << "max |y - y_mlx| = " << d.err << ", max |y_mlx| = " << d.ref;
  RecordProperty("rel_err", std::to_string(d.err / d.ref));
}

INSTANTIATE_TEST_SUITE_P(MlxLm, QuantizedMlxGolden, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return p.param.at("name").template get<std::string>(); });

}  // namespace
}  // namespace moekit
