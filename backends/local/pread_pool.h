// PreadPool: a few long-lived threads for blocking buffered reads. The calling
// thread works too, so a call makes progress even when the pool is busy with
// another caller's work.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ckptio::local {

class PreadPool {
 public:
  explicit PreadPool(unsigned helpers) : helpers_(helpers) {}
  ~PreadPool();
  PreadPool(const PreadPool&) = delete;
  PreadPool& operator=(const PreadPool&) = delete;

  // Runs fn(i) for every i in [0, n), on up to `helpers` pool threads plus the
  // calling thread; returns once every call has returned. Thread-safe. What
  // a call throws is thrown from here once every call has returned (the
  // first, if several did; fn reads the caller's frame); nothing leaves a
  // pool thread. A pool that cannot start its threads, or queue them, works
  // with fewer.
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Job;
  void worker();
  static void work_on(Job& job) noexcept;

  const unsigned helpers_;
  std::mutex mu_;  // guards everything below
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::thread> threads_;  // started on first use
  bool stopping_ = false;
};

}  // namespace ckptio::local
