// AWS Signature Version 4 for S3, on OpenSSL. Pure functions (except
// amz_date_now), safe from any thread, no allocation beyond the returned
// strings, no exceptions.
//
// The signing pipeline, each step separately testable against AWS's vectors:
//   canonical_request(r, amz_date, token)      what exactly is signed
//   string_to_sign(amz_date, region, service, creq)
//   signing_key(secret, date8, region, service) HMAC chain "AWS4"+secret -> ... -> "aws4_request"
//   signature_hex(key, sts)                    hex(HMAC(key, sts))
//   sign(r, creds, region, service, amz_date)  all of the above -> headers to add
//
// S3 specifics (and where they differ from the generic test suite):
//  - The path is signed exactly as sent: S3 neither normalizes it nor encodes
//    it a second time. Build it with encode_key_path().
//  - Every S3 request signs x-amz-content-sha256 (the payload hash, or
//    "UNSIGNED-PAYLOAD"); canonical_request() adds it, with host and
//    x-amz-date, and x-amz-security-token when there is a session token.
//  - canonicalize() is the generic form (signs exactly the headers given),
//    used for the aws-sig-v4-test-suite vectors, which do not sign
//    x-amz-content-sha256.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckptio::s3 {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// sha256("") — the payload hash of every request without a body.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Payload hash for bodies the caller chooses not to hash (S3 over TLS accepts it).
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// RFC 3986 percent-encoding as SigV4 defines it: A-Z a-z 0-9 - _ . ~ are kept,
// '/' is kept unless encode_slash, every other byte becomes %XX (uppercase
// hex). Bytes, not characters: UTF-8 keys encode byte by byte.
std::string uri_encode(std::string_view s, bool encode_slash);

// The on-the-wire form of an object key inside a path: uri_encode(key, false).
// "a b/c+d" -> "a%20b/c%2Bd".
std::string encode_key_path(std::string_view key);

// Lowercase hex of raw bytes.
std::string hex(std::string_view raw);
// Lowercase hex SHA-256.
std::string sha256_hex(std::string_view data);
std::string sha256_hex(std::span<const std::byte> data);
// Raw (32-byte) HMAC-SHA256. Returns an empty string only if OpenSSL fails
// (out of memory); a request signed with it is rejected by the server, never
// accepted.
std::string hmac_sha256(std::string_view key, std::string_view data);

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty for long-term keys
};

struct SignableRequest {
  std::string method;  // "GET", "PUT", ...
  // Host header value as sent, e.g. "127.0.0.1:9000" or "bucket.s3.us-east-1.amazonaws.com".
  std::string host;
  // Already URI-encoded path as sent on the wire, e.g. "/bucket/a%20b". S3 does
  // not double-encode or normalize. Empty means "/".
  std::string path;
  // Decoded name, value pairs; canonical_query() encodes and sorts them.
  KeyValues query;
  // Extra headers to sign, any case, e.g. range, content-md5, if-match,
  // content-type. They must also be sent, with the same values. host,
  // x-amz-date, x-amz-content-sha256, x-amz-security-token and authorization
  // are ignored here: canonical_request() supplies the first four itself.
  KeyValues headers;
  // Lowercase hex sha256 of the body, or kUnsignedPayload.
  std::string payload_hash;
};

// The canonical query string: each name and value uri_encode()d (slash
// included), sorted by encoded name then encoded value, joined as
// "n1=v1&n2=v2" ("lifecycle=" for an empty value). Also what the client sends
// after '?', so the signed and the sent query cannot differ.
std::string canonical_query(const KeyValues& q);

// The generic canonical request: signs exactly `headers` (which must include
// host, and x-amz-date for header signing). Names are trimmed and lowercased;
// values are trimmed and inner runs of whitespace collapse to one space;
// repeated names join their values with ',' in the order given; sorted by name.
struct Canonical {
  std::string request;         // the canonical request text
  std::string signed_headers;  // "host;range;x-amz-date"
};
Canonical canonicalize(std::string_view method, std::string_view path, const KeyValues& query,
                       const KeyValues& headers, std::string_view payload_hash);

// S3's canonical request: r.headers plus host, x-amz-content-sha256,
// x-amz-date and, when session_token is non-empty, x-amz-security-token (S3
// requires the token to be signed). The session token is a parameter, not one
// of r.headers, so that sign() and this function cannot disagree about it.
std::string canonical_request(const SignableRequest& r, std::string_view amz_date,
                              std::string_view session_token = {});

// "AWS4-HMAC-SHA256\n<amz_date>\n<date8>/<region>/<service>/aws4_request\n<hex sha256(creq)>"
std::string string_to_sign(std::string_view amz_date, std::string_view region,
                           std::string_view service, std::string_view canonical_request);

// The raw 32-byte derived key; date8 is "YYYYMMDD". Valid for one day, one
// region, one service, so callers may cache it.
std::string signing_key(std::string_view secret, std::string_view date8, std::string_view region,
                        std::string_view service);

// hex(HMAC(signing_key, string_to_sign)).
std::string signature_hex(std::string_view signing_key, std::string_view string_to_sign);

// "AWS4-HMAC-SHA256 Credential=<id>/<date8>/<region>/<service>/aws4_request,
//  SignedHeaders=<signed_headers>, Signature=<sig>" (", " separated, as the
// SDKs send it).
std::string authorization_header(std::string_view access_key_id, std::string_view amz_date,
                                 std::string_view region, std::string_view service,
                                 std::string_view signed_headers, std::string_view signature);

// The headers the caller must add to the request, in this order:
//   Authorization, x-amz-date, x-amz-content-sha256, and x-amz-security-token
//   when c.session_token is non-empty.
// The caller also sends Host exactly as r.host and every header of r.headers.
// amz_date is "YYYYMMDDTHHMMSSZ" (amz_date_now() for real requests).
KeyValues sign(const SignableRequest& r, const Credentials& c, std::string_view region,
               std::string_view service, std::string_view amz_date);

// The current UTC time as "20150830T123600Z". The only impure function here.
std::string amz_date_now();

}  // namespace ckptio::s3
