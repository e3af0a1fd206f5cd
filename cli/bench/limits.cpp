// `moekit bench`'s limits, measured in the same run with moekit's own means (no BLAS): the DRAM
// read bandwidth (a multi-threaded streaming sum) and the peaks of moekit's forward GEMM kernels
// on cached data.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <thread>

#include "bench/bench.hpp"
#include "kernels/gemm.hpp"

namespace moekit::cli::bench {

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
  synth::fill_uniform(a, 1.0f, 7);
  synth::fill_uniform(b, 0.02f, 8);
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
  synth::fill_uniform(a, 1.0f, 7);
  synth::fill_uniform(b, 0.02f, 8);
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


}  // namespace moekit::cli::bench
