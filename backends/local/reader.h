// Reading byte ranges of local files for Storage::read().
//
// Two modes (LocalOptions::read_mode):
//   direct:   O_DIRECT through the shared Ring at queue depth; pieces planned
//             by read_plan.h (zero-copy when dst and offset are congruent
//             modulo 4096, bounce buffers otherwise). Files whose file system
//             refuses O_DIRECT are read buffered through the same ring.
//   buffered: pread() into dst on a few pool threads, in large pieces, so the
//             kernel's readahead streams each piece.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backends/local/pread_pool.h"
#include "backends/local/ring.h"
#include "backends/local/writer.h"
#include "ckptio/storage.h"

namespace ckptio::local {

enum class ReadMode : uint8_t { kDirect, kBuffered };

struct ReadSettings {
  ReadMode mode = ReadMode::kBuffered;
  DirectIo direct_io = DirectIo::kAuto;
  uint64_t request_size = 8ull << 20;   // bytes per ring request / per pread
  uint64_t bounce_budget = 64ull << 20; // scratch bytes in flight per read() call
};

// Reads every request from files under `root`. The first error names the
// file; a range past end of file is kDataLoss; a missing file kNotFound.
Status read_files(const std::string& root, std::span<const ReadRequest> requests,
                  const ReadSettings& settings, Ring& ring, PreadPool& pool);

// Storage::view_cached for the file `key` under `root` (nullptr with
// direct_io kOn, for an empty or irregular file, or when the page cache
// holds less than 90% of it).
Result<std::unique_ptr<ObjectView>> view_cached_file(const std::string& root, const std::string& key,
                                                     DirectIo direct_io);

}  // namespace ckptio::local
