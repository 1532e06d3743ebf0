// The strict reader of the index: every valid index, every rejection named
// by its JSON location (index_readers::read_index_strict), and user metadata
// alone as canonical text (read_metadata). docs/format.md is the contract
// this file implements.
//
// parse_index (index.cc) first tries the fast reader (fast_reader.cc), which
// takes the plain form that serialize_index writes and gives up on anything
// else; then this reader. Neither builds a JSON tree.
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
// nothing here throws on purpose, and the entry points (index.cc) catch
// what is left (allocation failure).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/index/index_internal.h"
#include "src/index/index_readers.h"
#include "src/index/schema.h"
#include "src/util/json_scan.h"
#include "src/util/printable.h"

namespace ckptio::index_internal {
namespace {

// Scalars arrive from the SAX parser as nlohmann values; containers are
// stood for by an empty object or array of the same type.
using Json = nlohmann::ordered_json;

// ---- Messages ---------------------------------------------------------------

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

// ---- JSON text --------------------------------------------------------------

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

// ---- Stage 2: the streaming reader ------------------------------------------

// The schema (Kind, Field, kSchema) is in src/index/schema.h.

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
      s += printable(f.key, 120);
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
                   ascii_printable(what, 300));
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

}  // namespace

// User metadata alone, as canonical text. The object sits one level inside
// the index object, so it may nest one level less.
Result<std::string> read_metadata(std::string_view text, const IndexLimits& limits) {
  const uint32_t depth = std::min(limits.max_depth, kMaxSupportedDepth) - 1;
  IndexReader reader(IndexReader::Mode::kMetadata, limits, depth);
  CKPTIO_RETURN_IF_ERROR(read_json(text, limits.max_bytes, depth, &reader, "metadata"));
  return reader.take_metadata();
}

}  // namespace ckptio::index_internal

namespace ckptio::index_readers {

Result<Index> read_index_strict(std::string_view json, const IndexLimits& limits) {
  // Serializing metadata back never recurses, but keep a ceiling anyway: a
  // caller's huge max_depth should not become a huge frame stack.
  using index_internal::IndexReader;
  const uint32_t depth = std::min(limits.max_depth, index_internal::kMaxSupportedDepth);
  IndexReader reader(IndexReader::Mode::kIndex, limits, depth);
  CKPTIO_RETURN_IF_ERROR(index_internal::read_json(json, limits.max_bytes, depth, &reader, "index"));
  return reader.take_index();
}

}  // namespace ckptio::index_readers
