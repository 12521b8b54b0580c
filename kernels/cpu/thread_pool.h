// A small persistent thread pool for the CPU backend's data-parallel ops.
// ParallelFor splits [0, n) into tasks that the caller and any workers that
// are awake claim one at a time; the caller never waits for a worker that
// has not joined the job (on a loaded machine a sleeping worker may take
// milliseconds to be scheduled, so the caller simply does the work). Ops use
// it only to split independent outputs (matmul output rows, attention heads,
// GDN value heads), so results never depend on the thread count or on which
// thread ran which task.
#ifndef SPECSERVE_KERNELS_CPU_THREAD_POOL_H_
#define SPECSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specserve::kernels::cpu {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 = no worker threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), each exactly once, and returns when all
  // are done. Not reentrant: fn must not call ParallelFor. One caller at a
  // time (the backend serializes its ops).
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  // Claims and runs tasks of the current job until none is left.
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a new job or stop
  std::condition_variable leave_cv_;  // caller: joined workers left
  bool stop_ = false;                 // guarded by mu_
  uint64_t generation_ = 0;           // guarded by mu_; bumped per job
  bool open_ = false;                 // guarded by mu_; workers may still join
  int joined_ = 0;                    // guarded by mu_; workers inside the job
  // The current job. Written by the caller before the job is opened; read by
  // the caller and by workers that joined it while it was open.
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};        // next unclaimed task
  std::atomic<int64_t> done_{0};        // tasks finished
  std::atomic<uint64_t> published_{0};  // generation_, readable lock-free
};

}  // namespace specserve::kernels::cpu

#endif  // SPECSERVE_KERNELS_CPU_THREAD_POOL_H_
