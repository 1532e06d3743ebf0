// The read planner: which byte ranges of which data files to read, and where
// each byte goes, to fill a set of target boxes of one leaf from the boxes it
// was saved in. Pure: no I/O, no allocation in proportion to element counts;
// restore (or any other reader) executes the plan. docs/read-planning.md
// explains the algorithm; this header is the contract.
//
// Input is layout-neutral (SavedLeaf: boxes at offsets of numbered files), so
// a second on-disk layout (eformer's TensorStore/zarr chunks, uncompressed)
// can feed the same planner; saved_leaf_from_record() adapts a ckptio index
// leaf.
//
// What a plan promises, for valid input:
//   - every element of every target is delivered exactly once, by a direct
//     read (PlannedRead::target) or by exactly one PlannedCopy;
//   - reads of one file are sorted by offset and pairwise disjoint: no byte
//     is requested twice, even when several targets need it (replicated
//     targets, overlapping targets, or saved pieces that share bytes);
//   - a read is at most max_read bytes; it covers needed bytes plus, at most,
//     gaps of <= max_gap bytes between them and whole pieces widened for
//     verification (PlanOptions::verify_widen_max_bytes);
//   - the plan's size is O(regions * rank + reads * rank), where regions are
//     the non-empty (piece, target) intersections, never O(elements).
//
// Dedupe across targets: a read lands either directly in one target (when
// the read's bytes are exactly one contiguous range of that target: the
// common case when restoring into the saved sharding, or reading a shard
// into a replicated full leaf) or in a staging buffer. Copies then carry its
// bytes to every other place that needs them: replicas copy from the first
// target's landed bytes, so replication costs one read plus memcpys, never
// another read. A needed interval that one target holds contiguously and
// that is at least direct_min_bytes long is read on its own (not coalesced
// with neighbours) so that it can land without a copy.
//
// Checksums: a saved piece's crc32c covers the whole piece, so it can be
// checked only if every byte of the piece is read. The plan marks each piece
// `verifiable` when that is so (reads never skip bytes inside a needed
// interval, and gap filling or other targets may complete a piece). With
// PlanOptions::verify, a partly needed piece of at most verify_widen_max_bytes
// is widened to a whole-piece read so it can be checked: that costs up to
// that many extra bytes per partly needed piece, which is why the threshold
// is small by default; larger pieces read in part are delivered unverified
// (stats.pieces_unverified counts them). Per-block checksums in a later
// format version would remove the trade-off.
//
// Thread safety: plan_reads is a pure function; a ReadPlan is a value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/status.h"
#include "ckptio/types.h"
#include "src/util/box_runs.h"

namespace ckptio {

// One stored box of a leaf, whatever the on-disk layout.
struct SavedPiece {
  Box box;
  uint32_t file = 0;                // the caller's number for the data file / object
  uint64_t offset = 0;              // of the box's first byte (C order) in that file
  uint64_t length = 0;              // elements(box) * element_size
  std::optional<uint32_t> crc32c;   // of all `length` bytes; nullopt if the layout keeps none
};

// A leaf as stored. The non-empty pieces must lie inside `shape`, be
// pairwise disjoint and cover every target; plan_reads checks the first
// exactly and the other two by counting elements per target (kInvalidArgument
// on a hole or an overlap, unless a hole and an overlap cancel out exactly:
// the index parser proves ckptio's exact cover, and chunk grids are disjoint
// by construction). Pieces may share file bytes.
struct SavedLeaf {
  Shape shape;
  size_t element_size = 0;
  std::vector<SavedPiece> pieces;
};

// A ckptio index leaf as a SavedLeaf. File names are numbered in the order
// first seen and appended to *files (which may already hold names from other
// leaves, so one numbering can span a whole step).
SavedLeaf saved_leaf_from_record(const LeafRecord& leaf, std::vector<std::string>* files);

struct PlanOptions {
  // Two needed byte ranges of a file at most this far apart are read as one
  // request, the bytes between them read and discarded. 0: only touching
  // ranges merge. Larger values trade bytes for requests (S3 wants more).
  uint64_t max_gap = 4 << 10;
  // No read is longer than this; longer needed ranges are cut (>= 1).
  uint64_t max_read = 64 << 20;
  // A range one target holds contiguously, at least this long, is read on
  // its own so it lands without a copy (a memcpy costs more than a request).
  uint64_t direct_min_bytes = 256 << 10;
  // Limit on read units (contiguous byte ranges that must be read before
  // coalescing) across the plan, counted before any is listed. Above it the
  // planner reads coarser units: the whole span of the next outer dimension
  // of the regions with the most units, until the count fits (more bytes,
  // never an error). At least one unit per region is always kept.
  uint64_t max_runs = 1 << 20;
  // Widen reads of partly needed pieces of at most verify_widen_max_bytes
  // that carry a checksum to whole pieces, so that they can be verified.
  bool verify = true;
  uint64_t verify_widen_max_bytes = 64 << 10;
};

inline constexpr uint32_t kStaging = UINT32_MAX;

struct PlannedRead {
  uint32_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;  // > 0
  // Where the bytes land: in target `target` at `dst_offset`, or, when
  // target == kStaging, at `dst_offset` of a staging buffer of
  // ReadPlan::staging_bytes (a suggestion: an executor bounding memory may
  // land a staged read anywhere, since copies address it relative to the read).
  uint32_t target = kStaging;
  uint64_t dst_offset = 0;
  // This read's copies: ReadPlan::copies[first_copy, first_copy + num_copies).
  uint32_t first_copy = 0;
  uint32_t num_copies = 0;
};

// A strided copy out of one read's landed bytes into one target: runs of
// `run_bytes` from src_offset (relative to the read's first byte) to
// dst_offset (in the target buffer), repeated over the loops
// ReadPlan::copy_dims[first_dim, first_dim + num_dims), outermost first.
// num_dims == 0 is one plain run.
struct PlannedCopy {
  uint32_t read = 0;
  uint32_t target = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t run_bytes = 0;
  uint32_t first_dim = 0;
  uint32_t num_dims = 0;
};

// Per saved piece, parallel to SavedLeaf::pieces.
struct PieceReads {
  bool needed = false;      // some target needs some of its bytes
  bool verifiable = false;  // every byte of it is read and it has a crc32c
  uint32_t first_read = 0;  // reads overlapping it: [first_read, end_read)
  uint32_t end_read = 0;
};

struct ReadPlanStats {
  uint64_t bytes_needed = 0;     // distinct bytes: elements of the union of targets * size
  uint64_t bytes_delivered = 0;  // sum over targets of their bytes (replicas count each time)
  uint64_t bytes_read = 0;       // sum of read lengths: needed + gaps + widening
  uint64_t requests = 0;         // reads
  uint64_t bytes_direct = 0;     // delivered by reads landing in a target
  uint64_t bytes_copied = 0;     // delivered by copies (bytes_delivered - bytes_direct)
  uint64_t copies = 0;
  uint64_t regions = 0;          // non-empty (piece, target) intersections
  uint64_t units = 0;            // read units after coarsening
  uint64_t regions_coarsened = 0;
  uint64_t pieces_widened = 0;     // partly needed pieces read whole to verify them
  uint64_t pieces_unverified = 0;  // needed pieces with a crc that the plan cannot check
  uint64_t bytes_unverified = 0;   // bytes of those pieces that the reads fetch
};

struct ReadPlan {
  std::vector<PlannedRead> reads;    // sorted by (file, offset); disjoint within a file
  std::vector<PlannedCopy> copies;   // grouped by read, in read order
  std::vector<CopyDim> copy_dims;
  std::vector<PieceReads> pieces;    // parallel to SavedLeaf::pieces
  std::vector<uint64_t> target_bytes;  // size of each target's buffer (C order over its box)
  uint64_t staging_bytes = 0;          // sum of staged reads' lengths
  ReadPlanStats stats;
};

// Plans the reads that fill `targets` (boxes of leaf.shape; any number, may
// overlap or repeat; empty boxes get empty buffers) from `leaf`. Errors
// (kInvalidArgument): element size 0; a box of the wrong rank or outside
// the shape; a piece whose length is not its box's bytes or whose byte range
// overflows; pieces that overlap or do not cover a target; more than
// 2^32 - 1 pieces, targets, reads or copies.
//
// Cost: O(P*T*rank) to intersect P pieces with T targets, O(U log U) for
// U read units (<= max(max_runs, regions)), O(reads * T * rank) to place the
// copies, plus union_elements(targets) for bytes_needed.
Result<ReadPlan> plan_reads(const SavedLeaf& leaf, std::span<const Box> targets,
                            const PlanOptions& options = {});

// Calls f(src_offset, dst_offset, length) for each run of `copy`, offsets as
// in PlannedCopy. O(runs).
template <typename F>
void for_each_copy_run(const ReadPlan& plan, const PlannedCopy& copy, F&& f) {
  if (copy.num_dims == 0) {
    f(copy.src_offset, copy.dst_offset, copy.run_bytes);
    return;
  }
  RunLayout l;
  l.src_base = copy.src_offset;
  l.dst_base = copy.dst_offset;
  l.run_bytes = copy.run_bytes;
  l.dims.assign(plan.copy_dims.begin() + copy.first_dim,
                plan.copy_dims.begin() + copy.first_dim + copy.num_dims);
  for_each_run(l, f);
}

// Executes read `read`'s copies: `landed` is where its bytes are (in its
// target, in staging, anywhere), `targets[t]` the buffer of target t.
void apply_copies(const ReadPlan& plan, size_t read, const std::byte* landed,
                  std::span<std::byte* const> targets);

// Calls f(read_index, offset_in_read, length) for the slices of the reads
// that hold piece `piece`, in order, so a caller can crc32c it streaming.
// Only meaningful when plan.pieces[piece].verifiable.
template <typename F>
void for_each_piece_slice(const ReadPlan& plan, const SavedLeaf& leaf, size_t piece, F&& f) {
  const SavedPiece& p = leaf.pieces[piece];
  const PieceReads& pr = plan.pieces[piece];
  for (uint32_t i = pr.first_read; i < pr.end_read; ++i) {
    const PlannedRead& r = plan.reads[i];
    const uint64_t a = std::max(r.offset, p.offset);
    const uint64_t z = std::min(r.offset + r.length, p.offset + p.length);
    if (a < z) f(static_cast<size_t>(i), a - r.offset, z - a);
  }
}

}  // namespace ckptio
