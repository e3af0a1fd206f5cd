// `moekit demo`: routes a batch of random tokens under every family preset and prints the load
// per expert and MaxVio. Everything is embedded: no download.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "commands.hpp"
#include "moekit/moekit.hpp"

namespace moekit::cli {

namespace {

// Scaled-down config.json texts, one per family: the same fields the real checkpoints ship.
struct Preset {
  const char* name;
  const char* config_json;
};

const Preset kPresets[] = {
    {"DeepSeek-V3",
     R"({"model_type":"deepseek_v3","hidden_size":256,"num_hidden_layers":4,"n_routed_experts":64,
        "num_experts_per_tok":8,"moe_intermediate_size":128,"n_group":8,"topk_group":4,"topk_method":"noaux_tc",
        "scoring_func":"sigmoid","norm_topk_prob":true,"routed_scaling_factor":2.5,"n_shared_experts":1,
        "first_k_dense_replace":1})"},
    {"DeepSeek-V2",
     R"({"model_type":"deepseek_v2","hidden_size":256,"num_hidden_layers":4,"n_routed_experts":64,
        "num_experts_per_tok":6,"moe_intermediate_size":128,"n_group":8,"topk_group":3,
        "topk_method":"group_limited_greedy","norm_topk_prob":false,"routed_scaling_factor":16.0,
        "n_shared_experts":2})"},
    {"Mixtral",
     R"({"model_type":"mixtral","hidden_size":256,"num_hidden_layers":4,"num_local_experts":8,
        "num_experts_per_tok":2,"intermediate_size":512})"},
    {"Qwen2-MoE",
     R"({"model_type":"qwen2_moe","hidden_size":256,"num_hidden_layers":4,"num_experts":60,
        "num_experts_per_tok":4,"moe_intermediate_size":64,"shared_expert_intermediate_size":256,
        "norm_topk_prob":false})"},
    {"Qwen3-MoE",
     R"({"model_type":"qwen3_moe","hidden_size":256,"num_hidden_layers":4,"num_experts":128,
        "num_experts_per_tok":8,"moe_intermediate_size":64,"norm_topk_prob":true})"},
    {"OLMoE",
     R"({"model_type":"olmoe","hidden_size":256,"num_hidden_layers":4,"num_experts":64,
        "num_experts_per_tok":8,"intermediate_size":64,"norm_topk_prob":false})"},
    {"GPT-OSS",
     R"({"model_type":"gpt_oss","hidden_size":256,"num_hidden_layers":4,"num_local_experts":32,
        "num_experts_per_tok":4,"intermediate_size":128,"swiglu_limit":7.0})"},
    {"Llama-4",
     R"({"model_type":"llama4_text","hidden_size":256,"num_hidden_layers":4,"num_local_experts":16,
        "num_experts_per_tok":1,"intermediate_size":128,"interleave_moe_layer_step":1})"},
    {"MiniMax-M2",
     R"({"model_type":"minimax_m2","hidden_size":256,"num_hidden_layers":4,"num_local_experts":32,
        "num_experts_per_tok":8,"intermediate_size":128,"scoring_func":"sigmoid","use_routing_bias":true})"},
};

void fill_normal(const Tensor& t, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
}

void run_routing_demo(std::int64_t tokens, unsigned seed) {
  std::mt19937 rng(seed);
  std::printf("moekit demo: routing %lld random tokens under each family preset (%d threads)\n\n",
              static_cast<long long>(tokens), num_threads());
  for (const Preset& p : kPresets) {
    const MoeConfig cfg = parse_hf_config(p.config_json);
    const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts;
    Tensor x({tokens, D}, DType::f32), w({E, D}, DType::f32);
    fill_normal(x, rng, 1.0f);
    fill_normal(w, rng, 1.0f / std::sqrt(static_cast<float>(D)));
    Tensor router_bias, sel_bias;
    if (cfg.router.has_router_bias) {
      router_bias = Tensor({E}, DType::f32);
      fill_normal(router_bias, rng, 0.1f);
    }
    if (cfg.router.has_selection_bias) {
      sel_bias = Tensor({E}, DType::f32);
      fill_normal(sel_bias, rng, 0.05f);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = router_logits(x, w, router_bias.view());
    const Routing r = route(cfg.router, logits, sel_bias.view());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto counts = expert_counts(r.ids, E);
    std::printf("%-12s %s\n", p.name, describe(cfg.router).c_str());
    std::printf("  load per expert:");
    for (std::int64_t e = 0; e < E; ++e) std::printf("%s%lld", e % 32 == 0 ? "\n    " : " ", static_cast<long long>(counts[e]));
    std::printf("\n  MaxVio %.3f   router GEMM + route %.2f ms\n\n", max_violation(counts), ms);
  }
}

}  // namespace

void register_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Run moekit's main job on an embedded default (no download)");
  static std::int64_t tokens = 512;
  static unsigned seed = 0;
  static int threads = 0;
  cmd->add_option("--tokens", tokens, "Tokens in the batch")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", seed, "Random seed");
  cmd->add_option("--threads", threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, 4096));
  cmd->callback([] {
    set_num_threads(threads);
    run_routing_demo(tokens, seed);
  });
}

}  // namespace moekit::cli
