#include "backends/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <climits>
#include <ctime>

namespace ckptio::s3 {
namespace {

constexpr char kHexUpper[] = "0123456789ABCDEF";
constexpr char kHexLower[] = "0123456789abcdef";

bool unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// SigV4's "Trimall": strip both ends and collapse inner whitespace runs to one
// space. CR and LF count as whitespace, so a value can never break the
// line structure of the canonical request.
std::string trimall(std::string_view s) {
  s = trim(s);
  std::string out;
  out.reserve(s.size());
  bool in_space = false;
  for (char c : s) {
    if (is_space(c)) {
      in_space = true;
      continue;
    }
    if (in_space) out.push_back(' ');
    in_space = false;
    out.push_back(c);
  }
  return out;
}

std::string date8_of(std::string_view amz_date) { return std::string(amz_date.substr(0, 8)); }

// Headers S3 signing supplies itself (or must never sign).
bool reserved_header(std::string_view lowered) {
  return lowered == "host" || lowered == "x-amz-date" || lowered == "x-amz-content-sha256" ||
         lowered == "x-amz-security-token" || lowered == "authorization";
}

}  // namespace

std::string uri_encode(std::string_view s, bool encode_slash) {
  std::string out;
  out.reserve(s.size() * 3 / 2 + 8);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (unreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHexUpper[c >> 4]);
      out.push_back(kHexUpper[c & 0xF]);
    }
  }
  return out;
}

std::string encode_key_path(std::string_view key) { return uri_encode(key, false); }

std::string hex(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char ch : raw) {
    const auto c = static_cast<unsigned char>(ch);
    out.push_back(kHexLower[c >> 4]);
    out.push_back(kHexLower[c & 0xF]);
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  const void* p = data.empty() ? static_cast<const void*>(&kEmpty) : data.data();
  if (EVP_Digest(p, data.size(), md, &len, EVP_sha256(), nullptr) != 1) return {};
  return hex(std::string_view(reinterpret_cast<const char*>(md), len));
}

std::string sha256_hex(std::string_view data) {
  return sha256_hex(std::as_bytes(std::span<const char>(data.data(), data.size())));
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  if (key.size() > static_cast<size_t>(INT_MAX)) return {};
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  const auto* d = data.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(data.data());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), d, data.size(), md, &len) == nullptr)
    return {};
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string canonical_query(const KeyValues& q) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(q.size());
  for (const auto& [name, value] : q) enc.emplace_back(uri_encode(name, true), uri_encode(value, true));
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [name, value] : enc) {
    if (!out.empty()) out.push_back('&');
    out += name;
    out.push_back('=');
    out += value;
  }
  return out;
}

Canonical canonicalize(std::string_view method, std::string_view path, const KeyValues& query,
                       const KeyValues& headers, std::string_view payload_hash) {
  std::vector<std::pair<std::string, std::string>> hs;
  hs.reserve(headers.size());
  for (const auto& [name, value] : headers) hs.emplace_back(lowercase(trim(name)), trimall(value));
  // Stable: repeated names keep the order they were given in.
  std::stable_sort(hs.begin(), hs.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  Canonical c;
  std::string& t = c.request;
  t.reserve(256 + path.size());
  t.append(method);
  t.push_back('\n');
  t.append(path.empty() ? std::string_view("/") : path);
  t.push_back('\n');
  t += canonical_query(query);
  t.push_back('\n');
  for (size_t i = 0; i < hs.size();) {
    t += hs[i].first;
    t.push_back(':');
    t += hs[i].second;
    if (!c.signed_headers.empty()) c.signed_headers.push_back(';');
    c.signed_headers += hs[i].first;
    size_t j = i + 1;
    for (; j < hs.size() && hs[j].first == hs[i].first; ++j) {
      t.push_back(',');
      t += hs[j].second;
    }
    t.push_back('\n');
    i = j;
  }
  t.push_back('\n');
  t += c.signed_headers;
  t.push_back('\n');
  t.append(payload_hash);
  return c;
}

namespace {

Canonical s3_canonical(const SignableRequest& r, std::string_view amz_date,
                       std::string_view session_token) {
  KeyValues hs;
  hs.reserve(r.headers.size() + 4);
  for (const auto& h : r.headers)
    if (!reserved_header(lowercase(trim(h.first)))) hs.push_back(h);
  hs.emplace_back("host", r.host);
  hs.emplace_back("x-amz-content-sha256", r.payload_hash);
  hs.emplace_back("x-amz-date", std::string(amz_date));
  if (!session_token.empty()) hs.emplace_back("x-amz-security-token", std::string(session_token));
  return canonicalize(r.method, r.path, r.query, hs, r.payload_hash);
}

}  // namespace

std::string canonical_request(const SignableRequest& r, std::string_view amz_date,
                              std::string_view session_token) {
  return s3_canonical(r, amz_date, session_token).request;
}

std::string string_to_sign(std::string_view amz_date, std::string_view region,
                           std::string_view service, std::string_view canonical_request) {
  std::string s = "AWS4-HMAC-SHA256\n";
  s.append(amz_date);
  s.push_back('\n');
  s += date8_of(amz_date);
  s.push_back('/');
  s.append(region);
  s.push_back('/');
  s.append(service);
  s += "/aws4_request\n";
  s += sha256_hex(canonical_request);
  return s;
}

std::string signing_key(std::string_view secret, std::string_view date8, std::string_view region,
                        std::string_view service) {
  std::string k = "AWS4";
  k.append(secret);
  k = hmac_sha256(k, date8);
  k = hmac_sha256(k, region);
  k = hmac_sha256(k, service);
  return hmac_sha256(k, "aws4_request");
}

std::string signature_hex(std::string_view signing_key, std::string_view string_to_sign) {
  return hex(hmac_sha256(signing_key, string_to_sign));
}

std::string authorization_header(std::string_view access_key_id, std::string_view amz_date,
                                 std::string_view region, std::string_view service,
                                 std::string_view signed_headers, std::string_view signature) {
  std::string a = "AWS4-HMAC-SHA256 Credential=";
  a.append(access_key_id);
  a.push_back('/');
  a += date8_of(amz_date);
  a.push_back('/');
  a.append(region);
  a.push_back('/');
  a.append(service);
  a += "/aws4_request, SignedHeaders=";
  a.append(signed_headers);
  a += ", Signature=";
  a.append(signature);
  return a;
}

KeyValues sign(const SignableRequest& r, const Credentials& c, std::string_view region,
               std::string_view service, std::string_view amz_date) {
  const Canonical canon = s3_canonical(r, amz_date, c.session_token);
  const std::string sts = string_to_sign(amz_date, region, service, canon.request);
  const std::string key = signing_key(c.secret_access_key, date8_of(amz_date), region, service);
  KeyValues out;
  out.emplace_back("Authorization",
                   authorization_header(c.access_key_id, amz_date, region, service,
                                        canon.signed_headers, signature_hex(key, sts)));
  out.emplace_back("x-amz-date", std::string(amz_date));
  out.emplace_back("x-amz-content-sha256", r.payload_hash);
  if (!c.session_token.empty()) out.emplace_back("x-amz-security-token", c.session_token);
  return out;
}

std::string amz_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return std::string(buf, n);
}

}  // namespace ckptio::s3
