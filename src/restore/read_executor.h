// The read executor: the one place that reads a step's data for restore
// (whole leaves and into a sharding) and verify. A caller (a "consumer")
// hands it reads, byte ranges of numbered data files; the executor cuts them
// into batches bounded in bytes and in staging memory, keeps two batches in
// flight through Storage::read (the backend reads a batch's requests in
// parallel), and hands each read's landed bytes back to the consumer in read
// order, on the calling thread, while the next batches are read. There the
// consumer verifies (crc32c), transforms (cast, src/transform) and copies
// out; the executor knows nothing of leaves, shards or checksums.
//
//   consumer.more()        plans more reads while earlier ones are in flight
//   consumer.destination() at launch: where a read without one lands
//                          (a temporary made only now bounds memory)
//   consumer.landed()      in read order: the read's bytes, wherever they are
//   consumer.delivered()   after each batch: reads [0, end) are delivered (progress)
//   consumer.failed()      a read that failed on its own, after its batch did
//
// Where a read lands: its `dst` (a leaf, a device buffer: no copy) or, when
// it has none, a staging arena at an address that agrees with its file
// offset modulo `align` (direct I/O then takes no bounce copy). One arena per
// batch in flight, reused from batch to batch and grown only when a batch
// needs more. Filler reads (object stores: a small gap between two reads,
// read so the store serves both with one GET) land in scratch memory of
// their batch and are never delivered.
//
// Failure: a batch whose read fails is narrowed by halving, into the same
// places: each half is read as one (a half that fails is halved again), so
// that one bad read among n costs about 2 log2(n) reads, not n. A read that
// fails on its own goes to consumer.failed(), which names it (and returns
// the error: restore stops) or records it and returns OK (verify goes on);
// reads that succeed are delivered, in order. When every read succeeds on
// its own, the batch's error is returned anyway: a transient failure is
// reported, not hidden by a retry the caller did not ask for.
//
// Thread safety: one execute_reads per consumer; the consumer is called on
// the calling thread only. The reading threads see only the requests built
// at launch, so `reads` may grow (more()) while they run.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "ckptio/types.h"

namespace ckptio {

struct ExecRead {
  uint32_t file = 0;           // index into the keys
  uint64_t offset = 0;         // in the file
  uint64_t length = 0;
  std::byte* dst = nullptr;    // where it lands; nullptr: destination(), else staging
  bool filler = false;         // read only to join its neighbours' requests; not delivered
  bool ends_batch = false;     // the last read of its batch (callers cutting their own)
};

struct ReadExecutorLimits {
  uint64_t batch_bytes = 256ull << 20;    // requested per batch (fillers not counted)
  uint64_t staging_bytes = 128ull << 20;  // staged per batch, alignment padding included
  uint64_t align = 1;                     // the backend's read alignment (a power of two)
};

class ReadConsumer {
 public:
  virtual ~ReadConsumer() = default;
  // Appends more reads to *reads; false when there are no more. Called
  // before the first batch and whenever fewer than two batches wait.
  virtual Result<bool> more(std::vector<ExecRead>* reads) {
    (void)reads;
    return false;
  }
  // Where read i (dst == nullptr, not a filler) lands; nullptr: staging.
  // Called once per read, at its batch's launch, once the read is known to
  // fit the batch's byte limit; at most one batch is in flight then, so a
  // consumer may block here for a buffer of a bounded pool that a delivered
  // batch gives back (cp's chunk buffers, returned as their writes finish).
  virtual std::byte* destination(size_t i) {
    (void)i;
    return nullptr;
  }
  // Read i's bytes, in order. An error stops the execution and is returned.
  virtual Status landed(size_t i, const std::byte* bytes) = 0;
  // `bytes`: of all reads delivered (or failed) so far, fillers not counted.
  virtual void delivered(size_t end, uint64_t bytes) {
    (void)end;
    (void)bytes;
  }
  // Read i failed on its own with `st`: the error to stop with, or OK to
  // go on without delivering it.
  virtual Status failed(size_t i, Status st) = 0;
};

// A consumer's progress to the caller's hook (RestoreOptions::on_progress),
// `done` never above `total`, and done == total once at the end.
class ProgressReport {
 public:
  ProgressReport(std::function<void(uint64_t, uint64_t)> hook, uint64_t total)
      : hook_(std::move(hook)), total_(total) {}
  void update(uint64_t done) {
    if (!hook_) return;
    last_ = std::min(done, total_);
    hook_(last_, total_);
  }
  void finish() {
    if (hook_ && last_ != total_) hook_(total_, total_);
    last_ = total_;
  }

 private:
  std::function<void(uint64_t, uint64_t)> hook_;
  uint64_t total_ = 0;
  uint64_t last_ = UINT64_MAX;  // none reported yet
};

struct ReadExecutorStats {
  uint64_t bytes_read = 0;  // fillers included
  uint64_t requests = 0;    // ReadRequests issued (fillers included; retries not)
  uint64_t batches = 0;
};

// Executes `*reads` and whatever consumer.more() adds. `keys[file]` is each
// file's storage key. Returns the first error (consumer's or storage's,
// `what` naming the operation in an unnamed storage error); never returns
// while a read may still write into memory.
Status execute_reads(Storage& storage, std::span<const std::string> keys, std::vector<ExecRead>* reads,
                     ReadConsumer& consumer, const ReadExecutorLimits& limits, const std::string& what,
                     ReadExecutorStats* stats = nullptr);

}  // namespace ckptio
