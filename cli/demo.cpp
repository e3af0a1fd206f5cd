// `moekit demo`: moekit's main job on an embedded default, no download. First a whole model (a
// small Qwen3-MoE-shaped one with random weights) generates; then one DeepSeek-V3-shaped
// MoE layer (scaled down so it runs in seconds on two cores) with random weights built in
// memory runs a batch of random tokens a few times; it prints the routing load per expert,
// MaxVio, an output checksum and tokens/s. `--routing-only` instead routes a batch under every
// family preset.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "format.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/moekit.hpp"
#include "synth/random_layer.hpp"

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

void run_routing_demo(std::int64_t tokens, unsigned seed) {
  std::printf("moekit demo: routing %lld random tokens under each family preset (%d threads)\n\n",
              static_cast<long long>(tokens), num_threads());
  std::uint64_t stream = std::uint64_t{seed} * 1000 + 1;
  for (const Preset& p : kPresets) {
    const MoeConfig cfg = parse_hf_config(p.config_json);
    const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts;
    Tensor x({tokens, D}, DType::f32), w({E, D}, DType::f32);
    synth::fill_uniform(x, 1.0f, stream++);
    synth::fill_uniform(w, 1.0f / std::sqrt(static_cast<float>(D)), stream++);
    Tensor router_bias, sel_bias;
    if (cfg.router.has_router_bias) {
      router_bias = Tensor({E}, DType::f32);
      synth::fill_uniform(router_bias, 0.1f, stream++);
    }
    if (cfg.router.has_selection_bias) {
      sel_bias = Tensor({E}, DType::f32);
      synth::fill_uniform(sel_bias, 0.05f, stream++);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = router_logits(x, w, router_bias.view());
    const Routing r = route(cfg.router, logits, sel_bias.view());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto counts = expert_counts(r.ids, E);
    std::printf("%-12s %s\n", p.name, describe(cfg.router).c_str());
    std::printf("  load per expert:");
    for (std::int64_t e = 0; e < E; ++e)
      std::printf("%s%lld", e % 32 == 0 ? "\n    " : " ", static_cast<long long>(counts[e]));
    std::printf("\n  MaxVio %.3f   router GEMM + route %.2f ms\n\n", max_violation(counts), ms);
  }
}

// DeepSeek-V3's MoE block with its routing knobs as shipped (sigmoid scores, selection bias,
// noaux_tc groups, renormalised, rsf 2.5, one shared expert) and its dimensions scaled down:
// D 7168 -> 512, E 256 -> 64, K 8 -> 6, F 2048 -> 256, groups 8 / 4 kept.
constexpr const char* kDemoConfig =
    R"({"model_type":"deepseek_v3","hidden_size":512,"num_hidden_layers":4,"n_routed_experts":64,
        "num_experts_per_tok":6,"moe_intermediate_size":256,"n_group":8,"topk_group":4,"topk_method":"noaux_tc",
        "scoring_func":"sigmoid","norm_topk_prob":true,"routed_scaling_factor":2.5,"n_shared_experts":1,
        "first_k_dense_replace":1})";

// Random weights scaled by 1/sqrt(fan-in), so the activations keep unit scale; a non-zero
// selection bias, as in a trained checkpoint: it moves selection but never the weights. The
// values are the same on every machine and thread count (synth::fill_uniform).
MoeLayer build_demo_layer(std::uint64_t seed) {
  MoeConfig cfg = parse_hf_config(kDemoConfig);
  synth::WeightSpec spec;
  spec.stddev = 0;  // 1/sqrt(fan-in)
  spec.bias_stddev = 0.05f;
  MoeWeights w = synth::random_weights(cfg, spec, seed);
  MoeLayer layer(std::move(cfg), std::move(w));
  layer.pack_weights();  // owned weights: the panel kernel is the faster forward
  return layer;
}

void print_load(const char* what, const std::vector<std::int64_t>& counts) {
  std::printf("  %s (MaxVio %.3f):", what, max_violation(counts));
  for (std::size_t e = 0; e < counts.size(); ++e)
    std::printf("%s%4lld", e % 16 == 0 ? "\n    " : " ", static_cast<long long>(counts[e]));
  std::printf("\n");
}

// The seed's main feature in a few seconds: aux-loss-free balancing of the layer's own router.
// Tokens that share a direction (as real hidden states do) load some experts far more than
// others; one sign-rule update of the selection bias per batch evens the load out, with no
// gradient and no change to the routing weights of the selected experts.
void run_balance_demo(const MoeLayer& layer, std::int64_t tokens, std::uint64_t seed) {
  const MoeConfig& cfg = layer.config();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts;
  constexpr int kSteps = 1000;
  constexpr double kRate = 1e-3;
  std::uint64_t stream = seed * 1000 + 500;  // after the layer's and the input's streams
  Tensor direction({D}, DType::f32);
  synth::fill_uniform(direction, 1.0f, stream++);
  const auto batch = [&](std::uint64_t batch_stream) {
    Tensor x({tokens, D}, DType::f32);
    synth::fill_uniform(x, 1.0f, batch_stream);
    float* p = x.data_as<float>();
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t d = 0; d < D; ++d) p[t * D + d] += direction.data_as<float>()[d];
    return x;
  };
  const Tensor& bias = layer.weights().selection_bias;  // the layer's own bias, updated in place
  const auto load = [&](const Tensor& x) {
    const Tensor logits = router_logits(x, layer.weights().router, layer.weights().router_bias.view());
    return expert_counts(route(cfg.router, logits, bias.view()).ids, E);
  };
  const Tensor held_out = batch(stream++);
  const std::vector<std::int64_t> before = load(held_out);
  LoadBalancer balancer(E, BalanceRule::sign, RateSchedule{kRate, -1, -1, 0.0, {}, -1});
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < kSteps; ++step) {
    balancer.add_counts(load(batch(stream++)));
    balancer.update(bias, step);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<std::int64_t> after = load(held_out);
  std::printf(
      "\naux-loss-free balancing (arXiv:2408.15664; DeepSeek-V3's selection bias, sign rule, u = %g):\n"
      "  tokens sharing one direction, as real hidden states do, load the experts unevenly;\n"
      "  %d bias updates from batches of %lld tokens took %.2f s (moekit train does this while training)\n",
      kRate, kSteps, static_cast<long long>(tokens), s);
  print_load("held-out load per expert before", before);
  print_load("held-out load per expert after ", after);
}

// A whole model generating: the random Qwen3-MoE-shaped model (CausalLm::random) continues a
// random prompt greedily; the same prompt token by token gives the same bits.
void run_model_demo(std::uint64_t seed) {
  const std::shared_ptr<CausalLm> lm = CausalLm::random(seed);
  const LmInfo& info = lm->info();
  std::printf(
      "moekit demo: a whole model generating — %s, %lld layers, hidden %lld, %lld heads / %lld KV heads,\n"
      "  vocabulary %lld, MoE layers %s, seed %llu (the ids mean nothing: the weights are random)\n",
      info.arch.c_str(), static_cast<long long>(info.num_layers), static_cast<long long>(info.hidden_size),
      static_cast<long long>(info.num_heads), static_cast<long long>(info.num_kv_heads),
      static_cast<long long>(info.vocab_size), compact_ranges(info.moe_layers).c_str(),
      static_cast<unsigned long long>(seed));
  std::vector<std::int32_t> prompt(64);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] =
        static_cast<std::int32_t>((seed * 2654435761u + i * 40503u) % static_cast<std::uint64_t>(info.vocab_size));
  GenerateTimings tm;
  SamplingParams sampling;
  sampling.temperature = 0.8;
  sampling.top_k = 40;
  sampling.seed = seed;
  std::printf("  prompt: %zu ids; sampled (temperature 0.8, top-k 40, seed %llu):", prompt.size(),
              static_cast<unsigned long long>(seed));
  const std::vector<std::int32_t> ids = lm->generate(
      prompt, 32, sampling,
      [](std::int32_t id) {
        std::printf(" %d", id);
        std::fflush(stdout);
        return true;
      },
      &tm);
  std::printf("\n  prefill %.0f tokens/s, decode %.0f tokens/s (%d threads)\n", 1e3 * tm.prompt_tokens / tm.prefill_ms,
              tm.generated_tokens > 1 ? 1e3 * (tm.generated_tokens - 1) / tm.decode_ms : 0.0, num_threads());
  // The prompt's last logits in one pass and token by token: the same bits (batch invariance).
  std::unique_ptr<Sequence> a = lm->new_sequence(), b = lm->new_sequence();
  const Tensor whole = lm->forward(*a, prompt);
  Tensor step;
  for (const std::int32_t id : prompt) step = lm->forward(*b, {id});
  std::printf("  the prompt's last logits in one pass and token by token: %s\n\n",
              std::memcmp(whole.data(), step.data(), whole.nbytes()) == 0 ? "bit-identical" : "DIFFERENT");
  (void)ids;
  std::fflush(stdout);
}

void run_layer_demo(std::int64_t tokens, int runs, std::uint64_t seed) {
  const MoeLayer layer = build_demo_layer(seed);
  const MoeConfig& cfg = layer.config();
  const std::int64_t D = cfg.hidden_size, E = cfg.router.num_experts, K = cfg.router.top_k, F = cfg.expert_width;
  Tensor x({tokens, D}, DType::f32);
  synth::fill_uniform(x, 1.0f, seed * 1000 + 400);  // beyond the layer's streams

  std::printf("moekit demo: one DeepSeek-V3-shaped MoE layer (scaled down), random weights, seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::printf("  family %s  D=%lld E=%lld K=%lld F=%lld  shared experts: width %lld\n", cfg.model_type.c_str(),
              static_cast<long long>(D), static_cast<long long>(E), static_cast<long long>(K),
              static_cast<long long>(F), static_cast<long long>(cfg.shared_width));
  std::printf("  routing: %s\n", describe(cfg.router).c_str());
  std::printf("  expert weights: %s f32 (routed + shared)\n",
              format_bytes(layer.weights().experts.nbytes() + layer.weights().shared.nbytes()).c_str());
  std::printf("  tokens %lld, runs %d, threads %d\n\n", static_cast<long long>(tokens), runs, num_threads());
  std::fflush(stdout);

  std::vector<double> seconds;
  Tensor y, first_y;
  ForwardInfo info;
  bool identical = true;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    y = layer.forward(x, &info);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (r == 0)
      first_y = y;
    else
      identical = identical && std::memcmp(y.data(), first_y.data(), y.nbytes()) == 0;
  }

  const std::vector<std::int64_t> counts = expert_counts(info.routing.ids, E);
  std::printf("routing load per expert (%lld assignments = T*K, mean %.2f):\n", static_cast<long long>(tokens * K),
              static_cast<double>(tokens * K) / static_cast<double>(E));
  for (std::int64_t e = 0; e < E; ++e) {
    if (e % 16 == 0) std::printf("%s  e%-3lld", e ? "\n" : "", static_cast<long long>(e));
    std::printf(" %5lld", static_cast<long long>(counts[static_cast<std::size_t>(e)]));
  }
  std::printf("\nMaxVio %.4f\n", max_violation(counts));

  double sum = 0.0, sum_abs = 0.0;
  const float* py = y.data_as<const float>();
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    sum += py[i];
    sum_abs += std::fabs(static_cast<double>(py[i]));
  }
  std::printf("checksum: sum(y) = %.9g  sum(|y|) = %.9g  (%s across runs)\n", sum, sum_abs,
              identical ? "bit-identical" : "DIFFERENT");

  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double median =
      sorted.size() % 2 ? sorted[sorted.size() / 2] : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  // FLOPs of what the layer computes: router GEMM, K routed and the shared expert(s), 3 GEMMs each.
  const double flops = 2.0 * static_cast<double>(tokens) *
                       (static_cast<double>(E) * D + 3.0 * D * (static_cast<double>(K) * F + cfg.shared_width));
  std::printf(
      "forward: median %.3f ms, min %.3f ms over %d runs -> %.0f tokens/s, %.1f GFLOP/s (%d "
      "threads)\n",
      median * 1e3, sorted.front() * 1e3, runs, static_cast<double>(tokens) / median, flops / median * 1e-9,
      num_threads());
  run_balance_demo(layer, tokens, seed);
}

}  // namespace

void register_demo(CLI::App& app) {
  struct Options {
    std::int64_t tokens = 512;
    int runs = 5;
    unsigned seed = 0;
    bool routing_only = false;
    int threads = 0;
    CLI::Option* threads_option = nullptr;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("demo", "Run moekit's main job on an embedded default (no download)");
  cmd->add_option("--tokens", opt->tokens, "Tokens in the batch (default 512)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--runs", opt->runs, "Timed forward runs (default 5)")->check(CLI::Range(1, 1000));
  cmd->add_option("--seed", opt->seed, "Random seed (default 0)");
  cmd->add_flag("--routing-only", opt->routing_only, "Only route a batch under every family preset");
  opt->threads_option = add_threads_option(*cmd, opt->threads);
  cmd->callback([opt] {
    apply_threads_option(opt->threads_option, opt->threads);
    if (opt->routing_only)
      run_routing_demo(opt->tokens, opt->seed);
    else {
      run_model_demo(opt->seed);
      run_layer_demo(opt->tokens, opt->runs, opt->seed);
    }
  });
}

}  // namespace moekit::cli
