// Copying committed steps between two storages (local disk, S3, memory, in
// any combination), committed at the destination with the same atomicity as
// a save.
//
//   auto src = open_storage("/data/ckpt").value();
//   auto dst = open_storage("s3://bucket/run7").value();
//   CopyStats s = copy_step(*src, *dst, std::nullopt, {}).value();  // the latest
//
// What a copy guarantees:
//   - The source step's index is parsed strictly; a step without an index is
//     kNotFound, a damaged index kDataLoss naming it.
//   - Every shard's crc32c is checked while its bytes stream through; a
//     mismatch is kDataLoss naming prefix/leaf, shard and file, and nothing is
//     committed at the destination. A data file the index lists but the
//     source lacks (or holds short) is kDataLoss too, not kNotFound: the
//     committed step is damaged.
//   - Data files are written under attempt-unique names and the step is
//     committed by the destination's own protocol (src/save/commit.cc: rename on
//     POSIX, index last on object stores). A failure at any point discards the
//     attempt: the destination has no new committed step and its earlier
//     steps are intact.
//   - The committed copy is the same step: the destination index is the
//     source's, field for field (times, metadata, and fields this version of
//     ckptio does not know), except for the data file names, which are
//     renamed to the destination attempt's data-<attempt>-<n>.bin.
//   - Memory stays within CopyOptions::max_memory: data moves through a few
//     4096-aligned buffers, never a whole file.
//
// Thread safety: a copy uses its storages from the calling thread, the
// backends' own threads and, in a conversion (CopyOptions::format), one
// thread of its own that restores the next group of leaves; several copies may run at once (into different
// steps). Like a save from another process, a copy's data objects are
// unreferenced until it commits: do not run `gc` on an object-store
// destination while a copy into it is in flight.
//
// Errors are Status values; nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio {

struct CopyStats {
  int64_t step = 0;
  bool skipped = false;     // skip_identical found it already at the destination
  uint64_t bytes = 0;       // data bytes copied (sum of the data files' sizes)
  uint64_t files = 0;       // data files copied
  uint64_t shards = 0;      // shards whose checksum was verified
  // Of those bytes, read in place out of the page cache (Storage::view_cached:
  // a cached local step converted into another layout), not copied.
  uint64_t bytes_in_place = 0;
  double data_seconds = 0;    // first read to every data file durable
  double commit_seconds = 0;  // index written to step visible
  double seconds = 0;         // the whole copy, including reading the indexes
};

struct CopyOptions {
  // The destination's layout: "" (the source's), "ckptio" or "eformer"
  // (zarr v2 as eformer / TensorStore write it, docs/format.md section 7).
  // A copy into another layout decodes and encodes every leaf
  // (src/copy/convert.h); values stay bit-exact.
  std::string format;
  // zstd level of the chunks a copy into the eformer layout writes.
  int zstd_level = 1;
  // Step directory names at each end (ManagerOptions::step_format).
  std::string src_step_format = "run-{step}";
  std::string dst_step_format = "run-{step}";
  // Replace a step committed at the destination (atomically, as
  // SaveOptions::overwrite does). Without it such a step is kAlreadyExists.
  bool overwrite = false;
  // A step committed at the destination whose index is the source's (same
  // fields, data files of the same sizes; names may differ) is left alone
  // and reported as skipped instead of failing or being copied again.
  bool skip_identical = false;
  // Bytes per read and write request; 0 = 8 MiB. Rounded up to a multiple of
  // the destination's write_granularity() (an S3 part) and of 4096.
  uint64_t chunk_size = 0;
  // Bound on the copy's buffers; at least two chunks must fit (else
  // kInvalidArgument). 0 = 256 MiB.
  uint64_t max_memory = 0;
  // Called on the calling thread as a step's copy advances (first with
  // done = 0): data bytes whose write completed so far, and the step's total.
  // An exception it throws stops the copy (kCancelled, with its message):
  // nothing of the attempt is committed or left behind.
  std::function<void(int64_t step, uint64_t done, uint64_t total)> on_progress;
  // Called on the calling thread after each step copied or skipped. An
  // exception it throws ends the copy with kCancelled (that step stays).
  std::function<void(const CopyStats&)> on_step;
};

// Copies committed step `step` of `src` (nullopt: the latest, i.e. the
// largest step with an index; a damaged latest index is kDataLoss, never
// silently passed over) and commits it at `dst` under the same step number.
// kNotFound: no such step (or none at all) at `src`. kAlreadyExists: the step
// is committed at `dst` and neither `overwrite` nor a matching
// `skip_identical` applies. kInvalidArgument: bad options.
Result<CopyStats> copy_step(Storage& src, Storage& dst, std::optional<int64_t> step,
                            const CopyOptions& options = {});

// Copies every committed step of `src`, oldest first. It first reads every
// source index and every destination index of the same steps, and copies
// nothing if a source index is damaged (kDataLoss) or a step committed at
// the destination differs from the source's (kAlreadyExists, unless
// `overwrite`), naming all of them. Steps already at the destination and
// identical are skipped (skip_identical is implied). Then it copies the rest
// in order and stops at the first failure: the steps copied before it stay
// committed, the failing one is discarded. kNotFound if `src` has no
// committed step. The result has one entry per source step, in order.
Result<std::vector<CopyStats>> copy_all_steps(Storage& src, Storage& dst,
                                              const CopyOptions& options = {});

}  // namespace ckptio
