// Crash and power-loss tests of the commit promise: whatever moment a save
// is interrupted, discovery lists only complete steps, restore-latest returns
// a committed step bit-exact, and the latest committed step never goes back.
//
// Kill test: a forked child saves steps in a loop on local disk (real
// io_uring, real fsync, retention on); the parent SIGKILLs it at a random
// moment (seeded), then checks the directory, many times.
//
// Power-loss test: saves go through the fault-injecting backend over memory;
// at a random operation the "machine" freezes (every later operation fails),
// then drop_unsynced() discards everything that was not yet durable per the
// durability model in backends/memory/fault_storage.cc (an object is durable
// once finished/put and its directory synced; renames once the backend
// returns). The protocol it relies on: src/commit.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "backends/local/local_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

// The state of step `s`: deterministic, so any process can check it.
struct StepState {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<LeafView> views;
};

StepState state_for_step(int64_t s, uint64_t leaf_bytes) {
  StepState st;
  const Shape shapes[] = {{static_cast<int64_t>(leaf_bytes / 4)}, {static_cast<int64_t>(leaf_bytes / 8), 2}, {3, 5}, {}};
  const DType dtypes[] = {DType::kFloat32, DType::kFloat32, DType::kInt8, DType::kInt64};
  for (int i = 0; i < 4; ++i) {
    size_t n = checked_num_bytes(shapes[i], dtype_size(dtypes[i])).value();
    std::vector<std::byte> b(n);
    std::mt19937_64 rng(static_cast<uint64_t>(s) * 1000 + i);
    for (size_t k = 0; k < n; k += 8) {
      uint64_t x = rng();
      std::memcpy(b.data() + k, &x, std::min<size_t>(8, n - k));
    }
    st.bytes.push_back(std::move(b));
  }
  for (int i = 0; i < 4; ++i)
    st.views.push_back(LeafView::full(i < 2 ? "model" : "tx", "leaf" + std::to_string(i), dtypes[i],
                                      shapes[i], st.bytes[i].data()));
  return st;
}

::testing::AssertionResult matches_step(const RestoredState& r, uint64_t leaf_bytes) {
  StepState want = state_for_step(r.step, leaf_bytes);
  if (r.leaves.size() != want.views.size())
    return ::testing::AssertionFailure() << "step " << r.step << ": " << r.leaves.size() << " leaves";
  for (size_t i = 0; i < want.views.size(); ++i) {
    if (r.leaves[i].data.size() != want.bytes[i].size() ||
        std::memcmp(r.leaves[i].data.data(), want.bytes[i].data(), want.bytes[i].size()) != 0)
      return ::testing::AssertionFailure() << "step " << r.step << " leaf " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

uint64_t torture_seed() {
  if (const char* s = std::getenv("CKPTIO_TORTURE_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s ? std::atoi(s) : fallback;
}

// The child: continue from the latest committed step, saving forever.
[[noreturn]] void saver_child(const std::string& dir, uint64_t leaf_bytes, bool borrow) {
  auto storage = make_local_storage(dir);
  if (!storage.ok()) _exit(10);
  ManagerOptions o;
  o.max_to_keep = 3;
  o.chunk_size = 1 << 20;
  o.staging = borrow ? StagingMode::kBorrow : StagingMode::kCopy;
  CheckpointManager m(*storage, o);
  auto latest = m.latest_step();
  if (!latest.ok()) _exit(11);
  int64_t next = latest->value_or(0) + 1;
  for (int i = 0; i < 100000; ++i, ++next) {
    StepState st = state_for_step(next, leaf_bytes);
    auto h = m.save(next, st.views);
    if (!h.ok() || !h->wait().ok()) _exit(12);
  }
  _exit(0);
}

TEST(CrashTest, SigkillAtRandomMomentsNeverExposesPartialStep) {
  const uint64_t seed = torture_seed();
  const int kills = env_int("CKPTIO_TORTURE_KILLS", 30);
  std::printf("crash torture: seed %llu, %d kills (CKPTIO_TORTURE_SEED / CKPTIO_TORTURE_KILLS)\n",
              static_cast<unsigned long long>(seed), kills);
  std::mt19937_64 rng(seed);
  const std::string dir = (fs::temp_directory_path() / ("ckptio-crash-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const uint64_t leaf_bytes = 2 << 20;

  int64_t latest_seen = -1;
  int restores = 0;
  for (int k = 0; k < kills; ++k) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) saver_child(dir, leaf_bytes, k % 2 == 1);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status) << " (seed " << seed << ")";

    auto storage = make_local_storage(dir);
    ASSERT_TRUE(storage.ok());
    CheckpointManager m(*storage, ManagerOptions{.strict = true});
    auto steps = m.all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string() << " (seed " << seed << ", kill " << k << ")";
    if (steps->empty()) {
      ASSERT_EQ(latest_seen, -1) << "committed steps vanished (seed " << seed << ")";
      continue;
    }
    ASSERT_GE(steps->back(), latest_seen) << "latest went back (seed " << seed << ", kill " << k << ")";
    latest_seen = steps->back();
    // Every listed step is complete; the latest restores bit-exact.
    for (int64_t s : *steps) ASSERT_TRUE(m.verify(s).ok()) << "step " << s << " seed " << seed;
    auto r = m.restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->step, latest_seen);
    ASSERT_TRUE(matches_step(*r, leaf_bytes)) << "seed " << seed << ", kill " << k;
    ++restores;
  }
  // gc removes whatever the killed attempts left.
  auto storage = make_local_storage(dir);
  ASSERT_TRUE(storage.ok());
  CheckpointManager m(*storage, ManagerOptions{});
  ASSERT_TRUE(m.gc().ok());
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  std::printf("crash torture: %d kills, %d restores verified, latest step %lld\n", kills, restores,
              static_cast<long long>(latest_seen));
  EXPECT_GT(restores, kills / 3) << "too few kills landed after a commit; timing is off";
  fs::remove_all(dir);
}

TEST(PowerLossTest, DropUnsyncedAtRandomPointsKeepsACompleteStep) {
  const uint64_t seed = torture_seed();
  const int rounds = env_int("CKPTIO_POWERLOSS_ROUNDS", 60);
  std::printf("power-loss torture: seed %llu, %d rounds\n", static_cast<unsigned long long>(seed), rounds);
  std::mt19937_64 rng(seed);
  const uint64_t leaf_bytes = 64 << 10;
  auto base = make_memory_storage(true);
  int64_t committed = 0;  // last step whose save() reported success
  int64_t next = 1;
  for (int round = 0; round < rounds; ++round) {
    auto faulty = make_fault_storage(base);
    // The power fails before operation number `cut`: it and every later
    // operation fail without reaching the store.
    const uint64_t cut = rng() % 80;
    faulty->crash_after(cut);
    auto frozen = [&] { return faulty->crashed(); };
    {
      ManagerOptions o;
      o.chunk_size = 16 << 10;
      o.max_to_keep = 2;
      CheckpointManager m(faulty, o);
      for (int i = 0; i < 3 && !frozen(); ++i) {
        StepState st = state_for_step(next, leaf_bytes);
        auto h = m.save(next, st.views);
        ASSERT_TRUE(h.ok());
        Status s = h->wait();
        if (s.ok()) committed = next;
        ++next;
        if (frozen()) break;
      }
      (void)m.wait_until_finished();
    }
    // Everything after the cut is treated as never having happened only if it
    // was not durable; a save that returned OK before the cut must survive.
    ASSERT_TRUE(faulty->drop_unsynced().ok());
    CheckpointManager after(base, ManagerOptions{.strict = true});
    auto latest = after.latest_step();
    ASSERT_TRUE(latest.ok()) << latest.status().to_string();
    if (committed > 0) {
      ASSERT_TRUE(latest->has_value()) << "round " << round << " seed " << seed;
      ASSERT_GE(**latest, committed) << "a committed step was lost (round " << round << ", seed " << seed << ")";
    }
    if (latest->has_value()) {
      auto r = after.restore(std::nullopt);
      ASSERT_TRUE(r.ok()) << r.status().to_string() << " round " << round << " seed " << seed;
      ASSERT_TRUE(matches_step(*r, leaf_bytes)) << "round " << round << " seed " << seed;
      committed = std::max(committed, r->step);
    }
  }
}

}  // namespace
}  // namespace ckptio
