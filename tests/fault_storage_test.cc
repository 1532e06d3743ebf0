// The fault-injecting wrapper: rules (skip, times, seeded probability), the
// hook, and the durability model behind drop_unsynced(), including a power
// cut at every step of the POSIX commit protocol.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backends/fault/fault_storage.h"
#include "backends/memory/memory_storage.h"
#include "testutil/conformance.h"

namespace ckptio {
namespace {

using testutil::as_bytes;
using testutil::as_string;
using testutil::pattern_bytes;
using testutil::write_object;
using testutil::write_ranges;

bool exists(Storage& s, const std::string& key) { return s.stat(key).ok(); }

std::vector<std::string> all_keys(Storage& s) {
  auto l = s.list("", false);
  EXPECT_TRUE(l.ok());
  return l.ok() ? testutil::object_keys(*l) : std::vector<std::string>{};
}

TEST(FaultStorage, ForwardsEverythingWithoutRules) {
  auto base = make_memory_storage(true);
  auto f = make_fault_storage(base);
  EXPECT_TRUE(f->caps().atomic_rename);
  EXPECT_NE(f->describe().find(base->describe()), std::string::npos) << f->describe();
  ASSERT_TRUE(f->put("a/x", as_bytes("1")).ok());
  ASSERT_TRUE(write_object(*f, "a/y", pattern_bytes(1000, 1)).ok());
  EXPECT_EQ(base->get("a/x", 10).value(), "1");
  EXPECT_EQ(base->stat("a/y").value(), 1000u);
  EXPECT_EQ(f->list("a/", false).value().objects.size(), 2u);
  EXPECT_EQ(f->faults_fired(), 0u);
  EXPECT_FALSE(make_fault_storage(make_memory_storage(false))->caps().atomic_rename);
}

TEST(FaultStorage, SkipAndTimesCountOnlyMatchingCalls) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  f->add_rule({.op = FaultOp::kPut, .key_substr = "idx", .code = Code::kNoSpace, .skip = 2, .times = 3});
  std::string pattern;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(f->put("other-" + std::to_string(i), as_bytes("v")).ok()) << "not matching: never fails";
    Status st = f->put("idx-" + std::to_string(i), as_bytes("v"));
    pattern += st.ok() ? '.' : 'X';
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Code::kNoSpace);
      EXPECT_NE(st.message().find("injected fault"), std::string::npos) << st.to_string();
      EXPECT_NE(st.message().find("idx-" + std::to_string(i)), std::string::npos) << st.to_string();
      EXPECT_FALSE(exists(*base, "idx-" + std::to_string(i))) << "a fault never reaches base";
    }
  }
  EXPECT_EQ(pattern, "..XXX...");
  EXPECT_EQ(f->faults_fired(), 3u);
  // Other ops are not affected by a put rule.
  EXPECT_TRUE(f->get("idx-0", 10).ok());
  f->clear_rules();
  EXPECT_TRUE(f->put("idx-9", as_bytes("v")).ok());
}

TEST(FaultStorage, FirstFiringRuleWinsAndEmptySubstringMatchesAll) {
  auto f = make_fault_storage(make_memory_storage());
  ASSERT_TRUE(f->put("k", as_bytes("v")).ok());
  f->add_rule({.op = FaultOp::kStat, .key_substr = "", .code = Code::kUnavailable, .times = 1});
  f->add_rule({.op = FaultOp::kStat, .key_substr = "", .code = Code::kPermissionDenied});
  Status first = f->stat("k").status();
  EXPECT_EQ(first.code(), Code::kUnavailable);
  EXPECT_TRUE(first.retryable());
  EXPECT_EQ(f->stat("k").status().code(), Code::kPermissionDenied);
  EXPECT_EQ(f->stat("anything/else").status().code(), Code::kPermissionDenied);
  EXPECT_EQ(f->faults_fired(), 3u);
}

std::string probability_pattern(uint64_t seed, bool set_seed_twice = false) {
  auto f = make_fault_storage(make_memory_storage());
  (void)f->put("k", as_bytes("v"));
  f->set_seed(seed);
  f->add_rule({.op = FaultOp::kGet, .key_substr = "", .code = Code::kUnavailable, .probability = 0.3});
  std::string pattern;
  for (int i = 0; i < 300; ++i) {
    if (set_seed_twice && i == 150) f->set_seed(seed);
    pattern += f->get("k", 10).ok() ? '.' : 'X';
  }
  return pattern;
}

TEST(FaultStorage, ProbabilityIsDeterministicBySeed) {
  std::string a = probability_pattern(7), b = probability_pattern(7), c = probability_pattern(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  size_t fired = std::count(a.begin(), a.end(), 'X');
  EXPECT_GT(fired, 45u);
  EXPECT_LT(fired, 135u);
  // set_seed() restarts the sequence.
  std::string again = probability_pattern(7, true);
  EXPECT_EQ(again.substr(150), a.substr(0, 150));
}

TEST(FaultStorage, WriteFaultReachesCallbackAndFinish) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  f->add_rule({.op = FaultOp::kWrite, .key_substr = "data", .code = Code::kNoSpace, .skip = 1, .times = 1});
  auto w = f->create("run-1/data.bin", 4 * 4096);
  ASSERT_TRUE(w.ok());
  const auto content = pattern_bytes(4 * 4096, 2);
  std::vector<Status> seen;
  for (int i = 0; i < 4; ++i)
    (*w)->write_async(i * 4096, std::span(content).subspan(i * 4096, 4096),
                      [&](Status st) { seen.push_back(st); });
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_TRUE(seen[0].ok());
  EXPECT_EQ(seen[1].code(), Code::kNoSpace);
  EXPECT_TRUE(seen[2].ok());
  EXPECT_TRUE(seen[3].ok());
  Status st = (*w)->finish(content.size());
  EXPECT_EQ(st.code(), Code::kNoSpace) << st.to_string();
  EXPECT_FALSE(exists(*base, "run-1/data.bin"));
  EXPECT_EQ(f->faults_fired(), 1u);
  // The same helper the core-like tests use reports it too.
  f->add_rule({.op = FaultOp::kWrite, .key_substr = "", .code = Code::kIOError, .times = 1});
  EXPECT_EQ(write_object(*f, "run-1/data2.bin", content).code(), Code::kIOError);
  EXPECT_FALSE(exists(*base, "run-1/data2.bin"));
}

TEST(FaultStorage, EveryOperationCanFail) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  ASSERT_TRUE(f->put("s/x", as_bytes("v")).ok());
  std::string buf(1, '\0');
  ReadRequest r{"s/x", 0, 1, reinterpret_cast<std::byte*>(buf.data())};
  const std::vector<std::pair<FaultOp, std::function<Status()>>> ops = {
      {FaultOp::kCreate, [&] { return f->create("s/new", 1).status(); }},
      {FaultOp::kFinish, [&] { return write_object(*f, "s/new", pattern_bytes(10, 3)); }},
      {FaultOp::kPut, [&] { return f->put("s/y", as_bytes("v")); }},
      {FaultOp::kGet, [&] { return f->get("s/x", 10).status(); }},
      {FaultOp::kStat, [&] { return f->stat("s/x").status(); }},
      {FaultOp::kRead, [&] { return f->read({&r, 1}); }},
      {FaultOp::kList, [&] { return f->list("s/", true).status(); }},
      {FaultOp::kRemove, [&] { return f->remove("s/x"); }},
      {FaultOp::kRemove, [&] { return f->remove_prefix("s/"); }},
      {FaultOp::kRename, [&] { return f->rename("s/", "t/", RenameMode::kNoReplace); }},
      {FaultOp::kSync, [&] { return f->sync("s/"); }},
  };
  for (const auto& [op, call] : ops) {
    f->clear_rules();
    f->add_rule({.op = op, .key_substr = "", .code = Code::kPermissionDenied, .message = "nope"});
    Status st = call();
    EXPECT_EQ(st.code(), Code::kPermissionDenied) << "op " << static_cast<int>(op) << ": " << st.to_string();
  }
  f->clear_rules();
  EXPECT_EQ(all_keys(*base), std::vector<std::string>{"s/x"}) << "no failed call touched base";
  // A rename rule matches either side.
  f->add_rule({.op = FaultOp::kRename, .key_substr = "target"});
  EXPECT_EQ(f->rename("s/", "target/", RenameMode::kNoReplace).code(), Code::kIOError);
  EXPECT_TRUE(f->rename("s/", "u/", RenameMode::kNoReplace).ok());
}

TEST(FaultStorage, HookSeesEveryOperationInOrder) {
  auto f = make_fault_storage(make_memory_storage());
  std::mutex mu;
  std::vector<std::pair<FaultOp, std::string>> seen;
  f->set_hook([&](FaultOp op, const std::string& key) {
    std::lock_guard lock(mu);
    seen.emplace_back(op, key);
  });
  ASSERT_TRUE(write_object(*f, "d/data", pattern_bytes(200'000, 4),
                           {.chunk = 100'000, .one_at_a_time = true}).ok());
  ASSERT_TRUE(f->put("d/index", as_bytes("i")).ok());
  ASSERT_TRUE(f->get("d/index", 10).ok());
  ASSERT_TRUE(f->stat("d/data").ok());
  std::string b1(1, '\0'), b2(1, '\0');
  ReadRequest reqs[] = {{"d/data", 0, 1, reinterpret_cast<std::byte*>(b1.data())},
                        {"d/index", 0, 1, reinterpret_cast<std::byte*>(b2.data())}};
  ASSERT_TRUE(f->read(reqs).ok());
  ASSERT_TRUE(f->list("d/", true).ok());
  ASSERT_TRUE(f->sync("d/").ok());
  ASSERT_TRUE(f->rename("d/", "e/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->remove("e/index").ok());
  ASSERT_TRUE(f->remove_prefix("e/").ok());
  // The hook runs even when a rule then fails the call.
  f->add_rule({.op = FaultOp::kGet, .key_substr = ""});
  EXPECT_FALSE(f->get("e/gone", 1).ok());

  const std::vector<std::pair<FaultOp, std::string>> want = {
      {FaultOp::kCreate, "d/data"}, {FaultOp::kWrite, "d/data"},  {FaultOp::kWrite, "d/data"},
      {FaultOp::kFinish, "d/data"}, {FaultOp::kPut, "d/index"},   {FaultOp::kGet, "d/index"},
      {FaultOp::kStat, "d/data"},   {FaultOp::kRead, "d/data"},   {FaultOp::kRead, "d/index"},
      {FaultOp::kList, "d/"},       {FaultOp::kSync, "d/"},       {FaultOp::kRename, "d/"},
      {FaultOp::kRemove, "e/index"}, {FaultOp::kRemove, "e/"},    {FaultOp::kGet, "e/gone"},
  };
  EXPECT_EQ(seen, want);
  f->set_hook(nullptr);
  EXPECT_TRUE(f->put("after", as_bytes("v")).ok());
  EXPECT_EQ(seen.size(), want.size());
}

TEST(FaultStorage, DropUnsyncedKeepsOnlyDurableObjects) {
  auto base = make_memory_storage();
  ASSERT_TRUE(base->put("old/x", as_bytes("before the wrapper")).ok());
  auto f = make_fault_storage(base);
  const auto bytes = pattern_bytes(5000, 5);
  ASSERT_TRUE(write_object(*f, "a/unsynced.bin", bytes).ok());
  ASSERT_TRUE(write_object(*f, "b/synced.bin", bytes).ok());
  ASSERT_TRUE(f->sync("b").ok());  // "b" and "b/" name the same directory
  ASSERT_TRUE(f->put("a/index.json", as_bytes("{}")).ok());
  ASSERT_TRUE(write_object(*f, "c/d/nested.bin", bytes).ok());
  ASSERT_TRUE(f->sync("c/").ok());  // the parent, not the directory holding it
  ASSERT_TRUE(f->sync("").ok());
  ASSERT_TRUE(write_object(*f, "e/before.bin", bytes).ok());
  ASSERT_TRUE(f->sync("e/").ok());
  ASSERT_TRUE(write_object(*f, "e/after.bin", bytes).ok());  // finished after the sync
  ASSERT_TRUE(write_object(*f, "top.bin", bytes).ok());
  ASSERT_TRUE(f->sync("").ok());
  ASSERT_TRUE(write_object(*f, "gone/removed.bin", bytes).ok());
  ASSERT_TRUE(f->remove("gone/removed.bin").ok());
  ASSERT_TRUE(write_object(*f, "replaced-by-put", bytes).ok());
  ASSERT_TRUE(f->put("replaced-by-put", as_bytes("put")).ok());

  EXPECT_EQ(all_keys(*base).size(), 9u);
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"a/index.json", "b/synced.bin", "e/before.bin",
                                                       "old/x", "replaced-by-put", "top.bin"}));
  EXPECT_EQ(base->get("b/synced.bin", 1 << 20).value(), as_string(bytes));
  EXPECT_EQ(base->get("replaced-by-put", 10).value(), "put");
  // The books are clear: a second cut changes nothing.
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base).size(), 6u);
}

TEST(FaultStorage, FailedSyncMakesNothingDurable) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  ASSERT_TRUE(write_object(*f, "a/x", pattern_bytes(10, 6)).ok());
  f->add_rule({.op = FaultOp::kSync, .key_substr = "", .times = 1});
  EXPECT_FALSE(f->sync("a/").ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_FALSE(exists(*base, "a/x"));
}

TEST(FaultStorage, OpenWritersAreLostInAPowerCut) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  const auto bytes = pattern_bytes(10'000, 7);
  auto w = f->create("a/open.bin", bytes.size());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(write_ranges(**w, std::span(bytes).first(5000), {.chunk = 5000}).ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  Status late;
  std::span<const std::byte> rest = std::span(bytes).subspan(5000);
  (*w)->write_async(5000, rest, [&](Status st) { late = st; });
  EXPECT_EQ(late.code(), Code::kIOError);
  EXPECT_EQ((*w)->finish(bytes.size()).code(), Code::kIOError);
  (*w)->abort();
  EXPECT_FALSE(exists(*base, "a/open.bin"));
  // A writer dropped without finish() is simply gone.
  { auto w2 = f->create("a/dropped.bin", 1); }
  ASSERT_TRUE(f->drop_unsynced().ok());
}

TEST(FaultStorage, ObjectStoreUploadsAreDurableAtOnce) {
  auto base = make_memory_storage(false);
  auto f = make_fault_storage(base);
  ASSERT_TRUE(write_object(*f, "run-1/data-a-0.bin", pattern_bytes(100, 8)).ok());
  ASSERT_TRUE(f->put("run-1/ckptio_index.json", as_bytes("{}")).ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base).size(), 2u);
}

TEST(FaultStorage, RenameIsDurableOnReturnByDefault) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  ASSERT_TRUE(write_object(*f, "s.tmp/synced.bin", pattern_bytes(100, 9)).ok());
  ASSERT_TRUE(f->sync("s.tmp/").ok());
  ASSERT_TRUE(write_object(*f, "s.tmp/unsynced.bin", pattern_bytes(100, 10)).ok());
  ASSERT_TRUE(f->rename("s.tmp/", "s/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->sync("").ok());  // syncs the parent, not the files inside s/
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), std::vector<std::string>{"s/synced.bin"})
      << "a rename carries an unsynced name with it";
}

TEST(FaultStorage, NonDurableRenameIsUndone) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base, {.rename_durable_on_return = false});
  ASSERT_TRUE(write_object(*f, "s.tmp/x.bin", pattern_bytes(100, 11)).ok());
  ASSERT_TRUE(f->sync("s.tmp/").ok());
  ASSERT_TRUE(f->rename("s.tmp/", "s/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->put("s/index", as_bytes("i")).ok());  // lands in the renamed directory
  ASSERT_TRUE(f->sync("s/").ok());                       // not the parent: the rename stays pending
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"s.tmp/index", "s.tmp/x.bin"}));

  // Synced at the parent afterwards: durable.
  ASSERT_TRUE(f->rename("s.tmp/", "s/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->sync("").ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"s/index", "s/x.bin"}));

  // Different parents: both must be synced.
  ASSERT_TRUE(f->rename("s/", "deep/s/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->sync("deep/").ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"s/index", "s/x.bin"}));
  ASSERT_TRUE(f->rename("s/", "deep/s/", RenameMode::kNoReplace).ok());
  ASSERT_TRUE(f->sync("deep/").ok());
  ASSERT_TRUE(f->sync("").ok());
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"deep/s/index", "deep/s/x.bin"}));
}

TEST(FaultStorage, NonDurableExchangeIsUndone) {
  auto base = make_memory_storage();
  ASSERT_TRUE(base->put("run-3/ckptio_index.json", as_bytes("old")).ok());
  ASSERT_TRUE(base->put("run-3/data-old.bin", as_bytes("o")).ok());
  auto f = make_fault_storage(base, {.rename_durable_on_return = false});
  ASSERT_TRUE(f->put("run-3.tmp-1/ckptio_index.json", as_bytes("new")).ok());
  ASSERT_TRUE(f->rename("run-3.tmp-1/", "run-3/", RenameMode::kExchange).ok());
  EXPECT_EQ(base->get("run-3/ckptio_index.json", 10).value(), "new");
  ASSERT_TRUE(f->drop_unsynced().ok());
  EXPECT_EQ(base->get("run-3/ckptio_index.json", 10).value(), "old");
  EXPECT_EQ(base->get("run-3.tmp-1/ckptio_index.json", 10).value(), "new");
  EXPECT_TRUE(exists(*base, "run-3/data-old.bin"));

  // One side emptied by the cut itself: the exchange is still undone.
  auto f2 = make_fault_storage(base, {.rename_durable_on_return = false});
  ASSERT_TRUE(write_object(*f2, "run-4.tmp/unsynced.bin", pattern_bytes(10, 12)).ok());
  ASSERT_TRUE(f2->rename("run-4.tmp/", "run-3/", RenameMode::kExchange).ok());
  ASSERT_TRUE(f2->drop_unsynced().ok());
  EXPECT_EQ(base->get("run-3/ckptio_index.json", 10).value(), "old");
  EXPECT_FALSE(exists(*base, "run-4.tmp/unsynced.bin"));
  EXPECT_TRUE(testutil::object_keys(base->list("run-4.tmp/", false).value()).empty());
}

// The POSIX commit protocol of src/save/commit.cc, one call per step, with a
// power cut after every prefix of it. `sync_stage` = false leaves out the
// fsync of the stage directory, a bug the model must expose.
struct ProtocolRun {
  bool committed_visible = false;  // the index is at its final name
  bool data_intact = false;        // ... and the data it points to is whole
};

ProtocolRun cut_commit_after(size_t steps_done, bool sync_stage, const FaultStorageOptions& o) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base, o);
  const auto data = pattern_bytes(300'000, 13);
  std::vector<std::function<Status()>> steps = {
      [&] { return write_object(*f, "run-7.tmp-a/data-a-0.bin", data); },
      [&] { return f->put("run-7.tmp-a/ckptio_index.json", as_bytes("index")); },
      [&] { return sync_stage ? f->sync("run-7.tmp-a/") : Status::OK(); },
      [&] { return f->rename("run-7.tmp-a/", "run-7/", RenameMode::kNoReplace); },
      [&] { return f->sync(""); },
  };
  for (size_t i = 0; i < steps_done && i < steps.size(); ++i) EXPECT_TRUE(steps[i]().ok()) << i;
  EXPECT_TRUE(f->drop_unsynced().ok());
  ProtocolRun r;
  r.committed_visible = exists(*base, "run-7/ckptio_index.json");
  auto got = base->get("run-7/data-a-0.bin", 1 << 20);
  r.data_intact = got.ok() && *got == as_string(data);
  return r;
}

TEST(FaultStorage, PowerCutAtEveryStepOfTheCommitIsAllOrNothing) {
  for (bool rename_durable : {true, false}) {
    for (size_t k = 0; k <= 5; ++k) {
      SCOPED_TRACE("cut after " + std::to_string(k) + " steps, rename durable on return " +
                   std::to_string(rename_durable));
      ProtocolRun r = cut_commit_after(k, /*sync_stage=*/true, {.rename_durable_on_return = rename_durable});
      if (r.committed_visible) {
        EXPECT_TRUE(r.data_intact) << "a visible index must find its data";
      }
      if (k == 5) {
        EXPECT_TRUE(r.committed_visible) << "the full protocol commits";
      }
      if (k < 4) {
        EXPECT_FALSE(r.committed_visible) << "nothing is committed before the rename";
      }
    }
  }
}

TEST(FaultStorage, CommitWithoutSyncingTheStageLosesData) {
  ProtocolRun r = cut_commit_after(5, /*sync_stage=*/false, {});
  EXPECT_TRUE(r.committed_visible);
  EXPECT_FALSE(r.data_intact) << "the model must catch a missing directory fsync";
}

TEST(FaultStorage, CrashAfterFreezesEveryLaterOperation) {
  auto base = make_memory_storage();
  auto f = make_fault_storage(base);
  int hook_calls = 0;
  f->set_hook([&](FaultOp, const std::string&) { ++hook_calls; });
  ASSERT_TRUE(f->put("before", as_bytes("v")).ok());  // op 1, not counted by the crash below
  f->crash_after(2);
  EXPECT_FALSE(f->crashed());
  EXPECT_TRUE(f->put("a", as_bytes("v")).ok());
  EXPECT_TRUE(f->stat("a").ok());
  EXPECT_FALSE(f->crashed());
  Status st = f->put("b", as_bytes("v"));
  EXPECT_EQ(st.code(), Code::kIOError) << st.to_string();
  EXPECT_TRUE(f->crashed());
  EXPECT_EQ(f->get("a", 10).status().code(), Code::kIOError);
  EXPECT_EQ(write_object(*f, "c", pattern_bytes(10, 14)).code(), Code::kIOError);
  EXPECT_EQ(hook_calls, 6) << "the hook still sees operations after the crash";
  EXPECT_EQ(all_keys(*base), (std::vector<std::string>{"a", "before"}));
}

TEST(FaultStorage, ConcurrentUseIsSafe) {
  auto f = make_fault_storage(make_memory_storage());
  f->add_rule({.op = FaultOp::kPut, .key_substr = "t1", .probability = 0.5});
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::string key = "t" + std::to_string(t) + "/k" + std::to_string(i);
        (f->put(key, as_bytes("v")).ok() ? ok : failed)++;
        if (write_object(*f, key + ".bin", pattern_bytes(1000, i)).ok()) (void)f->sync("t" + std::to_string(t));
        (void)f->list("", true);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok + failed, 200);
  EXPECT_EQ(static_cast<uint64_t>(failed.load()), f->faults_fired());
  EXPECT_GT(failed.load(), 0);
  EXPECT_TRUE(f->drop_unsynced().ok());
}

}  // namespace
}  // namespace ckptio
