// Multi-process save (ManagerOptions::processes) with threads standing in
// for processes: every "process" has its own CheckpointManager over one
// shared storage, as N hosts over one shared disk or bucket. Real forked
// processes (and SIGKILL) are exercised through the CLI in
// cli_sharding_test.cc. Also the manifest format and the cover check.
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "src/save/group_commit.h"
#include "src/save/manifest.h"
#include "testutil/backend_fixture.h"
#include "testutil/fork_safety.h"
#include "testutil/random_bytes.h"
#include "testutil/sharded_state.h"

namespace ckptio {
namespace {

using testutil::GlobalLeaf;
using testutil::ProcessState;
using testutil::global_state;
using testutil::process_state;

// A barrier for threads, as a trainer's JAX client barrier would be.
class ThreadBarrier : public SaveBarrier {
 public:
  explicit ThreadBarrier(int n) : barrier_(n) {}
  Status wait(const std::string& name, double) override {
    {
      std::lock_guard lock(mu_);
      names_.push_back(name);
    }
    barrier_.arrive_and_wait();
    return Status::OK();
  }
  std::vector<std::string> names() {
    std::lock_guard lock(mu_);
    return names_;
  }

 private:
  std::barrier<> barrier_;
  std::mutex mu_;
  std::vector<std::string> names_;
};

// base_, faults_ over it, dir_ for the local backend: testutil/backend_fixture.h.
class GroupSaveTest : public testutil::BackendTest {
 protected:
  GroupSaveTest() : BackendTest("ckptio-group-") {}
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    mesh_ = Mesh::parse("dp=2,tp=4").value();
  }

  ManagerOptions group_options(int p, int procs, double timeout = 30) {
    ManagerOptions o;
    o.chunk_size = 64 << 10;
    o.processes.index = p;
    o.processes.count = procs;
    o.processes.run_id = run_id_;
    o.processes.timeout_seconds = timeout;
    o.processes.poll_seconds = 0.005;
    return o;
  }

  // Runs `procs` processes saving `step`; process p saves `states[p]`
  // (or nothing, if skip[p]). Returns each process's outcome.
  // One manager per process, kept for the run as a trainer keeps it (the
  // attempt id counts each process's saves of a step, across managers).
  using Managers = std::vector<std::shared_ptr<CheckpointManager>>;
  Managers managers(const std::vector<ManagerOptions>& options) {
    Managers m;
    for (const auto& o : options) m.push_back(std::make_shared<CheckpointManager>(faults_, o));
    return m;
  }
  std::vector<Status> save_all(int64_t step, const std::vector<ProcessState>& states,
                               std::vector<ManagerOptions> options, const std::vector<bool>& skip = {}) {
    return save_all(step, states, managers(options), skip);
  }
  std::vector<Status> save_all(int64_t step, const std::vector<ProcessState>& states, const Managers& ms,
                               const std::vector<bool>& skip = {}) {
    const int procs = static_cast<int>(states.size());
    std::vector<Status> out(procs);
    std::vector<std::thread> threads;
    for (int p = 0; p < procs; ++p) {
      if (!skip.empty() && skip[p]) {
        out[p] = Status(Code::kCancelled, "did not take part");
        continue;
      }
      threads.emplace_back([&, p] {
        auto h = ms[p]->save(step, states[p].leaves, {.metadata_json = R"({"by":"group"})"});
        out[p] = h.ok() ? h->wait() : h.status();
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  std::vector<ManagerOptions> options_for(int procs, double timeout = 30) {
    std::vector<ManagerOptions> o;
    for (int p = 0; p < procs; ++p) o.push_back(group_options(p, procs, timeout));
    return o;
  }

  void expect_step(int64_t step, const std::vector<GlobalLeaf>& want) {
    CheckpointManager reader(faults_, {});
    auto r = reader.restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(r->leaves[i].prefix + "/" + r->leaves[i].path, want[i].prefix + "/" + want[i].path);
      ASSERT_EQ(r->leaves[i].data.size(), want[i].bytes.size()) << want[i].path;
      if (!want[i].bytes.empty())
        EXPECT_EQ(std::memcmp(r->leaves[i].data.data(), want[i].bytes.data(), want[i].bytes.size()), 0)
            << want[i].path;
    }
    EXPECT_EQ(r->metadata_json, R"({"by":"group"})");
    EXPECT_TRUE(reader.verify(step).ok());
  }

  Mesh mesh_;
  std::string run_id_ = "test-run-" + std::to_string(::getpid());
};

TEST_P(GroupSaveTest, EightProcessesCommitOneStepThatRestoresBitExact) {
  const auto state = global_state(1);
  std::vector<ProcessState> states;
  for (int p = 0; p < 8; ++p) states.push_back(process_state(state, mesh_, p, 8));
  std::vector<ManagerOptions> opts = options_for(8);
  std::mutex mu;
  std::vector<int> called;
  for (int p = 0; p < 8; ++p)
    opts[p].on_commit = [&, p](const CommitEvent& e) {
      EXPECT_TRUE(e.status.ok()) << e.status.to_string();
      std::lock_guard lock(mu);
      called.push_back(p);
    };
  for (const Status& st : save_all(3, states, opts)) EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(called.size(), 8u);  // every process's callback learned the outcome
  expect_step(3, state);
  // One data file per process; replicated leaves stored once.
  CheckpointManager reader(faults_, {});
  auto index = reader.read_index(3);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->files.size(), 8u);
  for (const auto& p : index->prefixes)
    for (const auto& l : p.leaves)
      if (l.path == "params.bias" || l.path == "count") EXPECT_EQ(l.shards.size(), 1u) << l.path;
  // Manifests are gone once the step committed.
  auto listed = faults_->list("run-3/", false);
  ASSERT_TRUE(listed.ok());
  for (const auto& o : listed->objects) EXPECT_EQ(o.key.find("manifest-"), std::string::npos) << o.key;
}

TEST_P(GroupSaveTest, TwoProcessesWithATrainersBarrier) {
  const auto state = global_state(2);
  std::vector<ProcessState> states;  // not an initializer list: that would copy the buffers
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  auto barrier = std::make_shared<ThreadBarrier>(2);
  auto opts = options_for(2);
  for (auto& o : opts) o.processes.barrier = barrier;
  for (const Status& st : save_all(5, states, opts)) EXPECT_TRUE(st.ok()) << st.to_string();
  expect_step(5, state);
  auto names = barrier->names();
  ASSERT_EQ(names.size(), 4u);  // "written" and "decided", twice each
  EXPECT_NE(names[0].find("/written"), std::string::npos) << names[0];
  EXPECT_NE(names[3].find("/decided"), std::string::npos) << names[3];
}

// A trainer's barrier is user code (through a binding, perhaps): what it
// throws fails the save like an error it returns, instead of leaving the
// worker thread (which would end the process).
class ThrowingBarrier : public SaveBarrier {
 public:
  Status wait(const std::string& name, double) override { throw std::runtime_error("barrier down at " + name); }
};

TEST_P(GroupSaveTest, ABarrierThatThrowsFailsTheSaveOnEveryProcess) {
  const auto state = global_state(4);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  auto opts = options_for(2, 2.0);
  for (auto& o : opts) o.processes.barrier = std::make_shared<ThrowingBarrier>();
  for (const Status& st : save_all(6, states, opts)) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("the barrier callback threw: barrier down at ckptio/"), std::string::npos)
        << st.to_string();
  }
  CheckpointManager reader(faults_, {});
  EXPECT_FALSE(reader.latest_step().value().has_value());
}

TEST_P(GroupSaveTest, AHoleFailsEveryProcessNamingLeafAndRegion) {
  const auto state = global_state(3);
  std::vector<ProcessState> states;
  for (int p = 0; p < 4; ++p) states.push_back(process_state(state, mesh_, p, 4));
  ASSERT_FALSE(states[2].leaves[0].shards.empty());
  states[2].leaves[0].shards.pop_back();  // process 2 forgets a box of params.w
  auto out = save_all(7, states, options_for(4));
  for (const Status& st : out) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("model/params.w: elements ["), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("written by no process"), std::string::npos) << st.to_string();
  }
  CheckpointManager reader(faults_, {});
  EXPECT_FALSE(reader.latest_step().value().has_value());
}

TEST_P(GroupSaveTest, ADoubledRegionNamesBothProcesses) {
  const auto state = global_state(4);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  // Process 1 also writes process 0's first box of params.w.
  states[1].leaves[0].shards.push_back(states[0].leaves[0].shards[0]);
  auto out = save_all(8, states, options_for(2));
  for (const Status& st : out) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("written by process 0 and process 1"), std::string::npos) << st.to_string();
  }
}

// Processes that disagree on a leaf's shape (or dtype) fail the step on
// every process, naming the leaf and both shapes; nothing is committed.
TEST_P(GroupSaveTest, ProcessesThatDisagreeOnALeafsShapeFailItNamingTheLeaf) {
  const auto state = global_state(12);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  ASSERT_EQ(states[1].leaves[0].path, "params.w");
  states[1].leaves[0].shape[0] *= 2;  // its boxes still lie inside
  for (const Status& st : save_all(10, states, options_for(2))) {
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.to_string();
    EXPECT_NE(st.message().find("model/params.w: process 1 saved it as"), std::string::npos) << st.to_string();
  }
  CheckpointManager reader(faults_, {});
  EXPECT_FALSE(reader.latest_step().value().has_value());
}

// Two runs (two run ids) save the same step at once: their attempts never
// mix. One commits and restores whole; every process of the other fails
// without waiting for its timeout.
TEST_P(GroupSaveTest, TwoRunsSavingOneStepAtOnceCommitOneWholeStep) {
  const auto state_a = global_state(13), state_b = global_state(14);
  std::vector<ProcessState> a, b;
  for (int p = 0; p < 2; ++p) a.push_back(process_state(state_a, mesh_, p, 2));
  for (int p = 0; p < 2; ++p) b.push_back(process_state(state_b, mesh_, p, 2));
  Managers ma = managers(options_for(2, /*timeout=*/30));
  run_id_ += "-b";
  Managers mb = managers(options_for(2, /*timeout=*/30));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Status> out_a, out_b;
  std::thread run_a([&] { out_a = save_all(11, a, ma); });
  out_b = save_all(11, b, mb);
  run_a.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  const bool a_won = out_a[0].ok();
  for (const Status& st : a_won ? out_a : out_b) EXPECT_TRUE(st.ok()) << st.to_string();
  for (const Status& st : a_won ? out_b : out_a) EXPECT_FALSE(st.ok());
  expect_step(11, a_won ? state_a : state_b);
}

TEST_P(GroupSaveTest, ADeadProcessLeavesTheStepUncommittedAndThePreviousIntact) {
  const auto state1 = global_state(5);
  std::vector<ProcessState> states;
  for (int p = 0; p < 4; ++p) states.push_back(process_state(state1, mesh_, p, 4));
  for (const Status& st : save_all(1, states, options_for(4))) ASSERT_TRUE(st.ok()) << st.to_string();
  const auto state2 = global_state(6);
  std::vector<ProcessState> states2;
  for (int p = 0; p < 4; ++p) states2.push_back(process_state(state2, mesh_, p, 4));
  auto out = save_all(2, states2, options_for(4, /*timeout=*/1.0), {false, false, true, false});
  EXPECT_EQ(out[0].code(), Code::kUnavailable) << out[0].to_string();
  EXPECT_NE(out[0].message().find("process(es) 2 of 4"), std::string::npos) << out[0].to_string();
  for (int p : {1, 3}) {
    EXPECT_FALSE(out[p].ok());
    EXPECT_NE(out[p].message().find("timed out"), std::string::npos) << out[p].to_string();
  }
  CheckpointManager reader(faults_, {});
  EXPECT_EQ(reader.latest_step().value(), std::optional<int64_t>(1));
  expect_step(1, state1);
  // gc removes what the dead attempt left.
  ASSERT_TRUE(reader.gc().ok());
  auto dirs = reader.list_step_dirs();
  ASSERT_TRUE(dirs.ok());
  for (const auto& d : *dirs) EXPECT_TRUE(d.committed) << d.name;
}

TEST_P(GroupSaveTest, APollLongerThanTheTimeoutStillTimesOutOnTime) {
  // poll_seconds may be up to an hour; the wait must still end at the timeout
  // (the sleep used to run its whole length first).
  const auto state = global_state(8);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  auto options = options_for(2, /*timeout=*/0.5);
  for (auto& o : options) o.processes.poll_seconds = 30;
  const auto t0 = std::chrono::steady_clock::now();
  auto out = save_all(1, states, options, {false, true});  // process 1 never saves
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(out[0].code(), Code::kUnavailable) << out[0].to_string();
  EXPECT_NE(out[0].message().find("timed out"), std::string::npos) << out[0].to_string();
  EXPECT_LT(took, 10.0) << "the 30 s poll ran past the 0.5 s timeout";
}

TEST_P(GroupSaveTest, AProcessThatFailsToWriteFailsTheStepFast) {
  const auto state = global_state(7);
  std::vector<ProcessState> states;
  for (int p = 0; p < 3; ++p) states.push_back(process_state(state, mesh_, p, 3));
  FaultRule rule;
  rule.op = FaultOp::kCreate;
  rule.key_substr = "-p1-0.bin";
  rule.code = Code::kNoSpace;
  rule.message = "disk full (injected)";
  faults_->add_rule(rule);
  const auto t0 = std::chrono::steady_clock::now();
  Managers ms = managers(options_for(3, /*timeout=*/60));
  auto out = save_all(4, states, ms);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 30);  // did not wait for the timeout
  EXPECT_EQ(out[1].code(), Code::kNoSpace) << out[1].to_string();
  for (int p : {0, 2}) {
    EXPECT_FALSE(out[p].ok());
    EXPECT_NE(out[p].message().find("process 1 failed"), std::string::npos) << out[p].to_string();
    EXPECT_NE(out[p].message().find("disk full"), std::string::npos) << out[p].to_string();
  }
  faults_->clear_rules();
  // The same managers save the same step again: a new attempt id, so the
  // failed attempt's manifests do not count.
  for (const Status& st : save_all(4, states, ms)) EXPECT_TRUE(st.ok()) << st.to_string();
  expect_step(4, state);
}

// A save() refused on one process only (its state is invalid there) still
// counts as that process's save of the step: the attempt ids of the step's
// next save agree on every process, so a retry commits. Counting only the
// saves that passed the checks left process 1 one attempt behind, and every
// later save of the step timed out. And the refusal is recorded for the
// others, who fail at once instead of waiting for the timeout.
TEST_P(GroupSaveTest, ASaveRefusedOnOneProcessDoesNotPutItsAttemptsOutOfStep) {
  const auto state = global_state(11);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  Managers ms = managers(options_for(2, /*timeout=*/5));
  std::vector<LeafView> bad = states[1].leaves;
  ASSERT_FALSE(bad[0].shards.empty());
  bad[0].shards[0].data = nullptr;
  Status out0;
  std::thread coordinator([&] {
    auto h = ms[0]->save(9, states[0].leaves, {.metadata_json = R"({"by":"group"})"});
    out0 = h.ok() ? h->wait() : h.status();
  });
  auto refused = ms[1]->save(9, bad, {.metadata_json = R"({"by":"group"})"});
  coordinator.join();
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().to_string();
  // Process 1 recorded the refusal: the coordinator failed at once.
  EXPECT_EQ(out0.code(), Code::kFailedPrecondition) << out0.to_string();
  EXPECT_NE(out0.message().find("process 1 failed: InvalidArgument: save() refused it"), std::string::npos)
      << out0.to_string();
  for (const Status& st : save_all(9, states, ms)) EXPECT_TRUE(st.ok()) << st.to_string();
  expect_step(9, state);
}

// Managers made anew in the same processes (same run id) save a step whose
// first attempt failed: their attempt must not meet that attempt's
// manifests and failure record.
TEST_P(GroupSaveTest, NewManagersOfTheSameRunDoNotMeetAFailedAttemptsLeftovers) {
  const auto state = global_state(15);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  faults_->add_rule(FaultRule{.op = FaultOp::kCreate, .key_substr = "-p1-0.bin", .code = Code::kNoSpace});
  for (const Status& st : save_all(12, states, options_for(2))) EXPECT_FALSE(st.ok());
  faults_->clear_rules();
  for (const Status& st : save_all(12, states, options_for(2))) EXPECT_TRUE(st.ok()) << st.to_string();
  expect_step(12, state);
}

// The coordinator's save() refused (an invalid state there; or the step
// found committed, by another run meanwhile): the others learn it from the
// failure record at once instead of waiting for the timeout.
TEST_P(GroupSaveTest, ASaveRefusedOnTheCoordinatorFailsTheOthersAtOnce) {
  const auto state = global_state(16);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  Managers ms = managers(options_for(2, /*timeout=*/5));
  std::vector<LeafView> bad = states[0].leaves;
  bad[0].shards[0].data = nullptr;
  auto refused = ms[0]->save(13, bad, {});
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().to_string();
  auto h1 = ms[1]->save(13, states[1].leaves, {});
  ASSERT_TRUE(h1.ok()) << h1.status().to_string();
  const Status out1 = h1->wait();
  EXPECT_EQ(out1.code(), Code::kFailedPrecondition) << out1.to_string();
  EXPECT_NE(out1.message().find("save() refused it"), std::string::npos) << out1.to_string();
  for (const Status& st : save_all(13, states, ms)) EXPECT_TRUE(st.ok()) << st.to_string();
  expect_step(13, state);
}

// A save its caller refused before the call (a binding that cannot convert
// the state: CheckpointManager::refused_save) counts as one save() refused:
// the others fail the attempt at once, on either side, and the step saved
// again has one attempt id everywhere.
TEST_P(GroupSaveTest, ASaveItsCallerRefusedCountsAsARefusedSave) {
  const auto state = global_state(17);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  Managers ms = managers(options_for(2, /*timeout=*/30));
  for (int refuser : {1, 0}) {
    const int64_t step = 20 + refuser;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(ms[refuser]->refused_save(step, invalid_argument("the binding cannot read leaf x")).ok());
    auto h = ms[1 - refuser]->save(step, states[1 - refuser].leaves, {});
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const Status out = h->wait();
    EXPECT_EQ(out.code(), Code::kFailedPrecondition) << out.to_string();
    EXPECT_NE(out.message().find("the binding cannot read leaf x"), std::string::npos) << out.to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "waited for the timeout";
    for (const Status& st : save_all(step, states, ms)) EXPECT_TRUE(st.ok()) << st.to_string();
    expect_step(step, state);
  }
  // A single process has nothing to count.
  CheckpointManager single(faults_, {});
  EXPECT_TRUE(single.refused_save(1, invalid_argument("x")).ok());
}

// The coordinator's index PUT stores the index but its answer is lost, and
// the index cannot be read back: nobody knows whether the step committed.
// On an object store (the PUT is the commit) the step did commit, so no
// process may delete its data file: once the storage answers again the
// step restores whole. On a file system (the commit is the rename, never
// reached) the step is not committed.
// The coordinator's removal of a manifest, which tells a process polling on
// a file system that the commit is durable, fails once: it is tried again.
// Before, that process waited for its timeout and reported the committed
// step unconfirmed (Unavailable) while process 0 reported OK.
TEST_P(GroupSaveTest, AManifestRemovalThatFailsOnceIsTriedAgain) {
  const auto state = global_state(8);
  std::vector<ProcessState> states;
  for (int p = 0; p < 3; ++p) states.push_back(process_state(state, mesh_, p, 3));
  faults_->add_rule(FaultRule{.op = FaultOp::kRemove, .key_substr = "manifest-", .skip = 1, .times = 1});  // process 1's
  const auto t0 = std::chrono::steady_clock::now();
  auto out = save_all(5, states, options_for(3, /*timeout=*/20));
  for (int p = 0; p < 3; ++p) EXPECT_TRUE(out[p].ok()) << "process " << p << ": " << out[p].to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "waited for the timeout";
  faults_->clear_rules();
  expect_step(5, state);
}

TEST_P(GroupSaveTest, AnIndexPutOfUnknownOutcomeDeletesNoDataFile) {
  const auto state = global_state(8);
  std::vector<ProcessState> states;
  for (int p = 0; p < 3; ++p) states.push_back(process_state(state, mesh_, p, 3));
  faults_->add_rule(FaultRule{.op = FaultOp::kPut, .key_substr = "ckptio_index.json", .code = Code::kUnavailable,
                              .times = 1, .after = true});
  faults_->add_rule(FaultRule{.op = FaultOp::kGet, .key_substr = "ckptio_index.json", .code = Code::kUnavailable});
  auto out = save_all(5, states, options_for(3, /*timeout=*/30));
  for (int p = 0; p < 3; ++p) EXPECT_FALSE(out[p].ok()) << "process " << p;
  faults_->clear_rules();
  CheckpointManager reader(faults_, {});
  auto steps = reader.all_steps();
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  if (faults_->caps().atomic_rename) {
    EXPECT_TRUE(steps->empty());
    return;
  }
  EXPECT_NE(out[0].message().find("may or may not be committed"), std::string::npos) << out[0].to_string();
  EXPECT_EQ(*steps, std::vector<int64_t>{5});
  expect_step(5, state);
}

// A process that times out waiting for the coordinator does not know the
// step's outcome: the coordinator may be about to commit it. Its data file
// must stay, or the committed step names a file that is gone. Here the
// coordinator stalls in its index put until process 1 has given up.
TEST_P(GroupSaveTest, AProcessThatTimesOutKeepsItsDataForTheCoordinatorsCommit) {
  const auto state = global_state(9);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  Managers ms = managers(options_for(2, /*timeout=*/1.0));
  std::promise<Status> p1_done;
  std::shared_future<Status> p1 = p1_done.get_future().share();
  faults_->set_hook([p1](FaultOp op, const std::string& key) {
    if (op == FaultOp::kPut && key.find("ckptio_index.json") != std::string::npos)
      p1.wait_for(std::chrono::seconds(30));
  });
  Status out0;
  std::thread coordinator([&] {
    auto h = ms[0]->save(6, states[0].leaves, {.metadata_json = R"({"by":"group"})"});
    out0 = h.ok() ? h->wait() : h.status();
  });
  auto h1 = ms[1]->save(6, states[1].leaves, {.metadata_json = R"({"by":"group"})"});
  p1_done.set_value(h1.ok() ? h1->wait() : h1.status());
  coordinator.join();
  faults_->set_hook(nullptr);
  EXPECT_EQ(p1.get().code(), Code::kUnavailable) << p1.get().to_string();
  EXPECT_NE(p1.get().message().find("timed out"), std::string::npos) << p1.get().to_string();
  ASSERT_TRUE(out0.ok()) << out0.to_string();
  expect_step(6, state);
  CheckpointManager reader(faults_, {});
  ASSERT_TRUE(reader.gc().ok());  // the committed index names the file: kept
  expect_step(6, state);
}

// A manifest put that took effect and then failed (a directory fsync after
// the rename): the coordinator read it and committed the step, which holds
// this process's durable data. The process reports the commit, as all do.
TEST_P(GroupSaveTest, AManifestPutThatFailedAfterTakingEffectStillReportsTheCommit) {
  const auto state = global_state(10);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  faults_->add_rule(FaultRule{.op = FaultOp::kPut, .key_substr = "-p1.json", .code = Code::kIOError,
                              .times = 1, .after = true});
  auto out = save_all(7, states, options_for(2, /*timeout=*/30));
  faults_->clear_rules();
  for (int p = 0; p < 2; ++p) EXPECT_TRUE(out[p].ok()) << "process " << p << ": " << out[p].to_string();
  expect_step(7, state);
}

// On a file system the step is visible from the commit's rename on, but
// committed only once the fsync of the base after it succeeded; should that
// fail, the coordinator moves the step back and fails it. A process polling
// for the outcome that read the index in between must not report a commit
// (it waits until the coordinator removed its manifest from the step, which
// it does once the commit returned): here the failing fsync waits
// until process 1 has read the index. Object stores commit with the index
// PUT, never taken back (AnIndexPutOfUnknownOutcomeDeletesNoDataFile).
TEST_P(GroupSaveTest, AStepTakenBackAfterAnotherProcessReadItsIndexFailsEveryProcess) {
  if (!faults_->caps().atomic_rename) return;
  const auto state = global_state(11);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  std::atomic<bool> renamed{false}, failed_sync{false}, read_once{false};
  std::promise<void> read_p;
  std::shared_future<void> read = read_p.get_future().share();
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kRename && key.starts_with("run-8.tmp-")) {
      renamed = true;
    } else if (op == FaultOp::kGet && renamed && key == "run-8/ckptio_index.json") {
      if (!read_once.exchange(true)) read_p.set_value();  // (the coordinator reads none before the sync)
    } else if (op == FaultOp::kSync && renamed && !failed_sync.exchange(true)) {
      read.wait_for(std::chrono::seconds(20));
      faults_->add_rule(FaultRule{.op = FaultOp::kSync, .code = Code::kIOError, .times = 1});
    }
  });
  Managers ms = managers(options_for(2, /*timeout=*/30));
  auto out = save_all(8, states, ms);
  faults_->set_hook(nullptr);
  faults_->clear_rules();
  ASSERT_TRUE(read_once) << "process 1 never read the index between the rename and the fsync";
  EXPECT_EQ(out[0].code(), Code::kIOError) << out[0].to_string();
  EXPECT_NE(out[0].message().find("moved back"), std::string::npos) << out[0].to_string();
  EXPECT_EQ(out[1].code(), Code::kFailedPrecondition) << out[1].to_string();
  EXPECT_NE(out[1].message().find("moved back"), std::string::npos) << out[1].to_string();
  CheckpointManager reader(faults_, {});
  EXPECT_EQ(reader.all_steps().value(), std::vector<int64_t>{});
  out = save_all(8, states, ms);  // saved again, it commits
  for (int p = 0; p < 2; ++p) EXPECT_TRUE(out[p].ok()) << "process " << p << ": " << out[p].to_string();
  expect_step(8, state);
}

// A failure record or a manifest's error is outside data: quoted in the
// other processes' errors with its control bytes escaped and its length cut.
TEST_P(GroupSaveTest, AnotherProcesssErrorIsQuotedPrintableAndShort) {
  const auto state = global_state(12);
  std::vector<ProcessState> states;
  for (int p = 0; p < 2; ++p) states.push_back(process_state(state, mesh_, p, 2));
  // The coordinator's failure: its own data write fails with a message that
  // has a newline, an escape and 9,000 characters.
  const std::string hostile = "bad\n\x1b[31mred" + std::string(9000, 'x');
  faults_->add_rule(FaultRule{.op = FaultOp::kWrite, .key_substr = "-p0-", .code = Code::kIOError,
                              .message = hostile});
  auto out = save_all(9, states, options_for(2, /*timeout=*/30));
  faults_->clear_rules();
  ASSERT_FALSE(out[1].ok());
  const std::string msg = out[1].message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg.substr(0, 300);
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg.substr(0, 300);
  EXPECT_NE(msg.find("bad\\x0A\\x1B[31mred"), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 6000u) << msg.substr(0, 300);
}

INSTANTIATE_TEST_SUITE_P(Backends, GroupSaveTest, testutil::local_backends(), testutil::backend_name);

TEST(GroupSave, OptionsAreChecked) {
  ProcessGroup g;
  EXPECT_TRUE(check_process_group(g).ok());
  g.count = 4;
  g.index = 4;
  EXPECT_EQ(check_process_group(g).code(), Code::kInvalidArgument);
  g.index = 1;
  EXPECT_NE(check_process_group(g).message().find("run_id is required"), std::string::npos);
  g.run_id = "job/../x";
  EXPECT_EQ(check_process_group(g).code(), Code::kInvalidArgument);
  g.run_id = "job-17.restart_2";
  EXPECT_TRUE(check_process_group(g).ok());
  // The polling interval is a sleep: NaN, infinity or a negative one is refused.
  for (double poll : {std::nan(""), HUGE_VAL, -1.0, 1e300}) {
    g.poll_seconds = poll;
    EXPECT_EQ(check_process_group(g).code(), Code::kInvalidArgument) << poll;
  }
  g.poll_seconds = 0;
  EXPECT_TRUE(check_process_group(g).ok());
  g.poll_seconds = 0.05;
  // An infinite timeout kept every process waiting for a dead one for ever;
  // a group larger than a manifest may name failed every save on its manifests.
  g.timeout_seconds = HUGE_VAL;
  EXPECT_EQ(check_process_group(g).code(), Code::kInvalidArgument);
  g.timeout_seconds = 60;
  g.count = (1 << 20) + 1;
  EXPECT_EQ(check_process_group(g).code(), Code::kInvalidArgument);
  g.count = 1 << 20;
  EXPECT_TRUE(check_process_group(g).ok());
  g.count = 4;
  // Same inputs, same id; any difference, another id.
  EXPECT_EQ(group_attempt_id("a", 1, 0), group_attempt_id("a", 1, 0));
  EXPECT_NE(group_attempt_id("a", 1, 0), group_attempt_id("b", 1, 0));
  EXPECT_NE(group_attempt_id("a", 1, 0), group_attempt_id("a", 2, 0));
  EXPECT_NE(group_attempt_id("a", 1, 0), group_attempt_id("a", 1, 1));
  EXPECT_EQ(group_attempt_id("a", 1, 0).size(), 16u);
}

// The coordinator finds each listed manifest's process from its name: with
// thousands of processes, comparing every listed name with every process's
// expected name took seconds per poll (quadratic), before any I/O.
TEST(GroupSave, ManyManifestsAreGatheredInLinearTime) {
  auto storage = make_memory_storage(/*posix_like=*/false);
  ProcessGroup group;
  group.count = 4096;
  group.run_id = "many";
  const AttemptPaths paths = plan_attempt(*storage, "run-1", group_attempt_id(group.run_id, 1, 0));
  Index partial;
  partial.prefixes.push_back(PrefixRecord{"model", {LeafRecord{"w", DType::kFloat32, {0}, {}}}});
  for (int p = 0; p < group.count; ++p) {
    ProcessGroup me = group;
    me.index = p;
    ASSERT_TRUE(publish_manifest(GroupSave{*storage, me, paths, 1}, partial, Status::OK()).ok());
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto merged = gather_manifests(GroupSave{*storage, group, paths, 1});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_EQ(merged->prefixes.at(0).leaves.size(), 1u);
  // 1.2 s here when quadratic, 0.02 s now; sanitizers slow both down.
  const bool sanitized = testutil::under_thread_sanitizer() || testutil::under_address_sanitizer();
  EXPECT_LT(took, sanitized ? 10.0 : 0.5);
}

TEST(Manifest, RoundTripsAndRefusesWhatIsNotOne) {
  Manifest m;
  m.attempt = "0123456789abcdef";
  m.process_index = 2;
  m.process_count = 3;
  m.index.step = 9;
  m.index.files.push_back({"data-0123456789abcdef-p2-0.bin", 64});
  LeafRecord leaf{"w", DType::kFloat32, {4, 4}, {}};
  leaf.shards.push_back(ShardRecord{Box{{2, 0}, {4, 4}}, "data-0123456789abcdef-p2-0.bin", 0, 32, 7});
  m.index.prefixes.push_back(PrefixRecord{"model", {leaf}});
  auto back = parse_manifest(serialize_manifest(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->attempt, m.attempt);
  EXPECT_EQ(back->process_index, 2);
  EXPECT_EQ(back->process_count, 3);
  EXPECT_FALSE(back->error);
  EXPECT_EQ(back->index.prefixes, m.index.prefixes);
  // A step's index is not a manifest (holes are fine, identity is required).
  Index idx = m.index;
  EXPECT_EQ(parse_manifest(serialize_index(idx)).status().code(), Code::kDataLoss);
  // The step parser refuses the hole a manifest may have.
  EXPECT_FALSE(parse_index(serialize_manifest(m)).ok());
  Manifest bad = m;
  bad.process_index = 3;  // outside [0, count)
  EXPECT_EQ(parse_manifest(serialize_manifest(bad)).status().code(), Code::kDataLoss);
  bad = m;
  bad.attempt = "../x";
  EXPECT_EQ(parse_manifest(serialize_manifest(bad)).status().code(), Code::kDataLoss);
  // Overlapping shards are refused even in a manifest.
  bad = m;
  bad.index.prefixes[0].leaves[0].shards.push_back(
      ShardRecord{Box{{3, 0}, {4, 4}}, "data-0123456789abcdef-p2-0.bin", 32, 16, 1});
  bad.index.files[0].size = 64;
  EXPECT_EQ(parse_manifest(serialize_manifest(bad)).status().code(), Code::kDataLoss);
  // An error manifest carries the message, even one that is not UTF-8.
  Manifest failed = m;
  failed.index = Index{};
  failed.error = std::string("ENOSPC \xff on /x");
  auto f = parse_manifest(serialize_manifest(failed));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(f->error);
  EXPECT_NE(f->error->find("ENOSPC"), std::string::npos);
}

// Issue 5's hostile-input list, as manifests: each is refused by the parser
// (kDataLoss naming what is wrong) before the coordinator reads or
// allocates anything it describes.
TEST(Manifest, HostileManifestsAreRefusedWithAClearError) {
  Manifest m;
  m.attempt = "0123456789abcdef";
  m.process_index = 1;
  m.process_count = 2;
  m.index.step = 4;
  m.index.files.push_back({"data-0123456789abcdef-p1-0.bin", 64});
  LeafRecord leaf{"w", DType::kFloat32, {4, 4}, {}};
  leaf.shards.push_back(ShardRecord{Box{{2, 0}, {4, 4}}, "data-0123456789abcdef-p1-0.bin", 0, 32, 7});
  m.index.prefixes.push_back(PrefixRecord{"model", {leaf}});
  const std::string good = serialize_manifest(m);
  ASSERT_TRUE(parse_manifest(good).ok());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = 0, n = 0;
    while ((at = s.find(from, at)) != std::string::npos) {
      s.replace(at, from.size(), to);
      at += to.size();
      ++n;
    }
    EXPECT_GT(n, 0u) << "no \"" << from << "\" in " << good;
    return s;
  };
  const std::string file = "data-0123456789abcdef-p1-0.bin";
  struct Case {
    std::string name, text, says;
  };
  const std::vector<Case> cases = {
      {"traversal in a data file name", with(file, "../" + file), "unsafe"},
      {"absolute data file name", with(file, "/etc/passwd"), "unsafe"},
      {"nested traversal", with(file, "subdir/../../" + file), "unsafe"},
      {"traversal in a prefix", with("\"model\"", "\"../model\""), "unsafe prefix name"},
      {"NUL in a leaf path", with("\"w\"", "\"w\\u0000x\""), "NUL"},
      {"NUL in a file name", with(file, "data\\u0000.bin"), "unsafe"},
      {"shape whose bytes overflow 64 bits",
       with("\"shape\": [4, 4]", "\"shape\": [4294967296, 4294967296]"), "more than 2^64 bytes"},
      {"shard past the end of its file", with("\"size\": 64", "\"size\": 16"), "lie beyond the end"},
      {"overlapping shards",
       with("\"crc32c\": 7}", "\"crc32c\": 7},{\"box\":{\"start\":[3,0],\"stop\":[4,4]},\"file\":\"" + file +
                                "\",\"offset\":32,\"length\":16,\"crc32c\":1}"),
       "overlap"},
      {"duplicate key", with("\"step\": 4", "\"step\": 4, \"step\": 5"), "duplicate key"},
      {"non-UTF-8 string", with("\"w\"", "\"w\xff\""), "invalid JSON"},
      {"attempt not hex", with("0123456789abcdef\"", "../../etc\""), "attempt"},
      {"process index outside the count", with("\"process_index\":1", "\"process_index\":2"),
       "process_index"},
      {"deep nesting", with("\"metadata\": {", "\"metadata\": {\"x\":" + std::string(100000, '[') +
                                                  std::string(100000, ']') + ","),
       "nesting"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = parse_manifest(c.text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << "one line";
  }
  // 100 MB of JSON in an unknown member: the same streaming reader as the
  // index (IndexHugeInput.*), memory bounded by the text; the member is
  // dropped and the manifest is what it was.
  auto r = parse_manifest(with("\"step\": 4", "\"step\": 4, \"pad\": \"" + std::string(100 << 20, 'a') + "\""));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->index.prefixes, m.index.prefixes);
  EXPECT_EQ(r->index.files.size(), 1u);
}

// Found by fuzz/manifest_fuzz (fuzz/corpus/manifest/crash-dup-file-across-processes.json):
// two manifests claiming the same data file merged into an index that lists
// it twice, which the step parser then refuses. The merge refuses first,
// naming the file and both processes.
TEST(Manifest, MergeRefusesADataFileClaimedByTwoProcesses) {
  Manifest a;
  a.attempt = "0123456789abcdef";
  a.process_count = 2;
  a.index.files.push_back({"data-0123456789abcdef-p0-0.bin", 0});
  a.index.prefixes.push_back(PrefixRecord{"model", {LeafRecord{"e", DType::kFloat32, {0, 4}, {}}}});
  Manifest b = a;
  b.process_index = 1;
  auto merged = merge_manifests({a, b});
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(merged.status().message(),
            "data file data-0123456789abcdef-p0-0.bin is listed by process 0 and by process 1");
  b.index.files[0].name = "data-0123456789abcdef-p1-0.bin";
  merged = merge_manifests({a, b});
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_TRUE(parse_index(serialize_index(*merged)).ok());
}

TEST(CoverCheck, NamesTheRegion) {
  const Shape shape{8, 6};
  std::vector<std::string> who{"p0", "p1", "p2"};
  EXPECT_FALSE(describe_cover_problem(shape, {Box{{0, 0}, {4, 6}}, Box{{4, 0}, {8, 6}}}, who));
  auto hole = describe_cover_problem(shape, {Box{{0, 0}, {4, 6}}, Box{{4, 0}, {8, 3}}}, who);
  ASSERT_TRUE(hole);
  EXPECT_EQ(*hole, "elements [4:8, 3:6] are written by no process");
  auto twice = describe_cover_problem(shape, {Box{{0, 0}, {5, 6}}, Box{{4, 0}, {8, 6}}}, who);
  ASSERT_TRUE(twice);
  EXPECT_EQ(*twice, "elements [4:5, 0:6] are written by p0 and p1");
  // Scalars and empty boxes.
  EXPECT_FALSE(describe_cover_problem({}, {Box{{}, {}}}, who));
  EXPECT_EQ(*describe_cover_problem({}, {}, who), "the scalar is written by no process");
  EXPECT_EQ(*describe_cover_problem({}, {Box{{}, {}}, Box{{}, {}}}, who), "the scalar is written by p0 and p1");
  EXPECT_FALSE(describe_cover_problem({0, 4}, {}, who));
  EXPECT_FALSE(describe_cover_problem({4, 4}, {Box{{0, 0}, {4, 4}}, Box{{2, 2}, {2, 4}}}, who));
}

// A split of dimension 1 over many devices: every box spans all rows, so the
// sweep along dimension 0 compared every pair (8,192 boxes: 33 million
// intersections per leaf at the coordinator's commit). As a grid each box is
// one cell, and a doubled cell is found by its cell.
TEST(CoverCheck, ManyBoxesSharingTheirRowsAreCheckedAsAGrid) {
  constexpr int64_t kBoxes = 8192;
  const Shape shape{4, kBoxes * 2};
  std::vector<Box> boxes;
  std::vector<std::string> who;
  for (int64_t i = 0; i < kBoxes; ++i) {
    boxes.push_back(Box{{0, 2 * i}, {4, 2 * i + 2}});
    who.push_back("p" + std::to_string(i));
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(describe_cover_problem(shape, boxes, who));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool sanitized = testutil::under_thread_sanitizer() || testutil::under_address_sanitizer();
  EXPECT_LT(took, sanitized ? 10.0 : 0.2);  // 0.005 s as a grid
  // The same cell twice (a replica written twice) and a cell written by none.
  boxes[5000] = boxes[17];
  auto twice = describe_cover_problem(shape, boxes, who);
  ASSERT_TRUE(twice);
  EXPECT_EQ(*twice, "elements [0:4, 34:36] are written by p17 and p5000");
  // Boxes that are no grid (one spans two cells of the others') still go
  // through the pairwise check (0.3 s for all 8,192 here: 64 of them).
  std::vector<Box> few(boxes.begin(), boxes.begin() + 64);
  few[40] = Box{{0, 80}, {4, 84}};
  twice = describe_cover_problem({4, 128}, few, who);
  ASSERT_TRUE(twice);
  EXPECT_NE(twice->find("elements [0:4, 82:84] are written by"), std::string::npos) << *twice;
}

}  // namespace
}  // namespace ckptio
