// The worker's write of one save's data files, from staged chunks or
// straight from the caller's memory, up to durable.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "src/save/buffer_pool.h"
#include "src/save/save_job.h"

namespace ckptio {

// Writes every range of `job` into its data files (created under the stage
// directory with the attempt's names) and makes each file durable
// (WritableObject::finish); `crcs` gets the crc32c of every planned shard.
// `queued` runs once every write is queued and every checksum in `crcs`
// is known, while the writes drain and the files are made durable (not
// after a failure). Borrow mode's handle is released once no write reads
// the caller's memory any more. On failure every file is aborted and the
// error returned. `write_seconds` is set once the files were made durable
// (or one failed to be).
Status write_data(Storage& storage, BufferPool& pool, SaveJob& job, std::vector<uint32_t>& crcs,
                  double& write_seconds, const std::function<void()>& queued = {});

}  // namespace ckptio
