// The bounded pool of aligned staging buffers a save copies chunks into.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ckptio {

// A pool of `capacity` buffers of `chunk` bytes, 4096-aligned (direct I/O
// needs it). acquire() blocks while all are in use; freed buffers are kept
// for the next save, so steady-state saves do not page-fault fresh memory.
class BufferPool {
 public:
  BufferPool(uint64_t chunk, uint64_t capacity);
  ~BufferPool();
  std::byte* acquire();
  void release(std::byte* buf);
  // Allocates buffers until min(n, capacity) exist and faults their pages in
  // now. Copy mode calls it at the start of a save with the chunks it needs:
  // the first save pays for touching fresh memory (slow on a VM), later saves
  // of the same state never allocate (acquire() alone grows the pool only as
  // far as the writes lag the copy, and faults each buffer it adds in whole,
  // so resident memory stops growing once the pool does).
  void reserve(uint64_t n);
  uint64_t chunk() const { return chunk_; }
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t chunk_;
  const uint64_t capacity_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::vector<std::byte*> free_;
  uint64_t allocated_ = 0;

  std::byte* allocate_buffer() const;
  void populate(std::byte* b) const;  // faults every page of a buffer in
};

}  // namespace ckptio
