// Out of memory is an error of the call, never the end of the process: a
// checkpoint library runs inside a training job that must outlive a failed
// save. Each test runs in a forked child whose address space is capped
// (RLIMIT_AS) just above what it has mapped, so that the system refuses the
// memory a save or a restore asks for next, as it does at a process limit
// or under strict overcommit.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/ckptio.h"
#include "testutil/fork_safety.h"
#include "testutil/owned_leaves.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

using testutil::OwnedLeaf;
using testutil::expect_restored;
using testutil::make_leaf;
using testutil::views;

constexpr uint64_t kMiB = 1ull << 20;

// The child's address space may grow by `headroom` bytes from here on.
bool cap_address_space(uint64_t headroom) {
  std::ifstream in("/proc/self/statm");
  uint64_t pages = 0;
  if (!(in >> pages) || pages == 0) return false;
  const rlim_t cap = pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) + headroom;
  const rlimit r{cap, cap};
  return ::setrlimit(RLIMIT_AS, &r) == 0;
}

// Runs `child` in a forked process; its exit code (0: every check held; n:
// check n failed), or 128 + the signal that ended it.
int in_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) _exit(child());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class OutOfMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    // A sanitizer's runtime cannot live under the cap: ASan ends the process
    // when refused memory (a new thread's fake stack with
    // detect_stack_use_after_return, a refused malloc), TSan's child hangs.
    // The Release suite runs these.
    if (testutil::under_address_sanitizer() || testutil::under_thread_sanitizer())
      GTEST_SKIP() << "a sanitizer's own runtime cannot run when the system refuses it memory; the Release "
                      "suite runs the out-of-memory tests";
    dir_ = fs::temp_directory_path() / ("ckptio-oom-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::unique_ptr<CheckpointManager> open(ManagerOptions o) {
    auto m = CheckpointManager::open(dir_.string(), std::move(o));
    return m.ok() ? std::move(m).value() : nullptr;
  }
  fs::path dir_;
};

ManagerOptions copy_mode(uint64_t chunk, uint64_t budget) {
  ManagerOptions o;
  o.staging = StagingMode::kCopy;
  o.chunk_size = chunk;
  o.staging_budget = budget;
  return o;
}

// A pool whose buffers the system refuses after a few goes on with those:
// the save commits, bit-exact. (It ended the process with abort() before.)
TEST_F(OutOfMemory, ACopyModeSaveGoesOnWithTheStagingBuffersItGets) {
  const auto state = [] { return std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {12, kMiB}, 3)}; };
  const int code = in_child([&] {
    auto m = open(copy_mode(kMiB, 64 * kMiB));
    if (!m) return 1;
    const auto s = state();  // 48 MiB
    // A first small save: the manager's threads, arenas and ring are set up.
    const auto warm = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {16}, 1)};
    if (!m->save(1, views(warm)).value().wait().ok()) return 2;
    if (!cap_address_space(6 * kMiB)) return 3;
    // 48 buffers asked for; a few fit.
    if (m->prepare_staging(12 * 4 * kMiB).code() != Code::kResourceExhausted) return 4;
    auto h = m->save(2, views(s));
    const Status st = h.ok() ? h->wait() : h.status();
    if (!st.ok()) std::fprintf(stderr, "save: %s\n", st.to_string().c_str());
    return st.ok() ? 0 : 5;
  });
  ASSERT_EQ(code, 0) << "the child's failed check (128 + n: signal n)";
  auto m = open({});
  ASSERT_TRUE(m);
  auto r = m->restore(2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, state());
}

// With no staging buffer at all, the save fails with kResourceExhausted,
// leaves the latest step as it was, and the manager saves again once memory
// is there.
TEST_F(OutOfMemory, ASaveWithoutAnyStagingBufferFailsAndTheLatestStaysAsItWas) {
  const auto first = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {1024}, 5)};
  const int code = in_child([&] {
    {
      auto a = open({});
      if (!a || !a->save(1, views(first)).value().wait().ok()) return 1;
    }
    auto m = open(copy_mode(8 * kMiB, 64 * kMiB));  // its threads start here, before the cap
    if (!m) return 2;
    const auto s = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {4 * kMiB}, 6)};  // 16 MiB
    if (!cap_address_space(2 * kMiB)) return 3;
    auto h = m->save(2, views(s));
    if (!h.ok()) return h.status().code() == Code::kResourceExhausted ? 0 : 4;  // refused at once: fine too
    const Status st = h->wait();
    if (st.code() != Code::kResourceExhausted) return 5;
    if (st.message().find("out of memory: a staging buffer of 8388608 bytes") == std::string::npos) return 6;
    if (m->wait_until_finished().code() != Code::kResourceExhausted) return 7;
    return 0;
  });
  ASSERT_EQ(code, 0) << "the child's failed check (128 + n: signal n)";
  auto m = open({});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_restored(*r, first);
}

// The eformer layout's save (its chunk buffers, zstd's output, the writer's
// threads) under the same cap: kResourceExhausted from save() or from the
// save's handle, never the end of the process, and no step committed.
TEST_F(OutOfMemory, AnEformerLayoutSaveFailsWithResourceExhausted) {
  const auto first = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {1024}, 9)};
  for (const StagingMode staging : {StagingMode::kCopy, StagingMode::kBorrow}) {
    SCOPED_TRACE(staging == StagingMode::kCopy ? "copy" : "borrow");
    fs::remove_all(dir_);
    const int code = in_child([&] {
      ManagerOptions o;
      o.layout = "eformer";
      o.staging = staging;
      auto m = open(o);
      if (!m || !m->save(1, views(first)).value().wait().ok()) return 1;
      // 64 MiB: above glibc's largest mmap threshold (32 MiB), so never from
      // memory the heap already holds.
      const auto s = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {16 * kMiB}, 10)};
      if (!cap_address_space(4 * kMiB)) return 2;
      auto h = m->save(2, views(s));
      const Status st = h.ok() ? h->wait() : h.status();
      if (st.code() != Code::kResourceExhausted) {
        std::fprintf(stderr, "save: %s\n", st.to_string().c_str());
        return 3;
      }
      return 0;
    });
    ASSERT_EQ(code, 0) << "the child's failed check (128 + n: signal n)";
    auto m = open({});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
  }
}

// Opening a manager when the system refuses its threads' stacks (an
// in-memory store: no threads of its own): the crew goes on with fewer
// copiers; without a worker, open() returns kResourceExhausted, and with a
// worker but no reaper the worker is stopped before the exception leaves
// the constructor. (std::system_error escaped open(), or a half-made
// manager ended the process, before.)
TEST_F(OutOfMemory, OpeningAManagerWithoutThreadsFailsWithResourceExhausted) {
  const int code = in_child([&] {
    // glibc hands the stacks of ended threads out again: these hold every
    // stack it may have kept (40 MiB) until the end.
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<std::thread> holders;
    for (int i = 0; i < 8; ++i)
      holders.emplace_back([&] {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return done; });
      });
    auto release = [&](int code) {
      {
        std::lock_guard lock(mu);
        done = true;
      }
      cv.notify_all();
      for (std::thread& t : holders) t.join();
      return code;
    };
    if (!cap_address_space(2 * kMiB)) return release(2);  // a thread's stack is 8 MiB
    ManagerOptions o;
    o.max_to_keep = 2;  // a reaper thread too
    auto m = CheckpointManager::open("mem://oom", o);
    if (m.ok()) return release(3);
    if (m.status().code() != Code::kResourceExhausted) {
      std::fprintf(stderr, "open: %s\n", m.status().to_string().c_str());
      return release(4);
    }
    return release(0);
  });
  ASSERT_EQ(code, 0) << "the child's failed check (128 + n: signal n)";
}

// A restore whose memory the system refuses returns kResourceExhausted: not
// an exception out of the API (std::bad_alloc escaped restore() before),
// and not damage, so restore-latest does not fall back to an older step.
TEST_F(OutOfMemory, ARestoreItCannotHoldFailsWithoutFallingBackToAnOlderStep) {
  const int code = in_child([&] {
    auto m = open({});
    if (!m) return 1;
    const auto small = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {1024}, 7)};
    // 64 MiB: above glibc's largest mmap threshold (32 MiB), so never from
    // memory the heap already holds.
    const auto big = std::vector<OwnedLeaf>{make_leaf("model", "w", DType::kFloat32, {16 * kMiB}, 8)};
    if (!m->save(1, views(small)).value().wait().ok()) return 2;
    if (!m->save(2, views(big)).value().wait().ok()) return 3;
    if (!m->restore(1).ok()) return 4;  // the restore path's threads and arenas
    if (!cap_address_space(8 * kMiB)) return 5;
    auto latest = m->restore(std::nullopt);
    if (latest.ok()) return 6;
    if (latest.status().code() != Code::kResourceExhausted) return 7;
    if (latest.status().message().find("out of memory") == std::string::npos) return 8;
    if (m->restore(2).status().code() != Code::kResourceExhausted) return 9;
    if (!m->restore(1).ok()) return 10;  // what fits still restores
    return 0;
  });
  ASSERT_EQ(code, 0) << "the child's failed check (128 + n: signal n)";
}

}  // namespace
}  // namespace ckptio
