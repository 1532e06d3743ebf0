// Fuzzes the ~/.aws files and the S3 configuration resolver
// (backends/s3/aws_files.cc: parse_aws_ini; backends/s3/s3_config.cc: resolve_s3_config) with fake
// environment and file lookups fed from the input.
//
// Input: text in blocks, each started by a line "--- NAME" (NAME: env,
// config, credentials, overrides); text before the first marker is ignored.
//   env          NAME=value lines: the environment (HOME, AWS_PROFILE,
//                AWS_CONFIG_FILE, AWS_ACCESS_KEY_ID, ...)
//   config       the text read_file() returns for a path without
//                "credentials" in it ($HOME/.aws/config, AWS_CONFIG_FILE)
//   credentials  the text returned for a path containing "credentials"
//   overrides    key=value lines for S3ConfigOverrides: profile, endpoint,
//                region, anonymous, path_style, sign_payloads, checksums, access_key_id,
//                secret_access_key, session_token, part_size, max_connections,
//                max_attempts
// A missing config or credentials block is a missing file.
//
// Properties checked on every input (any violation aborts):
//   - no crash, hang, leak or sanitizer report;
//   - parse_aws_ini (each text, as both kinds): a rejection is
//     kInvalidArgument naming a line ("line N: ...") or the size limit; an
//     accepted file has non-empty section names without '[' or ']', and
//     non-empty, lowercase, trimmed keys with trimmed values;
//   - resolve_s3_config: a rejection is kInvalidArgument; messages carry no
//     raw CR or LF (they go to logs one line each);
//   - an accepted configuration is valid: an http(s)://host[:port] endpoint
//     without '@', whitespace or a trailing '/', a region of [A-Za-z0-9._-],
//     credentials exactly when not anonymous, part size and limits in range;
//     and normalizing its endpoint again changes nothing;
//   - secrets never show: replacing the secret access key and session token
//     (environment and overrides) by other text of the same length changes
//     neither an error message nor describe_redacted(), and describe_redacted()
//     does not change when the resolved secret and token are replaced.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "backends/s3/s3_config.h"

namespace {

using ckptio::Code;
using ckptio::Result;
using ckptio::Status;
namespace s3 = ckptio::s3;

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "aws_config_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

struct Input {
  std::map<std::string, std::string> env, overrides;
  std::optional<std::string> config, credentials;
};

// "NAME=value" lines; the first '=' splits; later lines win.
void parse_assignments(std::string_view block, std::map<std::string, std::string>& out) {
  size_t pos = 0;
  while (pos < block.size()) {
    size_t nl = block.find('\n', pos);
    if (nl == std::string_view::npos) nl = block.size();
    const std::string_view line = block.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
}

Input split(std::string_view text) {
  Input in;
  std::string current;
  std::string block;
  bool in_block = false;
  auto flush = [&] {
    if (!in_block) return;
    if (current == "env") parse_assignments(block, in.env);
    else if (current == "config") in.config = block;
    else if (current == "credentials") in.credentials = block;
    else if (current == "overrides") parse_assignments(block, in.overrides);
  };
  size_t pos = 0;
  bool first_line = true;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    const bool last = nl == std::string_view::npos;
    if (last) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    if (line.substr(0, 4) == "--- ") {
      flush();
      current = std::string(line.substr(4));
      block.clear();
      in_block = true;
      first_line = true;
    } else if (in_block) {
      if (!first_line) block += '\n';
      block += line;
      first_line = false;
    }
    if (last) break;
    pos = nl + 1;
  }
  flush();
  return in;
}

template <typename T>
std::optional<T> number(const std::string& s) {
  T v{};
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<bool> boolean(const std::string& s) {
  if (s == "true") return true;
  if (s == "false") return false;
  return std::nullopt;
}

s3::S3ConfigOverrides overrides_of(const std::map<std::string, std::string>& m) {
  s3::S3ConfigOverrides o;
  auto get = [&](const char* k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
  if (auto v = get("profile")) o.profile = *v;
  if (auto v = get("endpoint")) o.endpoint = *v;
  if (auto v = get("region")) o.region = *v;
  if (auto v = get("anonymous")) o.anonymous = boolean(*v);
  if (auto v = get("path_style")) o.path_style = boolean(*v);
  if (auto v = get("sign_payloads")) o.sign_payloads = boolean(*v);
  if (auto v = get("checksums")) o.checksums = boolean(*v);
  if (get("access_key_id") || get("secret_access_key"))
    o.creds = s3::Credentials{get("access_key_id").value_or(""), get("secret_access_key").value_or(""),
                              get("session_token").value_or("")};
  if (auto v = get("part_size")) o.part_size = number<uint64_t>(*v);
  if (auto v = get("max_connections")) o.max_connections = number<uint32_t>(*v);
  if (auto v = get("max_attempts")) {
    if (auto n = number<int>(*v)) {
      s3::RetryPolicy p;
      p.max_attempts = *n;
      o.retry = p;
    }
  }
  return o;
}

Result<s3::S3Config> resolve(const Input& in) {
  const s3::GetEnv getenv = [&](const std::string& name) -> std::optional<std::string> {
    auto it = in.env.find(name);
    if (it == in.env.end()) return std::nullopt;
    return it->second;
  };
  const s3::ReadFile read_file = [&](const std::string& path) -> std::optional<std::string> {
    return path.find("credentials") != std::string::npos ? in.credentials : in.config;
  };
  return s3::resolve_s3_config(overrides_of(in.overrides), getenv, read_file);
}

// Other text of the same length: a different byte at every position.
std::string other_text(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = c == 'x' ? 'y' : 'x';
  return out;
}

bool is_trim_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

void check_ini(const std::string& text, s3::AwsIniKind kind) {
  const auto r = s3::parse_aws_ini(text, kind);
  if (!r.ok()) {
    const Status& st = r.status();
    if (st.code() != Code::kInvalidArgument) fail("ini rejection is not kInvalidArgument", st.to_string());
    if (st.message().rfind("line ", 0) != 0 && st.message() != "larger than 1 MiB")
      fail("ini rejection does not name a line", st.message());
    if (st.message().find_first_of("\r\n") != std::string::npos) fail("CR or LF in an ini message", st.message());
    return;
  }
  for (const auto& [section, keys] : *r) {
    if (section.empty()) fail("accepted an empty section name", "");
    if (section.find_first_of("[]") != std::string::npos) fail("accepted '[' or ']' in a section", section);
    for (const auto& [k, v] : keys) {
      if (k.empty()) fail("accepted an empty key", section);
      for (char c : k)
        if (c >= 'A' && c <= 'Z') fail("key not lowercased", k);
      if (is_trim_space(k.front()) || is_trim_space(k.back())) fail("key not trimmed", k);
      if (!v.empty() && (is_trim_space(v.front()) || is_trim_space(v.back()))) fail("value not trimmed", v);
    }
  }
}

bool region_ok(const std::string& r) {
  if (r.empty() || r.size() > 64) return false;
  for (char c : r)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

void check_config(const s3::S3Config& c) {
  const std::string& e = c.endpoint;
  if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0) fail("endpoint scheme", e);
  if (e.find('@') != std::string::npos) fail("endpoint with user info", e);
  if (e.back() == '/') fail("endpoint with a trailing '/'", e);
  for (char c : e)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) fail("endpoint with whitespace or control", e);
  if (!region_ok(c.region)) fail("invalid region accepted", c.region);
  if (c.anonymous) {
    if (!c.creds.access_key_id.empty() || !c.creds.secret_access_key.empty() || !c.creds.session_token.empty())
      fail("anonymous configuration keeps credentials", c.credentials_source);
  } else if (c.creds.access_key_id.empty() || c.creds.secret_access_key.empty()) {
    fail("signed configuration without a full key pair", c.credentials_source);
  }
  if (c.part_size < (5ull << 20) || c.part_size > (5ull << 30)) fail("part size out of range", "");
  if (c.part_size % 4096 != 0) fail("part size not a multiple of 4096 accepted", "");  // write ranges assume it
  if (c.max_connections == 0) fail("zero max_connections", "");
  if (c.retry.max_attempts < 1) fail("max_attempts < 1", "");
  if (!(std::isfinite(c.connect_timeout_s) && c.connect_timeout_s > 0) ||
      !(std::isfinite(c.request_timeout_s) && c.request_timeout_s > 0))
    fail("bad timeout accepted", "");

  // The endpoint is in normal form: resolving it again as an override keeps it.
  s3::S3ConfigOverrides o;
  o.endpoint = e;
  o.anonymous = true;
  const auto again = s3::resolve_s3_config(o, nullptr, nullptr);
  if (!again.ok()) fail("a resolved endpoint does not resolve again", e + ": " + again.status().to_string());
  if (again->endpoint != e) fail("endpoint normalization is not idempotent", e + " -> " + again->endpoint);

  // describe_redacted() does not depend on the secret or the token.
  s3::S3Config other = c;
  other.creds.secret_access_key = other_text(c.creds.secret_access_key);
  other.creds.session_token = other_text(c.creds.session_token);
  if (other.describe_redacted() != c.describe_redacted())
    fail("describe_redacted() shows the secret or the token", c.describe_redacted());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Input in = split(text);
  for (const auto& t : {in.config, in.credentials})
    if (t) {
      check_ini(*t, s3::AwsIniKind::kConfig);
      check_ini(*t, s3::AwsIniKind::kCredentials);
    }

  const auto r = resolve(in);
  if (!r.ok()) {
    const Status& st = r.status();
    if (st.code() != Code::kInvalidArgument) fail("rejection is not kInvalidArgument", st.to_string());
    if (st.message().empty()) fail("rejection without a message", "");
    if (st.message().find_first_of("\r\n") != std::string::npos) fail("CR or LF in a message", st.message());
  } else {
    check_config(*r);
  }

  // The same input with other secrets (environment and overrides) must give
  // the same messages and the same description.
  Input swapped = in;
  bool changed = false;
  for (const char* k : {"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})
    if (auto it = swapped.env.find(k); it != swapped.env.end() && !it->second.empty()) {
      it->second = other_text(it->second);
      changed = true;
    }
  for (const char* k : {"secret_access_key", "session_token"})
    if (auto it = swapped.overrides.find(k); it != swapped.overrides.end() && !it->second.empty()) {
      it->second = other_text(it->second);
      changed = true;
    }
  if (!changed) return 0;
  const auto r2 = resolve(swapped);
  if (r.ok() != r2.ok()) return 0;  // not a message either way
  if (!r.ok()) {
    if (r.status().message() != r2.status().message())
      fail("an error message depends on a secret", r.status().message());
  } else if (r->describe_redacted() != r2->describe_redacted()) {
    fail("describe_redacted() depends on a secret", r->describe_redacted());
  }
  return 0;
}
