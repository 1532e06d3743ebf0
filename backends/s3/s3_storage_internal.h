// What the files of the S3 Storage share, private to them: the Storage class
// whose operations they implement, S3's part-size minimum and a string-as-body
// view. s3_storage.h is the public face and states the write and read
// protocols; each file below implements one of them.
//
// The files: s3_storage.cc (the object itself, whole-object put / get / stat,
// make_s3_storage), s3_writer.cc (create(): one PutObject or a multipart
// upload), s3_read.cc (read(): HEADs, then ranged GETs into the caller's
// buffers), s3_listing.cc (list, delete, unfinished multipart uploads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/s3/s3_client.h"
#include "backends/s3/s3_config.h"
#include "backends/s3/s3_storage.h"

namespace ckptio::s3::storage_internal {

// S3: every part of a multipart upload but the last has at least 5 MiB.
inline constexpr uint64_t kMinPart = 5ull << 20;

// An XML request body held in a string.
inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

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

  // s3_writer.cc
  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    return start_object(key, size_hint, false);
  }
  Result<std::unique_ptr<WritableObject>> create_new(const std::string& key, uint64_t size_hint) override {
    return start_object(key, size_hint, true);
  }

  // s3_storage.cc
  Status put(const std::string& key, std::span<const std::byte> data) override;
  Status put_new(const std::string& key, std::span<const std::byte> data) override;
  Result<std::string> get(const std::string& key, uint64_t max_size) override;
  Result<uint64_t> stat(const std::string& key) override;

  // s3_read.cc
  // Never throws: memory refused is kResourceExhausted, after the requests
  // already queued have landed.
  Status read(std::span<const ReadRequest> requests) override;

  // s3_listing.cc
  Result<ListResult> list(const std::string& prefix, bool delimiter) override;
  Status remove(const std::string& key) override;
  Status remove_prefix(const std::string& prefix) override;
  Result<std::vector<ListEntry>> list_unfinished(const std::string& prefix) override;
  Status abort_unfinished(const std::string& key) override;
  // Aborts the unfinished uploads into `key` (full name in the bucket) but
  // the one whose id is `keep` ("" aborts all).
  Status abort_uploads(const std::string& full_key, const std::string& keep);

 private:
  struct Head {
    uint64_t size = 0;
    std::string etag;
  };

  // s3_writer.cc: a data object's writer; `early` for create_new() (see S3Writer).
  Result<std::unique_ptr<WritableObject>> start_object(const std::string& key, uint64_t size_hint, bool early);

  // s3_storage.cc
  S3Op put_op(const std::string& key, std::span<const std::byte> data) const;

  // s3_read.cc
  Status past_the_end(const std::string& key, uint64_t offset, uint64_t length, uint64_t size) const;
  static std::optional<uint64_t> object_size(const HttpResponse& resp);
  static std::optional<std::pair<uint64_t, uint64_t>> content_range(const HttpResponse& resp);
  void head_async(const std::string& full_key, std::function<void(Result<Head>)> done);
  Status read_ranges(std::span<const ReadRequest> requests);  // read(), which catches
  Result<Head> head(const std::string& full_key);
  // Bytes per GET: one part, so a large read spreads over the connections.
  uint64_t read_get_bytes() const { return client_.config().part_size; }

  // s3_listing.cc
  Result<int64_t> newest_part(const std::string& full_key, const std::string& id);
  Status delete_batch(const std::vector<std::string>& keys);

  std::string full(const std::string& key) const {
    return where_.prefix.empty() ? key : where_.prefix + "/" + key;
  }

  const S3Uri where_;
  S3Client client_;
};

}  // namespace ckptio::s3::storage_internal
