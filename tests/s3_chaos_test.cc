// S3 chaos, scenario by scenario: whole saves (multipart, 3 parts) and
// restores through CheckpointManager over the fault proxy in front of moto
// (tests/s3/fault-proxy, fixture s3_moto_chaos; one proxy, its rules swapped
// per scenario through its control API).
//
// Scenarios that leave a chance (S3MotoChaos/ChaosTest.*): latency with
// jitter, bandwidth caps, resets of 15 % of connections (before the request
// reaches the server, and after it answered: the answer lost), slow closes,
// 503 on 10 % and 500 on 5 % of requests, truncated bodies, stalls longer
// than the request timeout. Each runs rounds -- a fresh storage and manager
// (new connections, as after a restart), a save of a new step, a restore of
// the latest -- until the proxy has injected the scenario's minimum of
// faults (its counters say so; a scenario in which nothing was injected
// fails). Every save commits, every restore is bit-exact, and after the
// faults stop, gc() leaves no unfinished upload and no unreferenced object.
//
// Scenarios that leave none (S3MotoChaos.*): 503 on every write, stalls on
// every part, a total outage. The save fails with a clear error, its callback
// runs once, the previous step stays the latest and restores bit-exact, and
// no multipart upload is left behind.
//
// Seeded: CKPTIO_CHAOS_SEED=<n> repeats a run (the proxy's coins and the
// data; concurrent requests still reach the proxy in no fixed order).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/fault/fault_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "testutil/leftovers.h"
#include "testutil/s3_server.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;
using testutil::kS3TestPart;

uint64_t chaos_seed() {
  if (const char* s = std::getenv("CKPTIO_CHAOS_SEED"); s != nullptr && *s != '\0')
    return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) % 1000000000000ull;
}

// Deterministic bytes of one step (splitmix64 of seed and step).
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

// A state of 2 full parts and a bit in one data file (3 parts), plus small leaves.
struct ChaosState {
  std::vector<std::byte> w, b;
  int64_t step = 0;

  ChaosState() : w(2 * kS3TestPart + 123457), b(4000 * sizeof(float)) {}
  void set(uint64_t seed, int64_t s) {
    step = s;
    fill(w, seed, s, 1);
    fill(b, seed, s, 2);
  }
  std::vector<LeafView> views() const {
    return {LeafView::full("model", "params.w", DType::kUInt8, {static_cast<int64_t>(w.size())},
                           w.data()),
            LeafView::full("model", "params.b", DType::kFloat32, {4000}, b.data()),
            LeafView::full("tx", "opt_state.step", DType::kInt64, {}, &step)};
  }
  // Empty when `r` is exactly this state; else what differs.
  std::string differences(const RestoredState& r) const {
    std::string out;
    if (r.step != step) out += "step " + std::to_string(r.step) + ", want " + std::to_string(step) + "; ";
    if (r.leaves.size() != 3) return out + std::to_string(r.leaves.size()) + " leaves, want 3";
    for (const Tensor& t : r.leaves) {
      const std::byte* want = nullptr;
      size_t n = 0;
      if (t.path == "params.w") want = w.data(), n = w.size();
      else if (t.path == "params.b") want = b.data(), n = b.size();
      else if (t.path == "opt_state.step") want = reinterpret_cast<const std::byte*>(&step), n = 8;
      if (want == nullptr) { out += "unexpected leaf " + t.path + "; "; continue; }
      if (t.data.size() != n || std::memcmp(t.data.data(), want, n) != 0)
        out += "leaf " + t.path + " differs; ";
    }
    return out;
  }
};

// The proxy's counters of this scenario (GET /__fault__/stats?format=text).
struct ProxyCounts {
  long requests = 0, connections = 0, faults = 0, kind = 0, s503 = 0, s500 = 0;
};

std::string one_line(std::string s) {
  for (size_t i; (i = s.find('\n')) != std::string::npos;) s.replace(i, 1, " | ");
  return s;
}

class ChaosBase {
 protected:
  // Returns false (with a gtest failure or skip recorded) when there is no proxy.
  void start() {
    CKPTIO_REQUIRE_S3_SERVER(srv);
    srv_ = srv;
    ASSERT_FALSE(srv_.control.empty()) << "this test needs the fault proxy (fixture s3_moto_chaos)";
    seed_ = chaos_seed();
    std::string resp;
    ASSERT_TRUE(testutil::s3_fault_control(srv_, "POST", "/reset?seed=" + std::to_string(seed_),
                                           "", &resp))
        << resp;
    config_ = testutil::s3_test_config(srv_);
    config_.retry.max_attempts = 10;  // the product's default
    prefix_ = testutil::s3_test_prefix();
    prefix_.pop_back();
    started_ = true;
  }
  void finish() {
    if (started_) (void)testutil::s3_fault_reset(srv_);
  }
  std::shared_ptr<s3::S3Storage> open_store(const s3::S3Config& c) {
    auto s = s3::make_s3_storage("s3://" + srv_.bucket + "/" + prefix_, c);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : nullptr;
  }
  ManagerOptions manager_options() const {
    ManagerOptions mo;
    mo.chunk_size = kS3TestPart;
    mo.max_to_keep = 2;
    return mo;
  }
  void rules(const std::string& r) {
    std::string resp;
    ASSERT_TRUE(testutil::s3_fault_set_rules(srv_, r, &resp)) << resp;
  }
  long count(const std::string& name) { return testutil::s3_fault_count(srv_, name); }
  ProxyCounts counts(const std::string& kind) {
    return {count("requests"),       count("connections"), count("faults_total"),
            count("faults." + kind), count("status.503"),  count("status.500")};
  }
  // The faults stop; gc() cleans up; nothing may be left.
  void expect_clean_after_gc(CheckpointManager& m) {
    rules("");
    Status g = m.gc();
    EXPECT_TRUE(g.ok()) << g.to_string();
    auto left = testutil::find_leftovers(m);
    ASSERT_TRUE(left.status.ok()) << left.status.to_string();
    EXPECT_TRUE(left.empty()) << "after gc: " << left.describe();
  }

  testutil::S3TestServer srv_;
  s3::S3Config config_;
  std::string prefix_;
  uint64_t seed_ = 0;
  bool started_ = false;
};

// ---- scenarios that leave a chance --------------------------------------------------

struct Scenario {
  std::string name;
  std::string rules;     // the proxy's rules, one a line
  std::string kind;      // the fault kind counted (faults.<kind>)
  long min_faults;       // rounds go on until at least this many were injected
  double request_timeout_s = 20;
  bool retries_expected = true;  // answering faults: the client must have retried
  double min_save_seconds = 0;   // bandwidth: a save cannot be faster than this
};

// gtest prints a parameter in test names (ctest's list): the name, not bytes.
void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

std::vector<Scenario> scenarios() {
  return {
      {"LatencyWithJitter", "fault=latency delay=0.05 jitter=0.04", "latency", 40, 20, false},
      // 3 parts at 16 MB/s each: a save needs at least one whole part's time.
      {"BandwidthCap", "fault=bandwidth rate=16M", "bandwidth", 40, 20, false,
       static_cast<double>(kS3TestPart) / 16e6},
      // 15 % of connections reset at their first request, before it reaches
      // the server (each round opens new connections: a fresh storage).
      {"ResetsOn15PercentOfConnections", "fault=reset per=connection prob=0.15", "reset", 6, 20,
       false},
      // 15 % reset after the server did the work, at their first or second
      // request (a reused connection: libcurl may resend by itself).
      {"ResetsAfterTheServerAnsweredOn15PercentOfConnections",
       "fault=reset per=connection prob=0.15 within=2 when=response", "reset", 6, 20, false},
      {"SlowCloses", "fault=slowclose delay=0.5 prob=0.2", "slowclose", 8, 20, false},
      {"SlowDown503On10Percent", "status=503 prob=0.1", "status", 8},
      {"InternalError500On5Percent", "status=500 prob=0.05", "status", 5},
      // Only responses with bodies can be truncated: GETs (objects, listings)
      // and POSTs (CreateMultipartUpload, CompleteMultipartUpload).
      {"TruncatedBodies", "fault=truncate prob=0.2 method=GET|POST", "truncate", 8},
      // Stalls of 5 s against a 2 s request timeout: before the request is
      // forwarded (any request), and halfway through a ranged GET's body.
      {"StallsLongerThanTheRequestTimeout",
       "fault=stall delay=5 prob=0.04\n"
       "fault=stall delay=5 prob=0.15 op=GetObject header=^Range: body_frac=0.5",
       "stall", 4, 2},
  };
}

class ChaosTest : public ChaosBase, public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(start()); }
  void TearDown() override { finish(); }
};

TEST_P(ChaosTest, SavesAndRestoresBitExact) {
  const Scenario& sc = GetParam();
  // Rounds cost ~0.3 s; the cap only bounds a scenario whose faults do not
  // come (the rarest, resets of 15 % of connections, average ~0.5 a round).
  const int kMaxRounds = 40, kMinRounds = 3;
  std::printf("chaos %s: seed %llu (CKPTIO_CHAOS_SEED to repeat); rules: %s\n", sc.name.c_str(),
              static_cast<unsigned long long>(seed_), one_line(sc.rules).c_str());
  std::fflush(stdout);
  s3::S3Config c = config_;
  c.request_timeout_s = sc.request_timeout_s;
  ChaosState state;
  ASSERT_NO_FATAL_FAILURE(rules(sc.rules));
  const auto t0 = Clock::now();
  int rounds = 0;
  uint64_t retries = 0, requests = 0;
  double slowest_save = 0, fastest_save = 1e9;
  ProxyCounts pc;
  for (int64_t step = 1; step <= kMaxRounds; ++step) {
    // A fresh storage each round: new connections, as after a restart.
    auto store = open_store(c);
    ASSERT_NE(store, nullptr);
    std::atomic<int> callbacks{0};
    ManagerOptions mo = manager_options();
    mo.on_commit = [&](const CommitEvent&) { ++callbacks; };
    CheckpointManager m(store, mo);
    state.set(seed_, step);
    auto h = m.save(step, state.views());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    Status st = h->wait();
    ASSERT_TRUE(st.ok()) << sc.name << ", step " << step << ": " << st.to_string();
    EXPECT_EQ(callbacks.load(), 1);
    const double save_s = h->stats().total_seconds;
    slowest_save = std::max(slowest_save, save_s);
    fastest_save = std::min(fastest_save, save_s);
    auto r = m.restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << sc.name << ", restore after step " << step << ": " << r.status().to_string();
    ASSERT_EQ(state.differences(*r), "") << sc.name << ", step " << step;
    // Retention runs after the handle completes: let it finish, so that the
    // client's and the proxy's counts below are final (a request still in
    // flight was counted by some of the proxy's counters and not others).
    ASSERT_TRUE(m.wait_until_finished().ok());
    retries += store->s3_stats().retries;
    requests += store->s3_stats().requests;
    rounds = static_cast<int>(step);
    pc = counts(sc.kind);
    ASSERT_GE(pc.requests, 0) << "the proxy's control API does not answer";
    if (rounds >= kMinRounds && pc.kind >= sc.min_faults) break;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string per_connection;
  if (sc.rules.find("per=connection") != std::string::npos)
    per_connection = " (" + std::to_string(count("rule.0.chosen")) + " of " +
                     std::to_string(count("rule.0.connections")) + " connections chosen)";
  std::printf("chaos %s: %d rounds in %.1f s; proxy: %ld requests on %ld connections, %ld faults "
              "injected (%ld %s%s, %ld 503s, %ld 500s sent); client: %llu requests, %llu retries; "
              "saves %.2f-%.2f s\n",
              sc.name.c_str(), rounds, seconds, pc.requests, pc.connections, pc.faults, pc.kind,
              sc.kind.c_str(), per_connection.c_str(),
              pc.s503, pc.s500, static_cast<unsigned long long>(requests),
              static_cast<unsigned long long>(retries), fastest_save, slowest_save);
  std::fflush(stdout);
  EXPECT_GE(pc.kind, sc.min_faults) << "the proxy injected too few " << sc.kind << " faults in "
                                    << rounds << " rounds: the scenario did not happen";
  if (sc.retries_expected) {
    EXPECT_GT(retries, 0u) << "faults were injected but nothing was retried";
  }
  if (sc.kind == "status") {
    EXPECT_GE(pc.s503 + pc.s500, sc.min_faults) << "the injected errors were not sent";
  }
  if (sc.kind == "latency") {
    EXPECT_EQ(pc.kind, pc.requests) << "every request is delayed";
  }
  if (sc.min_save_seconds > 0) {
    EXPECT_GE(fastest_save, 0.9 * sc.min_save_seconds)
        << "a save was faster than the bandwidth cap allows: was it applied?";
  }

  auto store = open_store(config_);
  ASSERT_NE(store, nullptr);
  CheckpointManager m(store, manager_options());
  ASSERT_NO_FATAL_FAILURE(expect_clean_after_gc(m));
  auto latest = m.latest_step();
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status().to_string();
  EXPECT_EQ(**latest, rounds);
}

INSTANTIATE_TEST_SUITE_P(S3MotoChaos, ChaosTest, ::testing::ValuesIn(scenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& i) { return i.param.name; });

// ---- scenarios that leave none ----------------------------------------------------------

class S3MotoChaos : public ChaosBase, public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(start()); }
  void TearDown() override { finish(); }

  // Saves step 1 with no faults; `rules` then make step 2 fail. Checks the
  // failure is clean: one callback with the handle's error, step 1 still the
  // latest and bit-exact, no upload and no object left behind (without gc).
  // Returns step 2's error.
  Status fail_cleanly(const std::string& fault_rules, const s3::S3Config& c) {
    ChaosState state;
    auto store = open_store(c);
    EXPECT_NE(store, nullptr);
    if (store == nullptr) return Status(Code::kInternal, "no store");
    Status callback_status;
    std::atomic<int> callbacks{0};
    ManagerOptions mo = manager_options();
    mo.on_commit = [&](const CommitEvent& e) {
      if (e.step == 2) callback_status = e.status;
      ++callbacks;
    };
    CheckpointManager m(store, mo);
    state.set(seed_, 1);
    auto h1 = m.save(1, state.views());
    EXPECT_TRUE(h1.ok() && h1->wait().ok());

    rules(fault_rules);
    ChaosState next;
    next.set(seed_, 2);
    const auto t0 = Clock::now();
    auto h2 = m.save(2, next.views());
    EXPECT_TRUE(h2.ok()) << h2.status().to_string();
    if (!h2.ok()) return h2.status();
    Status st = h2->wait();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_FALSE(st.ok()) << "step 2 committed although every attempt had to fail";
    EXPECT_EQ(callbacks.load(), 2);
    EXPECT_EQ(callback_status.code(), st.code()) << callback_status.to_string();
    const ProxyCounts pc = counts("status");
    std::printf("chaos no-chance: seed %llu; rules: %s\n  the save failed in %.1f s after %ld "
                "faults injected (%ld requests): %s\n",
                static_cast<unsigned long long>(seed_), one_line(fault_rules).c_str(), seconds, pc.faults,
                pc.requests, st.to_string().c_str());
    std::fflush(stdout);
    EXPECT_GE(pc.faults, 5) << "the proxy injected too few faults";

    // The faults stop (and stalled connections end); no gc before looking.
    EXPECT_TRUE(testutil::s3_fault_reset(srv_));
    auto left = testutil::find_leftovers(m);
    EXPECT_TRUE(left.status.ok()) << left.status.to_string();
    EXPECT_TRUE(left.empty()) << "after the failed save: " << left.describe();
    EXPECT_EQ(left.steps, std::vector<int64_t>{1});
    auto r = m.restore(std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) {
      state.set(seed_, 1);
      EXPECT_EQ(state.differences(*r), "");
    }
    return st;
  }
};

TEST_F(S3MotoChaos, EveryWriteAnswered503FailsCleaningUp) {
  s3::S3Config c = config_;
  c.retry.max_attempts = 5;
  Status st = fail_cleanly("status=503 op=UploadPart|PutObject|CompleteMultipartUpload", c);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  for (const char* want : {"run-2/", "HTTP 503", "SlowDown", "after 5 attempts"})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " not in: " << st.to_string();
}

// Each attempt ends one request timeout after its last byte moved, not
// when the stall ends (never, here).
TEST_F(S3MotoChaos, PermanentStallsFailCleaningUp) {
  s3::S3Config c = config_;
  c.retry.max_attempts = 3;
  c.request_timeout_s = 1;
  const auto t0 = Clock::now();
  Status st = fail_cleanly("fault=stall delay=60 op=UploadPart", c);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  for (const char* want : {"run-2/", "stalled: no byte moved for 1 s", "after 3 attempts"})
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " not in: " << st.to_string();
  // 3 attempts of 1 s each, checked about once a second, backoffs of at most
  // 0.5 s, and the saves of step 1 and the checks around them.
  EXPECT_LT(seconds, 3 * (1 + 1.2) + 2 * 0.5 + 3) << "the stalls were not cut at the request timeout";
}

// Every request fails: the save fails before any upload exists, restore and
// discovery fail as unavailable (not as damage), and all is well afterwards.
TEST_F(S3MotoChaos, TotalOutageFailsCleanlyAndNothingIsLost) {
  s3::S3Config c = config_;
  c.retry.max_attempts = 3;
  Status st = fail_cleanly("status=503", c);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("SlowDown"), std::string::npos) << st.to_string();

  auto store = open_store(c);
  ASSERT_NE(store, nullptr);
  CheckpointManager m(store, manager_options());
  rules("status=503");
  auto r = m.restore(std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().to_string();
  auto latest = m.latest_step();
  ASSERT_FALSE(latest.ok());
  EXPECT_EQ(latest.status().code(), Code::kUnavailable) << latest.status().to_string();
  rules("");
  auto back = m.restore(std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ChaosState state;
  state.set(seed_, 1);
  EXPECT_EQ(state.differences(*back), "");
}

// The index PUT reaches moto and moto stores it, but the answer never comes
// back (the connection is reset): the conditional PUT (If-None-Match: *) is
// sent again and meets the index its first attempt wrote (412). The commit reads the index, finds its own, and the step is
// committed; a second writer's index would have failed it instead.
TEST_F(S3MotoChaos, IndexPutWhoseAnswerIsLostCommitsOnce) {
  auto store = open_store(config_);
  ASSERT_NE(store, nullptr);
  std::atomic<int> callbacks{0};
  Status told = internal_error("no callback");
  ManagerOptions mo = manager_options();
  mo.on_commit = [&](const CommitEvent& e) { told = e.status; ++callbacks; };
  CheckpointManager m(store, mo);
  ChaosState state;
  state.set(seed_, 1);
  ASSERT_NO_FATAL_FAILURE(rules("fault=reset when=response method=PUT path=ckptio_index[.]json count=1"));
  auto h = m.save(1, state.views());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Status st = h->wait();
  EXPECT_TRUE(st.ok()) << st.to_string();
  ASSERT_TRUE(m.wait_until_finished().ok());
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_TRUE(told.ok()) << told.to_string();
  EXPECT_EQ(count("faults.reset"), 1) << "the answer to the index PUT was not lost: the scenario did not happen";
  // Sent again (by the client's retry, or by libcurl itself on a reused
  // connection): the index PUTs the proxy saw.
  EXPECT_EQ(count("rule.0.matched"), 2);
  rules("");
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(state.differences(*r), "");
  // And a second writer of step 1 is refused, even past the check before
  // the PUT (a save whose checks ran before the first writer committed).
  ChaosState other;
  other.set(seed_ + 1, 1);
  auto faulty = make_fault_storage(store);
  faulty->add_rule(FaultRule{.op = FaultOp::kStat, .key_substr = "ckptio_index.json", .code = Code::kNotFound});
  CheckpointManager second(faulty, manager_options());
  auto h2 = second.save(1, other.views());
  ASSERT_TRUE(h2.ok()) << h2.status().to_string();
  EXPECT_EQ(h2->wait().code(), Code::kAlreadyExists) << h2->wait().to_string();
  r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(state.differences(*r), "");
  ASSERT_NO_FATAL_FAILURE(expect_clean_after_gc(m));
}

}  // namespace
}  // namespace ckptio
