// Local-disk backend: files under a root directory, data I/O through io_uring.
//
// Writes: O_DIRECT from the core's 4096-aligned staging buffers when the file
// system allows it (else buffered), batched into one ring per object with a
// single completion thread; finish() fsyncs through the ring. Reads: either
// O_DIRECT through the ring, or buffered preads that benefit from kernel
// readahead (StorageOptions::read_mode; the default comes from measurement,
// see README "Benchmarks"). put() writes a temporary file, fsyncs it, renames
// it over the key and fsyncs the directory. rename() of a prefix is a
// directory rename (renameat2 RENAME_NOREPLACE / RENAME_EXCHANGE).
#pragma once

#include <memory>
#include <string>

#include "ckptio/storage.h"

namespace ckptio {

// `root` is created if missing. Fails if it cannot be created or is not a
// directory.
Result<std::shared_ptr<Storage>> make_local_storage(const std::string& root,
                                                    const StorageOptions& options = {});

}  // namespace ckptio
