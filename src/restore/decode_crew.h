// DecodeCrew: the threads that decode a zarr restore's chunks (and verify's)
// and copy them out (src/restore/restore_zarr.cc).
#pragma once

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "ckptio/status.h"
#include "src/layout/zarr/chunk_codec.h"
#include "src/util/allocate.h"

namespace ckptio {

// Threads that decode chunks and copy them out, one ChunkDecoder and one
// scratch buffer each. Tasks run in any order; the first error is kept, and
// every task after it is still called, with skip = true: it must do nothing
// but give back what it holds (a task whose bookkeeping was dropped with it
// left the reader waiting for compressed bytes that never drained).
//
// The scratch of all threads together is bounded: a task whose chunk would
// take the scratch in use past the budget waits for others to give theirs
// back, and a chunk larger than the budget goes alone. Without the bound a
// restore held threads x its largest chunk beside the state (a resharded
// eformer leaf in 128 MiB chunks: 8 GiB on a 64-core host). Between tasks a
// thread keeps at most min(kKeepScratch, budget / threads) for the next.
class DecodeCrew {
 public:
  static constexpr size_t kScratchBudget = 256u << 20;
  static constexpr size_t kKeepScratch = 64u << 20;

  // A thread's scratch. get(n): n bytes for this task (contents undefined),
  // waiting while that would take the crew's scratch in use past its budget.
  // Call it once per task: the bytes stay counted until the task returns.
  class Scratch {
   public:
    std::span<std::byte> get(size_t n) {
      if (n > buf_.capacity()) std::vector<std::byte>().swap(buf_);  // the old one is not copied over
      crew_->acquire(&counted_, std::max(n, buf_.capacity()));
      if (buf_.size() < n) buf_.resize(n);  // may throw bad_alloc: run() catches
      return {buf_.data(), n};
    }
    size_t capacity() const { return buf_.capacity(); }

   private:
    friend class DecodeCrew;
    explicit Scratch(DecodeCrew* crew) : crew_(crew) {}
    DecodeCrew* crew_;
    std::vector<std::byte> buf_;
    size_t counted_ = 0;  // of the budget, held by the task running
  };

  // The decoder is null when skip (then no decoder may have been made: the
  // thread's first one failed to allocate).
  using Task = std::function<Status(zarr::ChunkDecoder*, Scratch&, bool skip)>;
  // A system that refuses some of the threads (or the memory for them)
  // leaves the crew with fewer; one that refuses all, the exception.
  explicit DecodeCrew(unsigned n, size_t scratch_budget = kScratchBudget)
      : budget_(scratch_budget), keep_(std::min<size_t>(kKeepScratch, scratch_budget / std::max(1u, n))) {
    try {
      threads_.reserve(std::max(1u, n));
      for (unsigned i = 0; i < std::max(1u, n); ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {  // std::system_error, std::bad_alloc
      if (threads_.empty()) throw;
    }
  }
  ~DecodeCrew() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(Task t) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(t));
      ++pending_;
    }
    cv_.notify_one();
  }
  // Waits for every task submitted; the first error.
  Status wait() {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    return error_;
  }
  Status error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  // The most scratch the running tasks held at once.
  size_t scratch_peak() {
    std::lock_guard lock(mu_);
    return peak_;
  }

 private:
  // Gives back what the task holds (*counted) and takes n, once the rest in
  // use leaves room for it or nothing else is in use: a task that waits
  // holds nothing, so the tasks that hold some finish and make room.
  void acquire(size_t* counted, size_t n) {
    std::unique_lock lock(mu_);
    in_use_ -= std::exchange(*counted, 0);
    scratch_cv_.notify_all();
    scratch_cv_.wait(lock, [&] { return in_use_ == 0 || in_use_ + n <= budget_; });
    in_use_ += n;
    *counted = n;
    peak_ = std::max(peak_, in_use_);
  }

  void run() {
    pthread_setname_np(pthread_self(), "ckptio-decode");
    std::optional<zarr::ChunkDecoder> decoder;  // made by the first task (what that throws fails it)
    Scratch scratch(this);
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      Task t = std::move(tasks_.front());
      tasks_.pop_front();
      const bool skip = !error_.ok();
      lock.unlock();
      Status st;
      bool called = false;
      try {
        if (!skip && !decoder) decoder.emplace();
        called = true;
        st = t(skip ? nullptr : &*decoder, scratch, skip);
      } catch (...) {  // std::bad_alloc (a chunk's scratch): the restore fails, the process goes on
        st = status_of_exception("decoding a chunk");
        std::vector<std::byte>().swap(scratch.buf_);
      }
      // The decoder could not be made: the task still gives back what it
      // holds (before, it was dropped uncalled, and the reader waited for
      // its compressed bytes to drain for ever).
      if (!called) {
        try {
          (void)t(nullptr, scratch, true);
        } catch (...) {
        }
      }
      t = nullptr;  // frees what the task holds before it counts as done
      if (scratch.buf_.capacity() > keep_) std::vector<std::byte>().swap(scratch.buf_);
      lock.lock();
      in_use_ -= std::exchange(scratch.counted_, 0);
      scratch_cv_.notify_all();
      if (!st.ok() && error_.ok()) error_ = status_or_out_of_memory([&] { return st; });
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  const size_t budget_, keep_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_, scratch_cv_;
  std::deque<Task> tasks_;
  size_t pending_ = 0;
  size_t in_use_ = 0, peak_ = 0;  // scratch held by running tasks
  bool stop_ = false;
  Status error_;
  std::vector<std::thread> threads_;
};

}  // namespace ckptio
