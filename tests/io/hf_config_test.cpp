// config.json -> MoeConfig for every family: fields read, knobs set, schedule, errors.
#include <gtest/gtest.h>

#include <string>

#include "io/family.hpp"
#include "moekit/config.hpp"

namespace moekit {
namespace {

void expect_invalid(const std::string& json, const char* needle) {
  try {
    parse_hf_config(json);
    ADD_FAILURE() << "expected invalid_argument containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

const char* kDeepSeekV3 = R"({"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":6,
  "n_routed_experts":32,"num_experts_per_tok":8,"moe_intermediate_size":16,"n_group":8,"topk_group":4,
  "topk_method":"noaux_tc","scoring_func":"sigmoid","norm_topk_prob":true,"routed_scaling_factor":2.5,
  "n_shared_experts":1,"first_k_dense_replace":3,"moe_layer_freq":1})";

TEST(HfConfig, DeepSeekV3) {
  const MoeConfig c = parse_hf_config(kDeepSeekV3);
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.expert_width, 16);
  EXPECT_EQ(c.router.num_experts, 32);
  EXPECT_EQ(c.router.top_k, 8);
  EXPECT_EQ(c.router.score_func, ScoreFunc::sigmoid);
  EXPECT_TRUE(c.router.has_selection_bias);
  EXPECT_EQ(c.router.group_mode, GroupMode::top2_sum);
  EXPECT_EQ(c.router.n_group, 8);
  EXPECT_EQ(c.router.topk_group, 4);
  EXPECT_EQ(c.router.renorm, Renorm::sum_eps);
  EXPECT_FALSE(c.router.renorm_only_if_k_gt_1);
  EXPECT_FLOAT_EQ(c.router.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.shared_width, 16);
  EXPECT_FALSE(c.shared_gated);
  EXPECT_EQ(c.body, BodyKind::swiglu);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(5));
  EXPECT_THROW(c.is_moe_layer(6), std::out_of_range);
  EXPECT_EQ(c.names.block, "model.layers.{L}.mlp");
}

TEST(HfConfig, KimiAndGlmReuseDeepSeekV3) {
  for (const char* type : {"kimi_k2", "glm4_moe"}) {
    std::string j = kDeepSeekV3;
    j.replace(j.find("deepseek_v3"), 11, type);
    const MoeConfig c = parse_hf_config(j);
    EXPECT_EQ(c.router.score_func, ScoreFunc::sigmoid) << type;
    EXPECT_TRUE(c.router.has_selection_bias);
  }
}

TEST(HfConfig, DeepSeekV2) {
  const MoeConfig c = parse_hf_config(R"({"model_type":"deepseek_v2","hidden_size":64,"num_hidden_layers":4,
    "n_routed_experts":16,"num_experts_per_tok":6,"moe_intermediate_size":8,"n_group":4,"topk_group":2,
    "topk_method":"group_limited_greedy","norm_topk_prob":false,"routed_scaling_factor":16.0,"n_shared_experts":2,
    "first_k_dense_replace":1,"moe_layer_freq":2})");
  EXPECT_EQ(c.router.score_func, ScoreFunc::softmax);
  EXPECT_EQ(c.router.group_mode, GroupMode::max);
  EXPECT_EQ(c.router.renorm, Renorm::none);
  EXPECT_FLOAT_EQ(c.router.routed_scaling_factor, 16.0f);
  EXPECT_EQ(c.shared_width, 16);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));  // 1 % 2 != 0
  EXPECT_TRUE(c.is_moe_layer(2));
  const MoeConfig r = parse_hf_config(R"({"model_type":"deepseek_v2","hidden_size":64,"num_hidden_layers":4,
    "n_routed_experts":16,"num_experts_per_tok":6,"moe_intermediate_size":8,"topk_method":"greedy",
    "norm_topk_prob":true})");
  EXPECT_EQ(r.router.group_mode, GroupMode::none);
  EXPECT_EQ(r.router.renorm, Renorm::sum_eps);
  EXPECT_TRUE(r.router.renorm_only_if_k_gt_1);
  EXPECT_TRUE(r.router.scale_only_without_renorm);
}

TEST(HfConfig, MixtralQwenOlmoe) {
  const MoeConfig m = parse_hf_config(R"({"model_type":"mixtral","hidden_size":32,"num_hidden_layers":2,
    "num_local_experts":8,"num_experts_per_tok":2,"intermediate_size":64})");
  EXPECT_EQ(m.router.renorm, Renorm::sum);
  EXPECT_EQ(m.names.gate_proj, "w1");
  EXPECT_EQ(m.names.up_proj, "w3");
  EXPECT_EQ(m.names.down_proj, "w2");
  EXPECT_EQ(m.expert_width, 64);

  const MoeConfig q2 = parse_hf_config(R"({"model_type":"qwen2_moe","hidden_size":32,"num_hidden_layers":4,
    "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,"shared_expert_intermediate_size":48,
    "decoder_sparse_step":2,"mlp_only_layers":[3]})");
  EXPECT_EQ(q2.router.renorm, Renorm::none);  // norm_topk_prob absent -> false
  EXPECT_EQ(q2.shared_width, 48);
  EXPECT_TRUE(q2.shared_gated);
  EXPECT_EQ(q2.names.shared_gate, "shared_expert_gate");
  EXPECT_FALSE(q2.is_moe_layer(0));
  EXPECT_TRUE(q2.is_moe_layer(1));
  EXPECT_FALSE(q2.is_moe_layer(3));  // (3+1) % 2 == 0 but mlp_only

  const MoeConfig q3 = parse_hf_config(R"({"model_type":"qwen3_moe","hidden_size":32,"num_hidden_layers":2,
    "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,"norm_topk_prob":true})");
  EXPECT_EQ(q3.router.renorm, Renorm::sum);
  EXPECT_EQ(q3.shared_width, 0);
  // transformers 5's Qwen3MoeConfig.to_dict() names the count num_local_experts.
  const MoeConfig q3t = parse_hf_config(R"({"model_type":"qwen3_moe","hidden_size":32,"num_hidden_layers":2,
    "num_local_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16,"norm_topk_prob":true})");
  EXPECT_EQ(q3t.router.num_experts, 8);
  EXPECT_THROW(parse_hf_config(R"({"model_type":"qwen3_moe","hidden_size":32,"num_hidden_layers":2,
    "num_experts_per_tok":2,"moe_intermediate_size":16})"), std::invalid_argument);
  // A layer count beyond kMaxLayers is named, not allocated.
  try {
    (void)parse_hf_config(R"({"model_type":"qwen3_moe","hidden_size":32,"num_hidden_layers":268435456,
      "num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":16})");
    ADD_FAILURE() << "2^28 layers accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers (268435456) is above moekit's limit 65536"),
              std::string::npos)
        << e.what();
  }

  const MoeConfig o = parse_hf_config(R"({"model_type":"olmoe","hidden_size":32,"num_hidden_layers":2,
    "num_experts":8,"num_experts_per_tok":2,"intermediate_size":16,"norm_topk_prob":false})");
  EXPECT_EQ(o.router.renorm, Renorm::none);
  EXPECT_EQ(o.expert_width, 16);
}

TEST(HfConfig, GptOssLlama4MiniMax) {
  const MoeConfig g = parse_hf_config(R"({"model_type":"gpt_oss","hidden_size":32,"num_hidden_layers":2,
    "num_local_experts":8,"num_experts_per_tok":2,"intermediate_size":16,"swiglu_limit":7.0})");
  EXPECT_EQ(g.router.score_func, ScoreFunc::softmax_selected);
  EXPECT_TRUE(g.router.has_router_bias);
  EXPECT_EQ(g.body, BodyKind::swiglu_clamped);
  EXPECT_TRUE(g.expert_bias);
  EXPECT_FLOAT_EQ(g.swiglu_limit, 7.0f);
  EXPECT_EQ(g.names.router, "router");

  // Llama-4 keeps its language-model fields in text_config.
  const MoeConfig l = parse_hf_config(R"({"model_type":"llama4","text_config":{"model_type":"llama4_text",
    "hidden_size":32,"num_hidden_layers":4,"num_local_experts":4,"num_experts_per_tok":1,"intermediate_size":16,
    "interleave_moe_layer_step":2}})");
  EXPECT_EQ(l.router.score_func, ScoreFunc::sigmoid_selected);
  EXPECT_TRUE(l.router.weight_on_input);
  EXPECT_EQ(l.shared_width, 16);
  EXPECT_FALSE(l.is_moe_layer(0));
  EXPECT_TRUE(l.is_moe_layer(1));

  const MoeConfig mm = parse_hf_config(R"({"model_type":"minimax_m2","hidden_size":32,"num_hidden_layers":2,
    "num_local_experts":8,"num_experts_per_tok":2,"intermediate_size":16,"scoring_func":"sigmoid",
    "use_routing_bias":true})");
  EXPECT_EQ(mm.router.score_func, ScoreFunc::sigmoid);
  EXPECT_TRUE(mm.router.has_selection_bias);
  EXPECT_EQ(mm.router.renorm, Renorm::sum_eps);
  EXPECT_EQ(mm.names.selection_bias, "e_score_correction_bias");
}

// family.hpp's table: every model_type has a reader, supported_model_types() lists the table, and
// an alias reads a config exactly as the first model_type of its family does.
TEST(HfConfig, EveryModelTypeReadsAsItsFamily) {
  std::string listed;
  for (const detail::ModelType& t : detail::kModelTypes) listed += (listed.empty() ? "" : ", ") + std::string(t.name);
  EXPECT_EQ(supported_model_types(), listed);
  BlockShape shape;
  shape.hidden_size = 32;
  shape.num_experts = 8;
  shape.top_k = 2;
  shape.expert_width = 16;
  shape.num_layers = 2;
  for (const detail::ModelType& t : detail::kModelTypes) {
    const std::string name(t.name);
    const detail::ModelType* canon = nullptr;
    for (const detail::ModelType& c : detail::kModelTypes)
      if (canon == nullptr && c.family == t.family) canon = &c;
    const std::string key = "\"model_type\": \"" + std::string(canon->name) + "\"";
    std::string text = preset_config_json(std::string(canon->name), shape);
    ASSERT_NE(text.find(key), std::string::npos) << text;
    text.replace(text.find(key), key.size(), "\"model_type\": \"" + name + "\"");
    const MoeConfig a = parse_hf_config(text);
    const MoeConfig b = parse_hf_config(preset_config_json(std::string(canon->name), shape));
    EXPECT_EQ(a.model_type, name);
    EXPECT_EQ(a.hidden_size, b.hidden_size) << name;
    EXPECT_EQ(a.expert_width, b.expert_width) << name;
    EXPECT_EQ(a.router.num_experts, b.router.num_experts) << name;
    EXPECT_EQ(a.router.top_k, b.router.top_k) << name;
    EXPECT_EQ(a.router.score_func, b.router.score_func) << name;
    EXPECT_EQ(a.router.group_mode, b.router.group_mode) << name;
    EXPECT_EQ(a.router.renorm, b.router.renorm) << name;
    EXPECT_EQ(a.router.has_selection_bias, b.router.has_selection_bias) << name;
    EXPECT_EQ(a.router.has_router_bias, b.router.has_router_bias) << name;
    EXPECT_EQ(a.router.weight_on_input, b.router.weight_on_input) << name;
    EXPECT_EQ(a.body, b.body) << name;
    EXPECT_EQ(a.shared_width, b.shared_width) << name;
    EXPECT_EQ(a.names.block, b.names.block) << name;
    EXPECT_EQ(a.names.router, b.names.router) << name;
    EXPECT_EQ(a.names.gate_proj, b.names.gate_proj) << name;
    EXPECT_EQ(a.moe_layer_indices(), b.moe_layer_indices()) << name;
  }
}

TEST(HfConfig, Errors) {
  expect_invalid("{not json", "invalid JSON");
  expect_invalid("[1,2]", "must be a JSON object");
  expect_invalid(R"({"hidden_size":4})", "missing 'model_type'");
  expect_invalid(R"({"model_type":"llama"})", "unknown model_type 'llama' (supported: deepseek_v2");
  std::string j = kDeepSeekV3;
  j.replace(j.find("noaux_tc"), 8, "aux_tc");
  expect_invalid(j, "unsupported topk_method 'aux_tc' (supported: noaux_tc)");
  j = kDeepSeekV3;
  j.replace(j.find("\"sigmoid\""), 9, "\"tanh\"");
  expect_invalid(j, "unsupported scoring_func 'tanh' (supported: sigmoid, sqrtsoftplus)");
  j = kDeepSeekV3;
  j.replace(j.find("\"n_routed_experts\":32"), 21, "\"n_routed_experts\":\"x\"");
  expect_invalid(j, "field 'n_routed_experts' must be an integer");
  j = kDeepSeekV3;
  j.replace(j.find("\"num_experts_per_tok\":8"), 23, "\"num_experts_per_tok\":33");
  expect_invalid(j, "top_k (33)");
  j = kDeepSeekV3;
  j.replace(j.find("\"n_group\":8"), 11, "\"n_group\":5");
  expect_invalid(j, "not divisible by n_group (5)");
  expect_invalid(R"({"model_type":"mixtral","hidden_size":32,"num_hidden_layers":2,"num_experts_per_tok":2,
    "intermediate_size":64})", "num_local_experts");
  expect_invalid(R"({"model_type":"mixtral","hidden_size":32,"num_hidden_layers":2,"num_local_experts":8,
    "num_experts_per_tok":2,"intermediate_size":64,"hidden_act":"tanh"})", "unsupported hidden_act 'tanh'");
  expect_invalid(R"({"model_type":"mixtral","hidden_size":0,"num_hidden_layers":2,"num_local_experts":8,
    "num_experts_per_tok":2,"intermediate_size":64})", "hidden_size (0)");
  EXPECT_THROW(load_hf_config("/nonexistent/dir"), std::runtime_error);
}

}  // namespace
}  // namespace moekit
