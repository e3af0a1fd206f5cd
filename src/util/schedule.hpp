// The pool's dynamic task schedule, simulated: for the thread counts this machine does not have
// (moekit bench --simulate-threads). Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <stdexcept>
#include <vector>

namespace moekit::detail {

/// The time at which `threads` workers finish `costs` when each worker, as soon as it is free,
/// takes the next task in order (detail::parallel_tasks: one shared counter, tasks in index
/// order). Costs are durations (any unit, >= 0); the result is in the same unit.
inline double list_schedule_makespan(const std::vector<double>& costs, int threads) {
  if (threads < 1)
    throw std::invalid_argument("[moekit::list_schedule_makespan] threads must be >= 1");
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int i = 0; i < threads; ++i) free_at.push(0.0);
  double end = 0.0;
  for (const double c : costs) {
    const double start = free_at.top();
    free_at.pop();
    free_at.push(start + c);
    end = std::max(end, start + c);
  }
  return end;
}

}  // namespace moekit::detail
