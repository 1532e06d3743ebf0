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
// ring's and the copy crew's threads are not failed (the crew runs the
// caller's copy code, swept on the caller; the ring's completions allocate
// nothing); the other library threads are, each in a sweep of its own: the
// reaper, the eformer writer's, a conversion's restorer, the S3 credentials
// renewer, and the HTTP client's (S3MotoAllocSweep, at the end). The
// one-call threads of src/util/async.h (a restore's reads, the index's
// second half) hand what they throw to the caller, swept on its thread.
//
// And a restore's, on the caller's thread: the latest step bit-exact, or
// kResourceExhausted; never an older step or another status.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "alloc/failing_new.h"
#include "backends/s3/credentials.h"
#include "ckptio/copy.h"
#include "ckptio/local.h"
#include "src/save/eformer_writer.h"
#include "testutil/backend_fixture.h"
#include "testutil/leftovers.h"
#include "testutil/owned_leaves.h"
#include "testutil/random_bytes.h"
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

// Write ranges (and staging chunks) of the sweeps: several per file.
constexpr uint64_t kChunk = 64 * 1024;

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
};

// Whose allocations fail: the worker's (the write stage, the commit,
// retention), or the caller's during save() (planning; in copy mode the
// copy into staging buffers, which the caller's thread shares with the crew).
enum class Failing { kWorker, kCaller };

// `retention` false: the worker runs no retention (the caller removes the
// old steps instead), for the eformer layout, whose retention lists and
// parses whole steps on the worker (~2,000 allocations a save; the restore
// sweeps reach that reader on the caller's thread).
// `staging_budget` 0: the default pool (the state fits it).
void sweep(const std::shared_ptr<Storage>& storage, StagingMode staging, uint64_t chunk, Failing who,
           const std::string& layout = "ckptio", bool retention = true, uint64_t staging_budget = 0) {
  ManagerOptions o;
  o.chunk_size = chunk;  // several ranges per file, several writes in flight
  o.staging = staging;
  if (staging_budget) o.staging_budget = staging_budget;
  o.layout = layout;
  o.max_to_keep = retention ? 2 : 0;  // retention runs on the worker after each commit
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
    if (!retention) {
      auto all = m.all_steps();
      ASSERT_TRUE(all.ok()) << all.status().to_string();
      for (int64_t s : *all)
        if (s != step) {
          const Status removed = m.remove_step(s);
          ASSERT_TRUE(removed.ok()) << "remove step " << s << ": " << removed.to_string();
        }
    }
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
// The eformer layout: the worker hands each shard to the eformer writer
// (src/save/eformer_save.cc), whose own threads encode and write the chunks.
// ~500 allocations a save: on the memory stores only (AllocSweepMemory;
// on local disk each chunk is a file of its own, made durable: 35 s).
class AllocSweepMemory : public AllocSweep {};
// A pool of 4 chunks for a state of ~20: the copiers wait for buffers that
// only the worker's writes give back. Before, a failure of the worker's
// first allocations (before it queued a write) left them waiting for good,
// and save() with them.
TEST_P(AllocSweepMemory, EachAllocationOfTheSaveWorkerFailsOnlyThatSaveWithAPoolSmallerThanTheState) {
  sweep(store(), StagingMode::kCopy, kChunk, Failing::kWorker, "ckptio", true, 4 * kChunk);
}
TEST_P(AllocSweepMemory, EachAllocationOfAnEformerSavesWorkerFailsOnlyThatSave) {
  sweep(store(), StagingMode::kBorrow, kChunk, Failing::kWorker, "eformer", false);
}
// The eformer writer's own threads (src/save/eformer_writer.cc), one of each
// kind: its encoder ("ckptio-encode": zstd into pooled buffers, the chunk's
// I/O job) and its chunk writer ("ckptio-zarr-io": each chunk object made,
// written, finished). For n = 1, 2, ... the n-th allocation of that thread
// in one step's writing throws: commit() is OK (the step restores bit-exact)
// or kResourceExhausted (no step, and gc() leaves nothing); never a hang.
void sweep_eformer_thread(const std::shared_ptr<Storage>& storage, const std::string& thread) {
  zarr::EformerWriteOptions o;
  o.threads = 1;
  o.io_threads = 1;
  CheckpointManager m(storage, {});
  int failed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of " + thread + " fails");
    const std::vector<OwnedLeaf> state = small_state(n);
    auto w = zarr::EformerStepWriter::start(*storage, "run-" + std::to_string(n), n, o);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::optional<pid_t> task;  // (a thread names itself as it starts)
    for (int i = 0; i < 1000 && !(task = testutil::task_named(thread)); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(task) << "not exactly one thread named " << thread;
    testutil::fail_nth_allocation_of_task(*task, n);
    Status st;
    for (const OwnedLeaf& l : state) {
      // Two chunks a 2-D leaf (rows split), one else.
      Shape chunks = l.shape;
      if (chunks.size() == 2 && chunks[0] > 1) chunks[0] = (chunks[0] + 1) / 2;
      for (auto& c : chunks) c = std::max<decltype(c + 0)>(c, 1);  // zarr: chunks >= 1
      auto id = (*w)->add_array(l.prefix, l.path, l.dtype, l.shape, chunks);
      if (!id.ok()) {
        st = id.status();
        break;
      }
      st = (*w)->write_box(*id, Box::whole(l.shape), std::span<const std::byte>(l.bytes));
      if (!st.ok()) break;
    }
    const Status committed = st.ok() ? (*w)->commit() : st;
    w->reset();  // joins the writer's threads: nothing of this step runs on
    const bool fired = testutil::disarm_allocation_failure();
    if (!fired) {
      ASSERT_TRUE(committed.ok()) << committed.to_string();
      EXPECT_GT(n, 10) << "too few allocations on " << thread << ": is the sweep armed on it?";
      break;
    }
    auto steps = m.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    const bool listed = std::find(steps->begin(), steps->end(), n) != steps->end();
    if (committed.ok()) {
      ASSERT_TRUE(listed);
      auto r = m.restore(n);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      testutil::expect_restored(*r, state);
    } else {
      ++failed;
      EXPECT_EQ(committed.code(), Code::kResourceExhausted) << committed.to_string();
      EXPECT_FALSE(listed) << "a failed commit left step " << n;
    }
    if (::testing::Test::HasFailure()) return;
  }
  ASSERT_TRUE(m.gc().ok());
  testutil::Leftovers left = testutil::find_leftovers(m);
  ASSERT_TRUE(left.status.ok()) << left.status.to_string();
  EXPECT_TRUE(left.empty()) << left.describe();
  std::printf("sweep: %d commits failed\n", failed);
}
TEST_P(AllocSweepMemory, EachAllocationOfTheEformerEncoderFailsOnlyItsStep) {
  sweep_eformer_thread(store(), "ckptio-encode");
}
TEST_P(AllocSweepMemory, EachAllocationOfTheEformerChunkWriterFailsOnlyItsStep) {
  sweep_eformer_thread(store(), "ckptio-zarr-io");
}
// write_box() on the caller's thread marks its box's chunks written, then
// queues them: for n = 1, 2, ... its n-th allocation throws. A caller that
// commits anyway (the exception ignored) gets a failed commit() or a step
// that restores bit-exact. Before, the chunks not queued stayed marked
// written, and commit() made a step naming chunks never written.
TEST_P(AllocSweepMemory, EachAllocationOfWriteBoxFailsTheCommitOrNothing) {
  const std::shared_ptr<Storage> storage = store();
  CheckpointManager m(storage, {});
  int threw = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of write_box fails");
    const std::vector<OwnedLeaf> state = small_state(n);
    zarr::EformerWriteOptions o;
    o.compressor.id = zarr::CodecId::kNone;  // each chunk copied on the caller's thread
    auto w = zarr::EformerStepWriter::start(*storage, "run-" + std::to_string(n), n, o);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::vector<size_t> ids;
    for (const OwnedLeaf& l : state) {
      Shape chunks = l.shape;  // two chunks a 2-D leaf (rows split), one else
      if (chunks.size() == 2 && chunks[0] > 1) chunks[0] = (chunks[0] + 1) / 2;
      for (auto& c : chunks) c = std::max<decltype(c + 0)>(c, 1);
      auto id = (*w)->add_array(l.prefix, l.path, l.dtype, l.shape, chunks);
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    testutil::fail_nth_allocation(std::this_thread::get_id(), n);
    for (size_t i = 0; i < state.size(); ++i) {
      try {
        (void)(*w)->write_box(ids[i], Box::whole(state[i].shape), std::span<const std::byte>(state[i].bytes));
      } catch (const std::bad_alloc&) {
        ++threw;
      }
    }
    const bool fired = testutil::disarm_allocation_failure();
    const Status committed = (*w)->commit();
    w->reset();
    auto steps = m.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    const bool listed = std::find(steps->begin(), steps->end(), n) != steps->end();
    EXPECT_EQ(listed, committed.ok()) << committed.to_string();
    if (committed.ok()) {
      auto r = m.restore(n);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      testutil::expect_restored(*r, state);
    }
    if (!fired) {
      ASSERT_TRUE(committed.ok()) << committed.to_string();
      EXPECT_GT(n, 3) << "too few allocations in write_box: is the sweep armed on this thread?";
      break;
    }
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("sweep: write_box threw %d times\n", threw);
}

// The manager's reaper ("ckptio-reap", src/save/pipeline.cc): after a
// commit, retention retires the oldest step at once (out of the committed
// set) and the reaper removes its bytes in the background. For n = 1, 2, ...
// the n-th allocation the reaper makes removing one step throws: the process
// goes on, the save that retired the step is not failed by it, the latest
// step restores bit-exact, the retired step is never listed again, and gc()
// removes what the reaper left.
void sweep_reaper(const std::shared_ptr<Storage>& storage) {
  ManagerOptions o;
  o.max_to_keep = 1;
  CheckpointManager m(storage, o);
  std::vector<OwnedLeaf> state = small_state(1);
  ASSERT_TRUE(m.save(1, testutil::views(state)).value().wait().ok());
  ASSERT_TRUE(m.wait_until_finished().ok());
  std::optional<pid_t> task;  // (the thread names itself as it starts)
  for (int i = 0; i < 1000 && !(task = testutil::task_named("ckptio-reap")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(task) << "not exactly one thread named ckptio-reap";
  int fired_count = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the reaper fails");
    const int64_t step = n + 1;
    state = small_state(step);
    testutil::fail_nth_allocation_of_task(*task, n);
    const Status saved = m.save(step, testutil::views(state)).value().wait();
    const Status finished = m.wait_until_finished();  // the reaper's removal done
    const bool fired = testutil::disarm_allocation_failure();
    ASSERT_TRUE(saved.ok()) << saved.to_string();
    ASSERT_TRUE(finished.ok()) << finished.to_string();
    auto steps = m.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    EXPECT_EQ(*steps, std::vector<int64_t>{step});
    auto r = m.restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->step, step);
    testutil::expect_restored(*r, state);
    if (!fired) {
      EXPECT_GT(n, 3) << "too few allocations on the reaper: is the sweep armed on it?";
      break;
    }
    ++fired_count;
    ASSERT_TRUE(m.gc().ok());
    testutil::Leftovers left = testutil::find_leftovers(m);
    ASSERT_TRUE(left.status.ok()) << left.status.to_string();
    EXPECT_TRUE(left.empty()) << left.describe();
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("sweep: %d removals met a refused allocation\n", fired_count);
}
// On local disk (the retired step's directory removed, ~6 allocations) and
// on moto (AllocSweepS3: listed and deleted in batches). On the memory
// stores the removal allocates nothing.
class AllocSweepLocal : public AllocSweep {};
TEST_P(AllocSweepLocal, EachAllocationOfTheReaperFailsOnlyItsRemoval) { sweep_reaper(store()); }

TEST_P(AllocSweep, EachAllocationOfTheCallersEformerSaveFailsOnlyThatSave) {
  sweep(store(), StagingMode::kCopy, kChunk, Failing::kCaller, "eformer", false);
}

// The same for restore(), on the caller's thread: for n = 1, 2, ... the n-th
// allocation of one restore throws. The restore returns the latest step
// bit-exact, or kResourceExhausted: never another status (an out-of-memory
// called damage would send a restart to an older step), never an older step,
// never an exception out of the API. Whole leaves, and into a sharding (two
// devices, rows split; the planner, the executor and the device buffers).
void sweep_restore(const std::shared_ptr<Storage>& storage, bool sharded, const std::string& layout = "ckptio") {
  ManagerOptions o;
  o.chunk_size = kChunk;
  o.layout = layout;
  CheckpointManager m(storage, o);
  const std::vector<OwnedLeaf> older = small_state(1), latest = small_state(2);
  ASSERT_TRUE(m.save(1, testutil::views(older)).value().wait().ok());
  ASSERT_TRUE(m.save(2, testutil::views(latest)).value().wait().ok());

  RestoreOptions ro;
  if (sharded) {
    RestoreOptions::Sharding sh;
    sh.mesh = Mesh::create({{"dp", 2}}).value();
    for (const OwnedLeaf& l : latest) {
      PartitionSpec spec;  // scalars and empty leaves: replicated
      if (l.shape.size() == 2 && l.shape[0] > 0) spec = PartitionSpec::of({{"dp"}, {}});
      else if (l.shape.size() == 2) spec = PartitionSpec::of({{}, {}});
      sh.leaves.push_back(LeafSharding{l.prefix, l.path, l.shape, spec, -1});
    }
    ro.sharding = std::move(sh);
  }
  // What a restore without a failure gives: the reference.
  auto want = m.restore(std::nullopt, ro);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_EQ(want->step, 2);
  if (!sharded) testutil::expect_restored(*want, latest);
  auto same = [&](const RestoredState& got) {
    ASSERT_EQ(got.leaves.size(), want->leaves.size());
    for (size_t i = 0; i < got.leaves.size(); ++i) {
      const Tensor &g = got.leaves[i], &w = want->leaves[i];
      EXPECT_EQ(g.path, w.path);
      ASSERT_EQ(g.data.size(), w.data.size()) << g.path;
      if (g.data.size()) EXPECT_EQ(std::memcmp(g.data.data(), w.data.data(), g.data.size()), 0) << g.path;
      ASSERT_EQ(g.device_shards.size(), w.device_shards.size()) << g.path;
      for (size_t d = 0; d < g.device_shards.size(); ++d) {
        const Buffer &gb = g.device_shards[d].data, &wb = w.device_shards[d].data;
        ASSERT_EQ(gb.size(), wb.size()) << g.path << " device " << d;
        if (gb.size()) EXPECT_EQ(std::memcmp(gb.data(), wb.data(), gb.size()), 0) << g.path << " device " << d;
      }
    }
  };

  int failed = 0, absorbed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the restore fails");
    testutil::fail_nth_allocation(std::this_thread::get_id(), n);
    Result<RestoredState> r = Status(Code::kInternal, "not run");
    try {
      r = m.restore(std::nullopt, ro);
    } catch (const std::exception& e) {
      testutil::disarm_allocation_failure();
      FAIL() << "restore() threw " << e.what();
    }
    const bool fired = testutil::disarm_allocation_failure();
    if (!fired) {
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_GT(n, 20) << "a restore allocates more than this";
      same(*r);
      break;
    }
    if (r.ok()) {
      ++absorbed;
      ASSERT_EQ(r->step, 2) << "an older step, for want of memory";
      same(*r);
    } else {
      ++failed;
      ASSERT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().to_string();
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("sweep: %d restores failed, %d absorbed their failure\n", failed, absorbed);
}

// The manager's other calls, on the caller's thread: each returns its answer
// or kResourceExhausted, never another status (verify() never calls an
// intact step damaged for want of memory) and never an exception.
TEST_P(AllocSweep, EachAllocationOfTheManagersOtherCallsFailsOnlyThatCall) {
  ManagerOptions o;
  o.chunk_size = kChunk;
  CheckpointManager m(store(), o);
  const std::vector<OwnedLeaf> state = small_state(7);
  ASSERT_TRUE(m.save(1, testutil::views(state)).value().wait().ok());
  ASSERT_TRUE(m.save(2, testutil::views(state)).value().wait().ok());
  // Each call disarms the failure as soon as it returns (stop()), so that
  // the checks of its answer, which allocate too, are not failed.
  bool fired = false;
  auto stop = [&] { fired = testutil::disarm_allocation_failure(); };
  struct Call {
    const char* name;
    std::function<Status()> run;  // the call's status; its answer checked here
  };
  const std::vector<Call> calls = {
      {"latest_step", [&]() -> Status {
         auto r = m.latest_step();
         stop();
         if (r.ok() && *r != std::optional<int64_t>(2)) return internal_error("latest_step is not 2");
         return r.status();
       }},
      {"all_steps", [&]() -> Status {
         auto r = m.all_steps();
         stop();
         if (r.ok() && *r != std::vector<int64_t>{1, 2}) return internal_error("all_steps is not {1, 2}");
         return r.status();
       }},
      {"read_index", [&]() -> Status {
         auto r = m.read_index(2);
         stop();
         if (r.ok() && r->step != 2) return internal_error("read_index(2) is another step's");
         return r.status();
       }},
      {"verify", [&] {
         Status st = m.verify(2);
         stop();
         return st;
       }},
      {"gc", [&] {
         Status st = m.gc();
         stop();
         return st;
       }},
  };
  for (const Call& c : calls) {
    SCOPED_TRACE(c.name);
    int failed = 0;
    for (int64_t n = 1;; ++n) {
      SCOPED_TRACE("allocation " + std::to_string(n) + " fails");
      fired = false;
      testutil::fail_nth_allocation(std::this_thread::get_id(), n);
      Status st = internal_error("not run");
      try {
        st = c.run();
      } catch (const std::exception& e) {
        testutil::disarm_allocation_failure();
        FAIL() << c.name << "() threw " << e.what();
      }
      if (!fired) {
        ASSERT_TRUE(st.ok()) << st.to_string();
        break;
      }
      if (!st.ok()) {
        ++failed;
        ASSERT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
      }
    }
    EXPECT_GT(failed, 0) << c.name << "() never failed: is the sweep armed on the right thread?";
  }
  // Nothing was lost on the way: both steps are there and restore.
  ASSERT_EQ(m.all_steps().value(), (std::vector<int64_t>{1, 2}));
  for (int64_t s : {1, 2}) {
    auto r = m.restore(s);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    testutil::expect_restored(*r, state);
  }
}

// CheckpointManager::open, which makes the backend (a local ring and its
// thread), the staging pool, the crew, the worker and the reaper: a manager
// or kResourceExhausted, and a failed open leaves no thread behind.
TEST_P(AllocSweep, EachAllocationOfOpenFailsOnlyThatOpen) {
  const std::string uri = GetParam() == testutil::Backend::kLocal
                              ? (dir_ / "open").string()
                              : "mem://alloc-open-" + std::to_string(::getpid()) + "-" +
                                    testutil::backend_label(GetParam());
  ManagerOptions o;
  o.chunk_size = kChunk;
  o.max_to_keep = 3;  // a reaper thread too
  const std::vector<OwnedLeaf> state = small_state(9);
  {
    auto m = CheckpointManager::open(uri, o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_TRUE((*m)->save(5, testutil::views(state)).value().wait().ok());
  }
  int failed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of open() fails");
    testutil::fail_nth_allocation(std::this_thread::get_id(), n);
    Result<std::unique_ptr<CheckpointManager>> m = Status(Code::kInternal, "not run");
    try {
      m = CheckpointManager::open(uri, o);
    } catch (const std::exception& e) {
      testutil::disarm_allocation_failure();
      FAIL() << "open() threw " << e.what();
    }
    const bool fired = testutil::disarm_allocation_failure();
    if (!m.ok()) {
      ++failed;
      ASSERT_TRUE(fired) << m.status().to_string();
      ASSERT_EQ(m.status().code(), Code::kResourceExhausted) << m.status().to_string();
      continue;
    }
    // A manager opened, whatever it was refused on the way, works.
    auto latest = (*m)->latest_step();
    ASSERT_TRUE(latest.ok()) << latest.status().to_string();
    ASSERT_EQ(*latest, std::optional<int64_t>(5));
    if (!fired) break;
  }
  EXPECT_GT(failed, 0) << "open() never failed: is the sweep armed on the right thread?";
  auto m = CheckpointManager::open(uri, o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto r = (*m)->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  testutil::expect_restored(*r, state);
}

TEST_P(AllocSweep, EachAllocationOfARestoreFailsOnlyThatRestore) { sweep_restore(store(), false); }
TEST_P(AllocSweep, EachAllocationOfAShardedRestoreFailsOnlyThatRestore) { sweep_restore(store(), true); }
// Steps in the eformer layout: the zarr reader (.zarray files, chunk decoding).
TEST_P(AllocSweep, EachAllocationOfAnEformerRestoreFailsOnlyThatRestore) {
  sweep_restore(store(), false, "eformer");
}
TEST_P(AllocSweep, EachAllocationOfAShardedEformerRestoreFailsOnlyThatRestore) {
  sweep_restore(store(), true, "eformer");
}
// The decode threads ("ckptio-decode") of an eformer restore whose chunks
// are large (24 MiB, random, so compressed about as large): the n-th of
// their allocations throws (n = 1: a thread's first, its decoder). The
// restore returns OK or kResourceExhausted, at once. Before, the chunk whose
// task threw (or was dropped uncalled) stayed counted as held, and the
// reader waited for room among the 64 MiB of compressed chunks for ever.
TEST_P(AllocSweepMemory, AnAllocationRefusedToADecodeThreadFailsTheRestoreWithoutAHang) {
  const std::shared_ptr<Storage> storage = store();
  ManagerOptions o;
  o.layout = "eformer";
  constexpr int64_t kRows = 4, kCols = int64_t{6} << 20;  // float32: 24 MiB a row, a chunk each
  const std::vector<std::byte> data = testutil::random_bytes(kRows * kCols * 4, 77);
  LeafView leaf{"model", "big", DType::kFloat32, {kRows, kCols}, {}};
  for (int64_t r = 0; r < kRows; ++r) leaf.shards.push_back({Box{{r, 0}, {r + 1, kCols}}, data.data() + r * kCols * 4});
  CheckpointManager m(storage, o);
  ASSERT_TRUE(m.save(1, {leaf}).value().wait().ok());
  int failed = 0;
  for (int64_t n : {1, 2, 3, 4, 6, 10, 16}) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the decode threads fails");
    testutil::fail_nth_allocation_of_threads_named("ckptio-decode", n);
    auto restoring = std::async(std::launch::async, [&m] { return m.restore(1); });
    if (restoring.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      std::fprintf(stderr, "restore still running 120 s after a decode thread's allocation %lld failed\n",
                   static_cast<long long>(n));
      std::_Exit(1);  // (the restore's threads hold the manager)
    }
    const bool fired = testutil::disarm_allocation_failure();
    auto r = restoring.get();
    if (!r.ok()) {
      ++failed;
      EXPECT_TRUE(fired) << r.status().to_string();
      EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().to_string();
      continue;
    }
    ASSERT_EQ(r->leaves.size(), 1u);
    ASSERT_EQ(r->leaves[0].data.size(), data.size());
    EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), data.data(), data.size()), 0);
  }
  EXPECT_GT(failed, 0) << "no restore failed: is the sweep armed on the decode threads?";
}

// copy_step, on the caller's thread (reading the indexes, planning, the
// reads and writes it queues, the commit): for n = 1, 2, ... the n-th
// allocation of one copy throws. The copy returns OK or kResourceExhausted;
// the destination then holds the step bit-exact or not at all (its earlier
// step intact), and gc() leaves nothing of a failed attempt. A copy within
// a layout streams the data files; across layouts it decodes and encodes
// (src/copy/convert.cc, with a restoring thread of its own, swept below).
struct CopyCase {
  const char* name;
  const char* src_layout;
  const char* format;  // CopyOptions::format
};
// `thread`: the threads of that name fail instead of the caller's (the
// conversion's restorer, "ckptio-cp-read", lives only inside the copy).
void sweep_copy(const std::shared_ptr<Storage>& src, const std::shared_ptr<Storage>& dst, const CopyCase& c,
                const char* thread = nullptr) {
  SCOPED_TRACE(std::string(c.name) + (thread ? std::string(", thread ") + thread : std::string()));
  ManagerOptions so;
  so.chunk_size = kChunk;
  so.layout = c.src_layout;
  CheckpointManager source(src, so);
  const std::vector<OwnedLeaf> first = small_state(21), second = small_state(22);
  ASSERT_TRUE(source.save(1, testutil::views(first)).value().wait().ok());
  ASSERT_TRUE(source.save(2, testutil::views(second)).value().wait().ok());
  CopyOptions co;
  co.format = c.format;
  co.chunk_size = kChunk;
  co.max_memory = 4 * kChunk;
  ASSERT_TRUE(copy_step(*src, *dst, 1, co).ok());
  CheckpointManager target(dst, ManagerOptions{});
  auto expect_step = [&](int64_t step, const std::vector<OwnedLeaf>& want) {
    auto r = target.restore(step);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status().to_string();
    testutil::expect_restored(*r, want);
  };

  int failed = 0, absorbed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the copy fails");
    if (thread)
      testutil::fail_nth_allocation_of_threads_named(thread, n);
    else
      testutil::fail_nth_allocation(std::this_thread::get_id(), n);
    Result<CopyStats> r = Status(Code::kInternal, "not run");
    try {
      r = copy_step(*src, *dst, 2, co);
    } catch (const std::exception& e) {
      testutil::disarm_allocation_failure();
      FAIL() << "copy_step() threw " << e.what();
    }
    const bool fired = testutil::disarm_allocation_failure();
    if (!fired) {
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_GT(n, thread ? 10 : 20) << "a copy allocates more than this: is the sweep armed on the right thread?";
      expect_step(2, second);
      break;
    }
    auto steps = target.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    if (r.ok()) {
      ++absorbed;
      ASSERT_EQ(*steps, (std::vector<int64_t>{1, 2}));
    } else {
      ++failed;
      ASSERT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().to_string();
    }
    // Committed or not there at all (a failure after the commit point
    // leaves it committed); the earlier step intact either way.
    if (steps->size() == 2) {
      expect_step(2, second);
      ASSERT_TRUE(target.remove_step(2).ok());
    }
    expect_step(1, first);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(target.all_steps().value(), std::vector<int64_t>{1});
    ASSERT_TRUE(target.gc().ok());
    testutil::Leftovers left = testutil::find_leftovers(target);
    ASSERT_TRUE(left.status.ok()) << left.status.to_string();
    ASSERT_TRUE(left.empty()) << left.describe();
  }
  EXPECT_GT(failed, 0) << "no copy failed: is the sweep armed on the right thread?";
  std::printf("sweep: %d copies failed, %d absorbed their failure\n", failed, absorbed);
}

constexpr CopyCase kCopyCases[] = {
    {"ckptio to ckptio (streamed)", "ckptio", ""},
    {"ckptio to eformer (encoded)", "ckptio", "eformer"},
    {"eformer to ckptio (decoded)", "eformer", "ckptio"},
};

// ~600-1,200 allocations a copy: on the memory stores only (21 s on local disk).
TEST_P(AllocSweepMemory, EachAllocationOfACopyFailsOnlyThatCopy) {
  for (const CopyCase& c : kCopyCases) {
    // Each case into a store of its own, from a store of its own.
    std::shared_ptr<Storage> src, dst;
    const bool posix = GetParam() == testutil::Backend::kMemoryPosix;
    src = make_memory_storage(posix);
    dst = make_memory_storage(posix);
    sweep_copy(src, dst, c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The S3 credentials renewer ("ckptio-creds", backends/s3/credentials.cc),
// over a fetch of its own that hands out sets living 300 ms (renewed at
// half their life, on the renewer). For n = 1, 2, ... the n-th allocation
// of the renewer throws: the process goes on, that renewal counts as failed
// and is retried, and the renewals after it succeed.
TEST(CredentialsAllocSweep, EachAllocationOfARenewalFailsOnlyThatRenewal) {
  using namespace std::chrono_literals;
  s3::RefreshOptions o;
  o.retry_after_s = 0.05;
  int failed = 0;
  int64_t n = 1;
  for (;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the renewer fails");
    std::atomic<int> calls{0};
    auto p = s3::CredentialProvider::start("fake", [&]() -> Result<s3::TimedCredentials> {
      const std::string id = "key-number-" + std::to_string(++calls);  // (allocates, as a real fetch does)
      return s3::TimedCredentials{s3::Credentials{id, "secret-" + id, "token-" + id},
                                  std::chrono::system_clock::now() + 300ms};
    }, o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    testutil::fail_nth_allocation_of_threads_named("ckptio-creds", n);
    // Three renewals after the first fetch, or give up after 5 s.
    for (int i = 0; i < 500 && (*p)->fetches() < 4; ++i) std::this_thread::sleep_for(10ms);
    const bool fired = testutil::disarm_allocation_failure();
    ASSERT_GE((*p)->fetches(), 4u) << (*p)->failed_fetches() << " failed renewals";
    EXPECT_EQ((*p)->current().session_token, "token-" + (*p)->current().access_key_id);
    if (!fired) {
      EXPECT_GT(n, 5) << "too few allocations on the renewer: is the sweep armed on it?";
      break;
    }
    failed += static_cast<int>((*p)->failed_fetches());
  }
  std::printf("sweep: %lld rounds, %d renewals failed\n", static_cast<long long>(n - 1), failed);
}

// Descriptors this process holds (/proc/self/fd).
size_t open_descriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// The local backend's writer: for n = 1, 2, ... the n-th allocation of its
// finish() throws. The object is then not there, and neither its
// descriptor nor its temporary file is left. Before, finish() marked the
// object closed first, so what threw after (the fsync's submission, an
// error's text) leaked both: the destructor took it for finished.
TEST(LocalWriterAllocSweep, EachAllocationOfFinishLeavesNoDescriptorNorTemporary) {
  const auto dir = std::filesystem::temp_directory_path() / ("ckptio-finish-sweep-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto storage = make_local_storage(dir.string());
  ASSERT_TRUE(storage.ok()) << storage.status().to_string();
  // (Aligned: the writer may write with O_DIRECT.)
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(std::aligned_alloc(4096, 8192)),
                                                          &std::free);
  std::memset(buffer.get(), 7, 8192);
  const std::span<const std::byte> bytes(buffer.get(), 8192);
  int64_t n = 1;
  int threw = 0;
  for (;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of finish() fails");
    const size_t fds = open_descriptors();
    bool fired = false, finished = false;
    {
      auto w = (*storage)->create("a/k", bytes.size());
      ASSERT_TRUE(w.ok()) << w.status().to_string();
      std::promise<Status> written;
      (*w)->write_async(0, bytes, [&](Status st) { written.set_value(st); });
      ASSERT_TRUE(written.get_future().get().ok());
      testutil::fail_nth_allocation(std::this_thread::get_id(), n);
      try {
        finished = (*w)->finish(bytes.size()).ok();
      } catch (const std::bad_alloc&) {
        ++threw;
      }
      fired = testutil::disarm_allocation_failure();
    }
    EXPECT_EQ(open_descriptors(), fds) << "a descriptor leaked";
    for (const auto& e : std::filesystem::directory_iterator(dir / "a"))
      EXPECT_EQ(e.path().filename(), "k") << "left behind: " << e.path();
    EXPECT_EQ(std::filesystem::exists(dir / "a" / "k"), finished);
    std::filesystem::remove(dir / "a" / "k");
    if (!fired) {
      EXPECT_TRUE(finished);
      break;
    }
  }
  std::printf("sweep: %lld rounds, %d threw\n", static_cast<long long>(n - 1), threw);
  EXPECT_GT(threw, 0) << "no allocation of finish() was reached: is the sweep armed on it?";
  std::filesystem::remove_all(dir);
}

// A conversion restores its source on a thread of its own
// (src/copy/convert.cc, "ckptio-cp-read") while the caller writes.
TEST_P(AllocSweepMemory, EachAllocationOfAConversionsRestorerFailsOnlyThatCopy) {
  for (const CopyCase& c : kCopyCases) {
    if (std::string(c.format).empty()) continue;  // a stream: no restorer
    const bool posix = GetParam() == testutil::Backend::kMemoryPosix;
    sweep_copy(make_memory_storage(posix), make_memory_storage(posix), c, "ckptio-cp-read");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AllocSweep, testutil::local_backends(), testutil::backend_name);
INSTANTIATE_TEST_SUITE_P(Backends, AllocSweepLocal, ::testing::Values(testutil::Backend::kLocal),
                         testutil::backend_name);
INSTANTIATE_TEST_SUITE_P(Backends, AllocSweepMemory,
                         ::testing::Values(testutil::Backend::kMemoryPosix, testutil::Backend::kMemoryObject),
                         testutil::backend_name);

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
TEST_P(AllocSweepS3, EachAllocationOfARestoreFailsOnlyThatRestore) { sweep_restore(store(), false); }
TEST_P(AllocSweepS3, EachAllocationOfTheReaperFailsOnlyItsRemoval) { sweep_reaper(store()); }

// The HTTP loop's own thread (backends/s3/http_client.cc, named "ckptio-http":
// it signs each attempt, takes the response's headers and body, and runs the
// S3 client's and the storage's callbacks). For n = 1, 2, ... its n-th
// allocation during one round of requests throws. Each call ends OK or
// kResourceExhausted, never a crash or a hang; an object holds the new bytes
// or the old ones; the next round finds the loop working.
//
// Signing takes ~30 of the ~80 allocations a signed request makes on the
// loop (437 a round of 9 requests unsigned, 82 a signed PUT), the same for
// every request: the round of every kind of request (an early PUT, a
// one-part multipart upload, a read of three ranges: a HEAD, GETs with
// If-Match, a lone GET; a listing) is swept unsigned (`anonymous`, which moto
// accepts), and one signed PUT after it.
// The objects are checked through a second, signed storage (an anonymous GET
// of a missing key is 403, as on AWS without s3:ListBucket).
void sweep_http_loop(const testutil::S3TestServer& server, bool anonymous, bool whole_round) {
  s3::S3Config config = testutil::s3_test_config(server);
  config.anonymous = anonymous;
  std::string prefix = testutil::s3_test_prefix();
  prefix.pop_back();  // no trailing '/'
  const std::string uri = "s3://" + server.bucket + "/" + prefix;
  auto opened = s3::make_s3_storage(uri, config);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  std::shared_ptr<Storage> s = *opened;
  // A writer's whole life: one range, then finish. `early`: create_new(),
  // one PUT as the range arrives; else a multipart upload of one part.
  auto write = [&](bool early, const std::string& key, const std::string& v) -> Status {
    auto w = early ? s->create_new(key, v.size()) : s->create(key, 2 * testutil::kS3TestPart);
    if (!w.ok()) return w.status();
    std::promise<Status> landed;
    try {
      (*w)->write_async(0, std::as_bytes(std::span(v)), [&](Status st) { landed.set_value(std::move(st)); });
    } catch (const std::bad_alloc&) {  // accepted nothing (storage.h)
      (*w)->abort();
      return Status(Code::kResourceExhausted, "write_async refused memory");
    }
    Status wrote = landed.get_future().get();
    Status fin = (*w)->finish(v.size());
    return wrote.ok() ? fin : wrote;
  };
  auto value = [](const char* what, int64_t n) {
    return std::string(what) + " of round " + std::to_string(n) + std::string(1500, 'x');
  };
  std::string multi = value("multi", 0);
  const std::string lone = value("lone", 0);
  ASSERT_TRUE(write(false, "sweep/multi", multi).ok());
  ASSERT_TRUE(write(false, "sweep/lone", lone).ok());
  const std::optional<pid_t> loop = testutil::task_named("ckptio-http");
  ASSERT_TRUE(loop) << "not exactly one thread named ckptio-http in this process";
  auto checker = s3::make_s3_storage(uri, testutil::s3_test_config(server));
  ASSERT_TRUE(checker.ok()) << checker.status().to_string();

  int failed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the HTTP loop fails");
    const std::string new_multi = value("multi", n), single = value("single", n);
    const std::string single_key = "sweep/single-" + std::to_string(n);
    std::string a(100, '\0'), b(200, '\0'), c(50, '\0');
    std::vector<ReadRequest> reads = {{"sweep/multi", 10, 100, reinterpret_cast<std::byte*>(a.data())},
                                      {"sweep/multi", 1000, 200, reinterpret_cast<std::byte*>(b.data())},
                                      {"sweep/lone", 5, 50, reinterpret_cast<std::byte*>(c.data())}};
    Status up, read, list;
    testutil::fail_nth_allocation_of_task(*loop, n);
    Status early = write(true, single_key, single);
    if (whole_round) {
      up = write(false, "sweep/multi", new_multi);
      read = s->read(reads);
      list = s->list("sweep/", false).status();
    }
    const bool fired = testutil::disarm_allocation_failure();
    for (const Status* st : {&early, &up, &read, &list})
      if (!st->ok()) {
        ++failed;
        EXPECT_EQ(st->code(), Code::kResourceExhausted) << st->to_string();
      }
    if (!fired) {
      EXPECT_TRUE(early.ok() && up.ok() && read.ok() && list.ok());
      EXPECT_GT(n, whole_round ? 100 : 50) << "too few allocations on the loop: is the sweep armed on it?";
      break;
    }
    // The objects: the new bytes where the write succeeded, else the new or
    // the old ones (the server stored them, the answer was lost), never a mix.
    auto e = (*checker)->get(single_key, 1 << 20);
    if (early.ok()) EXPECT_TRUE(e.ok() && *e == single) << e.status().to_string();
    else EXPECT_TRUE(!e.ok() ? e.status().code() == Code::kNotFound : *e == single) << early.to_string() << " / " << e.status().to_string();
    if (::testing::Test::HasFailure()) return;
    if (!whole_round) continue;
    auto m = (*checker)->get("sweep/multi", 1 << 20);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    if (up.ok()) EXPECT_EQ(*m, new_multi);
    else EXPECT_TRUE(*m == new_multi || *m == multi);
    multi = *m;
    if (read.ok()) {
      EXPECT_EQ(a, multi.substr(10, 100));
      EXPECT_EQ(b, multi.substr(1000, 200));
      EXPECT_EQ(c, lone.substr(5, 50));
    }
    if (::testing::Test::HasFailure()) return;
  }
  ASSERT_TRUE(s->remove_prefix("sweep/").ok());
  std::printf("sweep: %d requests failed\n", failed);
}

// The caller's side of an S3 read (planning, then queueing its HEAD and its
// GETs; a restore calls it from the read executor's threads), one allocation
// at a time: kResourceExhausted or the bytes. A read refused memory with some
// requests queued waits for them before it returns: they write into its
// frame and the caller's buffers (before, the exception left with them in
// flight).
TEST(S3MotoAllocSweep, EachAllocationOfAReadFailsOnlyThatRead) {
  auto opened = testutil::open_s3_test_store();
  if (opened.status().code() == Code::kUnimplemented) GTEST_SKIP() << opened.status().to_string();
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Storage& s = **opened;
  std::string a_text(3000, 'a'), b_text(3000, 'b');
  for (size_t i = 0; i < a_text.size(); ++i) a_text[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(s.put("a", std::as_bytes(std::span(a_text))).ok());
  ASSERT_TRUE(s.put("b", std::as_bytes(std::span(b_text))).ok());
  int failed = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n) + " of the read fails");
    std::string x(100, '\0'), y(200, '\0'), z(50, '\0');
    // Two GETs of "a" (a HEAD first, then If-Match) and a lone one of "b".
    std::vector<ReadRequest> reads = {{"a", 10, 100, reinterpret_cast<std::byte*>(x.data())},
                                      {"a", 2000, 200, reinterpret_cast<std::byte*>(y.data())},
                                      {"b", 5, 50, reinterpret_cast<std::byte*>(z.data())}};
    testutil::fail_nth_allocation(std::this_thread::get_id(), n);
    const Status st = s.read(reads);
    const bool fired = testutil::disarm_allocation_failure();
    if (st.ok()) {
      EXPECT_EQ(x, a_text.substr(10, 100));
      EXPECT_EQ(y, a_text.substr(2000, 200));
      EXPECT_EQ(z, b_text.substr(5, 50));
    } else {
      ++failed;
      EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
    }
    if (!fired) {
      EXPECT_TRUE(st.ok()) << st.to_string();
      EXPECT_GT(n, 10) << "a read allocates more than this: is the sweep armed?";
      break;
    }
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("sweep: %d reads failed\n", failed);
}

TEST(S3MotoAllocSweep, EachAllocationOfTheHttpLoopFailsOnlyItsRequest) {
  const testutil::S3TestServerLookup look = testutil::lookup_s3_test_server();
  if (!look.server) {
    if (look.must_fail) FAIL() << look.why;
    GTEST_SKIP() << look.why;
  }
  sweep_http_loop(*look.server, true, true);
  if (::testing::Test::HasFailure()) return;
  sweep_http_loop(*look.server, false, false);
}

INSTANTIATE_TEST_SUITE_P(Backends, AllocSweepS3, ::testing::Values(testutil::Backend::kS3Moto),
                         testutil::backend_name);

}  // namespace
}  // namespace ckptio
