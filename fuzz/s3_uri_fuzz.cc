// Fuzzes parse_s3_uri (backends/s3/s3_uri.cc): s3://bucket[/prefix] as
// users type it on the command line or pass it to open_storage().
//
// Properties checked on every input (any violation aborts):
//   - no crash, hang, leak or sanitizer report;
//   - a rejection is kInvalidArgument with a message free of raw control
//     bytes (the URI is quoted in it, made printable);
//   - an accepted URI keeps the header's promises, checked here independently:
//     a bucket of 3-63 letters, digits, '.', '-', '_', starting and ending
//     with a letter or digit, without ".."; a prefix without a leading or
//     trailing '/', whose segments are non-empty, not "." or "..", and free
//     of NUL, backslash and control characters;
//   - it round-trips: "s3://" + bucket [+ "/" + prefix] [+ "/"] parses to the
//     same bucket and prefix.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/s3/s3_config.h"

namespace {

namespace s3 = ckptio::s3;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "s3_uri_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

bool alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

void check_bucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) fail("accepted a bucket of the wrong length", b);
  for (char c : b)
    if (!alnum(c) && c != '.' && c != '-' && c != '_') fail("accepted a bucket character", b);
  if (!alnum(b.front()) || !alnum(b.back())) fail("accepted a bucket edge character", b);
  if (b.find("..") != std::string::npos) fail("accepted '..' in a bucket", b);
}

void check_prefix(const std::string& p) {
  if (p.empty()) return;
  if (p.front() == '/' || p.back() == '/') fail("accepted a prefix with an outer '/'", p);
  for (char c : p) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '\\') fail("accepted a control byte or backslash in a prefix", p);
  }
  size_t start = 0;
  for (;;) {
    const size_t end = p.find('/', start);
    const std::string seg = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (seg.empty() || seg == "." || seg == "..") fail("accepted a bad prefix segment", p);
    if (end == std::string::npos) break;
    start = end + 1;
  }
}

void check_reparse(const std::string& uri, const s3::S3Uri& want) {
  auto again = s3::parse_s3_uri(uri);
  if (!again.ok()) fail("the canonical form does not parse", uri + ": " + again.status().to_string());
  if (again->bucket != want.bucket || again->prefix != want.prefix) fail("round trip changed the URI", uri);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view uri(reinterpret_cast<const char*>(data), size);
  auto r = s3::parse_s3_uri(uri);
  if (!r.ok()) {
    const ckptio::Status& st = r.status();
    if (st.code() != ckptio::Code::kInvalidArgument) fail("rejection is not kInvalidArgument", st.to_string());
    if (st.message().empty()) fail("rejection without a message", "");
    for (char c : st.message())
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("raw control byte in message", st.message());
    return 0;
  }
  check_bucket(r->bucket);
  check_prefix(r->prefix);
  const std::string canon = "s3://" + r->bucket + (r->prefix.empty() ? "" : "/" + r->prefix);
  check_reparse(canon, *r);
  check_reparse(canon + "/", *r);
  return 0;
}
