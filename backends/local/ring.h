// Ring: one io_uring, one completion thread, bounded in-flight operations.
//
// The local backend shares one Ring per Storage between every writer and every
// direct read. Callers hand it whole operations (read/write of any length at a
// 64-bit offset, or fsync); the Ring turns them into SQEs, finishes short
// transfers by resubmitting the remainder, retries -EAGAIN/-EINTR, and reports
// one outcome per operation on its completion thread.
//
// Backpressure: at most queue_depth() operations are accepted at once;
// submit() blocks until one completes. So the SQ and CQ can never overflow.
//
// Batching: an SQE goes to the kernel at once when the device is nearly idle
// (fewer than kKeepBusy reads/writes in the kernel), when kBatch SQEs are
// waiting, or when it is an fsync; otherwise it waits for the completion
// thread, which flushes the queue after every pass over the CQ. Nothing waits
// long: a deferred SQE has at least kKeepBusy reads/writes ahead of it in the
// kernel (fsyncs, which may take seconds, do not count), and the first of
// them to complete triggers the flush.
//
// Thread safety: submit() may be called from any thread. `done` runs on the
// completion thread and must be quick: it must not call submit() (it would wait
// for a slot only this thread can free).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <liburing.h>

#include "ckptio/status.h"

namespace ckptio::local {

struct RingOp {
  enum class Kind : uint8_t { kRead, kWrite, kFsync };
  Kind kind = Kind::kWrite;
  int fd = -1;
  std::byte* buf = nullptr;  // kRead: destination; kWrite: source (not written)
  uint64_t len = 0;
  uint64_t offset = 0;
  // kRead: a short read that already delivered this many bytes completes the
  // operation instead of asking for the rest (an O_DIRECT read of a block that
  // straddles end of file; the rest would be an unaligned request).
  uint64_t min_len = UINT64_MAX;
};

// err is 0 or a positive errno. bytes < len only for a read that met end of
// file (or stopped at min_len).
struct RingResult {
  int err = 0;
  uint64_t bytes = 0;
};

using RingDone = std::function<void(const RingResult&)>;

class Ring {
 public:
  static constexpr unsigned kKeepBusy = 2;
  static constexpr unsigned kBatch = 8;

  static Result<std::unique_ptr<Ring>> create(unsigned queue_depth);
  // Waits for every accepted operation, then stops the completion thread.
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Queues `op`; blocks while queue_depth() operations are outstanding.
  void submit(const RingOp& op, RingDone done);
  unsigned queue_depth() const { return depth_; }

 private:
  struct Pending;
  explicit Ring(unsigned depth) : depth_(depth) {}
  void prep_locked(Pending* p);   // one SQE for the rest of p
  void flush_locked();            // io_uring_submit what is queued
  void completion_loop();
  // Applies one CQE to its operation; true when the operation is over.
  bool on_cqe_locked(Pending* p, int res);

  const unsigned depth_;
  io_uring ring_{};
  bool ring_ready_ = false;  // io_uring_queue_init succeeded
  bool ext_arg_ = false;  // the kernel waits with a timeout without an SQE
  std::vector<Pending*> finished_;  // the completion thread's, reserved for depth_
  std::thread thread_;

  std::mutex mu_;  // guards the SQ and everything below
  std::condition_variable slot_freed_;
  unsigned outstanding_ = 0;  // accepted, `done` not yet run
  unsigned unsubmitted_ = 0;  // SQEs in the SQ not yet given to the kernel
  unsigned in_kernel_ = 0;    // SQEs given to the kernel, CQE not yet reaped
  unsigned fsyncs_ = 0;       // fsync operations prepared and not yet reaped
};

}  // namespace ckptio::local
