// resolve_s3_config, setting by setting in the order s3_config.h gives, and
// describe_redacted(). The URI, the AWS files, endpoints and the credential
// chain are in s3_uri.cc, aws_files.cc, s3_endpoint.cc and
// s3_config_credentials.cc (s3_config_internal.h).
#include "backends/s3/s3_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "backends/s3/credentials.h"
#include "backends/s3/s3_config_internal.h"
#include "src/util/printable.h"

namespace ckptio::s3 {

using namespace config_internal;

namespace {

constexpr uint64_t kMinPartSize = 5ull << 20;  // S3: every part but the last
constexpr uint64_t kMaxPartSize = 5ull << 30;

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status check_region(const std::string& region) {
  if (region.empty() || region.size() > 64) return invalid_argument("region must have 1 to 64 characters");
  for (char c : region)
    if (!is_alnum(c) && c != '-' && c != '_' && c != '.')
      return invalid_argument("region '" + printable(region) +
                              "' may contain only letters, digits, '-', '_' and '.'");
  return Status::OK();
}

bool finite_nonnegative(double v) { return std::isfinite(v) && v >= 0; }

// Region (STS's endpoint depends on it).
Status resolve_region(const S3ConfigOverrides& o, const ConfigSources& src, S3Config& c) {
  if (o.region) c.region = *o.region;
  else if (auto v = src.env("AWS_REGION")) c.region = *v;
  else if (auto v = src.env("AWS_DEFAULT_REGION")) c.region = *v;
  else if (auto v = src.from_profile("region")) c.region = *v;
  return check_region(c.region);
}

// Endpoint (whether it is on loopback decides the metadata probe). True when
// one was given rather than derived from the region.
Result<bool> resolve_endpoint(const S3ConfigOverrides& o, const ConfigSources& src, S3Config& c) {
  std::optional<std::pair<std::string, std::string>> endpoint;  // value, source
  if (o.endpoint) {
    endpoint.emplace(*o.endpoint, "override");
  } else if (!src.ignore_configured_endpoints()) {
    if (auto v = src.env("AWS_ENDPOINT_URL_S3")) endpoint.emplace(*v, "AWS_ENDPOINT_URL_S3");
    else if (auto v = src.env("AWS_ENDPOINT_URL")) endpoint.emplace(*v, "AWS_ENDPOINT_URL");
    else if (auto v = src.from_profile("s3.endpoint_url")) endpoint.emplace(*v, src.profile_source);
    else if (auto v = src.from_profile("endpoint_url")) endpoint.emplace(*v, src.profile_source);
  }
  if (endpoint) {
    CKPTIO_ASSIGN_OR_RETURN(c.endpoint, normalize_endpoint(endpoint->first, endpoint->second));
  } else {
    c.endpoint = default_s3_endpoint(c.region);
  }
  return endpoint.has_value();
}

// Addressing style, payload signing and upload checksums.
Status resolve_addressing(const S3ConfigOverrides& o, const ConfigSources& src, bool endpoint_given,
                          S3Config& c) {
  const std::string& profile_source = src.profile_source;
  if (o.path_style) {
    c.path_style = *o.path_style;
  } else {
    const std::string style = lowercase(src.from_profile("s3.addressing_style").value_or("auto"));
    if (style == "path") c.path_style = true;
    else if (style == "virtual") c.path_style = false;
    else if (style == "auto") c.path_style = endpoint_given || (o.bucket && !dns_compatible_bucket(*o.bucket));
    else return invalid_argument(profile_source + ": s3.addressing_style must be path, virtual or auto");
  }

  if (o.sign_payloads) {
    c.sign_payloads = *o.sign_payloads;
  } else if (auto v = src.from_profile("s3.payload_signing_enabled")) {
    const std::string b = lowercase(*v);
    if (b != "true" && b != "false")
      return invalid_argument(profile_source + ": s3.payload_signing_enabled must be true or false");
    c.sign_payloads = b == "true";
  } else {
    c.sign_payloads = c.endpoint.rfind("http://", 0) == 0;
  }

  // Upload checksums: the SDKs' setting and values ("when_required" sends
  // none, since no request of ours requires one).
  if (o.checksums) {
    c.checksums = *o.checksums;
  } else {
    std::optional<std::string> v = src.env("AWS_REQUEST_CHECKSUM_CALCULATION");
    std::string source = "AWS_REQUEST_CHECKSUM_CALCULATION";
    if (!v) {
      v = src.from_profile("request_checksum_calculation");
      source = profile_source + " request_checksum_calculation";
    }
    if (v) {
      const std::string w = lowercase(trim(*v));
      if (w != "when_supported" && w != "when_required")
        return invalid_argument(source + " must be when_supported or when_required");
      c.checksums = w == "when_supported";
    }
  }
  return Status::OK();
}

}  // namespace

std::string_view aws_dns_suffix(std::string_view region) {
  return region.starts_with("cn-") ? "amazonaws.com.cn" : "amazonaws.com";
}

std::string default_s3_endpoint(const std::string& region) {
  return "https://s3." + region + "." + std::string(aws_dns_suffix(region));
}

bool dns_compatible_bucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return b.front() != '-' && b.back() != '-';
}

Status check_part_size(uint64_t part_size) {
  if (part_size < kMinPartSize || part_size > kMaxPartSize)
    return invalid_argument("part_size " + std::to_string(part_size) +
                            " is outside S3's limits of 5 MiB to 5 GiB");
  // Staging chunks hold a whole number of parts and of 4 KiB pages (O_DIRECT
  // alignment): lcm(part_size, 4096), which for a part size of 100 MB
  // (100,000,000 bytes) is 1.5 GiB per chunk. The limits are multiples of
  // 4096, so both neighbours are within them.
  constexpr uint64_t kPage = 4096;
  if (part_size % kPage != 0) {
    const uint64_t below = part_size / kPage * kPage, above = below + kPage;
    return invalid_argument("part_size " + std::to_string(part_size) + " is not a multiple of 4096 (4 KiB); the "
                            "nearest valid sizes are " + std::to_string(below) + " and " +
                            std::to_string(above) + " (sizes in MiB, such as 100MiB, always are)");
  }
  return Status::OK();
}

namespace {

// Connections, part size, retries and timeouts.
Status resolve_limits(const S3ConfigOverrides& o, const ConfigSources& src, S3Config& c) {
  if (o.max_connections) c.max_connections = *o.max_connections;
  if (c.max_connections == 0) return invalid_argument("max_connections must be at least 1");
  if (o.part_size) c.part_size = *o.part_size;
  CKPTIO_RETURN_IF_ERROR(check_part_size(c.part_size));
  if (o.retry) {
    c.retry = *o.retry;
  } else {
    std::optional<std::string> attempts = src.env("AWS_MAX_ATTEMPTS");
    std::string source = "AWS_MAX_ATTEMPTS";
    if (!attempts) {
      attempts = src.from_profile("max_attempts");
      source = src.profile_source + " max_attempts";
    }
    if (attempts) {
      int v = 0;
      const std::string_view t = trim(*attempts);
      const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (!all_digits(t) || ec != std::errc() || ptr != t.data() + t.size())
        return invalid_argument(source + " must be a positive integer");
      c.retry.max_attempts = v;
    }
  }
  if (c.retry.max_attempts < 1) return invalid_argument("retry max_attempts must be at least 1");
  if (!finite_nonnegative(c.retry.base_seconds) || !finite_nonnegative(c.retry.cap_seconds))
    return invalid_argument("retry backoff seconds must be finite and not negative");
  if (o.connect_timeout_s) c.connect_timeout_s = *o.connect_timeout_s;
  if (o.request_timeout_s) c.request_timeout_s = *o.request_timeout_s;
  if (!finite_positive(c.connect_timeout_s) || !finite_positive(c.request_timeout_s))
    return invalid_argument("timeouts must be finite and positive");
  return Status::OK();
}

// What objects are written as: encryption and storage class.
Status resolve_object_options(const S3ConfigOverrides& o, S3Config& c) {
  if (o.sse) c.sse = *o.sse;
  if (o.sse_kms_key_id) c.sse_kms_key_id = *o.sse_kms_key_id;
  if (o.storage_class) c.storage_class = *o.storage_class;
  if (!c.sse.empty() && c.sse != "AES256" && c.sse != "aws:kms" && c.sse != "aws:kms:dsse")
    return invalid_argument("server-side encryption '" + printable(c.sse) +
                            "' must be AES256, aws:kms or aws:kms:dsse");
  if (!c.sse_kms_key_id.empty()) {
    if (c.sse.rfind("aws:kms", 0) != 0)
      return invalid_argument("a KMS key id needs server-side encryption aws:kms or aws:kms:dsse");
    for (char ch : c.sse_kms_key_id)
      if (is_control_byte(static_cast<unsigned char>(ch)) || is_space(ch))
        return invalid_argument("the KMS key id contains whitespace or control characters");
  }
  if (!c.storage_class.empty()) {
    if (c.storage_class.size() > 64 ||
        !std::all_of(c.storage_class.begin(), c.storage_class.end(),
                     [](char ch) { return (ch >= 'A' && ch <= 'Z') || ch == '_'; }))
      return invalid_argument("storage class '" + printable(c.storage_class) +
                              "' must be an S3 storage class name such as STANDARD or INTELLIGENT_TIERING");
    if (c.storage_class == "GLACIER" || c.storage_class == "DEEP_ARCHIVE")
      return invalid_argument("storage class " + c.storage_class +
                              " cannot be read without a restore request: a checkpoint there could not "
                              "be restored (GLACIER_IR can)");
  }
  return Status::OK();
}

}  // namespace

std::string S3Config::describe_redacted() const {
  std::string s = "endpoint=";
  s += endpoint.find('@') == std::string::npos ? endpoint : std::string("<redacted>");
  s += " region=" + region;
  s += path_style ? " addressing=path" : " addressing=virtual";
  s += sign_payloads ? " payloads=signed" : " payloads=unsigned";
  s += checksums ? " checksums=crc32c" : " checksums=off";
  if (anonymous) {
    s += " credentials=anonymous";
  } else {
    s += " credentials=" + (credentials_source.empty() ? std::string("given") : credentials_source);
    const std::string& id = creds.access_key_id;
    s += " access_key_id=" + (id.size() >= 8 ? "****" + id.substr(id.size() - 4) : std::string("****"));
    if (!creds.session_token.empty()) s += " session_token=yes";
    if (credential_provider) s += " renewed=yes";
  }
  s += " max_connections=" + std::to_string(max_connections);
  s += " part_size=" + std::to_string(part_size);
  s += " retry=" + std::to_string(retry.max_attempts) + "x/" + fmt(retry.base_seconds) + "s-" +
       fmt(retry.cap_seconds) + "s";
  s += " connect_timeout=" + fmt(connect_timeout_s) + "s";
  s += " stall_timeout=" + fmt(request_timeout_s) + "s";
  if (!sse.empty()) s += " sse=" + sse + (sse_kms_key_id.empty() ? "" : " sse_kms_key_id=" + sse_kms_key_id);
  if (!storage_class.empty()) s += " storage_class=" + storage_class;
  return s;
}

Result<S3Config> resolve_s3_config(const S3ConfigOverrides& o, const GetEnv& getenv,
                                   const ReadFile& read_file, bool use_network) {
  CKPTIO_ASSIGN_OR_RETURN(const ConfigSources src, load_config_sources(o, getenv, read_file));
  S3Config c;
  CKPTIO_RETURN_IF_ERROR(resolve_region(o, src, c));
  CKPTIO_ASSIGN_OR_RETURN(const bool endpoint_given, resolve_endpoint(o, src, c));
  CKPTIO_RETURN_IF_ERROR(resolve_credentials(o, src, use_network, c));
  CKPTIO_RETURN_IF_ERROR(resolve_addressing(o, src, endpoint_given, c));
  CKPTIO_RETURN_IF_ERROR(resolve_limits(o, src, c));
  CKPTIO_RETURN_IF_ERROR(resolve_object_options(o, c));
  return c;
}

Result<S3Config> resolve_s3_config(const S3ConfigOverrides& o) {
  const GetEnv getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  const ReadFile read_file = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    // One byte past the parser's limit, so an oversized file is reported, not truncated.
    std::string text(kMaxIniBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (in.bad()) return std::nullopt;
    text.resize(static_cast<size_t>(in.gcount()));
    return text;
  };
  return resolve_s3_config(o, getenv, read_file, /*use_network=*/true);
}

}  // namespace ckptio::s3
