// detail::list_schedule_makespan (moekit bench --simulate-threads) and the task cut it replays
// (expert_tasks): hand-worked schedules, the cut's invariants.
#include "util/schedule.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "experts/expert_rows.hpp"

namespace moekit {
namespace {

TEST(Schedule, WorkersTakeTheNextTaskWhenFree) {
  // 2 workers: 3 | 3, then 2 on each at 3, then the last 2 at 5.
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({3, 3, 2, 2, 2}, 2), 7.0);
  // A long task last waits for nobody but ends the schedule: 1 1 | 1 1 | 4 from 2.
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({1, 1, 1, 1, 4}, 2), 6.0);
  // In order, not sorted: the long task first balances better.
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({4, 1, 1, 1, 1}, 2), 4.0);
  // One worker: the sum; more workers than tasks: the longest task.
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({1, 2, 3}, 1), 6.0);
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({1, 2, 3}, 16), 3.0);
  EXPECT_DOUBLE_EQ(detail::list_schedule_makespan({}, 4), 0.0);
  EXPECT_THROW(detail::list_schedule_makespan({1}, 0), std::invalid_argument);
}

TEST(Schedule, ExpertTasksCoverEveryRowOnceInExpertOrder) {
  // Experts with 0, 1, 64, 65 and 200 rows.
  const std::vector<std::int64_t> counts = {0, 1, 64, 65, 200};
  std::vector<std::int64_t> offsets = {0};
  for (const std::int64_t c : counts) offsets.push_back(offsets.back() + c);
  const std::vector<ExpertTask> tasks = expert_tasks(offsets);
  ASSERT_EQ(tasks.size(), 1u + 1u + 2u + 4u);
  std::int64_t next = 0, prev_expert = -1;
  for (const ExpertTask& t : tasks) {
    EXPECT_EQ(t.begin, next);
    EXPECT_GE(t.count, 1);
    EXPECT_LE(t.count, kTaskRows);
    EXPECT_GE(t.expert, prev_expert);
    EXPECT_GE(t.begin, offsets[static_cast<std::size_t>(t.expert)]);
    EXPECT_LE(t.begin + t.count, offsets[static_cast<std::size_t>(t.expert) + 1]);
    next += t.count;
    prev_expert = t.expert;
  }
  EXPECT_EQ(next, offsets.back());
  EXPECT_TRUE(expert_tasks({0}).empty());
}

}  // namespace
}  // namespace moekit
