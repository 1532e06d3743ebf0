#include "backends/local/pread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <system_error>

namespace ckptio::local {

struct PreadPool::Job {
  const std::function<void(size_t)>* fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable all_done;
  size_t finished = 0;         // guarded by mu
  std::exception_ptr error;    // the first a call threw; guarded by mu
};

PreadPool::~PreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  for (std::thread& t : threads_) t.join();
}

void PreadPool::work_on(Job& job) noexcept {
  size_t mine = 0;
  for (size_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
    try {
      (*job.fn)(i);
    } catch (...) {  // (std::bad_alloc) kept for the caller, once every call has returned
      std::lock_guard lock(job.mu);
      if (!job.error) job.error = std::current_exception();
    }
    ++mine;
  }
  if (mine == 0) return;
  std::lock_guard lock(job.mu);
  job.finished += mine;
  if (job.finished == job.n) job.all_done.notify_all();
}

void PreadPool::worker() {
  pthread_setname_np(pthread_self(), "ckptio-pread");
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    work_on(*job);
    lock.lock();
  }
}

void PreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  const size_t helpers = std::min<size_t>(helpers_, n - 1);
  if (helpers > 0) {
    std::lock_guard lock(mu_);
    try {
      while (threads_.size() < helpers_) threads_.emplace_back([this] { worker(); });
    } catch (...) {
      // Out of threads or memory: the ones we have, and the caller, do the work.
    }
    try {
      for (size_t i = 0; i < std::min(helpers, threads_.size()); ++i) queue_.push_back(job);
    } catch (...) {
      // (std::bad_alloc) The helpers queued so far, and the caller, do the work.
    }
    wake_.notify_all();
  }
  work_on(*job);
  std::unique_lock lock(job->mu);
  job->all_done.wait(lock, [&] { return job->finished == job->n; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace ckptio::local
