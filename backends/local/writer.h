// LocalWriter: a WritableObject over one file, data written through the
// Storage's shared Ring. See writer.cc for the durability protocol.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/local/ring.h"
#include "ckptio/storage.h"

namespace ckptio::local {

enum class DirectIo : uint8_t { kAuto, kOn, kOff };
// How create() prepares the file for `size_hint` bytes (see writer.cc).
enum class Prealloc : uint8_t { kNone, kTruncate, kFallocate };

struct WriterOptions {
  DirectIo direct = DirectIo::kAuto;
  uint64_t request_size = 8ull << 20;  // bytes per SQE (a multiple of 4096)
  Prealloc prealloc = Prealloc::kTruncate;
};

// Opens a temporary file beside `path` (whose directory must exist).
Result<std::unique_ptr<WritableObject>> open_writer(std::shared_ptr<Ring> ring, const std::string& path,
                                                    uint64_t size_hint, const WriterOptions& options);

}  // namespace ckptio::local
