// Temporary credentials (backends/s3/credentials.h): the parsers, renewal
// ahead of expiry, and the sources end to end against moto with request
// authentication on: IMDS, container and web identity through
// tests/s3/credentials-server, which hands out keys that are deleted on moto
// the moment they expire, and a credential_process shell script.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backends/s3/credentials.h"
#include "backends/s3/http_client.h"
#include "backends/s3/s3_config.h"
#include "backends/s3/s3_storage.h"
#include "backends/s3/s3_xml.h"
#include "testutil/s3_server.h"

extern char** environ;

namespace ckptio::s3 {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ---- parsers ------------------------------------------------------------------

TEST(CredentialsJson, ImdsDocument) {
  const auto r = parse_credentials_json(
      R"({"Code":"Success","LastUpdated":"2026-11-25T10:00:00Z","Type":"AWS-HMAC",
          "AccessKeyId":"ASIAEXAMPLE","SecretAccessKey":"sek/ret+1","Token":"tok==",
          "Expiration":"2026-11-25T16:00:00Z"})",
      "imds");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->creds.access_key_id, "ASIAEXAMPLE");
  EXPECT_EQ(r->creds.secret_access_key, "sek/ret+1");
  EXPECT_EQ(r->creds.session_token, "tok==");
  ASSERT_TRUE(r->expiration.has_value());
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::seconds>(r->expiration->time_since_epoch()).count(),
            1795622400);  // date -d 2026-11-25T16:00:00Z +%s
}

TEST(CredentialsJson, ContainerDocumentWithoutTokenOrExpiration) {
  const auto r = parse_credentials_json(R"({"AccessKeyId":"AKIA1","SecretAccessKey":"s"})", "container");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->creds.session_token, "");
  EXPECT_FALSE(r->expiration.has_value());
}

TEST(CredentialsJson, RejectsWhatIsNotACredentialSet) {
  for (const char* body :
       {"", "[]", "not json", R"({"SecretAccessKey":"s"})", R"({"AccessKeyId":"a"})",
        R"({"AccessKeyId":"","SecretAccessKey":"s"})", R"({"AccessKeyId":1,"SecretAccessKey":"s"})",
        R"({"AccessKeyId":"a","SecretAccessKey":"s","Expiration":"tomorrow"})",
        R"({"AccessKeyId":"a","SecretAccessKey":"s\nx"})",
        R"({"Code":"AssumeRoleUnauthorizedAccess","AccessKeyId":"a","SecretAccessKey":"s"})"}) {
    const auto r = parse_credentials_json(body, "imds");
    EXPECT_FALSE(r.ok()) << body;
    if (!r.ok()) EXPECT_EQ(r.status().message().find("imds"), 0u) << r.status().to_string();
  }
  // A failure never quotes the secret.
  const auto r = parse_credentials_json(R"({"AccessKeyId":"a","SecretAccessKey":"TOPSECRET","Expiration":"x"})", "i");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string().find("TOPSECRET"), std::string::npos);
}

TEST(StsXml, WebIdentityResponse) {
  const auto r = parse_sts_credentials(
      R"(<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ns:sa</SubjectFromWebIdentityToken>
    <Credentials>
      <SessionToken>FwoGZX</SessionToken><SecretAccessKey>wJalr</SecretAccessKey>
      <Expiration>2026-11-25T11:00:00Z</Expiration><AccessKeyId>ASIAXYZ</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>)");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->access_key_id, "ASIAXYZ");
  EXPECT_EQ(r->secret_access_key, "wJalr");
  EXPECT_EQ(r->session_token, "FwoGZX");
  EXPECT_EQ(r->expiration_unix_ns, int64_t{1795604400} * 1000000000);
}

TEST(StsXml, ErrorsKeepStsCodeAndMessage) {
  const auto r = parse_sts_credentials(
      "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>"
      "<Message>No OpenIDConnect provider found</Message></Error></ErrorResponse>");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kPermissionDenied);
  EXPECT_NE(r.status().message().find("InvalidIdentityToken: No OpenIDConnect provider found"),
            std::string::npos)
      << r.status().to_string();
  const auto t = parse_sts_credentials("<ErrorResponse><Error><Code>Throttling</Code></Error></ErrorResponse>");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kUnavailable);
  for (const char* bad :
       {"", "<x/>", "<AssumeRoleWithWebIdentityResponse/>",
        "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
        "<AccessKeyId>a</AccessKeyId><SecretAccessKey>s</SecretAccessKey><SessionToken>t</SessionToken>"
        "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
        "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
        "<AccessKeyId>a</AccessKeyId><SecretAccessKey>s</SecretAccessKey><SessionToken>t</SessionToken>"
        "<Expiration>soon</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
        "</AssumeRoleWithWebIdentityResponse>"})
    EXPECT_FALSE(parse_sts_credentials(bad).ok()) << bad;
}

// Found by credentials_fuzz: a field with a control byte went through to the
// signed headers. Raw or as a character reference, each field by name, and
// the message never quotes the secret.
TEST(StsXml, ControlBytesInAFieldAreRefusedByName) {
  auto doc = [](const std::string& id, const std::string& secret, const std::string& token) {
    return "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>" + id +
           "</AccessKeyId><SecretAccessKey>" + secret + "</SecretAccessKey><SessionToken>" + token +
           "</SessionToken><Expiration>2026-11-25T11:00:00Z</Expiration></Credentials></AssumeRoleResult>"
           "</AssumeRoleResponse>";
  };
  ASSERT_TRUE(parse_sts_credentials(doc("a", "s", "t")).ok());
  const struct {
    std::string xml, field;
  } cases[] = {{doc("a\tb", "s", "t"), "AccessKeyId"},
               {doc("a", "TOP&#10;SECRET", "t"), "SecretAccessKey"},
               {doc("a", "TOP&#x1;SECRET", "t"), "SecretAccessKey"},
               {doc("a", "s", "t\r\nX-Injected: 1"), "SessionToken"},
               {doc("a", "s", "t&#127;"), "SessionToken"}};
  for (const auto& c : cases) {
    const auto r = parse_sts_credentials(c.xml);
    ASSERT_FALSE(r.ok()) << c.xml;
    EXPECT_NE(r.status().message().find("<" + c.field + "> contains a control character"), std::string::npos)
        << r.status().to_string();
    EXPECT_EQ(r.status().message().find("SECRET"), std::string::npos) << r.status().to_string();
  }
}

TEST(ProcessCredentials, VersionOneDocuments) {
  const auto r = parse_process_credentials(
      R"({"Version":1,"AccessKeyId":"ASIA1","SecretAccessKey":"s","SessionToken":"t","Expiration":"2026-11-25T16:00:00Z"})",
      "proc");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->creds.session_token, "t");
  EXPECT_TRUE(r->expiration.has_value());
  for (const char* bad : {R"({"AccessKeyId":"a","SecretAccessKey":"s"})",
                          R"({"Version":2,"AccessKeyId":"a","SecretAccessKey":"s"})",
                          R"({"Version":"1","AccessKeyId":"a","SecretAccessKey":"s"})"})
    EXPECT_FALSE(parse_process_credentials(bad, "proc").ok()) << bad;
}

TEST(ProcessCredentials, CommandsSplitAsBotocoreSplitsThem) {
  using V = std::vector<std::string>;
  struct Case { const char* in; V out; };
  for (const Case& c : {Case{"aws-vault export  --format=json prod", V{"aws-vault", "export", "--format=json", "prod"}},
                        Case{R"("/opt/my tool" 'x y' a\ b "q\"r" "\$HOME" '')",
                             V{"/opt/my tool", "x y", "a b", "q\"r", "\\$HOME", ""}},
                        Case{"a'b c'd", V{"ab cd"}}}) {
    const auto r = split_command(c.in);
    ASSERT_TRUE(r.ok()) << c.in << ": " << r.status().to_string();
    EXPECT_EQ(*r, c.out) << c.in;
  }
  for (const char* bad : {"", "   ", "'open", "\"open", "a \"b\\\""}) EXPECT_FALSE(split_command(bad).ok()) << bad;
}

// ---- renewal --------------------------------------------------------------------

// Waits until `done()` holds, up to `limit`: what the renewal thread does is
// waited for by its effect, not by a guess at how long it takes on a loaded
// machine. True when it held.
template <typename F>
bool eventually(F done, std::chrono::milliseconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TimedCredentials expiring_in(std::chrono::milliseconds ms, const std::string& id) {
  return TimedCredentials{Credentials{id, "secret-" + id, "token-" + id}, std::chrono::system_clock::now() + ms};
}

TEST(CredentialProvider, RenewsAheadOfExpiry) {
  std::atomic<int> n{0};
  auto p = CredentialProvider::start("fake", [&]() -> Result<TimedCredentials> {
    return expiring_in(2000ms, "key" + std::to_string(n++));
  });
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->current().access_key_id, "key0");
  // Renewed halfway through each 2 s lifetime, so a set in use never expires.
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < end) {
    const auto exp = (*p)->expiration();
    ASSERT_TRUE(exp.has_value());
    ASSERT_GT(*exp, std::chrono::system_clock::now()) << "the current set expired before it was renewed";
    EXPECT_EQ((*p)->stale_reason(), "");
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE((*p)->fetches(), 4u);
  EXPECT_NE((*p)->current().access_key_id, "key0");
  EXPECT_EQ((*p)->current().session_token, "token-" + (*p)->current().access_key_id);
}

TEST(CredentialProvider, FirstFailureIsReturnedAndLaterOnesAreRetriedAndReported) {
  auto none = CredentialProvider::start("fake", []() -> Result<TimedCredentials> {
    return Status(Code::kPermissionDenied, "nope");
  });
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kPermissionDenied);
  EXPECT_NE(none.status().message().find("credentials from fake"), std::string::npos);

  std::atomic<int> n{0};
  RefreshOptions o;
  o.retry_after_s = 0.05;
  auto p = CredentialProvider::start("fake", [&]() -> Result<TimedCredentials> {
    if (n++ == 0) return expiring_in(400ms, "only");
    return Status(Code::kUnavailable, "metadata service down");
  }, o);
  ASSERT_TRUE(p.ok());
  // The set expires at 400 ms; renewals fail from its halfway point on.
  EXPECT_TRUE(eventually([&] {
    return (*p)->failed_fetches() >= 2 && (*p)->stale_reason().find("expired at") != std::string::npos;
  })) << (*p)->failed_fetches() << " failed fetches; stale reason: " << (*p)->stale_reason();
  EXPECT_EQ((*p)->current().access_key_id, "only");  // the last good set is kept
  EXPECT_GE((*p)->failed_fetches(), 2u);
  const std::string why = (*p)->stale_reason();
  EXPECT_NE(why.find("credentials from fake expired at"), std::string::npos) << why;
  EXPECT_NE(why.find("metadata service down"), std::string::npos) << why;
}

// A source that returns a set already expired (a helper printing a stale
// cache) fails: at start, as any failing source does, and on renewal as a
// failed renewal, retried after retry_after_s. Before, the set was taken,
// and fetched again every 0.2 s for as long as the job ran.
TEST(CredentialProvider, AnExpiredSetIsAFailedFetch) {
  auto stale = CredentialProvider::start("fake", []() -> Result<TimedCredentials> {
    return expiring_in(-10s, "stale");
  });
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), Code::kPermissionDenied) << stale.status().to_string();
  EXPECT_NE(stale.status().message().find("expired at"), std::string::npos) << stale.status().to_string();

  std::atomic<int> n{0};
  RefreshOptions o;
  o.retry_after_s = 1;
  auto p = CredentialProvider::start("fake", [&]() -> Result<TimedCredentials> {
    return n++ == 0 ? expiring_in(300ms, "fresh") : expiring_in(-10s, "stale");
  }, o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::this_thread::sleep_for(1500ms);
  EXPECT_GE((*p)->failed_fetches(), 2u);
  EXPECT_LE(n.load(), 5) << "renewed every 0.2 s";  // (at 150 and 350 ms, then every second)
  EXPECT_EQ((*p)->current().access_key_id, "fresh");
}

TEST(CredentialProvider, KeysWithoutExpirationAreFetchedOnce) {
  std::atomic<int> n{0};
  auto p = CredentialProvider::start("fake", [&]() -> Result<TimedCredentials> {
    ++n;
    return TimedCredentials{Credentials{"a", "s", ""}, std::nullopt};
  });
  ASSERT_TRUE(p.ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(n.load(), 1);
  EXPECT_EQ((*p)->stale_reason(), "");
}

// ---- resolution (no network needed) ------------------------------------------------

using Env = std::map<std::string, std::string>;
GetEnv getenv_of(const Env& env) {
  return [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TEST(CredentialChain, NetworkSourcesAreIgnoredWithoutNetwork) {
  const Env env{{"AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent"},
                {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"},
                {"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:1/x"}};
  const auto c = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/false);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->anonymous);
  EXPECT_EQ(c->credential_provider, nullptr);
}

TEST(CredentialChain, StaticKeysComeFirst) {
  const Env env{{"AWS_ACCESS_KEY_ID", "AKIASTATIC"}, {"AWS_SECRET_ACCESS_KEY", "s"},
                {"AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent"}, {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"}};
  const auto c = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials_source, "environment");
  EXPECT_EQ(c->credential_provider, nullptr);
}

TEST(CredentialChain, ConfigurationErrorsNameTheSetting) {
  struct Case { Env env; const char* expect; };
  for (const Case& k : {
           Case{{{"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"}}, "needs both the token file and the role ARN"},
           Case{{{"AWS_WEB_IDENTITY_TOKEN_FILE", "/nonexistent/token"}, {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"},
                 {"AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9"}},
                "AWS_WEB_IDENTITY_TOKEN_FILE /nonexistent/token cannot be read"},
           Case{{{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://10.1.2.3/creds"}},
                "must be https, or http to loopback"},
           Case{{{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "creds"}}, "must be a path starting with '/'"},
           Case{{{"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9"},
                 {"AWS_METADATA_SERVICE_TIMEOUT", "soon"}},
                "AWS_METADATA_SERVICE_TIMEOUT"},
       }) {
    const auto c = resolve_s3_config({}, getenv_of(k.env), nullptr, /*use_network=*/true);
    ASSERT_FALSE(c.ok()) << k.expect;
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos) << c.status().to_string();
  }
}

TEST(CredentialChain, AssumeRoleConfigurationErrorsNameTheProfile) {
  struct Case { const char* config; const char* expect; };
  for (const Case& k : {
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\n", "needs exactly one of source_profile and credential_source"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = b\ncredential_source = Environment\n",
                "needs exactly one of"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = nope\n", "source_profile 'nope' not found"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = b\n[profile b]\nrole_arn = x\nsource_profile = c\n",
                "chained roles are not supported"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = b\n[profile b]\nregion = eu-west-1\n",
                "has no aws_access_key_id and aws_secret_access_key"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\ncredential_source = Ec2InstanceMetadata\n",
                "credential_source 'Ec2InstanceMetadata' is not supported"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\ncredential_source = Environment\n",
                "credential_source Environment needs AWS_ACCESS_KEY_ID"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = p\nmfa_serial = arn:aws:iam::1:mfa/u\n"
                "aws_access_key_id = a\naws_secret_access_key = s\n",
                "mfa_serial is not supported"},
           Case{"[profile p]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = p\nduration_seconds = 60\n"
                "aws_access_key_id = a\naws_secret_access_key = s\n",
                "duration_seconds must be 900 to 43200"},
       }) {
    const std::string config = k.config;
    const ReadFile files = [config](const std::string& path) -> std::optional<std::string> {
      if (path == "/cfg") return config;
      return std::nullopt;
    };
    const Env env{{"AWS_CONFIG_FILE", "/cfg"}, {"AWS_SHARED_CREDENTIALS_FILE", "/creds"}};
    S3ConfigOverrides o;
    o.profile = "p";
    const auto c = resolve_s3_config(o, getenv_of(env), files, /*use_network=*/true);
    ASSERT_FALSE(c.ok()) << k.expect;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find("profile p"), std::string::npos) << c.status().to_string();
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos) << c.status().to_string();
  }
}

TEST(CredentialChain, AnAbsentMetadataServiceMeansAnonymous) {
  // Port 9 (discard) on loopback: connection refused at once.
  const Env env{{"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9"}};
  const auto c = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->anonymous);
}

// ---- end to end: tests/s3/credentials-server in front of moto_sigv4 -------------------

// The fake credential source, running for the life of the object.
class CredentialServer {
 public:
  CredentialServer(const testutil::S3TestServer& srv, double lifetime_s) {
    dir_ = fs::temp_directory_path() / ("ckptio-creds-" + std::to_string(getpid()) + "-" +
                                        std::to_string(counter_++));
    fs::create_directories(dir_);
    const std::string script = std::string(CKPTIO_SOURCE_DIR) + "/tests/s3/credentials-server";
    const std::string port_file = (dir_ / "port").string();
    const std::string log = (dir_ / "log").string();
    std::vector<std::string> args{"python3", script, "--upstream", srv.env_path, "--port-file", port_file,
                                  "--lifetime", std::to_string(lifetime_s)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawnp(&pid_, "python3", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return;
    }
    for (int i = 0; i < 300 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(100ms);
    std::ifstream in(port_file);
    int port = 0;
    in >> port;
    if (port > 0) url_ = "http://127.0.0.1:" + std::to_string(port);
  }
  ~CredentialServer() {
    stop();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Every credential request fails from now on; keys already out still expire.
  void fail_from_now() {
    HttpClient http(HttpClientOptions{});
    HttpRequest req;
    req.method = "POST";
    req.url = url_ + "/__fail";
    http.perform(req);
  }
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  const std::string& url() const { return url_; }
  std::string log() const {
    std::ifstream in(dir_ / "log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  nlohmann::json stats() const {
    HttpClient http(HttpClientOptions{});
    HttpRequest req;
    req.method = "GET";
    req.url = url_ + "/__stats";
    HttpResponse r = http.perform(req);
    return nlohmann::json::parse(r.body, nullptr, false);
  }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
  pid_t pid_ = -1;
  std::string url_;
};

// A file of this process under the temporary directory, holding `text`.
fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  std::ofstream(p) << text;
  return p;
}

// The test server's endpoint and region, plus `extra`: no static keys.
Env server_env(const testutil::S3TestServer& srv, Env extra) {
  extra["AWS_ENDPOINT_URL"] = srv.endpoint;
  extra["AWS_REGION"] = srv.region;
  return extra;
}

Result<std::shared_ptr<S3Storage>> open_store(const testutil::S3TestServer& srv, const S3Config& c) {
  std::string prefix = testutil::s3_test_prefix();
  prefix.pop_back();
  return make_s3_storage("s3://" + srv.bucket + "/" + prefix, c);
}

std::vector<std::byte> bytes_of(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<unsigned char>(i * 131 + seed));
  return v;
}

void expect_put_get(Storage& store, const std::string& key, int seed) {
  const auto data = bytes_of(256 << 10, seed);
  ASSERT_TRUE(store.put(key, data).ok()) << store.put(key, data).to_string();
  auto got = store.get(key, 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), data.size());
  EXPECT_EQ(std::memcmp(got->data(), data.data(), data.size()), 0);
}

TEST(S3MotoSigV4Credentials, InstanceMetadataKeysAreRenewedBeforeMotoDeletesThem) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_TRUE(srv.checks_sigv4) << "needs request authentication to prove anything";
  CredentialServer fake(srv, 4);  // each key lives 4 s, then is deleted on moto
  ASSERT_FALSE(fake.url().empty()) << fake.log();
  const auto c = resolve_s3_config({}, getenv_of(server_env(srv, {{"AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url()}})),
                                   nullptr, /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->anonymous);
  EXPECT_EQ(c->credentials_source, "instance metadata " + fake.url());
  ASSERT_NE(c->credential_provider, nullptr);
  EXPECT_NE(c->describe_redacted().find("renewed=yes"), std::string::npos);
  auto store = open_store(srv, *c);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  // 11 s of traffic: keys minted at about 0, 2, 4, 6, 8, 10 s; each one dies at 4 s of age.
  const auto end = std::chrono::steady_clock::now() + 11s;
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    expect_put_get(**store, "obj" + std::to_string(i % 4), i);
    if (HasFatalFailure()) break;
    std::this_thread::sleep_for(100ms);
  }
  const auto st = fake.stats();
  EXPECT_GE(st.value("imds", 0), 4) << st.dump();
  EXPECT_GE(st.value("deleted", 0), 2) << st.dump();  // old keys really are gone on moto
  EXPECT_EQ(st.value("refused", 0), 0) << st.dump();  // IMDSv2: every call had its token
  EXPECT_GE(c->credential_provider->fetches(), 4u);

  // The source fails: once the last key has expired (and been deleted on
  // moto), requests fail, and the error says why.
  fake.fail_from_now();
  // Requests go on succeeding until the last key dies (4 s after it was
  // minted); then they fail, and say why.
  const auto data = bytes_of(1024, 7);
  Status s;
  EXPECT_TRUE(eventually([&] {
    s = (*store)->put("after", data);
    return !s.ok();
  }, 120s)) << "requests still succeed long after the last key expired";
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expired at"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("the last renewal failed"), std::string::npos) << s.to_string();
}

TEST(S3MotoSigV4Credentials, ContainerCredentialsNeedTheAuthorizationToken) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_TRUE(srv.checks_sigv4);
  CredentialServer fake(srv, 3600);
  ASSERT_FALSE(fake.url().empty()) << fake.log();
  const fs::path token_file = write_temp("ckptio-ecs-token", "ckptio-container-token\n");
  Env env = server_env(srv, {{"AWS_CONTAINER_CREDENTIALS_FULL_URI", fake.url() + "/ecs/credentials"},
                             {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.string()}});
  const auto c = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials_source, "container " + fake.url() + "/ecs/credentials");
  auto store = open_store(srv, *c);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  expect_put_get(**store, "obj", 1);
  EXPECT_EQ(fake.stats().value("container", 0), 1);

  // The token from the variable when there is no file; a wrong one is refused.
  env.erase("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  env["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "wrong-token-XYZZY";
  const auto bad = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("HTTP 401"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(bad.status().message().find("XYZZY"), std::string::npos) << bad.status().to_string();
  fs::remove(token_file);
}

TEST(S3MotoSigV4Credentials, WebIdentitySessionsSignRequestsWithTheirToken) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_TRUE(srv.checks_sigv4);
  CredentialServer fake(srv, 3600);
  ASSERT_FALSE(fake.url().empty()) << fake.log();
  const fs::path token_file = write_temp("ckptio-wi-token", "ckptio-web-identity-token");
  Env env = server_env(srv, {{"AWS_WEB_IDENTITY_TOKEN_FILE", token_file.string()},
                             {"AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/ckptio-test-role"},
                             {"AWS_ROLE_SESSION_NAME", "trainer-7"},
                             {"AWS_ENDPOINT_URL_STS", fake.url()}});
  const auto c = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials_source, "web identity arn:aws:iam::123456789012:role/ckptio-test-role");
  EXPECT_FALSE(c->creds.session_token.empty());
  auto store = open_store(srv, *c);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  expect_put_get(**store, "obj", 2);  // moto checks X-Amz-Security-Token against the session
  const auto st = fake.stats();
  EXPECT_EQ(st.value("sts", 0), 1) << st.dump();
  EXPECT_EQ(st["sessions"], nlohmann::json::array({"trainer-7"})) << st.dump();

  // A session signed without its token is refused by moto: the token matters.
  S3Config no_token = *c;
  no_token.credential_provider.reset();
  no_token.creds.session_token.clear();
  no_token.retry.max_attempts = 1;
  auto store2 = open_store(srv, no_token);
  ASSERT_TRUE(store2.ok());
  const auto data = bytes_of(1024, 3);
  EXPECT_FALSE((*store2)->put("x", data).ok());

  // A token STS rejects: STS's code, as a permission error.
  write_temp("ckptio-wi-token", "some-other-token");
  const auto bad = resolve_s3_config({}, getenv_of(env), nullptr, /*use_network=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("InvalidIdentityToken"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(bad.status().message().find("some-other-token"), std::string::npos);
  fs::remove(token_file);
}


// A shell script as a credential_process helper: prints `keys` with an
// Expiration `lifetime_s` ahead, and logs each run's arguments to `log`.
std::string write_helper(const fs::path& dir, const testutil::S3TestServer& srv, int lifetime_s, int exit_code) {
  const fs::path script = dir / "cred helper.sh";  // a space: the command must be quoted
  std::ofstream out(script);
  out << "#!/bin/sh\n"
      << "echo \"$#:$2\" >> '" << (dir / "runs").string() << "'\n";
  if (exit_code != 0) {
    out << "echo 'the SSO session has expired; run aws sso login' >&2\nexit " << exit_code << "\n";
  } else {
    out << "exp=$(date -u -d \"@$(( $(date +%s) + " << lifetime_s << " ))\" +%Y-%m-%dT%H:%M:%SZ)\n"
        << "printf '{\"Version\": 1, \"AccessKeyId\": \"%s\", \"SecretAccessKey\": \"%s\", "
           "\"Expiration\": \"%s\"}\\n' '"
        << srv.access_key << "' '" << srv.secret_key << "' \"$exp\"\n";
  }
  out.close();
  fs::permissions(script, fs::perms::owner_all);
  return script.string();
}

ReadFile real_files() {
  return [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
}

TEST(S3MotoSigV4Credentials, CredentialProcessRunsWithoutAShellAndIsRenewed) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_TRUE(srv.checks_sigv4);
  const fs::path dir = fs::temp_directory_path() / ("ckptio-proc-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string script = write_helper(dir, srv, 3, 0);
  {
    std::ofstream(dir / "config") << "[profile proc]\ncredential_process = \"" << script
                                  << "\" --profile 'two words'\n";
  }
  Env env = server_env(srv, {{"AWS_CONFIG_FILE", (dir / "config").string()},
                             {"AWS_SHARED_CREDENTIALS_FILE", (dir / "none").string()},
                             {"AWS_PROFILE", "proc"}});
  const auto c = resolve_s3_config({}, getenv_of(env), real_files(), /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials_source, "profile proc credential_process");
  auto store = open_store(srv, *c);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  expect_put_get(**store, "obj", 4);  // moto checks the helper's key
  // 3 s sets: renewed halfway through, by the helper run a second time.
  EXPECT_TRUE(eventually([&] { return c->credential_provider->fetches() >= 2; }))
      << c->credential_provider->fetches() << " fetches";
  EXPECT_GE(c->credential_provider->fetches(), 2u);
  std::ifstream runs(dir / "runs");
  std::string line;
  int n = 0;
  while (std::getline(runs, line)) {
    EXPECT_EQ(line, "2:two words");  // the arguments, unsplit and unexpanded
    ++n;
  }
  EXPECT_GE(n, 2);

  // A helper that fails: its exit status and stderr, as a permission error.
  write_helper(dir, srv, 3, 3);
  const auto bad = resolve_s3_config({}, getenv_of(env), real_files(), /*use_network=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("exit status 3"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("run aws sso login"), std::string::npos) << bad.status().to_string();
  std::error_code ec;
  fs::remove_all(dir, ec);
}


TEST(S3MotoSigV4Credentials, AssumeRoleFromASourceProfileSignsWithTheSession) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_TRUE(srv.checks_sigv4);
  CredentialServer roles(srv, 3600);  // makes the role ckptio-test-role on moto, with a policy
  ASSERT_FALSE(roles.url().empty()) << roles.log();
  const fs::path dir = fs::temp_directory_path() / ("ckptio-role-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto write_config = [&](const std::string& secret) {
    std::ofstream(dir / "config") << "[profile trainer]\n"
                                  << "role_arn = arn:aws:iam::123456789012:role/ckptio-test-role\n"
                                  << "source_profile = base\nrole_session_name = job-42\n"
                                  << "duration_seconds = 900\nexternal_id = ext-1\n"
                                  << "[profile base]\naws_access_key_id = " << srv.access_key << "\n"
                                  << "aws_secret_access_key = " << secret << "\n";
  };
  write_config(srv.secret_key);
  // AWS_ENDPOINT_URL serves STS too: moto answers both.
  Env env = server_env(srv, {{"AWS_CONFIG_FILE", (dir / "config").string()},
                             {"AWS_SHARED_CREDENTIALS_FILE", (dir / "none").string()},
                             {"AWS_PROFILE", "trainer"}});
  const auto c = resolve_s3_config({}, getenv_of(env), real_files(), /*use_network=*/true);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials_source, "profile trainer role arn:aws:iam::123456789012:role/ckptio-test-role");
  EXPECT_FALSE(c->creds.session_token.empty());
  EXPECT_NE(c->creds.access_key_id, srv.access_key);
  auto store = open_store(srv, *c);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  expect_put_get(**store, "obj", 5);  // signed with the role's session, which moto checks

  // A wrong source secret: STS (moto) refuses the signature.
  write_config("not-the-secret");
  const auto bad = resolve_s3_config({}, getenv_of(env), real_files(), /*use_network=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("STS AssumeRole"), std::string::npos) << bad.status().to_string();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace ckptio::s3
