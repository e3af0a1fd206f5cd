#include "util/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
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

// How long a thread spins on the pool's state before it parks on a condition variable: an idle
// worker waiting for the next job, the caller waiting for the workers' last tasks. Waking a
// parked thread costs 8-50 µs on the developers' VM (BM_PoolRoundTrip), paid at every job and
// twice on a decode step of under a millisecond. MOEKIT_SPIN_US (0 … 100000, default 100) sets
// it; 0 parks at once.
std::chrono::microseconds spin_budget() {
  static const std::chrono::microseconds budget = [] {
    long us = 100;
    if (const char* env = std::getenv("MOEKIT_SPIN_US")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v >= 0 && v <= 100000) us = v;
    }
    return std::chrono::microseconds(us);
  }();
  return budget;
}

// Spins until done() or the spin budget is spent; true if done() became true. The spin yields
// the core at each turn: a thread the kernel wakes onto the spinner's core (the worker a job
// notifies lands beside the caller) runs at once. With `pause` instead, such a worker waited out
// the caller's whole budget: round trips of 25-200 µs, worse than parking.
template <class Done>
bool spin_until(Done done) {
  const auto budget = spin_budget();
  if (budget.count() == 0) return done();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > budget) return done();
    std::this_thread::yield();
  }
}

// Workers wait on a generation counter; each job is a task counter that workers and the caller
// drain together. Only one job runs at a time (busy_ guards it). Waits spin for spin_budget(),
// then park: the counters a spinning thread reads are atomics, written under mu_ (so a parked
// thread's predicate sees them) and published with release / read with acquire.
class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const noexcept { return size_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(busy_);
    stop();
    size_.store(n, std::memory_order_relaxed);
    quit_.store(false, std::memory_order_relaxed);
    // A new worker starts at the current generation: starting from 0 it would replay the last
    // job, decrement `pending_` a second time, and let a later caller return before a worker
    // finished its task, or wait forever on a negative count.
    const std::uint64_t now = generation_.load(std::memory_order_relaxed);
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
      pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    in_worker_ = true;
    drain();
    in_worker_ = false;
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_.load(std::memory_order_relaxed) == 0; });
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
      const auto ready = [&] {
        return quit_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(ready)) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, ready);
      }
      if (quit_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      drain();
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_cv_.notify_one();
      }
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_.store(true, std::memory_order_release);
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
  std::atomic<bool> quit_{false};
  std::atomic<std::uint64_t> generation_{0};
  const std::function<void(std::int64_t)>* task_ = nullptr;
  std::int64_t n_tasks_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<int> pending_{0};
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
