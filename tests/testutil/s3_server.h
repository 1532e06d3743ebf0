// Where the S3 test server for this test is, and what to do when there is none.
//
// ctest starts S3-compatible servers on loopback as fixtures (tests/s3/, see
// tests/s3/README.md) and routes a GoogleTest case to one by its name:
//   S3Moto...      (or a parameter name ending the test name in /Moto)      -> moto
//   S3S3rver...    (or .../S3rver)                                          -> s3rver
//   S3MotoSigV4... (or .../MotoSigV4)                                       -> moto with SigV4 checks
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
#include <string>

#include <unistd.h>

namespace ckptio::testutil {

struct S3TestServer {
  std::string endpoint;    // "http://127.0.0.1:PORT"; path-style addressing only
  std::string bucket;      // exists, shared by all tests of this server
  std::string access_key;
  std::string secret_key;
  std::string region;      // "us-east-1"
  std::string kind;        // "moto", "moto-sigv4" or "s3rver"
  bool checks_sigv4 = false;  // true only for moto-sigv4: a wrong secret gets 403
  std::string env_path;    // the server.env it was read from
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
