// Restore into a sharding (RestoreOptions::sharding): the part of
// CheckpointManager::restore that runs once the step is chosen, its index
// parsed, the leaves selected and checked against the template.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"
#include "ckptio/storage.h"

namespace ckptio {

// Memory bounds of the executor. Fixed in the library; tests lower them to
// exercise many batches on small arrays.
struct ShardedRestoreLimits {
  uint64_t batch_bytes = 256ull << 20;    // bytes requested per batch
  uint64_t staging_bytes = 128ull << 20;  // staged bytes per batch (two batches in flight)
};
ShardedRestoreLimits& sharded_restore_limits();

// Fills out->leaves (one Tensor per selected leaf, device_shards only) and
// out->stats (all but `seconds`). `step_dir` is the step's directory
// ("run-5"); the data files are `step_dir + "/" + ShardRecord::file`.
Status restore_sharded(Storage& storage, const std::string& step_dir, int64_t step,
                       const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                       const RestoreOptions& options, RestoredState* out);

}  // namespace ckptio
