// Temporary credentials that expire and are renewed: the sources a training
// job on AWS actually has, in the AWS SDKs' order after static keys:
//   web identity   EKS IRSA (and any OIDC): AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN,
//                  exchanged at STS with AssumeRoleWithWebIdentity (unsigned); the
//                  token file is read again at each renewal, as kubelet rotates it
//   container      ECS task roles and EKS Pod Identity: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI
//                  or _FULL_URI, with AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]
//   instance       EC2 instance profiles through IMDSv2 (token, role, credentials),
//                  falling back to IMDSv1 only where the token call is not served
//   assume role    a profile's role_arn with source_profile (static keys) or
//                  credential_source = Environment: STS AssumeRole, signed
//   process        a profile's credential_process (SSO helpers, vaults): a
//                  command that prints the set as JSON
// s3_config_credentials.cc picks the source (see resolve_s3_config); this file fetches,
// parses and renews.
//
// Renewal never blocks a request: a CredentialProvider keeps the current set
// and a background thread replaces it ahead of its expiry (botocore's
// advisory refresh: 15 minutes before, or halfway through a shorter
// lifetime); a failed renewal is retried every few seconds while the old set
// is still used. Each S3 request attempt signs with the set current when it is
// sent (S3Client signs on the HTTP loop as the transfer starts, not when the
// attempt is queued), so retries of a long save pick up renewed keys.
//
// The parsers (parse_credentials_json here, parse_sts_credentials in
// s3_xml.h) are pure functions over outside data; their errors never quote a
// secret.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/s3/sigv4.h"
#include "ckptio/status.h"

namespace ckptio::s3 {

using SystemTime = std::chrono::system_clock::time_point;

struct TimedCredentials {
  Credentials creds;
  std::optional<SystemTime> expiration;  // none: never expires
};

// The JSON that IMDS and the container endpoint send:
// {"AccessKeyId", "SecretAccessKey", "Token", "Expiration", ...}. IMDS adds
// "Code": anything but "Success" is an error. "Token" and "Expiration" may be
// absent (a container endpoint may hand out long-lived keys); an Expiration
// is an ISO 8601 UTC time. `what` names the source in errors.
Result<TimedCredentials> parse_credentials_json(std::string_view body, std::string_view what);

// What a credential_process prints: {"Version": 1, "AccessKeyId",
// "SecretAccessKey", "SessionToken"?, "Expiration"?}.
Result<TimedCredentials> parse_process_credentials(std::string_view body, std::string_view what);

// A credential_process command line split into words as botocore splits it
// (shlex, POSIX mode: whitespace separates, '...' is literal, "..." knows the
// escapes \" and \\, \x outside quotes is x); no shell runs, nothing is expanded.
Result<std::vector<std::string>> split_command(std::string_view command);

using FetchCredentials = std::function<Result<TimedCredentials>()>;

struct RefreshOptions {
  // Renew this long before expiry, or halfway through the lifetime when that
  // is sooner (credentials that live under twice this long).
  double refresh_before_s = 15 * 60;
  // Wait after a failed renewal before the next try: while the set is
  // still valid, at most a quarter of the time it has left (at least 0.2 s).
  double retry_after_s = 10;
};

class CredentialProvider {
 public:
  // Fetches once (its error is returned as is), then renews in a background
  // thread when the set expires. `source` names it in logs and errors.
  static Result<std::shared_ptr<CredentialProvider>> start(std::string source, FetchCredentials fetch,
                                                           RefreshOptions options = {});
  ~CredentialProvider();
  CredentialProvider(const CredentialProvider&) = delete;
  CredentialProvider& operator=(const CredentialProvider&) = delete;

  // The newest set fetched; never waits for the network.
  Credentials current() const;
  // "" while the current set is valid; otherwise why it is not (expired at
  // when, and the last renewal's error), to append to a request's error.
  std::string stale_reason() const;
  const std::string& source() const { return source_; }
  std::optional<SystemTime> expiration() const;
  uint64_t fetches() const;          // successful fetches, the first included
  uint64_t failed_fetches() const;

 private:
  CredentialProvider(std::string source, FetchCredentials fetch, RefreshOptions options);
  void run();

  const std::string source_;
  const FetchCredentials fetch_;
  const RefreshOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  TimedCredentials current_;
  std::string last_error_;
  uint64_t fetches_ = 0;
  uint64_t failed_ = 0;
  std::thread thread_;
};

// ---- The fetchers, each one HTTP exchange or three. `timeout_s` bounds
// connecting and each stall; none of them signs its requests.

// IMDS at `endpoint` (http://169.254.169.254 unless AWS_EC2_METADATA_SERVICE_ENDPOINT):
// the role is discovered at each fetch, as it can change.
FetchCredentials instance_metadata_fetcher(std::string endpoint, double timeout_s);

// The container endpoint at `url`; the Authorization header is read from
// `token_file` at each fetch when it is set, else `token` (may be empty).
FetchCredentials container_fetcher(std::string url, std::string token, std::string token_file,
                                   double timeout_s);

// Runs argv (PATH searched, stdin /dev/null, the environment inherited) and
// reads its stdout; a non-zero exit is an error quoting the first 300 bytes of
// its stderr; killed past `timeout_s`.
FetchCredentials process_fetcher(std::vector<std::string> argv, double timeout_s);

// STS AssumeRoleWithWebIdentity at `sts_endpoint` (scheme://host[:port]),
// with the token read from `token_file` at each fetch.
FetchCredentials web_identity_fetcher(std::string sts_endpoint, std::string role_arn,
                                      std::string session_name, std::string token_file,
                                      double timeout_s);

// STS AssumeRole at `sts_endpoint`, signed (SigV4, service "sts", `region`)
// with the set `source` returns at each fetch: a profile's role_arn with its
// source_profile or credential_source. `external_id` "" and `duration_s` 0
// are left out of the request (STS's defaults).
FetchCredentials assume_role_fetcher(std::string sts_endpoint, std::string region, std::string role_arn,
                                     std::string session_name, std::string external_id, int duration_s,
                                     std::function<Credentials()> source, double timeout_s);

}  // namespace ckptio::s3
