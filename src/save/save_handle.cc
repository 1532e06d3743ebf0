// SaveHandle: the caller's view of a save, which the worker completes.
#include "src/save/save_handle.h"

#include <string>
#include <utility>

#include <unistd.h>

namespace ckptio {

// In a forked child the handle is a copy whose save runs (or ran) in the
// parent: it never changes there, and its lock may have been held at the
// fork. The child's own copy of the buffers is read by no one: released.
namespace {
bool forked_from(const SaveHandle::State& s) { return s.pid != static_cast<int>(::getpid()); }
}  // namespace

int64_t SaveHandle::step() const { return s_->step; }
bool SaveHandle::done() const {
  if (forked_from(*s_)) return true;
  std::lock_guard lock(s_->mu);
  return s_->done;
}
Status SaveHandle::wait() const {
  if (forked_from(*s_))
    return Status(Code::kFailedPrecondition, "save of step " + std::to_string(s_->step) + ": the handle of process " +
                                                 std::to_string(s_->pid) + ", waited on in its fork " +
                                                 std::to_string(::getpid()) + "; the outcome is known there");
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  return s_->status;
}
bool SaveHandle::released() const {
  if (forked_from(*s_)) return true;
  std::lock_guard lock(s_->mu);
  return s_->released;
}
void SaveHandle::wait_released() const {
  if (forked_from(*s_)) return;
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->released; });
}
SaveStats SaveHandle::stats() const {
  if (forked_from(*s_)) return {};  // the lock may have been held at the fork
  std::lock_guard lock(s_->mu);
  return s_->stats;
}
SaveProgress SaveHandle::progress() const {
  // Read in the order opposite to the counting, so that durable <= written
  // <= staged <= total holds in what the caller sees.
  SaveProgress p;
  p.durable = s_->durable.load(std::memory_order_acquire);
  p.written = s_->written.load(std::memory_order_acquire);
  p.staged = s_->staged.load(std::memory_order_acquire);
  p.total = s_->total.load(std::memory_order_acquire);
  return p;
}

void SaveHandle::State::set_released() {
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
}

void SaveHandle::State::set_stall(double seconds) {
  std::lock_guard lock(mu);
  stats.stall_seconds = seconds;
  stall_known = true;
}

void SaveHandle::State::finish(Status st, const SaveStats& s) {
  {
    std::lock_guard lock(mu);
    status = std::move(st);
    const double stall = stats.stall_seconds;
    stats = s;
    if (stall_known) stats.stall_seconds = stall;
    released = true;
    done = true;
  }
  cv.notify_all();
}

}  // namespace ckptio
