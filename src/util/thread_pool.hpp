// A small fork-join pool behind moekit::set_num_threads. Internal.
//
// parallel_for(n, fn) calls fn(begin, end) on disjoint chunks covering [0, n). Chunks are
// static and depend only on n and the grain, never on timing, so per-element results are
// bit-identical for any thread count as long as fn computes each element independently.
// When the pool is busy (a concurrent caller, or a nested call from inside a worker) the loop
// runs inline on the calling thread: correct and deterministic, just not parallel.
// The first exception thrown by any chunk is rethrown on the caller after all chunks finish.
#pragma once

#include <cstdint>
#include <functional>

namespace moekit::detail {

using RangeFn = std::function<void(std::int64_t begin, std::int64_t end)>;

/// Runs fn over [0, n) in chunks of at least `grain` elements.
void parallel_for(std::int64_t n, std::int64_t grain, const RangeFn& fn);

/// Runs fn(task) for task in [0, n_tasks), one task at a time per worker (dynamic order,
/// so each task must write disjoint outputs).
void parallel_tasks(std::int64_t n_tasks, const std::function<void(std::int64_t task)>& fn);

}  // namespace moekit::detail
