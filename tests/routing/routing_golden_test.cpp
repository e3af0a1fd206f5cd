// Golden tests of route() and router_logits() against mlx-lm and the HF / DeepSeek references.
// The goldens are written by tools/gen_routing_goldens.py (docs/goldens.md); each manifest case
// gives an HF config.json, optional RouterConfig overrides (to reproduce an mlx-lm quirk), the
// inputs and the reference's ids and weights, both in the reference's order and in moekit's
// documented order (descending selection score, ties to the lower id).
#include <gtest/gtest.h>

#include "util/json_print.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "moekit/config.hpp"
#include "moekit/npy.hpp"
#include "moekit/routing.hpp"

namespace moekit {
namespace {

using nlohmann::json;

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/routing";
const std::string kManifest = kDir + "/manifest.json";

constexpr double kWeightRel = 1e-6;   // weights, fp32, relative
constexpr double kWeightAbs = 1e-9;   // floor for tiny weights
constexpr double kLogitRel = 1e-5;    // router GEMM vs torch, relative to max(|logit|, 1)
constexpr double kGemmWeightRel = 1e-4;  // weights routed on moekit's own logits

json load_manifest() {
  std::ifstream in(kManifest);
  if (!in) throw std::runtime_error("cannot open " + kManifest);
  return json::parse(in);
}

// The parameter list. An unreadable manifest yields no cases; RoutingGolden.Manifest* then fails.
std::vector<json> manifest_cases() {
  try {
    json m = load_manifest();
    std::vector<json> out;
    for (const json& c : m.at("cases")) out.push_back(c);
    return out;
  } catch (const std::exception&) {
    return {};
  }
}

std::string case_name(const json& c) { return c.value("name", std::string("unnamed")); }

Tensor load(const json& c, const char* key) { return read_npy(kDir + "/" + c.at(key).get<std::string>()); }

bool has(const json& c, const char* key) { return c.contains(key) && !c.at(key).is_null(); }

template <typename T>
std::string row_str(const T* p, std::int64_t n) {
  std::ostringstream ss;
  ss.precision(9);
  ss << "[";
  for (std::int64_t i = 0; i < n; ++i) ss << (i ? ", " : "") << p[i];
  ss << "]";
  return ss.str();
}

void apply_overrides(const json& ov, RouterConfig& r) {
  for (const auto& [key, v] : ov.items()) set_router_knob(r, key, v.is_string() ? v.get<std::string>() : v.dump());
}

bool close(double got, double want, double rel, double abs_floor) {
  return std::fabs(got - want) <= rel * std::fabs(want) + abs_floor;
}

// Compares a routing with the case's expected ids / weights, token by token.
void expect_routing_matches(const Routing& r, const Tensor& ids_ref, const Tensor& w_ref, const Tensor& ids_m,
                            const Tensor& w_m, double wrel, const std::string& what) {
  ASSERT_EQ(r.ids.shape(), ids_m.shape()) << what << ": ids shape";
  ASSERT_EQ(r.weights.shape(), w_m.shape()) << what << ": weights shape";
  ASSERT_EQ(ids_ref.shape(), ids_m.shape());
  ASSERT_EQ(w_ref.shape(), w_m.shape());
  const std::int64_t K = ids_m.dim(-1);
  const std::int64_t T = ids_m.numel() / K;
  const auto* gi = r.ids.data_as<const std::int32_t>();
  const auto* gw = r.weights.data_as<const float>();
  const auto* ri = ids_ref.data_as<const std::int32_t>();
  const auto* rw = w_ref.data_as<const float>();
  const auto* mi = ids_m.data_as<const std::int32_t>();
  const auto* mw = w_m.data_as<const float>();
  int reported = 0;
  for (std::int64_t t = 0; t < T && reported < 8; ++t) {
    const std::set<std::int32_t> got(gi + t * K, gi + (t + 1) * K);
    const std::set<std::int32_t> want(ri + t * K, ri + (t + 1) * K);
    const bool same_set = got == want;
    const bool same_order = std::equal(gi + t * K, gi + (t + 1) * K, mi + t * K);
    bool weights_ok = true;
    for (std::int64_t k = 0; k < K && same_order; ++k)
      weights_ok = weights_ok && close(gw[t * K + k], mw[t * K + k], wrel, kWeightAbs);
    // Also check against the reference's own order (by id).
    for (std::int64_t k = 0; k < K && same_set; ++k) {
      const auto* pos = std::find(gi + t * K, gi + (t + 1) * K, ri[t * K + k]);
      weights_ok = weights_ok && close(gw[pos - gi], rw[t * K + k], wrel, kWeightAbs);
    }
    EXPECT_TRUE(same_set) << what << ": token " << t << " expert set differs: expected "
                          << row_str(ri + t * K, K) << ", got " << row_str(gi + t * K, K);
    EXPECT_TRUE(same_order) << what << ": token " << t << " slot order differs: expected "
                            << row_str(mi + t * K, K) << ", got " << row_str(gi + t * K, K);
    EXPECT_TRUE(weights_ok) << what << ": token " << t << " weights differ (rel tol " << wrel << "): expected "
                            << row_str(mw + t * K, K) << ", got " << row_str(gw + t * K, K);
    if (!(same_set && same_order && weights_ok)) ++reported;
  }
}

TEST(RoutingGolden, ManifestIsPresentAndCoversEveryFamily) {
  json m;
  ASSERT_NO_THROW(m = load_manifest()) << "missing or unreadable " << kManifest
                                       << " (regenerate: /usr/bin/python3 tools/gen_routing_goldens.py)";
  ASSERT_TRUE(m.contains("cases") && m.at("cases").is_array());
  ASSERT_GT(m.at("cases").size(), 0u) << kManifest << " has zero cases";
  ASSERT_TRUE(m.contains("recipe"));
  std::set<std::string> types;
  int with_x = 0, batched = 0;
  for (const json& c : m.at("cases")) {
    types.insert(c.at("config").at("model_type").get<std::string>());
    with_x += has(c, "x") ? 1 : 0;
    batched += load(c, "logits").rank() == 3 ? 1 : 0;
  }
  for (const char* t : {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe", "mixtral", "qwen2_moe", "qwen3_moe",
                        "olmoe", "gpt_oss", "llama4_text", "minimax_m2"})
    EXPECT_TRUE(types.count(t)) << "no golden case for model_type " << t;
  EXPECT_GE(with_x, 2) << "router-GEMM (x, w_router) cases";
  EXPECT_GE(batched, 1) << "a [B, S, E] case";
}

class RoutingGoldenCase : public ::testing::TestWithParam<json> {};

TEST_P(RoutingGoldenCase, MatchesReference) {
  const json& c = GetParam();
  const std::string name = case_name(c);
  SCOPED_TRACE("golden case " + name + " — source: " + c.value("source", std::string("?")));

  MoeConfig cfg = parse_hf_config(c.at("config").dump());
  if (c.contains("overrides") && c.at("overrides").is_object()) {
    apply_overrides(c.at("overrides"), cfg.router);
  }

  const Tensor logits = load(c, "logits");
  ASSERT_EQ(logits.dtype(), DType::f32);
  Tensor bias;
  if (has(c, "selection_bias")) {
    bias = load(c, "selection_bias");
    ASSERT_EQ(bias.dtype(), DType::f32);
  }
  ASSERT_EQ(cfg.router.has_selection_bias, bias.view().defined())
      << "preset's has_selection_bias disagrees with the golden";
  const Tensor ids_ref = load(c, "ids"), w_ref = load(c, "weights");
  const Tensor ids_m = load(c, "ids_moekit_order"), w_m = load(c, "weights_moekit_order");
  ASSERT_EQ(ids_ref.dtype(), DType::i32);
  ASSERT_EQ(ids_m.dtype(), DType::i32);
  ASSERT_EQ(w_ref.dtype(), DType::f32);
  ASSERT_EQ(w_m.dtype(), DType::f32);
  ASSERT_EQ(ids_m.dim(-1), cfg.router.top_k);

  const Routing r = route(cfg.router, logits, bias);
  expect_routing_matches(r, ids_ref, w_ref, ids_m, w_m, kWeightRel, "route(logits)");

  if (has(c, "x")) {
    ASSERT_TRUE(has(c, "w_router"));
    const Tensor x = load(c, "x"), w_r = load(c, "w_router");
    Tensor rb;
    if (has(c, "router_bias")) rb = load(c, "router_bias");
    EXPECT_EQ(cfg.router.has_router_bias, rb.view().defined());
    const Tensor z = router_logits(x, w_r, rb);
    ASSERT_EQ(z.shape(), logits.shape());
    const float* zg = z.data_as<const float>();
    const float* zw = logits.data_as<const float>();
    int bad = 0;
    for (std::int64_t i = 0; i < z.numel() && bad < 8; ++i) {
      const double tol = kLogitRel * std::max(1.0, static_cast<double>(std::fabs(zw[i])));
      if (std::fabs(zg[i] - zw[i]) > tol) {
        ++bad;
        ADD_FAILURE() << "router_logits token " << i / z.dim(-1) << ", expert " << i % z.dim(-1) << ": expected "
                      << zw[i] << ", got " << zg[i];
      }
    }
    const Routing r2 = route(cfg.router, z, bias);
    expect_routing_matches(r2, ids_ref, w_ref, ids_m, w_m, kGemmWeightRel, "route(router_logits(x, w_router))");
  }
}

INSTANTIATE_TEST_SUITE_P(RoutingGolden, RoutingGoldenCase, ::testing::ValuesIn(manifest_cases()),
                         [](const ::testing::TestParamInfo<json>& p) { return case_name(p.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RoutingGoldenCase);

}  // namespace
}  // namespace moekit
