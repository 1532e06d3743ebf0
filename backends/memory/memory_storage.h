// In-memory backend: tests, mem:// URIs, and the base for power-loss
// simulation (backends/fault/fault_storage.h wraps any backend).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ckptio/storage.h"

namespace ckptio {

// An in-process object store. caps: atomic_rename and atomic_exchange true
// (it models a POSIX directory tree well enough for the commit protocol) when
// `posix_like`, else an object store with no rename.
//
// Writes are buffered per WritableObject and published atomically by finish();
// write_async() runs its callback synchronously, on the calling thread, before
// returning. granularity() and alignment() are 1. The write contract is
// enforced to catch core bugs: an overlapping range fails its write (and
// finish) with kInvalidArgument; finish() fails with kInternal unless the
// ranges cover [0, final_size) exactly (no holes, no bytes past the end).
// Keys follow the local backend's rules (no empty or "." components, no
// trailing '/'); a POSIX-like store does not model a file and a directory of
// the same name being exclusive. sync() is a no-op: everything is durable on
// return (use make_fault_storage(), backends/fault/fault_storage.h, to model power
// loss).
std::shared_ptr<Storage> make_memory_storage(bool posix_like = true);

// The process-wide store called `name` (POSIX-like), created on first use and
// kept for the life of the process: the same instance for the same name.
// open_storage("mem://NAME") returns it. Thread-safe.
std::shared_ptr<Storage> memory_storage_named(const std::string& name);

}  // namespace ckptio
