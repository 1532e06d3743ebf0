#include "backends/s3/credentials.h"

#include <pthread.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "backends/s3/http_client.h"
#include "backends/s3/s3_xml.h"
#include "src/util/allocate.h"
#include "src/util/json_free.h"
#include "src/util/printable.h"
#include "src/util/log.h"

extern char** environ;

namespace ckptio::s3 {
namespace {

constexpr size_t kMaxCredentialBody = 64 << 10;  // a credentials document is < 4 KiB
constexpr size_t kMaxTokenFile = 64 << 10;         // a JWT is a few KiB

SystemTime from_unix_ns(int64_t ns) {
  return SystemTime(std::chrono::duration_cast<SystemTime::duration>(std::chrono::nanoseconds(ns)));
}

std::string utc_text(SystemTime t) {
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Server-supplied text for a message: bounded and printable.
std::string bounded(std::string_view s) { return printable(s, 200); }

// One HTTP exchange with a short-lived client: renewals are rare (hourly or
// less), so a loop thread per fetch costs nothing that matters.
HttpResponse http_perform(HttpRequest req, double timeout_s) {
  HttpClientOptions o;
  o.max_in_flight = 1;
  o.connect_timeout_s = timeout_s;
  o.stall_timeout_s = timeout_s;
  HttpClient client(o);
  req.max_body = kMaxCredentialBody;
  return client.perform(std::move(req));
}

// An exchange that did not complete, or answered other than 200, as a Status.
// The body is quoted (bounded) only for errors: it never holds credentials then.
Status http_failure(const HttpResponse& r, const std::string& what) {
  if (r.curl_code != 0) {
    if (r.body_too_large) return Status(Code::kDataLoss, what + ": response larger than " +
                                                             std::to_string(kMaxCredentialBody) + " bytes");
    return Status(Code::kUnavailable, what + ": " + r.curl_error);
  }
  const Code c = r.status == 401 || r.status == 403 ? Code::kPermissionDenied
                 : r.status == 404                  ? Code::kNotFound
                 : r.status == 429 || r.status >= 500 ? Code::kUnavailable
                                                      : Code::kIOError;
  return Status(c, what + ": HTTP " + std::to_string(r.status) +
                       (r.body.empty() ? "" : " (" + bounded(r.body) + ")"));
}

Result<std::string> read_token_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(Code::kNotFound, std::string(what) + " " + bounded(path) + " cannot be read");
  std::string text(kMaxTokenFile + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return io_error(std::string(what) + " " + bounded(path) + ": read failed");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxTokenFile)
    return invalid_argument(std::string(what) + " " + bounded(path) + " is larger than 64 KiB");
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (text.empty()) return invalid_argument(std::string(what) + " " + bounded(path) + " is empty");
  return text;
}

// An STS answer (either AssumeRole flavour) as credentials, or an error with
// STS's code and message.
Result<TimedCredentials> sts_result(const HttpResponse& r, const std::string& what) {
  if (r.curl_code != 0) return http_failure(r, what);
  Result<StsCredentials> sts = parse_sts_credentials(r.body);
  if (r.status != 200) {
    HttpResponse head;
    head.status = r.status;
    const Status h = http_failure(head, what);
    const Code c = !sts.ok() && sts.status().code() != Code::kIOError ? sts.status().code() : h.code();
    return Status(c, h.message() + (sts.ok() ? "" : ": " + sts.status().message()));
  }
  if (!sts.ok()) return sts.status().annotate(what);
  TimedCredentials out;
  out.creds = Credentials{std::move(sts->access_key_id), std::move(sts->secret_access_key),
                          std::move(sts->session_token)};
  out.expiration = from_unix_ns(sts->expiration_unix_ns);
  return out;
}

}  // namespace

namespace {

// The JSON documents of IMDS, the container endpoint and credential_process
// differ only in the session token's name and the process's "Version".
Result<TimedCredentials> parse_credentials_document(std::string_view body, const std::string& op,
                                                    const char* token_field, bool versioned) {
  if (body.size() > kMaxCredentialBody) return io_error(op + ": credentials document too large");
  nlohmann::json j;
  JsonFreer free_j(j);
  try {
    parse_json_into(j, body);
  } catch (const nlohmann::json::parse_error&) {
    j = nlohmann::json(nlohmann::json::value_t::discarded);
  }
  if (j.is_discarded() || !j.is_object()) return io_error(op + ": not a JSON object");
  auto field = [&](const char* name, bool required) -> Result<std::string> {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) {
      if (required) return io_error(op + ": missing \"" + name + "\"");
      return std::string();
    }
    if (!it->is_string()) return io_error(op + ": \"" + name + "\" is not a string");
    std::string v = it->get<std::string>();
    if (required && v.empty()) return io_error(op + ": empty \"" + name + "\"");
    if (has_control_byte(v)) return io_error(op + ": \"" + name + "\" contains a control character");
    return v;
  };
  if (versioned) {
    auto v = j.find("Version");
    if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != 1)
      return io_error(op + ": \"Version\" must be 1");
  } else {
    CKPTIO_ASSIGN_OR_RETURN(std::string code, field("Code", false));
    if (!code.empty() && code != "Success") {
      CKPTIO_ASSIGN_OR_RETURN(std::string message, field("Message", false));
      return Status(Code::kUnavailable, op + ": Code " + bounded(code) +
                                            (message.empty() ? "" : ": " + bounded(message)));
    }
  }
  TimedCredentials out;
  CKPTIO_ASSIGN_OR_RETURN(out.creds.access_key_id, field("AccessKeyId", true));
  CKPTIO_ASSIGN_OR_RETURN(out.creds.secret_access_key, field("SecretAccessKey", true));
  CKPTIO_ASSIGN_OR_RETURN(out.creds.session_token, field(token_field, false));
  CKPTIO_ASSIGN_OR_RETURN(std::string exp, field("Expiration", false));
  if (!exp.empty()) {
    const std::optional<int64_t> ns = parse_s3_timestamp(exp);
    if (!ns) return io_error(op + ": \"Expiration\" is '" + bounded(exp) + "', expected an ISO 8601 UTC time");
    out.expiration = from_unix_ns(*ns);
  }
  return out;
}

}  // namespace

Result<TimedCredentials> parse_credentials_json(std::string_view body, std::string_view what) {
  return parse_credentials_document(body, std::string(what), "Token", false);
}

Result<TimedCredentials> parse_process_credentials(std::string_view body, std::string_view what) {
  return parse_credentials_document(body, std::string(what), "SessionToken", true);
}

Result<std::vector<std::string>> split_command(std::string_view command) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else if (c == '\'') {
      const size_t end = command.find('\'', i + 1);
      if (end == std::string_view::npos) return invalid_argument("credential_process: unterminated single quote");
      cur.append(command.substr(i + 1, end - i - 1));
      i = end;
      in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < command.size() && command[j] != '"'; ++j) {
        if (command[j] == '\\' && j + 1 < command.size() && (command[j + 1] == '"' || command[j + 1] == '\\'))
          ++j;
        cur.push_back(command[j]);
      }
      if (j >= command.size()) return invalid_argument("credential_process: unterminated double quote");
      i = j;
      in_word = true;
    } else if (c == '\\') {
      if (i + 1 < command.size()) cur.push_back(command[++i]);
      in_word = true;
    } else {
      cur.push_back(c);
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(cur));
  if (out.empty()) return invalid_argument("credential_process is empty");
  return out;
}

// ---- CredentialProvider ----------------------------------------------------

namespace {
// kPermissionDenied when `c` expired already (botocore: "refreshed
// credentials are still expired").
Status refuse_expired(const TimedCredentials& c, SystemTime now) {
  if (!c.expiration || *c.expiration > now) return Status::OK();
  return Status(Code::kPermissionDenied, "the source returned credentials that expired at " + utc_text(*c.expiration));
}
}  // namespace

CredentialProvider::CredentialProvider(std::string source, FetchCredentials fetch, RefreshOptions options)
    : source_(std::move(source)), fetch_(std::move(fetch)), options_(options) {}

Result<std::shared_ptr<CredentialProvider>> CredentialProvider::start(std::string source,
                                                                      FetchCredentials fetch,
                                                                      RefreshOptions options) {
  std::shared_ptr<CredentialProvider> p(new CredentialProvider(std::move(source), std::move(fetch), options));
  Result<TimedCredentials> first = p->fetch_();
  if (!first.ok()) return first.status().annotate("credentials from " + p->source_);
  if (Status st = refuse_expired(*first, std::chrono::system_clock::now()); !st.ok())
    return st.annotate("credentials from " + p->source_);
  p->current_ = std::move(*first);
  p->fetches_ = 1;
  if (p->current_.expiration) p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  return p;
}

CredentialProvider::~CredentialProvider() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CredentialProvider::run() {
  pthread_setname_np(pthread_self(), "ckptio-creds");
  using std::chrono::duration;
  auto seconds = [](double s) {
    return std::chrono::duration_cast<SystemTime::duration>(duration<double>(s));
  };
  std::unique_lock lk(mu_);
  SystemTime fetched_at = std::chrono::system_clock::now();
  std::optional<SystemTime> retry_at;
  while (!stop_) {
    if (!current_.expiration) return;  // a renewal returned keys that never expire
    const SystemTime exp = *current_.expiration;
    SystemTime next;
    if (retry_at) {
      next = *retry_at;
    } else {
      const auto lifetime = exp - fetched_at;
      next = exp - std::min(seconds(options_.refresh_before_s), lifetime / 2);
      next = std::max(next, fetched_at + seconds(0.2));  // never spin on a set that is already stale
    }
    if (cv_.wait_until(lk, next, [&] { return stop_; })) return;
    if (std::chrono::system_clock::now() < next) continue;
    lk.unlock();
    // Nothing leaves this thread: what a renewal throws (std::bad_alloc)
    // is a failed renewal, retried as any other.
    Result<TimedCredentials> r = returning_exceptions("renew the credentials", [&] { return fetch_(); });
    lk.lock();
    const SystemTime now = std::chrono::system_clock::now();
    // A renewal that returns a set already expired failed (a helper that
    // prints a stale cache): else it was taken and fetched again every
    // 0.2 s for good, every request refused meanwhile.
    if (r.ok()) {
      Status expired = status_or_out_of_memory([&] { return refuse_expired(*r, now); });
      if (!expired.ok()) r = std::move(expired);
    }
    if (r.ok()) {
      current_ = std::move(*r);
      ++fetches_;
      last_error_.clear();
      retry_at.reset();
      fetched_at = now;
      logging::quietly([&] {
        logging::debug("ckptio: S3 credentials from {} renewed; they expire at {}", source_,
                       current_.expiration ? utc_text(*current_.expiration) : std::string("never"));
      });
    } else {
      ++failed_;
      try {
        last_error_ = r.status().to_string();
      } catch (...) {
        last_error_ = "out of memory";  // (fits the string's own room: allocates nothing)
      }
      // Sooner while the old set still works, every retry_after_s once it has expired.
      const double left = duration<double>(exp - now).count();
      const double wait = left > 0 ? std::max(0.2, std::min(options_.retry_after_s, left / 4)) : options_.retry_after_s;
      retry_at = now + seconds(wait);
      logging::quietly([&] {
        logging::warn("ckptio: renewing S3 credentials from {} failed ({}); the current set expires at {}; "
                      "next try in {:.1f} s",
                      source_, last_error_, utc_text(exp), wait);
      });
    }
  }
}

Credentials CredentialProvider::current() const {
  std::lock_guard lk(mu_);
  return current_.creds;
}

std::string CredentialProvider::stale_reason() const {
  std::lock_guard lk(mu_);
  if (!current_.expiration || std::chrono::system_clock::now() < *current_.expiration) return {};
  std::string s = "credentials from " + source_ + " expired at " + utc_text(*current_.expiration);
  if (!last_error_.empty()) s += "; the last renewal failed: " + last_error_;
  return s;
}

std::optional<SystemTime> CredentialProvider::expiration() const {
  std::lock_guard lk(mu_);
  return current_.expiration;
}

uint64_t CredentialProvider::fetches() const {
  std::lock_guard lk(mu_);
  return fetches_;
}

uint64_t CredentialProvider::failed_fetches() const {
  std::lock_guard lk(mu_);
  return failed_;
}

// ---- Fetchers ----------------------------------------------------------------

FetchCredentials instance_metadata_fetcher(std::string endpoint, double timeout_s) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return [endpoint, timeout_s]() -> Result<TimedCredentials> {
    // IMDSv2: a session token first. 403/404/405 mean the endpoint does not
    // serve tokens (IMDSv1 only), as botocore reads them; anything else that
    // fails is an error, never a silent downgrade.
    HttpRequest tok;
    tok.method = "PUT";
    tok.url = endpoint + "/latest/api/token";
    tok.headers = {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}};
    HttpResponse t = http_perform(tok, timeout_s);
    std::vector<std::pair<std::string, std::string>> auth;
    if (t.curl_code == 0 && t.status == 200 && !t.body.empty()) {
      if (has_control_byte(t.body))  // it goes into a header: no line breaks, no control bytes
        return io_error("instance metadata: the session token contains a control character");
      auth = {{"X-aws-ec2-metadata-token", t.body}};
    } else if (!(t.curl_code == 0 && (t.status == 403 || t.status == 404 || t.status == 405))) {
      return http_failure(t, "instance metadata token (PUT " + tok.url + ")");
    }
    HttpRequest roles;
    roles.method = "GET";
    roles.url = endpoint + "/latest/meta-data/iam/security-credentials/";
    roles.headers = auth;
    HttpResponse r = http_perform(roles, timeout_s);
    if (r.curl_code != 0 || r.status != 200) {
      if (r.curl_code == 0 && r.status == 404)
        return Status(Code::kNotFound, "instance metadata: no IAM role is attached to this instance");
      return http_failure(r, "instance metadata (GET " + roles.url + ")");
    }
    std::string role = r.body.substr(0, r.body.find('\n'));
    while (!role.empty() && (role.back() == '\r' || role.back() == ' ')) role.pop_back();
    if (role.empty() || role.find_first_of("/?#% ") != std::string::npos)
      return io_error("instance metadata: unexpected role name '" + bounded(role) + "'");
    HttpRequest get;
    get.method = "GET";
    get.url = roles.url + role;
    get.headers = auth;
    HttpResponse c = http_perform(get, timeout_s);
    if (c.curl_code != 0 || c.status != 200) return http_failure(c, "instance metadata role " + role);
    return parse_credentials_json(c.body, "instance metadata role " + role);
  };
}

FetchCredentials container_fetcher(std::string url, std::string token, std::string token_file,
                                   double timeout_s) {
  return [url, token, token_file, timeout_s]() -> Result<TimedCredentials> {
    HttpRequest req;
    req.method = "GET";
    req.url = url;
    std::string auth = token;
    if (!token_file.empty()) {
      CKPTIO_ASSIGN_OR_RETURN(auth, read_token_file(token_file, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"));
    }
    for (char c : auth)
      if (c == '\r' || c == '\n')
        return invalid_argument("the container authorization token contains a line break");
    if (!auth.empty()) req.headers = {{"Authorization", auth}};
    HttpResponse r = http_perform(req, timeout_s);
    if (r.curl_code != 0 || r.status != 200) return http_failure(r, "container credentials (GET " + url + ")");
    return parse_credentials_json(r.body, "container credentials");
  };
}

FetchCredentials web_identity_fetcher(std::string sts_endpoint, std::string role_arn,
                                      std::string session_name, std::string token_file,
                                      double timeout_s) {
  while (!sts_endpoint.empty() && sts_endpoint.back() == '/') sts_endpoint.pop_back();
  return [=]() -> Result<TimedCredentials> {
    CKPTIO_ASSIGN_OR_RETURN(std::string token, read_token_file(token_file, "AWS_WEB_IDENTITY_TOKEN_FILE"));
    // A form body is a query string: SigV4's canonical form (RFC 3986, sorted) serves.
    const std::string body = canonical_query({{"Action", "AssumeRoleWithWebIdentity"},
                                   {"Version", "2011-06-15"},
                                   {"RoleArn", role_arn},
                                   {"RoleSessionName", session_name},
                                   {"WebIdentityToken", token}});
    HttpRequest req;
    req.method = "POST";
    req.url = sts_endpoint + "/";
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}};
    req.body = std::as_bytes(std::span(body.data(), body.size()));
    HttpResponse r = http_perform(req, timeout_s);
    return sts_result(r, "STS AssumeRoleWithWebIdentity at " + sts_endpoint + " for " + bounded(role_arn));
  };
}

FetchCredentials assume_role_fetcher(std::string sts_endpoint, std::string region, std::string role_arn,
                                     std::string session_name, std::string external_id, int duration_s,
                                     std::function<Credentials()> source, double timeout_s) {
  while (!sts_endpoint.empty() && sts_endpoint.back() == '/') sts_endpoint.pop_back();
  return [=]() -> Result<TimedCredentials> {
    KeyValues params = {{"Action", "AssumeRole"},
                        {"Version", "2011-06-15"},
                        {"RoleArn", role_arn},
                        {"RoleSessionName", session_name}};
    if (!external_id.empty()) params.emplace_back("ExternalId", external_id);
    if (duration_s > 0) params.emplace_back("DurationSeconds", std::to_string(duration_s));
    const std::string body = canonical_query(params);
    const size_t sep = sts_endpoint.find("://");
    SignableRequest sr;
    sr.method = "POST";
    sr.host = sep == std::string::npos ? sts_endpoint : sts_endpoint.substr(sep + 3);
    sr.path = "/";
    sr.headers = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"}};
    sr.payload_hash = sha256_hex(std::string_view(body));
    HttpRequest req;
    req.method = "POST";
    req.url = sts_endpoint + "/";
    req.headers = sr.headers;
    for (auto& h : sign(sr, source(), region, "sts", amz_date_now())) req.headers.push_back(std::move(h));
    req.body = std::as_bytes(std::span(body.data(), body.size()));
    HttpResponse r = http_perform(req, timeout_s);
    return sts_result(r, "STS AssumeRole at " + sts_endpoint + " for " + bounded(role_arn));
  };
}

FetchCredentials process_fetcher(std::vector<std::string> argv, double timeout_s) {
  return [argv, timeout_s]() -> Result<TimedCredentials> {
    const std::string what = "credential_process " + bounded(argv.front());
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return Status::from_errno(errno, what + ": pipe");
    if (::pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      ::close(out[0]);
      ::close(out[1]);
      return Status::from_errno(e, what + ": pipe");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(err[1]);
    if (rc != 0) {
      ::close(out[0]);
      ::close(err[0]);
      return Status::from_errno(rc, what + ": cannot run it");
    }
    // Both pipes drained together (a chatty stderr must not block stdout),
    // each bounded; the helper is killed past the deadline.
    std::string text[2];
    struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    bool timed_out = false;
    int open = 2;
    while (open > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (n < 0 && errno != EINTR) break;
      for (int k = 0; k < 2; ++k) {
        if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[4096];
        const ssize_t got = ::read(fds[k].fd, buf, sizeof buf);
        if (got > 0) {
          if (text[k].size() < kMaxCredentialBody + 1) text[k].append(buf, static_cast<size_t>(got));
        } else if (got == 0 || errno != EINTR) {
          ::close(fds[k].fd);
          fds[k].fd = -1;
          --open;
        }
      }
    }
    for (auto& f : fds)
      if (f.fd >= 0) ::close(f.fd);
    if (timed_out) ::kill(pid, SIGKILL);
    int wstatus = 0;
    while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (timed_out)
      return Status(Code::kUnavailable, what + ": no answer within " + std::to_string(static_cast<int>(timeout_s)) + " s");
    std::string err_text = text[1].substr(0, 300);
    while (!err_text.empty() && (err_text.back() == '\n' || err_text.back() == '\r')) err_text.pop_back();
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
      const std::string how = WIFEXITED(wstatus) ? "exit status " + std::to_string(WEXITSTATUS(wstatus))
                                                 : "signal " + std::to_string(WTERMSIG(wstatus));
      return Status(Code::kPermissionDenied,
                    what + " failed (" + how + ")" + (err_text.empty() ? "" : ": " + bounded(err_text)));
    }
    return parse_process_credentials(text[0], what);
  };
}

}  // namespace ckptio::s3
