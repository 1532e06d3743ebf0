// Where the S3 backend sends requests and as whom, resolved the way the AWS
// CLI and SDKs do it, so users' existing environments and ~/.aws files work.
//
// Precedence for each setting: explicit override (caller / CLI flag), then the
// environment, then the profile in ~/.aws/credentials and ~/.aws/config, then
// defaults. Credentials come whole from one source: an access key from the
// environment is never paired with a secret from a file.
//
// Secrets (secret access keys, session tokens) never appear in any error
// message or in describe_redacted(); parse errors name files and line numbers,
// never line contents.
//
// Everything here is a pure function of its inputs, except the convenience
// resolve_s3_config(overrides), which reads the real environment and files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backends/s3/retry.h"
#include "backends/s3/sigv4.h"
#include "ckptio/status.h"

namespace ckptio::s3 {

class CredentialProvider;  // credentials.h

// s3://bucket[/prefix[/]]
struct S3Uri {
  std::string bucket;
  std::string prefix;  // "a/b": no leading or trailing '/', "" for the bucket root
};

// Accepts "s3://bucket", "s3://bucket/", "s3://bucket/a/b" and "s3://bucket/a/b/".
// The bucket is checked leniently enough for MinIO and Ceph (3-63 characters of
// letters, digits, '.', '-', '_'; starting and ending with a letter or digit;
// no ".."), and the server does the final check. Prefix segments must be
// non-empty ("a//b" is rejected), not "." or "..", and free of NUL, backslash
// and control characters. Errors are kInvalidArgument naming the URI.
Result<S3Uri> parse_s3_uri(std::string_view uri);

// Which AWS file a text came from: in the config file profiles are
// "[profile NAME]" (and "[default]"); in the credentials file they are "[NAME]".
enum class AwsIniKind { kConfig, kCredentials };

using AwsIni = std::map<std::string, std::map<std::string, std::string>>;

// Parses ~/.aws/config or ~/.aws/credentials text into section -> key -> value.
//  - "[section]" headers; "key = value" (or "key=value") lines; full-line
//    comments starting with '#' or ';'; blank lines. Keys are lowercased,
//    keys and values trimmed; a value is taken verbatim otherwise ('#' inside a
//    value is not a comment, as in botocore).
//  - Nested settings: "s3 =" followed by lines indented deeper, each
//    "name = value", are stored as "s3.name" (e.g. "s3.endpoint_url",
//    "s3.addressing_style").
//  - kConfig: "[profile NAME]" and "[default]" are stored as NAME / "default";
//    other sections with a space in the header ("[sso-session x]",
//    "[services y]") are stored under their header text; a bare "[NAME]"
//    other than default is not a profile in the config file and is dropped,
//    as the AWS CLI ignores it.
//  - kCredentials: section names are stored as written.
// Strict and total: any other line, a key outside a section, an empty key or
// section name, a repeated key within a section or a repeated section, and
// inputs over 1 MiB are kInvalidArgument errors naming the line number
// ("line 7: ...").
Result<AwsIni> parse_aws_ini(std::string_view text, AwsIniKind kind = AwsIniKind::kConfig);

struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  std::string region = "us-east-1";
  Credentials creds;
  bool anonymous = false;  // send requests unsigned
  // Path style: http://host/bucket/key; virtual-hosted: http://bucket.host/key.
  bool path_style = true;
  // Sign request bodies with their SHA-256 (x-amz-content-sha256 = hash) rather
  // than UNSIGNED-PAYLOAD. Resolved as botocore does: true over plain http, where
  // the hash is the only integrity check the server makes, false over https,
  // where TLS already protects the bytes and hashing 16 MiB parts costs CPU.
  bool sign_payloads = true;
  // Send x-amz-checksum-crc32c with every PutObject and UploadPart (declared on
  // CreateMultipartUpload, listed in CompleteMultipartUpload), as the AWS SDKs
  // do by default: a server that checks it refuses a body damaged on the way,
  // and the client sends it again. Off for a server that refuses the headers
  // (AWS_REQUEST_CHECKSUM_CALCULATION=when_required, as for the SDKs).
  bool checksums = true;
  uint32_t max_connections = 32;
  uint64_t part_size = 16 << 20;  // multipart part size, in [5 MiB, 5 GiB], a multiple of 4096
  RetryPolicy retry;
  double connect_timeout_s = 10;
  double request_timeout_s = 60;  // low-speed / stall timeout, not a total deadline
  // Sent with every request that creates an object (PutObject,
  // CreateMultipartUpload, CopyObject), never with UploadPart: server-side
  // encryption "" (the bucket's default) | "AES256" | "aws:kms" |
  // "aws:kms:dsse"; the KMS key (id, ARN or alias) with aws:kms*, "" for the
  // account's default key; the storage class, "" for the bucket's default
  // (STANDARD). Bucket policies that demand encryption headers then accept
  // every write of a checkpoint.
  std::string sse;
  std::string sse_kms_key_id;
  std::string storage_class;
  // Where creds came from, for logs: "override", "environment", "profile NAME",
  // "web identity ROLE_ARN", "container URL", "instance metadata ENDPOINT", or
  // "" when anonymous.
  std::string credentials_source;
  // Set for credentials that expire and are renewed (web identity, container,
  // instance metadata): every request attempt signs with its current() set
  // as it is sent, and `creds` is only the first one. Shared by copies of
  // the config.
  std::shared_ptr<CredentialProvider> credential_provider;

  // One line for logs and `ckptio` output: endpoint, region, addressing,
  // credential source and the last 4 characters of the access key id, limits.
  // Never the secret access key or session token.
  std::string describe_redacted() const;
};

// Caller / CLI settings; each one set wins over every other source.
struct S3ConfigOverrides {
  std::optional<std::string> endpoint;
  std::optional<std::string> region;
  std::optional<Credentials> creds;  // access key id and secret both required
  std::optional<bool> anonymous;
  std::optional<bool> path_style;
  std::optional<bool> sign_payloads;
  std::optional<bool> checksums;
  std::optional<uint32_t> max_connections;
  std::optional<uint64_t> part_size;
  std::optional<RetryPolicy> retry;
  std::optional<double> connect_timeout_s;
  std::optional<double> request_timeout_s;
  std::optional<std::string> profile;  // as AWS_PROFILE; must exist when set
  std::optional<std::string> sse;
  std::optional<std::string> sse_kms_key_id;
  std::optional<std::string> storage_class;
  // Not a setting: the bucket the configuration is for, when known (open_s3_uri
  // sets it). Under addressing "auto" a bucket name that is not DNS-compatible
  // is addressed path style (see path_style below).
  std::optional<std::string> bucket;
};

// Whether a bucket name can be a host name label under TLS, as botocore's
// check_dns_name decides: 3 to 63 characters of lowercase letters, digits and
// '-', starting and ending with a letter or digit. A '.' is refused too: the
// name would be several labels, which AWS's wildcard certificate
// (*.s3.REGION.amazonaws.com) does not cover.
bool dns_compatible_bucket(std::string_view bucket);

// The DNS suffix of AWS's endpoints in `region`'s partition: amazonaws.com.cn
// in the China regions (cn-north-1, cn-northwest-1), amazonaws.com elsewhere
// (the GovCloud regions included).
std::string_view aws_dns_suffix(std::string_view region);
// The S3 endpoint when none is configured: https://s3.<region>.<suffix>.
std::string default_s3_endpoint(const std::string& region);

using GetEnv = std::function<std::optional<std::string>(const std::string& name)>;
// Returns a file's contents, or nullopt when it does not exist or cannot be read.
using ReadFile = std::function<std::optional<std::string>(const std::string& path)>;

// Resolves the configuration from overrides, the environment and the AWS
// files, with these sources per setting (first one set wins):
//   endpoint   override; AWS_ENDPOINT_URL_S3; AWS_ENDPOINT_URL; profile
//              "s3.endpoint_url"; profile "endpoint_url"; else
//              https://s3.<region>.amazonaws.com (.com.cn in China: aws_dns_suffix).
//              AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true
//              skips the environment and profile endpoints.
//   region     override; AWS_REGION; AWS_DEFAULT_REGION; profile "region"; us-east-1
//   creds      override; AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
//              skipped when overrides.profile names a profile (as `aws --profile`);
//              then, only with use_network (see credentials.h for each):
//                assume role: the profile's role_arn with source_profile (its
//                static keys) or credential_source = Environment (+ role_session_name,
//                external_id, duration_seconds), STS AssumeRole signed with them;
//                web identity: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN
//                (+ AWS_ROLE_SESSION_NAME), else the profile's web_identity_token_file
//                + role_arn (+ role_session_name); STS at AWS_ENDPOINT_URL_STS, else
//                AWS_ENDPOINT_URL, else https://sts.<region>.amazonaws.com (.com.cn);
//              profile aws_access_key_id + aws_secret_access_key (+ aws_session_token),
//              the credentials file winning over the config file;
//              then, only with use_network:
//                the profile's credential_process (a command, split as botocore
//                splits it, run without a shell; 300 s to answer);
//                container: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on 169.254.170.2)
//                or AWS_CONTAINER_CREDENTIALS_FULL_URI (https, or http to loopback or
//                the ECS/EKS link-local hosts), Authorization from
//                AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or _TOKEN;
//                instance metadata (IMDSv2) at AWS_EC2_METADATA_SERVICE_ENDPOINT or
//                http://169.254.169.254, timeout AWS_METADATA_SERVICE_TIMEOUT (1 s);
//                not tried when AWS_EC2_METADATA_DISABLED=true, or when the S3
//                endpoint is on loopback and no metadata endpoint is set (a local
//                test server needs no probe of a link-local address).
//              A configured web identity or container source that fails is an
//              error; an instance metadata service that is absent or has no role
//              is not (the next rule applies).
//   anonymous  override; AWS_NO_SIGN_REQUEST=true; and, when no credentials are
//              found anywhere, true (public buckets and local test servers work
//              without setup; a server that needs credentials answers 403, and
//              describe_redacted() says "anonymous"). An override of false with
//              no credentials found is an error.
//   path_style override; profile "s3.addressing_style" (path | virtual | auto);
//              auto (the default): true when the endpoint was given explicitly
//              (MinIO, Ceph, moto have no per-bucket DNS) or overrides.bucket is
//              not dns_compatible_bucket() (a dotted name would fail TLS as a
//              host name, as in botocore), false otherwise (the AWS default
//              endpoint)
//   sign_payloads  override; profile "s3.payload_signing_enabled" (true | false);
//              else true for http:// endpoints, false for https://
//   checksums  override; AWS_REQUEST_CHECKSUM_CALCULATION; profile
//              "request_checksum_calculation" (when_supported: true, the
//              default | when_required: false; any case), as the AWS SDKs
//   retry.max_attempts  AWS_MAX_ATTEMPTS, profile "max_attempts", if not overridden
// The profile is the override, else AWS_PROFILE, else "default"; the files are
// AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE, else $HOME/.aws/credentials
// and $HOME/.aws/config. A missing file is empty; a malformed one is an error
// naming the file. An explicitly named profile that is in neither file is an
// error; the implicit "default" may be absent.
//   sse, sse_kms_key_id, storage_class  override only (as the AWS CLI's
//              --sse, --sse-kms-key-id, --storage-class); sse one of AES256,
//              aws:kms, aws:kms:dsse; a KMS key only with aws:kms*; a storage
//              class of [A-Z_], not GLACIER or DEEP_ARCHIVE (objects there
//              cannot be read without a restore request: a checkpoint would be
//              unrestorable)
// Validation (kInvalidArgument): endpoint is http(s)://host[:port] with no
// user info, path, query or fragment (a trailing '/' and a default port,
// :80 for http and :443 for https, are dropped, as curl drops them from Host); a partial
// credential pair; part_size outside [5 MiB, 5 GiB] or not a multiple of 4096
// (check_part_size); max_connections 0;
// max_attempts < 1; negative or non-finite backoff seconds (0 is allowed, for
// tests); zero, negative or non-finite timeouts; a region outside [A-Za-z0-9._-].
// Without use_network it never touches the network nor runs a
// credential_process (the fuzz target and the unit tests call it so).
Result<S3Config> resolve_s3_config(const S3ConfigOverrides& o, const GetEnv& getenv,
                                   const ReadFile& read_file, bool use_network = false);

// The same with the process environment (std::getenv), the filesystem and the
// network.
Result<S3Config> resolve_s3_config(const S3ConfigOverrides& o);

// kInvalidArgument unless part_size is within S3's [5 MiB, 5 GiB] and a
// multiple of 4096: a save stages whole parts in chunks aligned to 4 KiB
// pages, lcm(part_size, 4096) bytes each, so 100 MB (100,000,000 bytes)
// would make every chunk 1.5 GiB. The message names the nearest valid sizes.
// resolve_s3_config and make_s3_storage check it.
Status check_part_size(uint64_t part_size);

}  // namespace ckptio::s3
