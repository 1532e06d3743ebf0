// What the files of the S3 configuration share, private to them: the text
// helpers of the AWS formats, the sources a resolution reads (environment and
// profile), the endpoint check, and the credential rules' entry point.
// s3_config.h is the public face and states every rule.
//
// The files: s3_uri.cc (parse_s3_uri), aws_files.cc (parse_aws_ini; which
// files and profile a resolution reads), s3_endpoint.cc (http(s) endpoints),
// s3_config_credentials.cc (the credential chain and anonymous), s3_config.cc
// (resolve_s3_config: region, endpoint, addressing, limits, object options;
// describe_redacted).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "backends/s3/s3_config.h"

namespace ckptio::s3::config_internal {

// The AWS files are read up to this size; a larger one is an error.
inline constexpr size_t kMaxIniBytes = 1u << 20;

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }
inline bool is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

inline std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

inline bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

inline bool finite_positive(double v) { return std::isfinite(v) && v > 0; }

// ---- What a resolution reads (aws_files.cc) ---------------------------------

// The environment and the chosen profile, as every rule of a resolution sees
// them. The profile is merged from both files, the credentials file winning
// per key.
struct ConfigSources {
  const GetEnv* getenv = nullptr;  // the caller's; may hold no function
  std::string profile;             // the override, else AWS_PROFILE, else "default"
  std::string profile_source;      // "profile NAME", printable, for messages
  AwsIni config_ini;
  AwsIni creds_ini;
  std::map<std::string, std::string> prof;  // the profile's settings

  // Empty variables count as unset, as in the AWS CLI.
  std::optional<std::string> env(const std::string& name) const;
  bool env_true(const std::string& name) const;
  // A setting of the profile; empty counts as unset.
  std::optional<std::string> from_profile(const std::string& key) const;
  // AWS_IGNORE_CONFIGURED_ENDPOINT_URLS, or the profile's
  // ignore_configured_endpoint_urls: the environment's and profile's
  // endpoints (S3 and STS) are not used.
  bool ignore_configured_endpoints() const;
};

// Reads the files (AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE, else under
// $HOME/.aws) and picks the profile. A missing file is empty; a malformed one
// is an error naming it, and so is an explicitly named profile that is in
// neither file.
Result<ConfigSources> load_config_sources(const S3ConfigOverrides& o, const GetEnv& getenv,
                                          const ReadFile& read_file);

// ---- Endpoints (s3_endpoint.cc) ---------------------------------------------

// "HTTP://Host:9000/" -> "http://Host:9000"; `source` names where it came from.
Result<std::string> normalize_endpoint(std::string_view raw, const std::string& source);

// ---- Credentials (s3_config_credentials.cc) ---------------------------------

// Sets c.creds, c.credentials_source, c.credential_provider and c.anonymous
// by the rules of s3_config.h. Reads c.region (STS) and c.endpoint (whether
// to probe instance metadata), so it runs after both are resolved.
Status resolve_credentials(const S3ConfigOverrides& o, const ConfigSources& src, bool use_network,
                           S3Config& c);

}  // namespace ckptio::s3::config_internal
