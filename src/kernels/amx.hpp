// What the two AMX kernels share (gemm_amx.cpp: bf16; gemm_amx_int8.cpp: int8): the tile
// configuration and the split of a product over the pool. Internal.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/gemm.hpp"
#include "util/thread_pool.hpp"

namespace moekit::kernels {

/// The LDTILECFG operand (palette 1) with all eight tiles 16 rows of 64 bytes: both kernels use
/// 2 × 2 blocks of such tiles (4 accumulators, 2 weight tiles, 2 activation tiles). Kept as a
/// `static constexpr` object: GCC's _tile_loadconfig names only the operand's first 8 bytes, so
/// the stores that build a local configuration may be dropped.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};

  static constexpr AmxTileConfig full() {
    AmxTileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = 16;
      c.colsb[t] = 64;
    }
    return c;
  }
};

/// Runs run(p0, p1, q0, q1) over `panels` 16-row activation panels × `pairs` 32-column weight
/// tile pairs: on the calling thread, or split over the pool in whole pairs of panels (the
/// kernels' 2 × 2 block) or in column pairs, whichever has more. Every element is computed by one
/// call in the same order whatever the split.
template <class Run>
void split_amx(std::int64_t panels, std::int64_t pairs, Threads threads, const Run& run) {
  if (panels <= 0 || pairs <= 0) return;
  if (threads == Threads::caller) return run(0, panels, 0, pairs);
  const std::int64_t blocks = (panels + 1) / 2;
  if (blocks >= pairs) {
    moekit::detail::parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
      run(2 * b0, std::min(panels, 2 * b1), 0, pairs);
    });
  } else {
    moekit::detail::parallel_for(pairs, 1, [&](std::int64_t c0, std::int64_t c1) { run(0, panels, c0, c1); });
  }
}

}  // namespace moekit::kernels
