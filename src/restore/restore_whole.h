// Restore of whole leaves (no RestoreOptions::sharding): the part of
// CheckpointManager::restore that runs once the step is chosen, its index
// parsed, the leaves selected and checked against the template. Reads go
// through the read executor (src/restore/read_executor.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/manager.h"
#include "ckptio/storage.h"

namespace ckptio {

// Fills out->leaves (one Tensor per selected leaf, in the order selected)
// and out->stats (all but index_seconds and seconds). `step_dir` is the
// step's directory ("run-5"); `index` is the step's, whose leaf records
// `selected` points into: their paths, shapes and shards are taken from it
// as the leaves complete.
Status restore_whole(Storage& storage, const std::string& step_dir, const Index& index,
                     const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                     const RestoreOptions& options, RestoredState* out);

}  // namespace ckptio
