// read(): ranged GETs of at most one part each, adjacent requests merged
// (read_plan.h), written straight into the caller's buffers; an object read
// by several GETs is HEADed first so that its GETs carry If-Match on one
// version. s3_storage.h states the protocol; stat() uses the HEAD here too.

#include <charconv>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>

#include "backends/s3/read_plan.h"
#include "backends/s3/s3_storage_internal.h"
#include "src/util/allocate.h"
#include "src/util/log.h"
#include "src/util/printable.h"

namespace ckptio::s3::storage_internal {
namespace {

std::optional<uint64_t> parse_u64(const std::string* s) {
  if (!s) return std::nullopt;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
  if (ec != std::errc() || p != s->data() + s->size()) return std::nullopt;
  return v;
}

// Counts outstanding callbacks and keeps the first error.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t pending = 0;
  Status first;

  void add(uint64_t n = 1) {
    std::lock_guard lock(mu);
    pending += n;
  }
  void done(const Status& st) noexcept {
    std::lock_guard lock(mu);
    if (!st.ok() && first.ok()) first = status_or_out_of_memory([&] { return st; });
    if (--pending == 0) cv.notify_all();
  }
  Status wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
    return first;
  }
};

}  // namespace

Status S3StorageImpl::read(std::span<const ReadRequest> requests) {
  // What throws below throws with nothing in flight: the loops that queue
  // requests catch, and wait for what they queued.
  try {
    return read_ranges(requests);
  } catch (...) {
    return status_of_exception("an S3 read");
  }
}

Status S3StorageImpl::read_ranges(std::span<const ReadRequest> requests) {
  for (const ReadRequest& r : requests) CKPTIO_RETURN_IF_ERROR(check_storage_key(r.key));
  // Ranged GETs, adjacent requests merged (read_plan.h), straight into the
  // caller's buffers.
  std::vector<RangedGet> gets = plan_gets(requests, read_get_bytes());
  // 1. Size and ETag, in parallel, of each object read by more than one
  //    GET: the GETs then carry If-Match, so the pieces are of one version,
  //    and a read past the end fails before any GET. An object read by one
  //    GET (a save's data objects are one part each) needs no HEAD: one GET
  //    sees one version, and its Content-Range tells the object's size.
  std::map<std::string, Result<Head>> heads;
  {
    std::map<std::string_view, int> gets_per_key;
    for (const RangedGet& g : gets) ++gets_per_key[g.key];
    for (const ReadRequest& r : requests) {
      auto it = gets_per_key.find(r.key);
      // (Zero-length reads need no GET, but their object must exist.)
      if (it == gets_per_key.end() || it->second > 1) heads.emplace(r.key, Status(Code::kInternal, "unset"));
    }
  }
  {
    Waiter w;
    std::mutex mu;
    w.add(heads.size());
    size_t queued = 0;
    Status refused;
    for (auto& [key, slot] : heads) {
      try {  // head_async() queues the HEAD or throws having queued nothing
        head_async(full(key), [&, slot_ptr = &slot](Result<Head> h) {
          {
            std::lock_guard lock(mu);
            *slot_ptr = std::move(h);
          }
          w.done(Status::OK());
        });
      } catch (...) {
        refused = status_of_exception("queue a HEAD of a read");
        break;
      }
      ++queued;
    }
    for (size_t i = queued; i < heads.size(); ++i) w.done(Status::OK());  // never queued
    (void)w.wait();  // before `w`, `mu` and `heads` go: the HEADs in flight write there
    CKPTIO_RETURN_IF_ERROR(refused);
  }
  for (const ReadRequest& r : requests) {
    auto it = heads.find(r.key);
    if (it == heads.end()) continue;
    const auto& h = it->second;
    if (!h.ok()) return h.status();
    if (r.offset > h->size || r.length > h->size - r.offset)
      return past_the_end(r.key, r.offset, r.length, h->size);
  }
  // 2. The GETs.
  Waiter w;
  Status refused;
  logging::debug("ckptio: s3 read of {} ranges: {} GETs, {} HEADs", requests.size(), gets.size(), heads.size());
  for (RangedGet& g : gets) try {
    auto head = heads.find(g.key);
    const bool lone = head == heads.end();  // the object's only GET
    const uint64_t off = g.offset, len = g.length;
    S3Op op;
    op.method = "GET";
    op.key = full(g.key);
    op.headers = {{"range", "bytes=" + std::to_string(off) + "-" + std::to_string(off + len - 1)}};
    if (!lone && !head->second->etag.empty()) op.headers.emplace_back("if-match", head->second->etag);
    if (g.dst.size() == 1) {
      op.sink = g.dst[0].data();
      op.sink_size = len;
    } else {
      op.scatter = std::move(g.dst);
    }
    op.check = [this, lone, key = g.key, off, len](const HttpResponse& resp) {
      // The answer must be the bytes asked for: a 206 starting at `off`, or a
      // 200 (the whole object: the server ignored the Range) only for a read
      // of a whole object. Anything else is the server's fault, not damage to
      // the object: kUnavailable (retried; then restore-latest stops on it
      // rather than skip the step as damaged).
      const std::string asked = "bytes=" + std::to_string(off) + "-" + std::to_string(off + len - 1);
      if (resp.status == 206) {
        const std::optional<std::pair<uint64_t, uint64_t>> got = content_range(resp);
        if (!got || got->first != off || got->second > off + len - 1) {
          const std::string* cr = resp.header("content-range");
          return Status(Code::kUnavailable, "HTTP 206 with Content-Range '" + (cr ? printable(*cr, 128) : std::string()) +
                                                "' to a GET of " + asked);
        }
      } else if (resp.status == 200) {
        const std::optional<uint64_t> size = object_size(resp);
        if (lone && size && off + len > *size) return past_the_end(key, off, len, *size);
        if (off != 0 || size != len)
          return Status(Code::kUnavailable, "HTTP 200 (the whole object" +
                                                (size ? ", " + std::to_string(*size) + " bytes" : std::string()) +
                                                ") to a GET of " + asked + ": the server ignored the Range");
      } else {
        return io_error("unexpected HTTP " + std::to_string(resp.status) + " to a ranged GET");
      }
      if (resp.sink_bytes != len) {
        // Without a HEAD, a short body from an object that ends too soon is
        // data loss, not a transfer to retry.
        const std::optional<uint64_t> size = lone ? object_size(resp) : std::nullopt;
        if (size && off + len > *size) return past_the_end(key, off, len, *size);
        return Status(Code::kUnavailable, "truncated body: " + std::to_string(resp.sink_bytes) +
                                              " of " + std::to_string(len) + " bytes");
      }
      return Status::OK();
    };
    S3Done on_done = [&w, this, lone, key = g.key, off, len](Status st, HttpResponse resp) {
      // On the HTTP loop: throws nothing (http_client.h).
      st = status_or_out_of_memory([&]() -> Status {
        if (st.code() == Code::kFailedPrecondition)
          return data_loss(st.message() + " (the object changed while it was being read)");
        // 416: the range starts past the end of an object read without a HEAD.
        if (lone && resp.status == 416) return past_the_end(key, off, len, object_size(resp).value_or(0));
        return std::move(st);
      });
      w.done(st);
    };
    w.add();
    try {  // execute() queues the GET or throws having queued nothing
      client_.execute(std::move(op), std::move(on_done));
    } catch (...) {
      w.done(Status::OK());
      throw;
    }
  } catch (...) {
    refused = status_of_exception("queue a ranged GET of a read");
    break;
  }
  Status got = w.wait();  // before `w` and the caller's buffers go: the GETs in flight use them
  return refused.ok() ? got : refused;
}

Status S3StorageImpl::past_the_end(const std::string& key, uint64_t offset, uint64_t length,
                                   uint64_t size) const {
  return data_loss(client_.describe(full(key)) + ": read of [" + std::to_string(offset) + ", " +
                   std::to_string(offset + length) + ") past the end (" + std::to_string(size) + " bytes)");
}

// The first and last byte of a 206's Content-Range ("bytes 0-9/10"), or
// nullopt when there is none or it is malformed.
std::optional<std::pair<uint64_t, uint64_t>> S3StorageImpl::content_range(const HttpResponse& resp) {
  const std::string* cr = resp.header("content-range");
  if (!cr || cr->rfind("bytes ", 0) != 0) return std::nullopt;
  const size_t dash = cr->find('-', 6), slash = cr->find('/', 6);
  if (dash == std::string::npos || slash == std::string::npos || dash > slash) return std::nullopt;
  const std::string first = cr->substr(6, dash - 6), last = cr->substr(dash + 1, slash - dash - 1);
  const std::optional<uint64_t> a = parse_u64(&first), b = parse_u64(&last);
  if (!a || !b || *b < *a) return std::nullopt;
  return std::make_pair(*a, *b);
}

// The object's size from a GET's Content-Range ("bytes 0-9/10", or
// "bytes */10" with a 416), or from Content-Length of a 200.
std::optional<uint64_t> S3StorageImpl::object_size(const HttpResponse& resp) {
  const std::string* cr = resp.header("content-range");
  const std::string* cl = resp.header("content-length");
  const std::string* text = cr ? cr : resp.status == 200 ? cl : nullptr;
  if (!text) return std::nullopt;
  const size_t slash = cr ? text->rfind('/') : std::string::npos;
  const std::string digits = cr ? (slash == std::string::npos ? "" : text->substr(slash + 1)) : *text;
  if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoull(digits);
}

void S3StorageImpl::head_async(const std::string& full_key, std::function<void(Result<Head>)> done) {
  S3Op op;
  op.method = "HEAD";
  op.key = full_key;
  // On the HTTP loop: throws nothing (http_client.h).
  client_.execute(std::move(op), [this, full_key, done = std::move(done)](Status st, HttpResponse r) {
    Result<Head> head = Status(Code::kResourceExhausted, "out of memory");
    try {
      if (!st.ok()) {
        if (st.code() == Code::kNotFound) st = not_found(client_.describe(full_key) + " does not exist");
        head = std::move(st);
      } else if (auto size = parse_u64(r.header("content-length")); !size) {
        head = io_error(client_.describe(full_key) + ": HEAD without a Content-Length");
      } else {
        const std::string* etag = r.header("etag");
        head = Head{*size, etag ? *etag : ""};
      }
    } catch (...) {
      head = Status(Code::kResourceExhausted, "out of memory");
    }
    done(std::move(head));
  });
}

Result<S3StorageImpl::Head> S3StorageImpl::head(const std::string& full_key) {
  std::promise<Result<Head>> p;
  auto f = p.get_future();
  head_async(full_key, [&p](Result<Head> h) { p.set_value(std::move(h)); });
  return f.get();
}

}  // namespace ckptio::s3::storage_internal
