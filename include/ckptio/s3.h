// Options of the S3 backend (s3://bucket[/prefix] URIs: AWS S3 and
// S3-compatible stores such as MinIO and Ceph RGW). Set them through
// StorageOptions::get<S3Options>() (ckptio/storage.h).
//
// Empty or zero fields come from the AWS conventions: AWS_ENDPOINT_URL_S3 /
// AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE with
// ~/.aws/credentials and ~/.aws/config, then the job's role: EKS web
// identity, ECS / EKS Pod Identity, EC2 instance metadata, renewed ahead of
// expiry (docs/s3.md gives the precedence).
#pragma once

#include <cstdint>
#include <string>

namespace ckptio {

struct S3Options {
  std::string endpoint;     // "http://127.0.0.1:9000"; default AWS
  std::string region;
  std::string profile;
  std::string access_key_id, secret_access_key, session_token;
  bool anonymous = false;   // send unsigned requests
  std::string addressing;   // "path" | "virtual" | "" (path for custom endpoints and for bucket names with '.', uppercase or '_')
  uint64_t part_size = 0;   // multipart part size (default 16 MiB, min 5 MiB, a multiple of 4096)
  uint32_t max_connections = 0;  // requests in flight (default 32)
  int max_attempts = 0;          // per request, first try included (default 10)
  double retry_base_s = 0;       // full-jitter backoff base (default 0.1 s)
  double retry_cap_s = 0;        // backoff cap (default 20 s)
  double timeout_s = 0;          // a transfer stalled this long fails (default 60 s)
  // "on": sign every body's SHA-256; "off": UNSIGNED-PAYLOAD for data
  // parts; "": botocore's rule (on over http, off over https, where TLS
  // protects the bytes). Restore checks every shard's crc32c either way.
  std::string payload_signing;
  // "on": every PutObject and UploadPart carries x-amz-checksum-crc32c of its
  // body, so a server that checks it refuses a body damaged on the way (and
  // the client sends it again); "off": none, for a server that refuses the
  // header; "": AWS_REQUEST_CHECKSUM_CALCULATION or the profile's
  // request_checksum_calculation (when_supported | when_required), else on.
  std::string checksums;
  // Written with every object created: server-side encryption ("AES256",
  // "aws:kms", "aws:kms:dsse"), its KMS key, and the storage class ("" for
  // the bucket's defaults). See docs/s3.md.
  std::string sse, sse_kms_key_id, storage_class;
};

}  // namespace ckptio
