// The plan of a save: the state's shards laid out as one byte stream, cut
// into data files (plan_save), row bands (split_row_bands), and the write
// requests the stream is written in (plan_write_ranges, StreamCursor).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckptio/types.h"

namespace ckptio {

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

// Shards at least this long get phase alignment (below); smaller ones start
// at the next multiple of their dtype's alignment in their file (never more
// than 15 bytes of padding), so that restored leaves are aligned for their
// elements, and 10,000 tiny leaves of one dtype add no padding.
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

}  // namespace ckptio
