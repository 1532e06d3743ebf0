#include "backends/s3/s3_client.h"

#include <curl/curl.h>

#include <cctype>
#include <future>
#include <random>
#include <string_view>

#include "backends/s3/checksum.h"
#include "backends/s3/credentials.h"
#include "backends/s3/retry.h"
#include "backends/s3/s3_xml.h"
#include "backends/s3/sigv4.h"
#include "src/util/allocate.h"
#include "src/util/log.h"
#include "src/util/printable.h"

namespace ckptio::s3 {

namespace {

double uniform01() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

HttpClientOptions http_options(const S3Config& c) {
  HttpClientOptions o;
  o.max_in_flight = c.max_connections;
  o.connect_timeout_s = c.connect_timeout_s;
  o.stall_timeout_s = c.request_timeout_s;
  return o;
}

}  // namespace

struct S3Client::Attempt {
  S3Op op;
  S3Done done;
  std::string payload_hash;
  int attempts = 0;
  int resends = 0;  // by libcurl itself, over all attempts (HttpResponse::resends)
  std::string signed_region;  // of the attempt in flight
  bool redirected = false;    // sent again for the bucket's region once already
  int damaged = 0;            // attempts whose body the server found damaged (body_mismatch)
};

S3Client::S3Client(S3Config config, std::string bucket)
    : config_(std::move(config)),
      bucket_(std::move(bucket)),
      default_aws_endpoint_(config_.endpoint == default_s3_endpoint(config_.region)),
      region_(config_.region),
      http_(http_options(config_)) {
  std::string ep = config_.endpoint;
  size_t sep = ep.find("://");
  scheme_ = sep == std::string::npos ? "https" : ep.substr(0, sep);
  host_ = sep == std::string::npos ? ep : ep.substr(sep + 3);
  while (!host_.empty() && host_.back() == '/') host_.pop_back();
}

bool S3Client::follow_region(const std::string& region) {
  // A region name, nothing else: it goes into a host name and a signature.
  if (region.empty() || region.size() > 64) return false;
  for (char c : region)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  std::lock_guard lock(region_mu_);
  if (region == region_) return true;  // another request switched already
  logging::warn("ckptio: s3://{} is in region {}, not {}: switching (set AWS_REGION={} or --s3-region {} "
               "to save the extra request)",
               bucket_, region, region_, region, region);
  region_ = region;
  if (default_aws_endpoint_) host_ = "s3." + region + "." + std::string(aws_dns_suffix(region));
  return true;
}

S3Client::~S3Client() = default;

std::string S3Client::describe(const std::string& key) const {
  return "s3://" + bucket_ + (key.empty() ? "" : "/" + key);
}

S3ClientStats S3Client::stats() const { return {requests_.load(), retries_.load()}; }

namespace {

// PutObject, CopyObject and CreateMultipartUpload make an object; UploadPart
// (and UploadPartCopy) must not repeat the encryption headers.
bool creates_object(const S3Op& op) {
  if (op.key.empty()) return false;
  auto has = [&](std::string_view name) {
    for (const auto& [k, v] : op.query)
      if (k == name) return true;
    return false;
  };
  if (op.method == "PUT") return !has("partNumber");
  if (op.method == "POST") return has("uploads");
  return false;
}

// PutObject and UploadPart: the requests whose body becomes object bytes.
bool uploads_body(const S3Op& op) { return op.method == "PUT" && !op.key.empty(); }

bool has_header(const S3Op& op, std::string_view lower_name) {
  for (const auto& [k, v] : op.headers) {
    if (k.size() != lower_name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < k.size() && same; ++i)
      same = std::tolower(static_cast<unsigned char>(k[i])) == lower_name[i];
    if (same) return true;
  }
  return false;
}

}  // namespace

void S3Client::execute(S3Op op, S3Done done) {
  if (creates_object(op)) {
    if (!config_.sse.empty()) op.headers.emplace_back("x-amz-server-side-encryption", config_.sse);
    if (!config_.sse_kms_key_id.empty())
      op.headers.emplace_back("x-amz-server-side-encryption-aws-kms-key-id", config_.sse_kms_key_id);
    if (!config_.storage_class.empty()) op.headers.emplace_back("x-amz-storage-class", config_.storage_class);
  }
  // The body's CRC-32C, so that a server that checks it refuses a body
  // damaged on the way (signed: every op header is). Once per request, not
  // per attempt; the multipart writer sets its parts' itself (it lists them
  // again in CompleteMultipartUpload).
  if (config_.checksums && uploads_body(op) && !has_header(op, kChecksumHeader))
    op.headers.emplace_back(kChecksumHeader, crc32c_base64(op.body));
  auto a = std::make_shared<Attempt>();
  a->payload_hash = op.sign_payload ? sha256_hex(op.body) : "UNSIGNED-PAYLOAD";
  a->op = std::move(op);
  a->done = std::move(done);
  send(std::move(a), std::chrono::milliseconds(0));
}

std::pair<Status, HttpResponse> S3Client::execute_sync(S3Op op) {
  std::promise<std::pair<Status, HttpResponse>> p;
  auto f = p.get_future();
  execute(std::move(op), [&p](Status st, HttpResponse r) { p.set_value({std::move(st), std::move(r)}); });
  return f.get();
}

void S3Client::send(const std::shared_ptr<Attempt>& a, std::chrono::milliseconds delay) {
  const S3Op& op = a->op;
  HttpRequest req;
  req.method = op.method;
  req.body = op.body;
  req.sink = op.sink;
  req.sink_size = op.sink_size;
  req.scatter = op.scatter;
  req.max_body = op.max_body;
  req.retry = a->attempts > 0;
  // URL and signature are made by the HTTP loop when the attempt leaves its
  // queue (after the backoff and any wait for a connection slot), not here:
  // a request signed when queued could be sent minutes later, and S3 refuses
  // a signature over 15 minutes old (403 RequestTimeTooSkewed).
  req.prepare = [this, a](HttpRequest& r) { prepare(*a, r); };
  HttpDone on_done = [this, a](HttpResponse r) { on_response(a, std::move(r)); };
  ++a->attempts;
  ++requests_;
  try {
    http_.submit(std::move(req), std::move(on_done), delay);
  } catch (...) {  // nothing queued
    --a->attempts;
    --requests_;
    throw;
  }
}

// On the HTTP loop thread, right before the attempt is sent: the endpoint
// and region current now, the credentials current now, the date now.
void S3Client::prepare(Attempt& a, HttpRequest& req) {
  const S3Op& op = a.op;
  if (op.cancelled && op.cancelled->load(std::memory_order_relaxed)) {
    req.cancelled = true;
    return;
  }
  std::string host, region;
  {
    std::lock_guard lock(region_mu_);
    host = host_;
    region = region_;
  }
  a.signed_region = region;
  SignableRequest sr;
  sr.method = op.method;
  std::string path;
  if (config_.path_style) {
    sr.host = host;
    path = "/" + bucket_ + (op.key.empty() ? "/" : "/" + encode_key_path(op.key));
  } else {
    sr.host = bucket_ + "." + host;
    path = "/" + encode_key_path(op.key);
  }
  sr.path = path;
  sr.query = op.query;
  sr.headers = op.headers;
  sr.payload_hash = a.payload_hash;

  std::string query = canonical_query(op.query);
  req.url = scheme_ + "://" + sr.host + path + (query.empty() ? "" : "?" + query);
  req.headers = op.headers;
  if (config_.anonymous) {
    req.headers.emplace_back("x-amz-content-sha256", a.payload_hash);
  } else {
    // Renewed credentials: the set current now, for this attempt.
    const Credentials creds = config_.credential_provider ? config_.credential_provider->current() : Credentials{};
    for (auto& h : sign(sr, config_.credential_provider ? creds : config_.creds, region, "s3", amz_date_now()))
      req.headers.push_back(std::move(h));
  }
}

Status S3Client::judge(Attempt& a, const HttpResponse& resp, bool& again, std::chrono::milliseconds& delay) {
  const std::string what = a.op.method + " " + describe(a.op.key);
  Status st;
  if (resp.curl_code != CURLE_OK) {
    if (resp.body_too_large) {
      st = Status(Code::kDataLoss, what + ": response body larger than expected");
      // A 2xx the op's check finds wrong (a 200 with the whole object to a
      // ranged GET) is reported as the check says.
      if (resp.status >= 200 && resp.status < 300 && a.op.check) {
        Status why = a.op.check(resp);
        if (!why.ok()) st = why.annotate(what);
      }
    } else {
      Code c = retryable_transport(resp.curl_code) ? Code::kUnavailable : Code::kIOError;
      if (resp.curl_code == CURLE_ABORTED_BY_CALLBACK) c = Code::kCancelled;
      if (resp.curl_code == CURLE_OUT_OF_MEMORY) c = Code::kResourceExhausted;
      st = Status(c, what + ": " + resp.curl_error);
    }
  } else if (resp.status >= 200 && resp.status < 300) {
    if (a.op.check) {
      st = a.op.check(resp);
      if (!st.ok()) st = st.annotate(what);
    }
  } else {
    // Signed for the wrong region: S3 names the bucket's (301 PermanentRedirect,
    // 400 AuthorizationHeaderMalformed, 403 on a HEAD). Once per request, and
    // not counted against its attempts.
    const std::string* bucket_region = resp.header("x-amz-bucket-region");
    if (!a.redirected && bucket_region && *bucket_region != a.signed_region &&
        (resp.status == 301 || resp.status == 400 || resp.status == 403) && follow_region(*bucket_region)) {
      a.redirected = true;
      --a.attempts;
      again = true;
      delay = std::chrono::milliseconds(0);
      return Status::OK();
    }
    std::optional<S3Error> err = parse_error(resp.body);
    std::string s3code = err ? err->code : "";
    std::string msg = what + ": HTTP " + std::to_string(resp.status);
    // (The server's text, quoted: control bytes escaped, its length bounded.)
    if (err) msg += " " + printable(err->code, 128) + (err->message.empty() ? "" : ": " + printable(err->message, 512));
    if (config_.credential_provider && (resp.status == 400 || resp.status == 403)) {
      const std::string why = config_.credential_provider->stale_reason();
      if (!why.empty()) msg += " (" + why + ")";
    }
    st = Status(code_for_http(resp.status, s3code), msg);
    if (retryable_http(resp.status, s3code)) st = Status(Code::kUnavailable, msg);
    if (body_mismatch(s3code)) {
      // The body arrived damaged: sent again from memory, a bounded number of
      // times (retry.h); then kDataLoss, saying what that means.
      if (++a.damaged < kBodyMismatchAttempts && a.attempts < config_.retry.max_attempts) {
        st = Status(Code::kUnavailable, msg);
      } else {
        st = Status(st.code(), msg + " (the server received a body other than the one sent, " +
                                   std::to_string(a.damaged) +
                                   " times: damaged on the way each time, or changed in memory while it was sent)");
      }
    } else if (has_header(a.op, kChecksumHeader) && (resp.status == 400 || resp.status == 501) &&
               (s3code == "InvalidRequest" || s3code == "InvalidArgument" || s3code == "NotImplemented")) {
      // A server that does not know the checksum header may refuse it.
      msg += " (if this server refuses x-amz-checksum-crc32c, turn upload checksums off: "
             "AWS_REQUEST_CHECKSUM_CALCULATION=when_required, --s3-checksums off, or S3Options::checksums = \"off\")";
      st = Status(st.code(), msg);
    }
  }
  if (!st.ok() && st.retryable() && a.attempts < config_.retry.max_attempts) {
    double s = backoff_seconds(config_.retry, a.attempts - 1, uniform01());
    again = true;
    delay = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    return st;
  }
  if (!st.ok() && a.attempts > 1)
    st = Status(st.code(), st.message() + " (after " + std::to_string(a.attempts) + " attempts)");
  return st;
}

// On the HTTP loop thread. Throws nothing: whatever is refused memory here
// ends the request with kResourceExhausted.
void S3Client::on_response(const std::shared_ptr<Attempt>& a, HttpResponse resp) noexcept {
  a->resends += resp.resends;
  bool again = false;
  std::chrono::milliseconds delay{0};
  Status st = status_or_out_of_memory([&] { return judge(*a, resp, again, delay); });
  if (again) {
    try {
      if (!st.ok()) ++retries_;  // a redirect is not a retry
      send(a, delay);
      return;
    } catch (...) {
      if (!st.ok()) --retries_;
      st = status_of_exception("queue a retry of an S3 request");
    }
  }
  if (a->op.attempts) *a->op.attempts = a->attempts + a->resends;
  S3Done done = std::move(a->done);
  done(std::move(st), std::move(resp));
}



}  // namespace ckptio::s3
