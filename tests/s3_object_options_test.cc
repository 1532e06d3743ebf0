// What every object of a checkpoint is written as on S3: server-side
// encryption (SSE-S3, SSE-KMS with a key), and the storage class. Checked on
// moto, which stores these headers and returns them on HEAD, for every object
// a save writes: single PUTs, the multipart object of a shard larger than a
// part, and the index (whose write is the commit).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/s3/s3_client.h"
#include "backends/s3/s3_config.h"
#include "backends/s3/s3_storage.h"
#include "ckptio/manager.h"
#include "testutil/random_bytes.h"
#include "testutil/s3_server.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

TEST(S3ObjectOptionsConfig, Validation) {
  auto resolve = [](s3::S3ConfigOverrides o) { return s3::resolve_s3_config(o, nullptr, nullptr); };
  s3::S3ConfigOverrides o;
  o.sse = "aws:kms";
  o.sse_kms_key_id = "arn:aws:kms:us-east-1:123456789012:key/abc";
  o.storage_class = "INTELLIGENT_TIERING";
  auto ok = resolve(o);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_NE(ok->describe_redacted().find("sse=aws:kms sse_kms_key_id=arn:aws:kms"), std::string::npos);
  EXPECT_NE(ok->describe_redacted().find("storage_class=INTELLIGENT_TIERING"), std::string::npos);

  struct Case { s3::S3ConfigOverrides o; const char* expect; };
  std::vector<Case> bad;
  bad.push_back({{.sse = "aes256"}, "must be AES256, aws:kms or aws:kms:dsse"});
  bad.push_back({{.sse = "AES256", .sse_kms_key_id = "k"}, "needs server-side encryption aws:kms"});
  bad.push_back({{.sse_kms_key_id = "k"}, "needs server-side encryption aws:kms"});
  bad.push_back({{.sse = "aws:kms", .sse_kms_key_id = "a b"}, "whitespace"});
  bad.push_back({{.storage_class = "standard"}, "must be an S3 storage class name"});
  bad.push_back({{.storage_class = "DEEP_ARCHIVE"}, "cannot be read without a restore request"});
  bad.push_back({{.storage_class = "GLACIER"}, "cannot be read without a restore request"});
  for (const Case& c : bad) {
    auto r = resolve(c.o);
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().to_string();
  }
  EXPECT_TRUE(resolve({.storage_class = "GLACIER_IR"}).ok());
  EXPECT_TRUE(resolve({.sse = "aws:kms:dsse"}).ok());
}

TEST(S3MotoObjectOptions, EveryObjectOfAStepCarriesThem) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  s3::S3Config config = testutil::s3_test_config(srv);
  config.sse = "aws:kms";
  config.sse_kms_key_id = "alias/ckptio-test";
  config.storage_class = "INTELLIGENT_TIERING";
  std::string prefix = testutil::s3_test_prefix();
  prefix.pop_back();
  auto store = s3::make_s3_storage("s3://" + srv.bucket + "/" + prefix, config);
  ASSERT_TRUE(store.ok()) << store.status().to_string();

  ManagerOptions mo;
  mo.staging = StagingMode::kCopy;
  mo.chunk_size = testutil::kS3TestPart;
  CheckpointManager m(*store, mo);
  // One leaf above a part (a multipart data object), a small one (a single PUT).
  auto big = testutil::random_bytes(2 * testutil::kS3TestPart + 4096, 5);
  auto small = testutil::random_bytes(4096, 6);
  std::vector<LeafView> state = {
      LeafView::full("model", "w", DType::kUInt8, {static_cast<int64_t>(big.size())}, big.data()),
      LeafView::full("model", "b", DType::kUInt8, {static_cast<int64_t>(small.size())}, small.data()),
  };
  auto h = m.save(3, state);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();

  auto listed = (*store)->list("", false);
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  // The multipart data object of the big leaf, the small leaf's object, the step's index.
  ASSERT_GE(listed->objects.size(), 3u);
  bool saw_multipart_sized = false;
  s3::S3Client client(config, srv.bucket);
  for (const auto& o : listed->objects) {
    SCOPED_TRACE(o.key);
    saw_multipart_sized |= o.size > testutil::kS3TestPart;
    s3::S3Op head;
    head.method = "HEAD";
    head.key = prefix + "/" + o.key;
    auto [st, resp] = client.execute_sync(std::move(head));
    ASSERT_TRUE(st.ok()) << o.key << ": " << st.to_string();
    const std::string* sse = resp.header("x-amz-server-side-encryption");
    const std::string* key = resp.header("x-amz-server-side-encryption-aws-kms-key-id");
    const std::string* cls = resp.header("x-amz-storage-class");
    EXPECT_TRUE(sse && *sse == "aws:kms") << o.key;
    EXPECT_TRUE(key && *key == "alias/ckptio-test") << o.key;
    EXPECT_TRUE(cls && *cls == "INTELLIGENT_TIERING") << o.key;
  }
  EXPECT_TRUE(saw_multipart_sized);

  auto back = m.restore(3);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->leaves.size(), 2u);
  bool big_back = false;
  for (const auto& t : back->leaves)
    if (t.data.size() == big.size()) big_back = std::memcmp(t.data.data(), big.data(), big.size()) == 0;
  EXPECT_TRUE(big_back);
}

}  // namespace
}  // namespace ckptio
