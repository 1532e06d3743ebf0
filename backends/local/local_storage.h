// Local-disk backend: files under a root directory, data I/O through io_uring.
//
// One io_uring per Storage (backends/local/ring.h), shared by every writer
// and every direct read, with a single completion thread and at most
// queue_depth operations in flight (write_async blocks beyond that).
// Writes: O_DIRECT from 4096-aligned memory (the core's staging buffers, or
// in borrow mode the caller's own arrays) when the file system allows it
// (else buffered; direct_io "on" fails instead), into a temporary beside the
// key, split into request_size SQEs; finish() trims, fsyncs through the ring
// and renames the temporary over the key (writer.cc). write_granularity() is
// 4096 (1 with direct_io "off"), so the core cuts its ranges to 4096 before
// it knows whether a file system will take O_DIRECT. Reads (LocalOptions::read_mode): "direct" = O_DIRECT through
// the ring, zero-copy when dst and offset agree modulo read_alignment() (4096);
// "buffered" = pread()s on a few threads with kernel readahead. Defaults,
// measured on the CI machine (tests/local_storage_test.cc LocalStorageBench):
// read_mode "direct", request_size 8 MiB, queue_depth 32.
// put() writes a temporary file, fsyncs it, renames it over the key and
// fsyncs the directory (local_storage.cc). rename() of a prefix is a
// directory rename (renameat2 RENAME_NOREPLACE / RENAME_EXCHANGE), then an
// fsync of the parent directories.
// list() shows directories as prefixes even when empty (so a dead staging
// directory can be found and removed) and hides the backend's own
// temporaries ("<name>.tmp-ckptio-<16 hex>", see keys.h).
#pragma once

#include <memory>
#include <string>

#include "ckptio/local.h"
#include "ckptio/storage.h"

namespace ckptio {

// `root` is created if missing. Fails if it cannot be created or is not a
// directory.
Result<std::shared_ptr<Storage>> make_local_storage(const std::string& root,
                                                    const LocalOptions& options = {});

}  // namespace ckptio
