// The S3 retry predicate, its backoff, and the HTTP -> ckptio::Code mapping.
#include <gtest/gtest.h>

#include <curl/curl.h>

#include <climits>
#include <cmath>
#include <limits>

#include "backends/s3/retry.h"

namespace ckptio::s3 {
namespace {

TEST(RetryHttp, RetryableStatuses) {
  for (long s : {408L, 429L, 500L, 502L, 503L, 504L}) EXPECT_TRUE(retryable_http(s, "")) << s;
  for (long s : {0L, 200L, 204L, 206L, 301L, 304L, 400L, 401L, 403L, 404L, 405L, 409L, 411L, 412L,
                 416L, 501L, 505L, 507L})
    EXPECT_FALSE(retryable_http(s, "")) << s;
}

TEST(RetryHttp, RetryableCodesAtAnyStatus) {
  for (const char* code : {"SlowDown", "InternalError", "RequestTimeout", "ServiceUnavailable",
                           "Throttling", "ThrottlingException", "RequestThrottled",
                           "TooManyRequestsException", "RequestLimitExceeded",
                           "BandwidthLimitExceeded", "PriorRequestNotComplete", "OperationAborted",
                           "ConditionalRequestConflict"}) {
    EXPECT_TRUE(retryable_http(503, code)) << code;
    EXPECT_TRUE(retryable_http(200, code)) << code;  // an <Error> inside a 200
    EXPECT_TRUE(retryable_http(400, code)) << code;  // RequestTimeout is a 400
    EXPECT_TRUE(retryable_http(409, code)) << code;
  }
}

TEST(RetryHttp, PermanentCodesWinOverRetryableStatuses) {
  for (const char* code : {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchKey",
                           "NoSuchBucket", "NoSuchUpload", "PreconditionFailed", "BadDigest",
                           "InvalidDigest", "XAmzContentSHA256Mismatch", "RequestTimeTooSkewed",
                           "ExpiredToken", "InvalidPart", "EntityTooSmall", "MalformedXML"}) {
    EXPECT_FALSE(retryable_http(500, code)) << code;
    EXPECT_FALSE(retryable_http(503, code)) << code;
    EXPECT_FALSE(retryable_http(403, code)) << code;
  }
  // An unknown code follows the status.
  EXPECT_TRUE(retryable_http(503, "SomethingNew"));
  EXPECT_FALSE(retryable_http(400, "SomethingNew"));
  EXPECT_FALSE(retryable_http(200, ""));
}

TEST(RetryTransport, Classification) {
  for (CURLcode c : {CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_CONNECT,
                     CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR, CURLE_RECV_ERROR,
                     CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE, CURLE_WEIRD_SERVER_REPLY, CURLE_HTTP2,
                     CURLE_HTTP2_STREAM, CURLE_HTTP3, CURLE_QUIC_CONNECT_ERROR,
                     CURLE_SSL_CONNECT_ERROR, CURLE_SEND_FAIL_REWIND})
    EXPECT_TRUE(retryable_transport(c)) << curl_easy_strerror(c);
  for (CURLcode c : {CURLE_OK, CURLE_URL_MALFORMAT, CURLE_UNSUPPORTED_PROTOCOL, CURLE_OUT_OF_MEMORY,
                     CURLE_ABORTED_BY_CALLBACK, CURLE_WRITE_ERROR, CURLE_READ_ERROR,
                     CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CACERT_BADFILE,
                     CURLE_BAD_FUNCTION_ARGUMENT, CURLE_FAILED_INIT, CURLE_LOGIN_DENIED,
                     CURLE_TOO_MANY_REDIRECTS})
    EXPECT_FALSE(retryable_transport(c)) << curl_easy_strerror(c);
  EXPECT_FALSE(retryable_transport(-1));
  EXPECT_FALSE(retryable_transport(INT_MAX));
}

TEST(RetryBackoff, FullJitterGrowsThenCaps) {
  const RetryPolicy p;  // 0.1 s base, 20 s cap
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 0, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 1, 1.0), 0.2);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 3, 1.0), 0.8);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 3, 0.5), 0.4);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 3, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 8, 1.0), 20.0);  // 25.6 capped
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 8, 0.25), 5.0);
}

TEST(RetryBackoff, TotalForHostileInputs) {
  const RetryPolicy p;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int f : {INT_MIN, -1, 0, 1, 30, 31, 32, 63, 64, 1000, 1023, 1024, 5000, INT_MAX}) {
    for (double u : {-1.0, 0.0, 0.3, 1.0, 2.0, inf, -inf, nan}) {
      const double b = backoff_seconds(p, f, u);
      EXPECT_TRUE(std::isfinite(b)) << f << " " << u;
      EXPECT_GE(b, 0.0);
      EXPECT_LE(b, p.cap_seconds);
    }
  }
  EXPECT_DOUBLE_EQ(backoff_seconds(p, INT_MAX, 1.0), 20.0);
  EXPECT_DOUBLE_EQ(backoff_seconds(p, -5, 1.0), 0.1);  // negative counts as 0
  EXPECT_DOUBLE_EQ(backoff_seconds(p, 1, 7.0), 0.2);   // u clamped to 1
  for (RetryPolicy bad : {RetryPolicy{3, -1, 20}, RetryPolicy{3, nan, 20}, RetryPolicy{3, 0.1, -1},
                          RetryPolicy{3, 0.1, nan}, RetryPolicy{3, inf, inf}, RetryPolicy{3, 1e308, 1e308}}) {
    const double b = backoff_seconds(bad, 2000, 1.0);
    EXPECT_TRUE(std::isfinite(b));
    EXPECT_GE(b, 0.0);
  }
  EXPECT_DOUBLE_EQ(backoff_seconds(RetryPolicy{3, 0, 20}, 10, 1.0), 0.0);
}

TEST(RetryCode, FromHttp) {
  EXPECT_EQ(code_for_http(200, ""), Code::kOk);
  EXPECT_EQ(code_for_http(206, ""), Code::kOk);
  EXPECT_EQ(code_for_http(200, "InternalError"), Code::kUnavailable);
  EXPECT_EQ(code_for_http(200, "SlowDown"), Code::kUnavailable);
  EXPECT_EQ(code_for_http(200, "WhoKnows"), Code::kIOError);
  EXPECT_EQ(code_for_http(404, ""), Code::kNotFound);
  EXPECT_EQ(code_for_http(404, "NoSuchKey"), Code::kNotFound);
  EXPECT_EQ(code_for_http(404, "NoSuchBucket"), Code::kNotFound);
  EXPECT_EQ(code_for_http(404, "NoSuchUpload"), Code::kNotFound);
  EXPECT_EQ(code_for_http(403, ""), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(401, ""), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(403, "AccessDenied"), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(403, "SignatureDoesNotMatch"), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(403, "InvalidAccessKeyId"), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(403, "RequestTimeTooSkewed"), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(412, ""), Code::kFailedPrecondition);
  EXPECT_EQ(code_for_http(412, "PreconditionFailed"), Code::kFailedPrecondition);
  EXPECT_EQ(code_for_http(304, ""), Code::kFailedPrecondition);
  EXPECT_EQ(code_for_http(409, "BucketNotEmpty"), Code::kFailedPrecondition);
  EXPECT_EQ(code_for_http(409, "OperationAborted"), Code::kUnavailable);
  EXPECT_EQ(code_for_http(409, "BucketAlreadyOwnedByYou"), Code::kAlreadyExists);
  EXPECT_EQ(code_for_http(400, ""), Code::kInvalidArgument);
  EXPECT_EQ(code_for_http(400, "EntityTooSmall"), Code::kInvalidArgument);
  EXPECT_EQ(code_for_http(400, "InvalidPart"), Code::kInvalidArgument);
  EXPECT_EQ(code_for_http(400, "BadDigest"), Code::kDataLoss);
  EXPECT_EQ(code_for_http(400, "XAmzContentSHA256Mismatch"), Code::kDataLoss);
  EXPECT_EQ(code_for_http(400, "RequestTimeout"), Code::kUnavailable);
  EXPECT_EQ(code_for_http(416, ""), Code::kInvalidArgument);
  EXPECT_EQ(code_for_http(501, "NotImplemented"), Code::kUnimplemented);
  EXPECT_EQ(code_for_http(507, ""), Code::kNoSpace);
  EXPECT_EQ(code_for_http(403, "QuotaExceeded"), Code::kNoSpace);
  for (long s : {408L, 429L, 500L, 502L, 503L, 504L}) EXPECT_EQ(code_for_http(s, ""), Code::kUnavailable);
  EXPECT_EQ(code_for_http(500, "AccessDenied"), Code::kPermissionDenied);
  EXPECT_EQ(code_for_http(0, ""), Code::kIOError);
  EXPECT_EQ(code_for_http(302, ""), Code::kIOError);
  EXPECT_EQ(code_for_http(-1, ""), Code::kIOError);
}

TEST(RetryCode, RetryableExactlyWhenUnavailable) {
  // The predicate and the mapping agree: kUnavailable is Status::retryable().
  for (long s : {0L, 200L, 304L, 400L, 401L, 403L, 404L, 408L, 409L, 412L, 429L, 500L, 501L, 502L,
                 503L, 504L, 507L})
    for (const char* code : {"", "SlowDown", "InternalError", "NoSuchKey", "AccessDenied", "BadDigest",
                             "OperationAborted", "RequestTimeTooSkewed", "Unknown"}) {
      if (s >= 200 && s < 300 && std::string_view(code).empty()) continue;  // success
      EXPECT_EQ(retryable_http(s, code), code_for_http(s, code) == Code::kUnavailable)
          << s << " " << code;
    }
}

}  // namespace
}  // namespace ckptio::s3
