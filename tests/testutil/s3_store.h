// An S3Storage on the test server of the current test (testutil/s3_server.h),
// under a prefix no other test uses, configured for quick tests: 5 MiB parts
// (S3's minimum, so multipart paths run on small data) and short backoffs.
#pragma once

#include <memory>
#include <string>

#include "backends/s3/s3_storage.h"
#include "testutil/backend_fixture.h"
#include "testutil/s3_server.h"

namespace ckptio::testutil {

inline constexpr uint64_t kS3TestPart = 5ull << 20;

inline s3::S3Config s3_test_config(const S3TestServer& srv) {
  s3::S3Config c;
  c.endpoint = srv.endpoint;
  c.region = srv.region;
  c.creds = {srv.access_key, srv.secret_key, ""};
  c.path_style = true;
  c.part_size = kS3TestPart;
  c.max_connections = 16;
  c.retry.base_seconds = 0.02;
  c.retry.cap_seconds = 0.5;
  c.retry.max_attempts = 5;
  c.request_timeout_s = 20;
  return c;
}

// kUnimplemented (the test skips) when no server is configured outside CI;
// kFailedPrecondition (the test fails) when one should be there.
inline Result<std::shared_ptr<s3::S3Storage>> open_s3_test_store(
    const s3::S3Config* config = nullptr) {
  auto look = lookup_s3_test_server();
  if (!look.server)
    return Status(look.must_fail ? Code::kFailedPrecondition : Code::kUnimplemented, look.why);
  std::string prefix = s3_test_prefix();
  prefix.pop_back();  // no trailing '/'
  return s3::make_s3_storage("s3://" + look.server->bucket + "/" + prefix,
                             config ? *config : s3_test_config(*look.server));
}

// The backend fixture (backend_fixture.h) whose Moto and Ceph cases open the
// run's S3 test server through open_s3_test_store (a fresh prefix each).
class S3BackendTest : public BackendTest {
 protected:
  using BackendTest::BackendTest;
  Result<std::shared_ptr<Storage>> open_remote(Backend) override {
    auto s = open_s3_test_store();
    if (!s.ok()) return s.status();
    return std::shared_ptr<Storage>(*s);
  }
};

}  // namespace ckptio::testutil
