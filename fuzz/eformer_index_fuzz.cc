// Fuzzes eformer's step files (src/layout/zarr/eformer_index.h). The first
// byte selects the reader (an ASCII digit its value, any other byte its
// value, modulo 4): 0 parse_eformer_index, 1 parse_eformer_prefix_index
// (prefix "model"), 2 parse_eformer_metadata, 3 array_dir_of_key_path; the
// rest is the text.
//
// Properties:
//   - no crash, hang, leak or sanitizer report;
//   - a rejection is kDataLoss with a message free of control bytes;
//   - an accepted index keeps its paths inside the step: every path passes
//     check_array_path and an independent re-check (no empty, "." or ".."
//     component, no leading '/', no backslash or control byte), and no two
//     arrays share a directory or nest (checked pairwise on small indexes);
//   - an accepted index, or metadata, round-trips through its writer;
//   - metadata's timestamp is read without overflow, and one of whole
//     seconds without an offset comes back from gmtime as it was;
//   - a key path (without '/') that makes a directory comes back from it
//     unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/layout/zarr/eformer_index.h"
#include "src/util/iso8601.h"

namespace {

using namespace ckptio::zarr;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "eformer_index_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_rejection(const ckptio::Status& st) {
  if (st.code() != ckptio::Code::kDataLoss) fail("rejection is not kDataLoss", st.to_string());
  if (st.message().empty()) fail("rejection without a message", "");
  for (char c : st.message())
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control byte in message", st.message());
}

bool safe_path(std::string_view p) {
  if (p.empty() || p.front() == '/') return false;
  size_t start = 0;
  for (;;) {
    const size_t end = p.find('/', start);
    const std::string_view part = p.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
    if (end == std::string_view::npos) return true;
    start = end + 1;
  }
}

void check_index(const EformerIndex& index, const std::string& text) {
  std::vector<std::string_view> paths;
  for (const auto& p : index.prefixes)
    for (const auto& a : p.arrays) paths.push_back(a.path);
  if (index.arrays)
    for (const auto& a : *index.arrays) paths.push_back(a.path);
  for (auto p : paths) {
    if (!safe_path(p) || !check_array_path(p).ok()) fail("accepted an unsafe path", std::string(p));
  }
  if (paths.size() <= 200) {
    for (size_t i = 0; i < paths.size(); ++i)
      for (size_t j = 0; j < paths.size(); ++j) {
        if (i == j) continue;
        const std::string_view a = paths[i], b = paths[j];
        if (a == b) fail("accepted two arrays in one directory", std::string(a));
        if (b.size() > a.size() && b.substr(0, a.size()) == a && b[a.size()] == '/')
          fail("accepted an array inside another", std::string(b));
      }
  }
  const std::string once = serialize_eformer_index(index);
  auto back = parse_eformer_index(once);
  if (!back.ok()) fail("serialized index does not parse", back.status().to_string() + "\n" + once);
  if (!(*back == index)) fail("parse(serialize(x)) != x", text + "\n---\n" + once);
  if (serialize_eformer_index(*back) != once) fail("serialization is not stable", once);
}

// The step's time, as load_eformer_step reads it (src/util/iso8601.h): no overflow (UBSan), and
// a time without fraction or offset comes back from gmtime unchanged.
void check_timestamp(const std::string& t) {
  const std::optional<int64_t> ns = ckptio::parse_iso8601_ns(t, ckptio::TimeZones::kAny);
  if (!ns || t.size() != 19 || t[10] != 'T' || t.ends_with(":60")) return;  // (a leap second moves on)
  const int64_t secs = *ns / 1'000'000'000;
  if (*ns % 1'000'000'000 != 0) fail("a whole second with a fraction", t);
  const time_t tt = static_cast<time_t>(secs);
  std::tm tm{};
  char back[32];
  if (!gmtime_r(&tt, &tm) || std::strftime(back, sizeof back, "%Y-%m-%dT%H:%M:%S", &tm) != 19 || t != back)
    fail("timestamp does not come back", t + " -> " + back);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int which = (data[0] >= '0' && data[0] <= '9' ? data[0] - '0' : data[0]) % 4;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  EformerIndexLimits limits;
  limits.max_bytes = 1 << 20;
  switch (which) {
    case 0: {
      auto r = parse_eformer_index(text, limits);
      if (!r.ok()) check_rejection(r.status());
      else check_index(*r, text);
      break;
    }
    case 1: {
      auto r = parse_eformer_prefix_index("model", text, limits);
      if (!r.ok()) {
        check_rejection(r.status());
      } else {
        if (r->prefixes.size() != 1 || r->prefixes[0].name != "model" || r->arrays) fail("prefix index shape", text);
        check_index(*r, text);
      }
      break;
    }
    case 2: {
      auto r = parse_eformer_metadata(text);
      if (!r.ok()) {
        check_rejection(r.status());
      } else {
        const std::string once = serialize_eformer_metadata(*r);
        auto back = parse_eformer_metadata(once);
        if (!back.ok() || !(*back == *r)) fail("metadata does not round-trip", text + "\n---\n" + once);
        if (r->timestamp) check_timestamp(*r->timestamp);
      }
      break;
    }
    case 3: {
      auto r = array_dir_of_key_path(text);
      if (!r.ok()) {
        check_rejection(r.status());
      } else {
        if (!safe_path(*r)) fail("unsafe directory from a key path", *r);
        if (text.find('/') == std::string::npos && key_path_of_array_dir(*r) != text)
          fail("key path does not come back", text);
      }
      break;
    }
  }
  return 0;
}
