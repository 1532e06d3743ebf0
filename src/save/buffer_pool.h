// The bounded pool of aligned staging buffers a save copies chunks into.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ckptio/status.h"

namespace ckptio {

// A pool of `capacity` buffers of `chunk` bytes, 4096-aligned (direct I/O
// needs it). acquire() blocks while all are in use; freed buffers are kept
// for the next save, so steady-state saves do not page-fault fresh memory.
//
// The system may refuse a new buffer (a process at RLIMIT_AS, strict
// overcommit): a checkpoint library must not end the training process for
// it. The pool then lowers its ceiling to one buffer fewer than it has and
// gives that one back (now if it is free, else when released), so that the
// rest of the save (its index) and the trainer's next allocation find some
// memory, and goes on with the others: saves get slower, not fail. Only
// with no buffer at all does acquire() return nullptr, and the save fails
// with kResourceExhausted. An explicit reserve (prepare_staging) tries the
// whole capacity again.
class BufferPool {
 public:
  BufferPool(uint64_t chunk, uint64_t capacity);
  ~BufferPool();
  // A buffer: a free one, or a new one while fewer than the ceiling exist;
  // nullptr when none exists and the system refused one (out_of_memory()).
  std::byte* acquire();
  void release(std::byte* buf);
  // Allocates buffers until min(n, ceiling) exist and faults their pages in
  // now. Copy mode calls it at the start of a save with the chunks it needs:
  // the first save pays for touching fresh memory (slow on a VM), later saves
  // of the same state never allocate (acquire() alone grows the pool only as
  // far as the writes lag the copy, and faults each buffer it adds in whole,
  // so resident memory stops growing once the pool does). `lift`: the
  // ceiling goes back to the capacity first. kResourceExhausted when the
  // system refused a buffer (the pool goes on as above).
  Status reserve(uint64_t n, bool lift = false);
  // The error of a refused buffer.
  Status out_of_memory() const;
  uint64_t chunk() const { return chunk_; }
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t chunk_;
  const uint64_t capacity_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::vector<std::byte*> free_;
  uint64_t allocated_ = 0;  // made, or being made
  uint64_t ceiling_;        // at most this many exist (>= 1); capacity_ until the system refuses one

  std::byte* allocate_buffer() const;  // nullptr when mmap fails
  void free_buffer(std::byte* b) const;
  // With mu_ held, after a refusal: the ceiling one below the buffers there
  // are (at least 1); free buffers above it are returned in *unmap.
  void refused_locked(std::vector<std::byte*>* unmap);
  void populate(std::byte* b) const;  // faults every page of a buffer in
};

}  // namespace ckptio
