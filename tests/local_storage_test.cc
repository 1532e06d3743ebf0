// Tests of the io_uring local-disk backend (backends/local). Each test works in
// a fresh directory under /tmp (ext4 on the CI machine, so O_DIRECT works);
// tests that need a tmpfs/ramfs mount (ENOSPC, file systems refusing O_DIRECT,
// read-only file systems) mount one inside it and skip loudly when mounting is
// not permitted.
//
// LocalStorageBench.DISABLED_* are the measurements behind the defaults:
//   /tmp/local_test --gtest_also_run_disabled_tests --gtest_filter='LocalStorageBench.*'
// (CKPTIO_BENCH_DIR picks the directory, default /tmp; reads drop the page
// cache first, which needs root).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "backends/local/keys.h"
#include "backends/local/local_storage.h"
#include "backends/local/pread_pool.h"
#include "backends/local/read_plan.h"
#include "backends/local/reader.h"
#include "backends/local/ring.h"
#include "backends/local/writer.h"
#include "ckptio/local.h"
#include "ckptio/manager.h"
#include "ckptio/storage.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB, kGiB = 1024 * kMiB;

// Bytes that differ at every offset with no short period, so a misplaced
// block is caught.
std::byte pattern(uint64_t at, uint64_t seed = 0) {
  uint64_t x = (at + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  return static_cast<std::byte>((x ^ (x >> 31)) >> 24);
}

LocalOptions opts(std::string direct_io, std::string read_mode = "", uint64_t request_size = 0,
                    uint32_t queue_depth = 0) {
  LocalOptions o;
  o.direct_io = std::move(direct_io);
  o.read_mode = std::move(read_mode);
  o.request_size = request_size;
  o.queue_depth = queue_depth;
  return o;
}

struct AlignedBuf {
  explicit AlignedBuf(size_t n, size_t align = 4096)
      : size(n), ptr(static_cast<std::byte*>(std::aligned_alloc(align, (n + align - 1) / align * align + align))) {}
  ~AlignedBuf() { std::free(ptr); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  std::byte* data() { return ptr; }
  size_t size;
  std::byte* ptr;
};

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// Counts outstanding write callbacks and keeps the first error.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t issued = 0, completed = 0;
  Status first;
  IoDone callback() {
    {
      std::lock_guard lock(mu);
      ++issued;
    }
    return [this](Status st) {
      std::lock_guard lock(mu);
      if (!st.ok() && first.ok()) first = st;
      ++completed;
      cv.notify_all();
    };
  }
  Status wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return completed == issued; });
    return first;
  }
};

class LocalStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckptio-local-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::shared_ptr<Storage> open(LocalOptions opts = {}, std::string root = "") {
    auto r = make_local_storage(root.empty() ? dir_ + "/root" : root, opts);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : nullptr;
  }

  // Mounts a file system at `path` (created); false when not permitted.
  bool try_mount(const std::string& path, const char* type, const char* data) {
    fs::create_directories(path);
    if (::mount(type, path.c_str(), type, 0, data) != 0) return false;
    mounts_.push_back(path);
    return true;
  }

  // Writes `size` pattern bytes as the core does: chunks of `chunk` bytes at
  // multiples of it, the last one padded to the writer's alignment with junk.
  Status write_object(Storage& s, const std::string& key, uint64_t size, uint64_t chunk, uint64_t seed = 0) {
    auto w = s.create(key, size);
    if (!w.ok()) return w.status();
    WritableObject& obj = **w;
    const uint64_t align = obj.alignment();
    AlignedBuf buf(size + 2 * 4096);
    for (uint64_t i = 0; i < size; ++i) buf.data()[i] = pattern(i, seed);
    std::memset(buf.data() + size, 0xEE, 2 * 4096);
    Waiter waiter;
    for (uint64_t off = 0; off < size; off += chunk) {
      const uint64_t len = std::min(chunk, size - off);
      const uint64_t padded = (len + align - 1) / align * align;
      obj.write_async(off, {buf.data() + off, padded}, waiter.callback());
    }
    Status st = waiter.wait();
    if (!st.ok()) {
      obj.abort();
      return st;
    }
    return obj.finish(size);
  }

  std::string file_contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static void expect_pattern(const std::byte* p, uint64_t n, uint64_t at, uint64_t seed = 0) {
    for (uint64_t i = 0; i < n; ++i) {
      if (p[i] != pattern(at + i, seed)) {
        ADD_FAILURE() << "byte " << i << " (file offset " << at + i << ") differs";
        return;
      }
    }
  }

  std::string dir_;
  std::vector<std::string> mounts_;
};

// ---- keys ------------------------------------------------------------------

TEST_F(LocalStorageTest, RejectsMalformedKeys) {
  auto s = open();
  ASSERT_TRUE(s);
  for (std::string key : {std::string("../x"), std::string("a/../b"), std::string("/abs"),
                          std::string("a\0b", 3), std::string("a\\b"), std::string("a//b"),
                          std::string("./a"), std::string("a/"), std::string(""),
                          std::string("x.tmp-ckptio-0123456789abcdef")}) {
    EXPECT_EQ(s->put(key, bytes_of("x")).code(), Code::kInvalidArgument) << key;
    EXPECT_EQ(s->get(key, 100).status().code(), Code::kInvalidArgument) << key;
    EXPECT_EQ(s->create(key, 0).status().code(), Code::kInvalidArgument) << key;
  }
  EXPECT_EQ(s->list("../", true).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(s->remove_prefix("/etc/").code(), Code::kInvalidArgument);
  EXPECT_EQ(s->rename("a/", "../b/", RenameMode::kNoReplace).code(), Code::kInvalidArgument);
}

TEST(LocalKeys, SplitAndTempNames) {
  using local::split_prefix;
  EXPECT_EQ(split_prefix("a/b/run-"), std::make_pair(std::string_view("a/b/"), std::string_view("run-")));
  EXPECT_EQ(split_prefix("a/b/"), std::make_pair(std::string_view("a/b/"), std::string_view("")));
  EXPECT_EQ(split_prefix("run-"), std::make_pair(std::string_view(""), std::string_view("run-")));
  std::string t = local::temp_path_for("/r/index.json");
  EXPECT_EQ(t.rfind("/r/index.json.tmp-ckptio-", 0), 0u);
  EXPECT_TRUE(local::is_temp_name(fs::path(t).filename().string()));
  EXPECT_FALSE(local::is_temp_name("run-5.tmp-0123456789abcdef"));  // the core's staging dirs
  EXPECT_TRUE(local::check_prefix("run-").ok());
  EXPECT_TRUE(local::check_prefix("").ok());
  EXPECT_TRUE(local::check_prefix("a/b/").ok());
}

// ---- writes ------------------------------------------------------------------

TEST_F(LocalStorageTest, ChunkedDirectWriteWithPaddedLastChunk) {
  auto s = open(opts("on", "", 0, 0));
  ASSERT_TRUE(s);
  const uint64_t size = 3 * kMiB + 1000;
  {
    auto w = s->create("run-1/data.bin", size);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ((*w)->granularity(), 4096u);
    EXPECT_EQ((*w)->alignment(), 4096u);
    // The storage announces its writers' granularity before any create(),
    // so the core can cut its chunks to it.
    EXPECT_EQ(s->write_granularity(), 4096u);
    EXPECT_EQ(s->write_memory_alignment(), 4096u);  // O_DIRECT reads the data in place
    (*w)->abort();
  }
  ASSERT_TRUE(write_object(*s, "run-1/data.bin", size, kMiB).ok());
  std::string got = file_contents(dir_ + "/root/run-1/data.bin");
  ASSERT_EQ(got.size(), size);
  expect_pattern(reinterpret_cast<const std::byte*>(got.data()), size, 0);
  auto st = s->stat("run-1/data.bin");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(*st, size);
  // Only the object is left behind: no temporaries.
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir_ + "/root/run-1")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"data.bin"});
}

TEST_F(LocalStorageTest, RequestSizeSplitsLargeWrites) {
  // 5 MiB writes cut into 64 KiB SQEs, at queue depth 4.
  auto s = open(opts("auto", "", 64 * kKiB, 4));
  ASSERT_TRUE(s);
  const uint64_t size = 20 * kMiB + 4096 * 3 + 17;
  ASSERT_TRUE(write_object(*s, "big.bin", size, 5 * kMiB, 3).ok());
  std::string got = file_contents(dir_ + "/root/big.bin");
  ASSERT_EQ(got.size(), size);
  expect_pattern(reinterpret_cast<const std::byte*>(got.data()), size, 0, 3);
}

TEST_F(LocalStorageTest, BufferedWriteTakesAnyGranularity) {
  auto s = open(opts("off", "", 0, 0));
  ASSERT_TRUE(s);
  auto w = s->create("f.bin", 0);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->granularity(), 1u);
  EXPECT_EQ((*w)->alignment(), 1u);
  EXPECT_EQ(s->write_granularity(), 1u);
  EXPECT_EQ(s->write_memory_alignment(), 1u);
  const uint64_t size = 100003;
  std::vector<std::byte> src(size);
  for (uint64_t i = 0; i < size; ++i) src[i] = pattern(i);
  Waiter waiter;
  // Out of order, odd sizes, unaligned buffers.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t off = 0; off < size; off += 777) ranges.emplace_back(off, std::min<uint64_t>(777, size - off));
  std::shuffle(ranges.begin(), ranges.end(), std::mt19937(7));
  for (auto [off, len] : ranges) (*w)->write_async(off, {src.data() + off, len}, waiter.callback());
  ASSERT_TRUE(waiter.wait().ok());
  ASSERT_TRUE((*w)->finish(size).ok());
  std::string got = file_contents(dir_ + "/root/f.bin");
  ASSERT_EQ(got.size(), size);
  EXPECT_EQ(0, std::memcmp(got.data(), src.data(), size));
}

TEST_F(LocalStorageTest, NothingReplacedUntilFinishAndAbortLeavesOldObject) {
  auto s = open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put("obj", bytes_of("old")).ok());
  {
    auto w = s->create("obj", 8192);
    ASSERT_TRUE(w.ok());
    AlignedBuf buf(8192);
    std::memset(buf.data(), 'n', 8192);
    Waiter waiter;
    (*w)->write_async(0, {buf.data(), 8192}, waiter.callback());
    ASSERT_TRUE(waiter.wait().ok());
    EXPECT_EQ(*s->get("obj", 100), "old");  // not replaced yet
    (*w)->abort();
  }
  EXPECT_EQ(*s->get("obj", 100), "old");
  auto listed = s->list("", false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->objects.size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/root"), fs::directory_iterator()), 1);
  // And a writer dropped without finish() or abort() cleans up too.
  { auto w = s->create("obj2", 100); ASSERT_TRUE(w.ok()); }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/root"), fs::directory_iterator()), 1);
  // finish() then replaces.
  ASSERT_TRUE(write_object(*s, "obj", 5000, 4096).ok());
  EXPECT_EQ(*s->stat("obj"), 5000u);
}

TEST_F(LocalStorageTest, MisuseIsReportedNotCrashed) {
  auto s = open(opts("on", "", 0, 0));
  ASSERT_TRUE(s);
  auto w = s->create("x", 0);
  ASSERT_TRUE(w.ok());
  AlignedBuf buf(8192);
  Waiter waiter;
  (*w)->write_async(100, {buf.data(), 4096}, waiter.callback());  // unaligned offset
  Status st = waiter.wait();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find(dir_ + "/root/x"), std::string::npos) << st.message();
  // The object is lost once a write failed.
  EXPECT_EQ((*w)->finish(4096).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->finish(4096).code(), Code::kFailedPrecondition);
  EXPECT_EQ(s->stat("x").status().code(), Code::kNotFound);
}

TEST_F(LocalStorageTest, OffsetsBeyondFourGiB) {
  for (const char* mode : {"direct", "buffered"}) {
    auto s = open(opts("auto", mode, 0, 0));
    ASSERT_TRUE(s);
    const uint64_t at = 5 * kGiB;
    auto w = s->create("sparse.bin", at + 4096);
    ASSERT_TRUE(w.ok());
    AlignedBuf buf(4096);
    for (uint64_t i = 0; i < 4096; ++i) buf.data()[i] = pattern(at + i);
    Waiter waiter;
    (*w)->write_async(at, {buf.data(), 4096}, waiter.callback());
    ASSERT_TRUE(waiter.wait().ok());
    ASSERT_TRUE((*w)->finish(at + 4000).ok());
    EXPECT_EQ(*s->stat("sparse.bin"), at + 4000);
    AlignedBuf back(8192);
    std::vector<ReadRequest> reqs = {{"sparse.bin", at + 10, 3990, back.data() + 10},
                                     {"sparse.bin", at - 100, 100, back.data() + 5000}};
    ASSERT_TRUE(s->read(reqs).ok()) << mode;
    expect_pattern(back.data() + 10, 3990, at + 10);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(back.data()[5000 + i], std::byte{0}) << mode;
    ASSERT_TRUE(s->remove("sparse.bin").ok());
  }
}

TEST_F(LocalStorageTest, BackpressureBlocksInsteadOfFailing) {
  auto s = open(opts("auto", "", 0, 4));
  ASSERT_TRUE(s);
  const uint64_t n = 1000, len = 4096;
  auto w = s->create("many.bin", n * len);
  ASSERT_TRUE(w.ok());
  AlignedBuf buf(n * len);
  for (uint64_t i = 0; i < n * len; ++i) buf.data()[i] = pattern(i);
  Waiter waiter;
  uint64_t max_outstanding = 0;
  for (uint64_t i = 0; i < n; ++i) {
    (*w)->write_async(i * len, {buf.data() + i * len, len}, waiter.callback());
    std::lock_guard lock(waiter.mu);
    max_outstanding = std::max(max_outstanding, waiter.issued - waiter.completed);
  }
  ASSERT_TRUE(waiter.wait().ok());
  EXPECT_EQ(waiter.completed, n);
  EXPECT_LE(max_outstanding, 4u);
  ASSERT_TRUE((*w)->finish(n * len).ok());
  std::string got = file_contents(dir_ + "/root/many.bin");
  ASSERT_EQ(got.size(), n * len);
  expect_pattern(reinterpret_cast<const std::byte*>(got.data()), n * len, 0);
}

TEST_F(LocalStorageTest, ConcurrentWritersAndReaders) {
  auto s = open(opts("auto", "", 256 * kKiB, 8));
  ASSERT_TRUE(s);
  ASSERT_TRUE(write_object(*s, "shared.bin", 4 * kMiB + 5, kMiB, 9).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        const std::string key = "w" + std::to_string(t) + "/r" + std::to_string(round);
        if (!write_object(*s, key, 2 * kMiB + t * 4096 + 11, 512 * kKiB, t).ok()) ++failures;
        std::vector<std::byte> back(kMiB);
        std::vector<ReadRequest> reqs = {{"shared.bin", 12345, kMiB, back.data()}};
        if (!s->read(reqs).ok()) ++failures;
        for (uint64_t i = 0; i < kMiB; i += 4099)
          if (back[i] != pattern(12345 + i, 9)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---- reads -----------------------------------------------------------------

class LocalReadTest : public LocalStorageTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(LocalReadTest, BitExactWithUnalignedAndCongruentRanges) {
  // Small requests so that requests split into several ring / pread pieces.
  auto s = open(opts("auto", GetParam(), 64 * kKiB, 8));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->read_alignment(), std::string(GetParam()) == "direct" ? 4096u : 1u);
  const uint64_t size = 3 * kMiB + 123;
  ASSERT_TRUE(write_object(*s, "data.bin", size, kMiB).ok());
  std::mt19937_64 rng(42);
  struct Case { uint64_t off, len; uint64_t phase; };
  std::vector<Case> cases = {
      {0, size, 0},                // whole file, aligned
      {1, size - 1, 1},            // congruent, unaligned start, EOF end
      {4095, 2, 4095},             // straddles a block boundary, congruent
      {4096 * 3, 4096, 0},         // one aligned block
      {size - 1, 1, 7},            // last byte
      {size - 5000, 5000, 100},    // tail, not congruent
      {100, 200 * kKiB, 3},        // not congruent, several bounce pieces
      {70000, 0, 0},               // empty
  };
  for (int i = 0; i < 40; ++i) {
    uint64_t off = rng() % size, len = rng() % std::min<uint64_t>(size - off + 1, 400 * kKiB);
    uint64_t phase = (i % 2) ? off % 4096 : rng() % 4096;  // half congruent
    cases.push_back({off, len, phase});
  }
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<ReadRequest> reqs;
  for (const Case& c : cases) {
    bufs.push_back(std::make_unique<AlignedBuf>(c.len + 4096 + 8));
    std::memset(bufs.back()->data(), 0xAB, c.len + 4096 + 8);
    reqs.push_back({"data.bin", c.off, c.len, bufs.back()->data() + c.phase});
  }
  Status st = s->read(reqs);
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    expect_pattern(reqs[i].dst, cases[i].len, cases[i].off);
    // Nothing written outside the destination.
    for (uint64_t b = 0; b < cases[i].phase; ++b) ASSERT_EQ(bufs[i]->data()[b], std::byte{0xAB});
    for (uint64_t b = 0; b < 8; ++b) ASSERT_EQ(reqs[i].dst[cases[i].len + b], std::byte{0xAB});
  }
}

TEST_P(LocalReadTest, PastEndIsDataLossAndMissingIsNotFound) {
  auto s = open(opts("auto", GetParam(), 0, 0));
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put("run-1/small.bin", bytes_of(std::string(5000, 'x'))).ok());
  std::vector<std::byte> buf(10000);
  std::vector<ReadRequest> past = {{"run-1/small.bin", 4000, 1001, buf.data()}};
  Status st = s->read(past);
  EXPECT_EQ(st.code(), Code::kDataLoss) << st.to_string();
  EXPECT_NE(st.message().find("run-1/small.bin"), std::string::npos) << st.message();
  std::vector<ReadRequest> exact = {{"run-1/small.bin", 4000, 1000, buf.data()}};
  EXPECT_TRUE(s->read(exact).ok());
  std::vector<ReadRequest> missing = {{"run-1/small.bin", 0, 10, buf.data()}, {"run-1/nope.bin", 0, 10, buf.data()}};
  st = s->read(missing);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("run-1/nope.bin"), std::string::npos) << st.message();
  EXPECT_EQ(s->stat("run-1/nope.bin").status().code(), Code::kNotFound);
  EXPECT_EQ(s->get("run-1/nope.bin", 10).status().code(), Code::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Modes, LocalReadTest, ::testing::Values("direct", "buffered"));

// /proc/self/io's read_bytes: what this process had fetched from block
// devices (a read the page cache serves adds nothing).
uint64_t device_read_bytes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (in >> key >> v)
    if (key == "read_bytes:") return v;
  ADD_FAILURE() << "no read_bytes in /proc/self/io";
  return 0;
}

TEST_F(LocalStorageTest, DirectReadsOfBytesThePageCacheHoldsGoThroughIt) {
  // Direct mode reads with O_DIRECT, except the bytes of a file the page
  // cache already holds (direct_io auto): those would be fetched from the
  // device again. direct_io=on insists on O_DIRECT.
  auto s = open(opts("auto", "direct", 0, 0));
  auto on = open(opts("on", "direct", 0, 0));
  ASSERT_TRUE(s && on);
  const uint64_t size = 8 * kMiB;
  ASSERT_TRUE(write_object(*s, "run-1/data.bin", size, kMiB).ok());
  const std::string path = dir_ + "/root/run-1/data.bin";
  auto uncache = [&] {
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  };
  auto cache = [&] {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> b(size);
    in.read(b.data(), static_cast<std::streamsize>(size));
    ASSERT_EQ(static_cast<uint64_t>(in.gcount()), size);
  };
  AlignedBuf back(size);
  // Fetched from the device: read_bytes grows by at least the file.
  auto fetched = [&](Storage& st) -> uint64_t {
    std::memset(back.data(), 0, size);
    std::vector<ReadRequest> reqs = {{"run-1/data.bin", 0, size, back.data()}};
    const uint64_t before = device_read_bytes();
    Status r = st.read(reqs);
    EXPECT_TRUE(r.ok()) << r.to_string();
    const uint64_t n = device_read_bytes() - before;
    for (uint64_t i = 0; i < size; i += 4093) EXPECT_EQ(back.data()[i], pattern(i)) << "byte " << i;
    return n;
  };
  uncache();
  EXPECT_GE(fetched(*s), size) << "a file the cache does not hold is read from the device";
  cache();
  EXPECT_LT(fetched(*s), size / 8) << "a file the cache holds is read from it";
  EXPECT_GE(fetched(*on), size) << "direct_io=on reads with O_DIRECT whatever the cache holds";
}

// view_cached lends a file the page cache holds as a read-only mapping (the
// bytes as written, nothing read from the device), and nothing for a file
// mostly on the device, with direct_io=on, for an empty file; a missing
// key is kNotFound.
TEST_F(LocalStorageTest, ViewCachedMapsOnlyAFileThePageCacheHolds) {
  auto s = open(opts("auto", "direct", 0, 0));
  auto on = open(opts("on", "direct", 0, 0));
  ASSERT_TRUE(s && on);
  const uint64_t size = 8 * kMiB + 100;
  ASSERT_TRUE(write_object(*s, "run-1/data.bin", size, kMiB).ok());
  const std::string path = dir_ + "/root/run-1/data.bin";
  {
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  }
  auto cold = s->view_cached("run-1/data.bin");
  ASSERT_TRUE(cold.ok()) << cold.status().to_string();
  EXPECT_EQ(*cold, nullptr) << "a file on the device is read, not mapped";
  ASSERT_EQ(file_contents(path).size(), size);  // now the cache holds it
  const uint64_t before = device_read_bytes();
  auto warm = s->view_cached("run-1/data.bin");
  ASSERT_TRUE(warm.ok()) << warm.status().to_string();
  ASSERT_NE(*warm, nullptr) << "a file the page cache holds is lent in place";
  const std::span<const std::byte> b = (*warm)->bytes();
  ASSERT_EQ(b.size(), size);
  expect_pattern(b.data(), size, 0);
  EXPECT_LT(device_read_bytes() - before, size / 8) << "the view reads nothing from the device";
  auto forced = on->view_cached("run-1/data.bin");
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(*forced, nullptr) << "direct_io=on reads with O_DIRECT, never through the cache";
  ASSERT_TRUE(s->put("run-1/empty", {}).ok());
  auto empty = s->view_cached("run-1/empty");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, nullptr);
  EXPECT_EQ(s->view_cached("run-1/missing").status().code(), Code::kNotFound);
  EXPECT_EQ(s->view_cached("../escape").status().code(), Code::kInvalidArgument);
}

TEST(LocalReadPlan, PiecesTileTheRequestAligned) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 3000; ++i) {
    const uint64_t off = rng() % (1 << 20), len = rng() % (1 << 17);
    const uintptr_t dst = 0x100000 + ((i % 3 == 0) ? off % 4096 : rng() % 4096);
    std::vector<local::ReadPiece> pieces;
    local::plan_read(0, off, len, dst, 4096, 64 * kKiB, 16 * kKiB, pieces);
    std::vector<int> covered(len, 0);
    for (const auto& p : pieces) {
      ASSERT_EQ(p.file_offset % 4096, 0u);
      ASSERT_EQ(p.length % 4096, 0u);
      ASSERT_LE(p.length, p.bounce ? 16 * kKiB : 64 * kKiB);
      if (!p.bounce) {
        ASSERT_EQ((dst + p.dst_offset) % 4096, 0u);
        ASSERT_EQ(p.file_offset, off + p.dst_offset);
      } else {
        ASSERT_EQ(p.file_offset + p.copy_from, off + p.dst_offset);
        ASSERT_LE(p.copy_from + p.wanted, p.length);
      }
      for (uint64_t b = 0; b < p.wanted; ++b) covered[p.dst_offset + b]++;
    }
    for (uint64_t b = 0; b < len; ++b) ASSERT_EQ(covered[b], 1) << "off " << off << " len " << len;
  }
}

// ---- ring mechanics ----------------------------------------------------------

// Makes io_uring_setup fail with EPERM on the calling thread from now on, as
// a container's default seccomp profile does (x86-64 and arm64 syscall
// numbers alike). False if the kernel refuses the filter.
bool refuse_io_uring_setup() {
  sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// A ring the kernel refuses (a container's seccomp profile,
// kernel.io_uring_disabled) fails the storage's creation, saying why, and
// touches no descriptor of the process. Before, the failed ring's teardown
// called io_uring_queue_exit on a ring never set up, which closed fd 0 (its
// ring_fd): the next file opened took fd 0, and the next failure closed it.
// (In a child: the filter cannot be taken back.)
TEST(LocalRing, ARefusedRingClosesNoDescriptorOfTheProcess) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("ckptio-noring-" + std::to_string(::getpid()))).string();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (::fcntl(0, F_GETFD) == -1 && ::open("/dev/null", O_RDONLY) != 0) std::_Exit(5);  // fd 0 open
        if (!refuse_io_uring_setup()) std::_Exit(2);
        auto s = make_local_storage(dir);
        if (s.ok()) std::_Exit(3);
        if (s.status().message().find("io_uring refused") == std::string::npos) std::_Exit(4);
        std::_Exit(::fcntl(0, F_GETFD) == -1 ? 6 : 0);
      },
      ::testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

TEST(LocalRing, ShortReadsAndWritesAreCompleted) {
  // A pipe hands out what has arrived, so reads come back short; the ring must
  // keep asking for the remainder. Writes larger than the pipe buffer likewise.
  auto ring = local::Ring::create(4);
  ASSERT_TRUE(ring.ok()) << ring.status().to_string();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const size_t n = 3000;
  std::vector<std::byte> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = pattern(i);
  std::thread writer([&] {
    for (size_t at = 0; at < n; at += 1000) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_EQ(::write(fds[1], in.data() + at, 1000), 1000);
    }
  });
  std::vector<std::byte> out(n);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  local::RingResult result;
  local::RingOp op;
  op.kind = local::RingOp::Kind::kRead;
  op.fd = fds[0];
  op.buf = out.data();
  op.len = n;
  op.offset = 0;
  (*ring)->submit(op, [&](const local::RingResult& r) {
    std::lock_guard lock(mu);
    result = r;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  writer.join();
  EXPECT_EQ(result.err, 0);
  EXPECT_EQ(result.bytes, n);
  EXPECT_EQ(0, std::memcmp(in.data(), out.data(), n));

  // 1 MiB into a 64 KiB pipe while a slow reader drains it.
  const size_t big = kMiB;
  std::vector<std::byte> src(big), sink;
  for (size_t i = 0; i < big; ++i) src[i] = pattern(i, 5);
  std::thread reader([&] {
    std::vector<std::byte> chunk(10000);
    while (sink.size() < big) {
      ssize_t r = ::read(fds[0], chunk.data(), chunk.size());
      if (r <= 0) break;
      sink.insert(sink.end(), chunk.begin(), chunk.begin() + r);
    }
  });
  done = false;
  op.kind = local::RingOp::Kind::kWrite;
  op.fd = fds[1];
  op.buf = src.data();
  op.len = big;
  (*ring)->submit(op, [&](const local::RingResult& r) {
    std::lock_guard lock(mu);
    result = r;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  reader.join();
  EXPECT_EQ(result.err, 0);
  EXPECT_EQ(result.bytes, big);
  ASSERT_EQ(sink.size(), big);
  EXPECT_EQ(0, std::memcmp(src.data(), sink.data(), big));
  ::close(fds[0]);
  ::close(fds[1]);
}

// ---- put / get / list / remove / rename / sync -----------------------------

TEST_F(LocalStorageTest, PutReplacesAtomicallyAndGetLimits) {
  auto s = open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put("run-5/index.json", bytes_of("{\"v\":1}")).ok());
  ASSERT_TRUE(s->put("run-5/index.json", bytes_of("{\"v\":2}")).ok());
  EXPECT_EQ(*s->get("run-5/index.json", 100), "{\"v\":2}");
  EXPECT_EQ(s->get("run-5/index.json", 3).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(s->put("empty", {}).ok());
  EXPECT_EQ(*s->get("empty", 0), "");
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir_ + "/root/run-5")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"index.json"});  // no temporary left

  // A reader racing with puts sees one whole version or the other.
  const std::string a(100000, 'a'), b(100000, 'b');
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop) {
      auto got = s->get("run-5/index.json", 1 << 20);
      if (got.ok() && got->size() == a.size() && *got != a && *got != b) ++torn;
    }
  });
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(s->put("run-5/index.json", bytes_of(i % 2 ? a : b)).ok());
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

TEST_F(LocalStorageTest, ListHasS3Semantics) {
  auto s = open();
  ASSERT_TRUE(s);
  for (const char* k : {"run-1/index.json", "run-1/data/a.bin", "run-2/x", "run-10/y/z", "run-notes.txt",
                        "runner.txt", "other/q"})
    ASSERT_TRUE(s->put(k, bytes_of(k)).ok()) << k;
  fs::create_directories(dir_ + "/root/run-3.tmp-0123456789abcdef");  // a core staging dir: listed
  std::ofstream(dir_ + "/root/run-1/index.json.tmp-ckptio-0123456789abcdef") << "leftover";  // hidden

  auto top = s->list("run-", true);
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top->prefixes, (std::vector<std::string>{"run-1/", "run-10/", "run-2/", "run-3.tmp-0123456789abcdef/"}));
  ASSERT_EQ(top->objects.size(), 1u);
  EXPECT_EQ(top->objects[0].key, "run-notes.txt");
  EXPECT_EQ(top->objects[0].size, strlen("run-notes.txt"));

  auto deep = s->list("run-1", false);
  ASSERT_TRUE(deep.ok());
  EXPECT_TRUE(deep->prefixes.empty());
  std::vector<std::string> keys;
  for (auto& e : deep->objects) keys.push_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"run-1/data/a.bin", "run-1/index.json", "run-10/y/z"}));

  auto inner = s->list("run-1/", true);
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(inner->prefixes, std::vector<std::string>{"run-1/data/"});
  ASSERT_EQ(inner->objects.size(), 1u);
  EXPECT_EQ(inner->objects[0].key, "run-1/index.json");

  auto all = s->list("", false);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->objects.size(), 7u);
  EXPECT_TRUE(std::is_sorted(all->objects.begin(), all->objects.end(),
                             [](auto& x, auto& y) { return x.key < y.key; }));

  for (const char* p : {"missing/", "missing", "run-1/index.json/", "zzz"}) {
    auto none = s->list(p, true);
    ASSERT_TRUE(none.ok()) << p << ": " << none.status().to_string();
    EXPECT_TRUE(none->objects.empty() && none->prefixes.empty()) << p;
  }
  auto s2 = make_local_storage(dir_ + "/fresh-root");
  ASSERT_TRUE(s2.ok());
  fs::remove(dir_ + "/fresh-root");
  auto gone = (*s2)->list("", true);
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->objects.empty());
}

TEST_F(LocalStorageTest, RemoveAndRemovePrefixAreIdempotent) {
  auto s = open();
  ASSERT_TRUE(s);
  for (const char* k : {"run-1/a", "run-1/sub/b", "run-12/c", "run-2/d", "keep/e", "run-x"})
    ASSERT_TRUE(s->put(k, bytes_of("1")).ok());
  EXPECT_TRUE(s->remove("keep/e").ok());
  EXPECT_TRUE(s->remove("keep/e").ok());
  EXPECT_TRUE(s->remove("no/such/dir/key").ok());
  EXPECT_TRUE(s->remove_prefix("run-1/").ok());
  EXPECT_FALSE(fs::exists(dir_ + "/root/run-1"));
  EXPECT_TRUE(fs::exists(dir_ + "/root/run-12/c"));
  EXPECT_TRUE(s->remove_prefix("run-1/").ok());
  EXPECT_TRUE(s->remove_prefix("run-").ok());  // mid-name: run-12/, run-2/, run-x
  auto left = s->list("", false);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->objects.empty());
  EXPECT_TRUE(fs::exists(dir_ + "/root/keep"));
  EXPECT_TRUE(s->remove_prefix("nothing/here/").ok());
  EXPECT_TRUE(s->remove_prefix("nothing").ok());
}

TEST_F(LocalStorageTest, RenameNoReplaceAndExchange) {
  auto s = open();
  ASSERT_TRUE(s);
  auto caps = s->caps();
  EXPECT_TRUE(caps.atomic_rename);
  EXPECT_TRUE(caps.atomic_exchange);
  ASSERT_TRUE(s->put("run-5.tmp-a/index.json", bytes_of("A")).ok());
  ASSERT_TRUE(s->put("run-5.tmp-b/index.json", bytes_of("B")).ok());
  ASSERT_TRUE(s->sync("run-5.tmp-a/").ok());
  ASSERT_TRUE(s->rename("run-5.tmp-a/", "run-5/", RenameMode::kNoReplace).ok());
  EXPECT_EQ(*s->get("run-5/index.json", 10), "A");
  Status st = s->rename("run-5.tmp-b/", "run-5/", RenameMode::kNoReplace);
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.to_string();
  EXPECT_NE(st.message().find(dir_ + "/root/run-5"), std::string::npos) << st.message();
  ASSERT_TRUE(s->rename("run-5.tmp-b/", "run-5/", RenameMode::kExchange).ok());
  EXPECT_EQ(*s->get("run-5/index.json", 10), "B");
  EXPECT_EQ(*s->get("run-5.tmp-b/index.json", 10), "A");
  EXPECT_EQ(s->rename("nope/", "run-5/", RenameMode::kExchange).code(), Code::kNotFound);
  EXPECT_EQ(s->rename("nope/", "other/", RenameMode::kNoReplace).code(), Code::kNotFound);
  // Into a directory that does not exist yet.
  ASSERT_TRUE(s->rename("run-5/", "old/run-5/", RenameMode::kNoReplace).ok());
  EXPECT_EQ(*s->get("old/run-5/index.json", 10), "B");
}

TEST_F(LocalStorageTest, SyncAndDescribe) {
  auto s = open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->describe(), dir_ + "/root");
  ASSERT_TRUE(s->put("a/b", bytes_of("1")).ok());
  EXPECT_TRUE(s->sync("").ok());
  EXPECT_TRUE(s->sync("a/").ok());
  EXPECT_TRUE(s->sync("a/b-mid-name").ok());  // the directory holding a/b*
  EXPECT_EQ(s->sync("missing/").code(), Code::kNotFound);
  // Relative roots are made absolute; a root that is a file is refused.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  auto rel = make_local_storage("rel/root/");
  fs::current_path(cwd);
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ((*rel)->describe(), dir_ + "/rel/root");
  EXPECT_EQ(make_local_storage(dir_ + "/root/a/b").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(make_local_storage(dir_ + "/x", opts("maybe", "", 0, 0)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(make_local_storage(dir_ + "/x", opts("auto", "mmap", 0, 0)).status().code(), Code::kInvalidArgument);
}

// ---- error mapping -----------------------------------------------------------

// A FIFO planted where ckptio reads a file (an index, a data file): the
// open of a FIFO waits for a writer, so discovery, restore and cp hung for
// ever. Now refused as damage, at once, through every way a key is opened.
TEST_F(LocalStorageTest, AFifoInsideTheCheckpointIsRefusedWithoutWaiting) {
  auto storage = open();
  ASSERT_EQ(::mkdir((dir_ + "/root/run-7").c_str(), 0755), 0);
  const std::string fifo = dir_ + "/root/run-7/ckptio_index.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto within = [&](const char* what, auto&& call) {
    auto f = std::async(std::launch::async, call);
    if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << what << " blocked on the FIFO";
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets it go
      if (w >= 0) ::close(w);
    }
    return f.get();
  };
  Status got = within("get", [&] { return storage->get("run-7/ckptio_index.json", 1 << 20).status(); });
  EXPECT_EQ(got.code(), Code::kDataLoss) << got.to_string();
  EXPECT_NE(got.message().find("FIFO"), std::string::npos) << got.to_string();
  Status read = within("read", [&] {
    std::vector<std::byte> buf(16);
    ReadRequest r{"run-7/ckptio_index.json", 0, buf.size(), buf.data()};
    return storage->read(std::span(&r, 1));
  });
  EXPECT_EQ(read.code(), Code::kDataLoss) << read.to_string();
  CheckpointManager manager(storage, {});
  auto latest = within("latest_step", [&] { return manager.latest_step(); });  // damaged: passed over
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_FALSE(latest->has_value());
}

TEST_F(LocalStorageTest, FileWhereDirectoryExpectedIsNotDir) {
  auto s = open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put("run-7", bytes_of("a file")).ok());
  auto w = s->create("run-7/data.bin", 10);
  EXPECT_EQ(w.status().code(), Code::kInvalidArgument);
  EXPECT_NE(w.status().message().find(dir_ + "/root/run-7/data.bin"), std::string::npos)
      << w.status().message();
  EXPECT_NE(w.status().message().find("Not a directory"), std::string::npos) << w.status().message();
  Status st = s->put("run-7/index.json", bytes_of("x"));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
  std::vector<std::byte> buf(4);
  std::vector<ReadRequest> reqs = {{"run-7/data.bin", 0, 4, buf.data()}};
  EXPECT_EQ(s->read(reqs).code(), Code::kInvalidArgument);
}

TEST_F(LocalStorageTest, ReadOnlyFileSystemIsPermissionDenied) {
  // Root bypasses mode bits, so use a read-only bind mount (EROFS).
  auto s = open();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put("ro/existing", bytes_of("x")).ok());
  const std::string ro = dir_ + "/root/ro";
  if (::mount(ro.c_str(), ro.c_str(), nullptr, MS_BIND, nullptr) != 0)
    GTEST_SKIP() << "cannot bind-mount " << ro << " (" << std::strerror(errno)
                 << "): the read-only file system test needs CAP_SYS_ADMIN";
  mounts_.push_back(ro);
  ASSERT_EQ(::mount(nullptr, ro.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr), 0)
      << std::strerror(errno);
  auto w = s->create("ro/new.bin", 10);
  EXPECT_EQ(w.status().code(), Code::kPermissionDenied) << w.status().to_string();
  EXPECT_NE(w.status().message().find(ro + "/new.bin"), std::string::npos) << w.status().message();
  Status st = s->put("ro/existing", bytes_of("y"));
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.to_string();
  EXPECT_EQ(s->remove("ro/existing").code(), Code::kPermissionDenied);
  EXPECT_EQ(*s->get("ro/existing", 10), "x");
}

TEST_F(LocalStorageTest, NoSpaceIsReportedByWriteOrFinish) {
  const std::string small = dir_ + "/root/small";
  if (!try_mount(small, "tmpfs", "size=1m"))
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs at " << small << " (" << std::strerror(errno)
                 << "): the ENOSPC test needs CAP_SYS_ADMIN";
  for (const char* direct : {"auto", "off"}) {
    SCOPED_TRACE(direct);
    auto s = open(opts(direct, "", 0, 0));
    ASSERT_TRUE(s);
    // 3 MiB in 1 MiB chunks into 1 MiB: the chunk that fills the file system
    // comes back short and its remainder with ENOSPC.
    Status st = write_object(*s, "small/big.bin", 3 * kMiB, kMiB);
    EXPECT_EQ(st.code(), Code::kNoSpace) << st.to_string();
    EXPECT_NE(st.message().find(small + "/big.bin"), std::string::npos) << st.message();
    EXPECT_EQ(s->stat("small/big.bin").status().code(), Code::kNotFound);
    auto left = s->list("small/", false);
    ASSERT_TRUE(left.ok());
    EXPECT_TRUE(left->objects.empty());
    EXPECT_EQ(std::distance(fs::directory_iterator(small), fs::directory_iterator()), 0);  // temp unlinked
    st = s->put("small/index.json", bytes_of(std::string(2 * kMiB, 'i')));
    EXPECT_EQ(st.code(), Code::kNoSpace) << st.to_string();
    EXPECT_EQ(std::distance(fs::directory_iterator(small), fs::directory_iterator()), 0);
  }
}

TEST_F(LocalStorageTest, FileSystemRefusingODirect) {
  const std::string ram = dir_ + "/root/ram";
  if (!try_mount(ram, "ramfs", nullptr))
    GTEST_SKIP() << "cannot mount ramfs at " << ram << " (" << std::strerror(errno)
                 << "): the O_DIRECT fallback test needs CAP_SYS_ADMIN";
  {
    auto s = open(opts("on", "", 0, 0));
    ASSERT_TRUE(s);
    auto w = s->create("ram/x.bin", 10);
    EXPECT_EQ(w.status().code(), Code::kUnimplemented) << w.status().to_string();
    EXPECT_EQ(std::distance(fs::directory_iterator(ram), fs::directory_iterator()), 0);
  }
  auto s = open(opts("auto", "direct", 0, 0));
  ASSERT_TRUE(s);
  auto w = s->create("ram/x.bin", 10);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ((*w)->granularity(), 1u);  // fell back to buffered
  EXPECT_EQ(s->write_granularity() % (*w)->granularity(), 0u);  // 4096 still fits it
  (*w)->abort();
  const uint64_t size = 300 * kKiB + 7;
  ASSERT_TRUE(write_object(*s, "ram/x.bin", size, 100 * kKiB + 1).ok());
  std::vector<std::byte> back(size);
  std::vector<ReadRequest> reqs = {{"ram/x.bin", 3, size - 3, back.data() + 1}};
  ASSERT_TRUE(s->read(reqs).ok());
  expect_pattern(back.data() + 1, size - 3, 3);
  auto on = open(opts("on", "direct", 0, 0));
  EXPECT_EQ(on->read(reqs).code(), Code::kUnimplemented);
}

// ---- measurements (run by hand; see the file comment) ------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  return static_cast<bool>(f);
}

std::string bench_dir() {
  const char* d = std::getenv("CKPTIO_BENCH_DIR");
  return d ? d : "/tmp";
}

constexpr uint64_t kBenchSize = 2 * kGiB;

// Writes kBenchSize bytes with `chunk`-byte write_async calls, keeping at
// most 256 MiB in flight (like the core's staging pool); includes finish().
double bench_write(const std::string& root, const std::string& direct, uint64_t request, uint64_t chunk,
                   local::Prealloc prealloc, AlignedBuf& src) {
  auto ring = local::Ring::create(32);
  EXPECT_TRUE(ring.ok());
  local::WriterOptions o;
  o.direct = direct == "on" ? local::DirectIo::kOn : local::DirectIo::kOff;
  o.request_size = request;
  o.prealloc = prealloc;
  const auto t0 = std::chrono::steady_clock::now();
  auto w = local::open_writer(std::shared_ptr<local::Ring>(std::move(*ring)), root + "/bench.bin", kBenchSize, o);
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  const uint64_t slots = src.size / chunk;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t issued = 0, completed = 0;
  for (uint64_t off = 0; off < kBenchSize; off += chunk) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return issued - completed < slots; });
      ++issued;
    }
    (*w)->write_async(off, {src.data() + (off % src.size), chunk}, [&](Status st) {
      EXPECT_TRUE(st.ok()) << st.to_string();
      std::lock_guard lock(mu);
      ++completed;
      cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return issued == completed; });
  }
  EXPECT_TRUE((*w)->finish(kBenchSize).ok());
  return kBenchSize / seconds_since(t0) / 1e9;
}

TEST(LocalStorageBench, DISABLED_WriteModes) {
  const std::string root = bench_dir() + "/ckptio-bench";
  fs::create_directories(root);
  AlignedBuf src(256 * kMiB);
  for (uint64_t i = 0; i < src.size; i += 8) std::memcpy(src.data() + i, &i, 8);
  struct Mode { const char* direct; local::Prealloc prealloc; uint64_t request; const char* name; };
  const Mode modes[] = {{"on", local::Prealloc::kNone, 8 * kMiB, "O_DIRECT, no preallocation"},
                        {"on", local::Prealloc::kFallocate, 8 * kMiB, "O_DIRECT, fallocate(size_hint)"},
                        {"on", local::Prealloc::kTruncate, 1 * kMiB, "O_DIRECT, ftruncate(size_hint)"},
                        {"on", local::Prealloc::kTruncate, 4 * kMiB, "O_DIRECT, ftruncate(size_hint)"},
                        {"on", local::Prealloc::kTruncate, 8 * kMiB, "O_DIRECT, ftruncate(size_hint)"},
                        {"on", local::Prealloc::kTruncate, 16 * kMiB, "O_DIRECT, ftruncate(size_hint)"},
                        {"off", local::Prealloc::kTruncate, 8 * kMiB, "buffered + fsync"}};
  const char* only = std::getenv("CKPTIO_BENCH_ONLY");  // substring of a mode name
  const int runs = std::getenv("CKPTIO_BENCH_RUNS") ? std::atoi(std::getenv("CKPTIO_BENCH_RUNS")) : 2;
  for (int run = 0; run < runs; ++run) {
    for (const Mode& m : modes) {
      if (only && !std::strstr(m.name, only) && std::to_string(m.request / kMiB) + "M" != only) continue;
      fs::remove(root + "/bench.bin");
      ::sync();
      double gbs = bench_write(root, m.direct, m.request, m.request, m.prealloc, src);
      std::printf("write run %d  %-32s request %2llu MiB: %.2f GB/s\n", run, m.name,
                  static_cast<unsigned long long>(m.request / kMiB), gbs);
      std::fflush(stdout);
    }
  }
  fs::remove_all(root);
}

TEST(LocalStorageBench, DISABLED_ReadModes) {
  const std::string root = bench_dir() + "/ckptio-bench";
  fs::create_directories(root);
  {
    AlignedBuf src(256 * kMiB);
    for (uint64_t i = 0; i < src.size; i += 8) std::memcpy(src.data() + i, &i, 8);
    bench_write(root, "on", 8 * kMiB, 8 * kMiB, local::Prealloc::kTruncate, src);
  }
  AlignedBuf dst(kBenchSize);
  std::memset(dst.data(), 0, kBenchSize);  // fault the pages in before timing
  auto ring = local::Ring::create(32);
  ASSERT_TRUE(ring.ok());
  std::vector<ReadRequest> whole = {{"bench.bin", 0, kBenchSize, dst.data()}};
  struct Mode { local::ReadMode mode; unsigned helpers; const char* name; };
  const Mode modes[] = {{local::ReadMode::kDirect, 0, "O_DIRECT ring qd32"},
                        {local::ReadMode::kBuffered, 0, "buffered pread x1"},
                        {local::ReadMode::kBuffered, 1, "buffered pread x2"},
                        {local::ReadMode::kBuffered, 2, "buffered pread x3"}};
  const char* only = std::getenv("CKPTIO_BENCH_ONLY");  // "<N>M": one request size
  const int runs = std::getenv("CKPTIO_BENCH_RUNS") ? std::atoi(std::getenv("CKPTIO_BENCH_RUNS")) : 2;
  for (int run = 0; run < runs; ++run) {
    for (const Mode& m : modes) {
      for (uint64_t req : {1 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB}) {
        if (m.mode == local::ReadMode::kBuffered && req == kMiB) continue;
        if (only && std::to_string(req / kMiB) + "M" != only) continue;
        local::PreadPool pool(m.helpers);
        local::ReadSettings rs;
        rs.mode = m.mode;
        rs.request_size = req;
        ASSERT_TRUE(drop_caches()) << "dropping the page cache needs root";
        const auto t0 = std::chrono::steady_clock::now();
        Status st = local::read_files(root, whole, rs, **ring, pool);
        const double gbs = kBenchSize / seconds_since(t0) / 1e9;
        ASSERT_TRUE(st.ok()) << st.to_string();
        uint64_t probe;
        std::memcpy(&probe, dst.data() + 1234 * kMiB, 8);
        EXPECT_EQ(probe, (1234 * kMiB) % (256 * kMiB));
        std::printf("read  run %d  %-22s request %2llu MiB: %.2f GB/s\n", run, m.name,
                    static_cast<unsigned long long>(req / kMiB), gbs);
        std::fflush(stdout);
      }
    }
  }
  fs::remove_all(root);
}

// A call that throws (std::bad_alloc for a read's error message) on a pool
// thread or the caller's: every other call still runs, the exception comes
// out of parallel_for on the caller once they all have returned (their
// function reads the caller's frame), and the pool goes on working. Before,
// a throw on a pool thread ended the process.
TEST(PreadPool, ACallThatThrowsIsRethrownToTheCallerOnceEveryCallHasReturned) {
  local::PreadPool pool(2);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::atomic<int>> ran(64);
    bool threw = false;
    try {
      pool.parallel_for(ran.size(), [&](size_t i) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        ++ran[i];
        if (i % 7 == 3) throw std::bad_alloc();
      });
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    EXPECT_TRUE(threw);
    for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i].load(), 1) << "call " << i;
  }
  std::atomic<size_t> sum{0};
  pool.parallel_for(100, [&](size_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950u);
}

}  // namespace
}  // namespace ckptio
