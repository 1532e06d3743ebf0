#include "src/save/build_index.h"

#include <map>
#include <string>
#include <utility>

#include "src/util/clock.h"

namespace ckptio {

Index build_index(const SaveJob& job, const std::vector<uint32_t>& crcs) {
  BuiltIndex b = build_index(job);
  for (size_t k = 0; k < crcs.size(); ++k) *b.crc_of[k] = crcs[k];
  return std::move(b.index);
}

BuiltIndex build_index(const SaveJob& job) {
  BuiltIndex built;
  Index& index = built.index;
  index.step = job.step;
  index.created_unix_ns = job.created_unix_ns;
  index.committed_unix_ns = unix_ns_now();
  index.metadata_json = job.options.metadata_json.empty() ? "{}" : job.options.metadata_json;
  for (size_t f = 0; f < job.plan.files.size(); ++f)
    index.files.push_back({job.data_files[f], job.plan.files[f].size});
  // Every leaf, in the caller's order, also one without shards (a process
  // of a multi-process save that writes none of it; a zero-size leaf).
  std::map<std::string, size_t> prefix_at;
  std::vector<std::pair<size_t, size_t>> where(job.leaves.size());  // (prefix, leaf) positions
  size_t p = 0;  // the prefix of the leaf before: leaves come in runs of one prefix
  for (size_t i = 0; i < job.leaves.size(); ++i) {
    const LeafView& leaf = job.leaves[i];
    if (index.prefixes.empty() || index.prefixes[p].name != leaf.prefix) {
      auto [it, fresh] = prefix_at.emplace(leaf.prefix, index.prefixes.size());
      if (fresh) index.prefixes.push_back(PrefixRecord{leaf.prefix, {}});
      p = it->second;
    }
    auto& leaves = index.prefixes[p].leaves;
    where[i] = {p, leaves.size()};
    leaves.push_back(LeafRecord{leaf.path, leaf.dtype, leaf.shape, {}, {}});
  }
  for (const PlannedShard& ps : job.plan.shards) {
    const LeafView& leaf = job.leaves[ps.leaf];
    ShardRecord rec;
    rec.box = leaf.shards[ps.shard].box;
    rec.file = job.data_files[ps.file];
    rec.offset = ps.offset - job.plan.files[ps.file].start;
    rec.length = ps.length;
    index.prefixes[where[ps.leaf].first].leaves[where[ps.leaf].second].shards.push_back(std::move(rec));
  }
  // Every vector is final now: the records stay where they are.
  built.crc_of.reserve(job.plan.shards.size());
  std::vector<size_t> next_shard(job.leaves.size(), 0);
  for (const PlannedShard& ps : job.plan.shards)
    built.crc_of.push_back(
        &index.prefixes[where[ps.leaf].first].leaves[where[ps.leaf].second].shards[next_shard[ps.leaf]++].crc32c);
  return built;
}

}  // namespace ckptio
