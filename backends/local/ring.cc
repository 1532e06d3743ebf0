#include "backends/local/ring.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace ckptio::local {

namespace {
// One SQE never asks for more than this (the SQE length field is 32 bits and
// Linux caps a single transfer at 2 GiB - 4 KiB anyway).
constexpr uint64_t kMaxSqeBytes = 1ull << 30;
// -EAGAIN / -EINTR / zero-byte writes are retried this many times per
// operation before the error is reported.
constexpr int kMaxRetries = 64;
constexpr uint64_t kStopToken = 0;  // user_data of the shutdown NOP
}  // namespace

struct Ring::Pending {
  RingOp op;
  RingDone done;
  uint64_t moved = 0;  // bytes transferred so far
  int retries = 0;
  RingResult result;
};

Result<std::unique_ptr<Ring>> Ring::create(unsigned queue_depth) {
  queue_depth = std::clamp(queue_depth, 1u, 4096u);
  std::unique_ptr<Ring> r(new Ring(queue_depth));
  io_uring_params params{};
  // The CQ is twice the SQ by default; outstanding operations never exceed
  // the SQ size, so neither ring can overflow.
  int rc = io_uring_queue_init_params(queue_depth, &r->ring_, &params);
  if (rc < 0)
    return Status::from_errno(-rc, "io_uring_queue_init(" + std::to_string(queue_depth) +
                                       ")" + (rc == -EPERM ? " (io_uring refused: a container's seccomp profile, "
                                                             "or kernel.io_uring_disabled)" : ""));
  r->ring_ready_ = true;
  r->ext_arg_ = (params.features & IORING_FEAT_EXT_ARG) != 0;
  try {
    // The completion thread collects finished operations without
    // allocating (a throw there would end the process): at most queue_depth
    // are outstanding.
    r->finished_.reserve(queue_depth);
    r->thread_ = std::thread([p = r.get()] { p->completion_loop(); });
  } catch (const std::system_error& e) {
    // A process at its thread limit (EAGAIN): a limit of the process, as
    // out of memory is, not a fault of the storage to retry against.
    return Status(Code::kResourceExhausted, std::string("start the io_uring completion thread: ") + e.what());
  } catch (const std::bad_alloc&) {
    return out_of_memory("start the io_uring completion thread");
  }
  return r;
}

Ring::~Ring() {
  if (!thread_.joinable()) {  // create() failed to start the thread, or the ring
    // (A ring never set up holds ring_fd 0: io_uring_queue_exit would close
    // the process's fd 0.)
    if (ring_ready_) io_uring_queue_exit(&ring_);
    return;
  }
  std::unique_lock lock(mu_);
  slot_freed_.wait(lock, [&] { return outstanding_ == 0; });
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // SQ is empty: cannot fail
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, kStopToken);
  ++unsubmitted_;
  flush_locked();
  lock.unlock();
  thread_.join();
  io_uring_queue_exit(&ring_);
}

void Ring::submit(const RingOp& op, RingDone done) {
  auto* p = new Pending{op, std::move(done), 0, 0, {}};
  std::unique_lock lock(mu_);
  if (outstanding_ >= depth_) {
    flush_locked();  // never sleep on SQEs only we could hand to the kernel
    slot_freed_.wait(lock, [&] { return outstanding_ < depth_; });
  }
  ++outstanding_;
  prep_locked(p);
  // fsyncs_ may count one not yet in the kernel: that only flushes sooner.
  const unsigned data_in_kernel = in_kernel_ > fsyncs_ ? in_kernel_ - fsyncs_ : 0;
  if (data_in_kernel < kKeepBusy || unsubmitted_ >= kBatch || op.kind == RingOp::Kind::kFsync)
    flush_locked();
}

void Ring::prep_locked(Pending* p) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (!sqe) {  // cannot happen while outstanding_ <= SQ size; be safe
    flush_locked();
    sqe = io_uring_get_sqe(&ring_);
  }
  const RingOp& op = p->op;
  const uint64_t rest = op.len - p->moved;
  const unsigned n = static_cast<unsigned>(std::min(rest, kMaxSqeBytes));
  switch (op.kind) {
    case RingOp::Kind::kRead:
      io_uring_prep_read(sqe, op.fd, op.buf + p->moved, n, op.offset + p->moved);
      break;
    case RingOp::Kind::kWrite:
      io_uring_prep_write(sqe, op.fd, op.buf + p->moved, n, op.offset + p->moved);
      break;
    case RingOp::Kind::kFsync:
      io_uring_prep_fsync(sqe, op.fd, 0);
      if (p->retries == 0) ++fsyncs_;
      break;
  }
  io_uring_sqe_set_data(sqe, p);
  ++unsubmitted_;
}

void Ring::flush_locked() {
  int spins = 0;
  while (unsubmitted_ > 0) {
    int rc = io_uring_submit(&ring_);
    if (rc >= 0) {
      unsigned n = std::min<unsigned>(static_cast<unsigned>(rc), unsubmitted_);
      unsubmitted_ -= n;
      in_kernel_ += n;
      if (rc == 0 && ++spins > 1000) break;  // kernel took nothing; retried later
      continue;
    }
    // -EAGAIN / -EBUSY: the kernel is short of resources or has completions
    // to post; those complete on their own, so retry shortly. -EINTR: retry.
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == -ENOMEM) {
      if (++spins > 1000) break;
      if (rc != -EINTR) {
        mu_.unlock();
        std::this_thread::yield();
        mu_.lock();
      }
      continue;
    }
    break;  // unexpected: leave the SQEs queued; the completion thread retries
  }
}

bool Ring::on_cqe_locked(Pending* p, int res) {
  const RingOp& op = p->op;
  if (res == -EAGAIN || res == -EINTR || (res == 0 && op.kind == RingOp::Kind::kWrite && op.len > p->moved)) {
    if (++p->retries <= kMaxRetries) {
      prep_locked(p);
      return false;
    }
    p->result = {res == 0 ? EIO : -res, p->moved};
    return true;
  }
  if (res < 0) {
    p->result = {-res, p->moved};
    return true;
  }
  if (op.kind == RingOp::Kind::kFsync) {
    p->result = {0, 0};
    return true;
  }
  if (res == 0) {  // a read at end of file
    p->result = {0, p->moved};
    return true;
  }
  p->moved += static_cast<uint64_t>(res);
  const bool short_ok = op.kind == RingOp::Kind::kRead && p->moved >= op.min_len;
  if (p->moved >= op.len || short_ok) {
    p->result = {0, p->moved};
    return true;
  }
  prep_locked(p);  // a short transfer: ask for the remainder
  return false;
}

void Ring::completion_loop() {
  pthread_setname_np(pthread_self(), "ckptio-ring");
  std::vector<Pending*>& finished = finished_;  // room for every operation (create() reserved it)
  bool stop = false;
  while (!stop) {
    io_uring_cqe* cqe = nullptr;
    // The timeout only matters if a flush ever failed with nothing in the
    // kernel to trigger the next one: then this thread retries it.
    __kernel_timespec timeout{.tv_sec = 0, .tv_nsec = 100'000'000};
    // Without IORING_FEAT_EXT_ARG (kernels before 5.11) liburing would put a
    // timeout SQE on the SQ, which this thread does not own: wait plainly.
    int rc = ext_arg_ ? io_uring_wait_cqe_timeout(&ring_, &cqe, &timeout) : io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0) {
      std::lock_guard lock(mu_);
      flush_locked();
      continue;
    }
    finished.clear();
    {
      // Taking mu_ here also orders the submitter's writes to Pending before
      // our reads of it (the kernel hand-off is invisible to sanitizers).
      std::lock_guard lock(mu_);
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        --in_kernel_;
        if (cqe->user_data == kStopToken) {
          stop = true;
          continue;
        }
        auto* p = static_cast<Pending*>(io_uring_cqe_get_data(cqe));
        if (on_cqe_locked(p, cqe->res)) {
          if (p->op.kind == RingOp::Kind::kFsync) --fsyncs_;
          finished.push_back(p);
        }
      }
      io_uring_cq_advance(&ring_, seen);
      flush_locked();  // resubmissions and SQEs deferred for batching
    }
    for (Pending* p : finished) {
      p->done(p->result);
      delete p;
    }
    if (!finished.empty()) {
      std::lock_guard lock(mu_);
      outstanding_ -= static_cast<unsigned>(finished.size());
      slot_freed_.notify_all();
    }
  }
}

}  // namespace ckptio::local
