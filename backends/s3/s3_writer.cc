// create() and create_new(): an object's writer, either one PutObject (an
// object of at most one part) or a multipart upload (CreateMultipartUpload,
// an UploadPart per part_size slice, CompleteMultipartUpload, and
// AbortMultipartUpload on any failure). s3_storage.h states the protocol.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "backends/s3/checksum.h"
#include "backends/s3/s3_storage_internal.h"
#include "backends/s3/s3_xml.h"
#include "src/util/allocate.h"
#include "src/util/log.h"
#include "src/util/printable.h"

namespace ckptio::s3::storage_internal {
namespace {

constexpr uint64_t kMaxParts = 10000;

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
    if (offset % part_ != 0)
      return refuse(std::move(done), invalid_argument(c_.describe(key_) + ": write offset " + std::to_string(offset) +
                                                      " is not a multiple of the part size " + std::to_string(part_)));
    const uint64_t parts = data.empty() ? 0 : (data.size() + part_ - 1) / part_;
    const uint64_t first_part = offset / part_ + 1;
    if (parts == 0) return done(Status::OK());
    if (first_part + parts - 1 > kMaxParts)
      return refuse(std::move(done),
                    invalid_argument(c_.describe(key_) + ": more than 10000 parts; raise the part size"));
    // One callback for the whole range, when its last part lands. `left`
    // counts the parts in flight plus one reference of this call, until it
    // has queued them all (storage.h: a range partly queued is accepted and
    // fails). Until the first part is queued, a throw accepts nothing.
    auto range = std::make_shared<Range>();
    range->left = parts + 1;
    range->done = std::move(done);
    {
      std::lock_guard lock(mu_);
      outstanding_ += parts + 1;
    }
    uint64_t queued = 0;
    try {
      for (uint64_t i = 0; i < parts; ++i) {
        const uint64_t pn = first_part + i;
        const uint64_t len = std::min<uint64_t>(part_, data.size() - i * part_);
        S3Op op;
        op.method = "PUT";
        op.key = key_;
        op.query = {{"partNumber", std::to_string(pn)}, {"uploadId", upload_id_}};
        op.body = data.subspan(i * part_, len);
        op.sign_payload = c_.config().sign_payloads;
        op.cancelled = cancelled_;
        // The part's checksum, listed again in CompleteMultipartUpload.
        std::string crc = c_.config().checksums ? crc32c_base64(op.body) : std::string();
        if (!crc.empty()) op.headers.emplace_back(kChecksumHeader, crc);
        // execute() queues the request or throws having queued nothing.
        // On the HTTP loop: throws nothing (http_client.h).
        c_.execute(std::move(op), [this, range, pn, len, crc](Status st, HttpResponse r) {
          if (st.ok()) st = status_or_out_of_memory([&] {
            const std::string* etag = r.header("etag");
            if (!etag) return io_error(c_.describe(key_) + ": UploadPart returned no ETag");
            Part part{*etag, len, crc};
            std::lock_guard lock(mu_);
            parts_.insert_or_assign(pn, std::move(part));
            return Status::OK();
          });
          land(*range, std::move(st), 1);
        });
        ++queued;
      }
    } catch (...) {
      if (queued == 0) {
        std::lock_guard lock(mu_);
        outstanding_ -= parts + 1;
        if (outstanding_ == 0) cv_.notify_all();
        throw;
      }
      land(*range, status_or_out_of_memory([&] {
             return out_of_memory(c_.describe(key_) + ": queue the parts of the range at offset " +
                                  std::to_string(offset) + " (" + std::to_string(queued) + " of " +
                                  std::to_string(parts) + " queued)");
           }),
           parts - queued + 1);
      return;
    }
    land(*range, Status::OK(), 1);
  }

  Status finish(uint64_t final_size) override {
    Status st = wait_outstanding();
    closed_ = true;
    // What finish() throws (std::bad_alloc building the part list or the
    // request) leaves no upload behind: closed_ keeps ~S3Writer from aborting.
    try {
      return finish_object(std::move(st), final_size);
    } catch (...) {
      abort_upload();
      throw;
    }
  }

  void cancel() noexcept override { cancelled_->store(true, std::memory_order_relaxed); }

  void abort() override {
    (void)wait_outstanding();
    closed_ = true;
    abort_upload();
    remove_single();
  }

 private:
  Status finish_object(Status st, uint64_t final_size) {
    if (!st.ok()) {
      abort_upload();
      remove_single();  // (a one-part object PUT before a range was refused)
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
    // The parts must cover [0, final_size) exactly: parts 1..n, each but the
    // last a whole part (a short middle part would shift every byte after
    // it, S3 taking any part of 5 MiB or more).
    const uint64_t n = (final_size + part_ - 1) / part_;
    std::vector<CompletedPart> list;
    {
      std::lock_guard lock(mu_);
      const bool whole_middles = std::all_of(parts_.begin(), parts_.end(), [&](const auto& kv) {
        return kv.first == parts_.rbegin()->first || kv.second.size == part_;
      });
      if (parts_.size() != n || parts_.begin()->first != 1 || parts_.rbegin()->first != n || !whole_middles ||
          (n - 1) * part_ + parts_.rbegin()->second.size != final_size) {
        st = internal_error(c_.describe(key_) + ": parts written do not cover " +
                            std::to_string(final_size) + " bytes" + (whole_middles ? "" : " (a short middle part)"));
      }
      for (const auto& [pn, p] : parts_) list.push_back({static_cast<int>(pn), p.etag, p.crc32c});
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
    int attempts = 0;
    op.attempts = &attempts;
    auto [cst, resp] = c_.execute_sync(std::move(op));
    if (cst.code() == Code::kNotFound && attempts > 1) {
      // A retry found no such upload: an earlier attempt may have completed
      // it and its answer been lost (MinIO, among others, then answers 404
      // NoSuchUpload; moto answers the repeat with the object). The object
      // decides: there, of this size and (a multipart ETag "...-N") of these
      // N parts, it is ours.
      const std::optional<S3Error> err = parse_error(resp.body);
      if (err && err->code == "NoSuchUpload") {
        Status ours = check_completed(final_size, n);
        if (ours.ok()) {
          logging::info("ckptio: {}: a retried CompleteMultipartUpload found no such upload; the object is "
                       "there, complete: an earlier attempt completed it",
                       c_.describe(key_));
          return Status::OK();
        }
        cst = Status(cst.code(), cst.message() + "; " + ours.message());
      }
    }
    if (!cst.ok()) {
      abort_upload();
      return cst.annotate("CompleteMultipartUpload");
    }
    return Status::OK();
  }

  // A range refused before anything was queued fails the object too (its
  // finish() said "parts written do not cover", or, for a second range of a
  // single-part object already PUT, OK).
  void refuse(IoDone done, Status st) {
    {
      std::lock_guard lock(mu_);
      if (first_.ok()) first_ = st;
    }
    done(std::move(st));
  }

  // An object of at most one part created by create_new() whose one range
  // is exactly its size hint is PUT at once (below). Otherwise it is published by
  // finish(), never before: its one range is copied here, so its buffer is
  // released at once, and PUT by finish().
  void put_whole(uint64_t offset, std::span<const std::byte> data, IoDone done) {
    if (offset != 0 || data.size() > part_ || single_sent_ || single_done_)
      return refuse(std::move(done),
                    invalid_argument(c_.describe(key_) + ": a single-part object must be written in one range"));
    if (early_ && hint_ > 0 && data.size() == hint_) {
      // A new key (create_new) and the whole announced object in one range
      // (a save's bounded data objects): PUT it now, from the caller's
      // buffer, in parallel with the other objects. finish() then only
      // waits; abort() deletes it again.
      S3Op op;
      op.method = "PUT";
      op.key = key_;
      op.body = data;
      op.sign_payload = c_.config().sign_payloads;
      op.cancelled = cancelled_;
      {
        std::lock_guard lock(mu_);
        ++outstanding_;
        single_sent_ = true;
      }
      try {  // execute() queues the request or throws having queued nothing
        c_.execute(std::move(op), [this, done = std::move(done)](Status st, HttpResponse) {
          {
            std::lock_guard lock(mu_);
            if (st.ok()) single_stored_ = true;
            else if (first_.ok()) first_ = status_or_out_of_memory([&] { return st; });
          }
          done(std::move(st));
          std::lock_guard lock(mu_);
          if (--outstanding_ == 0) cv_.notify_all();
        });
      } catch (...) {
        std::lock_guard lock(mu_);
        single_sent_ = false;
        if (--outstanding_ == 0) cv_.notify_all();
        throw;
      }
      return;
    }
    {
      std::lock_guard lock(mu_);
      single_.assign(data.begin(), data.end());
      single_done_ = true;
    }
    done(Status::OK());
  }

  // After a retried CompleteMultipartUpload met NoSuchUpload: OK when the
  // object is there with `size` bytes and, if its ETag is a multipart one
  // ("md5-N"), of `parts` parts; otherwise an error saying what was found.
  Status check_completed(uint64_t size, uint64_t parts) {
    S3Op op;
    op.method = "HEAD";
    op.key = key_;
    auto [st, r] = c_.execute_sync(std::move(op));
    if (!st.ok()) return Status(st.code(), "the object is not there either (" + st.message() + ")");
    const std::string* cl = r.header("content-length");
    if (!cl || *cl != std::to_string(size))
      return io_error("the object there has " + (cl ? printable(*cl, 64) : std::string("no Content-Length")) +
                      " bytes, not " + std::to_string(size));
    const std::string* etag = r.header("etag");
    std::string e = etag ? *etag : "";
    if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
    const size_t dash = e.rfind('-');
    if (dash != std::string::npos && e.substr(dash + 1) != std::to_string(parts))
      return io_error("the object there has ETag " + printable(*etag, 128) + ", not one of " + std::to_string(parts) +
                      " parts");
    return Status::OK();
  }

  Status put_empty() {
    S3Op op;
    op.method = "PUT";
    op.key = key_;
    return c_.execute_sync(std::move(op)).first;
  }

  // A write_async() range of parts: its callback runs once the last lands.
  struct Range {
    std::mutex mu;
    uint64_t left;
    Status first;
    IoDone done;
  };
  // `n` of the range's references are done, with `st`; the last runs its
  // callback. Throws nothing (error copies fall back, status_or_out_of_memory).
  void land(Range& range, Status st, uint64_t n) {
    IoDone cb;
    Status result;
    Status for_object = st.ok() ? Status() : status_or_out_of_memory([&] { return st; });
    {
      std::lock_guard lock(range.mu);
      if (!st.ok() && range.first.ok()) range.first = std::move(st);
      range.left -= n;
      if (range.left == 0) {
        cb = std::move(range.done);
        result = std::move(range.first);
      }
    }
    {
      std::lock_guard lock(mu_);
      if (!for_object.ok() && first_.ok()) first_ = std::move(for_object);
    }
    if (cb) cb(std::move(result));
    std::lock_guard lock(mu_);
    outstanding_ -= n;
    if (outstanding_ == 0) cv_.notify_all();
  }

  Status wait_outstanding() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
    return first_;
  }

  // An aborted object that write_async() already stored is deleted again.
  // Never throws (it runs in ~S3Writer, also while an exception unwinds):
  // a request that cannot even be made (std::bad_alloc) leaves the object
  // for gc, as a failed one does.
  void remove_single() noexcept {
    if (!single_stored_) return;
    single_stored_ = false;
    try {
      S3Op op;
      op.method = "DELETE";
      op.key = key_;
      Status st = c_.execute_sync(std::move(op)).first;
      if (!st.ok() && st.code() != Code::kNotFound)
        logging::warn("ckptio: delete of aborted object {} failed ({}); gc removes it later",
                     c_.describe(key_), st.to_string());
    } catch (...) {
    }
  }

  // Never throws, as remove_single(): the upload is then left for gc.
  void abort_upload() noexcept {
    if (upload_id_.empty() || aborted_) return;
    aborted_ = true;
    try {
      S3Op op;
      op.method = "DELETE";
      op.key = key_;
      op.query = {{"uploadId", upload_id_}};
      Status st = c_.execute_sync(std::move(op)).first;
      if (!st.ok() && st.code() != Code::kNotFound)
        logging::warn("ckptio: abort of multipart upload {} failed ({}); gc removes it later",
                     c_.describe(key_), st.to_string());
    } catch (...) {
    }
  }

  S3Client& c_;
  const std::string key_;
  const uint64_t part_;
  const uint64_t hint_;
  const std::string upload_id_;  // empty: single PutObject
  const bool early_;
  // WritableObject::cancel: parts and PUTs not yet sent are not sent.
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  bool closed_ = false;          // owner thread only
  bool aborted_ = false;

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  uint64_t outstanding_ = 0;
  Status first_;
  struct Part {
    std::string etag;
    uint64_t size = 0;
    std::string crc32c;  // as sent (x-amz-checksum-crc32c); "" with checksums off
  };
  std::map<uint64_t, Part> parts_;  // by part number
  bool single_done_ = false;
  std::vector<std::byte> single_;  // the one range of a single-part object
  bool single_sent_ = false;       // that range was PUT by write_async()
  bool single_stored_ = false;     // and the PUT succeeded
};

}  // namespace

// A data object's writer: `early` for create_new() (see S3Writer).
Result<std::unique_ptr<WritableObject>> S3StorageImpl::start_object(const std::string& key, uint64_t size_hint,
                                                                    bool early) {
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
    // Each part then carries its CRC-32C, and CompleteMultipartUpload lists them.
    if (client_.config().checksums) op.headers.emplace_back("x-amz-checksum-algorithm", "CRC32C");
    int attempts = 0;
    op.attempts = &attempts;
    auto [st, resp] = client_.execute_sync(std::move(op));
    if (!st.ok()) return st.annotate("CreateMultipartUpload");
    auto id = parse_initiate_multipart(resp.body);
    if (!id.ok()) return id.status().annotate(client_.describe(full(key)));
    upload_id = std::move(id).value();
    // Sent more than once: an attempt whose answer was lost may have begun
    // an upload no one knows the id of, left for gc before. A key of
    // create_new() is this writer's alone, so any other upload into it is
    // such an orphan: aborted (best effort; gc still finds what stays).
    if (attempts > 1 && early) {
      Status orphans = abort_uploads(full(key), upload_id);
      if (!orphans.ok())
        logging::warn("ckptio: {}: uploads an earlier attempt of CreateMultipartUpload began are left for gc ({})",
                      client_.describe(full(key)), orphans.to_string());
    }
  }
  return std::unique_ptr<WritableObject>(
      std::make_unique<S3Writer>(client_, full(key), part, size_hint, std::move(upload_id), early));
}

}  // namespace ckptio::s3::storage_internal
