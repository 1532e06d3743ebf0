// Staging for save: the bounded pool of aligned chunk buffers, and the plan
// that lays the state's shards out as one byte stream (one data file).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

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
  uint64_t chunk() const { return chunk_; }
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t chunk_;
  const uint64_t capacity_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  std::vector<std::byte*> free_;
  uint64_t allocated_ = 0;
};

// One shard in the data file.
struct PlannedShard {
  size_t leaf = 0;
  size_t shard = 0;
  const std::byte* src = nullptr;
  uint64_t offset = 0;  // in the data file
  uint64_t length = 0;
};

// Shards packed back to back from offset 0, in leaf order.
struct SavePlan {
  std::vector<PlannedShard> shards;
  uint64_t total = 0;
};

SavePlan plan_save(const std::vector<LeafView>& leaves);

// Walks the byte stream of a plan in order, yielding the pieces of shards
// that fall in successive ranges. Used to fill chunks and to checksum them.
class StreamCursor {
 public:
  explicit StreamCursor(const SavePlan& plan) : plan_(plan) {}
  // Calls fn(shard_index, src, length, offset_in_range) for each piece of
  // the next `length` bytes of the stream.
  template <typename Fn>
  void next(uint64_t length, Fn&& fn) {
    uint64_t done = 0;
    while (done < length && i_ < plan_.shards.size()) {
      const PlannedShard& s = plan_.shards[i_];
      uint64_t n = std::min(s.length - pos_, length - done);
      if (n > 0) fn(i_, s.src + pos_, n, done);
      done += n;
      pos_ += n;
      if (pos_ == s.length) { ++i_; pos_ = 0; }
    }
  }

 private:
  const SavePlan& plan_;
  size_t i_ = 0;
  uint64_t pos_ = 0;
};

// Checks the leaves handed to save(): names, dtypes, shapes, and that the
// shards of each leaf lie inside it and cover it exactly once.
Status validate_leaves(const std::vector<LeafView>& leaves);

}  // namespace ckptio
