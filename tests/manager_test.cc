// CheckpointManager end to end over the memory backends (POSIX-like and
// object-store-like) and the local io_uring backend: save, commit, discover,
// restore, callbacks, retention, overwrite, casts, selection, templates,
// failures and corruption.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/local/local_storage.h"
#include "backends/fault/fault_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "src/util/crc32c.h"
#include "src/layout/layout.h"
#include "src/save/crew.h"
#include "src/save/save_plan.h"
#include "src/transform/cast.h"
#include "src/util/populate.h"
#include "testutil/backend_fixture.h"
#include "testutil/fork_safety.h"
#include "testutil/owned_leaves.h"
#include "testutil/random_bytes.h"
#include "testutil/resident.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

using testutil::OwnedLeaf;
using testutil::expect_restored;
using testutil::make_leaf;
using testutil::random_bytes;
using testutil::views;

std::vector<OwnedLeaf> sample_state(uint64_t seed) {
  std::vector<OwnedLeaf> s;
  s.push_back(make_leaf("model", "params.embed.embedding", DType::kFloat32, {300, 17}, seed + 1));
  s.push_back(make_leaf("model", "params.layers.0.attn.q_proj.kernel", DType::kBFloat16, {64, 129}, seed + 2));
  s.push_back(make_leaf("model", "params.scalar", DType::kFloat64, {}, seed + 3));
  s.push_back(make_leaf("model", "params.empty", DType::kInt32, {0, 5}, seed + 4));
  s.push_back(make_leaf("tx", "opt_state.count", DType::kInt32, {}, seed + 5));
  s.push_back(make_leaf("tx", "opt_state.mu.kernel", DType::kFloat32, {1000, 33}, seed + 6));
  return s;
}

// base_, faults_ over it, dir_ for the local backend: testutil/backend_fixture.h.
class ManagerTest : public testutil::BackendTest {
 protected:
  ManagerTest() : BackendTest("ckptio-mgr-") {}
  std::unique_ptr<CheckpointManager> manager(ManagerOptions o = {}) {
    if (o.chunk_size == 0) o.chunk_size = 64 * 1024;  // many chunks per save
    return std::make_unique<CheckpointManager>(faults_, std::move(o));
  }
};

// A save reports its own progress as it goes (the CLI's progress line polls
// it): stopped at its first data file's finish, every byte is staged and
// written and none durable yet; once committed, all of it is durable. In
// both staging modes (copy: through the pool; borrow: from the caller's
// memory).
TEST_P(ManagerTest, ProgressCountsStagedWrittenAndDurableBytes) {
  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    SCOPED_TRACE(mode == StagingMode::kCopy ? "copy" : "borrow");
    std::promise<void> reached, go;
    std::shared_future<void> go_f = go.get_future().share();
    std::atomic<bool> armed{true};
    faults_->set_hook([&](FaultOp op, const std::string& key) {
      if (op == FaultOp::kFinish && key.find("/data-") != std::string::npos && armed.exchange(false)) {
        reached.set_value();
        go_f.wait();
      }
    });
    ManagerOptions o;
    o.staging = mode;
    auto m = manager(o);
    const int64_t step = mode == StagingMode::kCopy ? 1 : 2;
    auto state = sample_state(40 + step);
    uint64_t payload = 0;
    for (const OwnedLeaf& l : state) payload += l.bytes.size();
    auto h = m->save(step, views(state));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    reached.get_future().wait();
    SaveProgress p = h->progress();
    EXPECT_GE(p.total, payload);
    EXPECT_EQ(p.staged, p.total);
    EXPECT_EQ(p.written, p.total);
    EXPECT_EQ(p.durable, 0u);
    EXPECT_FALSE(h->done());
    go.set_value();
    Status st = h->wait();
    faults_->set_hook(nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    p = h->progress();
    EXPECT_GE(p.total, payload);
    EXPECT_EQ(p.durable, p.total);
    EXPECT_EQ(p.total, h->stats().bytes);  // both count the data files' bytes
  }
}

// Restore and verify report progress through one hook, on the calling
// thread, never backwards, up to a total they reach exactly once at the end.
// Verify reads in batches of 32 MiB: a 40 MiB leaf takes two, so its hook
// sees a value between 0 and the total.
TEST_P(ManagerTest, RestoreAndVerifyReportProgressOnTheCallingThread) {
  auto m = manager();
  auto state = sample_state(5);
  state.push_back(make_leaf("zz", "big", DType::kFloat32, {10, 1024, 1024}, 99));  // 40 MiB, last in the index
  uint64_t payload = 0;
  for (const OwnedLeaf& l : state) payload += l.bytes.size();
  auto h = m->save(1, views(state));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok());

  const std::thread::id caller = std::this_thread::get_id();
  auto check = [&](const std::vector<std::pair<uint64_t, uint64_t>>& calls, uint64_t total, bool midway) {
    ASSERT_FALSE(calls.empty());
    bool seen_midway = false;
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(calls[k].second, total);
      if (k > 0) EXPECT_GT(calls[k].first, calls[k - 1].first);
      if (k + 1 < calls.size()) EXPECT_LT(calls[k].first, total);
      seen_midway |= calls[k].first > 0 && calls[k].first < total;
    }
    EXPECT_EQ(calls.back().first, total);
    if (midway) EXPECT_TRUE(seen_midway);
  };
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  bool other_thread = false;
  auto record = [&](uint64_t done, uint64_t total) {
    other_thread |= std::this_thread::get_id() != caller;
    calls.emplace_back(done, total);
  };

  RestoreOptions ro;
  ro.on_progress = record;
  auto r = m->restore(std::nullopt, ro);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  check(calls, payload, false);

  calls.clear();
  Status st = m->verify(1, record);
  ASSERT_TRUE(st.ok()) << st.to_string();
  check(calls, payload, true);
  EXPECT_FALSE(other_thread);
}

TEST_P(ManagerTest, SaveCommitRestoreLatest) {
  auto m = manager();
  auto state = sample_state(1);
  auto h = m->save(7, views(state), {.metadata_json = R"({"data_pos": 123, "rng": [1, 2]})"});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  EXPECT_TRUE(h->done());
  EXPECT_TRUE(h->released());
  EXPECT_GT(h->stats().bytes, 0u);

  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{7});
  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 7);
  EXPECT_NE(r->metadata_json.find("\"data_pos\":123"), std::string::npos) << r->metadata_json;
  expect_restored(*r, state);
  EXPECT_EQ(r->stats.bytes_needed, h->stats().bytes);
  // The phases are timed, latest or named step, and lie within the whole.
  for (auto step : {std::optional<int64_t>(), std::optional<int64_t>(7)}) {
    auto again = step ? m->restore(*step) : m->restore(std::nullopt);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    const RestoreStats& s = again->stats;
    EXPECT_GT(s.index_seconds, 0);
    EXPECT_GT(s.plan_seconds, 0);
    EXPECT_GT(s.read_seconds, 0);
    EXPECT_LE(s.index_seconds + s.plan_seconds + s.read_seconds, s.seconds);
  }
}

// Bad metadata and names that no index can hold are refused by save() itself,
// before any byte is written, rather than by the parse-back before commit.
TEST_P(ManagerTest, SaveRefusesBadMetadataAndNonUtf8NamesUpFront) {
  auto m = manager();
  int32_t x = 1;
  std::vector<LeafView> ok = {LeafView::full("model", "w", DType::kInt32, {}, &x)};
  for (const char* bad : {"[1,2]", "{\"a\": ", "{\"a\":1,\"a\":2}", "not json"}) {
    auto h = m->save(1, ok, {.metadata_json = bad});
    EXPECT_EQ(h.status().code(), Code::kInvalidArgument) << bad << ": " << h.status().to_string();
  }
  for (std::string name : {std::string("w\xff"), std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                           std::string("a\xe2\x82")}) {
    std::vector<LeafView> leaves = {LeafView::full("model", name, DType::kInt32, {}, &x)};
    auto h = m->save(1, leaves);
    EXPECT_EQ(h.status().code(), Code::kInvalidArgument) << h.status().to_string();
  }
  auto listed = faults_->list("", false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->objects.empty()) << "nothing may be written: " << listed->objects[0].key;
  std::vector<LeafView> utf8 = {LeafView::full("model", "naïve.文件", DType::kInt32, {}, &x)};
  auto h = m->save(2, utf8, {.metadata_json = R"({"pos": 3})"});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_TRUE(h->wait().ok());
}

TEST_P(ManagerTest, BorrowModeAndTinyPoolRoundTrip) {
  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    ManagerOptions o;
    o.staging = mode;
    o.chunk_size = 8192;
    o.staging_budget = 8192 * 2;  // the pool is far smaller than the state
    auto m = manager(o);
    auto state = sample_state(mode == StagingMode::kCopy ? 10 : 20);
    int64_t step = mode == StagingMode::kCopy ? 1 : 2;
    auto h = m->save(step, views(state));
    ASSERT_TRUE(h.ok());
    h->wait_released();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    auto r = m->restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state);
  }
}

TEST_P(ManagerTest, CopyModeLetsCallerReuseBuffersAtOnce) {
  auto m = manager({.staging = StagingMode::kCopy});
  auto state = sample_state(3);
  auto saved = state;
  auto h = m->save(1, views(state));
  ASSERT_TRUE(h.ok());
  for (auto& l : state) std::fill(l.bytes.begin(), l.bytes.end(), std::byte{0xAB});
  ASSERT_TRUE(h->wait().ok());
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, saved);
}

TEST_P(ManagerTest, CallbacksRunOncePerSaveWithStatus) {
  std::mutex mu;
  std::vector<std::pair<int64_t, bool>> events;
  ManagerOptions o;
  o.max_in_flight = 2;
  o.on_commit = [&](const CommitEvent& e) {
    std::lock_guard lock(mu);
    events.emplace_back(e.step, e.status.ok());
  };
  auto m = manager(o);
  auto state = sample_state(4);
  for (int64_t s = 1; s <= 4; ++s) ASSERT_TRUE(m->save(s, views(state)).ok());
  faults_->add_rule(FaultRule{.op = FaultOp::kWrite, .key_substr = "run-5", .code = Code::kIOError});
  ASSERT_TRUE(m->save(5, views(state)).ok());  // accepted; fails in the background
  Status all = m->wait_until_finished();
  EXPECT_FALSE(all.ok());
  EXPECT_NE(all.message().find("step 5"), std::string::npos) << all.to_string();
  std::lock_guard lock(mu);
  ASSERT_EQ(events.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(events[i].first, i + 1);
    EXPECT_TRUE(events[i].second);
  }
  EXPECT_EQ(events[4].first, 5);
  EXPECT_FALSE(events[4].second);
}

TEST_P(ManagerTest, FailedSaveLeavesPreviousLatestIntactAndNoGarbageAfterGc) {
  auto m = manager();
  auto state1 = sample_state(5);
  ASSERT_TRUE(m->save(1, views(state1)).value().wait().ok());
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kFinish, FaultOp::kPut, FaultOp::kRename, FaultOp::kCreate}) {
    if (op == FaultOp::kRename && !base_->caps().atomic_rename) continue;
    for (Code code : {Code::kNoSpace, Code::kIOError, Code::kPermissionDenied}) {
      faults_->clear_rules();
      faults_->add_rule(FaultRule{.op = op, .code = code, .message = "injected"});
      auto state2 = sample_state(6);
      auto h = m->save(2, views(state2));
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      Status st = h->wait();
      EXPECT_FALSE(st.ok()) << "op " << static_cast<int>(op);
      EXPECT_EQ(st.code(), code) << st.to_string();
      faults_->clear_rules();
      auto latest = m->latest_step();
      ASSERT_TRUE(latest.ok());
      EXPECT_EQ(latest->value_or(-1), 1) << "op " << static_cast<int>(op);
      auto r = m->restore(std::nullopt);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      expect_restored(*r, state1);
    }
  }
  (void)m->wait_until_finished();
  ASSERT_TRUE(m->gc().ok());
  auto listed = base_->list("", false);
  ASSERT_TRUE(listed.ok());
  for (const auto& o : listed->objects) EXPECT_EQ(o.key.rfind("run-1/", 0), 0u) << o.key;
}

// On an object store the index PUT is the commit. A PUT retried after its
// first attempt stored the index (the answer lost) can end with any error
// (here 403: keys rotated). The index is read back whatever the error: ours
// is there, so the step committed, and its data must stay.
TEST(IndexPut, AnyErrorAfterTheIndexWasStoredIsReadBack) {
  for (Code code : {Code::kPermissionDenied, Code::kInvalidArgument, Code::kNoSpace, Code::kDataLoss}) {
    SCOPED_TRACE(Status(code, "").to_string());
    auto faults = make_fault_storage(make_memory_storage(false));
    ManagerOptions o;
    o.chunk_size = 64 * 1024;
    CheckpointManager m(faults, o);
    faults->add_rule(FaultRule{.op = FaultOp::kPut, .key_substr = kIndexFileName, .code = code, .times = 1,
                               .after = true});
    auto state = sample_state(33);
    auto h = m.save(1, views(state));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_TRUE(h->wait().ok()) << h->wait().to_string();
    faults->clear_rules();
    auto r = m.restore(1);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state);
  }
}

// Waits for `f` up to a minute; a hang aborts the test binary (the thread
// that hangs cannot be joined).
template <typename T>
T within_a_minute(std::future<T> f, const std::string& what) {
  if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << what << " hangs";
    std::abort();
  }
  return f.get();
}

// Two threads saving at once in copy mode, each state larger than the pool:
// a save that copied ahead of one queued before it filled the pool with
// chunks the worker never reached (it takes them in queue order).
TEST(SaveConcurrency, TwoThreadsSavingInCopyModeBothCommit) {
  auto store = make_memory_storage(true);
  ManagerOptions o;
  o.chunk_size = 64 * 1024;
  o.staging_budget = 8 * 64 * 1024;  // 8 buffers: each state needs 48
  o.staging = StagingMode::kCopy;
  o.max_in_flight = 2;
  auto m = std::make_shared<CheckpointManager>(store, o);
  std::vector<std::vector<OwnedLeaf>> states;
  for (int t = 0; t < 2; ++t) states.push_back({make_leaf("model", "w", DType::kFloat32, {768, 1024}, 40 + t)});
  for (int round = 0; round < 10; ++round) {
    std::vector<std::future<Status>> saves;
    for (int t = 0; t < 2; ++t)
      saves.push_back(std::async(std::launch::async, [&, t] {
        auto h = m->save(1 + 2 * round + t, views(states[t]));
        return h.ok() ? h->wait() : h.status();
      }));
    for (auto& f : saves) {
      Status st = within_a_minute(std::move(f), "a save of two at once in copy mode");
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  for (int t = 0; t < 2; ++t) {
    auto r = m->restore(19 + t);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, states[t]);
  }
}

// on_commit and on_retention run on the worker: a save() from there would
// wait for a slot only the worker frees. Refused with a clear error.
TEST(SaveConcurrency, ASaveFromOnCommitIsRefusedNotAHang) {
  auto store = make_memory_storage(true);
  ManagerOptions o;
  o.chunk_size = 64 * 1024;
  std::shared_ptr<CheckpointManager> m;
  auto state = sample_state(41);
  Status inner;
  o.on_commit = [&](const CommitEvent& e) {
    if (e.step == 1) {
      auto h = m->save(2, views(state));
      inner = h.ok() ? Status::OK() : h.status();
    }
  };
  m = std::make_shared<CheckpointManager>(store, o);
  Status outer = within_a_minute(std::async(std::launch::async, [&] {
    auto h = m->save(1, views(state));
    return h.ok() ? h->wait() : h.status();
  }), "save() from on_commit");
  EXPECT_TRUE(outer.ok()) << outer.to_string();
  EXPECT_EQ(inner.code(), Code::kFailedPrecondition) << inner.to_string();
  EXPECT_NE(inner.message().find("from a callback"), std::string::npos) << inner.to_string();
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
}

// gc in the saver's own manager, on an object store, while the save
// commits: gc listed the step's objects and found no index yet; the save then
// committed and left the attempts in flight. The objects it had listed are
// the committed step's data and must not go (min_age 0, the default).
TEST(GcRace, AStepCommittedWhileGcRunsKeepsItsData) {
  auto faults = make_fault_storage(make_memory_storage(false));
  ManagerOptions o;
  o.chunk_size = 64 * 1024;
  CheckpointManager m(faults, o);
  // A dead attempt's object that sorts before the save's: gc removes it first.
  const std::string dead = "run-1/data-0000000000000000-0.bin";
  const std::string bytes = "left by a killed saver";
  ASSERT_TRUE(faults->put(dead, std::as_bytes(std::span(bytes))).ok());
  std::promise<void> commit_reached, gc_removing, saved;
  std::shared_future<void> gc_removing_f = gc_removing.get_future().share(), saved_f = saved.get_future().share();
  std::atomic<bool> put_armed{true}, remove_armed{true};
  faults->set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kPut && key.find(kIndexFileName) != std::string::npos && put_armed.exchange(false)) {
      commit_reached.set_value();
      gc_removing_f.wait_for(std::chrono::seconds(30));  // gc has read "no index" and removes
    }
    if (op == FaultOp::kRemove && key == dead && remove_armed.exchange(false)) {
      gc_removing.set_value();
      saved_f.wait_for(std::chrono::seconds(30));  // the save committed and left the attempts in flight
    }
  });
  auto state = sample_state(31);
  auto h = m.save(1, views(state));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  commit_reached.get_future().wait();  // every data object is written
  Status gc_status;
  std::thread gc([&] { gc_status = m.gc(); });
  ASSERT_TRUE(h->wait().ok());
  ASSERT_TRUE(m.wait_until_finished().ok());
  saved.set_value();
  gc.join();
  faults->set_hook(nullptr);
  EXPECT_TRUE(gc_status.ok()) << gc_status.to_string();
  EXPECT_EQ(faults->stat(dead).status().code(), Code::kNotFound) << "the dead attempt's object stays";
  auto r = m.restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  EXPECT_TRUE(m.verify(1).ok());
}

// What the commit throws (std::bad_alloc, where the system refuses memory)
// fails the save, not the process: the step is not committed, gc removes
// what the attempt left, and the manager saves again. (An exception on the
// worker thread ended the process before.) The commit is the rename of the
// attempt's directory on a POSIX-like store, the index PUT on an object store.
TEST(WorkerExceptions, AnExceptionInTheCommitFailsTheSaveAndTheManagerGoesOn) {
  for (const bool posix : {true, false}) {
    SCOPED_TRACE(posix ? "rename" : "index PUT");
    auto faults = make_fault_storage(make_memory_storage(posix));
    ManagerOptions o;
    o.chunk_size = 64 * 1024;
    CheckpointManager m(faults, o);
    const auto s1 = sample_state(51), s2 = sample_state(52), s3 = sample_state(53);
    ASSERT_TRUE(m.save(1, views(s1)).value().wait().ok());
    std::atomic<bool> armed{true};
    faults->set_hook([&](FaultOp op, const std::string& key) {
      const bool commit = posix ? op == FaultOp::kRename && key.find(".tmp-") != std::string::npos
                                : op == FaultOp::kPut && key.find(kIndexFileName) != std::string::npos;
      if (commit && armed.exchange(false)) throw std::bad_alloc();
    });
    auto h = m.save(2, views(s2));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const Status st = h->wait();
    faults->set_hook(nullptr);
    EXPECT_FALSE(armed.load()) << "the save never reached its commit";
    EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
    EXPECT_NE(st.message().find("commit"), std::string::npos) << st.to_string();
    EXPECT_EQ(m.all_steps().value(), std::vector<int64_t>{1});
    // (The handle completes before the save leaves the attempts in flight,
    // which gc spares: wait for that too.)
    EXPECT_EQ(m.wait_until_finished().code(), Code::kResourceExhausted);
    ASSERT_TRUE(m.gc().ok());
    auto left = faults->list("run-2", false);
    ASSERT_TRUE(left.ok()) << left.status().to_string();
    EXPECT_TRUE(left->objects.empty() && left->prefixes.empty())
        << left->objects.size() << " objects and " << left->prefixes.size() << " prefixes left after gc";
    ASSERT_TRUE(m.save(3, views(s3)).value().wait().ok());
    auto r = m.restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->step, 3);
    expect_restored(*r, s3);
  }
}

// gc removes only what ckptio names (data-, manifest-, failed- and an
// attempt id), even under a directory that parses as a step: with
// step_format "{step}" a shared base's "2024/" is one.
TEST(GcRace, GcRemovesOnlyWhatCkptioNamed) {
  for (bool posix : {false, true}) {
    SCOPED_TRACE(posix ? "POSIX" : "object store");
    auto store = make_memory_storage(posix);
    ManagerOptions o;
    o.chunk_size = 64 * 1024;
    o.step_format = "{step}";
    CheckpointManager m(store, o);
    auto state = sample_state(32);
    ASSERT_TRUE(m.save(1, views(state)).value().wait().ok());
    const std::string bytes = "someone else's";
    const std::vector<std::string> theirs = {"2024/a.csv", "1/notes.txt", "7/data.bin", "7/data-xyz-0.bin"};
    const std::vector<std::string> ours = {"1/manifest-00000000deadbeef-p1.json"};
    for (const auto& k : theirs) ASSERT_TRUE(store->put(k, std::as_bytes(std::span(bytes))).ok()) << k;
    for (const auto& k : ours) ASSERT_TRUE(store->put(k, std::as_bytes(std::span(bytes))).ok()) << k;
    if (!posix) ASSERT_TRUE(store->put("7/data-00000000deadbeef-0.bin", std::as_bytes(std::span(bytes))).ok());
    ASSERT_TRUE(m.gc().ok());
    for (const auto& k : theirs) EXPECT_TRUE(store->stat(k).ok()) << k << " was removed";
    for (const auto& k : ours) EXPECT_EQ(store->stat(k).status().code(), Code::kNotFound) << k << " stays";
    if (!posix) EXPECT_EQ(store->stat("7/data-00000000deadbeef-0.bin").status().code(), Code::kNotFound);
    auto r = m.restore(1);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state);
  }
}

// gc in another process (another manager here: it knows nothing of the
// saver's attempt) while a save is stopped just before its commit: with a
// minimum age it leaves the save's files alone, and the save commits whole.
// Leftovers a killed saver left (written here directly) go once they are
// older than the minimum age.
TEST_P(ManagerTest, GcWithMinAgeLeavesALiveSaveElsewhereAndRemovesOldLeftovers) {
  auto saver = manager();
  auto other = manager();
  auto state1 = sample_state(21);
  ASSERT_TRUE(saver->save(1, views(state1)).value().wait().ok());

  // Stop the saver at the moment its data is complete and its commit begins:
  // on object stores the index put (made after every data object); on POSIX
  // the fsync of the stage directory that publishing starts with (there a
  // single-process save stages its index while the data still drains).
  std::promise<void> reached, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> armed{true};
  const bool posix = base_->caps().atomic_rename;
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    const bool commit_begins = posix ? op == FaultOp::kSync && key.find(".tmp-") != std::string::npos
                                     : op == FaultOp::kPut && key.find(kIndexFileName) != std::string::npos;
    if (commit_begins && armed.exchange(false)) {
      reached.set_value();
      go_f.wait();
    }
  });
  auto state2 = sample_state(22);
  auto h = saver->save(2, views(state2));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  reached.get_future().wait();
  const auto listed_before = base_->list("", false);
  ASSERT_TRUE(listed_before.ok());
  Status st = other->gc(GcOptions{3600});
  EXPECT_TRUE(st.ok()) << st.to_string();
  const auto listed_after = base_->list("", false);
  ASSERT_TRUE(listed_after.ok());
  EXPECT_EQ(listed_after->objects.size(), listed_before->objects.size()) << "gc removed part of a live save";
  go.set_value();
  st = h->wait();
  faults_->set_hook(nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto r = other->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 2);
  expect_restored(*r, state2);
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_TRUE(other->verify(2).ok());

  // A killed saver's leftovers: POSIX, a temporary step directory; object
  // stores, data under a step prefix that has no index.
  const std::string dead = base_->caps().atomic_rename ? "run-3.tmp-00000000deadbeef/data-00000000deadbeef-0.bin"
                                                        : "run-3/data-00000000deadbeef-0.bin";
  // And in a committed step, a manifest of a multi-process save whose
  // coordinator was killed after the commit, before removing it.
  const std::string manifest = "run-2/manifest-00000000deadbeef-p1.json";
  const std::string bytes = "left by a killed saver";
  ASSERT_TRUE(base_->put(dead, std::as_bytes(std::span(bytes))).ok());
  ASSERT_TRUE(base_->put(manifest, std::as_bytes(std::span(bytes))).ok());
  auto exists = [&] { return base_->stat(dead).ok(); };
  ASSERT_TRUE(other->gc(GcOptions{1.0}).ok());
  EXPECT_TRUE(exists()) << "a leftover younger than min_age was removed";
  EXPECT_TRUE(base_->stat(manifest).ok()) << "a manifest younger than min_age was removed";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(other->gc(GcOptions{1.0}).ok());
  EXPECT_FALSE(exists()) << "a leftover older than min_age was kept";
  EXPECT_FALSE(base_->stat(manifest).ok()) << "a committed step's stray manifest was kept";
  EXPECT_EQ(other->gc(GcOptions{-1}).code(), Code::kInvalidArgument);
  // The committed steps themselves stay whole.
  r = saver->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state2);
}

TEST_P(ManagerTest, ExistingStepNeedsOverwriteWhichIsAtomic) {
  auto m = manager();
  auto a = sample_state(7), b = sample_state(8);
  ASSERT_TRUE(m->save(3, views(a)).value().wait().ok());
  auto again = m->save(3, views(b));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  ASSERT_TRUE(m->save(3, views(b), {.overwrite = true}).value().wait().ok());
  auto r = m->restore(3);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, b);
  // A failed overwrite keeps the old step.
  faults_->add_rule(FaultRule{.op = FaultOp::kFinish, .code = Code::kIOError});
  EXPECT_FALSE(m->save(3, views(a), {.overwrite = true}).value().wait().ok());
  faults_->clear_rules();
  r = m->restore(3);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, b);
  ASSERT_TRUE(m->gc().ok());
  EXPECT_TRUE(m->verify(3).ok());
}

// Retention after a commit never retires a step a restore has begun to read:
// restore-latest here has listed step 1 and is reading its index when step 2
// commits with max_to_keep = 1. The restore marked step 1 before reading its
// index, so retention leaves it (it once renamed it away under the restore,
// which then reported it damaged).
TEST_P(ManagerTest, RetentionLeavesAStepWhoseRestoreHasBegun) {
  auto m = manager({.max_to_keep = 1});
  auto s1 = sample_state(31), s2 = sample_state(32);
  ASSERT_TRUE(m->save(1, views(s1)).value().wait().ok());
  std::promise<void> reached, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> armed{true};
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    if ((op == FaultOp::kGet || op == FaultOp::kRead) && key == "run-1/ckptio_index.json" && armed.exchange(false)) {
      reached.set_value();
      go_f.wait();
    }
  });
  auto restoring = std::async(std::launch::async, [&] { return m->restore(std::nullopt); });
  const bool held = reached.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  Status saved = held ? m->save(2, views(s2)).value().wait() : Status::OK();
  go.set_value();
  auto r = restoring.get();
  faults_->set_hook(nullptr);
  ASSERT_TRUE(held) << "the restore never read step 1's index";
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 1);
  expect_restored(*r, s1);
  ASSERT_TRUE(m->apply_retention(1, 0).ok());  // not under a reader any more: retired now
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{2});
}

// remove_step() of a step whose save is in flight in this manager is
// refused, and the save commits whole. Before, on an object store (where a
// save writes under the step's prefix) the removal deleted the save's data,
// and the save then committed an index naming it: reported OK, restored as
// data loss. A save of a step being removed is refused likewise.
TEST_P(ManagerTest, RemoveStepRefusesAStepWhoseSaveIsInFlight) {
  auto m = manager();
  auto s7 = sample_state(31);
  std::promise<void> reached_p, go_p;
  std::shared_future<void> go = go_p.get_future().share();
  std::atomic<bool> armed{true};
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kPut && key.find("ckptio_index.json") != std::string::npos && armed.exchange(false)) {
      reached_p.set_value();
      go.wait_for(std::chrono::seconds(60));
    }
  });
  auto h = m->save(7, views(s7));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const bool held = reached_p.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  Status removed = held ? m->remove_step(7) : Status::OK();
  go_p.set_value();
  ASSERT_TRUE(held) << "the save never put its index";
  EXPECT_EQ(removed.code(), Code::kFailedPrecondition) << removed.to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  faults_->set_hook(nullptr);
  auto r = m->restore(7);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, s7);
  EXPECT_TRUE(m->remove_step(7).ok());  // once the save is done
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{});
}

// The fsync of the base after the commit's rename fails (EIO): the step is
// reported failed, so it must not stay discoverable (it would be restored,
// and saving it again refused), and an overwrite that fails so gives the
// replaced step back. Object stores commit with the index PUT instead
// (FailedSaveLeavesPreviousLatestIntactAndNoGarbageAfterGc).
TEST_P(ManagerTest, AFailedFsyncAfterTheCommitRenameTakesTheStepBack) {
  if (!base_->caps().atomic_rename) return;
  auto m = manager();
  auto s1 = sample_state(21), s2 = sample_state(22), s3 = sample_state(23);
  ASSERT_TRUE(m->save(1, views(s1)).value().wait().ok());
  // Once an attempt is renamed to its final name (the first rename of a
  // stage: an overwrite tries RENAME_NOREPLACE first), the next sync fails.
  std::atomic<bool> armed{false};
  auto fail_sync_after_commit_rename = [&] {
    armed = true;
    faults_->set_hook([this, &armed](FaultOp op, const std::string& key) {
      if (op == FaultOp::kRename && key.find(".tmp-") != std::string::npos && armed.exchange(false))
        faults_->add_rule(FaultRule{.op = FaultOp::kSync, .code = Code::kIOError, .times = 1});
    });
  };
  auto healed = [&] {
    faults_->set_hook(nullptr);
    faults_->clear_rules();
  };
  fail_sync_after_commit_rename();
  Status st = m->save(2, views(s2)).value().wait();
  healed();
  EXPECT_EQ(st.code(), Code::kIOError) << st.to_string();
  EXPECT_NE(st.message().find("moved back"), std::string::npos) << st.to_string();
  EXPECT_EQ(m->latest_step().value().value_or(-1), 1);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
  EXPECT_EQ(base_->stat("run-2/ckptio_index.json").status().code(), Code::kNotFound);
  ASSERT_TRUE(m->save(2, views(s2)).value().wait().ok());  // not "already exists"

  fail_sync_after_commit_rename();
  st = m->save(2, views(s3), {.overwrite = true}).value().wait();
  healed();
  EXPECT_EQ(st.code(), Code::kIOError) << st.to_string();
  EXPECT_NE(st.message().find("moved back"), std::string::npos) << st.to_string();
  auto r = m->restore(2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, s2);
  ASSERT_TRUE(m->gc().ok());
  auto listed = base_->list("", false);
  ASSERT_TRUE(listed.ok());
  for (const auto& o : listed->objects)
    EXPECT_TRUE(o.key.rfind("run-1/", 0) == 0 || o.key.rfind("run-2/", 0) == 0) << o.key;
}

// Two writers of one step (two jobs pointed at one base by mistake): the
// second one's checks saw no step 3 (its stat()s of the index answer "not
// found", as they would have before the first writer committed), yet its
// commit must not replace the first writer's step: on an object store the
// index is PUT with put_new (S3: If-None-Match), on a file system the step
// directory is renamed without replacing.
TEST_P(ManagerTest, SecondWriterOfAStepCommittedMeanwhileFailsAndReplacesNothing) {
  auto first = manager();
  auto a = sample_state(7), b = sample_state(8);
  ASSERT_TRUE(first->save(3, views(a)).value().wait().ok());
  faults_->add_rule(FaultRule{.op = FaultOp::kStat, .key_substr = "ckptio_index.json", .code = Code::kNotFound});
  Status told;
  ManagerOptions o;
  o.on_commit = [&](const CommitEvent& e) { told = e.status; };
  auto second = manager(o);
  auto h = second->save(3, views(b));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.to_string();
  EXPECT_EQ(told.code(), Code::kAlreadyExists) << told.to_string();
  EXPECT_EQ(second->wait_until_finished().code(), Code::kAlreadyExists);
  faults_->clear_rules();
  auto r = first->restore(3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, a);
  EXPECT_TRUE(first->verify(3).ok());
  ASSERT_TRUE(first->gc().ok());
  auto steps = first->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{3});
}

// Attempt ids name a save's staging directory and data objects. A child a
// process forks must not draw the same ids as its parent (a generator seeded
// once and kept in memory is copied by fork: the first id of each child
// would be the parent's next one).
TEST(AttemptIds, ForkedChildrenNameTheirAttemptsApart) {
  (void)new_attempt_id();  // the parent has drawn before it forks
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string id = new_attempt_id();
      _exit(::write(fds[1], id.data(), id.size()) == static_cast<ssize_t>(id.size()) ? 0 : 1);
    }
    kids.push_back(pid);
  }
  ::close(fds[1]);
  for (pid_t k : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(k, &status, 0), k);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::string all;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) all.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  ASSERT_EQ(all.size(), 48u) << all;
  std::set<std::string> ids{new_attempt_id()};
  for (size_t i = 0; i < all.size(); i += 16) ids.insert(all.substr(i, 16));
  EXPECT_EQ(ids.size(), 4u) << "ids drawn: the parent's next and three children's first: " << all;
  for (const std::string& id : ids) EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
}

// A manager's threads stay in the process that made it. A forked child that
// calls its parent's manager gets a clear error at once instead of a save
// queued for a worker that does not exist there (which never finished), and
// the child can destroy it without waiting forever.
TEST(ForkedManager, EveryCallInAForkedChildFailsAtOnceAndDestroyingItReturns) {
  const fs::path dir = fs::temp_directory_path() / ("ckptio-forked-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto opened = CheckpointManager::open(dir.string(), {});
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  std::unique_ptr<CheckpointManager> m = std::move(opened).value();
  std::vector<float> x(1024, 0.5f);
  std::vector<LeafView> v{LeafView::full("model", "w", DType::kFloat32, {1024}, x.data())};
  ASSERT_TRUE(m->save(1, v).value().wait().ok());
  // A save in flight as the process forks (64 MiB: still writing, most likely).
  std::vector<std::byte> big(64 << 20, std::byte{7});
  std::vector<LeafView> bv{LeafView::full("model", "big", DType::kUInt8, {static_cast<int64_t>(big.size())},
                                          big.data())};
  auto in_flight = m->save(3, bv);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().to_string();

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Exit codes: 0 all refused as they should be; 10 + n: check n failed.
    auto refused = [](const Status& s) {
      return s.code() == Code::kFailedPrecondition && s.message().find("fork") != std::string::npos &&
             s.message().find("open a manager in this process") != std::string::npos;
    };
    // The handle of the parent's save: its outcome is the parent's to know.
    if (Status w = in_flight->wait(); w.code() != Code::kFailedPrecondition ||
                                      w.message().find("the outcome is known there") == std::string::npos)
      _exit(20);
    if (!in_flight->done() || !in_flight->released()) _exit(21);
    in_flight->wait_released();
    if (in_flight->stats().bytes != 0) _exit(22);  // no lock of the parent's taken: empty here
    if (auto h = m->save(2, v); h.ok() || !refused(h.status())) _exit(10);
    if (auto s = m->all_steps(); s.ok() || !refused(s.status())) _exit(11);
    if (auto r = m->restore(std::nullopt); r.ok() || !refused(r.status())) _exit(12);
    if (!refused(m->verify(1))) _exit(13);
    if (!refused(m->gc())) _exit(14);
    if (!refused(m->wait_until_finished())) _exit(15);
    m.reset();  // must return
    _exit(0);
  }
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    (void)::waitpid(pid, &status, 0);
    FAIL() << "the forked child hung for 20 s using its parent's manager";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "exit code 10 + the index of the check that failed";
  // The parent's manager goes on; its save in flight at the fork commits.
  EXPECT_TRUE(in_flight->wait().ok());
  ASSERT_TRUE(m->save(2, v).value().wait().ok());
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{1, 2, 3}));
  m.reset();
  fs::remove_all(dir);
}

// Callbacks run on the worker thread. What they throw (a Python callback
// raising through a binding) is logged; the process goes on, every handle
// completes with the save's own outcome, and later saves still run.
TEST_P(ManagerTest, CallbacksThatThrowNeitherEndTheProcessNorStopTheManager) {
  ManagerOptions o;
  o.max_to_keep = 1;
  std::atomic<int> commits{0}, retentions{0};
  o.on_commit = [&](const CommitEvent& e) {
    ++commits;
    if (e.step == 1) throw std::runtime_error("raised in on_commit");
    if (e.step == 2) throw 7;  // not a std::exception
  };
  o.on_retention = [&](const RetentionEvent&) {
    ++retentions;
    throw std::runtime_error("raised in on_retention");
  };
  auto m = manager(o);
  auto state = sample_state(31);
  for (int64_t step : {1, 2, 3}) {
    auto h = m->save(step, views(state));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_TRUE(h->wait().ok()) << h->wait().to_string();
  }
  EXPECT_TRUE(m->wait_until_finished().ok());
  EXPECT_EQ(commits.load(), 3);
  EXPECT_EQ(retentions.load(), 3);
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{3}) << "retention ran, its callback's throw aside";
}

// Retention runs after a save's slot is free: a save() called as soon as the
// last handle completed does not wait for old steps to be deleted (it did:
// 245-365 ms per 2 GiB step, measured from Python). Old steps leave the
// committed set at once (rename / index removed) and their bytes are removed
// by the reaper thread, so the next save's writes and commit do not wait for
// that either. wait_until_finished() waits for all of it.
TEST_P(ManagerTest, RetentionDoesNotHoldTheNextSaveBack) {
  ManagerOptions o;
  o.max_to_keep = 1;
  o.max_in_flight = 1;
  auto m = manager(o);
  auto state = sample_state(32);
  auto h1 = m->save(1, views(state));
  ASSERT_TRUE(h1.ok()) << h1.status().to_string();
  ASSERT_TRUE(h1->wait().ok());

  std::promise<void> reached, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> armed{true};
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    // The removal of step 1's bytes (a prefix), not its retirement.
    if (op == FaultOp::kRemove && key.find("run-1") != std::string::npos && key.ends_with("/") &&
        armed.exchange(false)) {
      reached.set_value();
      go_f.wait();  // the reaper holds here, removing step 1's bytes
    }
  });
  auto h2 = m->save(2, views(state));
  ASSERT_TRUE(h2.ok()) << h2.status().to_string();
  ASSERT_TRUE(h2->wait().ok());
  ASSERT_EQ(reached.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "retention never deleted step 1";
  auto held = m->all_steps();
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  EXPECT_EQ(*held, std::vector<int64_t>{2}) << "step 1 left the committed set before its bytes went";
  auto third = std::async(std::launch::async, [&] { return m->save(3, views(state)); });
  const bool returned = third.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  // The save's writes and commit do not wait for it either: the bytes are
  // removed on a thread of their own, not on the worker that runs the saves.
  bool committed = false;
  std::optional<Result<SaveHandle>> h3;
  std::future<Status> done;  // (outlives go: its destructor waits for the save)
  if (returned) {
    h3.emplace(third.get());
    if (h3->ok()) {
      done = std::async(std::launch::async, [&] { return (*h3)->wait(); });
      committed = done.wait_for(std::chrono::seconds(20)) == std::future_status::ready && done.get().ok();
    }
  }
  go.set_value();
  EXPECT_TRUE(returned) << "save() waited for the retention of the step before";
  EXPECT_TRUE(committed) << "step 3 did not commit while step 1's bytes were being removed";
  if (!h3) h3.emplace(third.get());
  ASSERT_TRUE(h3->ok()) << h3->status().to_string();
  EXPECT_TRUE((**h3).wait().ok());
  EXPECT_TRUE(m->wait_until_finished().ok());
  faults_->set_hook(nullptr);
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{3});
}

using testutil::resident_bytes;

// prepare_staging() faults the copy-mode staging buffers in before the first
// save, so that save copies into memory already resident instead of paying
// for fresh pages while the training loop waits. Seen through resident
// memory: a save after it adds almost none; a save without it (the control,
// same state) adds about the state's size.
TEST(PrepareStaging, TheFirstSaveCopiesIntoBuffersAlreadyResident) {
  const uint64_t bytes = 64ull << 20;
  std::vector<std::byte> state(bytes, std::byte{3});  // touched: resident before measuring
  std::vector<LeafView> v{LeafView::full("model", "w", DType::kUInt8, {static_cast<int64_t>(bytes)}, state.data())};
  // Local disk: what is written goes to the page cache, not to this process.
  const fs::path dir = fs::temp_directory_path() / ("ckptio-prepare-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto growth_of_first_save = [&](bool prepare) -> uint64_t {
    ManagerOptions o;
    o.staging = StagingMode::kCopy;
    o.staging_budget = 2 * bytes;
    auto local = make_local_storage((dir / (prepare ? "with" : "without")).string());
    EXPECT_TRUE(local.ok()) << local.status().to_string();
    CheckpointManager m(*local, o);
    if (prepare) EXPECT_TRUE(m.prepare_staging(bytes).ok());
    const uint64_t before = resident_bytes();
    auto h = m.save(1, v);
    EXPECT_TRUE(h.ok());
    const uint64_t after = resident_bytes();  // save() returned: the copy is done
    EXPECT_TRUE(h->wait().ok());
    return after > before ? after - before : 0;
  };
  const uint64_t with = growth_of_first_save(true);
  const uint64_t without = growth_of_first_save(false);
  std::printf("resident memory added by the first save of %llu MiB: %.1f MiB after prepare_staging, %.1f without\n",
              static_cast<unsigned long long>(bytes >> 20), with / 1048576.0, without / 1048576.0);
  EXPECT_GT(without, bytes / 2) << "the control: a first save into fresh buffers";
  // Under ASan the copy also touches the shadow of what it writes, one byte
  // per eight: 8.6 MiB of 64 on a PVM guest, where the bound alone failed.
  const uint64_t shadow = testutil::under_address_sanitizer() ? bytes / 8 : 0;
  EXPECT_LT(with, bytes / 8 + shadow) << "resident memory added by the first save after prepare_staging";
  // Borrow mode has nothing to prepare.
  ManagerOptions b;
  b.staging = StagingMode::kBorrow;
  CheckpointManager m(make_memory_storage(true), b);
  EXPECT_TRUE(m.prepare_staging(bytes).ok());
  fs::remove_all(dir);
}

TEST_P(ManagerTest, RetentionKeepsLastAndEveryK) {
  auto m = manager({.max_to_keep = 2, .keep_every = 4});
  auto state = sample_state(9);
  for (int64_t s = 1; s <= 9; ++s) ASSERT_TRUE(m->save(s, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok());
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{4, 8, 9}));
  ASSERT_TRUE(m->gc().ok());
  auto dirs = m->list_step_dirs();
  ASSERT_TRUE(dirs.ok());
  EXPECT_EQ(dirs->size(), 3u);
}

// A step saved older than the newest max_to_keep (a run resumed from an
// older step) is kept by its own commit's retention: before, it was deleted
// as soon as it committed (its handle said OK, and no step 3 was there).
// The next commit's retention counts it as any other.
TEST_P(ManagerTest, RetentionKeepsTheStepItsCommitRanFor) {
  auto m = manager({.max_to_keep = 2});
  auto state = sample_state(10);
  for (int64_t s : {5, 6}) ASSERT_TRUE(m->save(s, views(state)).value().wait().ok());
  ASSERT_TRUE(m->save(3, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok());
  EXPECT_EQ(m->all_steps().value(), (std::vector<int64_t>{3, 5, 6}));
  ASSERT_TRUE(m->save(7, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok());
  EXPECT_EQ(m->all_steps().value(), (std::vector<int64_t>{6, 7}));
}

// The step's index is stored, and the caller told the PUT failed.
const FaultRule kIndexPutAnswerLost{
    .op = FaultOp::kPut, .key_substr = "ckptio_index.json", .code = Code::kUnavailable, .times = 1, .after = true};

// On an object store the index PUT is the commit. When its answer is lost
// (the PUT took effect, the caller got an error), the commit reads the index
// back: ours, so the step is committed and the save succeeds.
TEST(ObjectStoreCommitTest, AnIndexPutWhoseAnswerIsLostCommits) {
  auto faults = make_fault_storage(make_memory_storage(false));
  CheckpointManager m(faults, ManagerOptions{.chunk_size = 64 * 1024});
  auto a = sample_state(21);
  faults->add_rule(kIndexPutAnswerLost);
  auto h = m.save(1, views(a));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(faults->faults_fired(), 1u) << "the index PUT's answer was not lost: the case did not happen";
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, a);
  EXPECT_TRUE(m.verify(1).ok());
}

// ... and when the index cannot be read back either, whether the step is
// committed is unknown: the save fails saying so, and its data stays (here
// the index did land: the step is whole once the storage answers again).
TEST(ObjectStoreCommitTest, AnIndexPutOfUnknownOutcomeLeavesItsData) {
  auto faults = make_fault_storage(make_memory_storage(false));
  CheckpointManager m(faults, ManagerOptions{.chunk_size = 64 * 1024});
  auto a = sample_state(22);
  faults->add_rule(kIndexPutAnswerLost);
  faults->add_rule(FaultRule{.op = FaultOp::kGet, .key_substr = "ckptio_index.json", .code = Code::kUnavailable});
  auto h = m.save(1, views(a));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("may or may not be committed"), std::string::npos) << st.to_string();
  faults->clear_rules();
  auto r = m.restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, a);
  EXPECT_TRUE(m.verify(1).ok());
}

// Retention after each commit tells what it deleted and, when a delete
// fails, which step is left; the save that ran it committed regardless.
TEST_P(ManagerTest, RetentionReportsWhatItDeletedAndWhatItCouldNot) {
  std::mutex mu;
  std::vector<RetentionEvent> events;
  ManagerOptions o;
  o.max_to_keep = 2;
  o.on_retention = [&](const RetentionEvent& e) {
    std::lock_guard lock(mu);
    events.push_back(e);
  };
  auto m = manager(o);
  auto state = sample_state(9);
  for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(m->save(s, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok());
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[2].after_step, 3);
    EXPECT_EQ(events[2].deleted, std::vector<int64_t>{1});
    EXPECT_TRUE(events[2].status.ok()) << events[2].status.to_string();
    EXPECT_TRUE(events[0].deleted.empty());
  }
  // Deletes fail (POSIX: the rename that takes a step away; object stores:
  // removing its index).
  faults_->add_rule(FaultRule{.op = FaultOp::kRename, .key_substr = ".del-", .code = Code::kPermissionDenied});
  faults_->add_rule(FaultRule{.op = FaultOp::kRemove, .key_substr = "ckptio_index.json", .code = Code::kPermissionDenied});
  ASSERT_TRUE(m->save(4, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok()) << "a failed retention fails no save";
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(events.size(), 4u);
    EXPECT_EQ(events[3].after_step, 4);
    EXPECT_TRUE(events[3].deleted.empty());
    EXPECT_EQ(events[3].status.code(), Code::kPermissionDenied) << events[3].status.to_string();
    EXPECT_NE(events[3].status.message().find("retention: delete step 2"), std::string::npos)
        << events[3].status.to_string();
  }
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{2, 3, 4}));
  faults_->clear_rules();
  ASSERT_TRUE(m->save(5, views(state)).value().wait().ok());
  ASSERT_TRUE(m->wait_until_finished().ok());
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(events.size(), 5u);
    EXPECT_EQ(events[4].deleted, (std::vector<int64_t>{2, 3}));
    EXPECT_TRUE(events[4].status.ok()) << events[4].status.to_string();
  }
  steps = m->all_steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{4, 5}));
}

TEST_P(ManagerTest, SelectionByPrefixAndRegex) {
  auto m = manager();
  auto state = sample_state(11);
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  auto r = m->restore(1, {.select = {.prefixes = {"tx"}}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->leaves.size(), 2u);
  EXPECT_EQ(r->leaves[0].prefix, "tx");
  r = m->restore(1, {.select = {.path_regex = "attn\\.q_proj"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->leaves.size(), 1u);
  EXPECT_EQ(r->leaves[0].path, "params.layers.0.attn.q_proj.kernel");
  EXPECT_LT(r->stats.bytes_read, 64 * 129 * 2 + 1u);
  EXPECT_FALSE(m->restore(1, {.select = {.path_regex = "("}}).ok());
  // Python's syntax, as partition rules: what RE2 lacks is refused by name.
  auto look = m->restore(1, {.select = {.path_regex = "(?=attn)q"}});
  ASSERT_FALSE(look.ok());
  EXPECT_EQ(look.status().code(), Code::kInvalidArgument);
  EXPECT_NE(look.status().message().find("lookahead"), std::string::npos) << look.status().to_string();
  EXPECT_NE(look.status().message().find("path regex"), std::string::npos) << look.status().to_string();
}

// A restore into memory it allocates (as after a restart) faults that memory
// in on a thread of its own while the reads land (RestoreStats::
// bytes_prefaulted): every leaf of at least 1 MiB, none of the small ones,
// and nothing of a caller's `into` destinations, whose pages are theirs.
TEST_P(ManagerTest, RestoreIntoFreshMemoryFaultsItInAheadOfTheReads) {
  std::vector<std::byte> probe(8192);
  if (!populate_for_write(probe.data(), probe.size()))
    GTEST_SKIP() << "SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  auto m = manager();
  std::vector<OwnedLeaf> state = sample_state(3);
  state.insert(state.begin() + 4, make_leaf("model", "params.big", DType::kFloat32, {1024, 1024}, 21));  // 4 MiB
  state.push_back(make_leaf("tx", "opt_state.big", DType::kBFloat16, {1024, 768}, 22));  // 1.5 MiB
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  // The thread stops once the reads have landed (it runs at nice 19 and must
  // not hold up the restore's return), so it may have done less than all.
  EXPECT_LE(r->stats.bytes_prefaulted, (4u << 20) + 1024u * 768 * 2);

  std::vector<std::byte> big(4u << 20);
  RestoreOptions o;
  o.into = {{"model", "params.big", big.data(), big.size()}};
  r = m->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(big.data(), state[4].bytes.data(), big.size()), 0);
  EXPECT_LE(r->stats.bytes_prefaulted, 1024u * 768 * 2) << "only the leaf restore allocated";
}

// The prefault thread: every slice of every range when nothing stops it, in
// 8 MiB slices from the end; nothing once `stop` is set; bytes unchanged.
TEST(PopulateTest, FaultsEveryRangeInUnlessStoppedAndKeepsTheBytes) {
  std::vector<std::byte> probe(8192);
  if (!populate_for_write(probe.data(), probe.size()))
    GTEST_SKIP() << "SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  std::vector<std::byte> a(20u << 20, std::byte{7}), b(3u << 20, std::byte{9});
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false};
  auto f = populate_in_background({{a.data(), a.size()}, {b.data(), b.size()}}, &done, &stop);
  ASSERT_TRUE(f.valid());
  f.wait();
  EXPECT_EQ(done.load(), a.size() + b.size());
  EXPECT_EQ(a[0], std::byte{7});
  EXPECT_EQ(a.back(), std::byte{7});
  EXPECT_EQ(b[b.size() / 2], std::byte{9});

  done = 0;
  stop = true;
  f = populate_in_background({{a.data(), a.size()}}, &done, &stop);
  ASSERT_TRUE(f.valid());
  f.wait();
  EXPECT_EQ(done.load(), 0u) << "a set stop ends the thread before its first slice";
}

// Buffers of 1 MiB and up are mappings of their own, unmapped when the last
// Buffer (or slice) holding them goes: memory a bounded conversion or a
// save frees goes back to the system, even after glibc raised its mmap
// threshold (a freed 30 MiB block raises it to 30 MiB; then malloc served
// 8 MiB from its heaps and kept it: a conversion bounded to 512 MiB of
// buffers peaked at 1.19 GB). Alignment and phase hold on both paths.
TEST(BufferTest, LargeBuffersGoBackToTheSystemWhenFreed) {
  void* raise = std::malloc(30u << 20);
  ASSERT_NE(raise, nullptr);
  std::memset(raise, 1, 30u << 20);
  std::free(raise);
  auto mapped = [](uintptr_t page) {
    unsigned char v;
    return ::mincore(reinterpret_cast<void*>(page), 4096, &v) == 0;
  };
  for (size_t size : {size_t{1} << 20, size_t{8} << 20, (size_t{24} << 20) + 7})
    for (size_t align : {size_t{64}, size_t{4096}, size_t{2} << 20})
      for (size_t phase : {size_t{0}, size_t{192}}) {
        SCOPED_TRACE(std::to_string(size) + " bytes, alignment " + std::to_string(align) + ", phase " +
                     std::to_string(phase));
        Buffer b = Buffer::allocate(size, align, phase);
        const uintptr_t at = reinterpret_cast<uintptr_t>(b.data());
        EXPECT_EQ(at % align, phase % align);
        std::memset(b.data(), 0x5a, b.size());
        const uintptr_t first = at & ~uintptr_t{4095}, last = (at + size - 1) & ~uintptr_t{4095};
        Buffer tail = b.slice(size - 16, 16);
        b = Buffer();
        ASSERT_TRUE(mapped(last)) << "a slice keeps its buffer";
        EXPECT_EQ(tail.data()[15], std::byte{0x5a});
        tail = Buffer();
        EXPECT_FALSE(mapped(first)) << "freed, still mapped";
        EXPECT_FALSE(mapped(last)) << "freed, still mapped";
      }
  Buffer small = Buffer::allocate(1000, 64, 8);  // below 1 MiB: malloc's, aligned as asked
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 8u);
}

// The probe that decides whether a restore faults in ahead the memory its
// reads land in (first_touch_traps()): it runs, a second load from a page
// costs no trap, and it reaches the same verdict each time it is run (the
// choice must be stable from run to run, not a coin toss on a noisy VM).
TEST(PopulateTest, TheFirstTouchProbeMeasuresAndAgreesWithItself) {
  std::vector<std::byte> probe(8192);
  if (!populate_for_write(probe.data(), probe.size()))
    GTEST_SKIP() << "SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  const FirstTouchProbe p = probe_first_touch();
  EXPECT_GT(p.first_ns, 0.0);
  EXPECT_GT(p.again_ns, 0.0);
  EXPECT_LT(p.again_ns, 1000.0) << "a load from a mapped, touched page took a microsecond";
  EXPECT_EQ(p.traps, p.first_ns - p.again_ns > 1000.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(probe_first_touch().traps, p.traps) << "run " << i;
  std::printf("first load of a populated page %.0f ns, a second %.0f ns: %s\n", p.first_ns, p.again_ns,
              p.traps ? "traps" : "no trap");
}

// Leaf paths come from the index (outside data) and may be long; selection
// matches in linear time and never recurses per character (std::regex
// overflowed the stack on this one: a 200,000-character path, "(a|b)*c").
TEST_P(ManagerTest, SelectionRegexOnAVeryLongPathNeitherCrashesNorBacktracks) {
  auto m = manager();
  const std::string long_path(200000, 'a');
  std::vector<float> x(4, 1.5f), y(4, 2.5f);
  std::vector<LeafView> v{LeafView::full("model", long_path, DType::kFloat32, {4}, x.data()),
                          LeafView::full("model", "b", DType::kFloat32, {4}, y.data())};
  ASSERT_TRUE(m->save(1, v).value().wait().ok());
  auto r = m->restore(1, {.select = {.path_regex = "(a|b)*c"}});  // matches neither
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->leaves.empty());
  r = m->restore(1, {.select = {.path_regex = "^(a|b)*$"}});  // both
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->leaves.size(), 2u);
  r = m->restore(1, {.select = {.path_regex = "(a+)+$"}});  // exponential for a backtracker
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 1u);
  EXPECT_EQ(r->leaves[0].path, long_path);
  ASSERT_EQ(r->leaves[0].data.size(), 16u);
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), x.data(), 16), 0);
}

TEST_P(ManagerTest, TemplateMismatchesReportedTogether) {
  auto m = manager();
  auto state = sample_state(12);
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  RestoreOptions o;
  o.select.prefixes = {"model"};
  o.expected = {{"model", "params.embed.embedding", DType::kFloat32, {300, 18}},
                {"model", "params.layers.0.attn.q_proj.kernel", DType::kFloat32, {64, 129}},
                {"model", "params.scalar", DType::kFloat64, {}},
                {"model", "params.nonexistent", DType::kFloat32, {1}}};
  auto r = m->restore(1, o);
  ASSERT_FALSE(r.ok());
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("missing leaves [model/params.nonexistent]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected leaves [model/params.empty]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape [300, 17] saved, [300, 18] expected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dtype bfloat16 saved, float32 expected"), std::string::npos) << msg;
  // With allow_cast and the right shapes, bfloat16 -> float32 casts.
  o.expected[0].shape = {300, 17};
  o.expected.pop_back();
  o.expected.push_back({"model", "params.empty", DType::kInt32, {0, 5}});
  o.allow_cast = true;
  r = m->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->leaves[1].dtype, DType::kFloat32);
  EXPECT_EQ(r->leaves[1].data.size(), 64u * 129 * 4);
}

// float64 to bfloat16 and float16 rounds once, to nearest even: through a
// float rounded to nearest first, a value just above a tie became the tie
// and then rounded to even, one unit low.
TEST(Cast, Float64ToHalfWidthsRoundsOnce) {
  auto cast1 = [](double v, DType to) {
    uint16_t out = 0;
    EXPECT_TRUE(cast_elements(DType::kFloat64, to, &v, &out, 1).ok());
    return out;
  };
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  const double above_f16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(cast1(above_bf16_tie, DType::kBFloat16), 0x3f81);
  EXPECT_EQ(cast1(-above_bf16_tie, DType::kBFloat16), 0xbf81);
  EXPECT_EQ(cast1(above_f16_tie, DType::kFloat16), 0x3c01);
  EXPECT_EQ(cast1(-above_f16_tie, DType::kFloat16), 0xbc01);
  // Exact ties still go to even; exact values stay exact.
  EXPECT_EQ(cast1(1.0 + std::ldexp(1.0, -8), DType::kBFloat16), 0x3f80);
  EXPECT_EQ(cast1(1.0 + 3 * std::ldexp(1.0, -8), DType::kBFloat16), 0x3f82);
  EXPECT_EQ(cast1(1.0 + std::ldexp(1.0, -11), DType::kFloat16), 0x3c00);
  EXPECT_EQ(cast1(1.5, DType::kFloat16), 0x3e00);
  EXPECT_EQ(cast1(1.5, DType::kBFloat16), 0x3fc0);
  // Beyond float's range: infinity; far below the smallest subnormal: zero.
  EXPECT_EQ(cast1(1e300, DType::kBFloat16), 0x7f80);
  EXPECT_EQ(cast1(-1e300, DType::kFloat16), 0xfc00);
  EXPECT_EQ(cast1(1e-300, DType::kBFloat16), 0x0000);
  EXPECT_EQ(cast1(-1e-300, DType::kFloat16), 0x8000);
  EXPECT_EQ(cast1(std::nan(""), DType::kBFloat16) & 0x7fc0, 0x7fc0);
  // float64 -> float32 is the one rounding, unchanged.
  double v = above_bf16_tie;
  float f = 0;
  ASSERT_TRUE(cast_elements(DType::kFloat64, DType::kFloat32, &v, &f, 1).ok());
  EXPECT_EQ(f, static_cast<float>(v));
}

TEST_P(ManagerTest, FloatDtypeCastOnSave) {
  auto m = manager();
  std::vector<float> w = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-3f, 0.0f};
  std::vector<LeafView> state = {LeafView::full("model", "w", DType::kFloat32, {6}, w.data())};
  ASSERT_TRUE(m->save(1, state, {.float_dtype = DType::kBFloat16}).value().wait().ok());
  auto idx = m->read_index(1);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->prefixes[0].leaves[0].dtype, DType::kBFloat16);
  auto r = m->restore(1, {.float_dtype = DType::kFloat32});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->leaves[0].dtype, DType::kFloat32);
  const float* got = reinterpret_cast<const float*>(r->leaves[0].data.data());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(got[i], w[i], std::abs(w[i]) / 128 + 1e-6) << i;
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.5f);
}

// A destination in `into` takes no cast, and that is found before any read:
// 1,100 int32 leaves, then one float32 leaf, every one with a destination,
// restored with float_dtype = bfloat16. Before, the first 1,024 leaves (the
// first chunk of the plan) were read into the caller's buffers before the
// float leaf's cast was refused. A float_dtype that is not a float dtype is
// refused before any read too.
TEST_P(ManagerTest, ACastIntoADestinationIsRefusedBeforeAnyRead) {
  auto m = manager();
  constexpr size_t kInts = 1100;
  std::vector<int32_t> ints(kInts);
  for (size_t i = 0; i < kInts; ++i) ints[i] = static_cast<int32_t>(i) + 1;
  std::vector<float> w = {1.5f, -2.0f};
  std::vector<LeafView> state;
  std::vector<std::string> names;
  for (size_t i = 0; i < kInts; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "i%05zu", i);
    names.push_back(name);
  }
  for (size_t i = 0; i < kInts; ++i)
    state.push_back(LeafView::full("model", names[i], DType::kInt32, {1}, &ints[i]));
  state.push_back(LeafView::full("model", "z.w", DType::kFloat32, {2}, w.data()));
  ASSERT_TRUE(m->save(1, state).value().wait().ok());
  std::vector<int32_t> got(kInts, -7);
  std::vector<float> got_w(2, -7.0f);
  RestoreOptions o;
  for (size_t i = 0; i < kInts; ++i) o.into.push_back({"model", names[i], &got[i], sizeof(int32_t)});
  o.into.push_back({"model", "z.w", got_w.data(), sizeof(float) * 2});
  o.float_dtype = DType::kBFloat16;
  auto r = m->restore(1, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("cannot take a cast"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(std::count(got.begin(), got.end(), -7), static_cast<long>(kInts)) << "a destination was written";
  EXPECT_EQ(got_w, std::vector<float>(2, -7.0f));
  o.float_dtype = DType::kInt32;
  r = m->restore(1, o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  EXPECT_EQ(std::count(got.begin(), got.end(), -7), static_cast<long>(kInts)) << "a destination was written";
  o.float_dtype.reset();  // and without a cast, all of them are filled
  r = m->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(got, ints);
  EXPECT_EQ(got_w, w);
}

TEST_P(ManagerTest, MultiShardLeafIsScatteredBack) {
  // A 6x10 float32 leaf held as four shards (a 2x2 grid of uneven boxes).
  auto m = manager();
  std::vector<float> full(60);
  for (int i = 0; i < 60; ++i) full[i] = static_cast<float>(i);
  auto box_bytes = [&](int r0, int r1, int c0, int c1) {
    std::vector<float> v;
    for (int r = r0; r < r1; ++r)
      for (int c = c0; c < c1; ++c) v.push_back(full[r * 10 + c]);
    return v;
  };
  auto s00 = box_bytes(0, 4, 0, 3), s01 = box_bytes(0, 4, 3, 10), s10 = box_bytes(4, 6, 0, 3),
       s11 = box_bytes(4, 6, 3, 10);
  LeafView leaf;
  leaf.prefix = "model";
  leaf.path = "grid";
  leaf.dtype = DType::kFloat32;
  leaf.shape = {6, 10};
  leaf.shards = {{{{0, 0}, {4, 3}}, s00.data()}, {{{0, 3}, {4, 10}}, s01.data()},
                 {{{4, 0}, {6, 3}}, s10.data()}, {{{4, 3}, {6, 10}}, s11.data()}};
  ASSERT_TRUE(m->save(1, {leaf}).value().wait().ok());
  auto idx = m->read_index(1);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->prefixes[0].leaves[0].shards.size(), 4u);
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves[0].data.size(), 240u);
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), full.data(), 240), 0);
  // Shards past the small-shard grouping (256 KiB), each read on its own into
  // a temporary and scattered as its batch completes; with and without
  // checksums.
  const int rows = 512, cols = 1024;
  std::vector<float> big(rows * cols);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  std::vector<std::vector<float>> parts;
  LeafView wide = leaf;
  wide.path = "wide";
  wide.shape = {rows, cols};
  wide.shards.clear();
  for (int r0 : {0, 300})
    for (int c0 : {0, 700}) {
      const int r1 = r0 == 0 ? 300 : rows, c1 = c0 == 0 ? 700 : cols;
      std::vector<float>& v = parts.emplace_back();
      for (int rr = r0; rr < r1; ++rr)
        for (int c = c0; c < c1; ++c) v.push_back(big[rr * cols + c]);
    }
  size_t k = 0;
  for (int r0 : {0, 300})
    for (int c0 : {0, 700}) {
      const int r1 = r0 == 0 ? 300 : rows, c1 = c0 == 0 ? 700 : cols;
      wide.shards.push_back({{{r0, c0}, {r1, c1}}, parts[k++].data()});
    }
  ASSERT_TRUE(m->save(3, {wide}).value().wait().ok());
  for (bool verify : {true, false}) {
    RestoreOptions o;
    o.verify = verify;
    r = m->restore(3, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves[0].data.size(), big.size() * 4);
    EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), big.data(), big.size() * 4), 0) << "verify " << verify;
  }
  // Overlapping or incomplete shard sets are refused up front.
  leaf.shards.pop_back();
  EXPECT_EQ(m->save(2, {leaf}).status().code(), Code::kInvalidArgument);
}

TEST_P(ManagerTest, CorruptDataIsNamedAndBadIndexIsSkipped) {
  auto m = manager();
  auto s1 = sample_state(13), s2 = sample_state(14);
  ASSERT_TRUE(m->save(1, views(s1)).value().wait().ok());
  ASSERT_TRUE(m->save(2, views(s2)).value().wait().ok());
  // Flip one byte of step 2's data: verify and restore name the leaf.
  auto idx = m->read_index(2);
  ASSERT_TRUE(idx.ok());
  const LeafRecord& victim = idx->prefixes[1].leaves[1];  // tx/opt_state.mu.kernel
  const std::string key = "run-2/" + victim.shards[0].file;
  auto data = base_->get(key, 1ull << 30);
  ASSERT_TRUE(data.ok());
  (*data)[victim.shards[0].offset + 5] ^= 0x01;
  ASSERT_TRUE(base_->remove(key).ok());
  auto w = base_->create(key, data->size());
  ASSERT_TRUE(w.ok());
  const size_t rounded = (data->size() + 4095) / 4096 * 4096;
  Buffer aligned = Buffer::allocate(rounded, 4096);
  std::byte* p = aligned.data();
  std::memcpy(p, data->data(), data->size());
  std::fill(p + data->size(), p + rounded, std::byte{0});
  uint64_t len = (*w)->granularity() > 1 ? rounded : data->size();
  std::promise<Status> done;
  (*w)->write_async(0, {p, len}, [&](Status st) { done.set_value(st); });
  ASSERT_TRUE(done.get_future().get().ok());
  ASSERT_TRUE((*w)->finish(data->size()).ok());

  Status v = m->verify(2);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  EXPECT_NE(v.message().find("tx/opt_state.mu.kernel shard 0"), std::string::npos) << v.to_string();
  auto r = m->restore(2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tx/opt_state.mu.kernel"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(m->verify(1).ok());

  // Damage step 2's index: discovery skips it, restore-latest falls back.
  std::string junk = "{\"format\": \"ckptio\", \"version\": 1, broken";
  ASSERT_TRUE(base_->put("run-2/ckptio_index.json", {reinterpret_cast<const std::byte*>(junk.data()), junk.size()}).ok());
  auto latest = m->latest_step();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value_or(-1), 1);
  auto rl = m->restore(std::nullopt);
  ASSERT_TRUE(rl.ok()) << rl.status().to_string();
  EXPECT_EQ(rl->step, 1);
  expect_restored(*rl, s1);
  // Strict mode refuses instead.
  auto strict = manager({.strict = true});
  EXPECT_FALSE(strict->restore(std::nullopt).ok());
  EXPECT_FALSE(strict->all_steps().ok());
}

TEST_P(ManagerTest, EmptyStateAndManyTinyLeaves) {
  auto m = manager();
  ASSERT_TRUE(m->save(1, {}).value().wait().ok());
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->leaves.empty());

  // 20,000 leaves: an index over 4 MiB, which restore reads in two parts,
  // parsing the first while the second is read.
  std::vector<OwnedLeaf> many;
  for (int i = 0; i < 20000; ++i)
    many.push_back(make_leaf(i % 2 ? "model" : "tx", "leaf." + std::to_string(i), DType::kUInt8,
                             {static_cast<int64_t>(i % 7)}, i));
  auto h = m->save(2, views(many));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  auto index = m->read_index(2);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  ASSERT_GT(serialize_index(*index).size(), size_t{4} << 20);
  r = m->restore(2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), many.size());
  // restore returns leaves grouped by prefix in index order
  size_t checked = 0;
  for (const Tensor& t : r->leaves) {
    int i = std::stoi(t.path.substr(5));
    ASSERT_EQ(t.data.size(), many[i].bytes.size());
    if (t.data.size()) EXPECT_EQ(std::memcmp(t.data.data(), many[i].bytes.data(), t.data.size()), 0);
    ++checked;
  }
  EXPECT_EQ(checked, 20000u);
}

TEST_P(ManagerTest, RestoreIntoCallerBuffers) {
  auto m = manager();
  auto state = sample_state(16);
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  // Destinations for two leaves, one at an odd address: bytes land there.
  std::vector<std::byte> a(state[0].bytes.size() + 1), b(state[5].bytes.size());
  RestoreOptions o;
  o.into = {{"model", "params.embed.embedding", a.data() + 1, state[0].bytes.size()},
            {"tx", "opt_state.mu.kernel", b.data(), b.size()}};
  auto r = m->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  EXPECT_EQ(r->leaves[0].data.data(), a.data() + 1);
  EXPECT_EQ(std::memcmp(a.data() + 1, state[0].bytes.data(), state[0].bytes.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), state[5].bytes.data(), b.size()), 0);
  // A destination of the wrong size is refused before any read.
  o.into[1].size -= 1;
  EXPECT_EQ(m->restore(1, o).status().code(), Code::kInvalidArgument);
  // So is one that names no leaf (misspelt), or a leaf `select` left out:
  // its memory would be left as it was while the restore succeeded.
  o.into[1].size += 1;
  o.into.push_back({"tx", "opt_state.mu.kernal", b.data(), b.size()});
  auto misspelt = m->restore(1, o);
  ASSERT_EQ(misspelt.status().code(), Code::kInvalidArgument) << misspelt.status().to_string();
  EXPECT_NE(misspelt.status().message().find("tx/opt_state.mu.kernal names no leaf"), std::string::npos)
      << misspelt.status().to_string();
  o.into.pop_back();
  o.select.prefixes = {"model"};
  EXPECT_EQ(m->restore(1, o).status().code(), Code::kInvalidArgument);
  // An earlier entry for a leaf that a later one takes is no such destination.
  o.select.prefixes.clear();
  o.into.insert(o.into.begin(), o.into[1]);
  EXPECT_TRUE(m->restore(1, o).ok());
}

// While alive, no new thread can be had: the default stack of a new thread
// is the whole user address space (2^47 bytes), which can never be mapped,
// so pthread_create fails with EAGAIN and std::thread and
// std::async(std::launch::async) throw std::system_error, as in a process at
// its thread limit. Threads that exist keep running.
class NoNewThreads {
 public:
  NoNewThreads() {
    pthread_getattr_default_np(&saved_);
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, size_t{1} << 47);
    EXPECT_EQ(pthread_setattr_default_np(&a), 0);
    pthread_attr_destroy(&a);
  }
  ~NoNewThreads() {
    pthread_setattr_default_np(&saved_);
    pthread_attr_destroy(&saved_);
  }

 private:
  pthread_attr_t saved_;
};

// A save and a restore at a process's thread limit do the work they would
// have given a thread on their own thread: the step commits and restores
// (before, restore threw std::system_error out of its first read batch and
// the save worker died in std::terminate).
TEST_P(ManagerTest, SaveAndRestoreWorkWhenNoThreadCanBeHad) {
  auto m = manager();  // its worker (and the local backend's ring thread) exist already
  auto state = sample_state(21);
  for (int i = 0; i < 3000; ++i)  // several read batches
    state.push_back(make_leaf("tx", "small." + std::to_string(i), DType::kUInt8, {1 + i % 97}, 100 + i));
  NoNewThreads no_threads;
  EXPECT_THROW(std::thread([] {}).join(), std::system_error) << "the test cannot take threads away";
  auto h = m->save(3, views(state));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 3);
  expect_restored(*r, state);
}

// Options that mean nothing are refused, not taken for something else
// (max_to_keep = -1 kept every step, max_in_flight = 0 ran one save).
TEST(ManagerOpen, NegativeRetentionAndNoSavesInFlightAreInvalid) {
  for (auto [field, change] : std::vector<std::pair<std::string, std::function<void(ManagerOptions&)>>>{
           {"max_in_flight must be >= 1, got 0", [](ManagerOptions& o) { o.max_in_flight = 0; }},
           {"max_to_keep must be >= 0", [](ManagerOptions& o) { o.max_to_keep = -1; }},
           {"keep_every must be >= 0", [](ManagerOptions& o) { o.keep_every = -3; }}}) {
    ManagerOptions o;
    change(o);
    auto m = CheckpointManager::open("mem://options-test", o);
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << field;
    EXPECT_NE(m.status().message().find(field), std::string::npos) << m.status().to_string();
  }
  auto m = CheckpointManager::open("mem://options-test");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->apply_retention(-1, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ((*m)->apply_retention(2, -1).code(), Code::kInvalidArgument);
  EXPECT_TRUE((*m)->apply_retention(0, 0).ok());
}

// A step format whose directory names a storage refuses: one ending in '.'
// (its stage directory "5..tmp-..." holds '..') or one past 255 bytes. They
// opened, and every save failed at its first file.
TEST(ManagerOpen, AStepFormatWhoseNamesAStorageRefusesIsInvalid) {
  for (const std::string& format : {std::string("{step}."), std::string("run-{step}."), std::string(240, 'a') + "{step}"}) {
    ManagerOptions o;
    o.step_format = format;
    auto m = CheckpointManager::open("mem://format-test", o);
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << format;
    EXPECT_NE(m.status().message().find("directory names a storage refuses"), std::string::npos)
        << m.status().to_string();
  }
  ManagerOptions o;
  o.step_format = "{step}.ckpt";  // a dot inside is fine
  auto m = CheckpointManager::open("mem://format-test", o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const float x = 1;
  EXPECT_TRUE((*m)->save(5, {LeafView::full("m", "x", DType::kFloat32, {}, &x)}).value().wait().ok());
}

// Opening local storage at the thread limit: its io_uring's completion
// thread cannot start. That is a limit of the process (kResourceExhausted,
// as out of memory), not a fault of the disk to retry (it was kUnavailable).
TEST(ManagerOpen, AtTheThreadLimitIsResourceExhausted) {
  const fs::path dir = fs::temp_directory_path() / ("ckptio-nothreads-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Result<std::unique_ptr<CheckpointManager>> m = Status(Code::kInternal, "not opened");
  {
    NoNewThreads no_threads;
    m = CheckpointManager::open(dir.string());
  }
  fs::remove_all(dir);
  ASSERT_EQ(m.status().code(), Code::kResourceExhausted) << m.status().to_string();
  EXPECT_NE(m.status().message().find("io_uring completion thread"), std::string::npos) << m.status().to_string();
}

// Small leaves of odd sizes and mixed dtypes, saved next to each other.
std::vector<OwnedLeaf> small_leaves(int n, uint64_t seed) {
  std::vector<OwnedLeaf> s;
  const DType dtypes[] = {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  for (int i = 0; i < n; ++i)
    s.push_back(make_leaf("model", "leaf." + std::to_string(1000 + i), dtypes[i % 4],
                          {static_cast<int64_t>(1 + (i * 37) % 301)}, seed + i));
  return s;
}

// Small shards next to each other are read with one request straight into
// the leaves restore allocates: one allocation for the group, each leaf a
// slice of it that keeps it alive.
TEST_P(ManagerTest, SmallLeavesAreReadIntoOneAllocationTheyShare) {
  auto m = manager();
  auto state = small_leaves(200, 7);
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  auto index = m->read_index(1);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  // Leaves whose shards follow each other in a file follow each other in
  // memory: one read landed in them.
  const auto& saved = index->prefixes.at(0).leaves;
  size_t adjacent = 0;
  for (size_t i = 1; i < saved.size(); ++i) {
    const ShardRecord &a = saved[i - 1].shards.at(0), &b = saved[i].shards.at(0);
    if (a.file != b.file || b.offset != a.offset + a.length) continue;
    EXPECT_EQ(r->leaves[i].data.data(), r->leaves[i - 1].data.data() + a.length) << saved[i].path;
    ++adjacent;
  }
  EXPECT_GT(adjacent, 100u);
  // One leaf kept, the rest of the restore dropped: its bytes stay valid
  // (ASan reports a use after free otherwise).
  Buffer kept = r->leaves[57].data;
  r = Status(Code::kInternal, "dropped");
  ASSERT_EQ(kept.size(), state[57].bytes.size());
  EXPECT_EQ(std::memcmp(kept.data(), state[57].bytes.data(), kept.size()), 0);
  EXPECT_THROW((void)kept.slice(1, kept.size()), std::out_of_range);
  EXPECT_EQ(kept.slice(1, kept.size() - 1).data(), kept.data() + 1);
}

// Destinations that lie in memory as their shards lie in the file take one
// read of the group; any other layout (gaps between destinations, some
// leaves without one) still restores every byte and writes nothing outside
// the destinations. 3,500 leaves: restore plans them in three chunks (1,024,
// 2,048, the rest), the later ones while the first are read.
TEST_P(ManagerTest, RestoreIntoOneArenaWritesOnlyTheDestinations) {
  auto m = manager();
  auto state = small_leaves(3500, 11);
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  auto index = m->read_index(1);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  const auto& saved = index->prefixes.at(0).leaves;
  for (uint64_t gap : {0, 1, 64}) {
    for (int mode : {0, 1, 2}) {
      // Every leaf in the index's order, every other leaf, every leaf listed
      // backwards: restore finds each destination by name in all three.
      const bool every_leaf = mode != 1, backwards = mode == 2;
      SCOPED_TRACE("gap " + std::to_string(gap) + (mode == 0 ? ", every leaf" : mode == 1 ? ", every other leaf" : ", every leaf backwards"));
      // Each destination at the same distance from the one before as its
      // shard from the shard before, plus `gap` bytes never to be written.
      std::vector<uint64_t> at;
      uint64_t size = 4096;  // a margin before the first, then the file's phase
      size += saved[0].shards[0].offset % 4096;
      for (size_t i = 0; i < saved.size(); ++i) {
        if (i > 0) {
          const ShardRecord &a = saved[i - 1].shards[0], &b = saved[i].shards[0];
          size += (a.file == b.file && b.offset >= a.offset + a.length ? b.offset - a.offset - a.length : 0) + gap;
        }
        at.push_back(size);
        size += saved[i].shards[0].length;
      }
      size += 4096;
      std::vector<std::byte> arena(size + 4096, std::byte{0xA5});
      std::byte* base = arena.data() + (4096 - reinterpret_cast<uintptr_t>(arena.data()) % 4096) % 4096;
      std::vector<bool> is_dest(arena.size(), false);
      RestoreOptions o;
      for (size_t i = 0; i < saved.size(); ++i) {
        if (!every_leaf && i % 2) continue;
        o.into.push_back({"model", saved[i].path, base + at[i], saved[i].shards[0].length});
        for (uint64_t k = 0; k < saved[i].shards[0].length; ++k) is_dest[base - arena.data() + at[i] + k] = true;
      }
      if (backwards) std::reverse(o.into.begin(), o.into.end());
      auto r = m->restore(1, o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      expect_restored(*r, state);
      size_t touched = 0;
      for (size_t k = 0; k < arena.size(); ++k)
        if (!is_dest[k] && arena[k] != std::byte{0xA5}) ++touched;
      EXPECT_EQ(touched, 0u) << "bytes written outside the destinations";
      for (size_t i = 0; i < saved.size(); ++i)
        if (every_leaf || i % 2 == 0) EXPECT_EQ(r->leaves[i].data.data(), base + at[i]);
    }
  }
  // A destination of the wrong size in the last chunk is refused, and
  // nothing is read: the arena stays as it was.
  std::vector<std::byte> arena(8 << 20, std::byte{0xA5});
  RestoreOptions o;
  uint64_t used = 0;
  for (const LeafRecord& l : saved) {
    ASSERT_LE(used + l.num_bytes(), arena.size());
    o.into.push_back({"model", l.path, arena.data() + used, l.num_bytes()});
    used += l.num_bytes() + 8;
  }
  o.into[3400].size += 1;
  auto r = m->restore(1, o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find(saved[3400].path), std::string::npos) << r.status().to_string();
  EXPECT_EQ(std::count(arena.begin(), arena.end(), std::byte{0xA5}), static_cast<std::ptrdiff_t>(arena.size()));
}

// restore_arena_layout places leaves as their shards lie in the files
// (file neighbours adjacent, others at their file phase): restore reads
// into such an arena in place and writes nothing outside the leaves.
TEST_P(ManagerTest, ArenaLayoutPlacesLeavesAsTheirShardsLie) {
  auto m = manager();
  auto state = small_leaves(150, 17);
  state.insert(state.begin() + 70, make_leaf("model", "big.1", DType::kFloat32, {300, 700}, 5));
  state.push_back(make_leaf("tx", "count", DType::kInt64, {}, 6));
  for (int i = 0; i < 30; ++i) state.push_back(make_leaf("tx", "mu." + std::to_string(100 + i), DType::kUInt8, {i * 13 + 1}, 7 + i));
  ASSERT_TRUE(m->save(1, views(state)).value().wait().ok());
  auto index = m->read_index(1);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  const uint64_t align = std::max<uint64_t>(base_->read_alignment(), 1);
  const ArenaLayout layout = restore_arena_layout(*index, align);
  std::vector<const LeafRecord*> leaves;
  for (const PrefixRecord& p : index->prefixes)
    for (const LeafRecord& l : p.leaves) leaves.push_back(&l);
  ASSERT_EQ(layout.offsets.size(), leaves.size());
  EXPECT_EQ(layout.alignment % 64, 0u);
  EXPECT_EQ(layout.alignment % align, 0u);
  size_t adjacent = 0;
  for (size_t i = 0; i < leaves.size(); ++i) {
    const ShardRecord& r = leaves[i]->shards.at(0);
    EXPECT_EQ(layout.offsets[i] % align, r.offset % align) << leaves[i]->path;
    EXPECT_LE(layout.offsets[i] + leaves[i]->num_bytes(), layout.bytes);
    if (i == 0) continue;
    EXPECT_GE(layout.offsets[i], layout.offsets[i - 1] + leaves[i - 1]->num_bytes()) << "overlap at " << leaves[i]->path;
    const ShardRecord& b = leaves[i - 1]->shards.at(0);
    if (b.file == r.file && r.offset == b.offset + b.length) {
      EXPECT_EQ(layout.offsets[i], layout.offsets[i - 1] + b.length) << leaves[i]->path;
      ++adjacent;
    }
  }
  EXPECT_GT(adjacent, leaves.size() / 2) << "the save packed too few leaves for this test to mean much";

  std::vector<std::byte> arena(layout.bytes + 2 * layout.alignment, std::byte{0xA5});
  const size_t lead = (layout.alignment - reinterpret_cast<uintptr_t>(arena.data()) % layout.alignment) % layout.alignment;
  std::byte* base = arena.data() + lead;
  std::vector<bool> inside(arena.size(), false);
  RestoreOptions o;
  size_t i = 0;
  for (const PrefixRecord& p : index->prefixes)
    for (const LeafRecord& l : p.leaves) {
      o.into.push_back({p.name, l.path, base + layout.offsets[i], l.num_bytes()});
      std::fill_n(inside.begin() + lead + layout.offsets[i], l.num_bytes(), true);
      ++i;
    }
  auto r = m->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state);
  for (size_t k = 0; k < leaves.size(); ++k) EXPECT_EQ(r->leaves[k].data.data(), base + layout.offsets[k]);
  size_t touched = 0;
  for (size_t k = 0; k < arena.size(); ++k)
    if (!inside[k] && arena[k] != std::byte{0xA5}) ++touched;
  EXPECT_EQ(touched, 0u) << "bytes written outside the leaves";
}

TEST_P(ManagerTest, StepFormatFollowsOption) {
  auto m = manager({.step_format = "{step}"});
  auto state = sample_state(15);
  ASSERT_TRUE(m->save(42, views(state)).value().wait().ok());
  EXPECT_TRUE(base_->stat("42/ckptio_index.json").ok());
  EXPECT_EQ(m->latest_step().value().value_or(-1), 42);
  auto other = manager();  // run-{step}: does not see "42"
  EXPECT_FALSE(other->latest_step().value().has_value());
}

// Every step save() takes is one discovery finds: steps of 19 digits (ids
// taken from a clock in nanoseconds are ~1.7e18) up to INT64_MAX included.
TEST_P(ManagerTest, NineteenDigitStepsAreDiscovered) {
  auto m = manager();
  auto state = sample_state(16);
  const int64_t big = 1'700'000'000'000'000'000, most = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(m->save(big, views(state)).value().wait().ok());
  EXPECT_EQ(m->latest_step().value().value_or(-1), big);
  ASSERT_TRUE(m->save(most, views(state)).value().wait().ok());
  EXPECT_EQ(m->all_steps().value(), (std::vector<int64_t>{big, most}));
  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, most);
}

// A step directory copied by hand under another step's name: its index
// records step 5, and restore would read run-5's data for "step 7" (and
// retention could delete run-5 under it). Refused as damage instead.
TEST_P(ManagerTest, AnIndexThatRecordsAnotherStepIsDamage) {
  auto m = manager();
  auto state5 = sample_state(17), state6 = sample_state(18);
  ASSERT_TRUE(m->save(5, views(state5)).value().wait().ok());
  ASSERT_TRUE(m->save(6, views(state6)).value().wait().ok());
  auto objs = base_->list("run-5/", false);
  ASSERT_TRUE(objs.ok());
  for (const auto& o : objs->objects) {
    auto bytes = base_->get(o.key, 1 << 30);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    ASSERT_TRUE(base_->put("run-7/" + o.key.substr(6), std::as_bytes(std::span(*bytes))).ok());
  }
  auto idx = m->read_index(7);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss) << idx.status().to_string();
  EXPECT_NE(idx.status().message().find("records step 5, not 7"), std::string::npos) << idx.status().to_string();
  EXPECT_EQ(m->restore(7).status().code(), Code::kDataLoss);
  auto r = m->restore(std::nullopt);  // the newest good step, past the damaged one
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 6);
  expect_restored(*r, state6);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].step, 7);
}

// Saves step 5, holds a restore of it inside its first read of a data key
// (`is_data`) for a second, overwrites the step meanwhile: the restore reads
// the step it began with whole, and the overwrite then lands.
void expect_an_overwrite_waits_for_a_restore(CheckpointManager& m, FaultStorage& faults,
                                             const std::function<bool(const std::string&)>& is_data) {
  auto old_state = sample_state(19), new_state = sample_state(20);
  ASSERT_TRUE(m.save(5, views(old_state)).value().wait().ok());
  std::promise<void> reading;
  std::atomic<bool> armed{true};
  faults.set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kRead && is_data(key) && armed.exchange(false)) {
      reading.set_value();
      std::this_thread::sleep_for(std::chrono::seconds(1));  // the overwrite would land now
    }
  });
  auto restore = std::async(std::launch::async, [&] { return m.restore(5); });
  reading.get_future().wait();
  auto h = m.save(5, views(new_state), {.overwrite = true});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto r = restore.get();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, old_state);
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  faults.set_hook(nullptr);
  auto again = m.restore(5);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  expect_restored(*again, new_state);
}

// An overwrite of a step that a restore is reading: on POSIX the commit
// exchanges the directories and the replaced files go. It waits for the
// restore (as retention does), which reads the step it began with whole.
TEST_P(ManagerTest, AnOverwriteWaitsForARestoreOfTheStep) {
  auto m = manager();
  expect_an_overwrite_waits_for_a_restore(
      *m, *faults_, [](const std::string& key) { return key.find("run-5/data-") != std::string::npos; });
}

// The same in eformer's layout. On an object store its writer removes the
// old step's objects as it starts: the overwrite now waits for the restore
// from then on (it waited only at its commit, and the restore lost its
// chunks: NotFound).
TEST_P(ManagerTest, AnEformerOverwriteWaitsForARestoreOfTheStep) {
  ManagerOptions o;
  o.layout = "eformer";
  auto m = manager(o);
  expect_an_overwrite_waits_for_a_restore(*m, *faults_, [](const std::string& key) {  // a chunk
    return key.starts_with("run-5/") && !key.ends_with(".json") && !key.ends_with(".zarray");
  });
}

TEST_P(ManagerTest, InvalidInputIsRefusedAtOnce) {
  auto m = manager();
  std::vector<float> w(4);
  EXPECT_EQ(m->save(-1, {}).status().code(), Code::kInvalidArgument);
  auto dup = {LeafView::full("model", "a", DType::kFloat32, {4}, w.data()),
              LeafView::full("model", "a", DType::kFloat32, {4}, w.data())};
  EXPECT_EQ(m->save(1, dup).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m->save(1, {LeafView::full("", "a", DType::kFloat32, {4}, w.data())}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(m->save(1, {LeafView::full("model", "a", DType::kFloat32, {-4}, w.data())}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(m->save(1, {LeafView::full("model", "a", DType::kFloat32, {4}, nullptr)}).status().code(),
            Code::kInvalidArgument);
  // What the index reader refuses: refused here, not after the data is written.
  for (const char* prefix : {".", ".."})
    EXPECT_EQ(m->save(1, {LeafView::full(prefix, "a", DType::kFloat32, {4}, w.data())}).status().code(),
              Code::kInvalidArgument) << prefix;
  Shape rank33(33, 1);
  auto deep = m->save(1, {LeafView::full("model", "a", DType::kFloat32, rank33, w.data())});
  EXPECT_EQ(deep.status().code(), Code::kInvalidArgument) << deep.status().to_string();
  EXPECT_NE(deep.status().message().find("rank 33"), std::string::npos) << deep.status().to_string();
  EXPECT_EQ(m->restore(5).status().code(), Code::kNotFound);
  EXPECT_EQ(m->restore(std::nullopt).status().code(), Code::kNotFound);
  Shape rank32(32, 1);  // the limit itself is fine
  EXPECT_TRUE(m->save(1, {LeafView::full("model", "a", DType::kFloat32, rank32, w.data())}).value().wait().ok());
  EXPECT_TRUE(m->restore(1).ok());
}

TEST_P(ManagerTest, BorrowModeWritesLargeShardsStraightFromCallerMemory) {
  // Leaves large enough for zero-copy ranges, at addresses that are not
  // 4096-aligned (std::vector), beside small ones; chunks far smaller.
  std::vector<OwnedLeaf> state;
  state.push_back(make_leaf("model", "a.small", DType::kFloat32, {1000, 3}, 41));
  state.push_back(make_leaf("model", "b.large", DType::kBFloat16, {1537, 1031}, 42));  // ~3 MiB
  state.push_back(make_leaf("model", "c.tiny", DType::kInt8, {7}, 43));
  state.push_back(make_leaf("tx", "d.large", DType::kFloat32, {1 << 20}, 44));  // 4 MiB
  state.push_back(make_leaf("tx", "e.last", DType::kUInt8, {(5 << 20) + 3}, 45));
  auto saved = state;
  for (StagingMode mode : {StagingMode::kBorrow, StagingMode::kCopy}) {
    auto m = manager({.staging = mode, .staging_budget = 4 << 20, .chunk_size = 1 << 20});
    const int64_t step = mode == StagingMode::kBorrow ? 1 : 2;
    auto h = m->save(step, views(state));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    h->wait_released();
    // Released: the caller may now change its buffers; the step must hold
    // what they held at save().
    for (auto& l : state) std::fill(l.bytes.begin(), l.bytes.end(), std::byte{0x5A});
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    state = saved;
    auto r = m->restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, saved);
    EXPECT_TRUE(m->verify(step).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ManagerTest, testutil::local_backends(), testutil::backend_name);


// ---- Write ranges and the backend's write granularity -------------------------

// Over a memory store, reports a large write granularity (an object store's
// part size; not a power of two) and checks the seam's contract on every
// write: offsets and lengths are multiples of it (the range ending the object
// excepted) and data pointers are 4096-aligned. It also counts writes whose
// bytes come straight from a registered caller buffer (zero copy).
class CoarseStorage final : public Storage {
 public:
  // `memory_align`: what write_memory_alignment() reports and the writer
  // checks of every data pointer (4096 as O_DIRECT, 1 as an object store).
  CoarseStorage(std::shared_ptr<Storage> base, uint64_t granularity, uint64_t memory_align = 4096)
      : base_(std::move(base)), gran_(granularity), mem_(memory_align) {}

  struct Log {
    std::mutex mu;
    std::vector<std::string> violations;
    uint64_t writes = 0, direct_writes = 0;
    uint64_t final_size = 0;  // of the last object finished
    std::vector<uint64_t> finished;  // final sizes of every object finished, in order
    std::vector<std::pair<const std::byte*, size_t>> caller;  // registered buffers
  };
  Log log;

  StorageCaps caps() const override { return base_->caps(); }
  std::string describe() const override { return "coarse+" + base_->describe(); }
  uint64_t write_granularity() const override { return gran_; }
  uint64_t write_memory_alignment() const override { return mem_; }
  uint64_t data_object_bytes() const override { return object_bytes; }
  uint64_t object_bytes = 0;  // what data_object_bytes() reports
  int fail_create_at = 0;     // > 0: that create() (counting from 1) fails
  std::atomic<int> creates{0};
  uint64_t read_alignment() const override { return base_->read_alignment(); }
  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    if (fail_create_at > 0 && ++creates == fail_create_at) return Status(Code::kIOError, "injected: create " + key);
    auto w = base_->create(key, size_hint);
    if (!w.ok()) return w.status();
    return std::unique_ptr<WritableObject>(new Writer(this, std::move(w).value()));
  }
  Status put(const std::string& k, std::span<const std::byte> d) override { return base_->put(k, d); }
  Result<std::string> get(const std::string& k, uint64_t m) override { return base_->get(k, m); }
  Result<uint64_t> stat(const std::string& k) override { return base_->stat(k); }
  Status read(std::span<const ReadRequest> r) override { return base_->read(r); }
  Result<ListResult> list(const std::string& p, bool d) override { return base_->list(p, d); }
  Status remove(const std::string& k) override { return base_->remove(k); }
  Status remove_prefix(const std::string& p) override { return base_->remove_prefix(p); }
  Status rename(const std::string& f, const std::string& t, RenameMode m) override { return base_->rename(f, t, m); }
  Status sync(const std::string& p) override { return base_->sync(p); }

 private:
  class Writer final : public WritableObject {
   public:
    Writer(CoarseStorage* owner, std::unique_ptr<WritableObject> base) : owner_(owner), base_(std::move(base)) {}
    uint64_t granularity() const override { return owner_->gran_; }
    uint64_t alignment() const override { return 1; }
    void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
      {
        std::lock_guard lock(owner_->log.mu);
        ++owner_->log.writes;
        if (offset % owner_->gran_ != 0)
          owner_->log.violations.push_back("offset " + std::to_string(offset));
        if (data.size() % owner_->gran_ != 0) short_writes_.push_back(offset + data.size());
        if (reinterpret_cast<uintptr_t>(data.data()) % owner_->mem_ != 0)
          owner_->log.violations.push_back("unaligned data pointer at offset " + std::to_string(offset));
        for (const auto& [p, n] : owner_->log.caller)
          if (data.data() >= p && data.data() < p + n) ++owner_->log.direct_writes;
      }
      base_->write_async(offset, data, std::move(done));
    }
    Status finish(uint64_t final_size) override {
      {
        std::lock_guard lock(owner_->log.mu);
        // Only the range that ends the object may be short.
        for (uint64_t end : short_writes_)
          if (end < final_size)
            owner_->log.violations.push_back("short range ending at " + std::to_string(end) +
                                             " before the end " + std::to_string(final_size));
        owner_->log.final_size = final_size;
        owner_->log.finished.push_back(final_size);
      }
      return base_->finish(final_size);
    }
    void abort() override { base_->abort(); }

   private:
    CoarseStorage* owner_;
    std::unique_ptr<WritableObject> base_;
    std::vector<uint64_t> short_writes_;
  };

  std::shared_ptr<Storage> base_;
  const uint64_t gran_;
  const uint64_t mem_;
};

// Leaves in 4096-aligned memory at a chosen phase (the address modulo 4096),
// as a caller's arrays: what decides whether zero copy is possible.
struct PlacedLeaves {
  std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> memory;
  std::vector<OwnedLeaf> want;
  std::vector<LeafView> leaves;
  uint64_t total = 0;  // bytes of all leaves

  void add(std::string path, DType dtype, Shape shape, uint64_t seed, size_t phase = 0) {
    OwnedLeaf l = make_leaf("model", std::move(path), dtype, std::move(shape), seed);
    const size_t n = std::max<size_t>(l.bytes.size() + phase, 1);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    std::memcpy(p + phase, l.bytes.data(), l.bytes.size());
    memory.emplace_back(p, &std::free);
    leaves.push_back(LeafView::full(l.prefix, l.path, l.dtype, l.shape, p + phase));
    total += l.bytes.size();
    want.push_back(std::move(l));
  }
  // Tells the storage which writes come straight from these leaves.
  void register_with(CoarseStorage& storage) const {
    for (size_t i = 0; i < leaves.size(); ++i)
      storage.log.caller.emplace_back(static_cast<const std::byte*>(leaves[i].shards[0].data),
                                      want[i].bytes.size());
  }
};

TEST(ManagerGranularityTest, ChunksFollowALargeWriteGranularityInBothStagingModes) {
  constexpr uint64_t kGran = 3 * (4ull << 20);  // 12 MiB: an S3-like part, not a power of two
  // 4096-aligned leaves (so zero copy is possible) of sizes around the
  // granularity, with small ones between them.
  PlacedLeaves state;
  state.add("a.big", DType::kFloat32, {(int64_t)(kGran / 4) * 2 + 999}, 1);  // 2 parts and a bit
  state.add("b.small", DType::kInt16, {333}, 2);
  state.add("c.big", DType::kUInt8, {(int64_t)kGran * 3}, 3);
  state.add("d.scalar", DType::kFloat64, {}, 4);
  state.add("e.odd", DType::kUInt8, {(int64_t)kGran + 12345}, 5);

  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    SCOPED_TRACE(mode == StagingMode::kCopy ? "copy" : "borrow");
    auto storage = std::make_shared<CoarseStorage>(make_memory_storage(false), kGran);
    state.register_with(*storage);
    // A chunk far below the granularity, and a pool of two chunks: the
    // manager must round the chunk up before it cuts or copies anything.
    ManagerOptions o;
    o.staging = mode;
    o.chunk_size = 1 << 20;
    o.staging_budget = 2 * kGran;
    auto m = std::make_unique<CheckpointManager>(storage, o);
    auto h = m->save(1, state.leaves);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    {
      std::lock_guard lock(storage->log.mu);
      EXPECT_TRUE(storage->log.violations.empty()) << storage->log.violations.front();
      EXPECT_GE(storage->log.writes, 6u);
      if (mode == StagingMode::kBorrow) {
        EXPECT_GT(storage->log.direct_writes, 0u) << "no part was written straight from the caller";
      } else {
        EXPECT_EQ(storage->log.direct_writes, 0u);
      }
    }
    auto r = m->restore(1);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state.want);
    EXPECT_TRUE(m->verify(1).ok());
  }
}

TEST(ManagerGranularityTest, ObjectStoresGetPackedShardsAndZeroCopyFromAnyAddress) {
  // An object store takes part bodies from any address: a borrow-mode save
  // must neither pad large shards to 4 KiB phases (each gap would split the
  // restore's ranged reads) nor give up zero copy for unaligned memory. (A
  // shard starts at a multiple of its dtype's size: d.big's float64s 2 bytes
  // after c.big's uint8s.)
  constexpr uint64_t kGran = 5ull << 20;  // S3's smallest part
  PlacedLeaves state;
  state.add("a.big", DType::kFloat32, {(int64_t)(kGran / 4) * 3 + 17}, 1, 8);  // address 8 mod 4096
  state.add("b.small", DType::kInt16, {333}, 2, 0);
  state.add("c.big", DType::kUInt8, {(int64_t)kGran * 2 + 4000}, 3, 1000);
  state.add("d.big", DType::kFloat64, {(int64_t)(kGran / 8) * 2 + 5}, 4, 0);

  for (uint64_t mem : {uint64_t{1}, uint64_t{4096}}) {
    SCOPED_TRACE("memory alignment " + std::to_string(mem));
    auto storage = std::make_shared<CoarseStorage>(make_memory_storage(false), kGran, mem);
    state.register_with(*storage);
    ManagerOptions o;
    o.staging = StagingMode::kBorrow;
    auto m = std::make_unique<CheckpointManager>(storage, o);
    auto h = m->save(1, state.leaves);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    {
      std::lock_guard lock(storage->log.mu);
      EXPECT_TRUE(storage->log.violations.empty()) << storage->log.violations.front();
      if (mem == 1) {
        // (At most each dtype's alignment between shards, never 4 KiB phases.)
        EXPECT_GE(storage->log.final_size, state.total);
        EXPECT_LT(storage->log.final_size, state.total + 16 * state.leaves.size())
            << "phase padding between shards on an object store";
        EXPECT_GE(storage->log.direct_writes, 3u) << "unaligned caller memory was staged, not sent in place";
      } else {
        EXPECT_GT(storage->log.final_size, state.total) << "O_DIRECT-like storage: shards phase-aligned";
      }
    }
    auto r = m->restore(1);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state.want);
    EXPECT_TRUE(m->verify(1).ok());
  }
}

TEST(ManagerGranularityTest, ObjectStoresBoundEachDataObjectToOnePart) {
  // Storage::data_object_bytes() = one part: the save cuts its data into
  // objects of at most a part at shard boundaries (a larger shard alone),
  // each written in one request, and the index and restore follow.
  constexpr uint64_t kGran = 5ull << 20;
  PlacedLeaves state;
  for (int i = 0; i < 24; ++i)  // 24 x ~0.6 MiB: several objects of small leaves
    state.add("small." + std::to_string(i), DType::kFloat32, {150'000 + i}, 10 + i, 8 * i);
  state.add("big", DType::kUInt8, {(int64_t)kGran * 2 + 4000}, 3, 1000);  // 3 parts: its own object
  state.add("scalar", DType::kFloat64, {}, 4);
  state.add("mid", DType::kInt16, {(int64_t)kGran / 2}, 5);  // exactly one part

  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    SCOPED_TRACE(mode == StagingMode::kCopy ? "copy" : "borrow");
    auto base = make_memory_storage(false);
    auto storage = std::make_shared<CoarseStorage>(base, kGran, 1);
    storage->object_bytes = kGran;
    ManagerOptions o;
    o.staging = mode;
    auto m = std::make_unique<CheckpointManager>(storage, o);
    auto h = m->save(1, state.leaves);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    EXPECT_EQ(h->stats().bytes, state.total) << "object stores are packed: no padding anywhere";

    auto text = base->get("run-1/ckptio_index.json", 1 << 20);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    auto index = parse_index(*text);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    std::map<std::string, uint64_t> file_size;
    std::map<std::string, std::vector<const ShardRecord*>> in_file;
    for (const DataFileRecord& f : index->files) file_size[f.name] = f.size;
    for (const PrefixRecord& p : index->prefixes)
      for (const LeafRecord& l : p.leaves)
        for (const ShardRecord& sh : l.shards) in_file[sh.file].push_back(&sh);
    // 14.4 MiB of small leaves need at least 3 objects, plus one for "big".
    EXPECT_GE(index->files.size(), 5u);
    uint64_t sum = 0;
    for (const auto& [name, size] : file_size) {
      SCOPED_TRACE(name);
      sum += size;
      const auto& shards = in_file[name];
      if (size > kGran) {
        ASSERT_EQ(shards.size(), 1u) << "an object above one part holds anything but one large shard";
        EXPECT_EQ(shards[0]->length, kGran * 2 + 4000);
      }
      uint64_t used = 0;
      for (const ShardRecord* sh : shards) used += sh->length;
      EXPECT_EQ(used, size) << "a data object holds bytes no shard refers to";
    }
    EXPECT_EQ(sum, state.total);
    {
      std::lock_guard lock(storage->log.mu);
      EXPECT_TRUE(storage->log.violations.empty()) << storage->log.violations.front();
      EXPECT_EQ(storage->log.finished.size(), index->files.size());
    }
    auto r = m->restore(1);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state.want);
    EXPECT_TRUE(m->verify(1).ok());
  }
}

TEST(ManagerGranularityTest, AFailedCreateOfALaterDataObjectFailsTheSaveAndLeavesNothing) {
  // Data objects are created as their first range comes up: a failure there
  // (the third object here) must fail the save, stop the copiers without
  // blocking the caller, abort the objects already started, and leave the
  // previous step as the latest.
  constexpr uint64_t kGran = 5ull << 20;
  PlacedLeaves state;
  for (int i = 0; i < 12; ++i) state.add("l." + std::to_string(i), DType::kUInt8, {(int64_t)(3 << 20)}, 20 + i);
  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    SCOPED_TRACE(mode == StagingMode::kCopy ? "copy" : "borrow");
    auto base = make_memory_storage(false);
    auto storage = std::make_shared<CoarseStorage>(base, kGran, 1);
    storage->object_bytes = kGran;  // 3 MiB leaves: one per object
    ManagerOptions o;
    o.staging = mode;
    o.staging_budget = 2 * kGran;  // a small pool: the copiers must not be left waiting
    auto m = std::make_unique<CheckpointManager>(storage, o);
    auto h1 = m->save(1, state.leaves);
    ASSERT_TRUE(h1.ok() && h1->wait().ok());
    const int before = storage->creates.load();
    storage->fail_create_at = before + 3;
    auto h2 = m->save(2, state.leaves);
    ASSERT_TRUE(h2.ok()) << h2.status().to_string();
    Status st = h2->wait();
    EXPECT_EQ(st.code(), Code::kIOError) << st.to_string();
    EXPECT_NE(st.message().find("injected"), std::string::npos) << st.to_string();
    EXPECT_GE(storage->creates.load(), before + 3);
    auto steps = m->all_steps();
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ(*steps, std::vector<int64_t>{1});
    auto left = base->list("run-2/", false);
    ASSERT_TRUE(left.ok());
    EXPECT_TRUE(left->objects.empty()) << left->objects.size() << " objects left, e.g. " << left->objects[0].key;
    auto r = m->restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->step, 1);
    expect_restored(*r, state.want);
  }
}

TEST(Crc32cTest, CombineJoinsPiecesInOrder) {
  // The standard check value, and every split of a buffer joined back.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const auto bytes = random_bytes(3000, 99);
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{1024}, size_t{2999}, size_t{3000}}) {
    const uint32_t a = crc32c(bytes.data(), cut);
    const uint32_t b = crc32c(bytes.data() + cut, bytes.size() - cut);
    EXPECT_EQ(crc32c_combine(a, b, bytes.size() - cut), whole) << cut;
  }
  // Three pieces, joined left to right as the save worker does.
  uint32_t acc = 0;
  for (auto [at, n] : {std::pair<size_t, size_t>{0, 100}, {100, 2000}, {2100, 900}})
    acc = crc32c_combine(acc, crc32c(bytes.data() + at, n), n);
  EXPECT_EQ(acc, whole);
}

TEST(CrewTest, RunsOnTheCallerAndEveryHelper) {
  Crew crew(3);
  EXPECT_EQ(crew.size(), 4u);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> calls{0}, work{0};
    std::atomic<int> next{0};
    crew.run([&] {
      ++calls;
      while (next.fetch_add(1) < 1000) ++work;
    });
    EXPECT_EQ(calls.load(), 4);
    EXPECT_EQ(work.load(), 1000);
  }
}

TEST(SavePlanTest, WholeLeavesFirstThenShardsByWhereTheyStartInDimensionZero) {
  // Sharded leaves interleaved with whole ones: a resharded restore needs
  // every whole (replicated) leaf, and finds them together at the start; then
  // the shards by the fraction of dimension 0 before them, so that a restore
  // splitting dimension 0 finds the parts of all leaves it needs together.
  std::vector<std::byte> bytes(64);
  auto whole = [&](std::string path) {
    return LeafView::full("m", std::move(path), DType::kUInt8, {4}, bytes.data());
  };
  auto split = [&](std::string path, int64_t size, int64_t at) {
    LeafView v;
    v.prefix = "m";
    v.path = std::move(path);
    v.dtype = DType::kUInt8;
    v.shape = {size};
    v.shards.push_back(ShardView{Box{{0}, {at}}, bytes.data()});
    v.shards.push_back(ShardView{Box{{at}, {size}}, bytes.data() + at});
    return v;
  };
  auto partial = [&](std::string path) {  // one shard of a leaf another process writes the rest of
    LeafView v = split(std::move(path), 8, 4);
    v.shards.resize(1);
    return v;
  };
  const std::vector<LeafView> leaves = {split("a", 8, 4), whole("b"),          partial("c"), whole("d"),
                                        split("e", 8, 4), split("f", 9, 3),   split("g", 12, 6)};
  const SavePlan plan = plan_save(leaves);
  std::vector<std::pair<size_t, size_t>> order;
  uint64_t pos = 0;
  for (const PlannedShard& p : plan.shards) {
    order.emplace_back(p.leaf, p.shard);
    EXPECT_EQ(p.offset, pos);
    pos += p.length;
  }
  EXPECT_EQ(plan.total, pos);
  // Whole: b, d. From 0: a, c, e, f, g. From 1/3: f. From 1/2: a, e, g (a tie: leaf order).
  const std::vector<std::pair<size_t, size_t>> want = {{1, 0}, {3, 0}, {0, 0}, {2, 0}, {4, 0}, {5, 0},
                                                       {6, 0}, {5, 1}, {0, 1}, {4, 1}, {6, 1}};
  EXPECT_EQ(order, want);
}

TEST(SavePlanTest, RowBandsCutShardsWhereSplitsOfDimensionZeroWould) {
  // 20 rows of 32 KiB; shards [0,10) and [10,20) of 320 KiB; bands of at
  // least 96 KiB (3 rows). Up to 4 ways: n=2 cuts at 10 (a shard edge), n=3
  // (tiles of 7) at 7 and 14, n=4 (tiles of 5) at 5, 10, 15. 5 and 15 would
  // leave bands of 2 and 1 rows beside the 3-way cuts, which win.
  const int64_t row = 32 << 10;
  static_assert(kRowBandMinBytes == 3 * (32 << 10));
  std::vector<std::byte> bytes(20 * row);
  LeafView big;
  big.prefix = "m";
  big.path = "big";
  big.dtype = DType::kUInt8;
  big.shape = {20, row};
  big.shards.push_back(ShardView{Box{{0, 0}, {10, row}}, bytes.data()});
  big.shards.push_back(ShardView{Box{{10, 0}, {20, row}}, bytes.data() + 10 * row});
  LeafView small = big;  // shards too small for two bands stay whole
  small.path = "small";
  small.shape = {20, 4096};
  small.shards = {ShardView{Box{{0, 0}, {10, 4096}}, bytes.data()},
                  ShardView{Box{{10, 0}, {20, 4096}}, bytes.data()}};
  LeafView whole = LeafView::full("m", "whole", DType::kUInt8, {20, row}, bytes.data());  // not sharded
  std::vector<LeafView> leaves = {big, small, whole};

  std::vector<LeafView> same = leaves;
  split_row_bands(same, 1);
  EXPECT_EQ(same[0].shards.size(), 2u);

  split_row_bands(leaves, 4);
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const ShardView& s : leaves[0].shards) {
    rows.emplace_back(s.box.start[0], s.box.stop[0]);
    EXPECT_EQ(s.box.start[1], 0);
    EXPECT_EQ(s.box.stop[1], row);
    EXPECT_EQ(s.data, bytes.data() + s.box.start[0] * row) << s.box.start[0];
  }
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 7}, {7, 10}, {10, 14}, {14, 20}};
  EXPECT_EQ(rows, want);
  EXPECT_EQ(leaves[1].shards.size(), 2u);
  EXPECT_EQ(leaves[2].shards.size(), 1u);
}

TEST(WriteRangesTest, CoverTheFileInOrderOnUnitBoundaries) {
  // Shards at chosen addresses: only the phase of an address matters.
  alignas(4096) static std::byte arena[64];
  auto at = [&](uintptr_t phase) { return arena + phase; };  // never dereferenced
  auto leaf = [](std::string path, uint64_t bytes, const std::byte* p) {
    return LeafView::full("m", std::move(path), DType::kUInt8, {(int64_t)bytes}, p);
  };
  const uint64_t MiB = 1 << 20;
  std::vector<LeafView> leaves = {
      leaf("a", 100, at(0)),
      leaf("b", 3 * MiB + 5, at(16)),  // large, address 16 mod 4096
      leaf("c", 10, at(0)),
      leaf("d", 2 * MiB, at(0)),
      leaf("e", MiB / 2, at(0)),       // too small for a direct run
      leaf("f", 5 * MiB + 7, at(0)),   // ends the file unaligned
  };
  // (granularity, memory alignment): buffered file, O_DIRECT file, an
  // O_DIRECT-like store with large parts, an object store with large parts.
  const std::pair<uint64_t, uint64_t> backends[] = {{1, 1}, {4096, 4096}, {3 * MiB, 4096}, {3 * MiB, 1}};
  for (auto [gran, mem] : backends) {
    for (bool zero_copy : {false, true}) {
      SCOPED_TRACE("granularity " + std::to_string(gran) + " memory alignment " + std::to_string(mem) +
                   (zero_copy ? " zero copy" : " staged"));
      const uint64_t unit = write_unit(gran);
      const SavePlan plan = plan_save(leaves, zero_copy && mem > 1 ? mem : 0);
      // Phase alignment: large shards start congruent to their address.
      if (zero_copy && mem > 1) {
        EXPECT_EQ(plan.shards[1].offset % 4096, 16u);
        EXPECT_EQ(plan.shards[3].offset % 4096, 0u);
        EXPECT_EQ(plan.shards[4].offset, plan.shards[3].offset + 2 * MiB);  // small: packed
      } else {
        EXPECT_EQ(plan.shards[1].offset, 100u);
      }
      const uint64_t chunk = 1 * MiB;
      const auto ranges = plan_write_ranges(plan, chunk, gran, zero_copy, mem);
      uint64_t pos = 0, direct = 0;
      const uint64_t cut = std::max(unit, (chunk + unit - 1) / unit * unit);
      for (const WriteRange& r : ranges) {
        EXPECT_EQ(r.offset, pos);
        EXPECT_GT(r.length, 0u);
        EXPECT_LE(r.length, cut);
        EXPECT_EQ(r.offset % unit, 0u);
        if (r.offset + r.length != plan.total) EXPECT_EQ(r.length % unit, 0u) << r.offset;
        if (r.direct) {
          const PlannedShard& s = plan.shards[r.shard];
          EXPECT_GE(r.offset, s.offset);
          EXPECT_LE(r.offset + r.length, s.offset + s.length);
          EXPECT_EQ(r.direct, s.src + (r.offset - s.offset));
          EXPECT_EQ(reinterpret_cast<uintptr_t>(r.direct) % mem, 0u);
          direct += r.length;
        }
        pos += r.length;
      }
      EXPECT_EQ(pos, plan.total);
      if (!zero_copy) EXPECT_EQ(direct, 0u);
      if (zero_copy && gran == 1) EXPECT_EQ(direct, 3 * MiB + 5 + 2 * MiB + 5 * MiB + 7);
      if (zero_copy && gran == 4096) EXPECT_GE(direct, 9 * MiB);
      // Packed (object store): b = [100, 3 MiB + 105) holds no whole part,
      // d = [3 MiB + 115, 5 MiB + 115) neither, f = [5.5 MiB + 115, ...) holds
      // [6 MiB, 9 MiB). Phase-aligned: only f holds a whole unit too.
      if (zero_copy && gran == 3 * MiB) EXPECT_EQ(direct, 3 * MiB);
    }
  }
}

TEST(WriteRangesTest, BoundedDataFilesAreCutAtShardBoundariesOnUnitBoundaries) {
  alignas(4096) static std::byte arena[64];
  auto leaf = [&](std::string path, uint64_t bytes) {
    return LeafView::full("m", std::move(path), DType::kUInt8, {(int64_t)bytes}, arena);
  };
  const uint64_t MiB = 1 << 20;
  const uint64_t bound = 3 * MiB;
  std::vector<LeafView> leaves;
  const uint64_t sizes[] = {MiB, MiB, MiB, 1, 0, 2 * MiB, 7 * MiB + 3, 3 * MiB, 10, 2 * MiB + 1, MiB - 1};
  for (size_t i = 0; i < std::size(sizes); ++i) leaves.push_back(leaf("l" + std::to_string(i), sizes[i]));
  for (uint64_t gran : {uint64_t{1}, 3 * MiB}) {
    for (bool zero_copy : {false, true}) {
      SCOPED_TRACE("granularity " + std::to_string(gran) + (zero_copy ? " zero copy" : " staged"));
      const uint64_t unit = write_unit(gran);
      const SavePlan plan = plan_save(leaves, 0, bound, unit);
      // Files as a greedy fill would cut them: 1+1+1 | 1 B, 0, 2 | 7 | 3 | 10 B, 2+1 B | 1-1 B.
      ASSERT_EQ(plan.files.size(), 6u);
      const std::vector<size_t> first_file = {0, 0, 0, 1, 1, 1, 2, 3, 4, 4, 5};
      uint64_t sum = 0, stream_end = 0;
      for (size_t i = 0; i < plan.shards.size(); ++i) {
        const PlannedShard& p = plan.shards[i];
        EXPECT_EQ(p.file, first_file[i]) << "shard " << i;
        const PlannedFile& f = plan.files[p.file];
        EXPECT_GE(p.offset, f.start);
        EXPECT_LE(p.offset + p.length, f.start + f.size);
        if (i > 0 && plan.shards[i - 1].file == p.file)  // packed within a file
          EXPECT_EQ(p.offset, plan.shards[i - 1].offset + plan.shards[i - 1].length);
        else
          EXPECT_EQ(p.offset, f.start);
      }
      for (const PlannedFile& f : plan.files) {
        EXPECT_EQ(f.start % unit, 0u);
        EXPECT_GE(f.start, stream_end) << "files overlap";
        stream_end = f.start + f.size;
        sum += f.size;
      }
      EXPECT_EQ(plan.total, stream_end);
      EXPECT_EQ(plan.bytes(), sum);
      uint64_t leaf_bytes = 0;
      for (uint64_t n : sizes) leaf_bytes += n;
      EXPECT_EQ(sum, leaf_bytes);

      const auto ranges = plan_write_ranges(plan, MiB, gran, zero_copy, 1);
      std::vector<uint64_t> covered(plan.files.size(), 0);
      size_t prev_file = 0;
      for (const WriteRange& r : ranges) {
        ASSERT_LT(r.file, plan.files.size());
        EXPECT_GE(r.file, prev_file) << "ranges not in stream order";
        prev_file = r.file;
        const PlannedFile& f = plan.files[r.file];
        EXPECT_EQ(r.offset, f.start + covered[r.file]) << "ranges of a file out of order or with holes";
        EXPECT_LE(r.offset + r.length, f.start + f.size) << "a range spans two files";
        EXPECT_EQ((r.offset - f.start) % unit, 0u);
        if (r.offset + r.length != f.start + f.size) EXPECT_EQ(r.length % unit, 0u);
        covered[r.file] += r.length;
      }
      for (size_t f = 0; f < plan.files.size(); ++f) EXPECT_EQ(covered[f], plan.files[f].size) << "file " << f;
      // An object store's granularity: every file of at most a part is one
      // request (what makes it a single PutObject).
      if (gran == 3 * MiB)
        for (size_t f = 0; f < plan.files.size(); ++f)
          if (plan.files[f].size <= gran)
            EXPECT_EQ(std::count_if(ranges.begin(), ranges.end(), [&](const WriteRange& r) { return r.file == f; }),
                      1) << "file " << f;
    }
  }
  // No bound: one file, the stream itself.
  const SavePlan one = plan_save(leaves);
  ASSERT_EQ(one.files.size(), 1u);
  EXPECT_EQ(one.files[0].start, 0u);
  EXPECT_EQ(one.files[0].size, one.total);
}

}  // namespace
}  // namespace ckptio
