// Benchmarks of the MoE layer at the reference shapes of docs/performance.md, with the machine's limits measured
// in the same run (OpenBLAS sgemm peak, DRAM read bandwidth). Never asserts; never a test.
//
//   cmake --preset default -DMOEKIT_BUILD_BENCH=ON && cmake --build --preset default
//   build/bin/moekit_bench --benchmark_min_time=1 [--benchmark_filter=...]
//
// Routing is random and fresh per call: each iteration uses the next of 16 pre-drawn inputs
// (a fixed routing would keep a few experts' weights in cache and flatter the result).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ggml_blocks.hpp"
#include "kernels/activation.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "moekit/moekit.hpp"
#include "synth/random_layer.hpp"
#include "util/thread_pool.hpp"

namespace {

using namespace moekit;

using synth::ReferenceShape;
const ReferenceShape& kQwen3 = *synth::find_reference_shape("qwen3");
const ReferenceShape& kDeepSeek = *synth::find_reference_shape("deepseek");
// Llama-4-like decode: one expert per token plus a shared expert (scaled: D 5120 -> 2048).
const ReferenceShape kLlama4Like{
    "llama4_like", "Llama-4-like (scaled)", 2048, 8192, 8, 1, 1,
    R"({"model_type":"llama4_text","hidden_size":2048,"num_hidden_layers":1,"num_local_experts":8,
        "num_experts_per_tok":1,"intermediate_size":8192,"interleave_moe_layer_step":1})"};

Tensor randn(Shape s, std::mt19937& rng, float scale) {
  Tensor t(std::move(s), DType::f32);
  std::normal_distribution<float> d(0.0f, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return t;
}

std::shared_ptr<MoeLayer> make_layer(const ReferenceShape& s, DType dtype) {
  synth::WeightSpec spec;
  spec.dtype = dtype;
  MoeConfig cfg = synth::config_of(s);
  MoeWeights w = synth::random_weights(cfg, spec, 1);
  return std::make_shared<MoeLayer>(std::move(cfg), std::move(w));
}

void BM_MoeForward(benchmark::State& state, const ReferenceShape& s, DType dtype) {
  const std::int64_t T = state.range(0);
  set_num_threads(static_cast<int>(state.range(1)));
  static std::map<std::pair<std::string, int>, std::shared_ptr<MoeLayer>> cache;
  auto& layer = cache[{s.name, static_cast<int>(dtype)}];
  if (!layer) layer = make_layer(s, dtype);
  std::mt19937 rng(2);
  std::vector<Tensor> inputs;
  for (int i = 0; i < 16; ++i) inputs.push_back(randn({T, s.D}, rng, 1.0f));
  std::size_t i = 0;
  double touched_bytes = 0;
  const double bytes_per_expert = 3.0 * s.D * s.F * dtype_size(dtype);
  for (auto _ : state) {
    ForwardInfo info;
    Tensor y = layer->forward(inputs[i++ % inputs.size()], &info);
    benchmark::DoNotOptimize(y.data());
    std::int64_t active = 0;
    for (auto c : expert_counts(info.routing.ids, s.E)) active += c > 0;
    touched_bytes += bytes_per_expert * active + (s.shared ? bytes_per_expert * s.shared : 0);
  }
  const double flops = 2.0 * 3.0 * T * (s.K + s.shared) * s.D * s.F;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(touched_bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(T * state.iterations()), benchmark::Counter::kIsRate);
}

// The expert GEMM alone, one thread: M gathered rows x [N, K] weights.
void BM_GemmNt(benchmark::State& state, DType dtype) {
  const std::int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  std::mt19937 rng(4);
  Tensor a = randn({M, K}, rng, 1.0f), b = to_dtype(randn({N, K}, rng, 1.0f), dtype), c({M, N}, DType::f32);
  for (auto _ : state) {
    kernels::gemm_nt({a.data_as<float>(), K}, {b.data(), dtype, K}, {c.data_as<float>(), N}, M, N, K,
                     kernels::Threads::caller);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// The bf16 compute mode's GEMM alone, one thread, rounding included: f32 rows rounded to bf16
// once, times bf16 [N, K] weights, on path kBf16Paths[range 3] (0 f32_fma, 1 avx512bf16, 2 amx;
// skipped where the CPU lacks it).
void BM_GemmNtBf16(benchmark::State& state) {
  const std::int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const auto path = kernels::kBf16Paths[state.range(3)];
  // range(4): 1 = the weights packed in AMX tiles (amx path only); range(5): 1 = cold weights
  // (64 copies cycled, far beyond the L3: each call streams its weights from DRAM, as a layer).
  const bool tiles = state.range(4) == 1, cold = state.range(5) == 1;
  if (!kernels::bf16_path_supported(path) || (tiles && path != kernels::Bf16Path::amx)) {
    state.SkipWithError((std::string("this CPU has no ") + kernels::bf16_path_name(path) +
                         (tiles ? " (AMX tiles need the amx path)" : ""))
                            .c_str());
    return;
  }
  std::mt19937 rng(4);
  const int copies = cold ? 64 : 1;
  Tensor a = randn({M, K}, rng, 1.0f), b = to_dtype(randn({N, K}, rng, 1.0f), DType::bf16);
  const std::int64_t per = tiles ? kernels::amx_tile_elements(N, K) : N * K;
  std::vector<std::uint16_t> w(static_cast<std::size_t>(per * copies));
  for (int i = 0; i < copies; ++i) {
    if (tiles) {
      kernels::pack_amx_tiles({b.data(), DType::bf16, K}, N, K, w.data() + i * per);
    } else {
      std::memcpy(w.data() + i * per, b.data(), static_cast<std::size_t>(per) * 2);
    }
  }
  const kernels::WeightLayout layout = tiles ? kernels::WeightLayout::amx_tiles : kernels::WeightLayout::rows;
  Tensor c({M, N}, DType::f32);
  std::vector<float> buf((kernels::bf16_activation_bytes(M, K, path) + 3) / 4);
  int next = 0;
  for (auto _ : state) {
    const auto A = kernels::round_to_bf16({a.data_as<float>(), K}, M, K, path, buf.data());
    kernels::gemm_nt_bf16(A, {w.data() + (next++ % copies) * per, DType::bf16, K, layout}, {c.data_as<float>(), N}, M,
                          N, K, kernels::Threads::caller);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Issue rate of the two instructions the bf16 compute mode can be built on, one thread, 12
// independent accumulators (no latency bound): vdpbf16ps (32 bf16 products per zmm) against
// vfmadd231ps (16 f32 products). The ratio decides bf16_path() (docs/performance.md).
#if defined(__x86_64__) && defined(__GNUC__)
#define MOEKIT_X12(op) op "0\n" op "1\n" op "2\n" op "3\n" op "4\n" op "5\n" op "6\n" op "7\n" op "8\n" op "9\n" op "10\n" op "11\n"
void BM_InstructionRate(benchmark::State& state) {
  const bool dp = state.range(0) == 1;
  if (dp && !kernels::bf16_path_supported(kernels::Bf16Path::avx512bf16)) {
    state.SkipWithError("this CPU has no AVX512-BF16");
    return;
  }
  if (!__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("this CPU has no AVX-512");
    return;
  }
  constexpr long kLoops = 1000000;
  for (auto _ : state) {
    for (long i = 0; i < kLoops; ++i) {
      if (dp) {
        __asm__ volatile(MOEKIT_X12("vdpbf16ps %%zmm30, %%zmm31, %%zmm") ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
                         "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
      } else {
        __asm__ volatile(MOEKIT_X12("vfmadd231ps %%zmm30, %%zmm31, %%zmm") ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
                         "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
      }
    }
  }
  const double instr = 12.0 * kLoops * static_cast<double>(state.iterations());
  state.counters["Ginstr/s"] = benchmark::Counter(instr / 1e9, benchmark::Counter::kIsRate);
  state.counters["products_G/s"] = benchmark::Counter(instr * (dp ? 32 : 16) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_InstructionRate)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

// The same GEMM with B cycling through 64 different weight matrices (400 MB at f32 768x2048):
// B comes from DRAM every call, as in a real MoE layer.
void BM_GemmNtColdB(benchmark::State& state) {
  const std::int64_t M = state.range(0), N = 768, K = 2048, copies = 64;
  std::mt19937 rng(5);
  Tensor a = randn({M, K}, rng, 1.0f), b = randn({copies, N, K}, rng, 0.1f), c({M, N}, DType::f32);
  std::int64_t i = 0;
  for (auto _ : state) {
    kernels::gemm_nt({a.data_as<float>(), K}, {b.data_as<float>() + (i++ % copies) * N * K, DType::f32, K},
                     {c.data_as<float>(), N}, M, N, K, kernels::Threads::caller);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Every layout of the kernel layer at one expert's shapes, one thread, f32: R routed rows,
// weights [F, D] (gate/up) and [D, F] (down). `cold` cycles through 64 experts' matrices so the
// weights (forward, dx) or the weight gradient written (dW) come from / go to DRAM, as in a
// layer; otherwise they stay in cache.
//   fwd_up  nt: [R, D] · W[F, D]ᵀ      fwd_down nt: [R, F] · W[D, F]ᵀ
//   dx_up   nn: dh[R, F] · W[F, D]     dx_down  nn: dy[R, D] · W[D, F]
//   dw_up   tn: dh[R, F]ᵀ · x[R, D]    dw_down  tn: dy[R, D]ᵀ · h[R, F]
//   fwdp_* / dxp_*: the same on the weights packed in panels (MoeLayer::pack_weights)
enum class Op { fwd_up, fwd_down, fwdp_up, fwdp_down, dx_up, dx_down, dxp_up, dxp_down, dw_up, dw_down };
void BM_GemmLayout(benchmark::State& state, Op op, bool cold) {
  const std::int64_t R = state.range(0), F = state.range(1), D = state.range(2);
  const std::int64_t copies = cold ? 64 : 1;
  std::mt19937 rng(6);
  const bool up = op == Op::fwd_up || op == Op::fwdp_up || op == Op::dx_up || op == Op::dxp_up || op == Op::dw_up;
  const std::int64_t out = up ? F : D, in = up ? D : F;  // W [out, in]
  Tensor w = randn({copies, out, in}, rng, 0.02f);
  Tensor x = randn({R, in}, rng, 1.0f), dh = randn({R, out}, rng, 1.0f);
  // The same weights packed in panels (MoeLayer::pack_weights), for the fwdp / dxp cases.
  const std::int64_t per = kernels::panel_elements(out, in);
  Tensor wp = Tensor::uninitialized({copies, per}, DType::f32);
  for (std::int64_t e = 0; e < copies; ++e)
    kernels::pack_panels({w.data_as<float>() + e * out * in, DType::f32, in}, out, in, wp.data_as<float>() + e * per);
  const bool dw = op == Op::dw_up || op == Op::dw_down;
  Tensor c = dw ? Tensor({copies, out, in}, DType::f32) : Tensor({R, std::max(out, in)}, DType::f32);
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::int64_t e = i++ % copies;
    const float* we = w.data_as<float>() + e * out * in;
    const kernels::WeightMatrix wpe{wp.data_as<float>() + e * per, DType::f32, in, kernels::WeightLayout::panels};
    switch (op) {
      case Op::fwd_up:
      case Op::fwd_down:
        kernels::gemm_nt({x.data_as<float>(), in}, {we, DType::f32, in}, {c.data_as<float>(), out}, R, out, in,
                         kernels::Threads::caller);
        break;
      case Op::fwdp_up:
      case Op::fwdp_down:
        kernels::gemm_nt({x.data_as<float>(), in}, wpe, {c.data_as<float>(), out}, R, out, in, kernels::Threads::caller);
        break;
      case Op::dxp_up:
      case Op::dxp_down:
        kernels::gemm_nn({dh.data_as<float>(), out}, wpe, {c.data_as<float>(), in}, R, in, out, kernels::Threads::caller);
        break;
      case Op::dx_up:
      case Op::dx_down:
        kernels::gemm_nn({dh.data_as<float>(), out}, {we, DType::f32, in}, {c.data_as<float>(), in}, R, in, out,
                         kernels::Threads::caller);
        break;
      case Op::dw_up:
      case Op::dw_down:
        kernels::gemm_tn({dh.data_as<float>(), out}, {x.data_as<float>(), in},
                         {c.data_as<float>() + e * out * in, in}, out, in, R, kernels::Threads::caller);
        break;
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * R * F * D * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// gemm_nt on MLX affine weights [768, 2048] (group 64, bf16 scales), one thread, weights cached
// (L2/L3): the kernel's own rate, against the f32 rows kernel on the same shape (bits = 0).
// Rows R = 1, 2 take the in-register path; more rows the dequantized scratch block.
void BM_GemmAffine(benchmark::State& state) {
  const std::int64_t R = state.range(0), bits = state.range(1), N = 768, K = 2048, G = 64;
  std::mt19937 rng(7);
  Tensor x = randn({R, K}, rng, 1.0f), c({R, N}, DType::f32);
  Tensor w = randn({N, K}, rng, 0.02f);
  Tensor codes({N, std::max<std::int64_t>(1, K * bits / 32)}, DType::u32);
  for (std::int64_t i = 0; i < codes.numel(); ++i) codes.data_as<std::uint32_t>()[i] = static_cast<std::uint32_t>(rng());
  Tensor scales = to_dtype(randn({N, K / G}, rng, 0.01f), DType::bf16), biases = to_dtype(randn({N, K / G}, rng, 0.01f), DType::bf16);
  kernels::WeightMatrix B{w.data(), DType::f32, K};
  if (bits > 0)
    B = {codes.data(),
         DType::u32,
         K * bits / 32,
         kernels::WeightLayout::rows,
         WeightFormat::mlx_affine(static_cast<int>(bits), static_cast<int>(G), DType::bf16),
         scales.data(),
         biases.data(),
         K / G};
  // The int8 mode (4 and 8 bits, R <= 8) or the exact one.
  const ComputeMode mode = state.range(2) != 0 ? ComputeMode::int8 : ComputeMode::exact;
  for (auto _ : state) {
    kernels::gemm_nt({x.data_as<float>(), K}, B, {c.data_as<float>(), N}, R, N, K, kernels::Threads::caller, mode);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["Gweights/s"] = benchmark::Counter(1.0 * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * R * N * K * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// The int8 fast mode on ggml's block types, one thread: the row kernel with 1 or 2 rows of A (GGUF
// decode: an expert with 1 or 2 rows), the panel kernel with 32 (prefill: T = 512 with 8 of 128
// experts gives an expert 32 rows on average). One 768 x 2048 matrix of random blocks (about
// 0.5-1.7 MB: L2 / L3), so the kernels' own rate per byte, which for decode at 2 threads must stay
// above the DRAM's for decode to be memory bound.
void BM_GgmlRows(benchmark::State& state) {
  static constexpr const bench::GgmlKind* kKinds[] = {&bench::kQ4K,  &bench::kQ6K,   &bench::kQ3K, &bench::kQ8_0,
                                                      &bench::kQ4_0, &bench::kMxfp4, &bench::kQ5K};
  const bench::GgmlKind& kind = *kKinds[state.range(0)];
  const Element e = kind.element;
  const std::int64_t R = state.range(1), N = 768, K = 2048;
  const WeightFormat f = WeightFormat::ggml(e);
  std::int64_t ld = 0;
  const std::vector<std::uint8_t> bytes = bench::random_ggml_rows(kind, N, K, ld);
  std::mt19937 rng(12);
  Tensor x = randn({R, K}, rng, 1.0f), c({R, N}, DType::f32);
  const kernels::WeightMatrix B{bytes.data(), DType::u8, ld, kernels::WeightLayout::rows, f};
  for (auto _ : state) {
    kernels::gemm_nt({x.data_as<float>(), K}, B, {c.data_as<float>(), N}, R, N, K, kernels::Threads::caller,
                     ComputeMode::int8);
    benchmark::DoNotOptimize(c.data());
  }
  state.SetLabel(kernels::formats::traits(e).describe(f));
  state.counters["GB/s"] = benchmark::Counter(1.0 * N * ld * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// SwiGLU over one expert's pre-activations at T = 512 (32 rows × F = 768), gate ~ N(0, σ) with σ
// = range(0): 4 as a trained model's, 100 so that a quarter of the gates pass |87| (where exp's
// result turns denormal).
void BM_Swiglu(benchmark::State& state) {
  const std::int64_t n = 32 * 768;
  std::mt19937 rng(13);
  std::normal_distribution<float> g(0.0f, static_cast<float>(state.range(0))), u(0.0f, 1.0f);
  std::vector<float> gate(static_cast<std::size_t>(n)), up(gate.size()), h(gate.size());
  for (std::size_t i = 0; i < gate.size(); ++i) {
    gate[i] = g(rng);
    up[i] = u(rng);
  }
  for (auto _ : state) {
    kernels::apply_body(BodyKind::swiglu, 0.0f, 0.0f, gate.data(), up.data(), h.data(), n);
    benchmark::DoNotOptimize(h.data());
  }
  state.counters["time per element"] = benchmark::Counter(
      1e9 / static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The machine's limits, measured in the same run.
void BM_SgemmPeak(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  openblas_set_num_threads(static_cast<int>(state.range(1)));
  std::mt19937 rng(3);
  Tensor a = randn({n, n}, rng, 1.0f), b = randn({n, n}, rng, 1.0f), c({n, n}, DType::f32);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data_as<float>(), n, b.data_as<float>(), n,
                0.0f, c.data_as<float>(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_DramRead(benchmark::State& state) {
  const std::size_t n = std::size_t{1} << 28;  // 1 GiB of floats
  set_num_threads(static_cast<int>(state.range(0)));
  std::vector<float> buf(n, 1.0f);
  for (auto _ : state) {
    // Two halves summed on the pool's threads.
    std::vector<double> part(2, 0.0);
    std::vector<std::thread> th;
    const int nt = static_cast<int>(state.range(0));
    std::vector<float> sums(static_cast<std::size_t>(nt), 0.0f);
    for (int t = 0; t < nt; ++t)
      th.emplace_back([&, t] {
        const std::size_t b = n / nt * t, e = n / nt * (t + 1);
        float acc[16] = {};
        for (std::size_t i = b; i < e; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += buf[i + j];
        float s = 0;
        for (float v : acc) s += v;
        sums[t] = s;
      });
    for (auto& x : th) x.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(double(n) * 4 * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_SgemmPeak)->Args({2048, 1})->Args({2048, 2})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmNt, f32, DType::f32)
    ->Args({1, 768, 2048})->Args({32, 768, 2048})->Args({64, 768, 2048})->Args({256, 768, 2048})
    ->Args({64, 2048, 768})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmNt, bf16, DType::bf16)->Args({64, 768, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmNtBf16)->ArgsProduct({{1, 32, 64}, {768}, {2048}, {0, 1, 2}, {0}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmNtBf16)->ArgsProduct({{1, 32, 64}, {768}, {2048}, {2}, {1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
// The shared experts' shape (DeepSeek: 512 rows, one thread's half of 2 × 1408 columns): activations past L2.
BENCHMARK(BM_GemmNtBf16)->ArgsProduct({{128, 512}, {1408}, {2048}, {2}, {1}, {0}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmNtBf16)->ArgsProduct({{48}, {1408}, {2048}, {2}, {1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmNtColdB)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();
// Qwen3 at T = 512: 32 rows per expert; DeepSeek-style: 48 rows of F = 1408; cached also 256 rows
// (a shared expert or a large batch, `moekit bench`'s GEMM-peak shape).
#define MOEKIT_LAYOUT(name, op)                                                                             \
  BENCHMARK_CAPTURE(BM_GemmLayout, name##_cached, op, false)                                                  \
      ->Args({32, 768, 2048})->Args({48, 1408, 2048})->Args({256, 768, 2048})                                  \
      ->Unit(benchmark::kMillisecond)->UseRealTime();                                                          \
  BENCHMARK_CAPTURE(BM_GemmLayout, name##_cold, op, true)                                                     \
      ->Args({32, 768, 2048})->Args({48, 1408, 2048})->Unit(benchmark::kMillisecond)->UseRealTime();
MOEKIT_LAYOUT(fwd_up, Op::fwd_up)
MOEKIT_LAYOUT(fwd_down, Op::fwd_down)
MOEKIT_LAYOUT(fwdp_up, Op::fwdp_up)
MOEKIT_LAYOUT(fwdp_down, Op::fwdp_down)
MOEKIT_LAYOUT(dx_up, Op::dx_up)
MOEKIT_LAYOUT(dxp_up, Op::dxp_up)
MOEKIT_LAYOUT(dxp_down, Op::dxp_down)
MOEKIT_LAYOUT(dx_down, Op::dx_down)
MOEKIT_LAYOUT(dw_up, Op::dw_up)
MOEKIT_LAYOUT(dw_down, Op::dw_down)
// The pool's round trip: a job of one task per thread doing nothing, after range(0) µs of the
// caller's own work (a busy wait: a framework's attention between two MoE layers) — the
// fork-join cost a decode step pays per parallel region, with the workers still spinning (gap
// under MOEKIT_SPIN_US, default 100) or parked. 2 threads.
void BM_PoolRoundTrip(benchmark::State& state) {
  set_num_threads(2);
  const auto gap = std::chrono::microseconds(state.range(0));
  std::atomic<int> sink{0};
  for (auto _ : state) {
    state.PauseTiming();
    const auto until = std::chrono::steady_clock::now() + gap;
    while (std::chrono::steady_clock::now() < until) {
    }
    state.ResumeTiming();
    detail::parallel_tasks(2, [&](std::int64_t t) { sink.fetch_add(static_cast<int>(t)); });
  }
  benchmark::DoNotOptimize(sink.load());
  set_num_threads(0);
}

BENCHMARK(BM_GemmAffine)->ArgsProduct({{1, 2, 3, 32}, {0, 4, 8, 3}, {0}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_GemmAffine)->ArgsProduct({{1, 2, 4, 8}, {4, 8}, {1}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_GgmlRows)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {1, 2, 32}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Swiglu)->Arg(4)->Arg(100)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_PoolRoundTrip)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PoolRoundTrip)->Arg(50)->Arg(1000)->Iterations(3000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DramRead)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeForward, qwen3_f32, kQwen3, DType::f32)
    ->ArgsProduct({{1, 32, 512}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeForward, qwen3_bf16, kQwen3, DType::bf16)
    ->ArgsProduct({{1, 32, 512}, {2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeForward, deepseek_f32, kDeepSeek, DType::f32)
    ->ArgsProduct({{1, 32, 512}, {2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MoeForward, llama4_like_f32, kLlama4Like, DType::f32)
    ->ArgsProduct({{1, 32}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
