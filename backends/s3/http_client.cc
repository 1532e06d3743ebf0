// The loop: one thread owns the CURLM handle and every easy handle. Other
// threads only push into `incoming` (under `mu`) and wake the loop with
// curl_multi_wakeup(). Requests wait in `delayed` (retry backoff) and `ready`
// until fewer than max_in_flight are running, so that no request's timeout
// starts ticking while it queues inside curl for a connection; a request's
// prepare hook (the S3 client's signing) runs when it leaves `ready`.
//
// Out of memory: the loop never lets an exception out. A request whose
// bookkeeping, preparation or response headers the system refuses memory for
// fails alone with CURLE_OUT_OF_MEMORY ("out of memory", which fits in a
// std::string without allocating); the others go on (tests/alloc/,
// docs/reliability.md "Out of memory").
#include "backends/s3/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <new>
#include <thread>

#include <pthread.h>

namespace ckptio::s3 {

namespace {

using Clock = std::chrono::steady_clock;

// Short enough for std::string's inline buffer: assigning it allocates nothing.
constexpr const char* kOutOfMemory = "out of memory";

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

struct Transfer {
  HttpRequest req;
  HttpDone done;
  HttpResponse resp;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  uint64_t body_pos = 0;
  bool decided = false;  // whether the body goes to the sink is known
  bool to_sink = false;
  size_t seg = 0;          // scatter: the buffer being filled
  uint64_t seg_pos = 0;    // and how far
  Clock::time_point not_before;
  // The stall timer (on_progress): when a byte last moved either way.
  Clock::duration stall_limit{};
  Clock::time_point last_progress;
  curl_off_t seen_down = -1, seen_up = -1;
  bool stalled = false;
  // A callback below was refused memory (a header, an error body): the
  // transfer was aborted and fails with CURLE_OUT_OF_MEMORY.
  bool out_of_memory = false;
};

namespace {

// curl's callbacks are called from C: no exception may leave them. One that
// is refused memory aborts its transfer (a return other than the size).
size_t on_header(char* data, size_t size, size_t n, void* p) noexcept {
  auto* t = static_cast<Transfer*>(p);
  std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (e.g. after 100 Continue)
    t->resp.headers.clear();
    t->decided = false;
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    try {
      std::string name = trim(line.substr(0, colon));
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      t->resp.headers[name] = trim(line.substr(colon + 1));
    } catch (...) {
      t->out_of_memory = true;
      return 0;
    }
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* p) noexcept {
  auto* t = static_cast<Transfer*>(p);
  const size_t len = size * n;
  if (!t->decided) {
    long code = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    t->to_sink = (t->req.sink != nullptr || !t->req.scatter.empty()) && code >= 200 && code < 300;
    t->decided = true;
  }
  if (t->to_sink && !t->req.scatter.empty()) {
    size_t done = 0;
    while (done < len) {
      if (t->seg == t->req.scatter.size()) {
        t->resp.body_too_large = true;
        return 0;
      }
      std::span<std::byte> s = t->req.scatter[t->seg];
      const size_t n = static_cast<size_t>(std::min<uint64_t>(s.size() - t->seg_pos, len - done));
      std::memcpy(s.data() + t->seg_pos, data + done, n);
      done += n;
      t->seg_pos += n;
      if (t->seg_pos == s.size()) {
        ++t->seg;
        t->seg_pos = 0;
      }
    }
    t->resp.sink_bytes += len;
    return len;
  }
  if (t->to_sink) {
    if (t->resp.sink_bytes + len > t->req.sink_size) {
      t->resp.body_too_large = true;
      return 0;  // CURLE_WRITE_ERROR
    }
    std::memcpy(t->req.sink + t->resp.sink_bytes, data, len);
    t->resp.sink_bytes += len;
    return len;
  }
  // Error bodies (S3 XML) are small whatever the caller expected of a success.
  long code = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
  const uint64_t cap = (code >= 200 && code < 300) ? t->req.max_body : std::max<uint64_t>(t->req.max_body, 1 << 20);
  if (t->resp.body.size() + len > cap) {
    t->resp.body_too_large = true;
    return 0;
  }
  try {
    t->resp.body.append(data, len);
  } catch (...) {
    t->out_of_memory = true;
    return 0;
  }
  return len;
}

size_t on_read(char* buf, size_t size, size_t n, void* p) noexcept {
  auto* t = static_cast<Transfer*>(p);
  const uint64_t left = t->req.body.size() - t->body_pos;
  const size_t len = static_cast<size_t>(std::min<uint64_t>(left, size * n));
  std::memcpy(buf, t->req.body.data() + t->body_pos, len);
  t->body_pos += len;
  return len;
}

// A transfer that moves no byte, either way, for stall_timeout_s fails.
// curl's own low-speed check (kept as a backstop) averages the speed over
// its last ~5 s, so after a burst -- a part sent into the socket buffers, or
// half a body received -- it fires up to 5 s late; this one counts from the
// last byte. curl calls it at least once a second, also while nothing moves.
int on_progress(void* p, curl_off_t, curl_off_t dlnow, curl_off_t, curl_off_t ulnow) noexcept {
  auto* t = static_cast<Transfer*>(p);
  const auto now = Clock::now();
  if (dlnow != t->seen_down || ulnow != t->seen_up) {
    t->seen_down = dlnow;
    t->seen_up = ulnow;
    t->last_progress = now;
    return 0;
  }
  if (now - t->last_progress < t->stall_limit) return 0;
  t->stalled = true;
  return 1;  // CURLE_ABORTED_BY_CALLBACK, reported as CURLE_OPERATION_TIMEDOUT
}

int on_seek(void* p, curl_off_t offset, int origin) noexcept {
  auto* t = static_cast<Transfer*>(p);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->req.body.size())
    return CURL_SEEKFUNC_CANTSEEK;
  // curl rewinds a body it has sent (part of) only to send the request again.
  if (offset == 0 && t->body_pos > 0) ++t->resp.resends;
  t->body_pos = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

}  // namespace

struct HttpClient::Loop {
  explicit Loop(const HttpClientOptions& o) : opt(o) {
    global_init();
    if (opt.max_in_flight == 0) opt.max_in_flight = 1;
    // At most max_in_flight easy handles ever exist: handing one back to
    // `idle` never allocates.
    idle.reserve(opt.max_in_flight);
    multi = curl_multi_init();
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, static_cast<long>(opt.max_in_flight));
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, static_cast<long>(opt.max_in_flight));
    thread = std::thread([this] { run(); });
  }

  ~Loop() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    curl_multi_wakeup(multi);
    thread.join();
    for (CURL* e : idle) curl_easy_cleanup(e);
    curl_multi_cleanup(multi);
  }

  void push(std::unique_ptr<Transfer> t) {
    {
      std::lock_guard lock(mu);
      if (!stopping) {
        incoming.push_back(std::move(t));  // or throws, having queued nothing
        t = nullptr;
      }
    }
    if (t) {
      fail(*t, CURLE_ABORTED_BY_CALLBACK, "HTTP client is shutting down");
      return;
    }
    curl_multi_wakeup(multi);
  }

  // Never throws (see the top of the file).
  void run() noexcept {
    // Named for top -H, gdb and perf, and for the allocation sweeps
    // (tests/alloc/), which fail this thread's allocations by its name.
    pthread_setname_np(pthread_self(), "ckptio-http");
    for (;;) {
      bool stop = false;
      {
        std::lock_guard lock(mu);
        stop = stopping;
        arrived.swap(incoming);  // no allocation; no callback under the lock
      }
      if (stop) break;
      for (auto& t : arrived) {
        try {
          delayed.emplace(t->not_before, std::move(t));
        } catch (...) {  // the node: t was not moved
          fail(*t, CURLE_OUT_OF_MEMORY, kOutOfMemory);
        }
      }
      arrived.clear();
      const auto now = Clock::now();
      while (!delayed.empty() && delayed.begin()->first <= now) {
        auto node = delayed.extract(delayed.begin());
        try {
          if (node.mapped()->req.retry) ready.push_front(std::move(node.mapped()));
          else ready.push_back(std::move(node.mapped()));
        } catch (...) {  // a deque block: push_front / push_back moved nothing
          fail(*node.mapped(), CURLE_OUT_OF_MEMORY, kOutOfMemory);
        }
      }
      while (running.size() < opt.max_in_flight && !ready.empty()) {
        std::unique_ptr<Transfer> t = std::move(ready.front());
        ready.pop_front();
        start(std::move(t));
      }
      int still = 0;
      curl_multi_perform(multi, &still);
      int queued = 0;
      while (CURLMsg* m = curl_multi_info_read(multi, &queued)) {
        if (m->msg != CURLMSG_DONE) continue;
        complete(m->easy_handle, m->data.result);
      }
      int timeout_ms = 1000;
      if (!delayed.empty()) {
        auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(delayed.begin()->first -
                                                                          Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count() + 1, 0, timeout_ms));
      }
      if (!ready.empty() && running.size() < opt.max_in_flight) timeout_ms = 0;
      curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
    }
    // Shutdown: everything not finished fails.
    constexpr const char* kShutdown = "HTTP client is shutting down";
    while (!running.empty()) {
      auto node = running.extract(running.begin());
      curl_multi_remove_handle(multi, node.key());
      finish(std::move(node.mapped()), CURLE_ABORTED_BY_CALLBACK, kShutdown);
    }
    for (; !ready.empty(); ready.pop_front()) fail(*ready.front(), CURLE_ABORTED_BY_CALLBACK, kShutdown);
    while (!delayed.empty())
      fail(*delayed.extract(delayed.begin()).mapped(), CURLE_ABORTED_BY_CALLBACK, kShutdown);
    // What the last turn took from `incoming` as it saw `stopping`, then
    // anything still there (push() refuses once stopping: nothing, but cheap).
    for (auto& t : arrived) fail(*t, CURLE_ABORTED_BY_CALLBACK, kShutdown);
    arrived.clear();
    {
      std::lock_guard lock(mu);
      arrived.swap(incoming);
    }
    for (auto& t : arrived) fail(*t, CURLE_ABORTED_BY_CALLBACK, kShutdown);
    arrived.clear();
  }

  // curl_slist_append returns null, keeping the list, when refused memory.
  static void append_header(Transfer& t, const char* line) {
    curl_slist* list = curl_slist_append(t.headers, line);
    if (!list) throw std::bad_alloc();
    t.headers = list;
  }

  // Hands the transfer to curl, or fails it: never throws.
  void start(std::unique_ptr<Transfer> t) noexcept {
    try {
      // The last moment before the request goes out: signed now, not when queued.
      if (t->req.prepare) {
        auto prepare = std::move(t->req.prepare);
        prepare(t->req);
      }
      if (t->req.cancelled) {
        fail(*t, CURLE_ABORTED_BY_CALLBACK, "not sent: its object's writes were cancelled");
        return;
      }
      CURL* e = nullptr;
      if (!idle.empty()) {
        e = idle.back();
        idle.pop_back();
        curl_easy_reset(e);
      } else {
        e = curl_easy_init();
      }
      if (!e) {
        fail(*t, CURLE_OUT_OF_MEMORY, "curl_easy_init failed");
        return;
      }
      t->easy = e;
      const HttpRequest& r = t->req;
      curl_easy_setopt(e, CURLOPT_URL, r.url.c_str());
      curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
      curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
      curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
      curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt.connect_timeout_s * 1000));
      curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(opt.stall_timeout_s)));
      t->stall_limit = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(opt.stall_timeout_s));
      t->last_progress = Clock::now();
      curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
      curl_easy_setopt(e, CURLOPT_XFERINFODATA, t.get());
      curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024);
      curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024);
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, opt.verify_tls ? 1L : 0L);
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, opt.verify_tls ? 2L : 0L);
      curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
      curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
      curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
      curl_easy_setopt(e, CURLOPT_READDATA, t.get());
      curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
      curl_easy_setopt(e, CURLOPT_SEEKDATA, t.get());
      const auto size = static_cast<curl_off_t>(r.body.size());
      if (r.method == "HEAD") {
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
      } else if (r.method == "PUT") {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, size);
      } else if (r.method == "POST") {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, size);
      } else if (r.method != "GET") {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r.method.c_str());
      }
      for (const auto& [k, v] : r.headers) append_header(*t, (k + ": " + v).c_str());
      // No 100-continue round trip before each body; an S3 error arrives
      // after the body instead, which costs only bandwidth on a failure.
      append_header(*t, "Expect:");
      if (r.method == "POST" && r.body.empty()) append_header(*t, "Content-Type:");
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
      auto [it, inserted] = running.emplace(e, std::move(t));  // or throws: t not moved
      if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        t = std::move(it->second);
        running.erase(it);
        finish(std::move(t), CURLE_FAILED_INIT, "curl_multi_add_handle failed");
      }
    } catch (...) {
      if (!t) return;  // not reached: nothing after the emplace throws
      const bool oom = is_bad_alloc();
      finish(std::move(t), oom ? CURLE_OUT_OF_MEMORY : CURLE_FAILED_INIT,
             oom ? kOutOfMemory : "preparing the request threw");
    }
  }

  static bool is_bad_alloc() noexcept {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  void complete(CURL* e, CURLcode code) noexcept {
    auto it = running.find(e);
    curl_multi_remove_handle(multi, e);
    if (it == running.end()) return;
    std::unique_ptr<Transfer> t = std::move(it->second);
    running.erase(it);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    long fresh = 0;
    curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &fresh);
    connections += static_cast<uint64_t>(fresh);
    t->resp.status = status;
    const char* message = code == CURLE_OK ? "" : curl_easy_strerror(code);
    char buf[96];
    if (t->out_of_memory) {
      code = CURLE_OUT_OF_MEMORY;
      message = kOutOfMemory;
    } else if (code == CURLE_ABORTED_BY_CALLBACK && t->stalled) {
      code = CURLE_OPERATION_TIMEDOUT;
      std::snprintf(buf, sizeof buf, "stalled: no byte moved for %g s", opt.stall_timeout_s);
      message = buf;
    }
    finish(std::move(t), code, message);
  }

  // Hands the easy handle back for reuse and runs the callback.
  void finish(std::unique_ptr<Transfer> t, CURLcode code, const char* message) noexcept {
    if (t->easy) idle.push_back(t->easy);  // reserved: never allocates
    t->easy = nullptr;
    if (t->headers) curl_slist_free_all(t->headers);
    t->headers = nullptr;
    fail(*t, code, message);
  }

  // Runs the request's callback, which must not throw (http_client.h).
  void fail(Transfer& t, CURLcode code, const char* message) noexcept {
    t.resp.curl_code = code;
    try {
      t.resp.curl_error = message;
    } catch (...) {  // a message too long for the inline buffer
      t.resp.curl_error.clear();
    }
    ++completed;
    HttpDone done = std::move(t.done);
    done(std::move(t.resp));
  }

  HttpClientOptions opt;
  CURLM* multi = nullptr;
  std::thread thread;

  std::mutex mu;  // guards incoming, stopping
  std::vector<std::unique_ptr<Transfer>> incoming;
  bool stopping = false;
  std::vector<std::unique_ptr<Transfer>> arrived;  // loop thread: swapped with incoming

  // Loop thread only.
  std::multimap<Clock::time_point, std::unique_ptr<Transfer>> delayed;
  std::deque<std::unique_ptr<Transfer>> ready;
  std::map<CURL*, std::unique_ptr<Transfer>> running;
  std::vector<CURL*> idle;

  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> connections{0};
};

HttpClient::HttpClient(const HttpClientOptions& options) : loop_(std::make_unique<Loop>(options)) {}
HttpClient::~HttpClient() = default;

void HttpClient::submit(HttpRequest req, HttpDone done, std::chrono::milliseconds delay) {
  auto t = std::make_unique<Transfer>();
  t->req = std::move(req);
  t->done = std::move(done);
  t->not_before = Clock::now() + delay;
  loop_->push(std::move(t));
}

HttpResponse HttpClient::perform(HttpRequest req) {
  std::promise<HttpResponse> p;
  auto f = p.get_future();
  submit(std::move(req), [&p](HttpResponse r) { p.set_value(std::move(r)); });
  return f.get();
}

uint64_t HttpClient::requests_completed() const { return loop_->completed.load(); }
uint64_t HttpClient::connections_opened() const { return loop_->connections.load(); }

}  // namespace ckptio::s3
