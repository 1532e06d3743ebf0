// Where the S3 test server for this test is, and what to do when there is none.
//
// ctest starts S3-compatible servers on loopback as fixtures (tests/s3/, see
// tests/s3/README.md) and routes a GoogleTest case to one by its name:
//   S3Moto...      (or a parameter name ending the test name in /Moto)      -> moto
//   S3S3rver...    (or .../S3rver)                                          -> s3rver
//   S3Ceph...      (or .../Ceph)     -> Ceph's radosgw (real SigV4 checks; tests/s3/ceph-rgw)
//   S3MotoSigV4... (or .../MotoSigV4)                                       -> moto with SigV4 checks
//   S3MotoFaulty...(or .../MotoFaulty)  -> moto behind tests/s3/fault-proxy (faults on request)
// Such a test runs with CKPTIO_S3_SERVER_ENV=<build>/s3-servers/<name>/server.env,
// a file of key=value lines written by tests/s3/s3-server once the server answers
// and the bucket exists.
//
// No server for a test is never a silent pass:
//   - CKPTIO_S3_SERVER_ENV unset (the binary was run by hand, not by ctest), or
//     the server program is not installed: the test SKIPs with the reason, and
//     FAILs instead when CI=true;
//   - the variable is set but the file is missing or incomplete (the fixture
//     failed, or the server was stopped): the test FAILs.
//
//   TEST(S3MotoBackend, PutGet) {
//     CKPTIO_REQUIRE_S3_SERVER(srv);          // skips or fails, as above
//     auto prefix = ckptio::testutil::s3_test_prefix();   // this test's own keys
//     ... srv.endpoint, srv.bucket, srv.access_key, srv.secret_key, srv.region ...
//   }
//
// Every test shares the one bucket of its server, and tests run in parallel
// (ctest -j): keep each test under its own s3_test_prefix() and never list or
// delete outside it.
//
// S3MotoFaulty tests talk to moto through tests/s3/fault-proxy and set its
// fault rules through its control API (tests/s3/README.md, "Fault injection");
// ctest runs them one at a time (RESOURCE_LOCK): the rules are global.
//
//   TEST(S3MotoFaultyMultipart, AbortsAfterLastAttempt) {
//     CKPTIO_REQUIRE_S3_SERVER(srv);
//     ASSERT_TRUE(ckptio::testutil::s3_fault_reset(srv));   // no rules, counters zeroed
//     ASSERT_TRUE(ckptio::testutil::s3_fault_set_rules(srv,
//         R"(["fault=status status=503 op=UploadPart"])"));
//     ... upload, expect an error ...
//     EXPECT_EQ(ckptio::testutil::s3_fault_count(srv, "op.AbortMultipartUpload"), 1);
//     ckptio::testutil::s3_fault_reset(srv);
//   }
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include <curl/curl.h>
#include <unistd.h>

namespace ckptio::testutil {

struct S3TestServer {
  std::string endpoint;    // "http://127.0.0.1:PORT"; path-style addressing only
  std::string bucket;      // exists, shared by all tests of this server
  std::string access_key;
  std::string secret_key;
  std::string region;      // "us-east-1"
  std::string kind;        // "moto", "moto-sigv4", "s3rver" or "ceph"
  bool checks_sigv4 = false;  // true only for moto-sigv4: a wrong secret gets 403
  std::string env_path;    // the server.env it was read from
  // Only behind tests/s3/fault-proxy (S3MotoFaulty): its control API,
  // "http://127.0.0.1:PORT/__fault__", and the server it forwards to.
  std::string control;
  std::string upstream;
};

struct S3TestServerLookup {
  std::optional<S3TestServer> server;
  bool must_fail = false;  // true: FAIL the test; false: SKIP it (when no server)
  std::string why;         // why there is no server
};

inline bool s3_test_in_ci() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  std::string v(ci);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "true" || v == "1" || v == "yes";
}

inline S3TestServerLookup lookup_s3_test_server() {
  namespace fs = std::filesystem;
  S3TestServerLookup out;
  const char* path = std::getenv("CKPTIO_S3_SERVER_ENV");
  if (path == nullptr || *path == '\0') {
    out.why =
        "CKPTIO_S3_SERVER_ENV is not set: run S3 tests through ctest (it starts the "
        "servers), or point it at a server.env written by tests/s3/s3-server";
    out.must_fail = s3_test_in_ci();
    return out;
  }
  std::ifstream in(path);
  if (!in) {
    fs::path marker = fs::path(path).parent_path() / "unavailable";
    std::ifstream m(marker);
    if (m) {
      std::string reason((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
      while (!reason.empty() && std::isspace(static_cast<unsigned char>(reason.back())))
        reason.pop_back();
      out.why = "S3 test server not installed: " + reason;
      out.must_fail = s3_test_in_ci();
    } else {
      out.why = std::string("no S3 test server: ") + path +
                " is missing (its s3_*_start fixture failed or did not run; see "
                "server.log beside it)";
      out.must_fail = true;
    }
    return out;
  }
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    if (eq == std::string::npos || line.empty() || line[0] == '#') continue;
    auto trim = [](std::string s) {
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
      size_t i = 0;
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      return s.substr(i);
    };
    kv[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  S3TestServer s;
  s.endpoint = kv["endpoint"];
  s.bucket = kv["bucket"];
  s.access_key = kv["access_key"];
  s.secret_key = kv["secret_key"];
  s.region = kv["region"];
  s.kind = kv["kind"];
  s.checks_sigv4 = kv["checks_sigv4"] == "true";
  s.env_path = path;
  s.control = kv["control"];
  s.upstream = kv["upstream"];
  for (const char* k : {"endpoint", "bucket", "access_key", "secret_key", "region"}) {
    if (kv[k].empty()) {
      out.why = std::string(path) + ": no '" + k + "=' line";
      out.must_fail = true;
      return out;
    }
  }
  out.server = std::move(s);
  return out;
}

// The server for this test, or nullopt (lookup_s3_test_server() says why and
// whether that is a skip or a failure).
inline std::optional<S3TestServer> s3_test_server_from_env() {
  return lookup_s3_test_server().server;
}

// A key prefix no other test or run uses: "<test name>-<pid>-<n>-<random>/",
// made only of [A-Za-z0-9._-] so it needs no percent-encoding (moto-sigv4
// rejects percent-encoded paths; see tests/s3/README.md).
inline std::string s3_test_prefix() {
  static std::atomic<unsigned> counter{0};
  std::string name = "test";
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    name = std::string(info->test_suite_name()) + "." + info->name();
  for (auto& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  std::random_device rd;
  char rnd[9];
  std::snprintf(rnd, sizeof rnd, "%08x", rd());
  return name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + rnd + "/";
}

// ---- the fault proxy's control API (tests/s3/README.md, "Fault injection") ----

// One request to the proxy's control API: `method` "GET" or "POST", `path`
// under it ("/rules", "/stats?format=text", "/reset"), `body` sent as is (a
// JSON list of rules, or rule lines). True on HTTP 200; *response (if given)
// gets the body, or why the request failed (an error text on HTTP 400).
inline bool s3_fault_control(const S3TestServer& srv, const std::string& method,
                             const std::string& path, const std::string& body,
                             std::string* response) {
  std::string sink;
  std::string& out = response != nullptr ? *response : sink;
  out.clear();
  if (srv.control.empty()) {
    out = "no control= line in " + srv.env_path +
          ": not a fault-proxy server (name the test S3MotoFaulty...)";
    return false;
  }
  CURL* h = curl_easy_init();
  if (h == nullptr) {
    out = "curl_easy_init failed";
    return false;
  }
  std::string url = srv.control + (path.empty() || path[0] == '/' ? "" : "/") + path;
  curl_slist* headers = curl_slist_append(nullptr, "Expect:");
  headers = curl_slist_append(headers, "Content-Type: application/json");
  auto write = +[](char* p, size_t size, size_t n, void* ud) -> size_t {
    static_cast<std::string*>(ud)->append(p, size * n);
    return size * n;
  };
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PROXY, "");      // never through $http_proxy
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
  if (method == "GET") {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    if (method != "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) {
    out = std::string(method) + " " + url + ": " + curl_easy_strerror(rc);
    return false;
  }
  return status == 200;
}

// Replaces the proxy's rules: a JSON list of rule strings or objects, e.g.
// R"(["fault=status status=503 op=UploadPart"])", or rule lines. Counters of
// the old rules go; request counters stay (s3_fault_reset zeroes them).
inline bool s3_fault_set_rules(const S3TestServer& srv, const std::string& rules,
                               std::string* response = nullptr) {
  return s3_fault_control(srv, "POST", "/rules", rules, response);
}

// No rules, all counters zeroed, stalled connections closed.
inline bool s3_fault_reset(const S3TestServer& srv, std::string* response = nullptr) {
  return s3_fault_control(srv, "POST", "/reset", "", response);
}

// The proxy's counters as JSON (GET /__fault__/stats), or "" if unreachable.
inline std::string s3_fault_stats(const S3TestServer& srv) {
  std::string out;
  return s3_fault_control(srv, "GET", "/stats", "", &out) ? out : std::string();
}

// One counter by name from GET /__fault__/stats?format=text: "requests",
// "forwarded", "faults.status", "faults_total", "op.UploadPart", "status.503",
// "rule.0.injected", ... A counter not listed is 0; -1 if the proxy is unreachable.
inline long s3_fault_count(const S3TestServer& srv, const std::string& name) {
  std::string out;
  if (!s3_fault_control(srv, "GET", "/stats?format=text", "", &out)) return -1;
  std::istringstream in(out);
  std::string key, value;
  while (in >> key >> value)
    if (key == name) return std::strtol(value.c_str(), nullptr, 10);
  return 0;
}

}  // namespace ckptio::testutil

// Declares `const S3TestServer& var` for the current test, or ends the test:
// GTEST_SKIP with the reason, or GTEST_FAIL in CI or when the server should be
// there. For use in a TEST body or in SetUp() (functions returning void).
#define CKPTIO_REQUIRE_S3_SERVER(var)                                               \
  auto var##_s3_lookup_ = ::ckptio::testutil::lookup_s3_test_server();              \
  if (!var##_s3_lookup_.server) {                                                   \
    if (var##_s3_lookup_.must_fail) GTEST_FAIL() << var##_s3_lookup_.why;           \
    GTEST_SKIP() << var##_s3_lookup_.why;                                           \
  }                                                                                 \
  const ::ckptio::testutil::S3TestServer& var = *var##_s3_lookup_.server
