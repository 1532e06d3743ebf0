#include "backends/s3/s3_storage.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "backends/s3/read_plan.h"
#include "backends/s3/s3_client.h"
#include "backends/s3/s3_xml.h"

namespace ckptio::s3 {

namespace {

constexpr uint64_t kMaxParts = 10000;
constexpr uint64_t kMinPart = 5ull << 20;
constexpr size_t kDeleteBatch = 1000;

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string md5_base64(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), md, static_cast<int>(n));
  out.resize(static_cast<size_t>(len));
  return out;
}

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
  void done(const Status& st) {
    std::lock_guard lock(mu);
    if (!st.ok() && first.ok()) first = st;
    if (--pending == 0) cv.notify_all();
  }
  Status wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
    return first;
  }
};

class S3StorageImpl;

// One object being written: a multipart upload, or a single PutObject.
class S3Writer : public WritableObject {
 public:
  // `early`: create_new(), the key holds nothing to replace (see put_whole).
  S3Writer(S3Client& client, std::string key, uint64_t part_size, uint64_t size_hint,
           std::string upload_id, bool early)
      : c_(client), key_(std::move(key)), part_(part_size), hint_(size_hint),
        upload_id_(std::move(upload_id)), early_(early) {}

  ~S3Writer() override {
    if (!closed_) abort();
  }

  uint64_t granularity() const override { return part_; }
  uint64_t alignment() const override { return 1; }

  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    if (upload_id_.empty()) return put_whole(offset, data, std::move(done));
    if (offset % part_ != 0) {
      done(invalid_argument(c_.describe(key_) + ": write offset " + std::to_string(offset) +
                            " is not a multiple of the part size " + std::to_string(part_)));
      return;
    }
    const uint64_t parts = data.empty() ? 0 : (data.size() + part_ - 1) / part_;
    const uint64_t first_part = offset / part_ + 1;
    if (parts == 0) return done(Status::OK());
    if (first_part + parts - 1 > kMaxParts) {
      done(invalid_argument(c_.describe(key_) + ": more than 10000 parts; raise the part size"));
      return;
    }
    // One callback for the whole range, when its last part lands.
    struct Range {
      std::mutex mu;
      uint64_t left;
      Status first;
      IoDone done;
    };
    auto range = std::make_shared<Range>();
    range->left = parts;
    range->done = std::move(done);
    {
      std::lock_guard lock(mu_);
      outstanding_ += parts;
    }
    for (uint64_t i = 0; i < parts; ++i) {
      const uint64_t pn = first_part + i;
      const uint64_t len = std::min<uint64_t>(part_, data.size() - i * part_);
      S3Op op;
      op.method = "PUT";
      op.key = key_;
      op.query = {{"partNumber", std::to_string(pn)}, {"uploadId", upload_id_}};
      op.body = data.subspan(i * part_, len);
      op.sign_payload = c_.config().sign_payloads;
      c_.execute(std::move(op), [this, range, pn, len](Status st, HttpResponse r) {
        const std::string* etag = r.header("etag");
        if (st.ok() && !etag) st = io_error(c_.describe(key_) + ": UploadPart returned no ETag");
        bool last = false;
        IoDone cb;
        {
          std::lock_guard lock(range->mu);
          if (!st.ok() && range->first.ok()) range->first = st;
          last = --range->left == 0;
          if (last) cb = std::move(range->done);
        }
        {
          std::lock_guard lock(mu_);
          if (st.ok()) parts_[pn] = {*etag, len};
          else if (first_.ok()) first_ = st;
        }
        if (last) cb(range->first);
        {
          std::lock_guard lock(mu_);
          if (--outstanding_ == 0) cv_.notify_all();
        }
      });
    }
  }

  Status finish(uint64_t final_size) override {
    Status st = wait_outstanding();
    closed_ = true;
    if (!st.ok()) {
      abort_upload();
      return st;
    }
    if (upload_id_.empty()) {
      if (single_sent_) {
        if (final_size == hint_) return Status::OK();  // stored by write_async
        remove_single();
        return internal_error(c_.describe(key_) + ": object of " + std::to_string(hint_) +
                              " bytes was written whole, then finished at " + std::to_string(final_size));
      }
      if (final_size == 0) return put_empty();
      if (!single_done_ || final_size > single_.size())
        return internal_error(c_.describe(key_) + ": object of " + std::to_string(final_size) +
                              " bytes was not written whole");
      S3Op op;
      op.method = "PUT";
      op.key = key_;
      op.body = std::span<const std::byte>(single_.data(), final_size);
      op.sign_payload = c_.config().sign_payloads;
      Status put = c_.execute_sync(std::move(op)).first;
      single_.clear();
      single_.shrink_to_fit();
      return put;
    }
    if (final_size == 0) {
      abort_upload();
      return put_empty();
    }
    // The parts must cover [0, final_size) exactly.
    const uint64_t n = (final_size + part_ - 1) / part_;
    std::vector<std::pair<int, std::string>> list;
    {
      std::lock_guard lock(mu_);
      if (parts_.size() != n || parts_.begin()->first != 1 || parts_.rbegin()->first != n ||
          (n - 1) * part_ + parts_.rbegin()->second.second != final_size) {
        st = internal_error(c_.describe(key_) + ": parts written do not cover " +
                            std::to_string(final_size) + " bytes");
      }
      for (const auto& [pn, p] : parts_) list.emplace_back(static_cast<int>(pn), p.first);
    }
    if (!st.ok()) {
      abort_upload();
      return st;
    }
    std::string xml = build_complete_multipart(list);
    S3Op op;
    op.method = "POST";
    op.key = key_;
    op.query = {{"uploadId", upload_id_}};
    op.headers = {{"content-type", "application/xml"}};
    op.body = as_bytes(xml);
    op.check = [](const HttpResponse& r) { return parse_complete_multipart(r.body).status(); };
    auto [cst, resp] = c_.execute_sync(std::move(op));
    if (!cst.ok()) {
      abort_upload();
      return cst.annotate("CompleteMultipartUpload");
    }
    return Status::OK();
  }

  void abort() override {
    (void)wait_outstanding();
    closed_ = true;
    abort_upload();
    remove_single();
  }

 private:
  // An object of at most one part created by create_new() whose one range
  // is exactly its size hint is PUT at once (below). Otherwise it is published by
  // finish(), never before: its one range is copied here, so its buffer is
  // released at once, and PUT by finish().
  void put_whole(uint64_t offset, std::span<const std::byte> data, IoDone done) {
    if (offset != 0 || data.size() > part_) {
      done(invalid_argument(c_.describe(key_) + ": a single-part object must be written in one range"));
      return;
    }
    if (early_ && hint_ > 0 && data.size() == hint_) {
      // A new key (create_new) and the whole announced object in one range
      // (a save's bounded data objects): PUT it now, from the caller's
      // buffer, in parallel with the other objects. finish() then only
      // waits; abort() deletes it again.
      {
        std::lock_guard lock(mu_);
        ++outstanding_;
        single_sent_ = true;
      }
      S3Op op;
      op.method = "PUT";
      op.key = key_;
      op.body = data;
      op.sign_payload = c_.config().sign_payloads;
      c_.execute(std::move(op), [this, done = std::move(done)](Status st, HttpResponse) {
        {
          std::lock_guard lock(mu_);
          if (st.ok()) single_stored_ = true;
          else if (first_.ok()) first_ = st;
        }
        done(st);
        std::lock_guard lock(mu_);
        if (--outstanding_ == 0) cv_.notify_all();
      });
      return;
    }
    {
      std::lock_guard lock(mu_);
      single_.assign(data.begin(), data.end());
      single_done_ = true;
    }
    done(Status::OK());
  }

  Status put_empty() {
    S3Op op;
    op.method = "PUT";
    op.key = key_;
    return c_.execute_sync(std::move(op)).first;
  }

  Status wait_outstanding() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
    return first_;
  }

  // An aborted object that write_async() already stored is deleted again.
  void remove_single() {
    if (!single_stored_) return;
    single_stored_ = false;
    S3Op op;
    op.method = "DELETE";
    op.key = key_;
    Status st = c_.execute_sync(std::move(op)).first;
    if (!st.ok() && st.code() != Code::kNotFound)
      spdlog::warn("ckptio: delete of aborted object {} failed ({}); gc removes it later",
                   c_.describe(key_), st.to_string());
  }

  void abort_upload() {
    if (upload_id_.empty() || aborted_) return;
    aborted_ = true;
    S3Op op;
    op.method = "DELETE";
    op.key = key_;
    op.query = {{"uploadId", upload_id_}};
    Status st = c_.execute_sync(std::move(op)).first;
    if (!st.ok() && st.code() != Code::kNotFound)
      spdlog::warn("ckptio: abort of multipart upload {} failed ({}); gc removes it later",
                   c_.describe(key_), st.to_string());
  }

  S3Client& c_;
  const std::string key_;
  const uint64_t part_;
  const uint64_t hint_;
  const std::string upload_id_;  // empty: single PutObject
  const bool early_;
  bool closed_ = false;          // owner thread only
  bool aborted_ = false;

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  uint64_t outstanding_ = 0;
  Status first_;
  std::map<uint64_t, std::pair<std::string, uint64_t>> parts_;  // number -> etag, size
  bool single_done_ = false;
  std::vector<std::byte> single_;  // the one range of a single-part object
  bool single_sent_ = false;       // that range was PUT by write_async()
  bool single_stored_ = false;     // and the PUT succeeded
};

class S3StorageImpl : public S3Storage {
 public:
  S3StorageImpl(const S3Config& config, S3Uri where)
      : where_(std::move(where)), client_(config, where_.bucket) {}

  StorageCaps caps() const override { return {}; }
  std::string describe() const override {
    return "s3://" + where_.bucket + (where_.prefix.empty() ? "" : "/" + where_.prefix);
  }
  uint64_t write_granularity() const override { return client_.config().part_size; }
  // Part bodies are sent from any address (libcurl reads them): borrow-mode
  // saves pack shards, so a restore's adjacent ranges stay one GET.
  uint64_t write_memory_alignment() const override { return 1; }
  // One part: every data object that holds no larger shard is one PutObject.
  uint64_t data_object_bytes() const override { return client_.config().part_size; }

  S3StorageStats s3_stats() const override {
    auto s = client_.stats();
    return {s.requests, s.retries, client_.connections_opened()};
  }

  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    return start_object(key, size_hint, false);
  }
  Result<std::unique_ptr<WritableObject>> create_new(const std::string& key, uint64_t size_hint) override {
    return start_object(key, size_hint, true);
  }

  Status put(const std::string& key, std::span<const std::byte> data) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    return client_.execute_sync(put_op(key, data)).first;
  }
  // A conditional PutObject (If-None-Match: *): 412 PreconditionFailed when
  // the key holds an object. A server that answers 501 NotImplemented to the
  // condition gets a stat() and a plain PUT (not atomic), with a warning.
  // (A PUT whose answer was lost and that is retried meets its own object:
  // 412. The caller tells that apart by reading the object, as the commit
  // does.)
  Status put_new(const std::string& key, std::span<const std::byte> data) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    S3Op op = put_op(key, data);
    op.headers.emplace_back("If-None-Match", "*");
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (resp.status == 412) return Status(Code::kAlreadyExists, client_.describe(full(key)) + " already exists");
    if (st.code() == Code::kUnimplemented) {
      static std::once_flag warned;
      std::call_once(warned, [this, &st = st] {  // (a named capture: clang 14 cannot capture a structured binding)
        spdlog::warn("ckptio: {} refuses conditional PUTs ({}): a step's index is written after a check "
                     "instead, which two writers of the same step could both pass",
                     client_.describe(""), st.to_string());
      });
      return Storage::put_new(key, data);
    }
    return st;
  }

  Result<std::string> get(const std::string& key, uint64_t max_size) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    S3Op op;
    op.method = "GET";
    op.key = full(key);
    op.max_body = max_size;
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (resp.body_too_large)
      return invalid_argument(client_.describe(full(key)) + " is larger than " +
                              std::to_string(max_size) + " bytes");
    if (!st.ok()) return st;
    return std::move(resp.body);
  }

  Result<uint64_t> stat(const std::string& key) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    CKPTIO_ASSIGN_OR_RETURN(Head h, head(full(key)));
    return h.size;
  }

  Status read(std::span<const ReadRequest> requests) override {
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
      for (auto& [key, slot] : heads) {
        head_async(full(key), [&, slot_ptr = &slot](Result<Head> h) {
          {
            std::lock_guard lock(mu);
            *slot_ptr = std::move(h);
          }
          w.done(Status::OK());
        });
      }
      (void)w.wait();
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
    spdlog::debug("ckptio: s3 read of {} ranges: {} GETs, {} HEADs", requests.size(), gets.size(), heads.size());
    for (RangedGet& g : gets) {
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
        if (resp.status != 206 && resp.status != 200)
          return io_error("unexpected HTTP " + std::to_string(resp.status) + " to a ranged GET");
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
      w.add();
      client_.execute(std::move(op), [&w, this, lone, key = g.key, off, len](Status st, HttpResponse resp) {
        if (st.code() == Code::kFailedPrecondition)
          st = data_loss(st.message() + " (the object changed while it was being read)");
        // 416: the range starts past the end of an object read without a HEAD.
        if (lone && resp.status == 416) st = past_the_end(key, off, len, object_size(resp).value_or(0));
        w.done(st);
      });
    }
    return w.wait();
  }

  Status past_the_end(const std::string& key, uint64_t offset, uint64_t length, uint64_t size) const {
    return data_loss(client_.describe(full(key)) + ": read of [" + std::to_string(offset) + ", " +
                     std::to_string(offset + length) + ") past the end (" + std::to_string(size) + " bytes)");
  }

  // The object's size from a GET's Content-Range ("bytes 0-9/10", or
  // "bytes */10" with a 416), or from Content-Length of a 200.
  static std::optional<uint64_t> object_size(const HttpResponse& resp) {
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

  Result<ListResult> list(const std::string& prefix, bool delimiter) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
    ListResult out;
    const std::string root = where_.prefix.empty() ? "" : where_.prefix + "/";
    std::string token;
    for (int page = 0;; ++page) {
      S3Op op;
      op.method = "GET";
      op.query = {{"list-type", "2"}, {"prefix", root + prefix}};
      if (delimiter) op.query.emplace_back("delimiter", "/");
      if (!token.empty()) op.query.emplace_back("continuation-token", token);
      auto [st, resp] = client_.execute_sync(std::move(op));
      if (!st.ok()) return st.annotate("list " + describe() + "/" + prefix);
      auto parsed = parse_list_objects_v2(resp.body);
      if (!parsed.ok()) return parsed.status().annotate("list " + describe() + "/" + prefix);
      for (auto& o : parsed->objects) {
        if (o.key.compare(0, root.size(), root) != 0) continue;
        out.objects.push_back({o.key.substr(root.size()), o.size, o.modified_unix_ns});
      }
      for (auto& p : parsed->common_prefixes) {
        if (p.compare(0, root.size(), root) != 0) continue;
        out.prefixes.push_back(p.substr(root.size()));
      }
      if (!parsed->truncated) break;
      if (parsed->next_continuation_token.empty() || parsed->next_continuation_token == token)
        return io_error("list " + describe() + "/" + prefix + ": truncated page without a new token");
      token = parsed->next_continuation_token;
    }
    // S3 lists in UTF-8 byte order; some servers (s3rver) do not. The
    // contract is S3's, so sort here: it costs little next to the requests.
    std::sort(out.objects.begin(), out.objects.end(),
              [](const ListEntry& a, const ListEntry& b) { return a.key < b.key; });
    std::sort(out.prefixes.begin(), out.prefixes.end());
    out.prefixes.erase(std::unique(out.prefixes.begin(), out.prefixes.end()), out.prefixes.end());
    return out;
  }

  Status remove(const std::string& key) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    S3Op op;
    op.method = "DELETE";
    op.key = full(key);
    Status st = client_.execute_sync(std::move(op)).first;
    return st.code() == Code::kNotFound ? Status::OK() : st;
  }

  Status remove_prefix(const std::string& prefix) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
    CKPTIO_ASSIGN_OR_RETURN(ListResult all, list(prefix, false));
    for (size_t i = 0; i < all.objects.size(); i += kDeleteBatch) {
      std::vector<std::string> keys;
      for (size_t j = i; j < std::min(all.objects.size(), i + kDeleteBatch); ++j)
        keys.push_back(full(all.objects[j].key));
      CKPTIO_RETURN_IF_ERROR(delete_batch(keys));
    }
    return Status::OK();
  }

  Result<std::vector<ListEntry>> list_unfinished(const std::string& prefix) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_prefix(prefix));
    // key -> the newest change of its uploads: when one began, or when a
    // part of it landed (ListParts), whichever is later. Initiated alone would
    // make a long upload still sending parts look old (and some servers,
    // moto among them, answer a fixed Initiated).
    std::map<std::string, int64_t> newest;
    const std::string root = where_.prefix.empty() ? "" : where_.prefix + "/";
    std::string key_marker, id_marker;
    for (;;) {
      S3Op op;
      op.method = "GET";
      op.query = {{"uploads", ""}, {"prefix", root + prefix}};
      if (!key_marker.empty()) op.query.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) op.query.emplace_back("upload-id-marker", id_marker);
      auto [st, resp] = client_.execute_sync(std::move(op));
      if (!st.ok()) return st.annotate("ListMultipartUploads");
      auto page = parse_list_multipart_uploads(resp.body);
      if (!page.ok()) return page.status().annotate("ListMultipartUploads " + describe());
      for (const auto& u : page->uploads) {
        if (u.key.compare(0, root.size(), root) != 0) continue;
        auto parts = newest_part(u.key, u.upload_id);
        if (parts.status().code() == Code::kNotFound) continue;  // finished or aborted meanwhile
        if (!parts.ok()) return parts.status();
        const int64_t t = std::max(u.initiated_unix_ns, *parts);
        auto [it, fresh] = newest.emplace(u.key.substr(root.size()), t);
        if (!fresh) it->second = std::max(it->second, t);
      }
      if (!page->truncated) break;
      if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker)
        return io_error("ListMultipartUploads " + describe() + ": truncated page without new markers");
      key_marker = page->next_key_marker;
      id_marker = page->next_upload_id_marker;
    }
    std::vector<ListEntry> out;
    for (auto& [key, t] : newest) out.push_back(ListEntry{key, 0, t});
    return out;
  }

  Status abort_unfinished(const std::string& key) override {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    S3Op op;
    op.method = "GET";
    op.query = {{"uploads", ""}, {"prefix", full(key)}};
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("ListMultipartUploads");
    auto page = parse_list_multipart_uploads(resp.body);
    if (!page.ok()) return page.status();
    Status first;
    for (const auto& u : page->uploads) {
      if (u.key != full(key)) continue;
      S3Op del;
      del.method = "DELETE";
      del.key = u.key;
      del.query = {{"uploadId", u.upload_id}};
      Status d = client_.execute_sync(std::move(del)).first;
      if (!d.ok() && d.code() != Code::kNotFound && first.ok()) first = d;
    }
    return first;
  }

 private:
  // A data object's writer: `early` for create_new() (see S3Writer).
  Result<std::unique_ptr<WritableObject>> start_object(const std::string& key, uint64_t size_hint, bool early) {
    CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
    const uint64_t part = client_.config().part_size;
    if (part < kMinPart)
      return invalid_argument("S3 part size " + std::to_string(part) + " is below S3's 5 MiB minimum");
    if (size_hint > kMaxParts * part)
      return invalid_argument(client_.describe(full(key)) + ": " + std::to_string(size_hint) +
                              " bytes need more than 10000 parts of " + std::to_string(part) +
                              " bytes; raise the part size");
    std::string upload_id;
    if (size_hint > part) {
      S3Op op;
      op.method = "POST";
      op.key = full(key);
      op.query = {{"uploads", ""}};
      auto [st, resp] = client_.execute_sync(std::move(op));
      if (!st.ok()) return st.annotate("CreateMultipartUpload");
      auto id = parse_initiate_multipart(resp.body);
      if (!id.ok()) return id.status().annotate(client_.describe(full(key)));
      upload_id = std::move(id).value();
    }
    return std::unique_ptr<WritableObject>(
        std::make_unique<S3Writer>(client_, full(key), part, size_hint, std::move(upload_id), early));
  }

  S3Op put_op(const std::string& key, std::span<const std::byte> data) const {
    S3Op op;
    op.method = "PUT";
    op.key = full(key);
    op.body = data;
    return op;
  }

  struct Head {
    uint64_t size = 0;
    std::string etag;
  };

  // The newest LastModified of the parts of upload `id` of `full_key` (0 if
  // it has none or the server gives no times); kNotFound if the upload is gone.
  Result<int64_t> newest_part(const std::string& full_key, const std::string& id) {
    int64_t newest = 0;
    std::string marker;
    for (;;) {
      S3Op op;
      op.method = "GET";
      op.key = full_key;
      op.query = {{"uploadId", id}};
      if (!marker.empty()) op.query.emplace_back("part-number-marker", marker);
      auto [st, resp] = client_.execute_sync(std::move(op));
      if (!st.ok()) return st.annotate("ListParts");
      auto page = parse_list_parts(resp.body);
      if (!page.ok()) return page.status().annotate("ListParts " + client_.describe(full_key));
      for (const PartEntry& p : page->parts) newest = std::max(newest, p.modified_unix_ns);
      if (!page->truncated) return newest;
      if (page->next_part_number_marker == marker)
        return io_error("ListParts " + client_.describe(full_key) + ": truncated page without a new marker");
      marker = page->next_part_number_marker;
    }
  }

  // Bytes per GET: one part, so a large read spreads over the connections.
  uint64_t read_get_bytes() const { return client_.config().part_size; }

  std::string full(const std::string& key) const {
    return where_.prefix.empty() ? key : where_.prefix + "/" + key;
  }

  void head_async(const std::string& full_key, std::function<void(Result<Head>)> done) {
    S3Op op;
    op.method = "HEAD";
    op.key = full_key;
    client_.execute(std::move(op), [this, full_key, done = std::move(done)](Status st, HttpResponse r) {
      if (!st.ok()) {
        if (st.code() == Code::kNotFound) st = not_found(client_.describe(full_key) + " does not exist");
        return done(st);
      }
      auto size = parse_u64(r.header("content-length"));
      if (!size) return done(io_error(client_.describe(full_key) + ": HEAD without a Content-Length"));
      const std::string* etag = r.header("etag");
      done(Head{*size, etag ? *etag : ""});
    });
  }

  Result<Head> head(const std::string& full_key) {
    std::promise<Result<Head>> p;
    auto f = p.get_future();
    head_async(full_key, [&p](Result<Head> h) { p.set_value(std::move(h)); });
    return f.get();
  }

  Status delete_batch(const std::vector<std::string>& keys) {
    std::string xml = build_delete_objects(keys, /*quiet=*/true);
    S3Op op;
    op.method = "POST";
    op.query = {{"delete", ""}};
    op.headers = {{"content-md5", md5_base64(xml)}, {"content-type", "application/xml"}};
    op.body = as_bytes(xml);
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("DeleteObjects");
    auto res = parse_delete_objects(resp.body);
    if (!res.ok()) return res.status().annotate("DeleteObjects " + describe());
    for (const auto& [key, err] : res->errors) {
      if (err.code == "NoSuchKey") continue;
      return io_error("DeleteObjects " + client_.describe(key) + ": " + err.code + ": " + err.message);
    }
    return Status::OK();
  }

  const S3Uri where_;
  S3Client client_;
};

}  // namespace

Result<std::shared_ptr<S3Storage>> make_s3_storage(const std::string& uri, const S3Config& config) {
  CKPTIO_ASSIGN_OR_RETURN(S3Uri where, parse_s3_uri(uri));
  if (config.part_size < kMinPart)
    return invalid_argument("S3 part size must be at least 5 MiB, got " + std::to_string(config.part_size));
  if (config.endpoint.empty()) return invalid_argument("no S3 endpoint configured");
  return std::shared_ptr<S3Storage>(std::make_shared<S3StorageImpl>(config, std::move(where)));
}

}  // namespace ckptio::s3
