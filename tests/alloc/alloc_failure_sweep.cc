// Allocation failure swept across a save, one allocation at a time: for
// n = 1, 2, ... the n-th allocation one thread makes for one save throws
// std::bad_alloc (failing_new.h), until a save makes fewer than n. The
// thread is the save's worker (the write stage: creating the files,
// queueing the writes; the commit; retention), or the caller's during
// save() (planning and, in copy mode, its share of the copy).
//
// Each save must end in a status: committed (the failure was absorbed), or
// failed with kResourceExhausted; never a crash, a hang, or a partial step.
// After each, the latest committed step restores bit-exact, every committed
// step restores, and the next save works; after the sweep, gc() leaves
// nothing but committed steps (docs/reliability.md, "Out of memory"). The
// ring's and the HTTP client's threads, and the copy crew's, are not failed.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "alloc/failing_new.h"
#include "ckptio/local.h"
#include "testutil/backend_fixture.h"
#include "testutil/leftovers.h"
#include "testutil/owned_leaves.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

using testutil::OwnedLeaf;

std::vector<OwnedLeaf> small_state(uint64_t seed) {
  using testutil::make_leaf;
  std::vector<OwnedLeaf> s;
  s.push_back(make_leaf("model", "params.embed", DType::kFloat32, {300, 17}, seed + 1));
  s.push_back(make_leaf("model", "params.scalar", DType::kFloat64, {}, seed + 2));
  s.push_back(make_leaf("model", "params.empty", DType::kInt32, {0, 5}, seed + 3));
  s.push_back(make_leaf("tx", "opt_state.mu", DType::kBFloat16, {700, 33}, seed + 4));
  // Over kMinDirectRunBytes: borrow mode writes it from here, zero copy.
  s.push_back(make_leaf("tx", "opt_state.nu", DType::kFloat32, {520, 520}, seed + 5));
  return s;
}

class AllocSweep : public testutil::S3BackendTest {
 protected:
  AllocSweep() : S3BackendTest("ckptio-alloc-") {}
  // The store to sweep: the fixture's, but on local disk one whose ring
  // requests are a quarter of a write range, so that a write is several
  // pieces and a failure can come with some of them in flight.
  std::shared_ptr<Storage> store() {
    if (GetParam() != testutil::Backend::kLocal) return faults_;
    LocalOptions lo;
    lo.request_size = kChunk / 4;
    auto local = make_local_storage((dir_ / "quarter-requests").string(), lo);
    EXPECT_TRUE(local.ok()) << local.status().to_string();
    return local.ok() ? make_fault_storage(*local) : faults_;
  }
  static constexpr uint64_t kChunk = 64 * 1024;
};

// Whose allocations fail: the worker's (the write stage, the commit,
// retention), or the caller's during save() (planning; in copy mode the
// copy into staging buffers, which the caller's thread shares with the crew).
enum class Failing { kWorker, kCaller };

void sweep(const std::shared_ptr<Storage>& storage, StagingMode staging, uint64_t chunk, Failing who) {
  ManagerOptions o;
  o.chunk_size = chunk;  // several ranges per file, several writes in flight
  o.staging = staging;
  o.max_to_keep = 2;  // retention runs on the worker after each commit
  std::atomic<std::thread::id> worker{};
  o.on_commit = [&](const CommitEvent&) { worker.store(std::this_thread::get_id()); };
  CheckpointManager m(storage, o);

  // What the latest committed step must restore to.
  std::vector<OwnedLeaf> committed = small_state(1000);
  ASSERT_TRUE(m.save(1, testutil::views(committed)).value().wait().ok());
  ASSERT_TRUE(m.wait_until_finished().ok());
  ASSERT_NE(worker.load(), std::thread::id{});

  int failed = 0, absorbed = 0;
  int64_t step = 1, committed_step = 1;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the " +
                 (who == Failing::kWorker ? "worker" : "caller") + " fails");
    ++step;
    std::vector<OwnedLeaf> state = small_state(1000 + step);
    std::vector<LeafView> leaves = testutil::views(state);
    // The worker is idle (waited for above): counting starts with the job.
    // The caller's count starts in save() and ends as it returns.
    testutil::fail_nth_allocation(who == Failing::kWorker ? worker.load() : std::this_thread::get_id(), n);
    auto h = m.save(step, std::move(leaves));
    bool fired = who == Failing::kCaller && testutil::disarm_allocation_failure();
    const Status st = h.ok() ? h->wait() : h.status();
    (void)m.wait_until_finished();  // retention, and the attempt leaves the set in flight
    if (who == Failing::kWorker) fired = testutil::disarm_allocation_failure();
    if (!fired) {  // the save made fewer than n allocations: the sweep is over
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_GT(n, 20) << "a save allocates more than this: is the sweep armed on the right thread?";
      committed = std::move(state);
      break;
    }
    if (st.ok()) {
      ++absorbed;
      committed = std::move(state);
    } else {
      ++failed;
      EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
    }
    // Never a partial step: the latest is the last committed save, or this
    // one when its failure came after the commit (the outcome unknown).
    auto r = m.restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (st.ok()) {
      ASSERT_EQ(r->step, step);
    } else if (r->step == step) {
      committed = std::move(state);
    } else {
      ASSERT_EQ(r->step, committed_step) << st.to_string();
    }
    committed_step = r->step;
    testutil::expect_restored(*r, committed);
    if (::testing::Test::HasFatalFailure()) return;
    // Every committed step still restores (and a retention that failed left
    // no step marked as leaving, which a restore would wait on forever).
    auto steps = m.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    for (int64_t s : *steps) {
      auto old = m.restore(s);
      EXPECT_TRUE(old.ok()) << "step " << s << ": " << old.status().to_string();
    }
    // The manager goes on: a save without a failure commits, and its
    // retention removes what the failed one may have kept; gc() the rest.
    // (Else the leftovers pile up, and n never gets past listing them.)
    ++step;
    committed = small_state(1000 + step);
    const Status next = m.save(step, testutil::views(committed)).value().wait();
    ASSERT_TRUE(next.ok()) << "the save after the failure: " << next.to_string();
    ASSERT_TRUE(m.wait_until_finished().ok());
    committed_step = step;
    ASSERT_TRUE(m.gc().ok());  // and what a failure left behind (retired steps, attempts)
  }
  ASSERT_TRUE(m.gc().ok());
  testutil::Leftovers left = testutil::find_leftovers(m);
  ASSERT_TRUE(left.status.ok()) << left.status.to_string();
  EXPECT_TRUE(left.empty()) << left.describe();
  std::printf("sweep: %d saves failed, %d absorbed their failure\n", failed, absorbed);
}

TEST_P(AllocSweep, EachAllocationOfTheSaveWorkerFailsOnlyThatSaveCopyMode) {
  sweep(store(), StagingMode::kCopy, kChunk, Failing::kWorker);
}
TEST_P(AllocSweep, EachAllocationOfTheSaveWorkerFailsOnlyThatSaveBorrowMode) {
  sweep(store(), StagingMode::kBorrow, kChunk, Failing::kWorker);
}
TEST_P(AllocSweep, EachAllocationOfTheCallersSaveFailsOnlyThatSaveCopyMode) {
  sweep(store(), StagingMode::kCopy, kChunk, Failing::kCaller);
}
TEST_P(AllocSweep, EachAllocationOfTheCallersSaveFailsOnlyThatSaveBorrowMode) {
  sweep(store(), StagingMode::kBorrow, kChunk, Failing::kCaller);
}

INSTANTIATE_TEST_SUITE_P(Backends, AllocSweep, testutil::local_backends(), testutil::backend_name);

// Moto: the S3 writer's paths (one PUT per small object, a multipart upload
// per large one), and the requests the worker queues for the HTTP client.
// Each step there takes ~0.4 s (a save, two restores, a save, a gc against
// the server), so the worker is swept once, in borrow mode (copy mode's
// worker differs in what it takes from the copiers, swept above).
class AllocSweepS3 : public AllocSweep {};
TEST_P(AllocSweepS3, EachAllocationOfTheSaveWorkerFailsOnlyThatSaveBorrowMode) {
  sweep(store(), StagingMode::kBorrow, kChunk, Failing::kWorker);
}
TEST_P(AllocSweepS3, EachAllocationOfTheCallersSaveFailsOnlyThatSaveCopyMode) {
  sweep(store(), StagingMode::kCopy, kChunk, Failing::kCaller);
}
INSTANTIATE_TEST_SUITE_P(Backends, AllocSweepS3, ::testing::Values(testutil::Backend::kS3Moto),
                         testutil::backend_name);

}  // namespace
}  // namespace ckptio
