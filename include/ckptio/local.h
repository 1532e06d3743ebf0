// Options of the local-disk backend (plain paths and file:///path URIs):
// files under a root directory, data I/O through io_uring. Set them through
// StorageOptions::get<LocalOptions>() (ckptio/storage.h). Zero or empty
// fields mean the measured default (docs/library.md, "Request size, queue
// depth and read mode", says how each was chosen).
#pragma once

#include <cstdint>
#include <string>

namespace ckptio {

struct LocalOptions {
  // "auto" tries O_DIRECT and falls back to buffered I/O where the file
  // system refuses it; "on" fails instead; "off" never uses it.
  std::string direct_io = "auto";
  // Reads: "direct" (O_DIRECT through the ring) or "buffered" (kernel
  // readahead through pread workers); "" picks the default.
  std::string read_mode;
  uint64_t request_size = 0;  // bytes per ring request
  uint32_t queue_depth = 0;   // ring entries in flight
};

}  // namespace ckptio
