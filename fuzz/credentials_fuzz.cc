// Fuzzes the temporary-credential parsers (backends/s3/credentials.h): what an
// instance metadata service, a container credentials endpoint or STS sends
// back, or anything pretending to be one of them.
//
// Input: one selector byte, then the body. An ASCII digit selects its value
// modulo 4, any other byte its value modulo 4: 0 parse_credentials_json (IMDS,
// container), 1 parse_sts_credentials, 2 parse_process_credentials
// (credential_process output), 3 split_command (a credential_process line).
//
// Properties checked on every input (any violation aborts):
//   - no parser crashes, hangs, leaks or trips a sanitizer;
//   - a rejection is never kOk-coded, has a message of bounded length with no
//     raw control byte;
//   - the secret access key and the session token never shape the outcome:
//     the document with either replaced by as many 'S' is accepted or
//     rejected alike, with the same message (so no message can quote them;
//     it ends up in logs);
//   - an accepted set has a non-empty access key id and secret, no control
//     bytes in any field (they go into HTTP headers), and for STS a session
//     token and an expiration after 1970;
//   - split_command: the words of an accepted line, each quoted back in
//     single quotes and joined by spaces, split into the same words.
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

void check_rejection(const Status& st) {
  if (st.ok()) fail("OK status on a rejection", "");
  if (st.message().empty()) fail("error without a message", "");
  if (st.message().size() > 4096) fail("unbounded error message", st.message().substr(0, 200));
  for (char c : st.message())
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("raw control byte in message", st.message());
}

// What a parse says, as text: "" for a success, else the error message.
template <typename R>
std::string outcome(const R& r) {
  return r.ok() ? std::string() : r.status().to_string();
}

// A secret never shows in (or shapes) an error: the same document with the
// secret replaced by as many 'S' gives the same outcome. Only for a secret
// that is non-empty and plain text (one that is empty or has a control byte
// is rejected for that, by name), so the replacement keeps its validity; and
// free of XML's markup and quote characters, so that where the element's
// text is really inside an attribute (a malformed document) the replacement
// cannot move the parse error.
bool replaceable(std::string_view v) {
  if (v.empty()) return false;
  for (char c : v)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '<' || c == '&' || c == '>' || c == '"' ||
        c == '\'')
      return false;
  return true;
}

void check_json_secret_independence(std::string_view body, const char* field) {
  auto j = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_object()) return;
  auto it = j.find(field);
  if (it == j.end() || !it->is_string() || !replaceable(it->get<std::string>())) return;
  // Both sides from the re-serialized document, so only the secret differs.
  const std::string same = j.dump();
  *it = std::string(it->get<std::string>().size(), 'S');
  const std::string other = j.dump();
  const std::string a = outcome(s3::parse_credentials_json(same, "fuzz"));
  const std::string b = outcome(s3::parse_credentials_json(other, "fuzz"));
  if (a != b) fail("the secret changes the error", a + " | " + b);
}

void check_xml_secret_independence(std::string_view body, const std::string& before, const std::string& name) {
  // Inside CDATA or a comment the same text is not the element: skipped.
  if (body.find("<![CDATA[") != std::string_view::npos || body.find("<!--") != std::string_view::npos) return;
  const std::string open = "<" + name + ">", close = "</" + name + ">";
  const size_t a = body.find(open);
  if (a == std::string_view::npos) return;
  const size_t from = a + open.size();
  const size_t b = body.find(close, from);
  if (b == std::string_view::npos || !replaceable(body.substr(from, b - from))) return;
  std::string other(body);
  other.replace(from, b - from, std::string(b - from, 'S'));
  const std::string after = outcome(s3::parse_sts_credentials(other));
  if (before != after) fail("the secret changes the error", before + " | " + after);
}

void check_field(const std::string& v, const char* name, bool required) {
  if (required && v.empty()) fail("accepted an empty field", name);
  for (char c : v)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control byte in an accepted field", name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const int which = (data[0] >= '0' && data[0] <= '9' ? data[0] - '0' : data[0]) % 4;
  if (which == 3) {
    const auto r = s3::split_command(body);
    if (!r.ok()) return check_rejection(r.status()), 0;
    if (r->empty()) fail("accepted a command of no words", "");
    std::string line;
    for (const auto& w : *r) {
      if (!line.empty()) line += ' ';
      line += '\'';
      for (char c : w) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
      line += '\'';
    }
    const auto again = s3::split_command(line);
    if (!again.ok() || *again != *r) fail("quoted words do not split back", line);
    return 0;
  }
  if (which == 2) {
    const auto r = s3::parse_process_credentials(body, "fuzz");
    if (!r.ok()) return check_rejection(r.status()), 0;
    check_field(r->creds.access_key_id, "AccessKeyId", true);
    check_field(r->creds.secret_access_key, "SecretAccessKey", true);
    check_field(r->creds.session_token, "SessionToken", false);
    return 0;
  }
  if (which == 0) {
    const auto r = s3::parse_credentials_json(body, "fuzz");
    check_json_secret_independence(body, "SecretAccessKey");
    check_json_secret_independence(body, "Token");
    if (!r.ok()) return check_rejection(r.status()), 0;
    check_field(r->creds.access_key_id, "AccessKeyId", true);
    check_field(r->creds.secret_access_key, "SecretAccessKey", true);
    check_field(r->creds.session_token, "Token", false);
    return 0;
  }
  const auto r = s3::parse_sts_credentials(body);
  const std::string o = outcome(r);
  check_xml_secret_independence(body, o, "SecretAccessKey");
  check_xml_secret_independence(body, o, "SessionToken");
  if (!r.ok()) return check_rejection(r.status()), 0;
  check_field(r->access_key_id, "AccessKeyId", true);
  check_field(r->secret_access_key, "SecretAccessKey", true);
  check_field(r->session_token, "SessionToken", true);
  if (r->expiration_unix_ns <= 0) fail("accepted an expiration before 1970", "");
  return 0;
}
