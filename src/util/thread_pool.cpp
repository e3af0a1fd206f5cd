#include "util/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "moekit/threading.hpp"
#include "util/error.hpp"

namespace moekit {
namespace detail {
namespace {

int default_threads() {
  if (const char* env = std::getenv("MOEKIT_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 4096) return static_cast<int>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Workers wait on a generation counter; each job is a task counter that workers and the caller
// drain together. Only one job runs at a time (busy_ guards it).
class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const noexcept { return size_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(busy_);
    stop();
    size_.store(n, std::memory_order_relaxed);
    quit_ = false;
    // A new worker starts at the current generation: starting from 0 it would replay the last
    // job, decrement `pending_` a second time, and let a later caller return before a worker
    // finished its task, or wait forever on a negative count.
    const std::uint64_t now = generation_;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, now] { worker_loop(now); });
  }

  // Returns false (and runs nothing) if the pool is busy.
  bool try_run(std::int64_t n_tasks, const std::function<void(std::int64_t)>& task) {
    if (in_worker_) return false;  // nested call: never try_lock a mutex this thread may hold
    std::unique_lock<std::mutex> job_lock(busy_, std::try_to_lock);
    if (!job_lock.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      n_tasks_ = n_tasks;
      next_.store(0);
      pending_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    in_worker_ = true;
    drain();
    in_worker_ = false;
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void drain() {
    for (;;) {
      const std::int64_t t = next_.fetch_add(1);
      if (t >= n_tasks_) break;
      try {
        (*task_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void worker_loop(std::uint64_t seen) {
    in_worker_ = true;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
      }
      drain();
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex busy_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  std::atomic<int> size_{1};
  bool quit_ = false;
  std::uint64_t generation_ = 0;
  const std::function<void(std::int64_t)>* task_ = nullptr;
  std::int64_t n_tasks_ = 0;
  std::atomic<std::int64_t> next_{0};
  int pending_ = 0;
  std::exception_ptr error_;
  static thread_local bool in_worker_;
};

thread_local bool Pool::in_worker_ = false;

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

}  // namespace

void parallel_tasks(std::int64_t n_tasks, const std::function<void(std::int64_t)>& fn) {
  if (n_tasks <= 0) return;
  Pool& p = pool();
  if (n_tasks == 1 || p.size() == 1 || !p.try_run(n_tasks, fn)) {
    for (std::int64_t t = 0; t < n_tasks; ++t) fn(t);
  }
}

void parallel_for(std::int64_t n, std::int64_t grain, const RangeFn& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int threads = pool().size();
  // A few chunks per thread balance uneven work; the chunking is a pure function of n, grain
  // and the thread count, and each element lands in exactly one chunk.
  std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, static_cast<std::int64_t>(threads) * 4);
  if (chunks <= 1 || threads == 1) {
    fn(0, n);
    return;
  }
  const std::int64_t step = (n + chunks - 1) / chunks;
  chunks = (n + step - 1) / step;
  parallel_tasks(chunks, [&](std::int64_t c) { fn(c * step, std::min(n, (c + 1) * step)); });
}

}  // namespace detail

void set_num_threads(int n) {
  if (n < 0) throw std::invalid_argument(MOEKIT_MSG("[moekit::set_num_threads] n must be >= 0, got " << n));
  if (n == 0) n = detail::default_threads();
  if (n > 4096) throw std::invalid_argument(MOEKIT_MSG("[moekit::set_num_threads] n must be <= 4096, got " << n));
  detail::pool().resize(n);
}

int num_threads() noexcept { return detail::pool().size(); }

}  // namespace moekit
