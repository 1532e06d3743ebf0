// What a SaveHandle shares with the save it watches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "ckptio/manager.h"

namespace ckptio {

struct SaveHandle::State {
  int64_t step = 0;
  int pid = 0;  // the process whose manager runs the save (a forked child's copy never finishes)
  mutable std::mutex mu;  // guards the fields below
  mutable std::condition_variable cv;
  bool done = false;
  bool released = false;
  bool stall_known = false;  // save() returned and set stats.stall_seconds
  Status status;
  SaveStats stats;

  // SaveProgress, counted by the pipeline without the lock (relaxed: each
  // counter is read on its own, for display).
  std::atomic<uint64_t> total{0};    // set once the save is planned
  std::atomic<uint64_t> staged{0};   // write_data's queue_writes
  std::atomic<uint64_t> written{0};  // write completions
  std::atomic<uint64_t> durable{0};  // data files finished

  void set_released();
  void set_stall(double seconds);
  void finish(Status st, const SaveStats& s);
};

}  // namespace ckptio
