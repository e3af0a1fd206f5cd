// ggml's decode of a MoE layer, timed the way `moekit bench --decode` times moekit's: L distinct
// layers called in turn, each call on fresh tokens (so a fresh routing per call and per layer), the
// weights far larger than the last-level cache, so every touched expert comes from DRAM.
//
// Each layer is the graph llama.cpp's build_moe_ffn builds for a Qwen3-MoE block (softmax router,
// top-k, renormalised weights, gate and up through mul_mat_id, swiglu, down through mul_mat_id,
// the weighted sum of the K expert outputs), computed by ggml's CPU backend on a persistent thread
// pool, with the expert weights in a plain CPU buffer or in llama.cpp's CPU_REPACK buffer (the
// interleaved layouts llama.cpp loads by default where the CPU has one for the type).
//
// Not a test; built and run by bench/peers/decode.sh against the ggml of llama-cpp-python's sdist.
//   ggml_decode --type q4_0 --layout plain|repack --dims D,F,E,K --tokens 1,8 --threads 2
//               --layers L --reps R [--seed S]
// Prints one JSON object per (T) row on stdout; progress and errors on stderr (exit 1 on error).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ggml_decode: %s\n", what.c_str());
  std::exit(1);
}

std::vector<long long> parse_list(const std::string& s) {
  std::vector<long long> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) die("bad number '" + item + "' in '" + s + "'");
    out.push_back(v);
  }
  return out;
}

ggml_type type_by_name(const std::string& name) {
  for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
    const char* n = ggml_type_name(static_cast<ggml_type>(i));
    if (n != nullptr && name == n) return static_cast<ggml_type>(i);
  }
  die("unknown ggml type '" + name + "'");
}

// llama.cpp's repacked layout for `type`, or null where this CPU has none (the buffer type
// "CPU_REPACK" among the CPU device's extra buffer types).
ggml_backend_buffer_type_t repack_buft() {
  ggml_backend_reg_t reg = ggml_backend_cpu_reg();
  ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  if (get == nullptr) return nullptr;
  for (ggml_backend_buffer_type_t* b = get(dev); b != nullptr && *b != nullptr; ++b)
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
  return nullptr;
}

// One expert stack [cols, rows, E] in `type`: P distinct random experts tiled over E (the bytes
// differ between neighbours; DRAM traffic does not depend on their values).
std::vector<uint8_t> expert_stack(ggml_type type, int64_t cols, int64_t rows, int64_t E, std::mt19937& rng) {
  const int64_t P = std::min<int64_t>(E, 4);
  const size_t per = ggml_row_size(type, cols) * static_cast<size_t>(rows);
  std::vector<uint8_t> out(per * static_cast<size_t>(E));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(cols * rows));
  const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
  for (int64_t p = 0; p < P; ++p) {
    for (float& v : src) v = u(rng) * scale;
    uint8_t* dst = out.data() + per * static_cast<size_t>(p);
    if (type == GGML_TYPE_F32)
      std::memcpy(dst, src.data(), per);
    else if (ggml_quantize_chunk(type, src.data(), dst, 0, rows, cols, nullptr) != per)
      die(std::string("ggml_quantize_chunk wrote an unexpected size for ") + ggml_type_name(type));
  }
  for (int64_t e = P; e < E; ++e)
    std::memcpy(out.data() + per * static_cast<size_t>(e), out.data() + per * static_cast<size_t>(e % P), per);
  return out;
}

struct Layer {
  ggml_context* wctx = nullptr;
  ggml_backend_buffer_t wbuf = nullptr;
  ggml_tensor *router = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;
};

struct Graph {
  ggml_context* ctx = nullptr;
  ggml_cgraph* gf = nullptr;
  ggml_gallocr_t alloc = nullptr;
  ggml_tensor* ids = nullptr;  // the selected experts [K, T], read back to count the touched ones
};

// The block of llama.cpp's build_moe_ffn for a softmax router with renormalised weights.
Graph build_graph(const Layer& w, ggml_tensor* x, int64_t K) {
  Graph g;
  ggml_init_params ip = {ggml_tensor_overhead() * 256 + ggml_graph_overhead(), nullptr, true};
  g.ctx = ggml_init(ip);
  const int64_t D = x->ne[0], T = x->ne[1], E = w.gate->ne[2];
  ggml_tensor* logits = ggml_mul_mat(g.ctx, w.router, x);  // [E, T]
  ggml_tensor* probs = ggml_soft_max(g.ctx, logits);
  ggml_tensor* sel = ggml_argsort_top_k(g.ctx, probs, static_cast<int>(K));                  // [K, T]
  ggml_tensor* weights = ggml_get_rows(g.ctx, ggml_reshape_3d(g.ctx, probs, 1, E, T), sel);  // [1, K, T]
  weights = ggml_reshape_2d(g.ctx, weights, K, T);
  weights = ggml_div(g.ctx, weights, ggml_sum_rows(g.ctx, weights));
  weights = ggml_reshape_3d(g.ctx, weights, 1, K, T);
  ggml_tensor* cur = ggml_reshape_3d(g.ctx, x, D, 1, T);
  ggml_tensor* up = ggml_mul_mat_id(g.ctx, w.up, cur, sel);      // [F, K, T]
  ggml_tensor* gate = ggml_mul_mat_id(g.ctx, w.gate, cur, sel);  // [F, K, T]
  ggml_tensor* act = ggml_swiglu_split(g.ctx, gate, up);
  ggml_tensor* experts = ggml_mul_mat_id(g.ctx, w.down, act, sel);  // [D, K, T]
  experts = ggml_mul(g.ctx, experts, weights);
  ggml_tensor* out = ggml_view_2d(g.ctx, experts, D, T, experts->nb[2], 0);
  for (int64_t k = 1; k < K; ++k)
    out = ggml_add(g.ctx, out,
                   ggml_view_2d(g.ctx, experts, D, T, experts->nb[2], static_cast<size_t>(k) * experts->nb[1]));
  ggml_set_output(sel);
  ggml_set_output(out);
  g.gf = ggml_new_graph(g.ctx);
  ggml_build_forward_expand(g.gf, sel);
  ggml_build_forward_expand(g.gf, out);
  g.alloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
  if (!ggml_gallocr_alloc_graph(g.alloc, g.gf)) die("cannot allocate the graph's intermediates");
  g.ids = sel;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  std::string type_name = "q4_0", layout = "plain";
  std::vector<long long> dims = {2048, 768, 128, 8}, tokens = {1, 2, 4, 8, 32};
  long long threads = 2, layers = 8, reps = 5, seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) die("option " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--type")
      type_name = v;
    else if (a == "--layout")
      layout = v;
    else if (a == "--dims")
      dims = parse_list(v);
    else if (a == "--tokens")
      tokens = parse_list(v);
    else if (a == "--threads")
      threads = parse_list(v).at(0);
    else if (a == "--layers")
      layers = parse_list(v).at(0);
    else if (a == "--reps")
      reps = parse_list(v).at(0);
    else if (a == "--seed")
      seed = parse_list(v).at(0);
    else
      die("unknown option " + a);
  }
  if (dims.size() != 4) die("--dims takes D,F,E,K");
  if (layout != "plain" && layout != "repack") die("--layout is plain or repack");
  const int64_t D = dims[0], F = dims[1], E = dims[2], K = dims[3];
  const ggml_type type = type_by_name(type_name);
  if (D % ggml_blck_size(type) != 0 || F % ggml_blck_size(type) != 0)
    die("D and F must be multiples of " + type_name + "'s block of " + std::to_string(ggml_blck_size(type)));

  ggml_backend_t backend = ggml_backend_cpu_init();
  if (backend == nullptr) die("ggml_backend_cpu_init failed");
  ggml_threadpool_params tpp = ggml_threadpool_params_default(static_cast<int>(threads));
  ggml_threadpool* pool = ggml_threadpool_new(&tpp);
  if (pool == nullptr) die("ggml_threadpool_new failed");
  ggml_backend_cpu_set_threadpool(backend, pool);
  ggml_backend_cpu_set_n_threads(backend, static_cast<int>(threads));

  ggml_backend_buffer_type_t wbuft = ggml_backend_cpu_buffer_type();
  if (layout == "repack") {
    wbuft = repack_buft();
    if (wbuft == nullptr) die("this ggml has no CPU_REPACK buffer type");
  }

  // The weights: L layers, the same content in each (P distinct experts tiled), distinct memory.
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::fprintf(stderr, "ggml_decode: quantizing %s experts\n", type_name.c_str());
  const std::vector<uint8_t> gate_bytes = expert_stack(type, D, F, E, rng);
  const std::vector<uint8_t> up_bytes = expert_stack(type, D, F, E, rng);
  const std::vector<uint8_t> down_bytes = expert_stack(type, F, D, E, rng);
  std::vector<float> router_f(static_cast<size_t>(D * E));
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(D)) * 4.0f);
  std::vector<Layer> L(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    Layer& w = L[static_cast<size_t>(l)];
    ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
    w.wctx = ggml_init(ip);
    w.gate = ggml_new_tensor_3d(w.wctx, type, D, F, E);
    w.up = ggml_new_tensor_3d(w.wctx, type, D, F, E);
    w.down = ggml_new_tensor_3d(w.wctx, type, F, D, E);
    w.wbuf = ggml_backend_alloc_ctx_tensors_from_buft(w.wctx, wbuft);
    if (w.wbuf == nullptr) die("cannot allocate layer " + std::to_string(l) + "'s experts (out of memory?)");
    if (layout == "repack" && (w.gate->extra == nullptr || w.down->extra == nullptr))
      die("llama.cpp has no repacked layout for " + type_name + " on this CPU");
    ggml_backend_tensor_set(w.gate, gate_bytes.data(), 0, gate_bytes.size());
    ggml_backend_tensor_set(w.up, up_bytes.data(), 0, up_bytes.size());
    ggml_backend_tensor_set(w.down, down_bytes.data(), 0, down_bytes.size());
    // The router stays f32 in a plain buffer, as llama.cpp's converter writes ffn_gate_inp.
    ggml_init_params rp = {ggml_tensor_overhead() * 2, nullptr, true};
    ggml_context* rctx = ggml_init(rp);
    w.router = ggml_new_tensor_2d(rctx, GGML_TYPE_F32, D, E);
    if (ggml_backend_alloc_ctx_tensors(rctx, backend) == nullptr) die("cannot allocate a router");
    for (float& v : router_f) v = nd(rng);
    ggml_backend_tensor_set(w.router, router_f.data(), 0, router_f.size() * sizeof(float));
  }
  const double per_expert = 2.0 * static_cast<double>(ggml_row_size(type, D) * static_cast<size_t>(F)) +
                            static_cast<double>(ggml_row_size(type, F) * static_cast<size_t>(D));
  const double router_bytes = static_cast<double>(D * E) * 4.0;

  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (const long long T : tokens) {
    ggml_init_params xp = {ggml_tensor_overhead() * 2, nullptr, true};
    ggml_context* xctx = ggml_init(xp);
    ggml_tensor* x = ggml_new_tensor_2d(xctx, GGML_TYPE_F32, D, T);
    ggml_set_input(x);
    ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors(xctx, backend);
    std::vector<Graph> graphs;
    for (const Layer& w : L) graphs.push_back(build_graph(w, x, K));
    std::vector<float> xs(static_cast<size_t>(D * T));
    std::vector<int32_t> ids(static_cast<size_t>(K * T));
    std::vector<double> secs;
    double touched = 0;
    for (long long r = -1; r < reps; ++r)  // one warm-up pass over the layers
      for (int64_t l = 0; l < layers; ++l) {
        for (float& v : xs) v = ux(rng);
        ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * sizeof(float));
        Graph& g = graphs[static_cast<size_t>(l)];
        const auto t0 = std::chrono::steady_clock::now();
        if (ggml_backend_graph_compute(backend, g.gf) != GGML_STATUS_SUCCESS) die("graph compute failed");
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r < 0) continue;
        secs.push_back(dt);
        ggml_backend_tensor_get(g.ids, ids.data(), 0, ids.size() * sizeof(int32_t));
        std::set<int32_t> active(ids.begin(), ids.end());
        touched += per_expert * static_cast<double>(active.size()) + router_bytes;
      }
    std::vector<double> sorted = secs;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted.size() % 2 ? sorted[sorted.size() / 2]
                                         : 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
    const double tb = touched / static_cast<double>(secs.size());
    std::printf(
        "{\"type\": \"%s\", \"layout\": \"%s\", \"tokens\": %lld, \"threads\": %lld, \"layers\": %lld, "
        "\"ms_per_layer\": %.4f, \"min_ms\": %.4f, \"touched_bytes\": %.0f, \"gbps\": %.3f, "
        "\"tokens_per_s\": %.3f}\n",
        type_name.c_str(), layout.c_str(), T, threads, layers, med * 1e3, sorted.front() * 1e3, tb, tb / med / 1e9,
        static_cast<double>(T) / (static_cast<double>(layers) * med));
    std::fflush(stdout);
    for (Graph& g : graphs) {
      ggml_gallocr_free(g.alloc);
      ggml_free(g.ctx);
    }
    ggml_backend_buffer_free(xbuf);
    ggml_free(xctx);
  }
  ggml_threadpool_free(pool);
  ggml_backend_free(backend);
  return 0;
}
