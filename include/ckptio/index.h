// The index: one JSON document per step, the commit record. docs/format.md is
// its contract; this header is its in-memory form.
//
// parse_index() is strict and total: it never crashes, never allocates memory
// in proportion to numbers it reads (only to the bytes it is given, which are
// capped), and every rejection names the JSON location ("prefixes.model[3]
// .shards[0].box"). A parsed Index is internally consistent: shapes fit in 64
// bits, every shard box lies inside its leaf's shape, the shards of a leaf
// cover it exactly once, every shard's length equals its box's bytes and lies
// inside its data file, file names are safe relative names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

inline constexpr const char* kIndexFormat = "ckptio";
inline constexpr int kIndexVersion = 1;
inline constexpr const char* kIndexFileName = "ckptio_index.json";

struct ShardRecord {
  Box box;
  std::string file;     // data file name, relative to the step directory
  uint64_t offset = 0;  // byte offset of the box's C-order bytes in `file`
  uint64_t length = 0;  // == num_elements(box) * dtype_size
  uint32_t crc32c = 0;  // of those `length` bytes (Castagnoli, ISA-L crc32_iscsi)
  bool operator==(const ShardRecord&) const = default;
};

struct LeafRecord {
  std::string path;  // dotted pytree path, unique within its prefix
  DType dtype = DType::kFloat32;
  Shape shape;
  std::vector<ShardRecord> shards;
  // Steps in the eformer / TensorStore zarr v2 layout (Index::layout
  // "eformer", docs/format.md): the text of the leaf's `.zarray`. Each shard
  // is then one stored chunk: `file` its key under the step ("model/w/0.1"),
  // `box` the chunk's part inside the shape, `offset` 0, `length` its stored
  // (compressed) size, no crc32c. Chunks the store lacks have no shard.
  // Empty in ckptio's own layout.
  std::string zarray;
  uint64_t num_bytes() const;  // of the whole leaf (saturates at UINT64_MAX)
  bool operator==(const LeafRecord&) const = default;
};

struct PrefixRecord {
  std::string name;  // "model", "tx", ...
  std::vector<LeafRecord> leaves;
  bool operator==(const PrefixRecord&) const = default;
};

struct DataFileRecord {
  std::string name;
  uint64_t size = 0;
  bool operator==(const DataFileRecord&) const = default;
};

struct Index {
  // "ckptio" (this format) or "eformer" (a step eformer / JAX's TensorStore
  // serialization wrote, read through src/layout/zarr; never serialized).
  std::string layout = "ckptio";
  int64_t step = 0;
  int64_t created_unix_ns = 0;    // when save() was called
  int64_t committed_unix_ns = 0;  // when the index was written (docs/format.md)
  std::string metadata_json = "{}";  // the user's JSON object, serialized
  std::vector<PrefixRecord> prefixes;
  std::vector<DataFileRecord> files;
  uint64_t total_bytes() const;  // sum of shard lengths (saturates at UINT64_MAX)
  bool operator==(const Index&) const = default;  // metadata_json compared as text
};

struct IndexLimits {
  uint64_t max_bytes = 256ull << 20;   // of the JSON text
  uint32_t max_depth = 64;             // JSON nesting
  uint32_t max_rank = 32;
  uint64_t max_leaves = 10'000'000;
  uint64_t max_shards_per_leaf = 1'000'000;
  // Members of any one object outside the schema's own fields (metadata,
  // prefix names, unknown fields): their keys are kept to refuse duplicates,
  // at ~70 bytes each beyond the key, which would otherwise be the reader's
  // largest cost per input byte (7x for an object of short keys).
  uint64_t max_object_members = 1'000'000;
  // A manifest of one process in a multi-process save (src/save/manifest.h): the
  // shards of a leaf must still be disjoint, but may leave holes (other
  // processes write the rest). Never set for a step's index.
  bool partial_cover = false;
};

Result<Index> parse_index(std::string_view json, const IndexLimits& limits = {});

// Writes `index` in the version-1 format of docs/format.md. For an index that
// parse_index accepts back, parse_index(serialize_index(x)) == x provided
// x.metadata_json is in canonical form (what parse_index produces: compact,
// key order kept). A precondition violation is never hidden: invalid
// metadata_json (see check_metadata_json) is written as a JSON string and
// names that are not valid UTF-8 are written raw, so that parse_index rejects
// the result and a writer that parses back before committing fails loudly
// instead of committing a silently altered step.
std::string serialize_index(const Index& index);

// OK if `json` is acceptable as Index::metadata_json: a JSON object, valid
// UTF-8, no duplicate keys, nesting that fits inside an index. Otherwise
// kInvalidArgument naming the problem. Meant for save() to reject bad
// metadata up front.
Status check_metadata_json(std::string_view json);

// Checks a data-file or other relative name: non-empty, no "..", no leading
// '/', no NUL, no backslash, no empty or "." components.
bool is_safe_relative_name(std::string_view name);

}  // namespace ckptio
