// Internals of copy_step (include/ckptio/copy.h), one job per file:
//   copy_index.cc   the destination's index text (data files renamed, every
//                   other byte of meaning kept) and "is this the same step"
//   copy_stream.cc  data files from one storage to another through a few
//                   aligned buffers, checking every shard's crc32c
//   copy.cc         the orchestration: which step, what the destination
//                   holds, attempt, commit, discard
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/copy.h"
#include "ckptio/index.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio {

// ---- copy_index.cc --------------------------------------------------------------

// `index` with every data file name (in `files` and in shards) replaced
// through `renames` (source name -> destination name; every name of `files`
// must be a key).
Index rename_data_files(const Index& index, const std::map<std::string, std::string>& renames);

// The destination's index text: `src_text` (which parses to `src`) with the
// data file names replaced, every other field kept as written, including
// fields this version does not know (format.md §4: unknown fields are
// ignored, and must survive a copy). The result is checked to parse back to
// rename_data_files(src, renames); kInternal otherwise, so a copy never
// commits an index that says something else than the source's.
Result<std::string> rewrite_index_text(std::string_view src_text, const Index& src,
                                       const std::map<std::string, std::string>& renames);

// True if `a` and `b` describe the same step: equal in every field once each
// data file name is replaced by its position in `files`.
bool same_step(const Index& a, const Index& b);

// ---- copy_stream.cc -------------------------------------------------------------

// The request size a copy into `dst` uses: `requested` (0 = 8 MiB) rounded up
// to a multiple of dst.write_granularity() and of 4096.
uint64_t copy_chunk_size(const Storage& dst, uint64_t requested);

struct StreamPlan {
  // Keys of index.files[i] at each end, by position.
  std::vector<std::string> src_keys, dst_keys;
  uint64_t chunk = 0;       // copy_chunk_size()
  uint64_t max_memory = 0;  // at least 2 * chunk
  std::string what;         // "step 12" for messages
  // Data bytes whose write completed so far; on the calling thread. An
  // error stops the copy (what is in flight lands first, then the
  // unfinished objects are aborted).
  std::function<Status(uint64_t done)> on_progress;
};

struct StreamResult {
  uint64_t bytes = 0;
  uint64_t shards = 0;  // verified
};

// Copies every data file of `index` from `src` to `dst` (index.files[i] from
// plan.src_keys[i] to plan.dst_keys[i]), checks every shard's crc32c on the
// way, and finishes (makes durable) each destination object. On error the
// destination objects not finished are aborted; the caller discards the
// attempt (finished ones included). Never returns kNotFound for a source
// object: a data file the index lists is damage (kDataLoss).
Result<StreamResult> stream_data_files(Storage& src, Storage& dst, const Index& index,
                                       const StreamPlan& plan);

}  // namespace ckptio
