// The index of a save, built from its job's plan.
#pragma once

#include <cstdint>
#include <vector>

#include "ckptio/index.h"
#include "src/save/save_job.h"

namespace ckptio {

// The index with every checksum 0, and where each planned shard's goes.
struct BuiltIndex {
  Index index;
  std::vector<uint32_t*> crc_of;  // per job.plan.shards
};
BuiltIndex build_index(const SaveJob& job);

// The index with `crcs` (per job.plan.shards) filled in.
Index build_index(const SaveJob& job, const std::vector<uint32_t>& crcs);

}  // namespace ckptio
