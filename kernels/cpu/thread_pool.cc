#include "kernels/cpu/thread_pool.h"

#include "glog/logging.h"

namespace specserve::kernels::cpu {
namespace {
// Workers spin this many pause instructions for the next job before
// sleeping: decode issues many small ops back to back.
constexpr int kSpinIterations = 4000;

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  CHECK_GE(num_threads, 1) << "thread pool needs at least the caller";
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  while (true) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    (*fn_)(i);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::ParallelFor(int64_t n,
                             const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    open_ = true;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  work_cv_.notify_all();
  RunTasks();
  // Every task is claimed; wait for those still running on workers.
  while (done_.load(std::memory_order_acquire) < n) CpuRelax();
  std::unique_lock<std::mutex> lock(mu_);
  open_ = false;  // late workers skip this job
  leave_cv_.wait(lock, [this] { return joined_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    for (int i = 0; i < kSpinIterations; ++i) {
      if (published_.load(std::memory_order_acquire) != seen) break;
      CpuRelax();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
      if (!open_) continue;  // the caller already finished this job
      ++joined_;
    }
    RunTasks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--joined_ == 0) leave_cv_.notify_one();
    }
  }
}

}  // namespace specserve::kernels::cpu
