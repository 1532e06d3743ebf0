// Fuzzes the temporary-credential parsers (backends/s3/credentials.h): what an
// instance metadata service, a container credentials endpoint or STS sends
// back, or anything pretending to be one of them.
//
// Input: one selector byte, then the body. '0' (or any even byte)
// parse_credentials_json, '1' (or any odd byte) parse_sts_credentials.
//
// Properties checked on every input (any violation aborts):
//   - no parser crashes, hangs, leaks or trips a sanitizer;
//   - a rejection is never kOk-coded, has a message of bounded length with no
//     raw control byte, and never contains the secret access key or the
//     session token of the document (when they can be read out of it): the
//     message ends up in logs;
//   - an accepted set has a non-empty access key id and secret, no control
//     bytes in any field (they go into HTTP headers), and for STS a session
//     token and an expiration after 1970.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "backends/s3/credentials.h"
#include "backends/s3/s3_xml.h"

namespace {

using ckptio::Status;
namespace s3 = ckptio::s3;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "credentials_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_rejection(const Status& st, const std::string& secret, const std::string& token) {
  if (st.ok()) fail("OK status on a rejection", "");
  if (st.message().empty()) fail("error without a message", "");
  if (st.message().size() > 4096) fail("unbounded error message", st.message().substr(0, 200));
  for (char c : st.message())
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("raw control byte in message", st.message());
  for (const std::string* s : {&secret, &token})
    if (s->size() >= 6 && st.message().find(*s) != std::string::npos) fail("secret in an error message", st.message());
}

void check_field(const std::string& v, const char* name, bool required) {
  if (required && v.empty()) fail("accepted an empty field", name);
  for (char c : v)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control byte in an accepted field", name);
}

// The string member `name` of a JSON object body, if there is one.
std::string json_member(std::string_view body, const char* name) {
  const auto j = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_object()) return {};
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The text between <name> and </name>, if any: enough to find a secret in a
// message without a second XML parser.
std::string xml_member(std::string_view body, const std::string& name) {
  const size_t a = body.find("<" + name + ">");
  if (a == std::string_view::npos) return {};
  const size_t from = a + name.size() + 2;
  const size_t b = body.find("</" + name + ">", from);
  return b == std::string_view::npos ? std::string() : std::string(body.substr(from, b - from));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    const auto r = s3::parse_credentials_json(body, "fuzz");
    if (!r.ok()) {
      check_rejection(r.status(), json_member(body, "SecretAccessKey"), json_member(body, "Token"));
      return 0;
    }
    check_field(r->creds.access_key_id, "AccessKeyId", true);
    check_field(r->creds.secret_access_key, "SecretAccessKey", true);
    check_field(r->creds.session_token, "Token", false);
    return 0;
  }
  const auto r = s3::parse_sts_credentials(body);
  if (!r.ok()) {
    check_rejection(r.status(), xml_member(body, "SecretAccessKey"), xml_member(body, "SessionToken"));
    return 0;
  }
  check_field(r->access_key_id, "AccessKeyId", true);
  check_field(r->secret_access_key, "SecretAccessKey", true);
  check_field(r->session_token, "SessionToken", true);
  if (r->expiration_unix_ns <= 0) fail("accepted an expiration before 1970", "");
  return 0;
}
