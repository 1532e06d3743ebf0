// The S3 backend through the fault-injecting proxy in front of moto
// (tests/s3/fault-proxy, fixture s3_moto_faulty): each part and range is
// retried on its own; a save that runs out of attempts fails naming the key,
// the HTTP status and the S3 code, aborts its multipart upload and leaves the
// previous step intact; reads recover from truncated bodies, resets and
// stalls; a read never mixes two versions of an object; a body damaged on
// the way is refused by its checksum and sent again (also against Ceph's own
// check, through a proxy the test starts in front of it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "testutil/random_bytes.h"
#include "ckptio/ckptio.h"
#include "testutil/s3_server.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

using testutil::kS3TestPart;

using testutil::random_bytes;

class S3MotoFaulty : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPTIO_REQUIRE_S3_SERVER(srv);
    srv_ = srv;
    ASSERT_FALSE(srv_.control.empty()) << "this test needs the fault proxy (fixture s3_moto_faulty)";
    ASSERT_TRUE(testutil::s3_fault_reset(srv_));
    config_ = testutil::s3_test_config(srv_);
    auto s = testutil::open_s3_test_store(&config_);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    store_ = std::move(s).value();
  }
  void TearDown() override {
    if (!srv_.control.empty()) (void)testutil::s3_fault_reset(srv_);
  }
  void rules(const std::string& r) {
    std::string resp;
    ASSERT_TRUE(testutil::s3_fault_set_rules(srv_, r, &resp)) << resp;
  }
  long count(const std::string& name) { return testutil::s3_fault_count(srv_, name); }

  // A state of 3 parts and a bit (multipart), plus a scalar.
  std::vector<LeafView> state(const std::vector<std::byte>& big, const int32_t& scalar) {
    return {LeafView::full("model", "params.w", DType::kUInt8, {static_cast<int64_t>(big.size())}, big.data()),
            LeafView::full("tx", "opt_state.count", DType::kInt32, {}, &scalar)};
  }
  ManagerOptions manager_options() {
    ManagerOptions mo;
    mo.chunk_size = kS3TestPart;
    return mo;
  }

  testutil::S3TestServer srv_;
  s3::S3Config config_;
  std::shared_ptr<s3::S3Storage> store_;
};

TEST_F(S3MotoFaulty, EachPartIsRetriedOnItsOwn) {
  auto big = random_bytes(3 * kS3TestPart + 1000, 1);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  rules("status=503 op=UploadPart count=3\nfault=reset op=UploadPart skip=1 count=1");
  auto h = m.save(1, state(big, n));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_GE(count("faults_total"), 4);
  // The three 503s are ours to retry; a reset on a reused connection may be
  // retried inside libcurl (it resends a request whose connection died).
  EXPECT_GE(store_->s3_stats().retries, 3u);
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
}

TEST_F(S3MotoFaulty, ExhaustedRetriesFailTheSaveCleanly) {
  auto big = random_bytes(3 * kS3TestPart, 2);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  ASSERT_TRUE(m.save(1, state(big, n)).ok());
  ASSERT_TRUE(m.wait_until_finished().ok());

  // Every part of the next save gets 503 SlowDown, forever.
  rules("status=503 op=UploadPart");
  Status callback_status;
  std::atomic<int> callbacks{0};
  ManagerOptions mo = manager_options();
  mo.on_commit = [&](const CommitEvent& e) {
    callback_status = e.status;
    ++callbacks;
  };
  CheckpointManager m2(store_, mo);
  auto big2 = random_bytes(3 * kS3TestPart, 3);
  n = 2;
  auto h = m2.save(2, state(big2, n));
  ASSERT_TRUE(h.ok());
  Status st = h->wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  for (const char* want : {"run-2/data-", "HTTP 503", "SlowDown", "after 5 attempts"})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " not in: " << st.to_string();
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_EQ(callback_status.code(), st.code());
  rules("");

  // No upload left behind, step 1 still the latest and intact.
  auto uploads = store_->list_unfinished("");
  ASSERT_TRUE(uploads.ok()) << uploads.status().to_string();
  EXPECT_TRUE(uploads->empty()) << uploads->size() << " unfinished, first " << uploads->front().key;
  auto latest = m2.latest_step();
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ(**latest, 1);
  auto r = m2.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
}

// A save whose data objects all fail: a retry goes before the requests not
// yet tried, so the first object spends its attempts at once, and then the
// PUTs still queued are not sent (WritableObject::cancel). Before, each
// object spent its attempts in turn with the others (12 x 5 here), and with
// a save's thousands of objects against an endpoint that stopped answering
// the save reported its failure hours later. Two connections, twelve
// objects: about the first two objects' attempts now, and some first tries.
TEST_F(S3MotoFaulty, AFailedSaveSendsNoneOfItsQueuedWrites) {
  s3::S3Config cfg = config_;
  cfg.max_connections = 2;
  auto s = testutil::open_s3_test_store(&cfg);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const int attempts = cfg.retry.max_attempts;
  ASSERT_GE(attempts, 3);
  constexpr int kObjects = 12;
  const uint64_t leaf = (*s)->data_object_bytes() - 4096;
  auto big = random_bytes(leaf * kObjects, 4);
  std::vector<std::string> names;
  for (int i = 0; i < kObjects; ++i) names.push_back("w" + std::to_string(i));
  std::vector<LeafView> st8;
  for (int i = 0; i < kObjects; ++i)
    st8.push_back(LeafView::full("model", names[i], DType::kUInt8, {static_cast<int64_t>(leaf)}, big.data() + i * leaf));
  // Each answer takes 0.1 s, as from an endpoint that stopped answering
  // (there each attempt ends at a timeout).
  rules("fault=latency delay=0.1 op=PutObject path=.*/data-\nstatus=503 op=PutObject path=.*/data-");
  ManagerOptions mo = manager_options();
  mo.staging = StagingMode::kBorrow;
  CheckpointManager m(*s, mo);
  auto h = m.save(1, st8);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("HTTP 503"), std::string::npos) << st.to_string();
  const long sent = count("rule.1.injected");  // the 503s: attempts sent
  EXPECT_GE(sent, attempts);
  // (19 of 60 here; 60 before.)
  EXPECT_LE(sent, kObjects * attempts / 2) << "data PUTs sent, of " << kObjects * attempts << " before";
  rules("");
  ASSERT_TRUE(m.gc(GcOptions{0}).ok());
  auto left = (*s)->list("", false);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->objects.empty()) << left->objects.size() << " objects left, first " << left->objects[0].key;
}

// CreateMultipartUpload whose answer is lost after the server began the
// upload: the retry begins a second one, and the first, whose id no one
// learnt, stayed until gc. A key of create_new() is the writer's own, so the
// writer aborts every other upload into it.
TEST_F(S3MotoFaulty, ARetriedCreateLeavesNoOrphanUpload) {
  rules("fault=reset op=CreateMultipartUpload when=response count=1");
  const uint64_t n = 2 * kS3TestPart;
  auto data = random_bytes(n, 6);
  auto w = store_->create_new("run-7/data-orphan-0.bin", n);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(count("rule.0.injected"), 1);
  std::promise<Status> landed;
  (*w)->write_async(0, std::span<const std::byte>(data.data(), n), [&](Status st) { landed.set_value(st); });
  ASSERT_TRUE(landed.get_future().get().ok());
  ASSERT_TRUE((*w)->finish(n).ok());
  rules("");
  auto uploads = store_->list_unfinished("");
  ASSERT_TRUE(uploads.ok()) << uploads.status().to_string();
  EXPECT_TRUE(uploads->empty()) << uploads->size() << " unfinished, first " << uploads->front().key;
  auto back = store_->get("run-7/data-orphan-0.bin", n);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(std::memcmp(back->data(), data.data(), n), 0);
}

TEST_F(S3MotoFaulty, AuthErrorsAreNotRetried) {
  rules("status=403 code=AccessDenied op=PutObject");
  std::string body = "x";
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("AccessDenied"), std::string::npos) << st.to_string();
  EXPECT_EQ(count("op.PutObject"), 1) << "a 403 must not be retried";
}

// The server's error text is outside data: quoted in the Status with its
// control bytes escaped and its length bounded. Before, a newline, a
// terminal escape and kilobytes of text went into the message (and the
// log, and the CLI's stderr) as they came.
TEST_F(S3MotoFaulty, AServersErrorTextIsQuotedPrintableAndShort) {
  const std::string hostile = "line\\nckptio: step 100 committed\\u001b[2J" + std::string(5000, 'x');
  rules(R"([{"fault": "status", "status": 403, "code": "AccessDenied", "op": "PutObject", "message": ")" + hostile +
        R"("}])");
  std::string body = "x";
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message().substr(0, 300);
  EXPECT_EQ(st.message().find('\x1b'), std::string::npos) << st.message().substr(0, 300);
  EXPECT_NE(st.message().find("line\\x0Ackptio"), std::string::npos) << st.message().substr(0, 300);
  EXPECT_LT(st.message().size(), 2000u);
}

// S3 answers a request signed for the wrong region with the bucket's region
// (x-amz-bucket-region): the client sends it again for that region, at no
// retry cost, and signs every later request for it.
TEST_F(S3MotoFaulty, ARequestSignedForTheWrongRegionIsSentAgainForTheBucketsRegion) {
  ASSERT_EQ(config_.region, "us-east-1");
  rules(R"([{"status": 400, "code": "AuthorizationHeaderMalformed",
             "message": "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'",
             "header": "/us-east-1/s3/aws4_request", "bucket_region": "eu-west-1"}])");
  const std::string body = "in eu-west-1";
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto got = store_->get("k", 1024);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, body);
  EXPECT_EQ(count("rule.0.injected"), 1) << "only the first request was signed for us-east-1";
  EXPECT_EQ(count("op.PutObject"), 2);
  EXPECT_EQ(count("op.GetObject"), 1);

  // A save from a new client: its first requests, in parallel, are all signed
  // for us-east-1; each is sent again, and the step commits.
  auto fresh = testutil::open_s3_test_store(&config_);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  CheckpointManager m(*fresh, manager_options());
  auto big = random_bytes(3 * kS3TestPart + 1000, 9);
  int32_t scalar = 7;
  auto h = m.save(1, state(big, scalar));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  auto back = m.restore(1);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(std::memcmp(back->leaves[0].data.data(), big.data(), big.size()), 0);
  EXPECT_GE(count("rule.0.injected"), 2);
}

TEST_F(S3MotoFaulty, AWrongRegionWithoutTheBucketsRegionIsAnError) {
  rules(R"([{"status": 400, "code": "AuthorizationHeaderMalformed", "header": "/us-east-1/s3/aws4_request"}])");
  const std::string body = "x";
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("AuthorizationHeaderMalformed"), std::string::npos) << st.to_string();
  EXPECT_EQ(count("op.PutObject"), 1);
}

TEST_F(S3MotoFaulty, ReadsRecoverFromTruncationResetsAndStalls) {
  auto big = random_bytes(3 * kS3TestPart + 4321, 4);
  int32_t n = 9;
  CheckpointManager m(store_, manager_options());
  ASSERT_TRUE(m.save(1, state(big, n)).ok());
  ASSERT_TRUE(m.wait_until_finished().ok());

  rules("fault=truncate op=GetObject header=^Range: skip=1 count=2\n"
        "fault=reset op=GetObject header=^Range: skip=3 count=1 when=response body_bytes=1000\n"
        "fault=stall op=GetObject header=^Range: skip=4 count=1 delay=4 then=close");
  s3::S3Config quick = config_;
  quick.request_timeout_s = 1;  // the stall outlasts it
  auto s = s3::make_s3_storage(store_->describe(), quick);  // same prefix, same objects
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  CheckpointManager reader(*s, manager_options());
  auto r = reader.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
  EXPECT_GE(count("faults_total"), 3);
}

TEST_F(S3MotoFaulty, CompleteWithErrorInside200IsRetried) {
  rules("fault=error200 op=CompleteMultipartUpload count=1");
  auto big = random_bytes(2 * kS3TestPart + 10, 5);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  auto h = m.save(1, state(big, n));
  ASSERT_TRUE(h.ok());
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(count("faults_total"), 1);
  EXPECT_GE(count("op.CompleteMultipartUpload"), 2);
  EXPECT_TRUE(m.verify(1).ok());
}

// The server completes the upload but its answer is lost (a reset after the
// upstream answered): the retry meets an upload already completed. moto
// treats a repeated Complete as idempotent (200, the object's ETag); MinIO
// and others answer 404 NoSuchUpload (the next test). Either way the save
// succeeds, and the object is not deleted or re-uploaded.
TEST_F(S3MotoFaulty, CompleteWhoseAnswerIsLostSucceeds) {
  rules("fault=reset op=CompleteMultipartUpload when=response count=1");
  auto big = random_bytes(2 * kS3TestPart + 10, 8);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  auto h = m.save(1, state(big, n));
  ASSERT_TRUE(h.ok());
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(count("faults.reset"), 1);
  EXPECT_EQ(count("op.AbortMultipartUpload"), 0);
  EXPECT_EQ(count("op.UploadPart"), 3) << "parts uploaded again";
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
}

// Each attempt is signed when it is sent, not when it is queued: with one
// connection and 1 s per PUT, six PUTs (and the retry of the first, which
// gets a 503) wait up to ~6 s for their turn; a signature made when queued
// would reach the server that old (past 15 minutes S3 answers 403
// RequestTimeTooSkewed). The proxy records the oldest X-Amz-Date it sees,
// in whole seconds: with signing at the send it is under a second old.
TEST_F(S3MotoFaulty, EachAttemptIsSignedWhenItIsSent) {
  rules("fault=status status=503 op=PutObject count=1\n"
        "fault=latency delay=1 op=PutObject skip=1");
  s3::S3Config one = config_;
  one.max_connections = 1;
  auto s = s3::make_s3_storage(store_->describe(), one);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::shared_ptr<s3::S3Storage> store = *s;
  const std::string body = "signed when sent";
  std::vector<std::thread> puts;
  std::vector<Status> got(6);
  for (size_t i = 0; i < got.size(); ++i)
    puts.emplace_back([&, i] { got[i] = store->put("k" + std::to_string(i), std::as_bytes(std::span(body))); });
  for (auto& t : puts) t.join();
  for (const Status& st : got) EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(count("op.PutObject"), 7);
  EXPECT_EQ(count("rule.0.injected"), 1);
  EXPECT_EQ(store->s3_stats().retries, 1u);
  const long age_ms = count("amz_date_age_max_ms");
  EXPECT_GE(age_ms, 0);
  EXPECT_LT(age_ms, 2000) << "a request was signed long before it was sent";
}

// As above, but the retry is answered as MinIO answers it: 404 NoSuchUpload.
// The object is there, of the size and (ETag "md5-3") the 3 parts written:
// the save succeeds and the object is intact.
TEST_F(S3MotoFaulty, CompleteWhoseRetryFindsNoSuchUploadSucceeds) {
  rules("fault=reset op=CompleteMultipartUpload when=response count=1\n"
        "fault=status status=404 code=NoSuchUpload op=CompleteMultipartUpload count=1 "
        "message='The specified upload does not exist.'");
  auto big = random_bytes(2 * kS3TestPart + 10, 10);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  auto h = m.save(1, state(big, n));
  ASSERT_TRUE(h.ok());
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(count("faults.reset"), 1);
  EXPECT_EQ(count("faults.status"), 1);
  EXPECT_EQ(count("op.CompleteMultipartUpload"), 2);
  EXPECT_GE(count("op.HeadObject"), 1);  // the object checked (the commit HEADs too)
  EXPECT_EQ(count("op.AbortMultipartUpload"), 0);
  EXPECT_EQ(count("op.UploadPart"), 3) << "parts uploaded again";
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
  EXPECT_TRUE(m.verify(1).ok());
}

// ... but not when the object there is not the one these parts make: the
// retry's NoSuchUpload then stands (the upload was aborted meanwhile).
TEST_F(S3MotoFaulty, CompleteWhoseRetryFindsNoSuchUploadAndNoObjectFails) {
  rules("fault=status status=500 op=CompleteMultipartUpload count=1\n"
        "fault=status status=404 code=NoSuchUpload op=CompleteMultipartUpload count=1");
  auto big = random_bytes(2 * kS3TestPart + 10, 11);
  auto w = store_->create("obj", big.size());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::promise<Status> wrote;
  (*w)->write_async(0, big, [&](Status s) { wrote.set_value(s); });
  ASSERT_TRUE(wrote.get_future().get().ok());
  Status st = (*w)->finish(big.size());
  EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("NoSuchUpload"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("not there either"), std::string::npos) << st.to_string();
  EXPECT_EQ(count("op.HeadObject"), 1);
  EXPECT_EQ(count("op.AbortMultipartUpload"), 1);
}

// A ranged GET is answered with the bytes asked for, or it fails: a 206 of
// other bytes (the proxy sends another Range upstream) and a 200 with the
// whole object (the proxy drops the Range, as a server that ignores it) are
// the server's fault, kUnavailable (retried), not damage; a 200 is accepted
// for a read of the whole object.
TEST_F(S3MotoFaulty, ARangedGetIsAnsweredWithTheRangeAskedOrFails) {
  const uint64_t size = 100000;
  auto data = random_bytes(size, 12);
  ASSERT_TRUE(store_->put("obj", data).ok());
  std::vector<std::byte> got(size);
  auto read = [&](uint64_t off, uint64_t len) {
    ReadRequest req{"obj", off, len, got.data()};
    return store_->read(std::span(&req, 1));
  };

  rules("fault=range range=bytes=0-999 op=GetObject");
  Status st = read(4096, 1000);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("Content-Range 'bytes 0-999/100000' to a GET of bytes=4096-5095"), std::string::npos)
      << st.to_string();
  EXPECT_EQ(count("op.GetObject"), config_.retry.max_attempts);

  rules("fault=range range= op=GetObject");
  for (uint64_t off : {uint64_t{0}, uint64_t{4096}}) {
    st = read(off, 1000);
    EXPECT_EQ(st.code(), Code::kUnavailable) << off << ": " << st.to_string();
    EXPECT_NE(st.message().find("the server ignored the Range"), std::string::npos) << st.to_string();
  }
  st = read(0, size);  // the whole object: a 200 is the answer asked for
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(std::memcmp(got.data(), data.data(), size), 0);
  EXPECT_EQ(count("faults.range"), 3 * config_.retry.max_attempts + 1);
}

// A server that ignores Range fails restore-latest with its error instead of
// making it skip every step as damaged.
TEST_F(S3MotoFaulty, AServerIgnoringRangeIsNotStepDamage) {
  auto big = random_bytes(3 * kS3TestPart + 1000, 13);
  int32_t n = 1;
  CheckpointManager m(store_, manager_options());
  ASSERT_TRUE(m.save(1, state(big, n)).ok());
  ASSERT_TRUE(m.wait_until_finished().ok());
  rules("fault=range range= op=GetObject header=^Range:");
  auto r = m.restore(std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().to_string();
  EXPECT_NE(r.status().message().find("ignored the Range"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().message().find("skipping damaged"), std::string::npos) << r.status().to_string();
  rules("");
  r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
}

// If-Match: a ranged read that started on one version of an object fails
// rather than mixing in bytes of a newer version written meanwhile.
TEST_F(S3MotoFaulty, ReadNeverMixesVersions) {
  const uint64_t n = 2 * kS3TestPart;
  auto v1 = random_bytes(n, 6), v2 = random_bytes(n, 7);
  ASSERT_TRUE(store_->put("obj", v1).ok());
  // The read learns the object's version first (HEAD, not delayed); its GETs
  // then wait 1.5 s in the proxy before they go upstream. The overwrite goes
  // as soon as the proxy holds the first GET (a latch on the proxy's count,
  // not a guess at how long the HEAD takes), so it lands between the two.
  rules("fault=latency op=GetObject delay=1.5");
  std::thread writer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (count("op.GetObject") < 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_GE(count("op.GetObject"), 1) << "the read's GET never reached the proxy";
    EXPECT_TRUE(store_->put("obj", v2).ok());
  });
  std::vector<std::byte> got(n);
  ReadRequest req{"obj", 0, n, got.data()};
  Status st = store_->read(std::span(&req, 1));
  writer.join();
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.to_string();
  EXPECT_NE(st.message().find("changed while it was being read"), std::string::npos) << st.to_string();
}

// A body damaged on the way to a server that checks x-amz-checksum-crc32c is
// refused and sent again. The proxy stands for the path and the server's
// check: `corrupt` flips one byte of a body, then `checksum` checks the body
// against its checksum headers as S3 does (400 BadDigest) before anything
// goes upstream. (None of the three test servers checks
// x-amz-checksum-crc32c itself: docs/s3.md, "Upload checksums".) Payloads
// unsigned, as over https, the AWS default there: the checksum header is
// then the only check of the body.
TEST_F(S3MotoFaulty, ABodyDamagedOnTheWayIsRefusedAndSentAgain) {
  config_.sign_payloads = false;
  auto s = testutil::open_s3_test_store(&config_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  store_ = std::move(s).value();
  rules("fault=checksum op=PutObject|UploadPart\n"
        "fault=corrupt op=UploadPart path='[?&]partNumber=2(&|$)' count=1\n"
        "fault=corrupt op=PutObject count=1\n"
        // counts the uploads whose signature covers the header
        "fault=latency delay=0.001 op=PutObject|UploadPart header='^Authorization:.*SignedHeaders=[^,]*x-amz-checksum-crc32c'\n"
        "fault=latency delay=0.001 op=CreateMultipartUpload header='^x-amz-checksum-algorithm: *CRC32C'");
  auto big = random_bytes(3 * kS3TestPart + 1000, 21);  // 4 parts
  int32_t n = 7;
  CheckpointManager m(store_, manager_options());
  auto h = m.save(1, state(big, n));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();

  EXPECT_EQ(count("faults.corrupt"), 2);
  EXPECT_EQ(count("checksums.refused"), 2) << "both damaged bodies refused";
  EXPECT_GE(store_->s3_stats().retries, 2u);
  // Every upload carried the header, signed: the two refused, sent again.
  const long uploads = count("op.PutObject") + count("op.UploadPart");
  EXPECT_EQ(count("op.UploadPart"), 5);
  EXPECT_EQ(count("checksums.crc32c"), uploads);
  EXPECT_EQ(count("rule.3.matched"), uploads);
  EXPECT_EQ(count("rule.4.matched"), 1) << "CreateMultipartUpload declares CRC32C";
  rules("");

  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves[0].data.size(), big.size());
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
  ASSERT_EQ(r->leaves.size(), 2u);
  ASSERT_EQ(r->leaves[1].data.size(), sizeof n);
  int32_t back = 0;
  std::memcpy(&back, r->leaves[1].data.data(), sizeof back);
  EXPECT_EQ(back, n);
  EXPECT_TRUE(m.verify(1).ok());
}

// A body damaged on every attempt is not a transient: after three refusals
// the request fails as data loss, saying what the refusals mean.
TEST_F(S3MotoFaulty, ABodyDamagedOnEveryAttemptFailsAfterThree) {
  config_.retry.max_attempts = 10;
  auto s = testutil::open_s3_test_store(&config_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  store_ = std::move(s).value();
  rules("fault=checksum op=PutObject\nfault=corrupt op=PutObject");
  const std::string body(4000, 'b');
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.to_string();
  for (const char* want : {"HTTP 400 BadDigest", "3 times", "after 3 attempts"})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " not in: " << st.to_string();
  EXPECT_EQ(count("op.PutObject"), 3);
  EXPECT_EQ(count("forwarded"), 0) << "nothing damaged reached the server";
}

// A server that refuses the checksum header itself (not a mismatch: it does
// not support it) gets an error that names the switch, and with checksums
// off (AWS_REQUEST_CHECKSUM_CALCULATION=when_required) no header at all.
TEST_F(S3MotoFaulty, AServerThatRefusesTheChecksumHeaderNamesTheSwitch) {
  rules("status=400 code=InvalidArgument header='^x-amz-checksum-' op=PutObject");
  const std::string body = "index";
  Status st = store_->put("k", std::as_bytes(std::span(body)));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("AWS_REQUEST_CHECKSUM_CALCULATION=when_required"), std::string::npos)
      << st.to_string();
  config_.checksums = false;
  auto s = testutil::open_s3_test_store(&config_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE((*s)->put("k", std::as_bytes(std::span(body))).ok());
  EXPECT_EQ(count("rule.0.injected"), 1);
  EXPECT_EQ(count("op.PutObject"), 2);
}

// The same against a server that checks bodies itself: Ceph refuses a
// signed payload whose SHA-256 does not match (XAmzContentSHA256Mismatch;
// payloads are signed over http by default). This test starts a fault proxy
// of its own in front of the run's Ceph and flips one byte of one part.
TEST(S3CephBodyDamage, RefusedByTheServerAndSentAgain) {
  CKPTIO_REQUIRE_S3_SERVER(ceph);
  namespace fs = std::filesystem;
  const fs::path state = fs::temp_directory_path() / ("ckptio-ceph-proxy-" + std::to_string(::getpid()));
  const std::string proxy = std::string(CKPTIO_SOURCE_DIR) + "/tests/s3/fault-proxy";
  const std::string start = proxy + " start '" + ceph.env_path + "' '" + state.string() + "' > '" +
                            state.string() + ".log' 2>&1";
  ASSERT_EQ(std::system(start.c_str()), 0) << "fault-proxy start failed: see " << state << ".log";
  struct Stop {  // the proxy stopped; its state and log kept only if the test failed
    std::string cmd;
    fs::path state;
    ~Stop() {
      (void)std::system(cmd.c_str());
      if (::testing::Test::HasFailure()) return;
      std::error_code ec;
      fs::remove_all(state, ec);
      fs::remove(state.string() + ".log", ec);
    }
  } stop{proxy + " stop '" + state.string() + "' > /dev/null 2>&1", state};

  testutil::S3TestServer srv = ceph;  // the same server, reached through the proxy
  std::ifstream env(state / "server.env");
  for (std::string line; std::getline(env, line);) {
    if (line.rfind("endpoint=", 0) == 0) srv.endpoint = line.substr(9);
    if (line.rfind("control=", 0) == 0) srv.control = line.substr(8);
  }
  ASSERT_FALSE(srv.control.empty()) << "no control= in " << (state / "server.env");
  std::string resp;
  ASSERT_TRUE(testutil::s3_fault_set_rules(srv, "fault=corrupt op=UploadPart path='[?&]partNumber=2(&|$)' count=1",
                                           &resp))
      << resp;
  s3::S3Config config = testutil::s3_test_config(srv);
  ASSERT_TRUE(config.sign_payloads);
  auto store = testutil::open_s3_test_store(&config);
  ASSERT_TRUE(store.ok()) << store.status().to_string();

  auto big = random_bytes(3 * kS3TestPart + 1000, 22);
  const int32_t n = 3;
  const std::vector<LeafView> leaves = {
      LeafView::full("model", "params.w", DType::kUInt8, {static_cast<int64_t>(big.size())}, big.data()),
      LeafView::full("tx", "opt_state.count", DType::kInt32, {}, &n)};
  ManagerOptions mo;
  mo.chunk_size = kS3TestPart;
  CheckpointManager m(*store, mo);
  auto h = m.save(1, leaves);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(testutil::s3_fault_count(srv, "faults.corrupt"), 1);
  EXPECT_EQ(testutil::s3_fault_count(srv, "status.400"), 1) << "Ceph refused the damaged part";
  EXPECT_GE((*store)->s3_stats().retries, 1u);
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves[0].data.size(), big.size());
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size()), 0);
}

}  // namespace
}  // namespace ckptio
