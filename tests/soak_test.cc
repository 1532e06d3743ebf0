// Soak: 200 consecutive asynchronous saves with retention (keep the last 3)
// over S3 with ~5 % of requests faulted (503 SlowDown, resets before the
// request reaches the server and after it answered), through the fault proxy
// in front of moto (fixture s3_moto_soak, a proxy of its own), and a
// bit-exact restore of the latest step every 20 saves. Every save commits;
// resident memory after save 20 grows by less than 5 % by the end; file
// descriptors and connections stay bounded by what libcurl's connection
// cache may hold, and all are closed once the manager and its storage are
// gone; after gc() no object is left that no committed index references and
// no multipart upload is left unfinished.
//
// Resident memory is measured with large blocks mmapped one by one (a fixed
// M_MMAP_THRESHOLD) and after malloc_trim(0), so that it counts memory in
// use rather than what glibc's arenas keep after a restored state is freed
// (that swung it by a whole state, ~7 MiB, from one measurement to the next). Under a sanitizer, resident memory says nothing about ckptio
// (shadow memory, quarantine): that one assertion is left out, and the test
// says so.
//
// CKPTIO_SOAK_SEED=<n> repeats the data and the proxy's coins;
// CKPTIO_SOAK_SAVES overrides the 200 saves (a multiple of 20).
#include <gtest/gtest.h>

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckptio/ckptio.h"
#include "testutil/leftovers.h"
#include "testutil/s3_server.h"
#include "testutil/s3_store.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CKPTIO_SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define CKPTIO_SOAK_SANITIZED 1
#endif
#endif
#ifndef CKPTIO_SOAK_SANITIZED
#define CKPTIO_SOAK_SANITIZED 0
#endif

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;
using testutil::kS3TestPart;

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 10) : fallback;
}

// Resident memory in KiB (VmRSS of /proc/self/status), 0 if unreadable.
long rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return 0;
}

// This process's open file descriptors: fd -> what it points to.
std::vector<std::pair<int, std::string>> open_fds() {
  std::vector<std::pair<int, std::string>> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  const int own = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    char target[256];
    const ssize_t n = ::readlinkat(own, e->d_name, target, sizeof target - 1);
    out.emplace_back(fd, n > 0 ? std::string(target, static_cast<size_t>(n)) : "?");
  }
  ::closedir(d);
  return out;
}

std::string describe_fds(const std::vector<std::pair<int, std::string>>& fds) {
  std::string s;
  for (const auto& [fd, what] : fds) {
    s += ' ';
    s += std::to_string(fd);
    s += "->";
    s += what;
  }
  return s;
}

// TCP sockets of this process connected to 127.0.0.1:`port`: the socket
// inodes of /proc/self/fd matched against /proc/self/net/tcp (whose table is
// the network namespace's: the proxy's own ends are there too, and are not
// ours). `established` counts those in state ESTABLISHED.
struct Sockets {
  int total = 0, established = 0;
};
Sockets sockets_to(int port) {
  std::set<std::string> mine;
  for (const auto& [fd, what] : open_fds())
    if (what.rfind("socket:[", 0) == 0) mine.insert(what.substr(8, what.size() - 9));
  Sockets s;
  std::set<std::string> counted;
  std::ifstream in("/proc/self/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    const auto colon = remote.find(':');
    if (colon == std::string::npos) continue;
    if (std::strtol(remote.c_str() + colon + 1, nullptr, 16) != port || !mine.count(inode)) continue;
    // The table is read in several chunks while the proxy's and moto's
    // sockets come and go: a line can be seen twice. Count each socket once.
    if (!counted.insert(inode).second) continue;
    ++s.total;
    if (state == "01") ++s.established;
  }
  return s;
}

int endpoint_port(const std::string& endpoint) {
  return std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1);
}

void fill(std::vector<std::byte>& v, uint64_t seed, int64_t step, uint64_t leaf) {
  uint64_t x = seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^ (leaf << 56);
  for (size_t i = 0; i < v.size(); i += 8) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(&v[i], &z, std::min<size_t>(8, v.size() - i));
  }
}

// ~6 MiB in four leaves: one data file of 2 parts.
struct SoakState {
  std::vector<std::byte> w{5 * kS3TestPart / 4}, m{512 << 10}, b{4096 * 4};
  int64_t step = 0;

  void set(uint64_t seed, int64_t s) {
    step = s;
    fill(w, seed, s, 1);
    fill(m, seed, s, 2);
    fill(b, seed, s, 3);
  }
  uint64_t bytes() const { return w.size() + m.size() + b.size() + 8; }
  std::vector<LeafView> views() const {
    return {LeafView::full("model", "params.w", DType::kFloat32, {static_cast<int64_t>(w.size() / 4)},
                           w.data()),
            LeafView::full("model", "params.b", DType::kFloat32, {4096}, b.data()),
            LeafView::full("tx", "opt_state.mu", DType::kBFloat16, {static_cast<int64_t>(m.size() / 2)},
                           m.data()),
            LeafView::full("tx", "step", DType::kInt64, {}, &step)};
  }
  std::string differences(const RestoredState& r) const {
    std::string out;
    if (r.step != step) out += "step " + std::to_string(r.step) + ", want " + std::to_string(step) + "; ";
    if (r.leaves.size() != 4) return out + std::to_string(r.leaves.size()) + " leaves, want 4";
    for (const Tensor& t : r.leaves) {
      const std::vector<std::byte>* want = t.path == "params.w"       ? &w
                                           : t.path == "params.b"     ? &b
                                           : t.path == "opt_state.mu" ? &m
                                                                      : nullptr;
      const bool same = want != nullptr
                            ? t.data.size() == want->size() &&
                                  std::memcmp(t.data.data(), want->data(), want->size()) == 0
                            : t.path == "step" && t.data.size() == 8 &&
                                  std::memcmp(t.data.data(), &step, 8) == 0;
      if (!same) out += "leaf " + t.path + " differs; ";
    }
    return out;
  }
};

TEST(S3MotoSoak, TwoHundredAsyncSavesWithFaultsLeakNothing) {
  CKPTIO_REQUIRE_S3_SERVER(srv);
  ASSERT_FALSE(srv.control.empty()) << "this test needs the fault proxy (fixture s3_moto_soak)";
  const uint64_t seed = env_u64("CKPTIO_SOAK_SEED", std::random_device{}() % 1000000000u);
  const int saves = static_cast<int>(env_u64("CKPTIO_SOAK_SAVES", 200));
  ASSERT_TRUE(saves >= 40 && saves % 20 == 0) << "CKPTIO_SOAK_SAVES: a multiple of 20, at least 40";
  const int port = endpoint_port(srv.endpoint);
  // Blocks of 256 KiB and more (states, staging chunks, libcurl's transfer
  // buffers) mapped and unmapped one by one: glibc otherwise raises this
  // threshold as they are freed and serves them from per-thread arenas,
  // whose high-water marks then depend on which threads ran when.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  // 5 % of requests: 3 % answered 503 SlowDown, 1 % reset before reaching
  // moto, 1 % reset after moto answered (the work done, the answer lost).
  const std::string fault_rules =
      "status=503 prob=0.03\nfault=reset prob=0.01\nfault=reset prob=0.01 when=response";
  std::printf("soak: seed %llu (CKPTIO_SOAK_SEED), %d saves, retention 3, restore every 20; "
              "proxy %s, rules: %s\n",
              static_cast<unsigned long long>(seed), saves, srv.endpoint.c_str(), fault_rules.c_str());
  std::string resp;
  ASSERT_TRUE(testutil::s3_fault_control(srv, "POST", "/reset?seed=" + std::to_string(seed), "", &resp))
      << resp;

  s3::S3Config config = testutil::s3_test_config(srv);
  config.retry.max_attempts = 10;  // the product's default
  // Four requests in flight: the pools that grow with concurrency (libcurl's
  // easy handles with their 2 x 512 KiB buffers, its connection cache) fill
  // in the first saves instead of whenever retries first pile up.
  config.max_connections = 4;
  std::string prefix = testutil::s3_test_prefix();
  prefix.pop_back();
  const auto fds_before = open_fds();

  SoakState state;
  std::mutex mu;
  std::vector<std::string> failures;  // under mu
  std::atomic<int> committed{0};
  const auto t0 = Clock::now();
  long rss20 = 0, rss_end = 0;
  size_t fds20 = 0, fds_end = 0;
  int max_connections_seen = 0;
  int restores = 0;
  {
    auto store = s3::make_s3_storage("s3://" + srv.bucket + "/" + prefix, config);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ManagerOptions mo;
    mo.chunk_size = kS3TestPart;
    mo.max_to_keep = 3;
    mo.max_in_flight = 2;
    mo.staging = StagingMode::kCopy;
    mo.on_commit = [&](const CommitEvent& e) {
      if (e.status.ok()) {
        ++committed;
      } else {
        std::lock_guard lock(mu);
        failures.push_back("step " + std::to_string(e.step) + ": " + e.status.to_string());
      }
    };
    CheckpointManager m(*store, mo);
    ASSERT_TRUE(testutil::s3_fault_set_rules(srv, fault_rules, &resp)) << resp;

    std::printf("soak: %5s %9s %6s %4s %12s %8s %8s\n", "saves", "rss_kib", "fds", "conn",
                "proxy_faults", "requests", "seconds");
    for (int step = 1; step <= saves; ++step) {
      state.set(seed, step);
      auto h = m.save(step, state.views());  // copies the state and returns
      ASSERT_TRUE(h.ok()) << "step " << step << ": " << h.status().to_string();
      if (step % 20 != 0) continue;
      Status st = m.wait_until_finished();
      ASSERT_TRUE(st.ok()) << "by step " << step << ": " << st.to_string();
      {
        auto r = m.restore(std::nullopt);
        ASSERT_TRUE(r.ok()) << "restore after step " << step << ": " << r.status().to_string();
        ASSERT_EQ(state.differences(*r), "") << "restore after step " << step;
        ++restores;
      }
      malloc_trim(0);  // free memory back to the kernel: what stays is in use
      const long rss = rss_kib();

      const size_t fds = open_fds().size();
      const Sockets socks = sockets_to(port);
      max_connections_seen = std::max(max_connections_seen, socks.total);
      EXPECT_LE(socks.total, static_cast<int>(config.max_connections))
          << "after step " << step << ": more sockets to the proxy than the connection cache holds";
      if (step == 20) rss20 = rss, fds20 = fds;
      if (step == saves) rss_end = rss, fds_end = fds;
      std::printf("soak: %5d %9ld %6zu %4d %12ld %8ld %8.1f\n", step, rss, fds, socks.total,
                  testutil::s3_fault_count(srv, "faults_total"), testutil::s3_fault_count(srv, "requests"),
                  std::chrono::duration<double>(Clock::now() - t0).count());
      std::fflush(stdout);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const long requests = testutil::s3_fault_count(srv, "requests");
    const long faults = testutil::s3_fault_count(srv, "faults_total");
    const long s503 = testutil::s3_fault_count(srv, "status.503");
    const long resets = testutil::s3_fault_count(srv, "faults.reset");
    const auto client = (*store)->s3_stats();
    std::printf("soak: %d saves (%.1f MiB each) and %d restores in %.1f s; proxy: %ld requests, "
                "%ld faults injected (%ld 503s, %ld resets); client: %llu requests, %llu retries, "
                "%llu connections opened; RSS %ld -> %ld KiB, fds %zu -> %zu, at most %d sockets "
                "to the proxy\n",
                saves, state.bytes() / 1048576.0, restores, seconds, requests, faults, s503, resets,
                static_cast<unsigned long long>(client.requests),
                static_cast<unsigned long long>(client.retries),
                static_cast<unsigned long long>(client.connections_opened), rss20, rss_end, fds20,
                fds_end, max_connections_seen);

    {
      std::lock_guard lock(mu);
      EXPECT_TRUE(failures.empty()) << failures.size() << " saves failed, first: " << failures[0];
    }
    EXPECT_EQ(committed.load(), saves);
    // The faults really happened: ~5 % of requests (at least half of that).
    EXPECT_GE(faults, requests / 40) << "the proxy injected " << faults << " faults in " << requests
                                     << " requests";
    EXPECT_GT(s503, 0);
    EXPECT_GT(resets, 0);
    EXPECT_GT(client.retries, 0u);

    // Memory: less than 5 % growth from save 20 to the end.
    if (CKPTIO_SOAK_SANITIZED) {
      std::printf("soak: NOTE: built with a sanitizer: resident memory is not meaningful here, the "
                  "RSS assertion (< 5 %% growth) is NOT checked in this build; all others are\n");
    } else {
      EXPECT_LT(static_cast<double>(rss_end), 1.05 * static_cast<double>(rss20))
          << "resident memory grew from " << rss20 << " KiB after 20 saves to " << rss_end
          << " KiB after " << saves;
    }
    // Descriptors: what libcurl's connection cache may hold, at most.
    EXPECT_LE(fds_end, fds20 + config.max_connections)
        << "fds after save 20: " << fds20 << ", at the end: " << fds_end << ":"
        << describe_fds(open_fds());

    // Retention kept 3; after gc nothing else is there.
    ASSERT_TRUE(testutil::s3_fault_set_rules(srv, "", &resp)) << resp;
    Status g = m.gc();
    EXPECT_TRUE(g.ok()) << g.to_string();
    auto left = testutil::find_leftovers(m);
    ASSERT_TRUE(left.status.ok()) << left.status.to_string();
    EXPECT_TRUE(left.empty()) << "after gc: " << left.describe();
    EXPECT_EQ(left.steps, (std::vector<int64_t>{saves - 2, saves - 1, saves}));
  }
  // The manager and its storage are gone: every descriptor and connection they had is closed.
  const auto fds_after = open_fds();
  EXPECT_EQ(fds_after.size(), fds_before.size())
      << "before:" << describe_fds(fds_before) << "\nafter:" << describe_fds(fds_after);
  EXPECT_EQ(sockets_to(port).total, 0) << "sockets to the proxy left open";
  (void)testutil::s3_fault_reset(srv);
}

}  // namespace
}  // namespace ckptio
