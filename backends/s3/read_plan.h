// How a batch of ranged reads becomes GET requests: requests for adjacent
// bytes of one object are served by one GET that fills their buffers in turn
// (the core asks for each shard on its own, and shards lie back to back in a
// data file), and no GET is longer than `max_get` bytes, so large reads
// still spread over parallel connections.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckptio/storage.h"

namespace ckptio::s3 {

struct RangedGet {
  std::string key;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::span<std::byte>> dst;  // filled in order; sizes add up to length
};

// Pure. Requests are grouped by key and sorted by offset; a request is split
// across GETs where a GET reaches `max_get` (> 0). Zero-length requests need
// no GET. Overlapping requests are each served on their own.
std::vector<RangedGet> plan_gets(std::span<const ReadRequest> requests, uint64_t max_get);

}  // namespace ckptio::s3
