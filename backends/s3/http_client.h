// A small asynchronous HTTP/1.1 client on libcurl's multi interface: one
// event-loop thread, keep-alive connections reused across requests, a bounded
// number of requests in flight, bodies streamed from and into caller memory.
//
// It knows nothing of S3: no signing, no retries (s3_client.h does both).
//
// Thread safety: submit() may be called from any thread. Completion callbacks
// run on the loop thread (named "ckptio-http"), one at a time; they must not
// block (they may call submit()) and must not throw: a callback refused memory
// reports that through its own channel (an S3 client's status). The destructor
// fails every request still queued or in flight with CURLE_ABORTED_BY_CALLBACK
// and joins the loop.
//
// Out of memory: submit() throws std::bad_alloc having queued nothing; on the
// loop, a request whose preparation, bookkeeping or response headers are
// refused memory fails alone with CURLE_OUT_OF_MEMORY.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ckptio::s3 {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  // Request body, borrowed: must stay valid until the callback runs.
  std::span<const std::byte> body;
  // Where a 2xx response body goes. With `sink` set the body is written
  // straight into [sink, sink + sink_size) and a longer body fails the
  // request; otherwise it is collected into HttpResponse::body, up to
  // `max_body` bytes. Non-2xx bodies (S3 error XML) always go to `body`.
  std::byte* sink = nullptr;
  uint64_t sink_size = 0;
  // Or a list of buffers filled in order, as if they were one sink (a GET
  // of adjacent ranges scattered to several destinations). When non-empty
  // it replaces `sink`; `sink_size` is ignored.
  std::vector<std::span<std::byte>> scatter;
  uint64_t max_body = 64ull << 20;
  // Called on the loop thread right before the transfer starts -- after any
  // delay (a retry's backoff) and any wait for a free slot among
  // max_in_flight -- to finish the request (url, headers): the S3 client signs
  // here, so that a signature's date is the moment of sending however long
  // the request queued. It must not block.
  std::function<void(HttpRequest&)> prepare;
  // Set by prepare: the request is not to be sent after all (its writer was
  // cancelled). It fails with CURLE_ABORTED_BY_CALLBACK, unsent.
  bool cancelled = false;
  // A retry: once its backoff is over it goes before the requests waiting
  // for their first attempt. What was begun finishes first, so an endpoint
  // that fails everything fails the first request after its own attempts,
  // not after every queued request's attempts but the last in turn (with
  // thousands of parts queued: hours before a save reported its failure).
  bool retry = false;
};

struct HttpResponse {
  int curl_code = 0;        // CURLcode; 0 when the exchange completed
  std::string curl_error;   // curl's message when curl_code != 0
  long status = 0;          // HTTP status of the final response
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  uint64_t sink_bytes = 0;  // bytes written into the sink
  bool body_too_large = false;
  // Times libcurl sent the request again by itself: a reused connection that
  // died before any answer is retried on a new one, and a body already read
  // is rewound for it. The server may have acted on the first send.
  int resends = 0;

  const std::string* header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? nullptr : &it->second;
  }
};

struct HttpClientOptions {
  uint32_t max_in_flight = 32;     // requests handed to curl at once
  double connect_timeout_s = 10;
  // A transfer that moves no byte for this long fails with
  // CURLE_OPERATION_TIMEDOUT (a stall, not a slow transfer): counted from the
  // last byte either way, checked about once a second.
  double stall_timeout_s = 60;
  // Shared between calls: CA file etc. come from curl's defaults.
  bool verify_tls = true;
};

using HttpDone = std::function<void(HttpResponse)>;

class HttpClient {
 public:
  explicit HttpClient(const HttpClientOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Queues `req`; `done` runs once, on the loop thread, after `delay`.
  void submit(HttpRequest req, HttpDone done,
              std::chrono::milliseconds delay = std::chrono::milliseconds(0));

  // Blocking convenience over submit(). Do not call from a callback.
  HttpResponse perform(HttpRequest req);

  // Counters for tests and statistics.
  uint64_t requests_completed() const;
  uint64_t connections_opened() const;

 private:
  struct Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace ckptio::s3
