// `moekit bench`: a llama-bench-like table of the MoE layer at the reference shapes of docs/performance.md, for
// each weight dtype, token count and thread count, against the machine's limits measured in the
// same run with moekit's own means (no BLAS): the DRAM read bandwidth (a multi-threaded
// streaming sum over 1 GiB) and the peak of moekit's expert GEMM kernel on cached data.
//
// Each layer is built once per (shape, dtype) with random weights (splitmix64, fast enough to
// fill gigabytes in seconds). Routing is random and fresh per call: 8 pre-drawn input batches
// are cycled, so no call reuses the previous call's experts by construction. Weight GB/s counts
// the bytes of the experts a call actually touched (distinct experts in its routing, plus the
// shared experts) over the call's time.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "experts/expert_rows.hpp"
#include "format.hpp"
#include "kernels/gemm.hpp"
#include "moekit/moekit.hpp"
#include "util/schedule.hpp"
#ifdef MOEKIT_HAVE_DIST
#include "expert_parallel.hpp"
#endif

#include "git_commit.hpp"  // MOEKIT_GIT_COMMIT, generated at build time (cli/CMakeLists.txt)

namespace moekit::cli {

namespace {

// ---------------------------------------------------------------------------------------------
// Shapes

struct BenchShape {
  const char* name;
  const char* description;
  std::int64_t D, F, E, K, shared;  // shared: number of shared experts, each of width F
  const char* config_json;
};

// the reference shapes of docs/performance.md, as the config.json their families ship (one MoE layer). `tiny`
// is for smoke tests only; `all` means qwen3 + deepseek (Mixtral's f32 weights are 5.6 GB).
const BenchShape kShapes[] = {
    {"qwen3", "Qwen3-30B-A3B", 2048, 768, 128, 8, 0,
     R"({"model_type":"qwen3_moe","hidden_size":2048,"num_hidden_layers":1,"num_experts":128,
        "num_experts_per_tok":8,"moe_intermediate_size":768,"norm_topk_prob":true})"},
    {"deepseek", "DeepSeek-style (sigmoid, selection bias, groups 8/4, 2 shared)", 2048, 1408, 64,
     6, 2,
     R"({"model_type":"deepseek_v3","hidden_size":2048,"num_hidden_layers":1,"n_routed_experts":64,
        "num_experts_per_tok":6,"moe_intermediate_size":1408,"n_group":8,"topk_group":4,
        "topk_method":"noaux_tc","scoring_func":"sigmoid","norm_topk_prob":true,
        "routed_scaling_factor":2.5,"n_shared_experts":2,"first_k_dense_replace":0})"},
    {"mixtral", "Mixtral-8x7B", 4096, 14336, 8, 2, 0,
     R"({"model_type":"mixtral","hidden_size":4096,"num_hidden_layers":1,"num_local_experts":8,
        "num_experts_per_tok":2,"intermediate_size":14336})"},
    {"tiny", "tiny (smoke tests)", 64, 32, 8, 2, 0,
     R"({"model_type":"qwen3_moe","hidden_size":64,"num_hidden_layers":1,"num_experts":8,
        "num_experts_per_tok":2,"moe_intermediate_size":32,"norm_topk_prob":true})"},
};

std::vector<const BenchShape*> parse_shapes(const std::string& text) {
  std::vector<const BenchShape*> out;
  const auto add = [&](const BenchShape* s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  for (const std::string& item : split_list(text, "--shape")) {
    if (item == "all") {
      add(&kShapes[0]);
      add(&kShapes[1]);
      continue;
    }
    const BenchShape* found = nullptr;
    for (const BenchShape& s : kShapes)
      if (item == s.name) found = &s;
    if (found == nullptr)
      throw std::invalid_argument("--shape '" + item +
                                  "' is not a bench shape (expected qwen3, deepseek, mixtral, all, "
                                  "or tiny for smoke tests)");
    add(found);
  }
  return out;
}

// A weight format of the benchmark: a float dtype, or MLX affine codes of `bits` bits
// (group 64, bf16 scales and biases: what mlx-community's models use).
// "-int8": the fast mode (MoeLayer::set_int8_activations); "bf16-act": bf16 weights with the
// bf16 compute mode (MoeLayer::set_bf16_activations).
struct WeightFormat {
  DType dtype = DType::f32;
  int bits = 0;
  bool int8 = false;
  bool bf16_act = false;
  static constexpr int kGroup = 64;
  bool quantized() const { return bits != 0; }
  std::string name() const {
    if (bf16_act) return "bf16-act";
    if (!quantized()) return dtype_name(dtype);
    std::string n{'q', static_cast<char>('0' + bits)};
    if (int8) n += "-int8";
    return n;
  }
};

// The names parse_dtypes accepts, for --help and its error.
constexpr const char* kDtypeList =
    "f32, bf16, f16; q2, q3, q4, q5, q6, q8 (MLX affine, group 64, bf16 scales); q4-int8, q8-int8 (the "
    "int8 fast mode); bf16-act (bf16 weights, bf16 compute mode)";

std::vector<WeightFormat> parse_dtypes(const std::string& text) {
  std::vector<WeightFormat> out;
  for (const std::string& item : split_list(text, "--dtype")) {
    WeightFormat f;
    if (item == "f32") {
      f.dtype = DType::f32;
    } else if (item == "bf16") {
      f.dtype = DType::bf16;
    } else if (item == "bf16-act") {
      f.dtype = DType::bf16;
      f.bf16_act = true;
    } else if (item == "f16") {
      f.dtype = DType::f16;
    } else if (item.size() == 2 && item[0] == 'q' && std::string("234568").find(item[1]) != std::string::npos) {
      f.dtype = DType::u32;
      f.bits = item[1] - '0';
    } else if ((item == "q4-int8" || item == "q8-int8")) {
      f.dtype = DType::u32;
      f.bits = item[1] - '0';
      f.int8 = true;
    } else {
      throw std::invalid_argument("--dtype '" + item + "' is not a weight format moekit runs (expected " +
                                  kDtypeList + ")");
    }
    for (const WeightFormat& g : out)
      if (g.name() == f.name()) throw std::invalid_argument("--dtype '" + text + "' lists " + item + " twice");
    out.push_back(f);
  }
  return out;
}

std::vector<std::string> parse_layouts(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& item : split_list(text, "--layout")) {
    if (item != "rows" && item != "panels")
      throw std::invalid_argument("--layout '" + item + "' is not a weight layout (expected panels or rows)");
    if (std::find(out.begin(), out.end(), item) != out.end())
      throw std::invalid_argument("--layout '" + text + "' lists " + item + " twice");
    out.push_back(item);
  }
  return out;
}

// Bytes of one expert's three matrices (quantized: codes + bf16 scales and biases).
double expert_bytes(const BenchShape& s, const WeightFormat& f) {
  const double n = 3.0 * static_cast<double>(s.D) * static_cast<double>(s.F);
  if (f.quantized()) return n * f.bits / 8.0 + n / WeightFormat::kGroup * 2.0 * 2.0;
  return n * static_cast<double>(dtype_size(f.dtype));
}

double layer_weight_bytes(const BenchShape& s, const WeightFormat& f) {
  return static_cast<double>(s.E + s.shared) * expert_bytes(s, f);
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes * 1e-9);
  return buf;
}

// MemAvailable from /proc/meminfo in bytes, or -1 where it cannot be read.
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  return -1.0;
}

// ---------------------------------------------------------------------------------------------
// Random numbers

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint16_t to_bf16_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even (values are finite)
  return static_cast<std::uint16_t>(bits >> 16);
}

// Runs body(i) for i in [0, n) on all hardware threads (the work items are independent).
template <typename Body>
void parallel_items(std::int64_t n, const Body& body) {
  const int nt = static_cast<int>(
      std::min<std::int64_t>(n, std::max(1u, std::thread::hardware_concurrency())));
  std::atomic<std::int64_t> next{0};
  const auto work = [&] {
    for (std::int64_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < nt; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
}

// Uniform values with mean 0 and standard deviation `stddev` into an f32, bf16 or f16 tensor.
// Chunked with a seed per chunk, so the values depend on (stream, index) only, never on the
// thread count.
void fill_random(const Tensor& t, float stddev, std::uint64_t stream) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 18;
  const std::int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float a = std::sqrt(3.0f) * stddev;
  const DType dtype = t.dtype();
  Tensor staging;  // f16 goes through convert() chunk by chunk
  parallel_items(chunks, [&](std::int64_t c) {
    std::uint64_t state = stream * 0xD1B54A32D192ED03ull + static_cast<std::uint64_t>(c);
    splitmix64(state);
    const std::int64_t b = c * kChunk, e = std::min(n, b + kChunk);
    float tmp[256];
    for (std::int64_t i = b; i < e; i += 256) {
      const std::int64_t m = std::min<std::int64_t>(256, e - i);
      for (std::int64_t j = 0; j < m; ++j) {
        const float u = static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
        tmp[j] = (2.0f * u - 1.0f) * a;
      }
      if (dtype == DType::f32) {
        std::memcpy(t.data_as<float>() + i, tmp, static_cast<std::size_t>(m) * sizeof(float));
      } else if (dtype == DType::bf16) {
        std::uint16_t* p = t.data_as<std::uint16_t>() + i;
        for (std::int64_t j = 0; j < m; ++j) p[j] = to_bf16_bits(tmp[j]);
      } else {
        convert(TensorView(tmp, {m}, DType::f32),
                TensorView(t.data_as<std::uint16_t>() + i, {m}, dtype));
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The layer

// A stacked [n, out, in] projection in format `f`: float weights, or random codes with small
// random bf16 scales and biases around zero (values of the same spread as the float weights).
ExpertMatrix random_matrix(const WeightFormat& f, std::int64_t n, std::int64_t out, std::int64_t in,
                           std::uint64_t& stream, std::vector<std::shared_ptr<const void>>& keep) {
  if (!f.quantized()) {
    auto t = std::make_shared<Tensor>(Tensor::uninitialized({n, out, in}, f.dtype));
    fill_random(*t, 0.02f, stream++);
    keep.push_back(t);
    return ExpertMatrix::stacked(*t);
  }
  const std::int64_t words = in * f.bits / 32, groups = in / WeightFormat::kGroup;
  auto codes = std::make_shared<Tensor>(Tensor::uninitialized({n, out, words}, DType::u32));
  auto scales = std::make_shared<Tensor>(Tensor::uninitialized({n, out, groups}, DType::bf16));
  auto biases = std::make_shared<Tensor>(Tensor::uninitialized({n, out, groups}, DType::bf16));
  std::uint64_t state = stream++ * 0xD1B54A32D192ED03ull;
  auto* c = codes->data_as<std::uint32_t>();
  for (std::int64_t i = 0; i < codes->numel(); ++i) c[i] = static_cast<std::uint32_t>(splitmix64(state));
  const float top = static_cast<float>((1 << f.bits) - 1);
  auto* sc = scales->data_as<std::uint16_t>();
  auto* bi = biases->data_as<std::uint16_t>();
  for (std::int64_t i = 0; i < scales->numel(); ++i) {
    sc[i] = to_bf16_bits(0.07f / top);
    bi[i] = to_bf16_bits(-0.035f);
  }
  keep.insert(keep.end(), {codes, scales, biases});
  return ExpertMatrix::stacked_affine(*codes, *scales, *biases, f.bits, WeightFormat::kGroup);
}

// Random router weights (and selection / router bias where the config has them), f32.
MoeWeights random_router(const MoeConfig& cfg, std::int64_t E, std::int64_t D, std::uint64_t& stream) {
  MoeWeights w;
  auto router = std::make_shared<Tensor>(Tensor::uninitialized({E, D}, DType::f32));
  fill_random(*router, 0.02f, stream++);
  w.router = router->view();
  w.keep_alive.push_back(router);
  if (cfg.router.has_selection_bias) {
    w.selection_bias = Tensor({E}, DType::f32);
    fill_random(w.selection_bias, 0.01f, stream++);
  }
  if (cfg.router.has_router_bias) {
    w.router_bias = Tensor({E}, DType::f32);
    fill_random(w.router_bias, 0.01f, stream++);
  }
  return w;
}

std::unique_ptr<MoeLayer> build_layer(const BenchShape& s, const WeightFormat& format, bool panels,
                                      std::uint64_t seed) {
  MoeConfig cfg = parse_hf_config(s.config_json);
  if (cfg.hidden_size != s.D || cfg.expert_width != s.F || cfg.router.num_experts != s.E ||
      cfg.router.top_k != s.K || cfg.shared_width != s.shared * s.F)
    throw std::logic_error(std::string("bench shape ") + s.name + " disagrees with its config");
  const std::int64_t D = s.D, E = s.E;
  std::uint64_t stream = seed * 1000 + 1;
  MoeWeights w = random_router(cfg, E, D, stream);
  const auto experts = [&](std::int64_t n, std::int64_t F) {
    ExpertWeights ex;
    ex.gate = random_matrix(format, n, F, D, stream, ex.keep_alive);
    ex.up = random_matrix(format, n, F, D, stream, ex.keep_alive);
    ex.down = random_matrix(format, n, D, F, stream, ex.keep_alive);
    return ex;
  };
  w.experts = experts(E, s.F);
  if (cfg.shared_width > 0) w.shared = experts(1, cfg.shared_width);
  w.layout = "stacked (random, in memory)";
  auto layer = std::make_unique<MoeLayer>(std::move(cfg), std::move(w));
  if (format.bf16_act) layer->set_bf16_activations(true);  // first: packing then takes its layout
  if (panels) layer->pack_weights();
  if (format.int8) layer->set_int8_activations(true);
  return layer;
}

// ---------------------------------------------------------------------------------------------
// The machine's limits, measured with moekit's own means

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Multi-threaded streaming sum over `bytes` of floats, best of 3, in GB/s.
double measure_dram_read(int threads, std::size_t bytes) {
  using V = float __attribute__((vector_size(16)));
  constexpr std::size_t kStep = 16;  // floats per iteration: 4 accumulators of 4 lanes
  const std::size_t per_thread =
      bytes / sizeof(float) / static_cast<std::size_t>(threads) / kStep * kStep;
  const std::size_t n = per_thread * static_cast<std::size_t>(threads);
  if (per_thread == 0) throw std::invalid_argument("the DRAM buffer is too small");
  std::unique_ptr<float[]> buf(new (std::nothrow) float[n]);
  if (!buf)
    throw std::runtime_error("out of memory allocating the " + gb(double(n) * 4) +
                             " DRAM read buffer");
  std::vector<float> sums(static_cast<std::size_t>(threads));
  const auto run = [&](bool fill) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        float* p = buf.get() + per_thread * static_cast<std::size_t>(t);
        if (fill) {  // first touch on the thread that reads it
          std::fill(p, p + per_thread, 1.0f);
          return;
        }
        V a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (std::size_t i = 0; i < per_thread; i += kStep) {
          V v0, v1, v2, v3;
          std::memcpy(&v0, p + i, sizeof v0);
          std::memcpy(&v1, p + i + 4, sizeof v1);
          std::memcpy(&v2, p + i + 8, sizeof v2);
          std::memcpy(&v3, p + i + 12, sizeof v3);
          a0 += v0;
          a1 += v1;
          a2 += v2;
          a3 += v3;
        }
        const V s = (a0 + a1) + (a2 + a3);
        sums[static_cast<std::size_t>(t)] = s[0] + s[1] + s[2] + s[3];
      });
    for (std::thread& th : pool) th.join();
  };
  run(true);
  double best = 0.0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    run(false);
    best = std::max(best, static_cast<double>(n) * sizeof(float) / seconds_since(t0) * 1e-9);
  }
  volatile float sink = 0.0f;
  for (float v : sums) sink = sink + v;
  return best;
}

constexpr std::int64_t kPeakM = 256, kPeakN = 768, kPeakK = 2048;

// GFLOP/s of the best of 3 calls of a kPeakM x kPeakN x kPeakK GEMM, after one warm-up call (B
// into cache, the pool's threads started).
template <typename Call>
double best_peak_gflops(const Call& call) {
  call();
  double best = 0.0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    call();
    best = std::max(best, 2.0 * kPeakM * kPeakN * kPeakK / seconds_since(t0) * 1e-9);
  }
  return best;
}

// moekit::kernels::gemm_nt, f32, M = 256 rows x [768, 2048] weights (6 MB: cached), best of 3.
double measure_gemm_peak(int threads) {
  set_num_threads(threads);
  Tensor a = Tensor::uninitialized({kPeakM, kPeakK}, DType::f32);
  Tensor b = Tensor::uninitialized({kPeakN, kPeakK}, DType::f32);
  Tensor c = Tensor::uninitialized({kPeakM, kPeakN}, DType::f32);
  Tensor p = Tensor::uninitialized({kernels::panel_elements(kPeakN, kPeakK)}, DType::f32);
  fill_random(a, 1.0f, 7);
  fill_random(b, 0.02f, 8);
  kernels::pack_panels({b.data(), DType::f32, kPeakK}, kPeakN, kPeakK, p.data_as<float>());
  // The faster of moekit's two forward kernels: the panel kernel (the dot-product kernel on
  // rows measured 15-25 % lower on the machines of docs/performance.md).
  const auto call = [&] {
    kernels::gemm_nt({a.data_as<float>(), kPeakK}, {p.data(), DType::f32, kPeakK, kernels::WeightLayout::panels},
                     {c.data_as<float>(), kPeakN}, kPeakM, kPeakN, kPeakK);
  };
  return best_peak_gflops(call);
}

// The bf16 compute mode's GEMM on the CPU's bf16 path (kernels::bf16_path(): AMX tiles where the
// CPU has them), same shape and cache state, rounding of the f32 rows included, best of 3: the
// limit of the bf16-act rows.
double measure_bf16_peak(int threads) {
  set_num_threads(threads);
  const kernels::Bf16Path path = kernels::bf16_path();
  Tensor a = Tensor::uninitialized({kPeakM, kPeakK}, DType::f32);
  Tensor b = Tensor::uninitialized({kPeakN, kPeakK}, DType::f32);
  Tensor c = Tensor::uninitialized({kPeakM, kPeakN}, DType::f32);
  fill_random(a, 1.0f, 7);
  fill_random(b, 0.02f, 8);
  const Tensor wb = to_dtype(b, DType::bf16);
  std::vector<float> buf((kernels::bf16_activation_bytes(kPeakM, kPeakK, path) + 3) / 4);
  const auto call = [&] {
    const kernels::Bf16Activations x =
        kernels::round_to_bf16({a.data_as<float>(), kPeakK}, kPeakM, kPeakK, path, buf.data());
    kernels::gemm_nt_bf16(x, {wb.data(), DType::bf16, kPeakK}, {c.data_as<float>(), kPeakN}, kPeakM, kPeakN, kPeakK);
  };
  return best_peak_gflops(call);
}

// ---------------------------------------------------------------------------------------------
// Machine description

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) break;
      std::string v = line.substr(colon + 1);
      const std::size_t b = v.find_first_not_of(" \t");
      return b == std::string::npos ? "unknown CPU" : v.substr(b);
    }
  }
  return "unknown CPU";
}

std::string join_ints(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Results

struct Row {
  std::string mode = "forward";  // "forward", or "train" (forward_train + backward)
  std::string shape, dtype, layout;
  std::int64_t tokens = 0;
  int threads = 0;
  double median_ms = 0, min_ms = 0, tokens_per_s = 0, gflops = 0, weight_gbs = 0;
  std::string limit;  // "gemm_peak" or "dram_read"
  double limit_value = 0, limit_pct = 0;
  double saved_bytes_per_token = 0;  // train: what the training forward keeps for the backward
  // --simulate-threads (forward): the last call's routed-expert tasks, the model's time for them
  // at this row's threads, and the schedule's efficiency at each simulated thread count.
  std::int64_t sim_tasks = 0;
  double sim_model_ms = 0;
  std::vector<std::pair<int, double>> sim_efficiency;
};

struct Limits {
  int dram_threads = 0;
  std::size_t dram_bytes = 0;
  double dram_gbs = 0;
  std::vector<std::pair<int, double>> gemm_peak;  // (threads, GFLOP/s)
  std::vector<std::pair<int, double>> bf16_peak;  // (threads, GFLOP/s); only with a bf16-act dtype
  static double at(const std::vector<std::pair<int, double>>& v, int threads) {
    for (const auto& [t, x] : v)
      if (t == threads) return x;
    return 0.0;
  }
  double peak_for(int threads) const { return at(gemm_peak, threads); }
};

struct Header {
  std::string commit = MOEKIT_GIT_COMMIT, cpu, simd;
  unsigned hardware_threads = 0;
  std::vector<std::int64_t> threads;
  int reps = 0;
  std::uint64_t seed = 0;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<Row> run_shape(const BenchShape& s, const WeightFormat& format,
                           const std::string& layout, const std::vector<std::int64_t>& tokens,
                           const std::vector<std::int64_t>& threads, int reps, std::uint64_t seed,
                           const Limits& limits, bool progress, bool train,
                           const std::vector<std::int64_t>& simulate) {
  const double needed = layer_weight_bytes(s, format);
  const double avail = available_memory();
  if (avail >= 0 && needed + 256e6 > avail)
    throw std::runtime_error("out of memory: " + std::string(s.name) + " " + format.name() +
                             " needs " + gb(needed) + " of weights but only " + gb(avail) +
                             " is available");
  if (progress)
    std::fprintf(stderr, "moekit bench: building %s %s (%s)...\n", s.name, format.name().c_str(),
                 gb(needed).c_str());
  std::unique_ptr<MoeLayer> layer;
  try {
    layer = build_layer(s, format, layout == "panels", seed);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory building " + std::string(s.name) + " " +
                             format.name() + " (" + gb(needed) + " of weights)");
  }
  const double per_expert = expert_bytes(s, format);
  std::vector<Row> rows;
  for (const std::int64_t T : tokens) {
    constexpr int kBatches = 8;
    std::vector<Tensor> inputs;
    for (int i = 0; i < kBatches; ++i) {
      inputs.push_back(Tensor::uninitialized({T, s.D}, DType::f32));
      fill_random(inputs.back(), 1.0f,
                  seed * 1000 + 100 + static_cast<std::uint64_t>(T) * kBatches + i);
    }
    for (const std::int64_t nt : threads) {
      if (progress)
        std::fprintf(stderr, "moekit bench: %s %s T=%lld threads=%lld\n", s.name, format.name().c_str(),
                     static_cast<long long>(T), static_cast<long long>(nt));
      set_num_threads(static_cast<int>(nt));
      std::size_t next = 0;
      std::vector<double> secs;
      double touched = 0.0, saved_bytes = 0.0;
      Tensor last_ids;  // the last timed call's routing
      if (!train) {
        Tensor y = layer->forward(inputs[next++ % kBatches]);  // warm-up
        for (int r = 0; r < reps; ++r) {
          ForwardInfo info;
          const auto t0 = Clock::now();
          y = layer->forward(inputs[next++ % kBatches], &info);
          secs.push_back(seconds_since(t0));
          std::int64_t active = 0;
          for (const std::int64_t c : expert_counts(info.routing.ids, s.E)) active += c > 0;
          last_ids = info.routing.ids;
          touched += per_expert * static_cast<double>(active + s.shared);
        }
      } else {
        // One training step: forward_train + backward into gradient buffers kept between
        // steps (as a training loop keeps them), dy = a fixed random tensor.
        Tensor dy = Tensor::uninitialized({T, s.D}, DType::f32);
        fill_random(dy, 1.0f, seed * 1000 + 7);
        MoeTensors grads = MoeTensors::zeros_like(*layer);
        SavedForward saved;  // reused step after step, as a training loop does
        for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
          const auto t0 = Clock::now();
          layer->forward_train(inputs[next++ % kBatches], saved);
          backward(*layer, saved, dy, grads);
          const double dt = seconds_since(t0);
          if (r < 0) continue;
          secs.push_back(dt);
          saved_bytes = static_cast<double>(saved.nbytes()) / static_cast<double>(T);
          std::int64_t active = 0;
          for (const std::int64_t c : saved.routed.plan.counts) active += c > 0;
          touched += per_expert * static_cast<double>(active + s.shared);
        }
      }
      Row row;
      row.mode = train ? "train" : "forward";
      row.saved_bytes_per_token = saved_bytes;
      row.shape = s.name;
      row.dtype = format.name();
      row.layout = format.quantized()                         ? "affine"
                   : format.bf16_act && layout == "panels" ? "amx_tiles"
                                                           : layout;
      row.tokens = T;
      row.threads = static_cast<int>(nt);
      const double med = median_of(secs);
      row.median_ms = med * 1e3;
      row.min_ms = *std::min_element(secs.begin(), secs.end()) * 1e3;
      row.tokens_per_s = static_cast<double>(T) / med;
      row.gflops = (train ? 3.0 : 1.0) * 2.0 * 3.0 * static_cast<double>(T) * static_cast<double>(s.K + s.shared) *
                   static_cast<double>(s.D) * static_cast<double>(s.F) / med * 1e-9;
      row.weight_gbs = touched / reps / med * 1e-9;
      // The GEMM peak this row's kernels are held against (GFLOP/s at the row's threads).
      const double gemm_peak = format.bf16_act ? Limits::at(limits.bf16_peak, row.threads)
                                               : limits.peak_for(row.threads);
      if (T >= 128) {
        row.limit = format.bf16_act ? "bf16_peak" : "gemm_peak";
        row.limit_value = gemm_peak;
        row.limit_pct = row.limit_value > 0 ? 100.0 * row.gflops / row.limit_value : 0.0;
      } else {
        row.limit = "dram_read";
        row.limit_value = limits.dram_gbs;
        row.limit_pct = row.limit_value > 0 ? 100.0 * row.weight_gbs / row.limit_value : 0.0;
      }
      const double bw = limits.dram_gbs * 1e9 / std::max(1, limits.dram_threads);
      const double peak = gemm_peak * 1e9 / static_cast<double>(nt);
      if (!simulate.empty() && last_ids.numel() > 0 && bw > 0 && peak > 0) {
        // A task's time on one thread: its expert's weight bytes at one thread's share of the
        // DRAM read limit, then its FLOPs at one thread's share of the GEMM peak (streaming and
        // compute not overlapped). Shared experts, router and combine are not modelled.
        std::vector<double> costs;
        double sum = 0;
        for (const ExpertTask& t : expert_tasks(plan_dispatch(last_ids, s.E).offsets)) {
          costs.push_back(per_expert / bw + 6.0 * static_cast<double>(s.D * s.F * t.count) / peak);
          sum += costs.back();
        }
        row.sim_tasks = static_cast<std::int64_t>(costs.size());
        // Where run_sorted_rows splits each GEMM over the pool instead of running tasks side by
        // side (split_gemms), modelled as an even split.
        const auto makespan = [&](std::int64_t p) {
          return split_gemms(row.sim_tasks, p)
                     ? sum / static_cast<double>(p)
                     : detail::list_schedule_makespan(costs, static_cast<int>(p));
        };
        row.sim_model_ms = makespan(nt) * 1e3;
        for (const std::int64_t p : simulate)
          row.sim_efficiency.emplace_back(static_cast<int>(p),
                                          sum / (static_cast<double>(p) * makespan(p)));
      }
      rows.push_back(row);
    }
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Output

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Three significant digits, at least one decimal below 100 ("0.412", "14.8", "196").
std::string sig3(double v) {
  if (v >= 100.0) return fmt("%.0f", v);
  if (v >= 10.0) return fmt("%.1f", v);
  if (v >= 1.0) return fmt("%.2f", v);
  return fmt("%.3f", v);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

const char* limit_label(const std::string& limit) {
  if (limit == "bf16_peak") return "bf16 GEMM peak";
  return limit == "gemm_peak" ? "GEMM peak" : "DRAM read";
}

void print_md(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
              const std::vector<Row>& rows) {
  std::printf("moekit bench (commit %s)\n\n", h.commit.c_str());
  std::printf("- machine: %s, %u hardware threads\n", h.cpu.c_str(), h.hardware_threads);
  std::printf("- SIMD target: %s\n", h.simd.c_str());
  std::printf("- threads: %s; %d timed calls per row after one warm-up (median and min)\n",
              join_ints(h.threads).c_str(), h.reps);
  for (const BenchShape* s : shapes)
    std::printf("- %s: %s, D = %lld, F = %lld, E = %lld, K = %lld%s\n", s->name, s->description,
                static_cast<long long>(s->D), static_cast<long long>(s->F),
                static_cast<long long>(s->E), static_cast<long long>(s->K),
                s->shared ? (", " + std::to_string(s->shared) + " shared").c_str() : "");
  std::printf("\n| limit (same run) | threads | value | how |\n|---|---|---|---|\n");
  std::printf("| DRAM read | %d | %.1f GB/s | streaming sum over %s, best of 3 |\n", l.dram_threads,
              l.dram_gbs, format_bytes(l.dram_bytes).c_str());
  for (const auto& [t, v] : l.gemm_peak)
    std::printf(
        "| moekit GEMM peak (cached) | %d | %.1f GFLOP/s | gemm_nt f32 on panels, M = %lld, N = %lld, K = "
        "%lld, best of 3 |\n",
        t, v, static_cast<long long>(kPeakM), static_cast<long long>(kPeakN),
        static_cast<long long>(kPeakK));
  for (const auto& [t, v] : l.bf16_peak)
    std::printf(
        "| moekit bf16 GEMM peak (cached) | %d | %.1f GFLOP/s | gemm_nt_bf16 (%s), rounding included, M = %lld, N = "
        "%lld, K = %lld, best of 3 |\n",
        t, v, kernels::bf16_path_name(kernels::bf16_path()), static_cast<long long>(kPeakM),
        static_cast<long long>(kPeakN), static_cast<long long>(kPeakK));
  std::printf(
      "\n| mode | shape | dtype | layout | T | threads | median ms | min ms | tokens/s | GFLOP/s | weight GB/s | "
      "vs. limit |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %s | %s | %lld | %d | %s | %s | %s | %s | %s | %.0f %% of %s |\n", r.mode.c_str(),
                r.shape.c_str(), r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                sig3(r.median_ms).c_str(), sig3(r.min_ms).c_str(),
                fmt("%.0f", r.tokens_per_s).c_str(), sig3(r.gflops).c_str(),
                sig3(r.weight_gbs).c_str(), r.limit_pct, limit_label(r.limit));
  std::printf(
      "\nGFLOP/s = 2*3*T*(K + shared)*D*F per call / median; weight GB/s = bytes of the experts "
      "the "
      "call's routing touched (+ shared) / median; vs. limit: T >= 128 GFLOP/s against the GEMM "
      "peak "
      "at the row's threads (bf16-act: the bf16 GEMM peak), T < 128 weight GB/s against DRAM read. train: one step = forward_train + "
      "backward, 3x the forward's FLOPs.\n");
  bool simulated = false;
  for (const Row& r : rows) simulated = simulated || !r.sim_efficiency.empty();
  if (simulated) {
    std::printf(
        "\n| shape | dtype | layout | T | threads | tasks | model ms (routed experts) | measured "
        "ms |");
    for (const auto& [p, e] : rows.front().sim_efficiency)
      std::printf(" efficiency at %d threads |", p);
    std::printf("\n|---|---|---|---|---|---|---|---|");
    for (std::size_t i = 0; i < rows.front().sim_efficiency.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (const Row& r : rows) {
      std::printf("| %s | %s | %s | %lld | %d | %lld | %s | %s |", r.shape.c_str(), r.dtype.c_str(),
                  r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                  static_cast<long long>(r.sim_tasks), sig3(r.sim_model_ms).c_str(),
                  sig3(r.median_ms).c_str());
      for (const auto& [p, e] : r.sim_efficiency) std::printf(" %.0f %% |", 100.0 * e);
      std::printf("\n");
    }
    std::printf(
        "\nSimulated schedule (--simulate-threads): the last timed call's routed rows cut into\n"
        "the layer's tasks (expert, <= %lld rows), each costing its expert's weight bytes at one\n"
        "thread's share of the DRAM limit plus its FLOPs at one thread's share of the GEMM peak,\n"
        "run in order by workers that take the next task when free (fewer tasks than threads:\n"
        "each GEMM split evenly). Efficiency = total task time / (threads x finish time): the "
        "load\n"
        "balance only; the shared DRAM of a bigger machine is not modelled.\n",
        static_cast<long long>(kTaskRows));
  }
  for (const Row& r : rows)
    if (r.mode == "train")
      std::printf("- train %s T = %lld: the training forward keeps %s per token for the backward\n", r.shape.c_str(),
                  static_cast<long long>(r.tokens), format_bytes(static_cast<std::size_t>(r.saved_bytes_per_token)).c_str());
}

void print_csv(const Header& h, const std::vector<Row>& rows) {
  std::printf(
      "mode,shape,dtype,layout,tokens,threads,median_ms,min_ms,tokens_per_s,gflops,weight_gbs,limit,limit_"
      "value,"
      "limit_pct,saved_bytes_per_token,cpu,simd,commit\n");
  for (const Row& r : rows)
    std::printf("%s,%s,%s,%s,%lld,%d,%.4f,%.4f,%.2f,%.3f,%.3f,%s,%.3f,%.2f,%.0f,%s,%s,%s\n", r.mode.c_str(),
                r.shape.c_str(),
                r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads, r.median_ms, r.min_ms,
                r.tokens_per_s, r.gflops, r.weight_gbs, r.limit.c_str(), r.limit_value, r.limit_pct,
                r.saved_bytes_per_token, csv_field(h.cpu).c_str(), csv_field(h.simd).c_str(), csv_field(h.commit).c_str());
}

void print_json(const Header& h, const Limits& l, const std::vector<const BenchShape*>& shapes,
                const std::vector<Row>& rows) {
  nlohmann::json j;
  j["commit"] = h.commit;
  j["cpu"] = h.cpu;
  j["hardware_threads"] = h.hardware_threads;
  j["simd_target"] = h.simd;
  j["threads"] = h.threads;
  j["reps"] = h.reps;
  j["seed"] = h.seed;
  j["limits"] = nlohmann::json::array();
  j["limits"].push_back({{"name", "dram_read"},
                         {"unit", "GB/s"},
                         {"threads", l.dram_threads},
                         {"bytes", l.dram_bytes},
                         {"value", l.dram_gbs}});
  const auto peaks = [&](const std::vector<std::pair<int, double>>& values, const char* name,
                         const std::string& label) {
    for (const auto& [t, v] : values)
      j["limits"].push_back({{"name", name},
                             {"label", label},
                             {"unit", "GFLOP/s"},
                             {"threads", t},
                             {"M", kPeakM},
                             {"N", kPeakN},
                             {"K", kPeakK},
                             {"value", v}});
  };
  peaks(l.gemm_peak, "gemm_peak", "moekit GEMM peak (cached)");
  peaks(l.bf16_peak, "bf16_peak",
        std::string("moekit bf16 GEMM peak (cached, ") + kernels::bf16_path_name(kernels::bf16_path()) + ")");
  j["shapes"] = nlohmann::json::array();
  for (const BenchShape* s : shapes)
    j["shapes"].push_back({{"name", s->name},
                           {"description", s->description},
                           {"D", s->D},
                           {"F", s->F},
                           {"E", s->E},
                           {"K", s->K},
                           {"shared", s->shared}});
  j["results"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["results"].push_back({{"mode", r.mode},
                            {"saved_bytes_per_token", r.saved_bytes_per_token},
                            {"shape", r.shape},
                            {"dtype", r.dtype},
                            {"layout", r.layout},
                            {"tokens", r.tokens},
                            {"threads", r.threads},
                            {"median_ms", r.median_ms},
                            {"min_ms", r.min_ms},
                            {"tokens_per_s", r.tokens_per_s},
                            {"gflops", r.gflops},
                            {"weight_gbs", r.weight_gbs},
                            {"limit", r.limit},
                            {"limit_value", r.limit_value},
                            {"limit_pct", r.limit_pct},
                            {"simulated_tasks", r.sim_tasks},
                            {"simulated_model_ms", r.sim_model_ms},
                            {"simulated_efficiency", r.sim_efficiency}});
  std::printf("%s\n", j.dump(2).c_str());
}

struct Options {
  std::string shape = "all", dtype = "f32,bf16", layout = "panels", tokens = "1,32,512", threads,
              reps = "5", seed = "0", output = "md", dram_mib = "1024", mode = "forward",
              simulate_threads;
  bool expert_parallel = false;
};

#ifdef MOEKIT_HAVE_DIST
// ---------------------------------------------------------------------------------------------
// `mpirun -np N moekit bench --expert-parallel`

// The bench layer of shape `s` on one rank of an expert-parallel job: the router and shared
// experts whole, the routed experts this rank owns filled with random weights, every other
// expert pointing at the first of them (valid memory, never read), so a rank holds ~1/N of the
// routed bytes.
std::shared_ptr<MoeLayer> build_rank_layer(const BenchShape& s, const WeightFormat& format, std::uint64_t seed,
                                           const dist::ExpertPlacement& placement, int rank) {
  MoeConfig cfg = parse_hf_config(s.config_json);
  const std::int64_t D = s.D, E = s.E;
  const std::vector<std::int64_t> mine = placement.experts_of(rank);
  const std::int64_t n = std::max<std::int64_t>(1, static_cast<std::int64_t>(mine.size()));
  std::uint64_t stream = seed * 1000 + 1 + static_cast<std::uint64_t>(rank) * 7919;
  std::uint64_t shared_stream = seed * 1000 + 1;  // router, biases, shared experts: the same on every rank
  MoeWeights w = random_router(cfg, E, D, shared_stream);
  const auto spread = [&](ExpertMatrix m) {
    ExpertMatrix all = m;
    all.experts.assign(static_cast<std::size_t>(E), m.experts[0]);
    if (m.quantized()) {
      all.affine.scales.assign(static_cast<std::size_t>(E), m.affine.scales[0]);
      all.affine.biases.assign(static_cast<std::size_t>(E), m.affine.biases[0]);
    }
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto e = static_cast<std::size_t>(mine[i]);
      all.experts[e] = m.experts[i];
      if (m.quantized()) {
        all.affine.scales[e] = m.affine.scales[i];
        all.affine.biases[e] = m.affine.biases[i];
      }
    }
    return all;
  };
  w.experts.gate = spread(random_matrix(format, n, s.F, D, stream, w.experts.keep_alive));
  w.experts.up = spread(random_matrix(format, n, s.F, D, stream, w.experts.keep_alive));
  w.experts.down = spread(random_matrix(format, n, D, s.F, stream, w.experts.keep_alive));
  if (cfg.shared_width > 0) {
    w.shared.gate = random_matrix(format, 1, cfg.shared_width, D, shared_stream, w.shared.keep_alive);
    w.shared.up = random_matrix(format, 1, cfg.shared_width, D, shared_stream, w.shared.keep_alive);
    w.shared.down = random_matrix(format, 1, D, cfg.shared_width, shared_stream, w.shared.keep_alive);
  }
  auto layer = std::make_shared<MoeLayer>(std::move(cfg), std::move(w));
  if (format.int8) layer->set_int8_activations(true);
  if (format.bf16_act) layer->set_bf16_activations(true);
  return layer;
}

// Seconds of one collective exchange of `bytes` per rank pair (MPI_Alltoall), best of `reps`.
double time_alltoall(std::size_t bytes, int reps) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  std::vector<char> out(bytes * static_cast<std::size_t>(P), 1), in(out.size());
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Alltoall(out.data(), static_cast<int>(bytes), MPI_BYTE, in.data(), static_cast<int>(bytes), MPI_BYTE,
                 MPI_COMM_WORLD);
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 0) best = std::min(best, t);
  }
  return best;
}

// Half a round trip of `bytes` between ranks 0 and 1 (ping-pong), best of `reps`.
double time_pingpong(std::size_t bytes, int reps) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<char> buf(std::max<std::size_t>(bytes, 1));
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    }
    double t = (MPI_Wtime() - t0) / 2;
    MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (r > 0) best = std::min(best, t);
  }
  return best;
}

std::int64_t resident_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::int64_t kb = 0;
      in >> kb;
      return kb;
    }
    in.ignore(1 << 16, '\n');
  }
  return -1;
}

void run_bench_expert_parallel(const MpiSession& mpi, const Options& o) {
  std::exception_ptr err;
  std::vector<const BenchShape*> shapes;
  std::vector<WeightFormat> dtypes;
  std::vector<std::int64_t> tokens;
  int reps = 0, threads = 0;
  std::uint64_t seed = 0;
  try {
    shapes = parse_shapes(o.shape);
    dtypes = parse_dtypes(o.dtype);
    tokens = parse_int_list(o.tokens, "--tokens", 1, 1 << 20);
    const std::vector<std::int64_t> t = parse_int_list(o.threads, "--threads", 1, 4096);
    if (t.size() != 1) throw std::invalid_argument("--expert-parallel takes one --threads value (threads per rank)");
    threads = static_cast<int>(t[0]);
    reps = static_cast<int>(parse_int(o.reps, "--reps", 1, 1000));
    seed = static_cast<std::uint64_t>(parse_int(o.seed, "--seed", 0, INT64_MAX));
    if (o.mode != "forward") throw std::invalid_argument("--expert-parallel measures the forward only");
    if (o.output != "md") throw std::invalid_argument("--expert-parallel prints markdown only (-o md)");
    for (const WeightFormat& d : dtypes)
      if (d.bf16_act && o.layout != "rows" && o.layout != "panels")
        throw std::invalid_argument("bad --layout");
  } catch (...) {
    err = std::current_exception();
  }
  dist::agree(MPI_COMM_WORLD, err);
  set_num_threads(threads);
  const int P = mpi.size;
  if (mpi.rank == 0) {
    std::printf("moekit bench --expert-parallel (commit %s)\n\n", MOEKIT_GIT_COMMIT);
    std::printf("- machine: %s; %d ranks x %d threads (mpirun); one MPI_COMM_WORLD\n", cpu_model().c_str(), P, threads);
    std::printf("- each rank routes its own T tokens (data parallel) and owns a contiguous block of experts;\n"
                "  phase times are the slowest rank's, medians of %d forwards after one warm-up\n\n", reps);
    std::printf("| exchange (same run) | bytes per rank pair | time | per-rank bandwidth |\n|---|---|---|---|\n");
  }
  for (const std::size_t b : {std::size_t{8}, std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20,
                              std::size_t{8} << 20}) {
    const double t = time_alltoall(b, 5);
    if (mpi.rank == 0)
      std::printf("| MPI_Alltoall | %s | %.1f us | %.2f GB/s |\n", format_bytes(b).c_str(), t * 1e6,
                  static_cast<double>(b) * (P - 1) / t * 1e-9);
  }
  if (P >= 2)
    for (const std::size_t b : {std::size_t{8}, std::size_t{1} << 20}) {
      const double t = time_pingpong(b, 20);
      if (mpi.rank == 0)
        std::printf("| ping-pong rank 0 <-> 1 (half round trip) | %s | %.1f us | %.2f GB/s |\n", format_bytes(b).c_str(),
                    t * 1e6, static_cast<double>(b) / t * 1e-9);
    }
  if (mpi.rank == 0)
    std::printf("\n| shape | dtype | T per rank | total ms | route | exchange out | experts | exchange back | "
                "combine + shared | exchange / compute | rows sent per rank | MB sent per rank | resident MiB per rank |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BenchShape* s : shapes)
    for (const WeightFormat& d : dtypes) {
      const dist::ExpertPlacement placement = dist::ExpertPlacement::contiguous(s->E, P);
      std::shared_ptr<MoeLayer> layer;
      try {
        layer = build_rank_layer(*s, d, seed, placement, mpi.rank);
      } catch (...) {
        err = std::current_exception();
      }
      dist::agree(MPI_COMM_WORLD, err);
      const std::int64_t rss = resident_kib();
      std::int64_t rss_max = 0;
      MPI_Reduce(&rss, &rss_max, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
      const dist::ExpertParallelLayer ep(layer, placement, MPI_COMM_WORLD);
      for (const std::int64_t T : tokens) {
        Tensor x = Tensor::uninitialized({T, s->D}, DType::f32);
        std::vector<double> phase[6];
        std::int64_t rows = 0, bytes = 0;
        for (int r = 0; r < reps + 1; ++r) {
          fill_random(x, 1.0f, seed * 1000 + 500 + static_cast<std::uint64_t>(mpi.rank) * 131 + r);  // fresh routing
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          (void)ep.forward(x);
          const double total = MPI_Wtime() - t0;
          const dist::PhaseTimes& pt = ep.last_times();
          double v[6] = {total, pt.route, pt.exchange_out, pt.compute, pt.exchange_back, pt.combine};
          MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          if (r == 0) continue;
          for (int i = 0; i < 6; ++i) phase[i].push_back(v[i]);
          rows = pt.rows_sent;
          bytes = pt.bytes_sent;
        }
        std::int64_t mx[2] = {rows, bytes};
        MPI_Allreduce(MPI_IN_PLACE, mx, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        if (mpi.rank == 0) {
          double med[6];
          for (int i = 0; i < 6; ++i) med[i] = median_of(phase[i]) * 1e3;
          std::printf("| %s | %s | %lld | %s | %s | %s | %s | %s | %s | %.2f | %lld | %.1f | %lld |\n", s->name,
                      d.name().c_str(), static_cast<long long>(T), sig3(med[0]).c_str(), sig3(med[1]).c_str(),
                      sig3(med[2]).c_str(), sig3(med[3]).c_str(), sig3(med[4]).c_str(), sig3(med[5]).c_str(),
                      (med[2] + med[4]) / std::max(1e-9, med[3]), static_cast<long long>(mx[0]),
                      static_cast<double>(mx[1]) * 1e-6, static_cast<long long>(rss_max / 1024));
        }
      }
    }
  if (mpi.rank == 0)
    std::printf("\nexchange / compute = (exchange out + back) / experts. Resident: the largest VmRSS over the "
                "ranks after building (router, shared experts and 1/N of the routed experts).\n");
}
#endif

void run_bench(const Options& o) {
  if (o.expert_parallel && !o.simulate_threads.empty())
    throw std::invalid_argument(
        "--simulate-threads models one process's task schedule; it does not go with "
        "--expert-parallel");
  if (o.expert_parallel) {
#ifdef MOEKIT_HAVE_DIST
    return run_mpi_job("[moekit bench] ", [&](const MpiSession& mpi) { run_bench_expert_parallel(mpi, o); });
#else
    throw std::invalid_argument("--expert-parallel: this moekit was built without MPI (-DMOEKIT_WITH_MPI=OFF)");
#endif
  }
  // Everything is checked before anything is measured.
  const std::vector<const BenchShape*> shapes = parse_shapes(o.shape);
  const std::vector<WeightFormat> dtypes = parse_dtypes(o.dtype);
  const std::vector<std::string> layouts = parse_layouts(o.layout);
  const std::vector<std::int64_t> tokens = parse_int_list(o.tokens, "--tokens", 1, 1 << 20);
  const std::vector<std::int64_t> threads = parse_int_list(o.threads, "--threads", 1, 4096);
  const int reps = static_cast<int>(parse_int(o.reps, "--reps", 1, 1000));
  const auto seed = static_cast<std::uint64_t>(parse_int(o.seed, "--seed", 0, INT64_MAX));
  const std::int64_t dram_mib = parse_int(o.dram_mib, "--dram-mib", 1, 1 << 20);
  if (o.mode != "forward" && o.mode != "train")
    throw std::invalid_argument("--mode '" + o.mode + "' is not a mode (expected forward or train)");
  const bool train = o.mode == "train";
  const std::vector<std::int64_t> simulate =
      o.simulate_threads.empty()
          ? std::vector<std::int64_t>{}
          : parse_int_list(o.simulate_threads, "--simulate-threads", 1, 1 << 16);
  if (!simulate.empty() && train)
    throw std::invalid_argument(
        "--simulate-threads models the forward's tasks; it does not go with --mode train");
  if (train)
    for (const WeightFormat& d : dtypes)
      if (d.quantized())
        throw std::invalid_argument("--mode train needs float weights; " + d.name() + " has no gradient");
  for (const WeightFormat& d : dtypes) {
    if (d.bf16_act && train) throw std::invalid_argument("--mode train trains f32 parameters; bf16-act is forward only");
    if (d.bf16_act && kernels::bf16_path() != kernels::Bf16Path::amx &&
        std::find(layouts.begin(), layouts.end(), "rows") == layouts.end())
      throw std::invalid_argument(std::string("--dtype bf16-act needs --layout rows on this CPU: the bf16 compute mode "
                                              "packs (AMX tiles) on the amx path only, and it runs ") +
                                  kernels::bf16_path_name(kernels::bf16_path()) +
                                  " here; with other layouts listed too it runs in rows only");
  }
  if (o.output != "md" && o.output != "csv" && o.output != "json")
    throw std::invalid_argument("-o '" + o.output +
                                "' is not an output format (expected md, csv or json)");
  const double avail = available_memory();
  for (const BenchShape* s : shapes)
    for (const WeightFormat& d : dtypes)
      if (avail >= 0 && layer_weight_bytes(*s, d) * (train ? 3 : 1) + 256e6 > avail)
        throw std::runtime_error("out of memory: " + std::string(s->name) + " " + d.name() +
                                 " needs " + gb(layer_weight_bytes(*s, d)) +
                                 " of weights but only " + gb(avail) + " is available");

  const bool progress = isatty(STDERR_FILENO) != 0;
  Header h;
  h.cpu = cpu_model();
  h.hardware_threads = std::thread::hardware_concurrency();
  h.simd = std::string(kernels::simd_target_name()) + "; bf16 products: " +
           kernels::bf16_path_name(kernels::bf16_path());
  h.threads = threads;
  h.reps = reps;
  h.seed = seed;

  Limits limits;
  limits.dram_threads = static_cast<int>(*std::max_element(threads.begin(), threads.end()));
  limits.dram_bytes = static_cast<std::size_t>(dram_mib) << 20;
  if (progress) std::fprintf(stderr, "moekit bench: measuring the limits...\n");
  limits.dram_gbs = measure_dram_read(limits.dram_threads, limits.dram_bytes);
  for (const std::int64_t t : threads)
    limits.gemm_peak.emplace_back(static_cast<int>(t), measure_gemm_peak(static_cast<int>(t)));
  if (std::any_of(dtypes.begin(), dtypes.end(), [](const WeightFormat& d) { return d.bf16_act; }))
    for (const std::int64_t t : threads)
      limits.bf16_peak.emplace_back(static_cast<int>(t), measure_bf16_peak(static_cast<int>(t)));

  std::vector<Row> rows;
  for (const BenchShape* s : shapes)
    for (const WeightFormat& d : dtypes)
      for (const std::string& lay : layouts) {
        // Quantized experts have one layout (MLX's, read in place): run them once.
        if (d.quantized() && lay != layouts.front()) continue;
        // The bf16 compute mode packs AMX tiles on the amx path ("panels" then means them) and
        // reads rows on its other paths.
        if (d.bf16_act && lay != "rows" && kernels::bf16_path() != kernels::Bf16Path::amx) continue;
        for (Row& r :
             run_shape(*s, d, lay, tokens, threads, reps, seed, limits, progress, train, simulate))
          rows.push_back(std::move(r));
      }

  if (o.output == "md")
    print_md(h, limits, shapes, rows);
  else if (o.output == "csv")
    print_csv(h, rows);
  else
    print_json(h, limits, shapes, rows);
  std::fflush(stdout);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  opt->threads = hw > 1 ? "1," + std::to_string(hw) : "1";
  auto* cmd = app.add_subcommand(
      "bench",
      "A table of the MoE layer at reference shapes x dtypes x tokens x threads, against "
      "the machine's limits measured in the same run");
  cmd->add_option("--shape", opt->shape,
                  "qwen3, deepseek, mixtral (5.6 GB of f32 weights: only when named) or all "
                  "(= qwen3,deepseek); a comma list is accepted (default all)");
  cmd->add_option("--dtype", opt->dtype,
                  std::string("Weight formats, comma list of ") + kDtypeList + " (default f32,bf16)");
  cmd->add_option("--layout", opt->layout,
                  "Expert weight layouts, comma list of panels (repacked at load for the outer-product "
                  "kernel; for bf16-act on AMX: AMX tiles) and rows (as stored, read in place: mapped "
                  "checkpoints) (default panels)");
  cmd->add_option("--mode", opt->mode,
                  "forward (inference) or train (one training step: forward_train + backward, against 3x the "
                  "forward's FLOPs) (default forward)");
  cmd->add_option("--tokens", opt->tokens, "Token counts T, comma list (default 1,32,512)");
  cmd->add_option("--threads", opt->threads,
                  "Thread counts, comma list (default 1 and the hardware thread count)");
  cmd->add_option("--reps", opt->reps, "Timed calls per row after one warm-up (default 5)");
  cmd->add_option(
      "--simulate-threads", opt->simulate_threads,
      "Thread counts, comma list: forward rows also report how evenly the layer's task schedule "
      "would fill that many threads, replayed on a cost model calibrated by this run's limits "
      "(docs/performance.md)");
  cmd->add_option("--seed", opt->seed, "Random seed of weights and inputs (default 0)");
  cmd->add_option("-o,--output", opt->output, "Output format: md, csv or json (default md)");
  cmd->add_flag("--expert-parallel", opt->expert_parallel,
                "Under mpirun: the layer expert-parallel over the ranks (docs/distributed.md): the exchange's "
                "latency and bandwidth, then per shape, dtype and T per rank the time of each phase (route, "
                "exchange out, experts, exchange back, combine), rows and bytes sent per rank, resident memory");
  // For smoke tests: a smaller DRAM buffer (the limit is then not a DRAM figure).
  cmd->add_option("--dram-mib", opt->dram_mib, "DRAM read buffer in MiB (default 1024)")->group("");
  cmd->callback([opt] {
    try {
      run_bench(*opt);
    } catch (const std::bad_alloc&) {
      throw std::runtime_error("[moekit bench] out of memory");
    } catch (const ReportedElsewhere&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("[moekit bench] ") + e.what());
    }
  });
}

}  // namespace moekit::cli
