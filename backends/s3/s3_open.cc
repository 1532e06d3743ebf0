// Opens s3://bucket[/prefix] URIs (open_s3_uri in s3_storage.h): S3Options
// (include/ckptio/s3.h) become the overrides of the AWS conventions that
// resolve_s3_config applies. Registered for the scheme by register.cc, or
// handed to a program that loads the backend on demand by module/s3_module.cc.
#include <string>

#include "backends/s3/s3_config.h"
#include "backends/s3/s3_storage.h"
#include "ckptio/s3.h"
#include "ckptio/storage.h"
#include "src/util/log.h"

namespace ckptio::s3 {
namespace {

Result<S3ConfigOverrides> overrides(const S3Options& o) {
  S3ConfigOverrides ov;
  if (!o.endpoint.empty()) ov.endpoint = o.endpoint;
  if (!o.region.empty()) ov.region = o.region;
  if (!o.profile.empty()) ov.profile = o.profile;
  if (!o.access_key_id.empty() || !o.secret_access_key.empty())
    ov.creds = Credentials{o.access_key_id, o.secret_access_key, o.session_token};
  if (o.anonymous) ov.anonymous = true;
  if (!o.addressing.empty()) {
    if (o.addressing != "path" && o.addressing != "virtual")
      return invalid_argument("S3 addressing must be 'path' or 'virtual', got '" + o.addressing + "'");
    ov.path_style = o.addressing == "path";
  }
  if (o.part_size) ov.part_size = o.part_size;
  if (o.max_connections) ov.max_connections = o.max_connections;
  if (o.max_attempts || o.retry_base_s > 0 || o.retry_cap_s > 0) {
    RetryPolicy r;
    if (o.max_attempts) r.max_attempts = o.max_attempts;
    if (o.retry_base_s > 0) r.base_seconds = o.retry_base_s;
    if (o.retry_cap_s > 0) r.cap_seconds = o.retry_cap_s;
    ov.retry = r;
  }
  if (o.timeout_s > 0) ov.request_timeout_s = o.timeout_s;
  if (!o.payload_signing.empty()) {
    if (o.payload_signing != "on" && o.payload_signing != "off")
      return invalid_argument("S3 payload signing must be 'on' or 'off', got '" + o.payload_signing + "'");
    ov.sign_payloads = o.payload_signing == "on";
  }
  if (!o.checksums.empty()) {
    if (o.checksums != "on" && o.checksums != "off")
      return invalid_argument("S3 checksums must be 'on' or 'off', got '" + o.checksums + "'");
    ov.checksums = o.checksums == "on";
  }
  if (!o.sse.empty()) ov.sse = o.sse;
  if (!o.sse_kms_key_id.empty()) ov.sse_kms_key_id = o.sse_kms_key_id;
  if (!o.storage_class.empty()) ov.storage_class = o.storage_class;
  return ov;
}

}  // namespace

Result<std::shared_ptr<Storage>> open_s3_uri(const std::string& uri, const StorageOptions& options) {
  CKPTIO_ASSIGN_OR_RETURN(S3ConfigOverrides ov, overrides(options.get_or_default<S3Options>()));
  CKPTIO_ASSIGN_OR_RETURN(const S3Uri where, parse_s3_uri(uri));
  ov.bucket = where.bucket;  // a dotted bucket goes path style under "auto"
  CKPTIO_ASSIGN_OR_RETURN(S3Config config, resolve_s3_config(ov));
  logging::debug("ckptio: {}: {}", uri, config.describe_redacted());
  CKPTIO_ASSIGN_OR_RETURN(auto storage, make_s3_storage(uri, config));
  return std::shared_ptr<Storage>(std::move(storage));
}

}  // namespace ckptio::s3
