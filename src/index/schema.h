// The index's schema as the strict reader (strict_reader.cc) walks it: where
// a value sits (Kind), the members each object knows (Field, kSchema) and
// which of them are required. docs/format.md §2.1 is the contract; this is
// it as a table.
#pragma once

#include <cstdint>
#include <string_view>

namespace ckptio::index_internal {

// Where a value sits in the schema; decides how it is checked and stored.
enum class Kind : uint8_t {
  kRoot, kFiles, kFile, kPrefixes, kLeaves, kLeaf, kShape, kShards, kShard, kBox, kStart, kStop,
  kMetadata,  // inside the user's metadata: copied to canonical text
  kSkip,      // inside an unknown field: checked for duplicate keys, dropped
};

// The known members of the schema's objects. Values index a bit mask.
enum Field : uint8_t {
  kNoField,  // a member the schema does not know (ignored: forward compatibility)
  kFormat, kVersion, kStep, kCreatedNs, kCommittedNs, kCreatedAt, kCommittedAt, kMetadataField,
  kFilesField, kPrefixesField,
  kName, kSize,
  kPath, kDtype, kShapeField, kShardsField,
  kBoxField, kFileField, kOffset, kLength, kCrc,
  kStartField, kStopField,
};

struct FieldSpec {
  Kind kind;
  std::string_view name;
  Field field;
  bool required;
};

// In the order the writer writes them, which is also the order in which
// missing members are reported.
inline constexpr FieldSpec kSchema[] = {
    {Kind::kRoot, "format", kFormat, true},
    {Kind::kRoot, "version", kVersion, true},
    {Kind::kRoot, "step", kStep, true},
    {Kind::kRoot, "created_at", kCreatedAt, false},
    {Kind::kRoot, "committed_at", kCommittedAt, false},
    {Kind::kRoot, "created_unix_ns", kCreatedNs, true},
    {Kind::kRoot, "committed_unix_ns", kCommittedNs, true},
    {Kind::kRoot, "metadata", kMetadataField, true},
    {Kind::kRoot, "files", kFilesField, true},
    {Kind::kRoot, "prefixes", kPrefixesField, true},
    {Kind::kFile, "name", kName, true},
    {Kind::kFile, "size", kSize, true},
    {Kind::kLeaf, "path", kPath, true},
    {Kind::kLeaf, "dtype", kDtype, true},
    {Kind::kLeaf, "shape", kShapeField, true},
    {Kind::kLeaf, "shards", kShardsField, true},
    {Kind::kShard, "box", kBoxField, true},
    {Kind::kShard, "file", kFileField, true},
    {Kind::kShard, "offset", kOffset, true},
    {Kind::kShard, "length", kLength, true},
    {Kind::kShard, "crc32c", kCrc, true},
    {Kind::kBox, "start", kStartField, true},
    {Kind::kBox, "stop", kStopField, true},
};

inline bool has_schema(Kind k) {
  return k == Kind::kRoot || k == Kind::kFile || k == Kind::kLeaf || k == Kind::kShard ||
         k == Kind::kBox;
}

inline Field find_field(Kind kind, std::string_view name) {
  for (const FieldSpec& s : kSchema)
    if (s.kind == kind && s.name == name) return s.field;
  return kNoField;
}

}  // namespace ckptio::index_internal
