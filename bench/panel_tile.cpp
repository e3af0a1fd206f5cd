// How close the int8 fast mode's panel tiles (src/kernels/ggml_panel-inl.h) run to the port limit
// of the instruction that does their work, on the CPU at hand: the question to answer before any
// more work on GGUF prefill (docs/performance.md, "How close the panel tiles run to their
// instructions' limit"). Both widths where the CPU has them: AVX512-VNNI (16 columns, 12 rows of
// A per tile, `vpdpbusd`) and AVX2 (8 columns, 4 rows, `vpmaddubsw`).
//
// One panel (K = 2048) is packed once; then, alternated round by round so that a noisy host
// disturbs each the same way, and keeping each one's fastest round:
//   tile   the kernel's tile over it (its rows of A's int8 codes, every group's float step),
//   pack   the kernel's pack of the panel, per tile's worth of groups,
//   alone  the tile's multiplies alone (VNNI: 96 `vpdpbusd` per group; AVX2: 32 `vpmaddubsw`),
//          in registers: the bound of the instruction that does the work.
// Figures are in cycles per group of 32 inputs (VNNI 12 rows × 16 columns, AVX2 4 × 8), at the
// clock a chain of dependent `imul` (3 cycles each) measures.
//
// The kernel lives in an unnamed namespace of int8_panels.cpp, so this file includes that
// translation unit whole; the library it links then contributes nothing of that file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "ggml_blocks.hpp"
#include "kernels/int8_panels.cpp"  // NOLINT(bugprone-suspicious-include)

namespace moekit::kernels::int8 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The core clock in Hz: a chain of dependent 64-bit multiplies, 3 cycles each on every x86 core
// since Sandy Bridge and Zen 1 (fastest of a few tries).
double clock_hz() {
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    std::uint64_t x = 3, n = 100000000;
    const auto t = Clock::now();
    asm volatile("1: imul %0, %0\n imul %0, %0\n imul %0, %0\n imul %0, %0\n sub $4, %1\n jnz 1b" : "+r"(x), "+r"(n));
    best = std::min(best, seconds_since(t));
  }
  return 3.0 * 100000000 / best;
}

#define MOEKIT_DP12                                                                                             \
  "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n vpdpbusd %%zmm30, %%zmm31, %%zmm1\n vpdpbusd %%zmm30, %%zmm31, %%zmm2\n" \
  "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n vpdpbusd %%zmm30, %%zmm31, %%zmm4\n vpdpbusd %%zmm30, %%zmm31, %%zmm5\n" \
  "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n vpdpbusd %%zmm30, %%zmm31, %%zmm7\n vpdpbusd %%zmm30, %%zmm31, %%zmm8\n" \
  "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n vpdpbusd %%zmm30, %%zmm31, %%zmm10\n vpdpbusd %%zmm30, %%zmm31, %%zmm11\n"

// One group's 96 `vpdpbusd` on 12 independent accumulators, nothing else.
__attribute__((target("avx512f,avx512vnni"))) void dp_only(std::int64_t groups) {
  for (std::int64_t g = 0; g < groups; ++g)
    asm volatile(MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 MOEKIT_DP12 ::
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                       "xmm11");
}
#undef MOEKIT_DP12

#define MOEKIT_MB8                                                                                                    \
  "vpmaddubsw %%ymm14, %%ymm15, %%ymm0\n vpmaddubsw %%ymm14, %%ymm15, %%ymm1\n vpmaddubsw %%ymm14, %%ymm15, %%ymm2\n" \
  "vpmaddubsw %%ymm14, %%ymm15, %%ymm3\n vpmaddubsw %%ymm14, %%ymm15, %%ymm4\n vpmaddubsw %%ymm14, %%ymm15, %%ymm5\n" \
  "vpmaddubsw %%ymm14, %%ymm15, %%ymm6\n vpmaddubsw %%ymm14, %%ymm15, %%ymm7\n"

// One AVX2 group's 32 `vpmaddubsw` (4 rows × 8 steps), nothing else.
__attribute__((target("avx2"))) void maddubs_only(std::int64_t groups) {
  for (std::int64_t g = 0; g < groups; ++g)
    asm volatile(MOEKIT_MB8 MOEKIT_MB8 MOEKIT_MB8 MOEKIT_MB8 ::
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
}
#undef MOEKIT_MB8

// The two widths of the panel kernel: their namespace's pack and tile, the tile's rows of A, and
// the multiplies alone.
struct Vnni {
  static constexpr const char* kName = "AVX512-VNNI";
  static constexpr int kRows = 12;
  template <class T>
  using Traits = vnni::Traits<T>;
  using Stage = vnni::Stage;
  using Panel = vnni::Panel;
  static constexpr int kW = vnni::kW;
  static bool runs() { return cpu_features().avx512_vnni; }
  template <class T>
  static void pack(const WeightMatrix& B, std::int64_t K, Stage& s, Panel& p) {
    vnni::pack<T>(B, 0, kW, K, s, p);
  }
  template <class T>
  static void tile(const Rows& a, const Panel& p, std::int64_t K, float* out) {
    using Tr = Traits<T>;
    vnni::tile<kRows, Tr::kG, Tr::kOff != 0, Tr::kBias, Tr::kSb, Tr::kNibbles>(a, 0, p, K, out, nullptr, nullptr);
  }
  static void alone(std::int64_t groups) { dp_only(groups); }
};
struct Avx2 {
  static constexpr const char* kName = "AVX2";
  static constexpr int kRows = 4;
  template <class T>
  using Traits = avx2::Traits<T>;
  using Stage = avx2::Stage;
  using Panel = avx2::Panel;
  static constexpr int kW = avx2::kW;
  static bool runs() { return cpu_features().avx2_fma; }
  template <class T>
  static void pack(const WeightMatrix& B, std::int64_t K, Stage& s, Panel& p) {
    avx2::pack<T>(B, 0, kW, K, s, p);
  }
  template <class T>
  static void tile(const Rows& a, const Panel& p, std::int64_t K, float* out) {
    using Tr = Traits<T>;
    constexpr bool kSigned = Tr::kOff == 128;  // run()'s choice for AVX2
    avx2::tile<kRows, Tr::kG, Tr::kOff != 0 && !kSigned, Tr::kBias, Tr::kSb, kSigned, Tr::kSum16>(a, 0, p, K, out,
                                                                                                  nullptr, nullptr);
  }
  static void alone(std::int64_t groups) { maddubs_only(groups); }
};

// The figures for one type on width W: cycles per group of the tile, of the pack and of the
// multiplies alone.
template <class W, class T>
void measure(const bench::GgmlKind& kind, double hz, int rounds) {
  using Tr = typename W::template Traits<T>;
  constexpr std::int64_t K = 2048, N = W::kW, M = W::kRows, kGroups32 = K / 32;
  const WeightFormat f = WeightFormat::ggml(kind.element);
  std::int64_t ld = 0;
  const std::vector<std::uint8_t> bytes = bench::random_ggml_rows(kind, N, K, ld);
  std::mt19937 rng(12);
  const WeightMatrix B{bytes.data(), DType::u8, ld, WeightLayout::rows, f};
  typename W::Stage stage;
  typename W::Panel panel;
  W::template pack<T>(B, K, stage, panel);

  // The tile's rows of A as the kernel holds them: int8 codes in blocks of 4 rows, per group (of the
  // type's kG) the row's scale, its sum of codes and the sums' start −off·Σa.
  const std::int64_t groups = K / Tr::kG;
  std::vector<std::int8_t> q(static_cast<std::size_t>(M * K));
  for (auto& v : q) v = static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127);
  std::vector<float> d(static_cast<std::size_t>(groups * M), 0.01f), xs(d.size(), 3.0f);
  std::vector<std::int32_t> t0(d.size(), -Tr::kOff * 40);
  const Rows a{q.data(), d.data(), xs.data(), t0.data(), M};
  alignas(64) float out[W::kRows * W::kW];

  constexpr int kReps = 200;
  auto time = [&](auto&& body) {
    const auto t = Clock::now();
    for (int i = 0; i < kReps; ++i) {
      asm volatile("" : : "r"(&panel), "r"(&a), "r"(out) : "memory");  // each call computes anew
      body();
    }
    return seconds_since(t) * hz / kReps / kGroups32;
  };
  double tile = 1e30, pack = 1e30, dp = 1e30;
  for (int r = 0; r < rounds; ++r) {
    tile = std::min(tile, time([&] { W::template tile<T>(a, panel, K, out); }));
    pack = std::min(pack, time([&] { W::template pack<T>(B, K, stage, panel); }));
    dp = std::min(dp, time([&] { W::alone(kGroups32); }));
  }
  std::printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", kind.name, tile, pack, dp, tile / dp);
}

template <class W>
void table(double hz, int rounds) {
  if (!W::runs()) {
    std::printf("\n%s: not on this CPU\n", W::kName);
    return;
  }
  std::printf("\n%s: cycles per group of 32 inputs × %d rows × %d columns\n\n", W::kName, W::kRows, W::kW);
  std::printf("| type | tile | pack (one panel) | multiplies alone | tile / alone |\n|---|---|---|---|---|\n");
  measure<W, formats::q4_k::Type>(bench::kQ4K, hz, rounds);
  measure<W, formats::q6_k::Type>(bench::kQ6K, hz, rounds);
  measure<W, formats::q8_0::Type>(bench::kQ8_0, hz, rounds);
  measure<W, formats::ggml_mxfp4::Type>(bench::kMxfp4, hz, rounds);
}

int run(int rounds) {
  const double hz = clock_hz();
  std::printf("clock %.2f GHz (dependent imul); fastest of %d alternated rounds\n", hz / 1e9, rounds);
  table<Vnni>(hz, rounds);
  table<Avx2>(hz, rounds);
  return 0;
}

}  // namespace
}  // namespace moekit::kernels::int8

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 100;
  return moekit::kernels::int8::run(rounds);
}
