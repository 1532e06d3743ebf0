#include "backends/s3/s3_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "backends/s3/credentials.h"
#include "src/util/printable.h"

namespace ckptio::s3 {
namespace {

constexpr size_t kMaxIniBytes = 1u << 20;
constexpr uint64_t kMinPartSize = 5ull << 20;  // S3: every part but the last
constexpr uint64_t kMaxPartSize = 5ull << 30;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }
bool is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// ---- s3:// URIs ----------------------------------------------------------

Status bad_uri(std::string_view uri, const std::string& why) {
  return invalid_argument("invalid S3 URI '" + printable(uri) + "': " + why);
}

Status check_bucket(std::string_view uri, std::string_view b) {
  if (b.empty()) return bad_uri(uri, "empty bucket name (expected s3://bucket[/prefix])");
  if (b.size() < 3 || b.size() > 63) return bad_uri(uri, "bucket names have 3 to 63 characters");
  for (char c : b)
    if (!is_alnum(c) && c != '.' && c != '-' && c != '_')
      return bad_uri(uri, "bucket names contain only letters, digits, '.', '-' and '_'");
  if (!is_alnum(b.front()) || !is_alnum(b.back()))
    return bad_uri(uri, "bucket names start and end with a letter or digit");
  if (b.find("..") != std::string_view::npos) return bad_uri(uri, "bucket name contains '..'");
  return Status::OK();
}

Status check_prefix(std::string_view uri, std::string_view p) {
  for (char c : p) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') return bad_uri(uri, "prefix contains a backslash");
    if (c == '\0') return bad_uri(uri, "prefix contains NUL");
    if (is_control_byte(u)) return bad_uri(uri, "prefix contains a control character");
  }
  size_t start = 0;
  while (true) {
    const size_t end = p.find('/', start);
    const std::string_view seg = p.substr(start, end == std::string_view::npos ? end : end - start);
    if (seg.empty()) return bad_uri(uri, "prefix has an empty path segment ('//')");
    if (seg == "." || seg == "..") return bad_uri(uri, "prefix has a '.' or '..' segment");
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return Status::OK();
}

// ---- AWS ini files -------------------------------------------------------

Status ini_error(size_t line, const std::string& why) {
  return invalid_argument("line " + std::to_string(line) + ": " + why);
}

// ---- Endpoints -----------------------------------------------------------

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "HTTP://Host:9000/" -> "http://Host:9000"; `source` names where it came from.
Result<std::string> normalize_endpoint(std::string_view raw, const std::string& source) {
  if (raw.find('@') != std::string_view::npos)  // never echo: it may hold a password
    return invalid_argument("endpoint from " + source +
                            " contains user info ('@'); give credentials through "
                            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile");
  auto bad = [&](const std::string& why) {
    return invalid_argument("endpoint '" + printable(raw) + "' from " + source + ": " + why);
  };
  const std::string_view s = trim(raw);
  const size_t sep = s.find("://");
  if (sep == std::string_view::npos) return bad("expected http://host[:port] or https://host[:port]");
  const std::string scheme = lowercase(s.substr(0, sep));
  if (scheme != "http" && scheme != "https") return bad("scheme must be http or https");
  std::string_view rest = s.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  for (char c : rest)
    if (is_space(c) || is_control_byte(static_cast<unsigned char>(c)))
      return bad("contains whitespace or control characters");
  if (rest.find_first_of("/?#") != std::string_view::npos)
    return bad("must not have a path, query or fragment");
  std::string_view host = rest, port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 literal");
    host = rest.substr(0, close + 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("unexpected text after the IPv6 literal");
      port = after.substr(1);
      if (port.empty()) return bad("empty port");
    }
    if (host.size() <= 2) return bad("empty host");
    for (char c : host.substr(1, host.size() - 2))
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.')
        return bad("invalid IPv6 literal");
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != std::string_view::npos) {
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
    if (host.empty()) return bad("empty host");
    for (char c : host)
      if (!is_alnum(c) && c != '.' && c != '-' && c != '_') return bad("invalid host name");
  }
  if (!port.empty()) {
    unsigned v = 0;
    const auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
    if (!all_digits(port) || ec != std::errc() || ptr != port.data() + port.size() || v == 0 ||
        v > 65535)
      return bad("port must be 1-65535");
  }
  // curl leaves a scheme's default port out of the Host header; drop it here
  // too, so that a Host derived from the endpoint is the Host that gets signed.
  if ((scheme == "http" && port == "80") || (scheme == "https" && port == "443"))
    return scheme + "://" + std::string(host);
  return scheme + "://" + std::string(rest);
}

Status check_region(const std::string& region) {
  if (region.empty() || region.size() > 64) return invalid_argument("region must have 1 to 64 characters");
  for (char c : region)
    if (!is_alnum(c) && c != '-' && c != '_' && c != '.')
      return invalid_argument("region '" + printable(region) +
                              "' may contain only letters, digits, '-', '_' and '.'");
  return Status::OK();
}

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

bool finite_positive(double v) { return std::isfinite(v) && v > 0; }
bool finite_nonnegative(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

Result<S3Uri> parse_s3_uri(std::string_view uri) {
  constexpr std::string_view kScheme = "s3://";
  if (uri.substr(0, kScheme.size()) != kScheme) return bad_uri(uri, "expected s3://bucket[/prefix]");
  const std::string_view rest = uri.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  CKPTIO_RETURN_IF_ERROR(check_bucket(uri, bucket));
  S3Uri out{std::string(bucket), ""};
  if (slash == std::string_view::npos) return out;
  std::string_view prefix = rest.substr(slash + 1);
  if (!prefix.empty() && prefix.back() == '/') {
    prefix.remove_suffix(1);
    if (prefix.empty()) return bad_uri(uri, "prefix has an empty path segment ('//')");
  }
  if (prefix.empty()) return out;
  CKPTIO_RETURN_IF_ERROR(check_prefix(uri, prefix));
  out.prefix = std::string(prefix);
  return out;
}

Result<AwsIni> parse_aws_ini(std::string_view text, AwsIniKind kind) {
  if (text.size() > kMaxIniBytes) return invalid_argument("larger than 1 MiB");
  AwsIni out;
  std::set<std::string> seen_sections;
  bool in_section = false;
  std::map<std::string, std::string>* section = nullptr;  // null: a section we drop
  std::string section_name;
  // The last key of the section, for nested "s3 =" blocks.
  bool have_key = false;
  size_t key_indent = 0;
  bool key_opens_block = false;
  std::string key_name;

  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

    size_t indent = 0;
    while (indent < line.size() && (line[indent] == ' ' || line[indent] == '\t')) ++indent;
    const std::string_view body = trim(line);
    if (body.empty() || body.front() == '#' || body.front() == ';') continue;
    for (char c : body)
      if (is_control_byte(static_cast<unsigned char>(c)) && c != '\t')
        return ini_error(line_no, "control character");

    if (have_key && indent > key_indent) {  // continuation of the previous key
      if (!key_opens_block)
        return ini_error(line_no, "indented line continues a value; only nested settings "
                                  "such as 's3 =' may be followed by indented lines");
      const size_t eq = body.find('=');
      if (eq == std::string_view::npos) return ini_error(line_no, "expected 'name = value' in a nested block");
      const std::string name = lowercase(trim(body.substr(0, eq)));
      if (name.empty()) return ini_error(line_no, "empty key");
      if (section) {
        const std::string full = key_name + "." + name;
        if (section->count(full)) return ini_error(line_no, "repeated key in [" + section_name + "]");
        (*section)[full] = std::string(trim(body.substr(eq + 1)));
      }
      continue;
    }

    if (body.front() == '[') {
      if (body.back() != ']') return ini_error(line_no, "section header is missing ']'");
      const std::string_view raw = trim(body.substr(1, body.size() - 2));
      if (raw.empty()) return ini_error(line_no, "empty section name");
      if (raw.find_first_of("[]") != std::string_view::npos)
        return ini_error(line_no, "'[' or ']' inside a section name");
      std::string name(raw);
      bool keep = true;
      if (kind == AwsIniKind::kConfig && raw != "default") {
        const bool has_space = raw.find_first_of(" \t") != std::string_view::npos;
        if (raw.substr(0, 7) == "profile" && raw.size() > 7 && (raw[7] == ' ' || raw[7] == '\t')) {
          name = std::string(trim(raw.substr(8)));
          if (name.empty()) return ini_error(line_no, "empty profile name");
        } else if (!has_space) {
          keep = false;  // "[name]" is not a profile in the config file
        }
      }
      in_section = true;
      have_key = false;
      section_name = name;
      if (keep) {
        if (!seen_sections.insert(name).second)
          return ini_error(line_no, "section [" + name + "] repeated");
        section = &out[name];
      } else {
        section = nullptr;
      }
      continue;
    }

    const size_t delim = body.find_first_of("=:");
    if (delim == std::string_view::npos)
      return ini_error(line_no, "expected '[section]' or 'key = value'");
    if (!in_section) return ini_error(line_no, "setting outside of any [section]");
    const std::string key = lowercase(trim(body.substr(0, delim)));
    if (key.empty()) return ini_error(line_no, "empty key");
    const std::string_view value = trim(body.substr(delim + 1));
    if (section) {
      if (section->count(key)) return ini_error(line_no, "repeated key in [" + section_name + "]");
      (*section)[key] = std::string(value);
    }
    have_key = true;
    key_indent = indent;
    key_opens_block = value.empty();
    key_name = key;
  }
  return out;
}

std::string S3Config::describe_redacted() const {
  std::string s = "endpoint=";
  s += endpoint.find('@') == std::string::npos ? endpoint : std::string("<redacted>");
  s += " region=" + region;
  s += path_style ? " addressing=path" : " addressing=virtual";
  s += sign_payloads ? " payloads=signed" : " payloads=unsigned";
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
  // Empty variables count as unset, as in the AWS CLI.
  auto env = [&](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> v = getenv ? getenv(name) : std::nullopt;
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  auto env_true = [&](const std::string& name) {
    const auto v = env(name);
    return v && lowercase(trim(*v)) == "true";
  };

  // ---- The profile, from both files (credentials file wins per key).
  std::optional<std::string> named_profile = o.profile;
  if (!named_profile) named_profile = env("AWS_PROFILE");
  const std::string profile = named_profile ? *named_profile : "default";
  const std::optional<std::string> home = env("HOME");
  auto path_of = [&](const char* var, const char* leaf) -> std::optional<std::string> {
    if (auto p = env(var)) {
      if (p->substr(0, 2) == "~/" && home) return *home + p->substr(1);
      return p;
    }
    if (home) return *home + "/.aws/" + leaf;
    return std::nullopt;
  };
  const std::optional<std::string> creds_path = path_of("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::optional<std::string> config_path = path_of("AWS_CONFIG_FILE", "config");
  auto load = [&](const std::optional<std::string>& path, AwsIniKind kind) -> Result<AwsIni> {
    if (!path || !read_file) return AwsIni{};
    std::optional<std::string> text = read_file(*path);
    if (!text) return AwsIni{};
    Result<AwsIni> ini = parse_aws_ini(*text, kind);
    if (!ini.ok()) return ini.status().annotate("AWS file " + printable(*path));
    return ini;
  };
  CKPTIO_ASSIGN_OR_RETURN(const AwsIni config_ini, load(config_path, AwsIniKind::kConfig));
  CKPTIO_ASSIGN_OR_RETURN(const AwsIni creds_ini, load(creds_path, AwsIniKind::kCredentials));
  std::map<std::string, std::string> prof;
  bool profile_found = false;
  if (auto it = config_ini.find(profile); it != config_ini.end()) {
    prof = it->second;
    profile_found = true;
  }
  if (auto it = creds_ini.find(profile); it != creds_ini.end()) {
    for (const auto& [k, v] : it->second) prof[k] = v;
    profile_found = true;
  }
  if (named_profile && !profile_found)
    return invalid_argument("AWS profile '" + printable(profile) + "' not found in " +
                            (creds_path ? printable(*creds_path) : std::string("(no credentials file)")) +
                            " or " + (config_path ? printable(*config_path) : std::string("(no config file)")));
  auto from_profile = [&](const std::string& key) -> std::optional<std::string> {
    auto it = prof.find(key);
    if (it == prof.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
  // Paths and profile names come from the environment: printable in messages.
  const std::string profile_source = "profile " + printable(profile);

  S3Config c;

  // ---- Region (STS's endpoint depends on it).
  if (o.region) c.region = *o.region;
  else if (auto v = env("AWS_REGION")) c.region = *v;
  else if (auto v = env("AWS_DEFAULT_REGION")) c.region = *v;
  else if (auto v = from_profile("region")) c.region = *v;
  CKPTIO_RETURN_IF_ERROR(check_region(c.region));

  // ---- Endpoint (whether it is on loopback decides the metadata probe).
  const bool ignore_configured_endpoints =
      env_true("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") ||
      lowercase(from_profile("ignore_configured_endpoint_urls").value_or("")) == "true";
  std::optional<std::pair<std::string, std::string>> endpoint;  // value, source
  if (o.endpoint) {
    endpoint.emplace(*o.endpoint, "override");
  } else if (!ignore_configured_endpoints) {
    if (auto v = env("AWS_ENDPOINT_URL_S3")) endpoint.emplace(*v, "AWS_ENDPOINT_URL_S3");
    else if (auto v = env("AWS_ENDPOINT_URL")) endpoint.emplace(*v, "AWS_ENDPOINT_URL");
    else if (auto v = from_profile("s3.endpoint_url")) endpoint.emplace(*v, profile_source);
    else if (auto v = from_profile("endpoint_url")) endpoint.emplace(*v, profile_source);
  }
  if (endpoint) {
    CKPTIO_ASSIGN_OR_RETURN(c.endpoint, normalize_endpoint(endpoint->first, endpoint->second));
  } else {
    c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  }

  // ---- Credentials: one source supplies the whole set.
  const bool want_anonymous = o.anonymous ? *o.anonymous : env_true("AWS_NO_SIGN_REQUEST");
  const bool network = use_network && !want_anonymous;
  bool have_creds = false;
  auto use_provider = [&](std::string source, FetchCredentials fetch) -> Status {
    CKPTIO_ASSIGN_OR_RETURN(c.credential_provider, CredentialProvider::start(source, std::move(fetch)));
    c.creds = c.credential_provider->current();
    c.credentials_source = std::move(source);
    have_creds = true;
    return Status::OK();
  };
  // The web identity pair: from the environment, else from the profile.
  std::optional<std::string> wi_token_file = env("AWS_WEB_IDENTITY_TOKEN_FILE");
  std::optional<std::string> wi_role = env("AWS_ROLE_ARN");
  std::optional<std::string> wi_session = env("AWS_ROLE_SESSION_NAME");
  std::string wi_source = "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN";
  if (!wi_token_file && !wi_role && from_profile("web_identity_token_file")) {
    wi_token_file = from_profile("web_identity_token_file");
    wi_role = from_profile("role_arn");
    wi_session = from_profile("role_session_name");
    wi_source = profile_source + " web_identity_token_file and role_arn";
  }
  // STS: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, else the region's.
  auto sts_endpoint = [&]() -> Result<std::string> {
    if (auto v = ignore_configured_endpoints ? std::nullopt : env("AWS_ENDPOINT_URL_STS"))
      return normalize_endpoint(*v, "AWS_ENDPOINT_URL_STS");
    if (auto v = ignore_configured_endpoints ? std::nullopt : env("AWS_ENDPOINT_URL"))
      return normalize_endpoint(*v, "AWS_ENDPOINT_URL");
    return "https://sts." + c.region + ".amazonaws.com";
  };
  auto default_session = [] {
    return "ckptio-" + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
  };
  const bool assume_role = from_profile("role_arn") && !from_profile("web_identity_token_file");
  if (o.creds) {
    if (o.creds->access_key_id.empty() || o.creds->secret_access_key.empty())
      return invalid_argument("credentials override needs both an access key id and a secret access key");
    c.creds = *o.creds;
    c.credentials_source = "override";
    have_creds = true;
  } else if (!o.profile && (env("AWS_ACCESS_KEY_ID") || env("AWS_SECRET_ACCESS_KEY"))) {
    // An explicitly chosen profile (--profile) beats environment keys, as in
    // the AWS CLI; AWS_PROFILE does not.
    const auto id = env("AWS_ACCESS_KEY_ID");
    const auto secret = env("AWS_SECRET_ACCESS_KEY");
    if (!id) return invalid_argument("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not");
    if (!secret) return invalid_argument("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
    c.creds = Credentials{*id, *secret, env("AWS_SESSION_TOKEN").value_or("")};
    c.credentials_source = "environment";
    have_creds = true;
  } else if (network && assume_role) {
    // role_arn with source_profile (static keys) or credential_source = Environment.
    const std::string role = *from_profile("role_arn");
    const std::optional<std::string> source_profile = from_profile("source_profile");
    const std::optional<std::string> credential_source = from_profile("credential_source");
    if (source_profile.has_value() == credential_source.has_value())
      return invalid_argument(profile_source + ": role_arn needs exactly one of source_profile and credential_source");
    if (from_profile("mfa_serial"))
      return invalid_argument(profile_source + ": mfa_serial is not supported (a code would be needed at "
                                               "every renewal); use credential_process with an MFA helper");
    Credentials source;
    if (source_profile) {
      std::map<std::string, std::string> src;
      bool found = false;
      if (auto it = config_ini.find(*source_profile); it != config_ini.end()) {
        src = it->second;
        found = true;
      }
      if (auto it = creds_ini.find(*source_profile); it != creds_ini.end()) {
        for (const auto& [k, v] : it->second) src[k] = v;
        found = true;
      }
      const std::string what = profile_source + ": source_profile '" + printable(*source_profile) + "'";
      if (!found) return invalid_argument(what + " not found");
      if (src.count("role_arn") && *source_profile != profile)  // itself: its own keys, as botocore
        return invalid_argument(what + " assumes a role itself; chained roles are not supported");
      if (src["aws_access_key_id"].empty() || src["aws_secret_access_key"].empty())
        return invalid_argument(what + " has no aws_access_key_id and aws_secret_access_key");
      source = Credentials{src["aws_access_key_id"], src["aws_secret_access_key"], src["aws_session_token"]};
    } else if (*credential_source == "Environment") {
      const auto id = env("AWS_ACCESS_KEY_ID");
      const auto secret = env("AWS_SECRET_ACCESS_KEY");
      if (!id || !secret)
        return invalid_argument(profile_source + ": credential_source Environment needs AWS_ACCESS_KEY_ID "
                                                 "and AWS_SECRET_ACCESS_KEY");
      source = Credentials{*id, *secret, env("AWS_SESSION_TOKEN").value_or("")};
    } else {
      return invalid_argument(profile_source + ": credential_source '" + printable(*credential_source) +
                              "' is not supported (Environment is)");
    }
    int duration = 0;
    if (auto d = from_profile("duration_seconds")) {
      const std::string_view t = trim(*d);
      const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), duration);
      if (!all_digits(t) || ec != std::errc() || ptr != t.data() + t.size() || duration < 900 || duration > 43200)
        return invalid_argument(profile_source + ": duration_seconds must be 900 to 43200");
    }
    CKPTIO_ASSIGN_OR_RETURN(const std::string sts, sts_endpoint());
    CKPTIO_RETURN_IF_ERROR(use_provider(
        profile_source + " role " + printable(role),
        assume_role_fetcher(sts, c.region, role, from_profile("role_session_name").value_or(default_session()),
                            from_profile("external_id").value_or(""), duration, [source] { return source; },
                            10)));
  } else if (network && (wi_token_file || wi_role)) {
    if (!wi_token_file || !wi_role)
      return invalid_argument(wi_source + ": web identity needs both the token file and the role ARN");
    CKPTIO_ASSIGN_OR_RETURN(const std::string sts, sts_endpoint());
    const std::string session = wi_session.value_or(default_session());
    CKPTIO_RETURN_IF_ERROR(use_provider("web identity " + printable(*wi_role),
                                        web_identity_fetcher(sts, *wi_role, session, *wi_token_file, 10)));
  } else if (from_profile("aws_access_key_id") || from_profile("aws_secret_access_key")) {
    const auto id = from_profile("aws_access_key_id");
    const auto secret = from_profile("aws_secret_access_key");
    if (!id || !secret)
      return invalid_argument(profile_source + " has only one of aws_access_key_id and aws_secret_access_key");
    c.creds = Credentials{*id, *secret, from_profile("aws_session_token").value_or("")};
    c.credentials_source = profile_source;
    have_creds = true;
  } else if (network && from_profile("credential_process")) {
    CKPTIO_ASSIGN_OR_RETURN(std::vector<std::string> argv, split_command(*from_profile("credential_process")));
    CKPTIO_RETURN_IF_ERROR(
        use_provider(profile_source + " credential_process", process_fetcher(std::move(argv), 300)));
  } else if (network && (env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") ||
                         env("AWS_CONTAINER_CREDENTIALS_FULL_URI"))) {
    std::string url;
    if (auto rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
      if (rel->front() != '/' || rel->find_first_of(" \t\r\n@") != std::string::npos)
        return invalid_argument("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI must be a path starting with '/'");
      url = "http://169.254.170.2" + *rel;
    } else {
      url = *env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
      CKPTIO_RETURN_IF_ERROR(check_container_url(url));
    }
    CKPTIO_RETURN_IF_ERROR(use_provider(
        "container " + printable(url),
        container_fetcher(url, env("AWS_CONTAINER_AUTHORIZATION_TOKEN").value_or(""),
                          env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").value_or(""), 2)));
  } else if (network && !env_true("AWS_EC2_METADATA_DISABLED")) {
    std::optional<std::string> imds = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (!imds) imds = from_profile("ec2_metadata_service_endpoint");
    if (imds || !is_loopback_url(c.endpoint)) {
      std::string ep = "http://169.254.169.254";
      if (imds) {
        CKPTIO_ASSIGN_OR_RETURN(ep, normalize_endpoint(*imds, "AWS_EC2_METADATA_SERVICE_ENDPOINT"));
      }
      double timeout = 1;
      std::optional<std::string> t = env("AWS_METADATA_SERVICE_TIMEOUT");
      if (!t) t = from_profile("metadata_service_timeout");
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
        c.credential_provider = std::move(*p);
        c.creds = c.credential_provider->current();
        c.credentials_source = "instance metadata " + ep;
        have_creds = true;
      } else {
        // Not on EC2, or no role: as the SDKs, go on to the next rule.
        spdlog::debug("ckptio: no credentials from instance metadata: {}", p.status().to_string());
      }
    }
  }
  if (o.anonymous) {
    c.anonymous = *o.anonymous;
  } else {
    // With no credentials anywhere we go anonymous rather than fail: public
    // buckets and local test servers then work with no setup, and a server
    // that does need credentials answers 403, which names the problem.
    c.anonymous = env_true("AWS_NO_SIGN_REQUEST") || !have_creds;
  }
  if (!c.anonymous && !have_creds)
    return invalid_argument("signed requests were asked for (anonymous = false) but no credentials "
                            "were found: no override, no AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                            "and none in " + profile_source);
  if (c.anonymous) {
    c.creds = Credentials{};
    c.credentials_source.clear();
    c.credential_provider.reset();
  }

  if (o.path_style) {
    c.path_style = *o.path_style;
  } else {
    const std::string style = lowercase(from_profile("s3.addressing_style").value_or("auto"));
    if (style == "path") c.path_style = true;
    else if (style == "virtual") c.path_style = false;
    else if (style == "auto") c.path_style = endpoint.has_value();
    else return invalid_argument(profile_source + ": s3.addressing_style must be path, virtual or auto");
  }

  if (o.sign_payloads) {
    c.sign_payloads = *o.sign_payloads;
  } else if (auto v = from_profile("s3.payload_signing_enabled")) {
    const std::string b = lowercase(*v);
    if (b != "true" && b != "false")
      return invalid_argument(profile_source + ": s3.payload_signing_enabled must be true or false");
    c.sign_payloads = b == "true";
  } else {
    c.sign_payloads = c.endpoint.rfind("http://", 0) == 0;
  }

  // ---- Limits.
  if (o.max_connections) c.max_connections = *o.max_connections;
  if (c.max_connections == 0) return invalid_argument("max_connections must be at least 1");
  if (o.part_size) c.part_size = *o.part_size;
  if (c.part_size < kMinPartSize || c.part_size > kMaxPartSize)
    return invalid_argument("part_size " + std::to_string(c.part_size) +
                            " is outside S3's limits of 5 MiB to 5 GiB");
  if (o.retry) {
    c.retry = *o.retry;
  } else {
    std::optional<std::string> attempts = env("AWS_MAX_ATTEMPTS");
    std::string source = "AWS_MAX_ATTEMPTS";
    if (!attempts) {
      attempts = from_profile("max_attempts");
      source = profile_source + " max_attempts";
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

  // ---- What objects are written as.
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
