// One save on its way from save() through the worker: what was asked, its
// plan, and (copy mode) the chunks the copiers hand to the worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckptio/manager.h"
#include "src/save/commit.h"
#include "src/save/save_handle.h"
#include "src/save/save_plan.h"

namespace ckptio {

// The checksum of one shard's piece inside a staged chunk.
struct PieceCrc {
  size_t shard = 0;
  uint32_t crc = 0;
  uint64_t length = 0;
};

struct SaveJob {
  // Set by save() before it queues the job; read by the worker.
  int64_t step = 0;
  std::vector<LeafView> leaves;
  std::vector<Buffer> owned;  // cast copies the leaves point into
  SaveOptions options;
  AttemptPaths paths;
  std::vector<std::string> data_files;  // this process's data files in the step (plan.files)
  bool group = false;     // a multi-process save (ManagerOptions::processes)
  bool eformer = false;   // ManagerOptions::layout "eformer": src/save/eformer_save.cc
  SavePlan plan;
  std::vector<WriteRange> ranges;  // the data files' write requests, in order
  uint64_t chunk = 0;
  uint64_t unit = 1;  // write_unit() of the backend's granularity
  bool copy_mode = true;
  std::chrono::steady_clock::time_point started;
  int64_t created_unix_ns = 0;
  std::atomic<double> stall_seconds{0};  // set by save() as it returns
  std::shared_ptr<SaveHandle::State> handle;
  std::atomic<bool> failed{false};  // the writes failed: copiers and worker stop
  // Why the copiers stopped, when it was theirs to say (no staging buffer).
  void fail(Status st) {
    {
      std::lock_guard lock(mu);
      if (copy_error.ok()) copy_error = std::move(st);
    }
    failed = true;
  }
  Status copy_failure() {
    std::lock_guard lock(mu);
    return copy_error;
  }

  // Copy mode: the caller's thread and the crew fill chunks (one per range)
  // and checksum them as they copy; the worker consumes them in range order.
  // A thread takes a pool buffer and then claims the next range, both under
  // claim_mu, so the lowest range not yet consumed always has its buffer and
  // a full pool cannot deadlock. Every claimed range is published (with a
  // null buffer when its copier saw `failed`).
  struct Chunk {
    std::byte* buf = nullptr;
    std::vector<PieceCrc> crcs;
    bool ready = false;
  };
  std::mutex claim_mu;       // guards next_claim
  size_t next_claim = 0;
  std::mutex mu;             // guards chunks, claimed, producer_done, copy_error
  std::condition_variable cv;
  std::vector<Chunk> chunks;
  size_t claimed = 0;        // final once producer_done
  bool producer_done = false;
  Status copy_error;         // guarded by mu

  void publish(size_t i, std::byte* buf, std::vector<PieceCrc> crcs) {
    {
      std::lock_guard lock(mu);
      chunks[i].buf = buf;
      chunks[i].crcs = std::move(crcs);
      chunks[i].ready = true;
    }
    cv.notify_all();
  }
  // Chunk i once published; nullptr when the copiers stopped before it.
  Chunk* wait_chunk(size_t i) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return chunks[i].ready || (producer_done && i >= claimed); });
    return chunks[i].ready ? &chunks[i] : nullptr;
  }
  void producer_finished(size_t n_claimed) {
    {
      std::lock_guard lock(mu);
      claimed = n_claimed;
      producer_done = true;
    }
    cv.notify_all();
  }
};

}  // namespace ckptio
