// Serialization of the index: the text serialize_index (index.cc) returns,
// the plain form that the fast reader (fast_reader.cc) takes. docs/format.md
// is the contract this file implements (§2 shows the text it writes).
#include <charconv>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "src/index/index_internal.h"

namespace ckptio::index_internal {

// ---- JSON text --------------------------------------------------------------

// Appends `s` as a JSON string, escaped as nlohmann-json escapes it (so that
// canonical metadata is what nlohmann's dump() would print). Bytes >= 0x80
// are copied as they are: valid UTF-8 stays valid, and invalid UTF-8 makes
// the output unparsable on purpose (see serialize_index in
// include/ckptio/index.h).
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

namespace {

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

// Kept out of serialize on purpose: inlined there, its appends of literals
// were left as calls (a strlen each) once serialize reached GCC's
// large-function-growth limit, ~20% slower on a 100-leaf index
// (bench/micro_bench BM_IndexSerialize/100).
[[gnu::noinline]] void append_leaf(std::string& out, const LeafRecord& leaf) {
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

}  // namespace

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

}  // namespace ckptio::index_internal
