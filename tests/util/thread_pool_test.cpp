// The thread pool under resizes between jobs: every task of every job runs exactly once and
// nothing hangs. A worker created by set_num_threads once started from generation 0 and could
// replay the last job's generation, decrementing the pending count twice; the next job's caller
// then waited for pending == 0 with pending at −1, forever (seen as a rare ctest timeout).
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "moekit/threading.hpp"
#include "util/thread_pool.hpp"

namespace moekit {
namespace {

TEST(ThreadPool, ResizingBetweenJobsRunsEveryTaskOnceAndNeverHangs) {
  const int before = num_threads();
  for (int round = 0; round < 1000; ++round) {
    set_num_threads(2 + round % 3);
    for (int job = 0; job < 3; ++job) {
      std::vector<std::atomic<int>> hits(17);
      // Counted at the end of the task: a caller returning while a worker still runs one sees 0.
      detail::parallel_tasks(17, [&](std::int64_t t) {
        volatile int spin = 0;
        for (int i = 0; i < 200; ++i) spin = spin + i;
        hits[static_cast<std::size_t>(t)].fetch_add(1);
      });
      for (const auto& h : hits) ASSERT_EQ(h.load(), 1) << "round " << round;
    }
  }
  set_num_threads(before);
}

}  // namespace
}  // namespace moekit
