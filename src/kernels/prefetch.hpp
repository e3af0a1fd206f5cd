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
  /// Lines owed, 32.32 fixed point: each step() adds `pace` and fetches the whole lines owed, so
  /// the fetches spread evenly over the steps (a rounded-up count per step would finish early
  /// and leave the rest of the block's steps without any). 0: nothing to fetch.
  std::uint64_t owed = 0, pace = 0;

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
    const auto lines = static_cast<std::uint64_t>(rows * ((row_bytes + 63) / 64));
    const auto n = static_cast<std::uint64_t>(steps);
    // Rounded up, so the last line is owed by the last step; lines < 2^31 for any block here.
    p.pace = std::min<std::uint64_t>(std::uint64_t{8} << 32, ((lines << 32) + n - 1) / n);
    return p;
  }

  // Always inlined: it runs inside the kernels' k loops, where a call would spill every
  // accumulator register around it (the SIMD registers are caller-saved).
  [[gnu::always_inline]] inline void step() {
    owed += pace;
    for (; owed >= (std::uint64_t{1} << 32) && rows > 0; owed -= std::uint64_t{1} << 32) {
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
