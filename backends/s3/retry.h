// The S3 backend's one retry predicate and its backoff. Every request path
// (PUT part, GET range, list, complete, delete) asks these functions, and
// nothing else, whether a failure is worth repeating and how long to wait.
//
// A retryable failure is one where repeating the same request unchanged may
// succeed: server overload (503 SlowDown), server-side transients (500
// InternalError), dropped or stalled connections. Everything else is
// permanent: authentication, missing keys, failed preconditions — retrying
// those only delays the error. One exception, bounded: a body the server
// received damaged (BadDigest) is sent again from memory a few times
// (body_mismatch).
//
// Pure functions; no state, safe from any thread.
#pragma once

#include <string_view>

#include "ckptio/status.h"

namespace ckptio::s3 {

struct RetryPolicy {
  int max_attempts = 10;      // total tries of one request, the first included (>= 1)
  double base_seconds = 0.1;  // backoff before the first retry is at most this
  double cap_seconds = 20;    // no single wait exceeds this
};

// True when an HTTP response with `status` and S3 error `s3_code` (the <Code>
// of the <Error> body; empty when there was none) is worth retrying.
//   Retryable statuses: 408, 429, 500, 502, 503, 504.
//   Retryable codes, at any status (S3 can put an <Error> inside a 200 for
//   CompleteMultipartUpload and CopyObject): SlowDown, InternalError,
//   RequestTimeout, ServiceUnavailable, Throttling, ThrottlingException,
//   RequestThrottled, TooManyRequestsException, RequestLimitExceeded,
//   BandwidthLimitExceeded, PriorRequestNotComplete, OperationAborted and
//   ConditionalRequestConflict (both 409 "try again" conflicts).
//   Never retryable, whatever the status: authentication and permission codes,
//   NoSuchKey / NoSuchBucket / NoSuchUpload, PreconditionFailed, checksum
//   mismatches (BadDigest, InvalidDigest, XAmzContentSHA256Mismatch; but see
//   body_mismatch) and RequestTimeTooSkewed (our clock is off; the same clock
//   fails again).
bool retryable_http(long status, std::string_view s3_code);

// True for the S3 codes that say the body that arrived is not the body that
// was sent: BadDigest (a Content-MD5 or x-amz-checksum-* mismatch) and
// XAmzContentSHA256Mismatch (a signed payload's SHA-256). The bytes were
// damaged on the way (a proxy, a NIC, plain http), and the same bytes sent
// again may arrive intact: the client resends such a request until it has
// made kBodyMismatchAttempts attempts that met one (and never more than its
// max_attempts), then fails with kDataLoss. Not InvalidDigest: a malformed
// header fails again.
bool body_mismatch(std::string_view s3_code);

// Past this many damaged arrivals of one request's body the damage is not a
// transient but steady (a buffer changed while it was sent, a middlebox that
// rewrites bodies): more tries only delay the error.
inline constexpr int kBodyMismatchAttempts = 3;

// True for libcurl results (CURLcode values) that mean the connection or the
// transfer failed in a way a fresh attempt may not: could not resolve (DNS in
// containers hiccups) or connect, timeouts and stalls, send/receive errors,
// an empty or garbled reply, HTTP/2 and HTTP/3 stream errors, a reset during
// the TLS handshake, a body that could not be rewound for a resend, and
// CURLE_PARTIAL_FILE — which callers also report for a body shorter than its
// Content-Length. Not retryable: CURLE_OK, malformed URLs, unsupported
// protocols, out of memory, certificate verification failures, errors raised
// by our own read/write callbacks, and CURLE_ABORTED_BY_CALLBACK (our cancel).
bool retryable_transport(int curl_code);

// Seconds to sleep before the next attempt after `failures_so_far` failures
// (>= 1 for the first retry), with "full jitter":
//   uniform01 * min(cap_seconds, base_seconds * 2^failures_so_far).
// Total for any inputs: never overflows, never NaN, always in [0, cap_seconds]
// (negative or non-finite policy values and uniform01 outside [0,1] are
// clamped). The caller supplies uniform01 so that tests are deterministic.
double backoff_seconds(const RetryPolicy& p, int failures_so_far, double uniform01);

// The ckptio::Code for an HTTP response (status, S3 error code):
//   2xx without an error code             -> kOk
//   retryable_http(status, code)          -> kUnavailable
//   NoSuchKey, NoSuchBucket, NoSuchUpload, 404          -> kNotFound
//   AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch, ExpiredToken,
//     InvalidToken, RequestTimeTooSkewed, 401, 403      -> kPermissionDenied
//   PreconditionFailed, 412, 304, other 409s            -> kFailedPrecondition
//   BucketAlreadyExists, BucketAlreadyOwnedByYou        -> kAlreadyExists
//   BadDigest, InvalidDigest, XAmzContentSHA256Mismatch -> kDataLoss (the bytes
//     that arrived are not the bytes we sent)
//   EntityTooSmall/Large, InvalidPart, InvalidPartOrder, InvalidArgument,
//     InvalidRequest, MalformedXML, KeyTooLongError, 400, 411, 413, 414, 416
//                                                       -> kInvalidArgument
//   NotImplemented, 501                                 -> kUnimplemented
//   QuotaExceeded (Ceph), XMinioStorageFull, 507        -> kNoSpace
//   anything else                                       -> kIOError
Code code_for_http(long status, std::string_view s3_code);

}  // namespace ckptio::s3
