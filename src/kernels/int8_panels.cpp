// The int8 fast mode's many-row kernel on ggml's block types (kernels/plan.hpp's int8_panels): A
// quantized once — inside a ReuseQuantizedRows scope, once for every call on the same rows — then
// B's rows a panel at a time (ggml_unpack-inl.h, ggml_pack-inl.h, ggml_panel-inl.h: 16 rows with
// AVX512-VNNI, 8 with AVX2), split over the pool in whole panels. gemm_nt_int8_many also sends
// MLX affine codes to AMX-INT8 (gemm_amx_int8.cpp).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/int8_common.hpp"
#include "util/thread_pool.hpp"

namespace moekit::kernels::int8 {

namespace {

#if MOEKIT_X86
// The includes come in the order of their definitions, not sorted:
// clang-format off
namespace avx2 {
#define MOEKIT_I8_VNNI 0
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/ggml_unpack-inl.h"
#include "kernels/ggml_pack-inl.h"
#include "kernels/ggml_panel-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace avx2
namespace vnni {
#define MOEKIT_I8_VNNI 1
#include "kernels/int8_width_begin.h"
#include "kernels/int8_codes-inl.h"
#include "kernels/ggml_unpack-inl.h"
#include "kernels/ggml_pack-inl.h"
#include "kernels/ggml_panel-inl.h"
#include "kernels/int8_width_end.h"
}  // namespace vnni
// clang-format on
#endif

#if MOEKIT_X86
// Which rows of A a call reads, and in which ReuseQuantizedRows scope (epoch 0: none).
struct RowsKey {
  std::uint64_t epoch = 0;
  const float* data = nullptr;
  std::int64_t ld = 0;
  const std::int32_t* index = nullptr;
  const float* scale = nullptr;
  std::int64_t M = 0, K = 0;
  bool operator==(const RowsKey&) const = default;
};

// The open ReuseQuantizedRows scopes on this thread, and the epoch of the outermost: a new one
// per scope, so rows prepared in an earlier scope are never taken again.
thread_local int reuse_depth = 0;
thread_local std::uint64_t reuse_epoch = 0;

RowsKey rows_key(const RowSource& A, std::int64_t M, std::int64_t K) {
  return {reuse_depth > 0 ? reuse_epoch : 0, A.data, A.ld, A.index, A.scale, M, K};
}

// A quantized as ggml_int8 quantizes it (QuantA) and laid out for the panel kernels (Rows):
// codes, and per group of T's kG inputs d, d·Σa (Σa where the tile applies d per block) and
// −off·Σa.
template <class T>
void prepare_rows(const RowSource& A, std::int64_t M, std::int64_t K, std::int64_t Mp, std::vector<std::int8_t>& q,
                  std::vector<float>& d, std::vector<float>& xs, std::vector<std::int32_t>& t0) {
  using Tr = avx2::Traits<T>;  // its group and offset: the same for both widths
  const std::int64_t groups = K / Tr::kG;
  QuantA& qa = thread_quant_a();
  quantize_a(A, M, K, 32, 8, true, true, qa, T::kBlock);
  if constexpr (Tr::kG == 16) sums16(qa);
  q.assign(static_cast<std::size_t>(Mp * K), 0);
  d.assign(static_cast<std::size_t>(Mp * groups), 0.0f);
  xs.assign(d.size(), 0.0f);
  t0.assign(d.size(), 0);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int8_t* row = qa.q8.data() + m * K;
    std::int8_t* block = q.data() + (m / 4) * 4 * K + (m % 4) * 4;  // Rows's layout
    for (std::int64_t j = 0; j < K / 4; ++j) std::memcpy(block + 16 * j, row + 4 * j, 4);
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::size_t at = static_cast<std::size_t>(g * Mp + m);
      const std::size_t gi = static_cast<std::size_t>(m * qa.gstride + g * Tr::kG / 32);
      const std::int32_t sum = Tr::kG == 16 ? qa.qsum16[static_cast<std::size_t>(m * (K / 16) + g)] : qa.qsum[gi];
      d[at] = qa.d[gi];
      // With a scale per block of 256 (Tr::kSb > 1) the tile applies d once per block: xs is Σq.
      xs[at] = Tr::kSb > 1 ? static_cast<float>(sum) : Tr::kG == 32 ? qa.xsum[gi] : qa.d[gi] * static_cast<float>(sum);
      t0[at] = -Tr::kOff * sum;
    }
  }
}

// The fast mode on a ggml type for many rows (ggml_panel-inl.h): A prepared once (prepare_rows;
// inside a ReuseQuantizedRows scope, once for every call on the same rows and type), then B's
// rows a panel at a time (16 rows with AVX512-VNNI, 8 with AVX2), split over the pool in whole
// panels where `threads` asks for it.
template <class T>
void ggml_panels(T, const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M, std::int64_t N,
                 std::int64_t K, Threads threads, bool vnni) {
  const std::int64_t Mp = (M + 3) / 4 * 4;
  thread_local std::vector<std::int8_t> q;
  thread_local std::vector<float> d, xs;
  thread_local std::vector<std::int32_t> t0;
  thread_local RowsKey last;  // the rows q, d, xs and t0 hold
  const RowsKey key = rows_key(A, M, K);
  if (key.epoch == 0 || !(key == last)) {
    last = {};  // until the rows are whole again
    prepare_rows<T>(A, M, K, Mp, q, d, xs, t0);
  }
  last = key;
  const Rows rows{q.data(), d.data(), xs.data(), t0.data(), Mp};
  const std::int64_t width = vnni ? vnni::kW : avx2::kW;
  const auto run = [&](std::int64_t b0, std::int64_t b1) {
    if (vnni) return vnni::run<T>(rows, M, Mp, B, C, b0 * width, std::min(N, b1 * width), K);
    avx2::run<T>(rows, M, Mp, B, C, b0 * width, std::min(N, b1 * width), K);
  };
  const std::int64_t panels = (N + width - 1) / width;
  if (threads == Threads::caller) return run(0, panels);
  moekit::detail::parallel_for(panels, 1, run);
}
#endif

}  // namespace

}  // namespace moekit::kernels::int8

namespace moekit::kernels {

void detail::gemm_nt_int8_many(const RowSource& A, const WeightMatrix& B, const Output& C, std::int64_t M,
                               std::int64_t N, std::int64_t K, Threads threads, Int8Path path) {
  using namespace int8;  // NOLINT(google-build-using-namespace): this file's own namespace
  if (M <= 0 || N <= 0) return;
#if MOEKIT_X86
  if (path == Int8Path::best) path = cpu_paths().int8;
  const bool vnni = path == Int8Path::avx512vnni;
  if (with_ggml_type(B.format.element, [&](auto type) { ggml_panels(type, A, B, C, M, N, K, threads, vnni); })) return;
#else
  (void)path;
#endif
  amx_int8_gemm(A, B, C, M, N, K, threads);
}

ReuseQuantizedRows::ReuseQuantizedRows() noexcept {
#if MOEKIT_X86
  if (int8::reuse_depth++ == 0) ++int8::reuse_epoch;
#endif
}

ReuseQuantizedRows::~ReuseQuantizedRows() {
#if MOEKIT_X86
  --int8::reuse_depth;
#endif
}

}  // namespace moekit::kernels
