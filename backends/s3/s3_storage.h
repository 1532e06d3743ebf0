// The S3-compatible object store backend (AWS S3, MinIO, Ceph RGW; tested on
// moto_server and s3rver).
//
// Keys map to objects "<prefix>/<key>" in the bucket of an s3://bucket/prefix
// URI. caps(): no rename, so the core commits by writing the index last (see
// src/save/commit.cc and docs/format.md).
//
// Writes: create() of an object larger than one part starts a multipart
// upload; each write_async() range (offset a multiple of part_size) becomes
// one UploadPart per part_size slice, sent in parallel and retried on its own;
// finish() completes the upload (an <Error> inside its 200 response is an
// error; a repeated Complete answered 404 NoSuchUpload is a success when the
// object is there with the size and part count written), and any failure
// aborts it so no parts are left behind. An object of
// at most one part is written with a single PutObject (its one range must
// cover [0, final size)): for create_new() (a save's data objects, at most
// data_object_bytes() = one part each) sent from the caller's buffer as soon
// as a range of exactly the size hint arrives, so they go up in parallel
// (abort() deletes the object again); otherwise copied and sent by finish(),
// so create() replaces nothing until then. put() is
// one PutObject with a signed payload: S3 PUTs are atomic and
// read-after-write consistent.
//
// Reads: read() issues ranged GETs of at most part_size bytes in parallel,
// written straight into the caller's buffer at the right offset. An object
// read by several GETs is HEADed first (size and ETag): ranges past its end
// are kDataLoss before any GET, and each GET carries If-Match on that ETag so
// a read never mixes two versions of an object. An object read by one GET (a
// save's data objects are one part each) is not HEADed: one GET sees one
// version, and a range past its end (416, or a body cut short at the size
// its Content-Range gives) is kDataLoss too. An answer that is not the range
// asked for (a 206 whose Content-Range starts elsewhere, a 200 with the whole
// object unless the whole object was asked for) is kUnavailable: the
// server's fault, not damage.
//
// Errors name the operation, the s3:// key, the HTTP status and the S3 error
// code and message; credentials never appear. Thread safety as Storage.
#pragma once

#include <memory>
#include <string>

#include "backends/s3/s3_config.h"
#include "ckptio/storage.h"

namespace ckptio::s3 {

struct S3StorageStats {
  uint64_t requests = 0;
  uint64_t retries = 0;
  uint64_t connections_opened = 0;
};

class S3Storage : public Storage {
 public:
  virtual S3StorageStats s3_stats() const = 0;
};

// Opens s3://bucket[/prefix] with `config` (see resolve_s3_config()).
Result<std::shared_ptr<S3Storage>> make_s3_storage(const std::string& uri, const S3Config& config);

// The backend's opener (s3_open.cc): the S3Options in `options` over the AWS
// conventions (resolve_s3_config), then make_s3_storage.
Result<std::shared_ptr<Storage>> open_s3_uri(const std::string& uri, const StorageOptions& options);

}  // namespace ckptio::s3
