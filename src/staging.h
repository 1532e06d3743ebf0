// Staging for save: the bounded pool of aligned chunk buffers, and the plan
// that lays the state's shards out as one byte stream, cut into data files.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

// Faults in the whole pages of [p, p + len) as writable without changing
// their contents (MADV_POPULATE_WRITE), so that it is safe while a read is
// landing in the same memory. False when the kernel cannot (before 5.14):
// then nothing was done, and the caller must not fall back to writing.
bool populate_for_write(void* p, size_t len);

// Fresh allocations of a restore, faulted in on a thread of their own
// (populate_for_write) while the restore fills them: the ranges from the
// last backwards, each in 8 MiB slices from its end, so that this thread
// and copies filling them from the front meet in the middle. Invalid when
// there is nothing to do, no thread to be had, or the kernel cannot. The
// caller waits on it before freeing the ranges.
std::future<void> populate_in_background(std::vector<std::pair<std::byte*, uint64_t>> ranges);

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

// A few long-lived threads that join the calling thread on one task: run(fn)
// calls fn on the caller and on every helper at once and returns when all
// calls have returned. Copy mode's save() copies the state with it, so the
// stall shrinks with the cores a machine has. One run() at a time (others
// wait); fn must not call run().
class Crew {
 public:
  explicit Crew(unsigned helpers);
  ~Crew();
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;
  unsigned size() const { return static_cast<unsigned>(threads_.size()) + 1; }
  void run(const std::function<void()>& fn);

 private:
  void loop();

  std::mutex run_mu_;  // one run() at a time
  std::mutex mu_;      // guards the fields below
  std::condition_variable wake_, done_;
  const std::function<void()>* fn_ = nullptr;
  uint64_t generation_ = 0;
  unsigned busy_ = 0;  // helpers still in this generation's fn
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// One shard in the plan's byte stream.
struct PlannedShard {
  size_t leaf = 0;
  size_t shard = 0;
  const std::byte* src = nullptr;
  uint64_t offset = 0;  // in the stream; in its data file: offset - files[file].start
  uint64_t length = 0;
  size_t file = 0;      // index into SavePlan::files
};

// One data file: the stream's bytes [start, start + size).
struct PlannedFile {
  uint64_t start = 0;
  uint64_t size = 0;
};

// Shards at increasing offsets from 0: first the leaves held whole (one shard
// covering the leaf: unsharded and replicated leaves), in leaf order; then
// the shards of the other leaves ordered by where they start along dimension
// 0, as a fraction of the leaf's size there (ties in leaf, then shard order).
// So the leaves every process of a resharded restore needs whole lie
// together at the start of a data file, one contiguous read, instead of
// between shards most processes skip; and a restore that splits dimension 0
// finds the parts of all leaves it needs together (with row bands, below,
// in one range per data file) instead of one range per leaf.
// Back to back unless the plan was asked for phase alignment (then gaps of
// unspecified bytes, which the writer fills with zeros, may lie between
// them).
//
// The stream is cut into data files (at least one, possibly empty), each a
// run of consecutive shards. With one file it is the file. With several
// (Storage::data_object_bytes()), each file starts at a multiple of the
// write unit in the stream, so that every file's write ranges line up with
// the backend's granularity; the stream bytes between files belong to none
// and are never written.
struct SavePlan {
  std::vector<PlannedShard> shards;
  std::vector<PlannedFile> files;
  uint64_t total = 0;  // end of the stream (of the last file)
  uint64_t bytes() const;  // sum of the files' sizes: what the save writes
};

// Shards at least this long get phase alignment (below); smaller ones are
// packed, so 10,000 tiny leaves add no padding.
constexpr uint64_t kPhaseAlignMinBytes = 1ull << 20;

// With phase_align (a power of two, 4096 for O_DIRECT) each shard of at
// least kPhaseAlignMinBytes starts at the first offset congruent to its
// address modulo phase_align: then the aligned middle of the shard can be
// written straight from the caller's memory (borrow mode's zero copy), at a
// cost of < phase_align bytes of padding per large shard. 0: packed.
// With object_bytes > 0 a new data file starts, at the next multiple of
// file_align in the stream, before any shard that would take a non-empty
// file past object_bytes (a larger shard gets a file of its own; phase
// padding, when asked for too, may add < phase_align). 0: one file.
SavePlan plan_save(const std::vector<LeafView>& leaves, uint64_t phase_align = 0,
                   uint64_t object_bytes = 0, uint64_t file_align = 1);

// Row bands (SaveOptions::row_band_ways, docs/read-planning.md): splits every
// shard of each leaf not held whole into bands of dimension-0 rows, cut
// wherever a sharding of that dimension over n devices would cut (XLA's
// ceil-division tiles, JAX's chunks when n divides the size), for n from 2
// to `ways`, smaller n first, keeping only cuts that leave every band at
// least kRowBandMinBytes long. Each band is a shard of its own (the rows of a
// C-order box are contiguous: its data points into the shard's). With
// plan_save's order, a restore that splits dimension 0 n ways, n <= ways,
// reads the bands it needs as one range per data file, and whole, so each
// one's checksum is checked. Bands stay above the restore's default
// verify_widen_max_bytes (64 KiB), so a restore that needs part of every
// band (one splitting another dimension) reads no more than without bands.
// ways < 2: nothing changes.
constexpr uint64_t kRowBandMinBytes = 96 << 10;
constexpr uint32_t kMaxRowBandWays = 64;  // cuts grow as ways^2 / 2
void split_row_bands(std::vector<LeafView>& leaves, uint32_t ways, uint64_t min_band_bytes = kRowBandMinBytes);
// The band minimum save() uses: kRowBandMinBytes; tests lower it to band
// small arrays.
uint64_t& row_band_min_bytes();

// One write request of a save: a byte range of one data file, written either
// straight from the caller's memory (`direct`, one shard's bytes) or from a
// staging buffer that the pieces of shards in it are copied into.
struct WriteRange {
  uint64_t offset = 0;  // in the stream; in the file: offset - files[file].start
  uint64_t length = 0;
  const std::byte* direct = nullptr;  // zero copy from here; nullptr: staged
  size_t shard = 0;                   // direct: index into SavePlan::shards
  size_t file = 0;                    // index into SavePlan::files
};

// Direct runs shorter than this are staged: a separate request costs more
// than copying a few hundred KiB.
constexpr uint64_t kMinDirectRunBytes = 1ull << 20;

// The least common multiple of the backend's write granularity and 4096 (or
// 1 when the granularity is 1): what chunk sizes and direct ranges are cut to.
uint64_t write_unit(uint64_t granularity);

// Cuts each data file of the plan into write requests of at most `chunk`
// bytes (a multiple of write_unit(granularity)), in stream order; no request
// spans two files. Every offset in its file is a multiple of the unit, and
// every length too except for the range that ends its file, which is what
// the storage seam asks of write_async(). With
// `zero_copy`, the unit-aligned middle of each shard of at least
// kMinDirectRunBytes whose address agrees with its offset modulo
// `memory_align` (Storage::write_memory_alignment(); any address when it is
// 1) becomes direct ranges; the rest is staged. A
// direct range never ends the file unless its length is a unit multiple (it
// would need padding past the caller's bytes).
std::vector<WriteRange> plan_write_ranges(const SavePlan& plan, uint64_t chunk, uint64_t granularity,
                                          bool zero_copy, uint64_t memory_align);

// Walks the shards of a plan for successive, increasing byte ranges of the
// data file, yielding the pieces of shards that fall in each. Used to fill
// staging buffers and to checksum them.
class StreamCursor {
 public:
  explicit StreamCursor(const SavePlan& plan) : plan_(plan) {}
  // Calls fn(shard_index, src, length, offset_in_range) for each piece of a
  // shard inside [offset, offset + length), in file order. Ranges must come
  // in increasing order and must not overlap.
  template <typename Fn>
  void range(uint64_t offset, uint64_t length, Fn&& fn) {
    const uint64_t end = offset + length;
    while (i_ < plan_.shards.size() && plan_.shards[i_].offset + plan_.shards[i_].length <= offset) ++i_;
    for (size_t j = i_; j < plan_.shards.size() && plan_.shards[j].offset < end; ++j) {
      const PlannedShard& s = plan_.shards[j];
      const uint64_t a = std::max(s.offset, offset);
      const uint64_t b = std::min(s.offset + s.length, end);
      if (a < b) fn(j, s.src + (a - s.offset), b - a, a - offset);
    }
  }

 private:
  const SavePlan& plan_;
  size_t i_ = 0;
};

// Checks the leaves handed to save(): names, dtypes, shapes, and that the
// shards of each leaf lie inside it and cover it exactly once.
// With `partial` (a process of a multi-process save), a leaf's shards must
// be disjoint but need not cover it, and a leaf may have none.
Status validate_leaves(const std::vector<LeafView>& leaves, bool partial = false);

}  // namespace ckptio
