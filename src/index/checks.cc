// The record checks both index readers run, and the messages that quote
// the input in their errors. docs/format.md is the contract they enforce.
//
// Each check returns the first problem of a record, its location relative
// to the record, or nothing. The strict reader (strict_reader.cc) turns a
// problem into its error; the fast reader (fast_reader.cc) gives the text
// to the strict reader instead. The exact-cover check that check_leaf ends
// with is in cover.cc.
#include <cstdint>
#include <cstdio>
#include <future>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/index/index_internal.h"
#include "src/util/async.h"
#include "src/util/printable.h"
#include "src/util/position_table.h"

namespace ckptio::index_internal {
namespace {

bool is_flat_name(std::string_view name) {
  return is_safe_relative_name(name) && name.find('/') == std::string_view::npos;
}

}  // namespace

// ---- Messages ---------------------------------------------------------------

std::string quote_name(std::string_view s) { return "\"" + printable(s, 120) + "\""; }

// ---- Record checks, shared by both readers ----------------------------------

std::optional<Problem> check_file_name(const DataFileRecord& f) {
  if (is_flat_name(f.name)) return std::nullopt;
  return Problem{".name", "unsafe data file name " + quote_name(f.name) +
                              " (must be one non-empty path component, not \".\" or "
                              "\"..\", without '/', '\\' or NUL)"};
}

// Fills `by_name` (views of the names in `files`, which must not change
// while it is used).
std::optional<Problem> check_file_table(const std::vector<DataFileRecord>& files,
                                        std::unordered_map<std::string_view, size_t>* by_name) {
  by_name->reserve(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    auto [it, fresh] = by_name->emplace(files[i].name, i);
    if (!fresh)
      return Problem{"[" + std::to_string(i) + "].name", "duplicate data file name " + quote_name(files[i].name) +
                                                             " (also files[" + std::to_string(it->second) + "])"};
  }
  return std::nullopt;
}

// A leaf whose fields are all in: shape size, boxes against the shape,
// lengths against the boxes, exact cover. Adds its shard lengths to `total`.
std::optional<Problem> check_leaf(const LeafRecord& l, bool partial, uint64_t* total) {
  const size_t item = dtype_size(l.dtype);
  const size_t rank = l.shape.size();
  if (!checked_num_bytes(l.shape, item))
    return Problem{".shape", shape_to_string(l.shape) + " of \"" + std::string(dtype_name(l.dtype)) +
                                 "\" holds more than 2^64 bytes"};
  for (size_t j = 0; j < l.shards.size(); ++j) {
    const ShardRecord& s = l.shards[j];
    auto at = [j] { return ".shards[" + std::to_string(j) + "]"; };
    for (auto [name, coords] : {std::pair{"start", &s.box.start}, std::pair{"stop", &s.box.stop}})
      if (coords->size() != rank)
        return Problem{at() + ".box." + name, "rank " + std::to_string(coords->size()) +
                                                  " does not match the leaf's rank " + std::to_string(rank)};
    for (size_t d = 0; d < rank; ++d) {
      const std::string dim = "[" + std::to_string(d) + "]";
      if (s.box.start[d] > s.box.stop[d])
        return Problem{at() + ".box.start" + dim, std::to_string(s.box.start[d]) + " is greater than stop" +
                                                      dim + " = " + std::to_string(s.box.stop[d])};
      if (s.box.stop[d] > l.shape[d])
        return Problem{at() + ".box.stop" + dim, std::to_string(s.box.stop[d]) +
                                                     " is beyond the leaf's shape" + dim + " = " +
                                                     std::to_string(l.shape[d])};
    }
    const uint64_t bytes = box_volume(s.box) * item;
    if (s.length != bytes)
      return Problem{at() + ".length",
                     std::to_string(s.length) + ", but the box holds " + std::to_string(bytes) + " bytes"};
    if (__builtin_add_overflow(*total, s.length, total))
      return Problem{at() + ".length", "the index's total of shard lengths overflows 64 bits"};
  }
  if (auto problem = check_exact_cover(l, partial)) return Problem{".shards" + problem->where, problem->what};
  return std::nullopt;
}

// The leaves of one prefix: unique paths. The first duplicate in order is
// reported, with the first leaf of that path. `known`, if given, holds
// hash_names(path) of every leaf, in order (the fast reader hashes each path
// as it reads it, while it is in cache). Many leaves are checked by two
// threads: each looks for duplicates among the paths of one half of the hash
// space (equal paths hash alike, so each duplicate is found by exactly one of
// them); the earlier find wins, which is what one thread would have reported.
std::optional<Problem> check_leaf_paths(const std::vector<LeafRecord>& leaves,
                                        const std::vector<size_t>* known) {
  constexpr size_t kTwoThreads = 32768;
  const size_t n = leaves.size();
  std::vector<size_t> own;
  if (!known) {
    own.resize(n);
    for (size_t i = 0; i < n; ++i) own[i] = hash_names(leaves[i].path);
  }
  const std::vector<size_t>& hashes = known ? *known : own;
  // First i whose path came before (and where), among hashes with `part`.
  struct Found { size_t i = SIZE_MAX, j = 0; };
  auto scan = [&](int parts, int part) {
    PositionTable seen(n);
    for (size_t i = 0; i < n; ++i) {
      if (parts == 2 && static_cast<int>(hashes[i] >> 63) != part) continue;
      size_t& slot = seen.slot(hashes[i], [&](size_t j) { return hashes[j] == hashes[i] && leaves[j].path == leaves[i].path; });
      if (slot != 0) return Found{i, slot - 1};
      slot = i + 1;
    }
    return Found{};
  };
  std::future<Found> other;
  if (n >= kTwoThreads) other = try_async("ckptio-check", [&] { return scan(2, 1); });
  Found found = scan(other.valid() ? 2 : 1, 0);
  if (other.valid()) {
    const Found second = other.get();
    if (second.i < found.i) found = second;
  }
  if (found.i == SIZE_MAX) return std::nullopt;
  return Problem{"[" + std::to_string(found.i) + "].path", "duplicate leaf path " + quote_name(leaves[found.i].path) +
                                                               " (also at [" + std::to_string(found.j) + "])"};
}

// Shard -> file references, and every shard inside its file. The location
// is from the top ("prefixes.model[3].shards[0].file").
std::optional<Problem> check_shard_files(const Index& index,
                                         const std::unordered_map<std::string_view, size_t>& files) {
  const std::string* last = nullptr;
  uint64_t size = 0;
  for (const PrefixRecord& p : index.prefixes)
    for (size_t i = 0; i < p.leaves.size(); ++i)
      for (size_t j = 0; j < p.leaves[i].shards.size(); ++j) {
        const ShardRecord& s = p.leaves[i].shards[j];
        auto at = [&] {
          return "prefixes." + printable(p.name, 120) + "[" + std::to_string(i) + "].shards[" + std::to_string(j) + "]";
        };
        if (s.length == 0 && s.crc32c != 0)
          return Problem{at() + ".crc32c", "an empty shard's checksum is 0, not " + std::to_string(s.crc32c)};
        // Shards of one file come in runs: look a name up when it changes.
        if (!last || s.file != *last) {
          auto it = files.find(s.file);
          if (it == files.end()) return Problem{at() + ".file", quote_name(s.file) + " is not listed in \"files\""};
          last = &s.file;
          size = index.files[it->second].size;
        }
        uint64_t end;
        if (__builtin_add_overflow(s.offset, s.length, &end))
          return Problem{at() + ".offset", "offset + length overflows 64 bits"};
        if (end > size)
          return Problem{at() + ".offset", "bytes [" + std::to_string(s.offset) + ", " + std::to_string(end) +
                                               ") lie beyond the end of " + quote_name(s.file) + " (size " +
                                               std::to_string(size) + ")"};
      }
  return std::nullopt;
}

}  // namespace ckptio::index_internal
