// The read executor (src/restore/read_executor.h) on its own: what a failed
// batch becomes. Reads of one object on the memory backend, through a
// wrapper that fails every read() call whose requests touch a bad byte
// (damage: it fails each time) or fails the first call only (a transient
// fault), and counts the calls. The consumers check every delivered byte.
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "src/restore/read_executor.h"
#include "testutil/forwarding_storage.h"

namespace ckptio {
namespace {

constexpr uint64_t kReadBytes = 100;

std::byte byte_at(uint64_t pos) { return static_cast<std::byte>((pos * 131 + 7) & 0xff); }

class FailingReads final : public testutil::ForwardingStorage {
 public:
  using ForwardingStorage::ForwardingStorage;
  Status read(std::span<const ReadRequest> requests) override {
    ++calls;
    {
      char name[16] = {};
      pthread_getname_np(pthread_self(), name, sizeof name);
      std::lock_guard lock(mu);
      threads.insert(name);
    }
    if (fail_first && calls == 1) return Status(Code::kUnavailable, "injected transient fault");
    for (const ReadRequest& r : requests)
      for (uint64_t bad : bad_bytes)
        if (bad >= r.offset && bad < r.offset + r.length)
          return Status(Code::kDataLoss, "damaged byte " + std::to_string(bad));
    return ForwardingStorage::read(requests);
  }
  std::set<uint64_t> bad_bytes;
  bool fail_first = false;
  std::atomic<int> calls{0};
  std::mutex mu;
  std::set<std::string> threads;  // the names of the threads read() ran on
};

// Records what it is handed. `stop_at_failure`: a restore's consumer (the
// first failed read is the error); otherwise verify's (noted, goes on).
class Recorder final : public ReadConsumer {
 public:
  Recorder(const std::vector<ExecRead>& reads, bool stop_at_failure) : reads_(reads), stop_(stop_at_failure) {}
  Status landed(size_t i, const std::byte* bytes) override {
    order.push_back(i);
    const ExecRead& r = reads_[i];
    for (uint64_t b = 0; b < r.length; ++b)
      if (bytes[b] != byte_at(r.offset + b)) return Status(Code::kInternal, "wrong byte in read " + std::to_string(i));
    return Status::OK();
  }
  Status failed(size_t i, Status st) override {
    order.push_back(i);
    failures.push_back(i);
    return stop_ ? st.annotate("read " + std::to_string(i)) : Status::OK();
  }
  std::vector<size_t> order;     // landed and failed, as handed over
  std::vector<size_t> failures;

 private:
  const std::vector<ExecRead>& reads_;
  const bool stop_;
};

class ReadExecutorFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mem = make_memory_storage(false);
    std::vector<std::byte> data(kObjectBytes);
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = byte_at(i);
    ASSERT_TRUE(mem->put("obj", data).ok());
    storage_ = std::make_shared<FailingReads>(mem);
  }
  // n reads of kReadBytes, every fourth a zero-length one between them.
  std::vector<ExecRead> reads(size_t n) const {
    std::vector<ExecRead> r;
    for (size_t i = 0; i < n; ++i) r.push_back(ExecRead{0, (i * kReadBytes) % kObjectBytes, i % 4 == 3 ? 0 : kReadBytes});
    return r;
  }
  Status run(std::vector<ExecRead>* r, Recorder& rec) {
    return execute_reads(*storage_, keys_, r, rec, ReadExecutorLimits{}, "test reads");
  }

  static constexpr uint64_t kObjectBytes = 2000 * kReadBytes;
  std::shared_ptr<FailingReads> storage_;
  const std::vector<std::string> keys_{"obj"};
};

TEST_F(ReadExecutorFailure, ABatchWithDamageIsNarrowedByHalvingAndEveryOtherReadIsDelivered) {
  std::vector<ExecRead> r = reads(2000);  // one batch
  const std::vector<size_t> bad = {1, 1000, 1998};
  for (size_t i : bad) storage_->bad_bytes.insert(r[i].offset + 5);
  Recorder rec(r, /*stop_at_failure=*/false);
  Status st = run(&r, rec);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(rec.failures, bad);
  ASSERT_EQ(rec.order.size(), r.size());
  for (size_t i = 0; i < rec.order.size(); ++i) ASSERT_EQ(rec.order[i], i) << "handed over out of order";
  // Read by read this took 1,501 calls (one per read of bytes); halving takes
  // about 2 log2(n) per bad read.
  EXPECT_LE(storage_->calls.load(), 1 + 3 * 2 * 11) << "read() calls";
}

TEST_F(ReadExecutorFailure, ARestoreStopsAtTheFirstReadThatFailsOnItsOwn) {
  std::vector<ExecRead> r = reads(2000);
  storage_->bad_bytes = {r[1200].offset, r[1500].offset};
  Recorder rec(r, /*stop_at_failure=*/true);
  Status st = run(&r, rec);
  EXPECT_EQ(st.code(), Code::kDataLoss);
  EXPECT_EQ(st.message(), "read 1200: damaged byte " + std::to_string(r[1200].offset)) << st.to_string();
  EXPECT_EQ(rec.failures, std::vector<size_t>{1200});
  ASSERT_EQ(rec.order.size(), 1201u);  // every read before it delivered, none after
  EXPECT_LE(storage_->calls.load(), 1 + 2 * 11) << "read() calls";
}

TEST_F(ReadExecutorFailure, ATransientFailureOfTheBatchIsReturnedAfterEveryReadIsDelivered) {
  std::vector<ExecRead> r = reads(2000);
  storage_->fail_first = true;
  Recorder rec(r, /*stop_at_failure=*/true);
  Status st = run(&r, rec);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  EXPECT_EQ(st.message(), "test reads: injected transient fault");
  EXPECT_TRUE(rec.failures.empty());
  EXPECT_EQ(rec.order.size(), r.size());
  // (The batch; then, each left half reading whole, the right one is
  // taken for the culprit and halved: about log2(n) calls, not n.)
  EXPECT_LE(storage_->calls.load(), 1 + 2 * 11) << "read() calls";
}

TEST_F(ReadExecutorFailure, ABatchOfOneReadIsReadAgainAlone) {
  std::vector<ExecRead> r = reads(1);
  storage_->fail_first = true;
  Recorder rec(r, /*stop_at_failure=*/true);
  EXPECT_EQ(run(&r, rec).code(), Code::kUnavailable);
  EXPECT_EQ(rec.order, std::vector<size_t>{0});
  storage_->calls = 0;
  storage_->fail_first = false;
  storage_->bad_bytes = {0};
  Recorder rec2(r, /*stop_at_failure=*/false);
  EXPECT_TRUE(run(&r, rec2).ok());
  EXPECT_EQ(rec2.failures, std::vector<size_t>{0});
  EXPECT_EQ(storage_->calls.load(), 2);
}

// A filler (read only to join its neighbours' requests) that fails on its
// own loses nothing: it is not handed over, and the batch's error is
// returned, as for a transient failure.
TEST_F(ReadExecutorFailure, AFillerThatFailsAloneIsNotAFailedRead) {
  std::vector<ExecRead> r = {ExecRead{0, 0, 100}, ExecRead{0, 100, 50, nullptr, /*filler=*/true},
                             ExecRead{0, 150, 100}};
  storage_->bad_bytes = {120};
  Recorder rec(r, /*stop_at_failure=*/true);
  Status st = run(&r, rec);
  EXPECT_EQ(st.code(), Code::kDataLoss);
  EXPECT_TRUE(rec.failures.empty());
  EXPECT_EQ(rec.order, (std::vector<size_t>{0, 2}));
}

// Batches are read on threads of their own, named for top -H, gdb and the
// allocation sweeps (src/util/async.h); the caller's thread keeps its name.
TEST_F(ReadExecutorFailure, BatchesAreReadOnThreadsNamedCkptioRead) {
  char before[16] = {};
  pthread_getname_np(pthread_self(), before, sizeof before);
  std::vector<ExecRead> r = reads(2000);
  Recorder rec(r, /*stop_at_failure=*/false);
  ASSERT_TRUE(run(&r, rec).ok());
  EXPECT_EQ(storage_->threads, std::set<std::string>{"ckptio-read"});
  char after[16] = {};
  pthread_getname_np(pthread_self(), after, sizeof after);
  EXPECT_STREQ(after, before);
}

}  // namespace
}  // namespace ckptio
