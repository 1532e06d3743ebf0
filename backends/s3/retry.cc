#include "backends/s3/retry.h"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace ckptio::s3 {
namespace {

template <size_t N>
bool one_of(std::string_view code, const std::array<std::string_view, N>& set) {
  return std::find(set.begin(), set.end(), code) != set.end();
}

// Transient by the server's own description (botocore's "standard" retry mode
// uses the same list, plus InternalError which S3 returns inside a 200).
constexpr std::array<std::string_view, 13> kRetryableCodes = {
    "SlowDown",          "InternalError",          "RequestTimeout",
    "ServiceUnavailable", "Throttling",            "ThrottlingException",
    "RequestThrottled",  "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "PriorRequestNotComplete", "OperationAborted",
    "ConditionalRequestConflict",
};

constexpr std::array<std::string_view, 9> kNotFoundCodes = {
    "NoSuchKey", "NoSuchBucket", "NoSuchUpload", "NoSuchVersion", "NotFound",
    "NoSuchBucketPolicy", "NoSuchLifecycleConfiguration", "NoSuchTagSet", "NoSuchCORSConfiguration",
};

// RequestTimeTooSkewed is here rather than retryable: every attempt signs with
// the same wrong clock.
constexpr std::array<std::string_view, 11> kPermissionCodes = {
    "AccessDenied",  "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken",  "TokenRefreshRequired", "AllAccessDisabled",   "AccountProblem",
    "InvalidSecurity", "RequestTimeTooSkewed", "InvalidObjectState",
};

constexpr std::array<std::string_view, 3> kDataLossCodes = {
    "BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch",
};

constexpr std::array<std::string_view, 14> kInvalidArgumentCodes = {
    "EntityTooSmall",  "EntityTooLarge", "InvalidPart",     "InvalidPartOrder",
    "InvalidArgument", "InvalidRequest", "MalformedXML",    "KeyTooLongError",
    "InvalidBucketName", "InvalidRange", "MetadataTooLarge", "IncompleteBody",
    "MissingContentLength", "InvalidURI",
};

constexpr std::array<std::string_view, 2> kAlreadyExistsCodes = {
    "BucketAlreadyExists", "BucketAlreadyOwnedByYou",
};

constexpr std::array<std::string_view, 3> kNoSpaceCodes = {
    "QuotaExceeded", "XMinioStorageFull", "XMinioAdminBucketQuotaExceeded",
};

bool retryable_status(long status) {
  switch (status) {
    case 408: case 429: case 500: case 502: case 503: case 504: return true;
    default: return false;
  }
}

// A code that says "this will fail again" overrides a retryable status.
bool permanent_code(std::string_view code) {
  return one_of(code, kNotFoundCodes) || one_of(code, kPermissionCodes) ||
         one_of(code, kDataLossCodes) || one_of(code, kInvalidArgumentCodes) ||
         code == "PreconditionFailed" || code == "NotImplemented";
}

}  // namespace

bool body_mismatch(std::string_view s3_code) {
  return s3_code == "BadDigest" || s3_code == "XAmzContentSHA256Mismatch";
}

bool retryable_http(long status, std::string_view s3_code) {
  if (one_of(s3_code, kRetryableCodes)) return true;
  if (permanent_code(s3_code)) return false;
  return retryable_status(status);
}

bool retryable_transport(int curl_code) {
  // Switch on the int: casting an arbitrary int to CURLcode (an enum without a
  // fixed underlying type) is undefined for values outside its range.
  switch (curl_code) {
    case CURLE_COULDNT_RESOLVE_HOST:  // a typo'd host fails after max_attempts;
    case CURLE_COULDNT_RESOLVE_PROXY: // a DNS blip in a pod must not fail a save
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:    // also our low-speed (stall) limit
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:          // and "truncated body", as callers report it
    case CURLE_WEIRD_SERVER_REPLY:    // a connection cut inside the status line
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_SSL_CONNECT_ERROR:     // resets during the handshake under load;
                                      // certificate failures have their own codes
    case CURLE_SEND_FAIL_REWIND:      // the next attempt builds a fresh request
      return true;
    default:
      return false;
  }
}

double backoff_seconds(const RetryPolicy& p, int failures_so_far, double uniform01) {
  auto sane = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
  const double base = sane(p.base_seconds);
  const double cap = sane(p.cap_seconds);
  double u = std::isfinite(uniform01) ? uniform01 : 0.0;
  u = std::clamp(u, 0.0, 1.0);
  // 2^1023 is the largest finite power of two; beyond it ldexp would give inf,
  // and min(cap, inf) is fine, but clamping keeps the arithmetic plainly finite.
  const int exp = std::clamp(failures_so_far, 0, 1023);
  const double grown = std::ldexp(base, exp);
  const double ceiling = std::isfinite(grown) ? std::min(cap, grown) : cap;
  return u * ceiling;
}

Code code_for_http(long status, std::string_view s3_code) {
  if (!s3_code.empty()) {
    if (one_of(s3_code, kRetryableCodes)) return Code::kUnavailable;
    if (one_of(s3_code, kNotFoundCodes)) return Code::kNotFound;
    if (one_of(s3_code, kNoSpaceCodes)) return Code::kNoSpace;
    if (one_of(s3_code, kPermissionCodes)) return Code::kPermissionDenied;
    if (one_of(s3_code, kDataLossCodes)) return Code::kDataLoss;
    if (one_of(s3_code, kInvalidArgumentCodes)) return Code::kInvalidArgument;
    if (one_of(s3_code, kAlreadyExistsCodes)) return Code::kAlreadyExists;
    if (s3_code == "PreconditionFailed") return Code::kFailedPrecondition;
    if (s3_code == "NotImplemented") return Code::kUnimplemented;
  }
  if (status >= 200 && status < 300) return s3_code.empty() ? Code::kOk : Code::kIOError;
  if (retryable_status(status)) return Code::kUnavailable;
  switch (status) {
    case 404: return Code::kNotFound;
    case 401: case 403: return Code::kPermissionDenied;
    case 304: case 409: case 412: return Code::kFailedPrecondition;
    case 400: case 411: case 413: case 414: case 416: return Code::kInvalidArgument;
    case 501: return Code::kUnimplemented;
    case 507: return Code::kNoSpace;
    default: return Code::kIOError;
  }
}

}  // namespace ckptio::s3
