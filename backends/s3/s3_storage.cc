// The S3 Storage object: its whole-object operations (put, a conditional
// put_new, get, stat) and make_s3_storage(). The write, read and listing
// paths are in s3_writer.cc, s3_read.cc and s3_listing.cc
// (s3_storage_internal.h); s3_storage.h states the protocols.
#include "backends/s3/s3_storage.h"

#include <mutex>

#include "backends/s3/s3_storage_internal.h"
#include "src/util/log.h"

namespace ckptio::s3 {
namespace storage_internal {

Status S3StorageImpl::put(const std::string& key, std::span<const std::byte> data) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
  return client_.execute_sync(put_op(key, data)).first;
}

// A conditional PutObject (If-None-Match: *): 412 PreconditionFailed when
// the key holds an object. A server that answers 501 NotImplemented to the
// condition gets a stat() and a plain PUT (not atomic), with a warning.
// (A PUT whose answer was lost and that is retried meets its own object:
// 412. The caller tells that apart by reading the object, as the commit
// does.)
Status S3StorageImpl::put_new(const std::string& key, std::span<const std::byte> data) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
  S3Op op = put_op(key, data);
  op.headers.emplace_back("If-None-Match", "*");
  auto [st, resp] = client_.execute_sync(std::move(op));
  if (resp.status == 412) return Status(Code::kAlreadyExists, client_.describe(full(key)) + " already exists");
  if (st.code() == Code::kUnimplemented) {
    static std::once_flag warned;
    std::call_once(warned, [this, &st = st] {  // (a named capture: clang 14 cannot capture a structured binding)
      logging::warn("ckptio: {} refuses conditional PUTs ({}): a step's index is written after a check "
                   "instead, which two writers of the same step could both pass",
                   client_.describe(""), st.to_string());
    });
    return Storage::put_new(key, data);
  }
  return st;
}

Result<std::string> S3StorageImpl::get(const std::string& key, uint64_t max_size) {
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

Result<uint64_t> S3StorageImpl::stat(const std::string& key) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(key));
  CKPTIO_ASSIGN_OR_RETURN(Head h, head(full(key)));
  return h.size;
}

S3Op S3StorageImpl::put_op(const std::string& key, std::span<const std::byte> data) const {
  S3Op op;
  op.method = "PUT";
  op.key = full(key);
  op.body = data;
  return op;
}

}  // namespace storage_internal

Result<std::shared_ptr<S3Storage>> make_s3_storage(const std::string& uri, const S3Config& config) {
  CKPTIO_ASSIGN_OR_RETURN(S3Uri where, parse_s3_uri(uri));
  CKPTIO_RETURN_IF_ERROR(check_part_size(config.part_size));
  if (config.endpoint.empty()) return invalid_argument("no S3 endpoint configured");
  return std::shared_ptr<S3Storage>(std::make_shared<storage_internal::S3StorageImpl>(config, std::move(where)));
}

}  // namespace ckptio::s3
