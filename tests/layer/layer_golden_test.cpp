// Conformance: every family's whole MoE block, loaded from a checkpoint folder moekit has
// never seen, against frozen goldens from tools/gen_layer_goldens.py (torch reimplementation
// of the reference, cross-checked with mlx-lm's own modules; see docs/layer_goldens.md).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "moekit/model.hpp"
#include "moekit/npy.hpp"
#include "util/golden_knobs.hpp"
#include "util/compare.hpp"

namespace moekit {
namespace {

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/layers";

nlohmann::json manifest() {
  std::ifstream in(kDir + "/manifest.json");
  if (!in) throw std::runtime_error("cannot open " + kDir + "/manifest.json");
  return nlohmann::json::parse(in);
}

// The knobs a golden may override to reproduce an mlx-lm quirk.
using testing::apply_overrides;

TEST(LayerGolden, EveryFamilyMatchesItsReference) {
  const nlohmann::json m = manifest();
  ASSERT_GE(m["cases"].size(), 10u);
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"], dir = kDir + "/" + c["dir"].get<std::string>();
    SCOPED_TRACE(name);
    MoeConfig cfg = load_hf_config(dir);
    apply_overrides(cfg.router, c["overrides"]);
    for (const bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "panels" : "rows");
    MoeLayer layer = load_moe_layer(dir, cfg, c["layer"].get<std::int64_t>());
    if (packed) layer.pack_weights();
    EXPECT_EQ(layer.weights().experts.up.layout == MatrixLayout::panels, packed);
    const std::map<std::string, std::string> layout_names = {
        {"per_expert", "per_expert"},
        {"mixtral_w1w3w2", "per_expert"},
        {"fused_gate_up", "fused_gate_up"},
        {"llama4_fused_transposed", "fused_gate_up_transposed"},
        {"gpt_oss_interleaved_transposed", "fused_gate_up_transposed_interleaved"},
        {"switch_mlp_stacked", "switch_mlp"}};
    const std::string layout = layout_names.at(c["layout"]);
    EXPECT_EQ(layer.weights().layout, layout);
    // Untransposed layouts are used in place from the mapped file.
    EXPECT_EQ(layer.weights().mapped, layout.find("transposed") == std::string::npos);
    const Tensor x = read_npy(dir + "/input.npy");
    const Tensor y_ref = read_npy(dir + "/output.npy");
    const Tensor ids_ref = read_npy(dir + "/ids.npy");
    const Tensor w_ref = read_npy(dir + "/weights.npy");
    ForwardInfo info;
    const Tensor y = layer.forward(x, &info);
    ASSERT_EQ(y.shape(), y_ref.shape());
    ASSERT_EQ(info.routing.ids.shape(), ids_ref.shape());
    const std::int64_t T = ids_ref.dim(0), K = ids_ref.dim(1);
    for (std::int64_t t = 0; t < T; ++t) {
      std::set<std::int32_t> got, want;
      for (std::int64_t k = 0; k < K; ++k) {
        got.insert(info.routing.ids.data_as<std::int32_t>()[t * K + k]);
        want.insert(ids_ref.data_as<std::int32_t>()[t * K + k]);
      }
      ASSERT_EQ(got, want) << "expert set of token " << t;
      for (std::int64_t k = 0; k < K; ++k) {
        // goldens store slots in moekit's order (descending selection score, ties to lower id)
        EXPECT_EQ(info.routing.ids.data_as<std::int32_t>()[t * K + k], ids_ref.data_as<std::int32_t>()[t * K + k]);
        const float wr = w_ref.data_as<float>()[t * K + k];
        EXPECT_NEAR(info.routing.weights.data_as<float>()[t * K + k], wr, 1e-6 * std::fabs(wr) + 1e-7);
      }
    }
    const testing::MaxDiff d = testing::max_diff(y, y_ref);
    const double tol = c["tolerance"].get<double>();
    EXPECT_LE(d.err, tol * d.ref) << "max |y - y_ref| = " << d.err << ", max |y_ref| = " << d.ref;
    }
  }
}

}  // namespace
}  // namespace moekit
