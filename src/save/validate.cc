#include "src/save/validate.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "ckptio/index.h"
#include "src/util/position_table.h"

namespace ckptio {

namespace {

bool boxes_intersect(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.stop[d], b.stop[d])) return false;
  return true;
}

Status validate_leaf(const LeafView& leaf, bool partial) {
  // For messages only: built when one is (a state may hold millions of leaves).
  auto name = [&] { return leaf.prefix + "/" + leaf.path; };
  if (leaf.prefix.empty() || leaf.path.empty())
    return invalid_argument("leaf '" + name() + "': prefix and path must be non-empty");
  if (leaf.prefix.find_first_of(std::string("/\\\0", 3)) != std::string::npos ||
      leaf.path.find('\0') != std::string::npos)
    return invalid_argument("leaf '" + name() + "': prefix has '/', '\\' or NUL");
  // What the index reader refuses, refused here and not after every byte is
  // written (the index is parsed back before the commit).
  if (!is_safe_relative_name(leaf.prefix))
    return invalid_argument("leaf '" + name() + "': prefix '" + leaf.prefix + "' is not a safe name");
  if (leaf.shape.size() > IndexLimits{}.max_rank)
    return invalid_argument("leaf '" + name() + "': rank " + std::to_string(leaf.shape.size()) +
                            " is above the index's limit of " + std::to_string(IndexLimits{}.max_rank));
  if (static_cast<int>(leaf.dtype) >= kNumDTypes)
    return invalid_argument("leaf '" + name() + "': unknown dtype");
  auto total = checked_num_bytes(leaf.shape, dtype_size(leaf.dtype));
  if (!total)
    return invalid_argument("leaf '" + name() + "': shape " + shape_to_string(leaf.shape) +
                            " is negative or overflows 64 bits");
  if (leaf.shards.empty() && *total != 0 && !partial)
    return invalid_argument("leaf '" + name() + "' has no shards");
  uint64_t covered = 0;
  for (size_t i = 0; i < leaf.shards.size(); ++i) {
    const Box& b = leaf.shards[i].box;
    if (b.start.size() != leaf.shape.size() || b.stop.size() != leaf.shape.size())
      return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) + ": box rank differs from shape");
    for (size_t d = 0; d < b.rank(); ++d)
      if (b.start[d] < 0 || b.start[d] > b.stop[d] || b.stop[d] > leaf.shape[d])
        return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) +
                                ": box lies outside shape " + shape_to_string(leaf.shape));
    uint64_t bytes = checked_num_bytes(b, dtype_size(leaf.dtype)).value_or(0);
    if (bytes > 0 && leaf.shards[i].data == nullptr)
      return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) + ": null data");
    covered += bytes;
  }
  // Pairwise overlap check: save() receives few shards per leaf per process.
  for (size_t i = 0; i < leaf.shards.size(); ++i)
    for (size_t j = i + 1; j < leaf.shards.size(); ++j)
      if (boxes_intersect(leaf.shards[i].box, leaf.shards[j].box))
        return invalid_argument("leaf '" + name() + "': shards " + std::to_string(i) + " and " +
                                std::to_string(j) + " overlap");
  if (covered != *total && !partial)
    return invalid_argument("leaf '" + name() + "': shards do not cover the whole shape " +
                            shape_to_string(leaf.shape));
  return Status::OK();
}

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF),
// as the index reader demands of every name.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; min = 0x10000; }
    else return false;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

Status validate_leaves(const std::vector<LeafView>& leaves, bool partial) {
  // The names' hashes in one array: a probe compares them before it reads
  // another leaf, whose strings are a cache miss each (at 100,000 leaves
  // most of what this check cost; bench/micro_bench BM_SaveStallTinyLeaves).
  std::vector<size_t> hashes(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafView& leaf = leaves[i];
    if (!valid_utf8(leaf.prefix) || !valid_utf8(leaf.path))
      return invalid_argument("leaf names must be valid UTF-8 (the index stores them as JSON strings)");
    CKPTIO_RETURN_IF_ERROR(validate_leaf(leaf, partial));
    hashes[i] = hash_names(leaf.prefix, leaf.path);
  }
  PositionTable seen(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafView& leaf = leaves[i];
    size_t& slot = seen.slot(hashes[i], [&](size_t j) {
      return hashes[j] == hashes[i] && leaves[j].path == leaf.path && leaves[j].prefix == leaf.prefix;
    });
    if (slot != 0) return invalid_argument("leaf '" + leaf.prefix + "/" + leaf.path + "' appears twice");
    slot = i + 1;
  }
  return Status::OK();
}

}  // namespace ckptio
