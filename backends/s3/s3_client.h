// One S3 request, signed and retried: the layer between the HTTP loop
// (http_client.h) and the Storage implementation (s3_storage.h).
//
// Every attempt is signed anew (SigV4 dates are part of the signature), with
// the credentials current then (credentials.h), on the HTTP loop right before
// it is sent: not when it is queued (a retry's backoff, a wait for one of
// max_connections), so a signature is never older than a moment when it
// leaves, however long the queue (S3 refuses one over 15 minutes old).
// A request signed for the wrong region is answered with the bucket's region
// (x-amz-bucket-region): the client switches to it, for this request (once,
// at no retry cost) and every later one, as boto3 does, and logs it.
// Retries follow the one predicate in retry.h, with full-jitter exponential
// backoff scheduled on the HTTP loop (no thread sleeps). The final error names
// the operation and key, the HTTP status, the S3 error code and message, and
// the number of attempts; it never contains credentials.
//
// Thread safety: execute() may be called from any thread, including from a
// completion callback. Callbacks run on the HTTP loop thread and must not
// throw (http_client.h).
//
// Out of memory: execute() throws std::bad_alloc having queued nothing. On
// the loop, an attempt refused memory (its signing, its response, a retry's
// queueing) ends the request with kResourceExhausted, never retried.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/s3/http_client.h"
#include "backends/s3/s3_config.h"
#include "ckptio/status.h"

namespace ckptio::s3 {

struct S3Op {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string key;     // object key in the bucket; "" for bucket-level calls
  std::vector<std::pair<std::string, std::string>> query;    // decoded
  std::vector<std::pair<std::string, std::string>> headers;  // all signed
  std::span<const std::byte> body;  // borrowed until the callback runs
  // true: the body's SHA-256 is signed (the server checks it); false:
  // UNSIGNED-PAYLOAD (data parts: their crc32c is checked on restore).
  bool sign_payload = true;
  std::byte* sink = nullptr;  // see HttpRequest
  uint64_t sink_size = 0;
  std::vector<std::span<std::byte>> scatter;
  uint64_t max_body = 64ull << 20;
  // Judges a 2xx response. A non-OK status fails the attempt; it is retried
  // when retryable() (e.g. an <Error> inside a 200, a truncated body). Also
  // asked about a 2xx whose body overflowed the sink: its error, if any,
  // replaces the generic kDataLoss "larger than expected".
  std::function<Status(const HttpResponse&)> check;
  // If set, receives how many times the request was sent, before the
  // callback runs: its attempts and libcurl's own resends of a request with
  // a body (HttpResponse::resends). CompleteMultipartUpload tells a retry
  // that may have met its own success so.
  int* attempts = nullptr;
  // If set: once true, an attempt not yet sent (queued, or waiting out a
  // retry's backoff) fails with kCancelled instead of being sent
  // (WritableObject::cancel).
  std::shared_ptr<const std::atomic<bool>> cancelled;
};

using S3Done = std::function<void(Status, HttpResponse)>;

struct S3ClientStats {
  uint64_t requests = 0;  // attempts sent
  uint64_t retries = 0;
};

class S3Client {
 public:
  S3Client(S3Config config, std::string bucket);
  ~S3Client();

  void execute(S3Op op, S3Done done);
  // Blocking form; never call it from a callback.
  std::pair<Status, HttpResponse> execute_sync(S3Op op);

  const S3Config& config() const { return config_; }
  const std::string& bucket() const { return bucket_; }
  // "s3://bucket/key" for messages.
  std::string describe(const std::string& key) const;
  S3ClientStats stats() const;
  uint64_t connections_opened() const { return http_.connections_opened(); }

 private:
  struct Attempt;
  // Queues an attempt on the HTTP loop (after `delay`); prepare() makes its
  // URL and signs it there, when it is sent.
  // Throws having queued nothing.
  void send(const std::shared_ptr<Attempt>& a, std::chrono::milliseconds delay);
  void prepare(Attempt& a, HttpRequest& req);
  void on_response(const std::shared_ptr<Attempt>& a, HttpResponse resp) noexcept;
  // What on_response makes of a response: the request's status, and whether
  // to send the attempt again (after `delay`) instead of reporting it.
  Status judge(Attempt& a, const HttpResponse& resp, bool& again, std::chrono::milliseconds& delay);

  // The bucket's region, as the server named it (x-amz-bucket-region on a
  // 301, 400 or 403): later attempts sign for it and, on AWS's default
  // endpoint, go to that region's endpoint. False for a malformed name.
  bool follow_region(const std::string& region);

  const S3Config config_;
  const std::string bucket_;
  std::string scheme_;  // "http" or "https"
  const bool default_aws_endpoint_;  // config_.endpoint is default_s3_endpoint(region)
  mutable std::mutex region_mu_;
  std::string region_;  // signing region; config_.region until the server says otherwise
  std::string host_;    // host[:port] of the endpoint
  HttpClient http_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace ckptio::s3
