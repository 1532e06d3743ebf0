// The credential chain of resolve_s3_config, in the order s3_config.h gives:
// one source supplies the whole set; static keys are taken as they are, and
// each temporary source starts a CredentialProvider (credentials.h) that
// fetches the first set now and renews it later. Then whether requests are
// signed at all.

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/s3/credentials.h"
#include "backends/s3/s3_config_internal.h"
#include "src/util/printable.h"
#include "src/util/log.h"

namespace ckptio::s3::config_internal {
namespace {

// The host of an http(s) URL is on loopback: 127.0.0.0/8, ::1 or localhost.
bool is_loopback_url(std::string_view url) {
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos) return false;
  std::string_view host = url.substr(sep + 3);
  host = host.substr(0, host.find_first_of("/?#"));
  if (!host.empty() && host.front() == '[') return host.substr(0, 5) == "[::1]";
  host = host.substr(0, host.find(':'));
  return lowercase(host) == "localhost" || host.substr(0, 4) == "127.";
}

// AWS_CONTAINER_CREDENTIALS_FULL_URI: https anywhere; plain http only to
// loopback and the ECS / EKS Pod Identity agents, as the SDKs allow.
Status check_container_url(std::string_view url) {
  const std::string lower = lowercase(url.substr(0, 8));
  if (lower.rfind("https://", 0) == 0) return Status::OK();
  if (lower.rfind("http://", 0) == 0) {
    std::string_view host = url.substr(7);
    host = host.substr(0, host.find_first_of("/?#"));
    if (host.find('@') != std::string_view::npos)
      return invalid_argument("AWS_CONTAINER_CREDENTIALS_FULL_URI must not contain user info");
    if (is_loopback_url(url)) return Status::OK();
    if (!host.empty() && host.front() == '[') {
      if (host.substr(0, 14) == "[fd00:ec2::23]") return Status::OK();
    } else {
      host = host.substr(0, host.find(':'));
      if (host == "169.254.170.2" || host == "169.254.170.23") return Status::OK();
    }
  }
  return invalid_argument("AWS_CONTAINER_CREDENTIALS_FULL_URI '" + printable(url) +
                          "' must be https, or http to loopback, 169.254.170.2, 169.254.170.23 "
                          "or [fd00:ec2::23]");
}

// What the chain found, written into the config being resolved.
struct Found {
  S3Config& c;
  bool have_creds = false;

  void set(Credentials creds, std::string source) {
    c.creds = std::move(creds);
    c.credentials_source = std::move(source);
    have_creds = true;
  }
  void adopt(std::shared_ptr<CredentialProvider> provider, std::string source) {
    c.credential_provider = std::move(provider);
    c.creds = c.credential_provider->current();
    c.credentials_source = std::move(source);
    have_creds = true;
  }
  // A configured temporary source that fails is an error.
  Status use_provider(std::string source, FetchCredentials fetch) {
    CKPTIO_ASSIGN_OR_RETURN(std::shared_ptr<CredentialProvider> provider,
                            CredentialProvider::start(source, std::move(fetch)));
    adopt(std::move(provider), std::move(source));
    return Status::OK();
  }
};

// STS: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, else the region's.
Result<std::string> sts_endpoint(const ConfigSources& src, const std::string& region) {
  const bool ignore_configured_endpoints = src.ignore_configured_endpoints();
  if (auto v = ignore_configured_endpoints ? std::nullopt : src.env("AWS_ENDPOINT_URL_STS"))
    return normalize_endpoint(*v, "AWS_ENDPOINT_URL_STS");
  if (auto v = ignore_configured_endpoints ? std::nullopt : src.env("AWS_ENDPOINT_URL"))
    return normalize_endpoint(*v, "AWS_ENDPOINT_URL");
  return "https://sts." + region + "." + std::string(aws_dns_suffix(region));
}

std::string default_session() {
  return "ckptio-" + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

// The static keys that sign an AssumeRole: the source profile's, or the
// environment's (credential_source = Environment).
Result<Credentials> role_source_credentials(const ConfigSources& src,
                                            const std::optional<std::string>& source_profile,
                                            const std::optional<std::string>& credential_source) {
  const std::string& profile_source = src.profile_source;
  if (source_profile) {
    std::map<std::string, std::string> keys;
    bool found = false;
    if (auto it = src.config_ini.find(*source_profile); it != src.config_ini.end()) {
      keys = it->second;
      found = true;
    }
    if (auto it = src.creds_ini.find(*source_profile); it != src.creds_ini.end()) {
      for (const auto& [k, v] : it->second) keys[k] = v;
      found = true;
    }
    const std::string what = profile_source + ": source_profile '" + printable(*source_profile) + "'";
    if (!found) return invalid_argument(what + " not found");
    if (keys.count("role_arn") && *source_profile != src.profile)  // itself: its own keys, as botocore
      return invalid_argument(what + " assumes a role itself; chained roles are not supported");
    if (keys["aws_access_key_id"].empty() || keys["aws_secret_access_key"].empty())
      return invalid_argument(what + " has no aws_access_key_id and aws_secret_access_key");
    return Credentials{keys["aws_access_key_id"], keys["aws_secret_access_key"], keys["aws_session_token"]};
  }
  if (*credential_source == "Environment") {
    const auto id = src.env("AWS_ACCESS_KEY_ID");
    const auto secret = src.env("AWS_SECRET_ACCESS_KEY");
    if (!id || !secret)
      return invalid_argument(profile_source + ": credential_source Environment needs AWS_ACCESS_KEY_ID "
                                               "and AWS_SECRET_ACCESS_KEY");
    return Credentials{*id, *secret, src.env("AWS_SESSION_TOKEN").value_or("")};
  }
  return invalid_argument(profile_source + ": credential_source '" + printable(*credential_source) +
                          "' is not supported (Environment is)");
}

// The profile's role_arn, assumed at STS with role_source_credentials().
Status from_assumed_role(const ConfigSources& src, const std::string& region, Found& found) {
  const std::string& profile_source = src.profile_source;
  const std::string role = *src.from_profile("role_arn");
  const std::optional<std::string> source_profile = src.from_profile("source_profile");
  const std::optional<std::string> credential_source = src.from_profile("credential_source");
  if (source_profile.has_value() == credential_source.has_value())
    return invalid_argument(profile_source + ": role_arn needs exactly one of source_profile and credential_source");
  if (src.from_profile("mfa_serial"))
    return invalid_argument(profile_source + ": mfa_serial is not supported (a code would be needed at "
                                             "every renewal); use credential_process with an MFA helper");
  CKPTIO_ASSIGN_OR_RETURN(const Credentials source,
                          role_source_credentials(src, source_profile, credential_source));
  int duration = 0;
  if (auto d = src.from_profile("duration_seconds")) {
    const std::string_view t = trim(*d);
    const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), duration);
    if (!all_digits(t) || ec != std::errc() || ptr != t.data() + t.size() || duration < 900 || duration > 43200)
      return invalid_argument(profile_source + ": duration_seconds must be 900 to 43200");
  }
  CKPTIO_ASSIGN_OR_RETURN(const std::string sts, sts_endpoint(src, region));
  return found.use_provider(
      profile_source + " role " + printable(role),
      assume_role_fetcher(sts, region, role, src.from_profile("role_session_name").value_or(default_session()),
                          src.from_profile("external_id").value_or(""), duration, [source] { return source; },
                          10));
}

// The web identity pair: from the environment, else from the profile.
struct WebIdentity {
  std::optional<std::string> token_file;
  std::optional<std::string> role;
  std::optional<std::string> session;
  std::string source = "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN";
};

WebIdentity web_identity_of(const ConfigSources& src) {
  WebIdentity wi{src.env("AWS_WEB_IDENTITY_TOKEN_FILE"), src.env("AWS_ROLE_ARN"), src.env("AWS_ROLE_SESSION_NAME")};
  if (!wi.token_file && !wi.role && src.from_profile("web_identity_token_file")) {
    wi.token_file = src.from_profile("web_identity_token_file");
    wi.role = src.from_profile("role_arn");
    wi.session = src.from_profile("role_session_name");
    wi.source = src.profile_source + " web_identity_token_file and role_arn";
  }
  return wi;
}

Status from_web_identity(const WebIdentity& wi, const ConfigSources& src, const std::string& region, Found& found) {
  if (!wi.token_file || !wi.role)
    return invalid_argument(wi.source + ": web identity needs both the token file and the role ARN");
  CKPTIO_ASSIGN_OR_RETURN(const std::string sts, sts_endpoint(src, region));
  const std::string session = wi.session.value_or(default_session());
  return found.use_provider("web identity " + printable(*wi.role),
                            web_identity_fetcher(sts, *wi.role, session, *wi.token_file, 10));
}

// ECS task roles and EKS Pod Identity.
Status from_container(const ConfigSources& src, Found& found) {
  std::string url;
  if (auto rel = src.env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
    if (rel->front() != '/' || rel->find_first_of(" \t\r\n@") != std::string::npos)
      return invalid_argument("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI must be a path starting with '/'");
    url = "http://169.254.170.2" + *rel;
  } else {
    url = *src.env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    CKPTIO_RETURN_IF_ERROR(check_container_url(url));
  }
  return found.use_provider(
      "container " + printable(url),
      container_fetcher(url, src.env("AWS_CONTAINER_AUTHORIZATION_TOKEN").value_or(""),
                        src.env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").value_or(""), 2));
}

// EC2 instance profiles. Unlike the sources above, one that is absent or has
// no role is not an error: the chain goes on. Not probed for an S3 endpoint on
// loopback unless a metadata endpoint is set.
Status from_instance_metadata(const ConfigSources& src, const std::string& s3_endpoint, Found& found) {
  std::optional<std::string> imds = src.env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (!imds) imds = src.from_profile("ec2_metadata_service_endpoint");
  if (!imds && is_loopback_url(s3_endpoint)) return Status::OK();
  std::string ep = "http://169.254.169.254";
  if (imds) {
    CKPTIO_ASSIGN_OR_RETURN(ep, normalize_endpoint(*imds, "AWS_EC2_METADATA_SERVICE_ENDPOINT"));
  }
  double timeout = 1;
  std::optional<std::string> t = src.env("AWS_METADATA_SERVICE_TIMEOUT");
  if (!t) t = src.from_profile("metadata_service_timeout");
  if (t) {
    char* end = nullptr;
    const std::string text(trim(*t));
    timeout = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !finite_positive(timeout))
      return invalid_argument("AWS_METADATA_SERVICE_TIMEOUT must be a positive number of seconds");
  }
  Result<std::shared_ptr<CredentialProvider>> p =
      CredentialProvider::start("instance metadata " + ep, instance_metadata_fetcher(ep, timeout));
  if (p.ok()) {
    found.adopt(std::move(*p), "instance metadata " + ep);
  } else {
    // Not on EC2, or no role: as the SDKs, go on to the next rule.
    logging::debug("ckptio: no credentials from instance metadata: {}", p.status().to_string());
  }
  return Status::OK();
}

// Signed or anonymous, once the chain has run.
Status choose_anonymous(const S3ConfigOverrides& o, const ConfigSources& src, bool have_creds, S3Config& c) {
  if (o.anonymous) {
    c.anonymous = *o.anonymous;
  } else {
    // With no credentials anywhere we go anonymous rather than fail: public
    // buckets and local test servers then work with no setup, and a server
    // that does need credentials answers 403, which names the problem.
    c.anonymous = src.env_true("AWS_NO_SIGN_REQUEST") || !have_creds;
  }
  if (!c.anonymous && !have_creds)
    return invalid_argument("signed requests were asked for (anonymous = false) but no credentials "
                            "were found: no override, no AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                            "and none in " + src.profile_source);
  if (c.anonymous) {
    c.creds = Credentials{};
    c.credentials_source.clear();
    c.credential_provider.reset();
  }
  return Status::OK();
}

}  // namespace

Status resolve_credentials(const S3ConfigOverrides& o, const ConfigSources& src, bool use_network,
                           S3Config& c) {
  const bool want_anonymous = o.anonymous ? *o.anonymous : src.env_true("AWS_NO_SIGN_REQUEST");
  const bool network = use_network && !want_anonymous;
  Found found{c};
  const WebIdentity wi = web_identity_of(src);
  const bool assume_role = src.from_profile("role_arn") && !src.from_profile("web_identity_token_file");
  if (o.creds) {
    if (o.creds->access_key_id.empty() || o.creds->secret_access_key.empty())
      return invalid_argument("credentials override needs both an access key id and a secret access key");
    found.set(*o.creds, "override");
  } else if (!o.profile && (src.env("AWS_ACCESS_KEY_ID") || src.env("AWS_SECRET_ACCESS_KEY"))) {
    // An explicitly chosen profile (--profile) beats environment keys, as in
    // the AWS CLI; AWS_PROFILE does not.
    const auto id = src.env("AWS_ACCESS_KEY_ID");
    const auto secret = src.env("AWS_SECRET_ACCESS_KEY");
    if (!id) return invalid_argument("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not");
    if (!secret) return invalid_argument("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
    found.set(Credentials{*id, *secret, src.env("AWS_SESSION_TOKEN").value_or("")}, "environment");
  } else if (network && assume_role) {
    CKPTIO_RETURN_IF_ERROR(from_assumed_role(src, c.region, found));
  } else if (network && (wi.token_file || wi.role)) {
    CKPTIO_RETURN_IF_ERROR(from_web_identity(wi, src, c.region, found));
  } else if (src.from_profile("aws_access_key_id") || src.from_profile("aws_secret_access_key")) {
    const auto id = src.from_profile("aws_access_key_id");
    const auto secret = src.from_profile("aws_secret_access_key");
    if (!id || !secret)
      return invalid_argument(src.profile_source + " has only one of aws_access_key_id and aws_secret_access_key");
    found.set(Credentials{*id, *secret, src.from_profile("aws_session_token").value_or("")}, src.profile_source);
  } else if (network && src.from_profile("credential_process")) {
    CKPTIO_ASSIGN_OR_RETURN(std::vector<std::string> argv, split_command(*src.from_profile("credential_process")));
    CKPTIO_RETURN_IF_ERROR(
        found.use_provider(src.profile_source + " credential_process", process_fetcher(std::move(argv), 300)));
  } else if (network && (src.env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") ||
                         src.env("AWS_CONTAINER_CREDENTIALS_FULL_URI"))) {
    CKPTIO_RETURN_IF_ERROR(from_container(src, found));
  } else if (network && !src.env_true("AWS_EC2_METADATA_DISABLED")) {
    CKPTIO_RETURN_IF_ERROR(from_instance_metadata(src, c.endpoint, found));
  }
  return choose_anonymous(o, src, found.have_creds, c);
}

}  // namespace ckptio::s3::config_internal
