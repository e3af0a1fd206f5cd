// gemm_nt_bf16's AMX kernel (Bf16Path::amx in gemm.hpp): `tdpbf16ps` on 16 × 16 fp32 tiles.
//
// Highway 1.0.3 has no AMX target, so the kernel is written with intrinsics in functions that
// carry their own target attribute and runs only where kernels/cpu.hpp found AMX-BF16 with the
// OS's permission. The weights run in place, as stored (rows layout, [N, K]): 16 weight rows ×
// 32 k are the instruction's first operand, loaded straight from the checkpoint with the row
// stride; the activations, packed in pairs of k by round_to_bf16, are its second; so each tile
// holds Cᵀ (16 weight rows × 16 activation rows) and is transposed on the way out. Weights
// packed at load in the amx_tiles layout (gemm.hpp) are read as whole 1 KB tiles instead: the
// same operands, so the same bits, without the 16 strided rows per load.
//
// Blocking: 2 × 2 tiles of Cᵀ (4 accumulators, 2 weight tiles, 2 activation tiles: all 8 tile
// registers) over the whole K, so an element is one chain over K's chunks of 32 in order —
// the instruction's own fixed order within a chunk (ref::tdpbf16_chunk), nothing that depends
// on M, N, the tile an element lands in or the thread count. A weight tile that runs past N or
// past K is staged through a zero-filled stack tile, so nothing beyond a row is ever read and
// the zero padding the contract names is exact.
#include <algorithm>
#include <cstring>

#include "kernels/amx.hpp"
#include "kernels/gemm.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOEKIT_HAVE_AMX_KERNEL 1
#include <immintrin.h>
#endif

namespace moekit::kernels {

#ifdef MOEKIT_HAVE_AMX_KERNEL

#define MOEKIT_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

namespace {

constexpr int kTileK = 32;                   // bf16 elements per tile row (64 bytes)
constexpr int kTileElems = 16 * kTileK;      // one bf16 tile
constexpr std::int64_t kPanelStep = kTileElems;  // elements of one k-chunk of an activation panel
constexpr std::int64_t kPrefetchSteps = 4;       // packed weights: tiles prefetched this many chunks ahead
constexpr std::int64_t kGroupBytes = 1 << 20;    // activation panels per pass over N (half an L2)

// One weight tile's source: `rows` (1..16) rows of K from `base`, `ld` elements apart.
struct WeightTile {
  const std::uint16_t* base = nullptr;
  std::int64_t ld = 0;
  std::int64_t rows = 0;
};

// Rows × k in [k0, k0 + 32) ∩ [0, K) of `w` into a zero-filled 16 × 32 tile.
void stage(const WeightTile& w, std::int64_t k0, std::int64_t K, std::uint16_t* tile) {
  std::memset(tile, 0, kTileElems * sizeof(std::uint16_t));
  const std::int64_t n = std::min<std::int64_t>(kTileK, K - k0);
  for (std::int64_t r = 0; r < w.rows; ++r)
    std::memcpy(tile + r * kTileK, w.base + r * w.ld + k0, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
}

// Loads k-chunk k0 of weight tile `w` into tile register T: from the packed tiles (whole, zero
// padded: one contiguous 1 KB block), else straight from the rows when the tile is whole, else
// staged. (A macro: GCC's tile intrinsics paste the register number into the assembly text, so
// it must be a literal.)
#define MOEKIT_LOAD_WEIGHTS(T, w, k0, K, staging)                                          \
  do {                                                                                    \
    if constexpr (Packed) {                                                               \
      _tile_loadd(T, (w).base + (k0) * 16, kTileK * static_cast<std::int64_t>(sizeof(std::uint16_t))); \
    } else if ((w).rows == 16 && (k0) + kTileK <= (K)) {                                 \
      _tile_loadd(T, (w).base + (k0), (w).ld * static_cast<std::int64_t>(sizeof(std::uint16_t))); \
    } else {                                                                              \
      stage((w), (k0), (K), (staging));                                                   \
      _tile_loadd(T, (staging), kTileK * static_cast<std::int64_t>(sizeof(std::uint16_t))); \
    }                                                                                     \
  } while (0)

// Writes a stored Cᵀ tile (16 weight rows × 16 activation rows, fp32) into C[m0.., n0..].
void write_out(const float* tile, const Output& C, std::int64_t m0, std::int64_t rows_m, std::int64_t n0,
               std::int64_t rows_n) {
  for (std::int64_t i = 0; i < rows_m; ++i) {
    float* c = C.data + (m0 + i) * C.ld + n0;
    const float scale = C.row_scale ? C.row_scale[m0 + i] : 1.0f;
    for (std::int64_t j = 0; j < rows_n; ++j) {
      float v = tile[j * 16 + i];
      if (C.row_scale) v *= scale;
      c[j] = C.accumulate ? c[j] + v : v;
    }
  }
}

// NT weight tiles × MT activation panels over the whole K. Tile registers: C(t, u) = 2t + u,
// weights 4 + t, activations 6 + u. Packed: the weights are in amx_tiles layout, w[t].base at
// the block's first tile.
template <int NT, int MT, bool Packed>
MOEKIT_AMX void block(const WeightTile* w, const std::uint16_t* const* x, std::int64_t K, const Output& C,
                      std::int64_t m0, std::int64_t M, std::int64_t n0) {
  alignas(64) std::uint16_t staging[2][kTileElems];
  _tile_zero(0);
  if constexpr (MT == 2) _tile_zero(1);
  if constexpr (NT == 2) _tile_zero(2);
  if constexpr (NT == 2 && MT == 2) _tile_zero(3);
  std::int64_t s = 0;
  for (std::int64_t k0 = 0; k0 < K; k0 += kTileK, ++s) {
    if constexpr (Packed) {
      // Each weight stream's tile kPrefetchSteps chunks ahead, into L1 (past the block's end: the
      // next block's first tiles; a prefetch never faults). Packed tiles only: there a tile is 16
      // consecutive lines; in the rows layout it is 16 strided rows, where the same prefetch
      // does not pay (docs/performance.md).
      for (int t = 0; t < NT; ++t)
        for (int l = 0; l < 16; ++l)
          __builtin_prefetch(w[t].base + (k0 + kPrefetchSteps * kTileK) * 16 + l * 32, 0, 3);
    }
    MOEKIT_LOAD_WEIGHTS(4, w[0], k0, K, staging[0]);
    if constexpr (NT == 2) MOEKIT_LOAD_WEIGHTS(5, w[1], k0, K, staging[1]);
    _tile_loadd(6, x[0] + s * kPanelStep, 64);
    if constexpr (MT == 2) _tile_loadd(7, x[1] + s * kPanelStep, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (MT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (NT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (NT == 2 && MT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[4][256];
  _tile_stored(0, out[0], 64);
  if constexpr (MT == 2) _tile_stored(1, out[1], 64);
  if constexpr (NT == 2) _tile_stored(2, out[2], 64);
  if constexpr (NT == 2 && MT == 2) _tile_stored(3, out[3], 64);
  for (int t = 0; t < NT; ++t)
    for (int u = 0; u < MT; ++u) {
      const std::int64_t mu = m0 + u * 16;
      write_out(out[2 * t + u], C, mu, std::min<std::int64_t>(16, M - mu), n0 + t * 16, w[t].rows);
    }
}

}  // namespace

MOEKIT_AMX void detail::gemm_nt_bf16_amx(const Bf16Activations& A, const WeightMatrix& B, const Output& C,
                                         std::int64_t M, std::int64_t N, std::int64_t K) {
  if (M <= 0 || N <= 0) return;
  static constexpr AmxTileConfig config = AmxTileConfig::full();
  _tile_loadconfig(&config);
  const auto* b = static_cast<const std::uint16_t*>(B.data);
  const auto* a = static_cast<const std::uint16_t*>(A.data);
  const std::int64_t panel = kAmxRows * A.ld;  // elements of one activation panel
  const std::int64_t panels = (M + kAmxRows - 1) / kAmxRows;
  const bool packed = B.layout == WeightLayout::amx_tiles;
  const std::int64_t row_step = packed ? amx_padded_k(K) : B.ld;  // elements from one row to the next block's
  // Panels in groups of at most kGroupBytes of activations (at least one pair), each group over
  // all of N: a group stays in L2 while every column block passes over it, where all the
  // activations (2 MB at 512 rows of K = 2048) would be re-read from L3 for every 32 columns.
  // Whole pairs, so the tiles' blocking is unchanged.
  const std::int64_t group = std::max<std::int64_t>(2, kGroupBytes / (panel * 2) / 2 * 2);
  for (std::int64_t g0 = 0; g0 < panels; g0 += group) {
    const std::int64_t g1 = std::min(panels, g0 + group);
    for (std::int64_t n0 = 0; n0 < N; n0 += 32) {
      WeightTile w[2];
      for (int t = 0; t < 2; ++t)
        w[t] = {b + (n0 + 16 * t) * row_step, B.ld, std::clamp<std::int64_t>(N - n0 - 16 * t, 0, 16)};
      const bool two_n = w[1].rows > 0;
      for (std::int64_t p = g0; p < g1; p += 2) {
        const std::uint16_t* x[2] = {a + p * panel, a + (p + 1) * panel};
        const bool two_m = p + 1 < g1;
        const std::int64_t m0 = p * kAmxRows;
        if (packed) {
          if (two_n && two_m) block<2, 2, true>(w, x, K, C, m0, M, n0);
          else if (two_n) block<2, 1, true>(w, x, K, C, m0, M, n0);
          else if (two_m) block<1, 2, true>(w, x, K, C, m0, M, n0);
          else block<1, 1, true>(w, x, K, C, m0, M, n0);
        } else {
          if (two_n && two_m) block<2, 2, false>(w, x, K, C, m0, M, n0);
          else if (two_n) block<2, 1, false>(w, x, K, C, m0, M, n0);
          else if (two_m) block<1, 2, false>(w, x, K, C, m0, M, n0);
          else block<1, 1, false>(w, x, K, C, m0, M, n0);
        }
      }
    }
  }
  _tile_release();
}

#undef MOEKIT_LOAD_WEIGHTS

#else

void detail::gemm_nt_bf16_amx(const Bf16Activations&, const WeightMatrix&, const Output&, std::int64_t, std::int64_t,
                              std::int64_t) {}  // bf16_path() never selects it off x86

#endif

}  // namespace moekit::kernels
