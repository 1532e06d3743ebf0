// eformer's index and metadata (contract in eformer_index.h). As with the
// .zarray reader, the text is screened for size and nesting before
// nlohmann-json parses it, and its exceptions stop here.
#include "src/layout/zarr/eformer_index.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <new>

#include <nlohmann/json.hpp>

#include "src/util/json_scan.h"
#include "src/util/json_free.h"
#include "src/util/printable.h"

namespace ckptio::zarr {
namespace {

// Ordered: prefixes keep their file order. (parse_json_into reserves each
// object's members, so that an ordered object never grows by copying.)
using Json = nlohmann::ordered_json;

// index > prefixes > prefix's list > entry > shape.
constexpr uint64_t kMaxDepth = 8;

std::string in_quotes(std::string_view s) { return "\"" + printable(s, 96) + "\""; }
std::string shown(const Json& j) {
  try {
    return printable(j.dump(), 64);
  } catch (const std::exception&) {
    return std::string("a ") + j.type_name();
  }
}

// Parses into `root` (which the caller frees with a JsonFreer).
Status parse_screened(std::string_view text, uint64_t max_bytes, const std::string& what, Json* root) {
  if (text.size() > max_bytes)
    return data_loss(what + ": " + std::to_string(text.size()) + " bytes, more than the limit of " +
                     std::to_string(max_bytes));
  if (size_t at = find_excess_depth(text, kMaxDepth); at != std::string_view::npos)
    return data_loss(what + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels at byte " +
                     std::to_string(at));
  try {
    parse_json_into(*root, text);
    return Status::OK();
  } catch (const Json::parse_error& e) {
    return data_loss(what + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + ascii_printable(e.what()));
  } catch (const std::bad_alloc&) {  // not damage: the file may be whole
    return out_of_memory("parse " + what);
  } catch (const std::exception& e) {
    return data_loss(what + ": cannot parse: " + ascii_printable(e.what()));
  }
}

bool get_int(const Json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    *out = j.get<int64_t>();
    return true;
  }
  return false;
}

Result<EformerArray> read_array(const Json& j, const std::string& at, const EformerIndexLimits& limits) {
  const std::string where = "tensorstore_index.json: " + at;
  if (!j.is_object()) return data_loss(where + " must be an object {path, shape, dtype}, got " + shown(j));
  EformerArray a;
  auto path = j.find("path");
  if (path == j.end() || !path->is_string()) return data_loss(where + " has no \"path\" string");
  a.path = path->get<std::string>();
  if (Status s = check_array_path(a.path); !s.ok()) return s.annotate("tensorstore_index.json: " + at);
  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array())
    return data_loss(where + " (" + in_quotes(a.path) + ") has no \"shape\" array");
  if (shape->size() > limits.max_rank)
    return data_loss(where + " (" + in_quotes(a.path) + ") has rank " + std::to_string(shape->size()) + ", more than " +
                     std::to_string(limits.max_rank));
  for (const Json& d : *shape) {
    int64_t v = 0;
    if (!get_int(d, &v) || v < 0)
      return data_loss(where + " (" + in_quotes(a.path) + ") has a shape entry that is not an integer >= 0: " +
                       shown(d));
    a.shape.push_back(v);
  }
  auto dtype = j.find("dtype");
  if (dtype == j.end() || !dtype->is_string())
    return data_loss(where + " (" + in_quotes(a.path) + ") has no \"dtype\" string");
  a.dtype_name = dtype->get<std::string>();
  a.dtype = parse_dtype(a.dtype_name);
  if (a.dtype && !checked_num_bytes(a.shape, dtype_size(*a.dtype)))
    return data_loss(where + " (" + in_quotes(a.path) + ") has a shape " + shape_to_string(a.shape) +
                     " whose bytes overflow 64 bits");
  return a;
}

Result<std::vector<EformerArray>> read_list(const Json& j, const std::string& at, const EformerIndexLimits& limits,
                                           uint64_t* count) {
  if (!j.is_array()) return data_loss("tensorstore_index.json: " + at + " must be a list of arrays, got " + shown(j));
  std::vector<EformerArray> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (++*count > limits.max_arrays)
      return data_loss("tensorstore_index.json: more than " + std::to_string(limits.max_arrays) + " arrays");
    auto a = read_array(j[i], at + "[" + std::to_string(i) + "]", limits);
    if (!a.ok()) return a.status();
    out.push_back(std::move(*a));
  }
  return out;
}

Status check_distinct_dirs(const EformerIndex& index) {
  std::vector<std::string_view> paths;
  for (const auto& p : index.prefixes)
    for (const auto& a : p.arrays) paths.push_back(a.path);
  if (index.arrays)
    for (const auto& a : *index.arrays) paths.push_back(a.path);
  return check_array_dirs(std::move(paths));
}

Result<EformerIndex> read_index(const Json& root, const EformerIndexLimits& limits) {
  if (!root.is_object()) return data_loss("tensorstore_index.json: expected a JSON object, got " + shown(root));
  auto format = root.find("format");
  // (Not `*format != "tensorstore"`: nlohmann's comparison with a scalar
  // makes a JSON value of it, allocating, in a noexcept operator.)
  if (format == root.end() || !format->is_string() || format->get_ref<const std::string&>() != "tensorstore")
    return data_loss("tensorstore_index.json: \"format\" is not \"tensorstore\" (got " +
                     (format == root.end() ? std::string("none") : shown(*format)) + ")");
  EformerIndex index;
  index.version.clear();
  if (auto v = root.find("version"); v != root.end()) {
    if (v->is_string()) index.version = v->get<std::string>();
    else if (v->is_number()) index.version = v->dump();  // tolerated: only "prefixes"/"arrays" matter
    else return data_loss("tensorstore_index.json: \"version\" must be a string, got " + shown(*v));
  }
  uint64_t count = 0;
  if (auto p = root.find("prefixes"); p != root.end()) {
    if (!p->is_object()) return data_loss("tensorstore_index.json: \"prefixes\" must be an object, got " + shown(*p));
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (it.key().empty() || it.key().find('/') != std::string::npos || it.key() == "." || it.key() == ".." ||
          has_control_byte(it.key()) || it.key().find('\\') != std::string::npos)
        return data_loss("tensorstore_index.json: bad prefix name " + in_quotes(it.key()));
      auto list = read_list(*it, "prefixes[" + in_quotes(it.key()) + "]", limits, &count);
      if (!list.ok()) return list.status();
      index.prefixes.push_back({it.key(), std::move(*list)});
    }
  }
  if (auto a = root.find("arrays"); a != root.end()) {
    auto list = read_list(*a, "arrays", limits, &count);
    if (!list.ok()) return list.status();
    index.arrays = std::move(*list);
  }
  if (Status s = check_distinct_dirs(index); !s.ok()) return s;
  return index;
}

// Python's json.dumps with ensure_ascii: non-ASCII as \uXXXX (UTF-16
// surrogate pairs above the BMP), control bytes as \n, \t ... or \u00XX.
void put_string(std::string* out, std::string_view s) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    char buf[16];
    if (c < 0x80) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7F) {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            *out += buf;
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence (the parser let only valid UTF-8 in; a
    // writer's own strings are taken as they are, a bad byte as U+FFFD).
    uint32_t cp = 0xFFFD;
    size_t len = 1;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    if (len > 1 && i + len <= s.size()) {
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    } else {
      cp = 0xFFFD;
      len = 1;
    }
    if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    *out += buf;
    i += len;
  }
  out->push_back('"');
}

void put_indent(std::string* out, int level) {
  out->push_back('\n');
  out->append(static_cast<size_t>(level) * 2, ' ');
}

void put_arrays(std::string* out, const std::vector<EformerArray>& arrays, int level) {
  if (arrays.empty()) {
    *out += "[]";
    return;
  }
  *out += "[";
  for (size_t i = 0; i < arrays.size(); ++i) {
    const EformerArray& a = arrays[i];
    if (i > 0) out->push_back(',');
    put_indent(out, level + 1);
    *out += "{";
    put_indent(out, level + 2);
    *out += "\"path\": ";
    put_string(out, a.path);
    out->push_back(',');
    put_indent(out, level + 2);
    *out += "\"shape\": ";
    if (a.shape.empty()) {
      *out += "[]";
    } else {
      *out += "[";
      for (size_t d = 0; d < a.shape.size(); ++d) {
        if (d > 0) out->push_back(',');
        put_indent(out, level + 3);
        *out += std::to_string(a.shape[d]);
      }
      put_indent(out, level + 2);
      *out += "]";
    }
    out->push_back(',');
    put_indent(out, level + 2);
    *out += "\"dtype\": ";
    put_string(out, !a.dtype_name.empty() || !a.dtype ? a.dtype_name : std::string(dtype_name(*a.dtype)));
    put_indent(out, level + 1);
    *out += "}";
  }
  put_indent(out, level);
  *out += "]";
}

}  // namespace

// Sorted with '/' as the smallest byte, every path inside "a/b" ("a/b/...")
// comes right after "a/b", before any "a/bX": checking neighbours is enough.
Status check_array_dirs(std::vector<std::string_view> paths) {
  std::sort(paths.begin(), paths.end(), [](std::string_view x, std::string_view y) {
    const size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (x[i] == y[i]) continue;
      if (x[i] == '/') return true;
      if (y[i] == '/') return false;
      return static_cast<unsigned char>(x[i]) < static_cast<unsigned char>(y[i]);
    }
    return x.size() < y.size();
  });
  for (size_t i = 1; i < paths.size(); ++i) {
    const std::string_view a = paths[i - 1], b = paths[i];
    if (a == b) return data_loss("tensorstore_index.json: two arrays in one directory " + in_quotes(a));
    if (b.size() > a.size() && b.substr(0, a.size()) == a && b[a.size()] == '/')
      return data_loss("tensorstore_index.json: array " + in_quotes(b) + " lies inside array " + in_quotes(a));
  }
  return Status::OK();
}

Status check_array_path(std::string_view path) {
  auto refuse = [&](const char* why) {
    return data_loss("array path " + in_quotes(path) + " " + why + " (array paths stay inside the step)");
  };
  if (path.empty()) return refuse("is empty");
  if (path.front() == '/') return refuse("is absolute");
  if (path.back() == '/') return refuse("ends in '/'");
  for (char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') return refuse("holds a backslash");
    if (c < 0x20 || c == 0x7F) return refuse("holds a control byte");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (part.empty()) return refuse("has an empty component");
    if (part == "." || part == "..") return refuse("has a \".\" or \"..\" component");
    start = end + 1;
  }
  return Status::OK();
}

Result<std::string> array_dir_of_key_path(std::string_view key_path) {
  std::string dir(key_path);
  std::replace(dir.begin(), dir.end(), '.', '/');
  if (Status s = check_array_path(dir); !s.ok())
    return data_loss("key path " + in_quotes(key_path) + " makes no safe array directory: " + s.message());
  return dir;
}

std::string key_path_of_array_dir(std::string_view path) {
  std::string key(path);
  std::replace(key.begin(), key.end(), '/', '.');
  return key;
}

Result<EformerIndex> parse_eformer_index(std::string_view text, const EformerIndexLimits& limits) {
  Json root;
  JsonFreer free_root(root);
  CKPTIO_RETURN_IF_ERROR(parse_screened(text, limits.max_bytes, "tensorstore_index.json", &root));
  try {
    return read_index(root, limits);
  } catch (const std::bad_alloc&) {  // not damage: the file may be whole
    return out_of_memory("read tensorstore_index.json");
  } catch (const std::exception& e) {  // types are checked before every get
    return data_loss(std::string("tensorstore_index.json: cannot read: ") + ascii_printable(e.what()));
  }
}

Result<EformerIndex> parse_eformer_prefix_index(std::string_view prefix, std::string_view text,
                                                const EformerIndexLimits& limits) {
  auto index = parse_eformer_index(text, limits);
  if (!index.ok()) return index.status().annotate(std::string(prefix) + "_tensorstore_index.json");
  if (!index->prefixes.empty() && !(index->prefixes.size() == 1 && index->prefixes[0].name == prefix))
    return data_loss(std::string(prefix) + "_tensorstore_index.json: holds \"prefixes\" other than " +
                     in_quotes(prefix));
  EformerIndex out;
  out.version = index->version;
  EformerPrefix p{std::string(prefix), {}};
  if (!index->prefixes.empty()) p.arrays = std::move(index->prefixes[0].arrays);
  if (index->arrays) p.arrays.insert(p.arrays.end(), index->arrays->begin(), index->arrays->end());
  out.prefixes.push_back(std::move(p));
  if (Status s = check_distinct_dirs(out); !s.ok()) return s;
  return out;
}

std::optional<std::string> prefix_of_index_name(std::string_view file_name) {
  constexpr std::string_view kTail = "_tensorstore_index.json";
  if (file_name.size() <= kTail.size() || file_name.substr(file_name.size() - kTail.size()) != kTail)
    return std::nullopt;
  std::string prefix(file_name.substr(0, file_name.size() - kTail.size()));
  if (prefix.find('/') != std::string::npos || prefix.find('\\') != std::string::npos || has_control_byte(prefix) ||
      prefix == "." || prefix == "..")
    return std::nullopt;
  return prefix;
}

std::string serialize_eformer_index(const EformerIndex& index) {
  std::string out = "{";
  put_indent(&out, 1);
  out += "\"format\": \"tensorstore\",";
  put_indent(&out, 1);
  out += "\"version\": ";
  put_string(&out, index.version);
  out += ",";
  put_indent(&out, 1);
  out += "\"prefixes\": ";
  if (index.prefixes.empty()) {
    out += "{}";
  } else {
    out += "{";
    for (size_t i = 0; i < index.prefixes.size(); ++i) {
      if (i > 0) out += ",";
      put_indent(&out, 2);
      put_string(&out, index.prefixes[i].name);
      out += ": ";
      put_arrays(&out, index.prefixes[i].arrays, 2);
    }
    put_indent(&out, 1);
    out += "}";
  }
  if (index.arrays) {
    out += ",";
    put_indent(&out, 1);
    out += "\"arrays\": ";
    put_arrays(&out, *index.arrays, 1);
  }
  put_indent(&out, 0);
  out += "}";
  return out;
}

Result<EformerStepMetadata> parse_eformer_metadata(std::string_view text) {
  Json root;
  JsonFreer free_root(root);
  CKPTIO_RETURN_IF_ERROR(parse_screened(text, 16 << 20, "metadata.json", &root));
  const Json& j = root;
  if (!j.is_object()) return data_loss("metadata.json: expected a JSON object, got " + shown(j));
  EformerStepMetadata m;
  if (auto it = j.find("step"); it != j.end() && !it->is_null()) {
    int64_t step = 0;
    if (!get_int(*it, &step)) return data_loss("metadata.json: \"step\" must be an integer, got " + shown(*it));
    m.step = step;
  }
  if (auto it = j.find("timestamp"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return data_loss("metadata.json: \"timestamp\" must be a string, got " + shown(*it));
    m.timestamp = it->get<std::string>();
  }
  if (auto it = j.find("is_temporary"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return data_loss("metadata.json: \"is_temporary\" must be true or false, got " + shown(*it));
    m.is_temporary = it->get<bool>();
  }
  return m;
}

std::string serialize_eformer_metadata(const EformerStepMetadata& m) {
  std::string out = "{";
  auto sep = [&] {
    if (out.size() > 1) out += ", ";
  };
  if (m.step) {
    sep();
    out += "\"step\": " + std::to_string(*m.step);
  }
  if (m.timestamp) {
    sep();
    out += "\"timestamp\": ";
    put_string(&out, *m.timestamp);
  }
  if (m.is_temporary) {
    sep();
    out += std::string("\"is_temporary\": ") + (*m.is_temporary ? "true" : "false");
  }
  out += "}";
  return out;
}

}  // namespace ckptio::zarr
