// The index (docs/format.md is its contract): serialization and the strict,
// total parser. Every rejection is Code::kDataLoss (the stored commit record
// is damaged or hostile) with the JSON location in the message.
//
// Memory and stack are bounded before nlohmann-json sees the text: the size
// is capped, and nesting depth is measured by a byte scan first (nlohmann's
// parser recurses per level). Duplicate object keys are caught by the
// parser callback. Nothing is ever allocated in proportion to a number read.
#include "ckptio/index.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <set>
#include <unordered_set>

namespace ckptio {

using json = nlohmann::ordered_json;  // keeps prefixes in the order written

uint64_t LeafRecord::num_bytes() const {
  return checked_num_bytes(shape, dtype_size(dtype)).value_or(0);
}

uint64_t Index::total_bytes() const {
  uint64_t n = 0;
  for (const auto& p : prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards) n += s.length;
  return n;
}

bool is_safe_relative_name(std::string_view name) {
  if (name.empty() || name.size() > 1024 || name.front() == '/') return false;
  if (name.find('\0') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return name.find("..") == std::string_view::npos;
}

// ---- Serialization -------------------------------------------------------------

namespace {

std::string rfc3339(int64_t unix_ns) {
  std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
  int64_t frac = unix_ns % 1000000000;
  if (frac < 0) { frac += 1000000000; --secs; }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[96];
  std::snprintf(out, sizeof out, "%s.%09lldZ", buf, static_cast<long long>(frac));
  return out;
}

json box_json(const Box& b) { return json{{"start", b.start}, {"stop", b.stop}}; }

}  // namespace

std::string serialize_index(const Index& index) {
  json prefixes = json::object();
  for (const PrefixRecord& p : index.prefixes) {
    json leaves = json::array();
    for (const LeafRecord& l : p.leaves) {
      json shards = json::array();
      for (const ShardRecord& s : l.shards)
        shards.push_back(json{{"box", box_json(s.box)}, {"file", s.file}, {"offset", s.offset},
                              {"length", s.length}, {"crc32c", s.crc32c}});
      leaves.push_back(json{{"path", l.path}, {"dtype", std::string(dtype_name(l.dtype))},
                            {"shape", l.shape}, {"shards", std::move(shards)}});
    }
    prefixes[p.name] = std::move(leaves);
  }
  json files = json::array();
  for (const DataFileRecord& f : index.files) files.push_back(json{{"name", f.name}, {"size", f.size}});
  json metadata = json::parse(index.metadata_json, nullptr, /*allow_exceptions=*/false);
  if (!metadata.is_object()) metadata = json::object();
  json doc = {{"format", kIndexFormat},
              {"version", kIndexVersion},
              {"step", index.step},
              {"created_at", rfc3339(index.created_unix_ns)},
              {"committed_at", rfc3339(index.committed_unix_ns)},
              {"created_unix_ns", index.created_unix_ns},
              {"committed_unix_ns", index.committed_unix_ns},
              {"metadata", std::move(metadata)},
              {"files", std::move(files)},
              {"prefixes", std::move(prefixes)}};
  return doc.dump(-1, ' ', false, json::error_handler_t::strict);
}

// ---- Parsing ---------------------------------------------------------------------

namespace {

Status bad(const std::string& where, const std::string& what) {
  return data_loss("index: " + where + ": " + what);
}

// Depth of [ and { outside strings; stops early once past the limit.
bool depth_within(std::string_view text, uint32_t max_depth) {
  uint32_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') { if (++depth > max_depth) return false; }
    else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return true;
}

// Typed field access that names the location on failure.
class Reader {
 public:
  static Result<const json*> field(const json& obj, const std::string& where, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end()) return bad(where, std::string("missing field \"") + key + "\"");
    return &*it;
  }
  static Result<uint64_t> u64(const json& v, const std::string& where) {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer()) {
      int64_t x = v.get<int64_t>();
      if (x >= 0) return static_cast<uint64_t>(x);
    }
    return bad(where, "expected a non-negative integer, got " + type_of(v));
  }
  static Result<int64_t> i64(const json& v, const std::string& where) {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX))
      return static_cast<int64_t>(v.get<uint64_t>());
    return bad(where, "expected a 64-bit integer, got " + type_of(v));
  }
  static Result<std::string> str(const json& v, const std::string& where) {
    if (!v.is_string()) return bad(where, "expected a string, got " + type_of(v));
    return v.get<std::string>();
  }
  static std::string type_of(const json& v) {
    if (v.is_number_float()) return "a non-integer number";
    if (v.is_number()) return "number " + v.dump();
    return v.type_name();
  }
};

Result<std::vector<int64_t>> dims(const json& v, const std::string& where, uint32_t max_rank) {
  if (!v.is_array()) return bad(where, "expected an array, got " + Reader::type_of(v));
  if (v.size() > max_rank) return bad(where, "rank " + std::to_string(v.size()) + " exceeds " + std::to_string(max_rank));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    CKPTIO_ASSIGN_OR_RETURN(uint64_t d, Reader::u64(v[i], where + "[" + std::to_string(i) + "]"));
    if (d > static_cast<uint64_t>(INT64_MAX)) return bad(where + "[" + std::to_string(i) + "]", "too large");
    out.push_back(static_cast<int64_t>(d));
  }
  return out;
}

bool boxes_intersect(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.stop[d], b.stop[d])) return false;
  return true;
}

bool box_empty(const Box& b) {
  for (size_t d = 0; d < b.rank(); ++d)
    if (b.start[d] == b.stop[d]) return true;
  return false;
}

// Shards must cover the leaf exactly once: volumes add up and no two
// non-empty boxes intersect. Pairwise for few shards; for many, the boxes
// must align to a grid of their own cut points, and each grid cell may be
// claimed once (work proportional to the cells, capped).
Status check_exact_cover(const LeafRecord& leaf, const std::string& where) {
  const uint64_t want = checked_num_bytes(leaf.shape).value_or(0);
  uint64_t have = 0;
  for (const auto& s : leaf.shards) {
    uint64_t v = checked_num_bytes(s.box.extent()).value_or(0);
    if (__builtin_add_overflow(have, v, &have)) return bad(where, "shard volumes overflow");
  }
  std::vector<const Box*> boxes;
  for (const auto& s : leaf.shards)
    if (!box_empty(s.box)) boxes.push_back(&s.box);
  const size_t n = boxes.size();
  if (n <= 2048) {
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j)
        if (boxes_intersect(*boxes[i], *boxes[j]))
          return bad(where, "shards overlap (" + std::to_string(i) + " and " + std::to_string(j) + " among non-empty shards)");
  } else {
    const size_t r = leaf.shape.size();
    std::vector<std::vector<int64_t>> cuts(r);
    for (const Box* b : boxes)
      for (size_t d = 0; d < r; ++d) { cuts[d].push_back(b->start[d]); cuts[d].push_back(b->stop[d]); }
    uint64_t cells = 1;
    for (auto& c : cuts) {
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
      if (__builtin_mul_overflow(cells, c.size() - 1, &cells) || cells > 16 * static_cast<uint64_t>(n) + 1024)
        return bad(where, "shard layout is too fragmented to check (" + std::to_string(n) + " shards)");
    }
    std::vector<uint8_t> claimed(cells, 0);
    for (size_t i = 0; i < n; ++i) {
      const Box& b = *boxes[i];
      std::vector<size_t> lo(r), hi(r), idx(r);
      for (size_t d = 0; d < r; ++d) {
        lo[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), b.start[d]) - cuts[d].begin();
        hi[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), b.stop[d]) - cuts[d].begin();
        idx[d] = lo[d];
      }
      for (;;) {
        uint64_t cell = 0;
        for (size_t d = 0; d < r; ++d) cell = cell * (cuts[d].size() - 1) + idx[d];
        if (claimed[cell]++) return bad(where, "shards overlap (shard " + std::to_string(i) + ")");
        size_t d = r;
        while (d > 0 && ++idx[d - 1] == hi[d - 1]) { idx[d - 1] = lo[d - 1]; --d; }
        if (d == 0) break;
      }
    }
  }
  if (have != want)
    return bad(where, "shards cover " + std::to_string(have) + " of " + std::to_string(want) +
                          " elements: they leave holes or overlap");
  return Status::OK();
}

Result<ShardRecord> parse_shard(const json& v, const std::string& where, const LeafRecord& leaf,
                                const std::map<std::string, uint64_t>& files, const IndexLimits& limits) {
  if (!v.is_object()) return bad(where, "expected an object");
  ShardRecord s;
  CKPTIO_ASSIGN_OR_RETURN(const json* box, Reader::field(v, where, "box"));
  if (!box->is_object()) return bad(where + ".box", "expected an object");
  CKPTIO_ASSIGN_OR_RETURN(const json* start, Reader::field(*box, where + ".box", "start"));
  CKPTIO_ASSIGN_OR_RETURN(const json* stop, Reader::field(*box, where + ".box", "stop"));
  CKPTIO_ASSIGN_OR_RETURN(s.box.start, dims(*start, where + ".box.start", limits.max_rank));
  CKPTIO_ASSIGN_OR_RETURN(s.box.stop, dims(*stop, where + ".box.stop", limits.max_rank));
  if (s.box.start.size() != leaf.shape.size() || s.box.stop.size() != leaf.shape.size())
    return bad(where + ".box", "rank differs from the shape's " + std::to_string(leaf.shape.size()));
  for (size_t d = 0; d < leaf.shape.size(); ++d)
    if (s.box.start[d] > s.box.stop[d] || s.box.stop[d] > leaf.shape[d])
      return bad(where + ".box", "dimension " + std::to_string(d) + " [" + std::to_string(s.box.start[d]) + ", " +
                                     std::to_string(s.box.stop[d]) + ") lies outside shape " + shape_to_string(leaf.shape));
  CKPTIO_ASSIGN_OR_RETURN(const json* file, Reader::field(v, where, "file"));
  CKPTIO_ASSIGN_OR_RETURN(s.file, Reader::str(*file, where + ".file"));
  if (!is_safe_relative_name(s.file) || s.file.find('/') != std::string::npos)
    return bad(where + ".file", "unsafe data file name");
  auto f = files.find(s.file);
  if (f == files.end()) return bad(where + ".file", "\"" + s.file + "\" is not listed in \"files\"");
  CKPTIO_ASSIGN_OR_RETURN(const json* off, Reader::field(v, where, "offset"));
  CKPTIO_ASSIGN_OR_RETURN(s.offset, Reader::u64(*off, where + ".offset"));
  CKPTIO_ASSIGN_OR_RETURN(const json* len, Reader::field(v, where, "length"));
  CKPTIO_ASSIGN_OR_RETURN(s.length, Reader::u64(*len, where + ".length"));
  auto want = checked_num_bytes(s.box.extent(), dtype_size(leaf.dtype));
  if (!want || *want != s.length)
    return bad(where + ".length", std::to_string(s.length) + " does not match the box's bytes");
  uint64_t end;
  if (__builtin_add_overflow(s.offset, s.length, &end) || end > f->second)
    return bad(where + ".offset", "range ends past the end of data file \"" + s.file + "\" (" +
                                      std::to_string(f->second) + " bytes)");
  CKPTIO_ASSIGN_OR_RETURN(const json* crc, Reader::field(v, where, "crc32c"));
  CKPTIO_ASSIGN_OR_RETURN(uint64_t c, Reader::u64(*crc, where + ".crc32c"));
  if (c > 0xffffffffull) return bad(where + ".crc32c", "not a 32-bit value");
  s.crc32c = static_cast<uint32_t>(c);
  return s;
}

Result<LeafRecord> parse_leaf(const json& v, const std::string& where,
                              const std::map<std::string, uint64_t>& files, const IndexLimits& limits) {
  if (!v.is_object()) return bad(where, "expected an object");
  LeafRecord leaf;
  CKPTIO_ASSIGN_OR_RETURN(const json* path, Reader::field(v, where, "path"));
  CKPTIO_ASSIGN_OR_RETURN(leaf.path, Reader::str(*path, where + ".path"));
  if (leaf.path.empty() || leaf.path.find('\0') != std::string::npos)
    return bad(where + ".path", "empty or holds NUL");
  const std::string at = where + "(" + leaf.path + ")";
  CKPTIO_ASSIGN_OR_RETURN(const json* dt, Reader::field(v, at, "dtype"));
  CKPTIO_ASSIGN_OR_RETURN(std::string dtype, Reader::str(*dt, at + ".dtype"));
  auto parsed = parse_dtype(dtype);
  if (!parsed) return bad(at + ".dtype", "unknown dtype \"" + dtype + "\"");
  leaf.dtype = *parsed;
  CKPTIO_ASSIGN_OR_RETURN(const json* shape, Reader::field(v, at, "shape"));
  CKPTIO_ASSIGN_OR_RETURN(leaf.shape, dims(*shape, at + ".shape", limits.max_rank));
  if (!checked_num_bytes(leaf.shape, dtype_size(leaf.dtype)))
    return bad(at + ".shape", shape_to_string(leaf.shape) + " overflows 64 bits of bytes");
  CKPTIO_ASSIGN_OR_RETURN(const json* shards, Reader::field(v, at, "shards"));
  if (!shards->is_array()) return bad(at + ".shards", "expected an array");
  if (shards->empty()) return bad(at + ".shards", "a leaf needs at least one shard");
  if (shards->size() > limits.max_shards_per_leaf) return bad(at + ".shards", "too many shards");
  for (size_t i = 0; i < shards->size(); ++i) {
    CKPTIO_ASSIGN_OR_RETURN(ShardRecord s, parse_shard((*shards)[i], at + ".shards[" + std::to_string(i) + "]", leaf, files, limits));
    leaf.shards.push_back(std::move(s));
  }
  CKPTIO_RETURN_IF_ERROR(check_exact_cover(leaf, at + ".shards"));
  return leaf;
}

}  // namespace

Result<Index> parse_index(std::string_view text, const IndexLimits& limits) {
  if (text.size() > limits.max_bytes)
    return bad("$", "index is " + std::to_string(text.size()) + " bytes, over the limit of " +
                        std::to_string(limits.max_bytes));
  if (!depth_within(text, limits.max_depth))
    return bad("$", "JSON nests deeper than " + std::to_string(limits.max_depth) + " levels");

  // Duplicate keys: nlohmann keeps the last silently; the callback sees each
  // key as it is read, with the object it belongs to still open.
  std::vector<std::unordered_set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end: if (!open_objects.empty()) open_objects.pop_back(); break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return bad("$", std::string("not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) return bad("$", "duplicate object key \"" + duplicate + "\"");
  if (!doc.is_object()) return bad("$", "expected an object");

  Index index;
  CKPTIO_ASSIGN_OR_RETURN(const json* format, Reader::field(doc, "$", "format"));
  if (!format->is_string() || format->get<std::string>() != kIndexFormat)
    return bad("format", "unknown format " + format->dump() + " (expected \"ckptio\")");
  CKPTIO_ASSIGN_OR_RETURN(const json* version, Reader::field(doc, "$", "version"));
  if (!version->is_number_integer() || version->get<int64_t>() != kIndexVersion)
    return bad("version", "unsupported version " + version->dump() + " (this reader knows " +
                              std::to_string(kIndexVersion) + ")");
  CKPTIO_ASSIGN_OR_RETURN(const json* step, Reader::field(doc, "$", "step"));
  CKPTIO_ASSIGN_OR_RETURN(index.step, Reader::i64(*step, "step"));
  if (index.step < 0) return bad("step", "negative");
  CKPTIO_ASSIGN_OR_RETURN(const json* created, Reader::field(doc, "$", "created_unix_ns"));
  CKPTIO_ASSIGN_OR_RETURN(index.created_unix_ns, Reader::i64(*created, "created_unix_ns"));
  CKPTIO_ASSIGN_OR_RETURN(const json* committed, Reader::field(doc, "$", "committed_unix_ns"));
  CKPTIO_ASSIGN_OR_RETURN(index.committed_unix_ns, Reader::i64(*committed, "committed_unix_ns"));
  CKPTIO_ASSIGN_OR_RETURN(const json* metadata, Reader::field(doc, "$", "metadata"));
  if (!metadata->is_object()) return bad("metadata", "expected an object");
  index.metadata_json = metadata->dump();

  CKPTIO_ASSIGN_OR_RETURN(const json* files, Reader::field(doc, "$", "files"));
  if (!files->is_array()) return bad("files", "expected an array");
  std::map<std::string, uint64_t> file_sizes;
  for (size_t i = 0; i < files->size(); ++i) {
    const std::string at = "files[" + std::to_string(i) + "]";
    const json& f = (*files)[i];
    if (!f.is_object()) return bad(at, "expected an object");
    DataFileRecord rec;
    CKPTIO_ASSIGN_OR_RETURN(const json* name, Reader::field(f, at, "name"));
    CKPTIO_ASSIGN_OR_RETURN(rec.name, Reader::str(*name, at + ".name"));
    if (!is_safe_relative_name(rec.name) || rec.name.find('/') != std::string::npos)
      return bad(at + ".name", "unsafe data file name");
    CKPTIO_ASSIGN_OR_RETURN(const json* size, Reader::field(f, at, "size"));
    CKPTIO_ASSIGN_OR_RETURN(rec.size, Reader::u64(*size, at + ".size"));
    if (!file_sizes.emplace(rec.name, rec.size).second) return bad(at + ".name", "listed twice");
    index.files.push_back(std::move(rec));
  }

  CKPTIO_ASSIGN_OR_RETURN(const json* prefixes, Reader::field(doc, "$", "prefixes"));
  if (!prefixes->is_object()) return bad("prefixes", "expected an object");
  uint64_t leaves_total = 0;
  for (const auto& [name, leaves] : prefixes->items()) {
    const std::string at = "prefixes." + name;
    if (!is_safe_relative_name(name) || name.find('/') != std::string::npos)
      return bad(at, "unsafe prefix name");
    if (!leaves.is_array()) return bad(at, "expected an array");
    PrefixRecord p{name, {}};
    std::unordered_set<std::string> paths;
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (++leaves_total > limits.max_leaves) return bad(at, "more than " + std::to_string(limits.max_leaves) + " leaves");
      CKPTIO_ASSIGN_OR_RETURN(LeafRecord leaf, parse_leaf(leaves[i], at + "[" + std::to_string(i) + "]", file_sizes, limits));
      if (!paths.insert(leaf.path).second)
        return bad(at + "[" + std::to_string(i) + "].path", "duplicate leaf path \"" + leaf.path + "\"");
      p.leaves.push_back(std::move(leaf));
    }
    index.prefixes.push_back(std::move(p));
  }
  return index;
}

}  // namespace ckptio
