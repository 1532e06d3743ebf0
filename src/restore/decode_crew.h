// DecodeCrew: the threads that decode a zarr restore's chunks (and verify's)
// and copy them out (src/restore/restore_zarr.cc).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "ckptio/status.h"
#include "src/layout/zarr/chunk_codec.h"

namespace ckptio {

// Threads that decode chunks and copy them out, one ChunkDecoder and one
// scratch buffer each. Tasks run in any order; the first error is kept, and
// every task after it is still called, with skip = true: it must do nothing
// but give back what it holds (a task whose bookkeeping was dropped with it
// left the reader waiting for compressed bytes that never drained).
class DecodeCrew {
 public:
  static constexpr size_t kKeepScratch = 64u << 20;
  using Task = std::function<Status(zarr::ChunkDecoder&, std::vector<std::byte>&, bool skip)>;
  explicit DecodeCrew(unsigned n) {
    for (unsigned i = 0; i < std::max(1u, n); ++i) threads_.emplace_back([this] { run(); });
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

 private:
  void run() {
    zarr::ChunkDecoder decoder;
    std::vector<std::byte> scratch;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      Task t = std::move(tasks_.front());
      tasks_.pop_front();
      const bool skip = !error_.ok();
      lock.unlock();
      Status st;
      try {
        st = t(decoder, scratch, skip);
      } catch (const std::bad_alloc&) {  // a chunk's scratch: the restore fails, the process goes on
        st = out_of_memory("decoding a chunk");
        std::vector<std::byte>().swap(scratch);
      }
      t = nullptr;  // frees what the task holds before it counts as done
      // A chunk that did not land in place left the scratch at its size: kept
      // up to kKeepScratch for the next, freed above it, so that a restore
      // holds no more than threads x kKeepScratch of it between chunks.
      if (scratch.capacity() > kKeepScratch) std::vector<std::byte>().swap(scratch);
      lock.lock();
      if (!st.ok() && error_.ok()) error_ = st;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Task> tasks_;
  size_t pending_ = 0;
  bool stop_ = false;
  Status error_;
  std::vector<std::thread> threads_;
};

}  // namespace ckptio
