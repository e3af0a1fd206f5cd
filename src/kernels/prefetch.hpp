// Software prefetch of the next block of weight rows into L2 while the current block computes.
//
// The forward kernels keep a block of B's rows (≈ 256 KB) in L2 while every row strip of A passes
// over it. Without help, the first strip of each block reads its rows from DRAM at the strip's
// compute rate, which the hardware prefetchers do not run far enough ahead to hide; the other
// strips then run from L2. A NextRows cursor walks the next block's rows a few cache lines per
// k step of the current block, spread so that it finishes about when the block does.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moekit::kernels {

struct NextRows {
  const char* row = nullptr;  ///< the row being fetched
  std::int64_t off = 0;       ///< bytes of it fetched
  std::int64_t row_bytes = 0, stride = 0, rows = 0;
  int per_step = 0;  ///< lines per step(); 0: nothing to fetch

  /// `rows` rows of `row_bytes` bytes, `stride` bytes apart from `first`, fetched over `steps`
  /// calls of step() (at most 8 lines a call).
  static NextRows over(const void* first, std::int64_t rows, std::int64_t row_bytes, std::int64_t stride,
                       std::int64_t steps) {
    NextRows p;
    if (rows <= 0 || row_bytes <= 0 || steps <= 0) return p;
    p.row = static_cast<const char*>(first);
    p.rows = rows;
    p.row_bytes = row_bytes;
    p.stride = stride;
    const std::int64_t lines = rows * ((row_bytes + 63) / 64);
    p.per_step = static_cast<int>(std::min<std::int64_t>(8, (lines + steps - 1) / steps));
    return p;
  }

  // Always inlined: it runs inside the kernels' k loops, where a call would spill every
  // accumulator register around it (the SIMD registers are caller-saved).
  [[gnu::always_inline]] inline void step() {
    for (int s = 0; s < per_step && rows > 0; ++s) {
      __builtin_prefetch(row + off, 0, 2);  // read, into L2 (prefetcht1 on x86)
      off += 64;
      if (off >= row_bytes) {
        off = 0;
        row += stride;
        --rows;
      }
    }
  }
};

}  // namespace moekit::kernels
