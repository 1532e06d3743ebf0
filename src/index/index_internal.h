// What the files of src/index/ share, private to them: messages that quote
// the input, the JSON string writer, the record checks both readers run,
// the exact-cover check, the strict reader's metadata canonicalizer and the
// fast reader's mode for a text still arriving. docs/format.md is the
// contract they implement; include/ckptio/index.h is the public face and
// src/index/index.cc chooses between the readers.
//
// The files: checks.cc (messages, record checks), cover.cc (exact cover),
// strict_reader.cc (with schema.h, its table of the schema), fast_reader.cc,
// serialize.cc, index.cc (entry points).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckptio/index.h"

namespace ckptio::index_internal {

// ---- Messages (checks.cc) ---------------------------------------------------

// Input text made safe and short for a message (src/util/printable.h, 120
// bytes at most), in double quotes.
std::string quote_name(std::string_view s);

// ---- JSON text and serialization (serialize.cc) -----------------------------

// Appends `s` as a JSON string, escaped as nlohmann-json's dump() escapes it.
void append_string(std::string& out, std::string_view s);
// serialize_index's text; throws only on allocation failure.
std::string serialize(const Index& index);

// ---- Stage 1: byte screening ------------------------------------------------

// The size limit, then nesting by find_excess_depth (src/util/json_scan.h).
// The deepest nesting parse_index accepts whatever IndexLimits::max_depth says.
inline constexpr uint32_t kMaxSupportedDepth = 1000;

// ---- Record checks, shared by both readers (checks.cc, cover.cc) ------------

// A problem found in a record after it closed: where, relative to the
// record ("shards[3].box.stop[1]"), and what.
struct Problem {
  std::string where;
  std::string what;
};

// Elements in a box already known to lie inside a shape whose size fits.
inline uint64_t box_volume(const Box& box) {
  uint64_t n = 1;
  for (size_t d = 0; d < box.rank(); ++d) n *= static_cast<uint64_t>(box.stop[d] - box.start[d]);
  return n;
}

// A data file's name: one safe path component.
std::optional<Problem> check_file_name(const DataFileRecord& f);
// Unique file names; fills `by_name` with views of `files`' names.
std::optional<Problem> check_file_table(const std::vector<DataFileRecord>& files,
                                        std::unordered_map<std::string_view, size_t>* by_name);
// A whole leaf: shape size, boxes, lengths, exact cover; adds to `*total`.
std::optional<Problem> check_leaf(const LeafRecord& l, bool partial, uint64_t* total);
// Unique paths among one prefix's leaves; `known`: their hash_names, if at hand.
std::optional<Problem> check_leaf_paths(const std::vector<LeafRecord>& leaves,
                                        const std::vector<size_t>* known = nullptr);
// Every shard names a listed file and lies inside it (location from the top).
std::optional<Problem> check_shard_files(const Index& index,
                                         const std::unordered_map<std::string_view, size_t>& files);
// The non-empty boxes of a checked leaf partition its shape (or, `partial`, do not overlap).
std::optional<Problem> check_exact_cover(const LeafRecord& leaf, bool partial);

// ---- The strict reader (strict_reader.cc) -----------------------------------

// User metadata alone, as canonical text, or the strict reader's error.
Result<std::string> read_metadata(std::string_view text, const IndexLimits& limits = {});

// ---- The fast reader (fast_reader.cc) ---------------------------------------

// A text whose bytes from `loaded` on are still to come: rest() brings
// them in. Once `called`, `status` is rest()'s.
struct Arriving {
  size_t loaded = 0;
  const std::function<Status()>* rest = nullptr;
  Status status;
  bool called = false;
  bool bring() {
    if (!std::exchange(called, true)) status = (*rest)();
    return status.ok();
  }
};

// The fast reader over `json` as it arrives; false: not taken. Its helper is joined on return.
bool read_index_fast_arriving(std::string_view json, const IndexLimits& limits, Index* out,
                              std::optional<size_t> split, Arriving* arriving);

}  // namespace ckptio::index_internal
