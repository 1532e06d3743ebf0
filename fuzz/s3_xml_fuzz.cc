// Fuzzes the S3 XML response parsers (backends/s3/s3_xml.cc): the bodies an
// S3-compatible server (or anything pretending to be one) sends back.
//
// Input: one selector byte, then the body. The selector picks the parser:
//   0 parse_error (+ status_from_s3_error)   4 parse_list_multipart_uploads
//   1 parse_initiate_multipart              5 parse_delete_objects
//   2 parse_complete_multipart              6 parse_list_parts
//   3 parse_list_objects_v2
// (an ASCII digit selects its value, any other byte its value modulo 7;
// seeds use the digits '0'..'6').
//
// Properties checked on every input (any violation aborts):
//   - no parser crashes, hangs, leaks or trips a sanitizer (s3_xml.h: "strict
//     and total");
//   - a rejection is never kOk-coded, has a message, and the message has no
//     raw control byte and a bounded length (server text is quoted, cut at
//     256 bytes and made printable: it ends up in logs);
//   - a rejection of a document that is not an <Error> is Code::kIOError;
//   - an accepted result keeps the header's promises: a non-empty UploadId /
//     ETag; non-empty keys, sizes that parsed; a continuation token (or next
//     key marker) whenever the page says it is truncated;
//   - the keys of an accepted listing survive build_delete_objects: each one
//     comes back unchanged through the request body (read back by
//     parse_delete_objects after renaming the elements), so escaping cannot
//     turn a listed key into another key in a delete request.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "backends/s3/s3_xml.h"

namespace {

using ckptio::Code;
using ckptio::Status;
namespace s3 = ckptio::s3;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "s3_xml_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_message(const Status& st, const char* where) {
  if (st.ok()) fail("OK status where an error was expected", where);
  if (st.message().empty()) fail("error without a message", where);
  if (st.message().size() > 4096) fail("unbounded error message", st.message().substr(0, 200));
  for (char c : st.message())
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("raw control byte in message", st.message());
}

// A rejection: any error code for an <Error> document (status_from_s3_error
// picks it from the S3 code), kIOError for everything else.
void check_rejection(const Status& st, std::string_view body, const char* op) {
  check_message(st, op);
  if (st.code() != Code::kIOError && !s3::parse_error(body).has_value())
    fail("rejection of a non-<Error> body is not kIOError", st.to_string());
}

// Keys -> DeleteObjects request body -> the same keys. The request is turned
// into a DeleteResult document by renaming its elements (keys are escaped, so
// no tag text can occur inside them), then read back by parse_delete_objects.
void check_delete_round_trip(const std::vector<std::string>& listed) {
  std::vector<std::string> keys;
  for (const std::string& k : listed)
    if (k.find('\0') == std::string::npos) keys.push_back(k);  // NUL: not a storage key
  if (keys.empty()) return;
  if (keys.size() > s3::kMaxDeleteKeys) keys.resize(s3::kMaxDeleteKeys);
  std::string body = s3::build_delete_objects(keys, /*quiet=*/false);
  auto replace_all = [&](std::string_view from, std::string_view to) {
    for (size_t at = body.find(from); at != std::string::npos; at = body.find(from, at + to.size()))
      body.replace(at, from.size(), to);
  };
  replace_all("<Delete ", "<DeleteResult ");
  replace_all("</Delete>", "</DeleteResult>");
  replace_all("<Object>", "<Deleted>");
  replace_all("</Object>", "</Deleted>");
  auto back = s3::parse_delete_objects(body);
  if (!back.ok()) fail("a DeleteObjects request body does not read back", back.status().to_string());
  if (back->deleted != keys) fail("a key changed through build_delete_objects", body.substr(0, 2000));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int which = (data[0] >= '0' && data[0] <= '9' ? data[0] - '0' : data[0]) % 7;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  switch (which) {
    case 0: {
      const auto e = s3::parse_error(body);
      if (!e) return 0;
      for (long http : {200L, 304L, 400L, 403L, 404L, 409L, 412L, 500L, 503L, 507L})
        check_message(s3::status_from_s3_error(http, *e), "status_from_s3_error");
      return 0;
    }
    case 1: {
      const auto r = s3::parse_initiate_multipart(body);
      if (!r.ok()) return check_rejection(r.status(), body, "initiate"), 0;
      if (r->empty()) fail("accepted an empty UploadId", "");
      return 0;
    }
    case 2: {
      const auto r = s3::parse_complete_multipart(body);
      if (!r.ok()) return check_rejection(r.status(), body, "complete"), 0;
      // An empty ETag is accepted (Ceph's radosgw sends one), not a missing one.
      if (r->etag.empty() && body.find("ETag") == std::string_view::npos)
        fail("accepted a Complete result without an ETag", "");
      return 0;
    }
    case 3: {
      const auto r = s3::parse_list_objects_v2(body);
      if (!r.ok()) return check_rejection(r.status(), body, "list_objects_v2"), 0;
      if (r->truncated && r->next_continuation_token.empty())
        fail("truncated page without a continuation token", "");
      std::vector<std::string> keys;
      for (const auto& o : r->objects) {
        if (o.key.empty()) fail("accepted an empty key", "");
        keys.push_back(o.key);
      }
      for (const auto& p : r->common_prefixes)
        if (p.empty()) fail("accepted an empty common prefix", "");
      check_delete_round_trip(keys);
      return 0;
    }
    case 4: {
      const auto r = s3::parse_list_multipart_uploads(body);
      if (!r.ok()) return check_rejection(r.status(), body, "list_multipart_uploads"), 0;
      if (r->truncated && r->next_key_marker.empty()) fail("truncated page without a key marker", "");
      std::vector<std::string> keys;
      for (const auto& u : r->uploads) {
        if (u.key.empty() || u.upload_id.empty()) fail("accepted an empty key or upload id", u.key);
        keys.push_back(u.key);
      }
      check_delete_round_trip(keys);
      return 0;
    }
    case 6: {
      const auto r = s3::parse_list_parts(body);
      if (!r.ok()) return check_rejection(r.status(), body, "list_parts"), 0;
      if (r->truncated && r->next_part_number_marker.empty()) fail("truncated page without a part marker", "");
      return 0;
    }
    default: {
      const auto r = s3::parse_delete_objects(body);
      if (!r.ok()) return check_rejection(r.status(), body, "delete_objects"), 0;
      for (const auto& k : r->deleted)
        if (k.empty()) fail("accepted an empty deleted key", "");
      for (const auto& [k, e] : r->errors)
        if (k.empty() || e.code.empty()) fail("accepted an error entry without key or code", k);
      return 0;
    }
  }
}
