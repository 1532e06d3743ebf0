// The index: strict parsing and serialization of the per-step commit record.
// docs/format.md is the contract this file implements.
//
// parse_index first tries the fast reader (below, "The fast reader"), which
// takes the plain form that serialize_index writes and gives up on anything
// else; then the strict reader, described here. Neither builds a JSON tree.
//
// The strict reader streams:
//   1. The raw bytes are screened: the size limit, then nesting depth by a
//      plain byte scan, so hostile nesting is refused before any JSON code
//      sees it.
//   2. nlohmann's SAX parser (iterative, UTF-8 checking) feeds IndexReader,
//      which keeps a stack of frames that know where they are in the schema
//      ("a shard's box", "a leaf's shape"). Each value is checked and stored
//      into the Index as it arrives; each object is checked when it closes
//      (required fields; a leaf's boxes, lengths and exact cover); shard ->
//      file references are checked when the document closes, since "files"
//      may come after "prefixes". Duplicate keys are refused (nlohmann's own
//      DOM parser would keep the last one silently). User metadata is written
//      straight to its canonical text; unknown fields are checked for
//      well-formedness and dropped.
// So memory is the Index itself plus the text, and a hostile document fails
// at the first value that is out of place instead of after it has been
// materialized (a tree of "[],[],..." costs ~20x its size in memory).
// No exception escapes: nlohmann reports syntax errors to the handler,
// nothing here throws on purpose, and the entry points catch what is left
// (allocation failure).
#include "ckptio/index.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "src/async.h"
#include "src/index_readers.h"
#include "src/json_scan.h"
#include "src/position_table.h"

namespace ckptio {
namespace {

// Scalars arrive from the SAX parser as nlohmann values; containers are
// stood for by an empty object or array of the same type.
using Json = nlohmann::ordered_json;

// ---- Messages ---------------------------------------------------------------

// Text from the input, made safe and short for a message: control bytes (and,
// with `ascii`, every non-ASCII byte) become \xNN, and long text is cut at a
// UTF-8 boundary.
std::string for_message(std::string_view s, bool ascii = false, size_t max = 120) {
  bool cut = false;
  if (s.size() > max) {
    size_t n = max;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    s = s.substr(0, n);
    cut = true;
  }
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F || (ascii && c >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  if (cut) out += "...";
  return out;
}

std::string quote_name(std::string_view s) { return "\"" + for_message(s) + "\""; }

std::string describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case Json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case Json::value_t::number_float: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());
      return std::string("the non-integer ") + buf;
    }
    case Json::value_t::string: return "a string";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    default: return "a non-JSON value";
  }
}

// ---- Stage 1: byte screening ------------------------------------------------

// The size limit, then nesting by find_excess_depth (src/json_scan.h).
// The deepest nesting parse_index accepts whatever IndexLimits::max_depth says.
constexpr uint32_t kMaxSupportedDepth = 1000;

// ---- JSON text --------------------------------------------------------------

// Appends `s` as a JSON string, escaped as nlohmann-json escapes it (so that
// canonical metadata is what nlohmann's dump() would print). Bytes >= 0x80
// are copied as they are: valid UTF-8 stays valid, and invalid UTF-8 makes
// the output unparsable on purpose (see serialize_index in the header).
void append_string(std::string& out, std::string_view s) {
  out.reserve(out.size() + s.size() + 2);  // one allocation for a long string, quotes included
  out += '"';
  while (!s.empty()) {
    // The run of bytes that need no escape, in one append.
    size_t run = 0;
    while (run < s.size() && static_cast<unsigned char>(s[run]) >= 0x20 && s[run] != '"' && s[run] != '\\') ++run;
    out.append(s.data(), run);
    if (run == s.size()) break;
    const auto c = static_cast<unsigned char>(s[run]);
    s.remove_prefix(run + 1);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      }
    }
  }
  out += '"';
}

// A scalar in canonical form: integers in decimal ("-0" becomes 0), floats
// as nlohmann prints them (shortest text that reads back to the same double).
void append_scalar(std::string& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::string: append_string(out, v.get_ref<const std::string&>()); break;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    default: out += v.dump(); break;  // null, true, false, floats (finite: the lexer refuses others)
  }
}

// ---- Scalar checks ----------------------------------------------------------

// Integers only: nlohmann reports 1.5, 1e3 and anything beyond uint64 as
// floats, which are refused here. "-0" arrives as a signed zero and is 0.
bool as_u64(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() == 0) {
    *out = 0;
    return true;
  }
  return false;
}

std::string expected(const char* what, const Json& v) {
  return std::string("expected ") + what + ", got " + describe(v);
}

bool is_flat_name(std::string_view name) {
  return is_safe_relative_name(name) && name.find('/') == std::string_view::npos;
}

// Elements in a box already known to lie inside a shape whose size fits.
uint64_t box_volume(const Box& box) {
  uint64_t n = 1;
  for (size_t d = 0; d < box.rank(); ++d) n *= static_cast<uint64_t>(box.stop[d] - box.start[d]);
  return n;
}

// A problem found in a record after it closed: where, relative to the
// record ("shards[3].box.stop[1]"), and what.
struct Problem {
  std::string where;
  std::string what;
};

std::optional<Problem> check_exact_cover(const LeafRecord& leaf, bool partial);

// ---- Record checks, shared by both readers ----------------------------------
//
// Each returns the first problem of a record, its location relative to the
// record, or nothing. The strict reader turns a problem into its error; the
// fast reader (below) gives the text to the strict reader instead.

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
                                        const std::vector<size_t>* known = nullptr) {
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
  if (n >= kTwoThreads) other = try_async([&] { return scan(2, 1); });
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
          return "prefixes." + for_message(p.name) + "[" + std::to_string(i) + "].shards[" + std::to_string(j) + "]";
        };
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

// ---- Stage 2: the streaming reader ------------------------------------------

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
constexpr FieldSpec kSchema[] = {
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

bool has_schema(Kind k) {
  return k == Kind::kRoot || k == Kind::kFile || k == Kind::kLeaf || k == Kind::kShard ||
         k == Kind::kBox;
}

Field find_field(Kind kind, std::string_view name) {
  for (const FieldSpec& s : kSchema)
    if (s.kind == kind && s.name == name) return s.field;
  return kNoField;
}

// Keys of one object, for refusing duplicates: a short list scanned
// linearly (nearly every object), a hash set once it grows.
class KeySet {
 public:
  bool insert(const std::string& key) {  // false if already present
    if (!big_) {
      for (const auto& k : small_)
        if (k == key) return false;
      if (small_.size() < kLinear) {
        small_.push_back(key);
        return true;
      }
      big_ = std::make_unique<std::unordered_set<std::string>>(small_.begin(), small_.end());
      small_.clear();
    }
    return big_->insert(key).second;
  }

 private:
  static constexpr size_t kLinear = 16;
  std::vector<std::string> small_;
  std::unique_ptr<std::unordered_set<std::string>> big_;
};

// One open object or array.
struct Frame {
  Kind kind = Kind::kSkip;
  bool is_object = false;
  bool has_key = false;    // objects: a member's key was read, its value not finished
  Field field = kNoField;  // objects: that member, if the schema knows it
  size_t count = 0;        // members or elements so far
  uint32_t seen = 0;       // schema objects: bit per Field seen
  std::string key;         // objects: that member's key (for locations)
  KeySet other_keys;       // objects: keys outside the schema
};

class IndexReader final : public nlohmann::json_sax<Json> {
 public:
  // kIndex reads a whole index; kMetadata reads a metadata object alone
  // (check_metadata_json, serialize_index) into canonical text.
  enum class Mode { kIndex, kMetadata };

  IndexReader(Mode mode, const IndexLimits& limits, uint32_t max_depth)
      : mode_(mode), limits_(limits), max_depth_(max_depth) {}

  const Status& error() const { return error_; }
  Index take_index() { return std::move(index_); }
  std::string take_metadata() { return std::move(metadata_); }

  bool null() override { return value(Json(nullptr)); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override { return value(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool string(string_t& v) override { return value(Json(std::move(v))); }
  bool binary(binary_t&) override { return fail_here("binary values are not JSON"); }
  bool start_object(std::size_t) override { return value(Json(Json::value_t::object)); }
  bool start_array(std::size_t) override { return value(Json(Json::value_t::array)); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override;
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override;

 private:
  bool value(Json&& v);
  bool accept(Frame& f, Json& v, Kind* child);
  bool accept_root(Frame& f, Json& v, Kind* child);
  bool accept_leaf(Frame& f, Json& v, Kind* child);
  bool accept_shard(Frame& f, Json& v, Kind* child);
  bool accept_coordinate(Frame& f, const Json& v, std::vector<int64_t>* out, size_t limit);
  bool accept_metadata(Frame& f, const Json& v);
  bool push(Kind kind, bool is_object);
  bool close();
  bool finish(const Frame& f);
  bool finish_files();
  bool finish_leaf();
  bool finish_leaves();
  bool finish_root();

  bool get_u64(const Json& v, uint64_t* out);
  bool get_nonneg_i64(const Json& v, int64_t* out);
  bool get_string(Json& v, std::string* out);
  bool want(const Json& v, bool is_object, Kind kind, Kind* child);

  LeafRecord& leaf() { return index_.prefixes.back().leaves.back(); }
  ShardRecord& shard() { return leaf().shards.back(); }

  std::string location(bool container) const;
  bool fail_here(const std::string& what) { return fail_where(location(false), what); }
  bool fail_container(const std::string& what) { return fail_where(location(true), what); }
  bool fail_at(std::string_view suffix, const std::string& what);
  bool fail_where(std::string where, const std::string& what);

  const Mode mode_;
  const IndexLimits limits_;
  const uint32_t max_depth_;
  std::vector<Frame> stack_;
  Index index_;
  std::string metadata_;  // canonical text of the metadata object being read
  uint64_t num_leaves_ = 0;
  uint64_t total_bytes_ = 0;
  std::unordered_map<std::string_view, size_t> files_;  // name -> position, once "files" closed
  Status error_;
};

// ---- Locations and failures ----

// The location of the value being read: for each open container, the key or
// index of the child that is open (or, innermost, of the value coming). With
// `container`, the innermost array's index is left out: the array itself.
std::string IndexReader::location(bool container) const {
  std::string s;
  for (size_t i = 0; i < stack_.size(); ++i) {
    const Frame& f = stack_[i];
    const bool innermost = i + 1 == stack_.size();
    if (!f.is_object) {
      if (!(innermost && container))
        s += "[" + std::to_string(innermost ? f.count : f.count - 1) + "]";
    } else if (f.has_key) {
      if (!s.empty()) s += '.';
      s += for_message(f.key);
    }
  }
  return s;
}

bool IndexReader::fail_at(std::string_view suffix, const std::string& what) {
  std::string where = location(true);
  if (where.empty() && !suffix.empty() && suffix[0] == '.') suffix.remove_prefix(1);
  return fail_where(where + std::string(suffix), what);
}

// Index locations start at the top ("prefixes.model"); a metadata text read
// on its own names itself ("metadata.a").
bool IndexReader::fail_where(std::string where, const std::string& what) {
  const char* root = mode_ == Mode::kIndex ? "index" : "metadata";
  if (where.empty()) where = root;
  else if (mode_ == Mode::kMetadata) where = std::string(root) + (where[0] == '[' ? "" : ".") + where;
  error_ = data_loss(where + ": " + what);
  return false;
}

bool IndexReader::parse_error(std::size_t position, const std::string&,
                              const nlohmann::detail::exception& ex) {
  // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep the reason.
  std::string_view what = ex.what();
  if (auto p = what.find("] "); p != std::string_view::npos) what.remove_prefix(p + 2);
  return fail_here("invalid JSON at byte " + std::to_string(position) + ": " +
                   for_message(what, /*ascii=*/true, 300));
}

// ---- Events ----

bool IndexReader::key(string_t& k) {
  Frame& f = stack_.back();
  ++f.count;
  f.key = std::move(k);
  f.has_key = true;
  f.field = kNoField;
  if (has_schema(f.kind)) {
    f.field = find_field(f.kind, f.key);
    if (f.field != kNoField) {
      const uint32_t bit = 1u << f.field;
      if (f.seen & bit) return fail_here("duplicate key");
      f.seen |= bit;
      return true;
    }
  }
  if (f.count > limits_.max_object_members)
    return fail_container("more than " + std::to_string(limits_.max_object_members) + " members in one object");
  if (!f.other_keys.insert(f.key)) return fail_here("duplicate key");
  if (f.kind == Kind::kMetadata) {
    if (f.count > 1) metadata_ += ',';
    append_string(metadata_, f.key);
    metadata_ += ':';
  } else if (f.kind == Kind::kPrefixes) {
    f.has_key = false;  // the name is wrong, not its value: report at "prefixes"
    if (f.key.empty()) return fail_here("empty prefix name");
    if (!is_safe_relative_name(f.key)) return fail_here("unsafe prefix name " + quote_name(f.key));
    f.has_key = true;
    index_.prefixes.emplace_back().name = f.key;
  }
  return true;
}

// Every value, scalar or container, at the place the stack says. `v` is a
// temporary of ours: strings may be moved out of it.
bool IndexReader::value(Json&& v) {
  Kind child = Kind::kSkip;
  if (stack_.empty()) {  // the document's value
    if (!v.is_object()) return fail_here(expected("an object", v));
    if (mode_ == Mode::kMetadata) metadata_ += '{';
    return push(mode_ == Mode::kIndex ? Kind::kRoot : Kind::kMetadata, true);
  }
  Frame& f = stack_.back();
  if (!accept(f, v, &child)) return false;
  if (!f.is_object) ++f.count;
  if (v.is_structured()) return push(child, v.is_object());
  f.has_key = false;
  return true;
}

bool IndexReader::push(Kind kind, bool is_object) {
  // Stage 1 has bounded depth already; this keeps the reader safe on its own.
  if (stack_.size() >= max_depth_) return fail_here("nesting deeper than " + std::to_string(max_depth_));
  Frame& f = stack_.emplace_back();
  f.kind = kind;
  f.is_object = is_object;
  return true;
}

bool IndexReader::close() {
  if (!finish(stack_.back())) return false;
  const Frame& f = stack_.back();
  if (f.kind == Kind::kMetadata) metadata_ += f.is_object ? '}' : ']';
  stack_.pop_back();
  if (stack_.empty()) return true;
  Frame& parent = stack_.back();
  if (parent.kind == Kind::kRoot && parent.field == kMetadataField)
    index_.metadata_json = std::move(metadata_);
  parent.has_key = false;
  return true;
}

// ---- Values, by where they are ----

bool IndexReader::get_u64(const Json& v, uint64_t* out) {
  return as_u64(v, out) || fail_here(expected("a non-negative integer", v));
}

bool IndexReader::get_nonneg_i64(const Json& v, int64_t* out) {
  uint64_t u;
  if (!get_u64(v, &u)) return false;
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return fail_here(std::to_string(u) + " is larger than " +
                     std::to_string(std::numeric_limits<int64_t>::max()));
  *out = static_cast<int64_t>(u);
  return true;
}

bool IndexReader::get_string(Json& v, std::string* out) {
  if (!v.is_string()) return fail_here(expected("a string", v));
  *out = std::move(v.get_ref<std::string&>());
  return true;
}

// A container of the given type, whose children are read as `kind`.
bool IndexReader::want(const Json& v, bool is_object, Kind kind, Kind* child) {
  if (is_object ? !v.is_object() : !v.is_array())
    return fail_here(expected(is_object ? "an object" : "an array", v));
  *child = kind;
  return true;
}

bool IndexReader::accept(Frame& f, Json& v, Kind* child) {
  if (f.is_object && f.field == kNoField && f.kind != Kind::kMetadata && f.kind != Kind::kPrefixes)
    return true;  // an unknown member, or inside one: *child stays kSkip
  switch (f.kind) {
    case Kind::kRoot: return accept_root(f, v, child);
    case Kind::kFiles:
      if (!want(v, true, Kind::kFile, child)) return false;
      index_.files.emplace_back();
      return true;
    case Kind::kFile:
      if (f.field == kName) return get_string(v, &index_.files.back().name);
      return get_u64(v, &index_.files.back().size);
    case Kind::kPrefixes: return want(v, false, Kind::kLeaves, child);
    case Kind::kLeaves:
      if (!want(v, true, Kind::kLeaf, child)) return false;
      if (num_leaves_++ == limits_.max_leaves)
        return fail_container("the index holds more than the limit of " +
                              std::to_string(limits_.max_leaves) + " leaves");
      index_.prefixes.back().leaves.emplace_back();
      return true;
    case Kind::kLeaf: return accept_leaf(f, v, child);
    case Kind::kShape: return accept_coordinate(f, v, &leaf().shape, limits_.max_rank);
    case Kind::kShards:
      if (!want(v, true, Kind::kShard, child)) return false;
      if (f.count == limits_.max_shards_per_leaf)
        return fail_container("more than the limit of " +
                              std::to_string(limits_.max_shards_per_leaf) + " shards");
      leaf().shards.emplace_back();
      return true;
    case Kind::kShard: return accept_shard(f, v, child);
    case Kind::kBox: return want(v, false, f.field == kStartField ? Kind::kStart : Kind::kStop, child);
    case Kind::kStart: return accept_coordinate(f, v, &shard().box.start, limits_.max_rank);
    case Kind::kStop: return accept_coordinate(f, v, &shard().box.stop, limits_.max_rank);
    case Kind::kMetadata:
      *child = Kind::kMetadata;
      return accept_metadata(f, v);
    case Kind::kSkip: return true;
  }
  return true;
}

bool IndexReader::accept_root(Frame& f, Json& v, Kind* child) {
  switch (f.field) {
    case kFormat: {
      std::string format;
      if (!get_string(v, &format)) return false;
      if (format != kIndexFormat)
        return fail_here(quote_name(format) + " is not \"" + kIndexFormat + "\"");
      return true;
    }
    case kVersion:
      if (!v.is_number_unsigned() || v.get<uint64_t>() != static_cast<uint64_t>(kIndexVersion))
        return fail_here("unsupported version " +
                         (v.is_string() ? quote_name(v.get_ref<const std::string&>()) : describe(v)) +
                         " (this reader understands " + std::to_string(kIndexVersion) + ")");
      return true;
    case kStep: return get_nonneg_i64(v, &index_.step);
    case kCreatedNs: return get_nonneg_i64(v, &index_.created_unix_ns);
    case kCommittedNs: return get_nonneg_i64(v, &index_.committed_unix_ns);
    case kCreatedAt:
    case kCommittedAt:
      // For humans; the integers are authoritative.
      return v.is_string() || fail_here(expected("a string", v));
    case kMetadataField:
      if (!want(v, true, Kind::kMetadata, child)) return false;
      metadata_ = "{";
      return true;
    case kFilesField: return want(v, false, Kind::kFiles, child);
    case kPrefixesField: return want(v, true, Kind::kPrefixes, child);
    default: return true;
  }
}

bool IndexReader::accept_leaf(Frame& f, Json& v, Kind* child) {
  switch (f.field) {
    case kPath: {
      std::string& path = leaf().path;
      if (!get_string(v, &path)) return false;
      if (path.empty()) return fail_here("empty leaf path");
      if (path.find('\0') != std::string::npos) return fail_here("leaf path contains NUL");
      return true;
    }
    case kDtype: {
      std::string name;
      if (!get_string(v, &name)) return false;
      auto dt = parse_dtype(name);
      if (!dt) return fail_here("unknown dtype " + quote_name(name));
      leaf().dtype = *dt;
      return true;
    }
    case kShapeField: return want(v, false, Kind::kShape, child);
    case kShardsField: return want(v, false, Kind::kShards, child);
    default: return true;
  }
}

bool IndexReader::accept_shard(Frame& f, Json& v, Kind* child) {
  switch (f.field) {
    case kBoxField: return want(v, true, Kind::kBox, child);
    case kFileField: return get_string(v, &shard().file);
    case kOffset: return get_u64(v, &shard().offset);
    case kLength: return get_u64(v, &shard().length);
    case kCrc: {
      uint64_t crc;
      if (!get_u64(v, &crc)) return false;
      if (crc > UINT32_MAX) return fail_here(std::to_string(crc) + " is larger than 4294967295");
      shard().crc32c = static_cast<uint32_t>(crc);
      return true;
    }
    default: return true;
  }
}

// A shape dimension or box coordinate. At most `limit` of them: a box's rank
// is compared with its leaf's when the leaf closes (the shape may come later).
bool IndexReader::accept_coordinate(Frame& f, const Json& v, std::vector<int64_t>* out,
                                    size_t limit) {
  if (f.count == limit)
    return fail_container("rank larger than the limit of " + std::to_string(limit));
  int64_t x;
  if (!get_nonneg_i64(v, &x)) return false;
  out->push_back(x);
  return true;
}

bool IndexReader::accept_metadata(Frame& f, const Json& v) {
  if (!f.is_object && f.count > 0) metadata_ += ',';
  if (v.is_object()) metadata_ += '{';
  else if (v.is_array()) metadata_ += '[';
  else append_scalar(metadata_, v);
  return true;
}

// ---- Records, as they close ----

bool IndexReader::finish(const Frame& f) {
  if (has_schema(f.kind))
    for (const FieldSpec& s : kSchema)
      if (s.kind == f.kind && s.required && !(f.seen & (1u << s.field)))
        return fail_at("." + std::string(s.name), "missing");
  switch (f.kind) {
    case Kind::kFile:
      if (auto p = check_file_name(index_.files.back())) return fail_at(p->where, p->what);
      return true;
    case Kind::kFiles: return finish_files();
    case Kind::kLeaf: return finish_leaf();
    case Kind::kLeaves: return finish_leaves();
    case Kind::kRoot: return mode_ == Mode::kIndex ? finish_root() : true;
    default: return true;
  }
}

// The file table: names are final now (the vector no longer grows), so the
// map can hold views of them.
bool IndexReader::finish_files() {
  if (auto p = check_file_table(index_.files, &files_)) return fail_at(p->where, p->what);
  return true;
}

// Everything about a leaf that needs its shape and dtype, which may come
// after its shards.
bool IndexReader::finish_leaf() {
  if (auto p = check_leaf(leaf(), limits_.partial_cover, &total_bytes_)) return fail_at(p->where, p->what);
  return true;
}

bool IndexReader::finish_leaves() {
  if (auto p = check_leaf_paths(index_.prefixes.back().leaves)) return fail_at(p->where, p->what);
  return true;
}

// Shard -> file references: "files" may follow "prefixes" in the text.
bool IndexReader::finish_root() {
  if (auto p = check_shard_files(index_, files_)) return fail_at(p->where, p->what);
  return true;
}

// Runs the reader over `text` after the byte screening of stage 1.
Status read_json(std::string_view text, uint64_t max_bytes, uint32_t max_depth, IndexReader* reader,
                 const char* root) {
  if (text.size() > max_bytes)
    return data_loss(std::string(root) + ": " + std::to_string(text.size()) +
                     " bytes, larger than the limit of " + std::to_string(max_bytes));
  if (size_t at = find_excess_depth(text, max_depth); at != std::string_view::npos)
    return data_loss(std::string(root) + ": JSON nesting deeper than " + std::to_string(max_depth) +
                     " at byte " + std::to_string(at));
  const char* begin = text.data();
  if (!Json::sax_parse(begin, begin + text.size(), reader)) {
    if (!reader->error().ok()) return reader->error();
    return data_loss(std::string(root) + ": invalid JSON");
  }
  return Status::OK();
}

// User metadata alone, as canonical text. The object sits one level inside
// the index object, so it may nest one level less.
Result<std::string> read_metadata(std::string_view text, const IndexLimits& limits = {}) {
  const uint32_t depth = std::min(limits.max_depth, kMaxSupportedDepth) - 1;
  IndexReader reader(IndexReader::Mode::kMetadata, limits, depth);
  CKPTIO_RETURN_IF_ERROR(read_json(text, limits.max_bytes, depth, &reader, "metadata"));
  return reader.take_metadata();
}

// ---- The fast reader ----------------------------------------------------------
//
// parse_index tries this reader first. It reads the plain form of an index,
// the one serialize_index writes (members in any order, any JSON
// whitespace): strings of printable ASCII without escapes, numbers that are
// unsigned integers, only the schema's members. It stores straight into the
// Index, with no JSON values in between, and runs the record checks above.
// At any surprise - anything else in the text, a duplicate or missing
// member, a limit reached, a failed check - it gives up, and the strict
// reader reads the text from the start and names the problem. The metadata
// object is handed whole to the strict reader (its end found by
// end_of_container, src/json_scan.h), which writes its canonical text. So
// it never takes what the strict reader refuses and gives the same Index;
// fuzz/index_fuzz.cc checks that on every input. Beyond the Index it keeps a
// hash per leaf of the prefix being read and a FileRun per run of shards
// naming one file (so the duplicate-path and shard-file checks need not walk
// every record again, cold, after the read).
// `build/bin/micro_bench --benchmark_filter=IndexParse` (100,000 leaves,
// 24.5 MB): 273 ms for the strict reader, 67 ms for this one.
//
// Two threads read a large index (kSplitBytes and up): a helper reads leaves
// from a split point near the middle (the first '{"path"' after it) while
// this thread reads from the start. When this thread arrives exactly at the
// split point, about to read a leaf of a prefix's array, the text from there
// is the helper's run of leaves, token for token; it takes the helper's
// leaves (or gives up if the helper did: it would have failed on the same
// token) and goes on after them. Limits that count across leaves (leaves,
// total bytes) are checked when the runs join. If it never arrives there
// (the point lay in metadata, a file name, ...), the helper's work is
// dropped. Either way the result is the one-thread result; the fuzzer and
// IndexReaders tests force split points to check that.
//
// A text may also be read while it arrives (parse_index_arriving): the
// first part is in, the rest is brought in by the helper before it reads
// its run. The split point then lies in the first part, and this thread
// reads only the first part (text_ and end_ end there) until it takes the
// helper's run, after which the whole text is in. A text that would make it
// read beyond (not what serialize_index writes) fails the fast reader.

class FastReader {
 public:
  explicit FastReader(const IndexLimits& limits) : limits_(limits) {}

  static constexpr size_t kSplitBytes = 1u << 20;
  static constexpr size_t kNoSplit = std::string_view::npos;

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

  // False: not taken (the strict reader decides). `split`: where a helper
  // reads leaves (kNoSplit: none; default: near the middle of a large text).
  // `arriving`: see above; when all of the text is in already, it is read
  // as any text and rest() is left to the caller.
  bool read(std::string_view text, Index* out, std::optional<size_t> split = std::nullopt,
            Arriving* arriving = nullptr) {
    if (text.size() > limits_.max_bytes || limits_.max_depth < kSchemaDepth ||
        limits_.max_depth > kMaxSupportedDepth)
      return false;
    text_ = whole_ = text;
    p_ = text.data();
    end_ = p_ + text.size();
    if (arriving && arriving->loaded < text.size()) {
      const std::string_view first = text.substr(0, arriving->loaded);
      start_helper(split                           ? *split
                   : text.size() >= kSplitBytes ? first.rfind("{\"path\"")  // the last leaf that is in
                                                : kNoSplit,
                   arriving);
      if (split_) {
        text_ = first;  // until the helper's run is taken
        end_ = first.data() + first.size();
      } else if (!arriving->bring()) {  // no split point in the first part, or no thread: all of it now
        return false;
      }
    } else {
      start_helper(split ? *split : text.size() >= kSplitBytes ? text.find("{\"path\"", text.size() / 2) : kNoSplit);
    }
    if (!read_root()) return false;
    if (text_.size() != whole_.size()) {  // done before taking the helper's run, which is dropped:
      split_ = nullptr;                   // what follows must be in before it is checked
      (void)helper_.get();
      if (!arriving->bring()) return false;
      text_ = whole_;
      end_ = whole_.data() + whole_.size();
    }
    skip_space();
    if (p_ != end_) return false;
    std::unordered_map<std::string_view, size_t> files;
    if (check_file_table(index_.files, &files)) return false;
    for (const FileRun& r : file_runs_) {  // check_shard_files, by runs
      auto it = files.find(r.name);
      if (it == files.end() || r.end > index_.files[it->second].size) return false;
    }
    *out = std::move(index_);
    return true;
  }

 private:
  // Root, prefixes, leaves, leaf, shards, shard, box, coordinates.
  static constexpr uint32_t kSchemaDepth = 8;

  // Shards naming one file one after another (in the text), and the
  // furthest byte they reach: what check_shard_files checks, without a
  // second pass over every shard.
  struct FileRun {
    std::string_view name;  // in the text
    uint64_t end = 0;
  };

  // ---- The helper ----

  struct Run {
    bool ok = false;
    std::vector<LeafRecord> leaves;
    std::vector<size_t> path_hashes;
    std::vector<FileRun> file_runs;
    const char* end = nullptr;  // after the last leaf
    uint64_t total_bytes = 0;
  };

  void start_helper(size_t at, Arriving* arriving = nullptr) {
    if (at >= text_.size()) return;
    split_ = text_.data() + at;
    helper_ = try_async([limits = limits_, text = text_, from = split_, arriving] {
      if (arriving && !arriving->bring()) return Run{};
      FastReader h(limits);
      h.text_ = h.whole_ = text;
      h.p_ = from;
      h.end_ = text.data() + text.size();
      Run run;
      run.ok = h.read_leaf_run(&run.leaves);
      run.end = h.p_;
      run.total_bytes = h.total_bytes_;
      run.path_hashes = std::move(h.path_hashes_);
      run.file_runs = std::move(h.file_runs_);
      return run;
    });
    if (!helper_.valid()) split_ = nullptr;  // no thread to be had: one thread reads all
  }
  // `leaf (, leaf)*`, as a prefix's array holds them; stops before what
  // follows the last leaf.
  bool read_leaf_run(std::vector<LeafRecord>* leaves) {
    do {
      if (leaves->size() >= limits_.max_leaves || !read_leaf(leaves->emplace_back())) return false;
      skip_space();
    } while (p_ < end_ && *p_ == ',' && (++p_, true));
    return true;
  }
  // At the split point, at a leaf of `leaves`: the helper's run joins them.
  bool take_helper_run(std::vector<LeafRecord>* leaves) {
    split_ = nullptr;
    Run run = helper_.get();
    text_ = whole_;  // all in now, if it was arriving
    end_ = whole_.data() + whole_.size();
    if (!run.ok || run.leaves.empty()) return false;
    if (run.leaves.size() > limits_.max_leaves - std::min(limits_.max_leaves, num_leaves_)) return false;
    if (__builtin_add_overflow(total_bytes_, run.total_bytes, &total_bytes_)) return false;
    num_leaves_ += run.leaves.size();
    leaves->reserve(leaves->size() + run.leaves.size());
    std::move(run.leaves.begin(), run.leaves.end(), std::back_inserter(*leaves));
    path_hashes_.insert(path_hashes_.end(), run.path_hashes.begin(), run.path_hashes.end());
    file_runs_.insert(file_runs_.end(), run.file_runs.begin(), run.file_runs.end());
    p_ = run.end;
    return true;
  }

  // ---- Tokens ----

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool eat(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // A string of printable ASCII without escapes.
  bool text(std::string_view* out) {
    if (!eat('"')) return false;
    const char* begin = p_;
    for (; p_ < end_; ++p_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = std::string_view(begin, static_cast<size_t>(p_++ - begin));
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
    }
    return false;
  }
  bool text(std::string* out) {
    std::string_view s;
    if (!text(&s)) return false;
    out->assign(s);
    return true;
  }
  // An unsigned integer as JSON writes one (no leading zero, no fraction or
  // exponent: the strict reader calls those floats).
  bool u64(uint64_t* out) {
    skip_space();
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    const bool zero = *p_ == '0';
    uint64_t v = 0;
    const char* begin = p_;
    for (; p_ < end_ && *p_ >= '0' && *p_ <= '9'; ++p_)
      if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<uint64_t>(*p_ - '0'), &v))
        return false;
    if (zero && p_ - begin > 1) return false;
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
    *out = v;
    return true;
  }
  bool i64(int64_t* out) {
    uint64_t u;
    if (!u64(&u) || u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  // The members of an object: member(key) reads each value.
  template <class F>
  bool object(F&& member) {
    if (!eat('{')) return false;
    if (eat('}')) return true;
    do {
      std::string_view key;
      if (!text(&key) || !eat(':') || !member(key)) return false;
    } while (eat(','));
    return eat('}');
  }
  template <class F>
  bool array(F&& element) {
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      if (!element()) return false;
    } while (eat(','));
    return eat(']');
  }
  // Each member once; `bit` is its place in `*seen`.
  static bool once(uint32_t* seen, uint32_t bit) {
    if (*seen & bit) return false;
    *seen |= bit;
    return true;
  }
  // Into `out` (empty), with one allocation of the exact size for up to
  // eight coordinates: push_back would allocate 1, 2, 4, ... elements, and
  // a leaf has three such lists (shape, box start and stop).
  bool coordinates(std::vector<int64_t>* out) {
    int64_t first[8];
    size_t n = 0;
    const bool ok = array([&] {
      int64_t c;
      if (n == limits_.max_rank || !i64(&c)) return false;
      if (n < std::size(first)) {
        first[n++] = c;
        return true;
      }
      if (n++ == std::size(first)) out->assign(first, first + std::size(first));
      out->push_back(c);
      return true;
    });
    if (ok && n <= std::size(first)) out->assign(first, first + n);
    return ok;
  }

  // ---- Records ----

  bool read_root() {
    uint32_t seen = 0;
    const bool ok = object([&](std::string_view key) {
      std::string_view s;
      uint64_t version;
      if (key == "format") return once(&seen, 1) && text(&s) && s == kIndexFormat;
      if (key == "version")
        return once(&seen, 2) && u64(&version) && version == static_cast<uint64_t>(kIndexVersion);
      if (key == "step") return once(&seen, 4) && i64(&index_.step);
      if (key == "created_unix_ns") return once(&seen, 8) && i64(&index_.created_unix_ns);
      if (key == "committed_unix_ns") return once(&seen, 16) && i64(&index_.committed_unix_ns);
      if (key == "metadata") return once(&seen, 32) && read_metadata_member();
      if (key == "files") return once(&seen, 64) && read_files();
      if (key == "prefixes") return once(&seen, 128) && read_prefixes();
      if (key == "created_at") return once(&seen, 256) && text(&s);
      if (key == "committed_at") return once(&seen, 512) && text(&s);
      return false;
    });
    return ok && (seen & 255) == 255;
  }

  bool read_metadata_member() {
    skip_space();
    if (p_ == end_ || *p_ != '{') return false;
    const size_t at = static_cast<size_t>(p_ - text_.data());
    const size_t end = end_of_container(text_, at);
    if (end == std::string_view::npos) return false;
    auto canonical = read_metadata(text_.substr(at, end - at), limits_);
    if (!canonical.ok()) return false;
    index_.metadata_json = std::move(canonical).value();
    p_ = text_.data() + end;
    return true;
  }

  bool read_files() {
    return array([&] {
      DataFileRecord& file = index_.files.emplace_back();
      uint32_t seen = 0;
      return object([&](std::string_view key) {
               if (key == "name") return once(&seen, 1) && text(&file.name);
               if (key == "size") return once(&seen, 2) && u64(&file.size);
               return false;
             }) &&
             seen == 3 && !check_file_name(file);
    });
  }

  bool read_prefixes() {
    return object([&](std::string_view name) {
      // Prefixes are few: duplicates by a scan; many go to the strict reader.
      if (name.empty() || !is_safe_relative_name(name) || index_.prefixes.size() >= 64 ||
          index_.prefixes.size() >= limits_.max_object_members)
        return false;
      for (const PrefixRecord& p : index_.prefixes)
        if (p.name == name) return false;
      PrefixRecord& prefix = index_.prefixes.emplace_back();
      prefix.name.assign(name);
      path_hashes_.clear();
      return array([&] {
               if (split_) {
                 skip_space();
                 if (p_ == split_) return take_helper_run(&prefix.leaves);
               }
               return num_leaves_++ < limits_.max_leaves && read_leaf(prefix.leaves.emplace_back());
             }) &&
             path_hashes_.size() == prefix.leaves.size() && !check_leaf_paths(prefix.leaves, &path_hashes_);
    });
  }

  bool read_leaf(LeafRecord& leaf) {
    uint32_t seen = 0;
    return object([&](std::string_view key) {
             std::string_view s;
             if (key == "path") {
               if (!once(&seen, 1) || !text(&s) || s.empty()) return false;
               leaf.path.assign(s);
               path_hashes_.push_back(hash_names(s));
               return true;
             }
             if (key == "dtype") {
               if (!once(&seen, 2) || !text(&s)) return false;
               auto dt = parse_dtype(s);
               if (!dt) return false;
               leaf.dtype = *dt;
               return true;
             }
             if (key == "shape") return once(&seen, 4) && coordinates(&leaf.shape);
             if (key == "shards")
               return once(&seen, 8) && array([&] {
                        return leaf.shards.size() < limits_.max_shards_per_leaf &&
                               read_shard(leaf.shards.emplace_back());
                      });
             return false;
           }) &&
           seen == 15 && !check_leaf(leaf, limits_.partial_cover, &total_bytes_);
  }

  bool read_shard(ShardRecord& shard) {
    uint32_t seen = 0;
    std::string_view file;
    uint64_t end;
    return object([&](std::string_view key) {
             uint64_t crc;
             if (key == "box") return once(&seen, 1) && read_box(shard.box);
             if (key == "file") {
               if (!once(&seen, 2) || !text(&file)) return false;
               shard.file.assign(file);
               return true;
             }
             if (key == "offset") return once(&seen, 4) && u64(&shard.offset);
             if (key == "length") return once(&seen, 8) && u64(&shard.length);
             if (key == "crc32c") {
               if (!once(&seen, 16) || !u64(&crc) || crc > UINT32_MAX) return false;
               shard.crc32c = static_cast<uint32_t>(crc);
               return true;
             }
             return false;
           }) &&
           seen == 31 && !__builtin_add_overflow(shard.offset, shard.length, &end) && note_file_run(file, end);
  }
  bool note_file_run(std::string_view file, uint64_t end) {
    if (file_runs_.empty() || file_runs_.back().name != file) file_runs_.push_back(FileRun{file, end});
    else file_runs_.back().end = std::max(file_runs_.back().end, end);
    return true;
  }

  bool read_box(Box& box) {
    uint32_t seen = 0;
    return object([&](std::string_view key) {
             if (key == "start") return once(&seen, 1) && coordinates(&box.start);
             if (key == "stop") return once(&seen, 2) && coordinates(&box.stop);
             return false;
           }) &&
           seen == 3;
  }

  const IndexLimits limits_;
  std::string_view text_;   // what this thread may read: the whole text, or its first part while it arrives
  std::string_view whole_;  // the whole text
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  Index index_;
  uint64_t num_leaves_ = 0;
  uint64_t total_bytes_ = 0;
  std::vector<size_t> path_hashes_;  // of the leaves of the prefix being read (check_leaf_paths)
  std::vector<FileRun> file_runs_;
  const char* split_ = nullptr;  // while the helper's run is not taken
  std::future<Run> helper_;      // joined at the latest when this reader goes
};

// ---- Exact cover ------------------------------------------------------------
//
// The non-empty shard boxes of a leaf must partition its shape. Every box is
// already inside the shape, so that holds exactly when their volumes sum to
// the leaf's and no two of them intersect. The intersection test picks an
// algorithm by how many dimensions the boxes actually split (dimensions that
// every box spans whole cannot separate two boxes):
//   - few boxes: pairwise;
//   - one split dimension: sort by start, compare neighbours, O(n log n);
//   - two: sweep along one with an ordered set of the other's intervals,
//     O(n log n);
//   - three or more: mark the cells of the coordinate-compressed grid. Grid
//     layouts (what sharding produces) have exactly n cells; irregular
//     layouts beyond kMaxGridCells cells are refused as unverifiable.

constexpr size_t kPairwiseBoxes = 16;
constexpr uint64_t kMaxGridCells = 1ull << 27;  // a 16 MiB bitmap

struct OverlapCheck {
  enum Kind { kNone, kOverlap, kTooIrregular } kind = kNone;
  size_t a = 0, b = 0;  // positions in the box list, for kOverlap
};

bool intersects(const Box& x, const Box& y) {
  for (size_t d = 0; d < x.rank(); ++d)
    if (std::max(x.start[d], y.start[d]) >= std::min(x.stop[d], y.stop[d])) return false;
  return true;
}

OverlapCheck overlap_pairwise(const std::vector<const Box*>& boxes) {
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j)
      if (intersects(*boxes[i], *boxes[j])) return {OverlapCheck::kOverlap, i, j};
  return {};
}

OverlapCheck overlap_1d(const std::vector<const Box*>& boxes, size_t d) {
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return boxes[x]->start[d] < boxes[y]->start[d]; });
  for (size_t i = 1; i < order.size(); ++i)
    if (boxes[order[i - 1]]->stop[d] > boxes[order[i]]->start[d])
      return {OverlapCheck::kOverlap, order[i - 1], order[i]};
  return {};
}

// Sweeps dimension x; the boxes open at each x must have disjoint y
// intervals, kept in a map from y start to box.
OverlapCheck overlap_2d(const std::vector<const Box*>& boxes, size_t x, size_t y) {
  struct Event {
    int64_t at;
    bool open;  // closes sort first: boxes are half-open
    size_t box;
  };
  std::vector<Event> events;
  events.reserve(2 * boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    events.push_back({boxes[i]->start[x], true, i});
    events.push_back({boxes[i]->stop[x], false, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& p, const Event& q) {
    return p.at != q.at ? p.at < q.at : p.open < q.open;
  });
  std::map<int64_t, size_t> open;
  for (const Event& e : events) {
    const Box& b = *boxes[e.box];
    if (!e.open) {
      open.erase(b.start[y]);
      continue;
    }
    auto next = open.lower_bound(b.start[y]);
    if (next != open.end() && next->first < b.stop[y])
      return {OverlapCheck::kOverlap, next->second, e.box};
    if (next != open.begin()) {
      auto prev = std::prev(next);
      if (boxes[prev->second]->stop[y] > b.start[y])
        return {OverlapCheck::kOverlap, prev->second, e.box};
    }
    open.emplace_hint(next, b.start[y], e.box);
  }
  return {};
}

OverlapCheck overlap_grid(const std::vector<const Box*>& boxes, const Shape& shape,
                          const std::vector<size_t>& dims) {
  const size_t r = dims.size();
  std::vector<std::vector<int64_t>> cuts(r);
  uint64_t cells = 1;
  for (size_t k = 0; k < r; ++k) {
    auto& c = cuts[k];
    c.reserve(2 * boxes.size() + 2);
    c.push_back(0);
    c.push_back(shape[dims[k]]);
    for (const Box* b : boxes) {
      c.push_back(b->start[dims[k]]);
      c.push_back(b->stop[dims[k]]);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (__builtin_mul_overflow(cells, c.size() - 1, &cells) || cells > kMaxGridCells)
      return {OverlapCheck::kTooIrregular};
  }
  std::vector<uint64_t> marked((cells + 63) / 64);
  std::vector<size_t> lo(r), hi(r), idx(r);
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t k = 0; k < r; ++k) {
      const auto& c = cuts[k];
      lo[k] = std::lower_bound(c.begin(), c.end(), boxes[i]->start[dims[k]]) - c.begin();
      hi[k] = std::lower_bound(c.begin(), c.end(), boxes[i]->stop[dims[k]]) - c.begin();
    }
    idx = lo;
    while (true) {  // every cell of the box, odometer order
      uint64_t cell = 0;
      for (size_t k = 0; k < r; ++k) cell = cell * (cuts[k].size() - 1) + idx[k];
      uint64_t& word = marked[cell / 64];
      const uint64_t bit = 1ull << (cell % 64);
      if (word & bit) {  // find who marked it first: one linear scan
        for (size_t j = 0; j < i; ++j)
          if (intersects(*boxes[j], *boxes[i])) return {OverlapCheck::kOverlap, j, i};
        return {OverlapCheck::kOverlap, i, i};  // unreachable
      }
      word |= bit;
      size_t k = r;
      while (k > 0 && ++idx[k - 1] == hi[k - 1]) {
        idx[k - 1] = lo[k - 1];
        --k;
      }
      if (k == 0) break;
    }
  }
  return {};
}

OverlapCheck find_overlap(const std::vector<const Box*>& boxes, const Shape& shape) {
  if (boxes.size() <= kPairwiseBoxes) return overlap_pairwise(boxes);
  std::vector<size_t> split;  // dimensions some box does not span whole
  for (size_t d = 0; d < shape.size(); ++d)
    for (const Box* b : boxes)
      if (b->start[d] != 0 || b->stop[d] != shape[d]) {
        split.push_back(d);
        break;
      }
  switch (split.size()) {
    case 0: return {OverlapCheck::kOverlap, 0, 1};  // all whole; n > 1
    case 1: return overlap_1d(boxes, split[0]);
    case 2: return overlap_2d(boxes, split[0], split[1]);
    default: return overlap_grid(boxes, shape, split);
  }
}

std::optional<Problem> check_exact_cover(const LeafRecord& leaf, bool partial) {
  const uint64_t volume = *checked_num_bytes(leaf.shape);  // fits: checked with the itemsize
  if (leaf.shards.size() == 1 && box_volume(leaf.shards[0].box) == volume) return std::nullopt;
  uint64_t covered = 0;
  std::vector<const Box*> boxes;
  std::vector<size_t> shard_of;  // box list position -> shard index
  for (size_t i = 0; i < leaf.shards.size(); ++i) {
    const uint64_t v = box_volume(leaf.shards[i].box);
    if (v == 0) continue;
    if (__builtin_add_overflow(covered, v, &covered) || covered > volume)
      return Problem{"[" + std::to_string(i) + "]",
                     "shards overlap: the boxes up to here hold more than the leaf's " +
                         std::to_string(volume) + " elements"};
    boxes.push_back(&leaf.shards[i].box);
    shard_of.push_back(i);
  }
  if (covered < volume && !partial)
    return Problem{"", "shards leave a hole: their boxes hold " + std::to_string(covered) +
                           " of the leaf's " + std::to_string(volume) + " elements"};
  const OverlapCheck o = find_overlap(boxes, leaf.shape);
  switch (o.kind) {
    case OverlapCheck::kNone: return std::nullopt;
    case OverlapCheck::kOverlap:
      return Problem{"[" + std::to_string(shard_of[o.b]) + "]",
                     "box overlaps that of shards[" + std::to_string(shard_of[o.a]) +
                         (partial ? "]" : "] (and so the shards leave a hole too)")};
    case OverlapCheck::kTooIrregular:
      return Problem{"", "shard layout too irregular to verify: its compressed grid has more than " +
                             std::to_string(kMaxGridCells) + " cells"};
  }
  return std::nullopt;
}


// ---- Serialization ----------------------------------------------------------

// RFC 3339 UTC with nanoseconds, from Unix nanoseconds (days-to-civil after
// Howard Hinnant's algorithm).
std::string rfc3339(int64_t unix_ns) {
  constexpr int64_t kNs = 1'000'000'000, kDay = 86'400;
  int64_t secs = unix_ns / kNs, frac = unix_ns % kNs;
  if (frac < 0) frac += kNs, --secs;
  int64_t days = secs / kDay, sod = secs % kDay;
  if (sod < 0) sod += kDay, --days;
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  const int64_t y = yoe + era * 400 + (m <= 2);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04" PRId64 "-%02" PRId64 "-%02" PRId64 "T%02" PRId64 ":%02" PRId64
                ":%02" PRId64 ".%09" PRId64 "Z",
                y, m, d, sod / 3600, sod / 60 % 60, sod % 60, frac);
  return buf;
}

// Decimal, without a temporary string (the index of a large state holds
// millions of numbers).
template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_ints(std::string& out, const std::vector<int64_t>& v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    append_int(out, v[i]);
  }
  out += ']';
}

// The metadata object, compact; or, when metadata_json is not acceptable,
// that text as a JSON string, which every reader refuses.
std::string metadata_text(const std::string& metadata_json) {
  auto canonical = read_metadata(metadata_json);
  if (canonical.ok()) return std::move(canonical).value();
  std::string s;
  append_string(s, metadata_json);
  return s;
}

void append_shard(std::string& out, const ShardRecord& s) {
  out += "{\"box\": {\"start\": ";
  append_ints(out, s.box.start);
  out += ", \"stop\": ";
  append_ints(out, s.box.stop);
  out += "}, \"file\": ";
  append_string(out, s.file);
  out += ", \"offset\": ";
  append_int(out, s.offset);
  out += ", \"length\": ";
  append_int(out, s.length);
  out += ", \"crc32c\": ";
  append_int(out, s.crc32c);
  out += '}';
}

void append_leaf(std::string& out, const LeafRecord& leaf) {
  out += "      {\"path\": ";
  append_string(out, leaf.path);
  out += ", \"dtype\": ";
  append_string(out, dtype_name(leaf.dtype));
  out += ", \"shape\": ";
  append_ints(out, leaf.shape);
  out += ", \"shards\": [";
  for (size_t i = 0; i < leaf.shards.size(); ++i) {
    out += i ? ",\n        " : "\n        ";
    append_shard(out, leaf.shards[i]);
  }
  out += leaf.shards.empty() ? "]}" : "\n      ]}";
}

// At least the size of the index's text (a string escapes to at most 6
// bytes a byte, an integer is at most 20 digits and a sign; the metadata's
// canonical text is taken at 6 bytes a byte too, and a text that outgrew
// the bound would only grow as any string does): reserved at once, the text
// is never copied as it grows, and pages never written are never touched.
// At 100,000 leaves that takes a third off the time to serialize
// (bench/micro_bench BM_IndexSerialize: 43.7 -> 28.8 ms).
size_t text_bound(const Index& index) {
  size_t n = 1024 + 6 * index.metadata_json.size();
  for (const auto& f : index.files) n += 64 + 6 * f.name.size();
  for (const PrefixRecord& p : index.prefixes) {
    n += 32 + 6 * p.name.size();
    for (const LeafRecord& leaf : p.leaves) {
      n += 96 + 6 * leaf.path.size() + 23 * leaf.shape.size();
      for (const ShardRecord& sh : leaf.shards)
        n += 192 + 6 * sh.file.size() + 23 * (sh.box.start.size() + sh.box.stop.size());
    }
  }
  return n;
}

std::string serialize(const Index& index) {
  std::string out;
  out.reserve(text_bound(index));
  out += "{\n  \"format\": ";
  append_string(out, kIndexFormat);
  out += ",\n  \"version\": " + std::to_string(kIndexVersion);
  out += ",\n  \"step\": " + std::to_string(index.step);
  out += ",\n  \"created_at\": \"" + rfc3339(index.created_unix_ns) + "\"";
  out += ",\n  \"committed_at\": \"" + rfc3339(index.committed_unix_ns) + "\"";
  out += ",\n  \"created_unix_ns\": " + std::to_string(index.created_unix_ns);
  out += ",\n  \"committed_unix_ns\": " + std::to_string(index.committed_unix_ns);
  out += ",\n  \"metadata\": " + metadata_text(index.metadata_json);
  out += ",\n  \"files\": [";
  for (size_t i = 0; i < index.files.size(); ++i) {
    out += i ? ",\n    {\"name\": " : "\n    {\"name\": ";
    append_string(out, index.files[i].name);
    out += ", \"size\": " + std::to_string(index.files[i].size) + "}";
  }
  out += index.files.empty() ? "]" : "\n  ]";
  out += ",\n  \"prefixes\": {";
  for (size_t p = 0; p < index.prefixes.size(); ++p) {
    const PrefixRecord& prefix = index.prefixes[p];
    out += p ? ",\n    " : "\n    ";
    append_string(out, prefix.name);
    out += ": [";
    for (size_t i = 0; i < prefix.leaves.size(); ++i) {
      out += i ? ",\n" : "\n";
      append_leaf(out, prefix.leaves[i]);
    }
    out += prefix.leaves.empty() ? "]" : "\n    ]";
  }
  out += index.prefixes.empty() ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

}  // namespace

uint64_t LeafRecord::num_bytes() const {
  return checked_num_bytes(shape, dtype_size(dtype)).value_or(UINT64_MAX);
}

uint64_t Index::total_bytes() const {
  uint64_t total = 0;
  for (const auto& p : prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards)
        if (__builtin_add_overflow(total, s.length, &total)) return UINT64_MAX;
  return total;
}

bool is_safe_relative_name(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  if (name.find('\0') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    return false;
  size_t begin = 0;
  while (true) {  // each '/'-separated component
    const size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part = name.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    if (end == name.size()) return true;
    begin = end + 1;
  }
}

namespace index_readers {

Result<Index> read_index_strict(std::string_view json, const IndexLimits& limits) {
  // Serializing metadata back never recurses, but keep a ceiling anyway: a
  // caller's huge max_depth should not become a huge frame stack.
  const uint32_t depth = std::min(limits.max_depth, kMaxSupportedDepth);
  IndexReader reader(IndexReader::Mode::kIndex, limits, depth);
  CKPTIO_RETURN_IF_ERROR(read_json(json, limits.max_bytes, depth, &reader, "index"));
  return reader.take_index();
}

bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out) {
  return FastReader(limits).read(json, out);
}

bool read_index_fast(std::string_view json, const IndexLimits& limits, Index* out, size_t split) {
  return FastReader(limits).read(json, out, split);
}

Result<Index> parse_index_arriving(std::string_view json, size_t loaded, const std::function<Status()>& rest,
                                   const IndexLimits& limits, std::optional<size_t> split) {
  try {
    FastReader::Arriving arriving;
    arriving.loaded = std::min(loaded, json.size());
    arriving.rest = &rest;
    Index index;
    bool taken;
    {
      FastReader reader(limits);
      taken = reader.read(json, &index, split, &arriving);
    }  // (its helper joined)
    if (!arriving.bring()) return arriving.status;
    if (taken) return index;
    return read_index_strict(json, limits);
  } catch (const std::exception& e) {  // allocation failure; nothing else throws
    return Status(Code::kInternal, std::string("parse_index: ") + e.what());
  }
}

}  // namespace index_readers

Result<Index> parse_index(std::string_view json, const IndexLimits& limits) {
  try {
    Index index;
    if (index_readers::read_index_fast(json, limits, &index)) return index;
    return index_readers::read_index_strict(json, limits);
  } catch (const std::exception& e) {  // allocation failure; nothing else throws
    return Status(Code::kInternal, std::string("parse_index: ") + e.what());
  }
}

std::string serialize_index(const Index& index) {
  try {
    return serialize(index);
  } catch (const std::exception&) {
    return std::string();  // allocation failure: an empty text no reader accepts
  }
}

Status check_metadata_json(std::string_view json) {
  try {
    auto canonical = read_metadata(json);
    return canonical.ok() ? Status::OK() : invalid_argument(canonical.status().message());
  } catch (const std::exception& e) {
    return Status(Code::kInternal, std::string("check_metadata_json: ") + e.what());
  }
}

}  // namespace ckptio
