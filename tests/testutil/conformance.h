// The backend conformance suite: one parameterized GoogleTest fixture that
// every Storage implementation must pass, plus the helpers it uses to drive a
// backend the way the core does (4096-aligned buffers, offsets that honour
// granularity(), the last range padded to alignment()).
//
// The tests live in tests/storage_conformance_test.cc. A backend is added by
// instantiating the suite with a factory, from any test file:
//
//   INSTANTIATE_TEST_SUITE_P(S3, StorageConformanceTest,
//       ::testing::Values(ConformanceBackend{"S3", [] { return make_s3_storage(...); }}),
//       conformance_name);
//
// A factory returns a fresh, empty store each call. If it returns
// kUnimplemented (a kernel feature or a server is absent) the test is skipped
// with that message; any other error fails the test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "ckptio/storage.h"

namespace ckptio::testutil {

struct ConformanceBackend {
  std::string name;  // a GoogleTest-safe name: letters, digits, '_'
  std::function<Result<std::shared_ptr<Storage>>()> make;
  // Known deviations of the server behind the backend from S3's contract,
  // each documented where the server is set up (tests/s3/README.md):
  //   "nonatomic_put"          a GET may see an object half rewritten
  //   "nested_common_prefixes" a delimiter listing omits "directories"
  //                            that hold only deeper keys
  //   "unconditional_put"      PUT ignores If-None-Match: *, so put_new()
  //                            replaces an object like put()
  // The assertions that need the missing behaviour are not made for such a
  // backend; everything else is.
  std::vector<std::string> gaps = {};
  bool has_gap(const std::string& g) const {
    return std::find(gaps.begin(), gaps.end(), g) != gaps.end();
  }
};

// Prints the backend's name (not its bytes) in test names and messages.
inline void PrintTo(const ConformanceBackend& b, std::ostream* os) { *os << b.name; }

inline std::string conformance_name(const ::testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.name;
}

class StorageConformanceTest : public ::testing::TestWithParam<ConformanceBackend> {
 protected:
  void SetUp() override {
    auto made = GetParam().make();
    if (!made.ok()) {
      if (made.status().code() == Code::kUnimplemented)
        GTEST_SKIP() << GetParam().name << " is unavailable here: " << made.status().to_string();
      FAIL() << "cannot create backend " << GetParam().name << ": " << made.status().to_string();
    }
    storage_ = std::move(made).value();
    ASSERT_NE(storage_, nullptr);
  }
  void TearDown() override { storage_.reset(); }

  Storage& storage() { return *storage_; }
  std::shared_ptr<Storage> storage_;
};

// Returns a Storage that runs `cleanup` after the last reference to `storage`
// is gone (e.g. removes a temporary directory).
inline std::shared_ptr<Storage> with_cleanup(std::shared_ptr<Storage> storage,
                                             std::function<void()> cleanup) {
  struct Holder {
    std::shared_ptr<Storage> storage;
    std::function<void()> cleanup;
    ~Holder() {
      storage.reset();
      if (cleanup) cleanup();
    }
  };
  auto holder = std::make_shared<Holder>();
  holder->storage = std::move(storage);
  holder->cleanup = std::move(cleanup);
  Storage* raw = holder->storage.get();
  return std::shared_ptr<Storage>(holder, raw);
}

// A fresh directory under the system temporary directory; not created.
inline std::filesystem::path fresh_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto dir = std::filesystem::temp_directory_path() /
             ("ckptio-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  return dir;
}

// A 4096-aligned heap buffer, as the core's staging buffers are.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    size_t rounded = std::max<size_t>((size + 4095) / 4096 * 4096, 4096);
    data_ = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    if (!data_) std::abort();
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr; }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }
  std::byte* data() { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_;
  size_t size_;
};

// Counts outstanding write callbacks and keeps the first error.
class PendingWrites {
 public:
  void add() {
    std::lock_guard lock(mu_);
    ++count_;
  }
  IoDone callback() {
    return [this](Status st) {
      std::lock_guard lock(mu_);
      if (!st.ok() && first_.ok()) first_ = st;
      if (--count_ == 0) cv_.notify_all();
    };
  }
  Status wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return count_ == 0; });
    return first_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
  Status first_;
};

enum class WriteOrder { kForward, kReverse, kShuffled };

struct WriteOptions {
  uint64_t chunk = 64 * 1024;  // rounded up to granularity() and alignment()
  WriteOrder order = WriteOrder::kForward;
  uint64_t seed = 1;           // for kShuffled
  bool one_at_a_time = false;  // wait for each write before the next
};

// The chunk size the core would use with `w`: a multiple of granularity()
// and of alignment(), at least `hint`.
inline uint64_t chunk_for(const WritableObject& w, uint64_t hint) {
  const uint64_t gran = std::max<uint64_t>(w.granularity(), 1);
  const uint64_t align = std::max<uint64_t>(w.alignment(), 1);
  const uint64_t unit = std::lcm(gran, align);
  return (std::max(hint, unit) + unit - 1) / unit * unit;
}

// Issues the writes for `content` on `w` (all in flight at once unless
// one_at_a_time) and waits for their callbacks; does not finish.
inline Status write_ranges(WritableObject& w, std::span<const std::byte> content,
                           const WriteOptions& o = {}) {
  const uint64_t align = std::max<uint64_t>(w.alignment(), 1);
  const uint64_t chunk = chunk_for(w, o.chunk);
  std::vector<uint64_t> offsets;
  for (uint64_t off = 0; off < content.size(); off += chunk) offsets.push_back(off);
  if (o.order == WriteOrder::kReverse) std::reverse(offsets.begin(), offsets.end());
  if (o.order == WriteOrder::kShuffled) std::shuffle(offsets.begin(), offsets.end(), std::mt19937_64(o.seed));

  std::vector<AlignedBuffer> buffers;  // alive until every callback ran
  buffers.reserve(offsets.size());
  PendingWrites pending;
  Status first;
  for (uint64_t off : offsets) {
    const uint64_t len = std::min<uint64_t>(chunk, content.size() - off);
    const uint64_t padded = (len + align - 1) / align * align;  // <= chunk: chunk is a multiple of align
    AlignedBuffer& buf = buffers.emplace_back(padded);
    std::memcpy(buf.data(), content.data() + off, len);
    std::memset(buf.data() + len, 0, padded - len);
    pending.add();
    w.write_async(off, std::span<const std::byte>(buf.data(), padded), pending.callback());
    if (o.one_at_a_time) {
      Status st = pending.wait();
      if (!st.ok() && first.ok()) first = st;
    }
  }
  Status st = pending.wait();
  return first.ok() ? st : first;
}

// create + write_ranges + finish, as the core writes a data file.
inline Status write_object(Storage& s, const std::string& key, std::span<const std::byte> content,
                           const WriteOptions& o = {}) {
  auto created = s.create(key, content.size());
  if (!created.ok()) return created.status();
  std::unique_ptr<WritableObject> w = std::move(created).value();
  Status st = write_ranges(*w, content, o);
  if (!st.ok()) {
    w->abort();
    return st;
  }
  return w->finish(content.size());
}

// Deterministic pseudo-random bytes.
inline std::vector<std::byte> pattern_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(rng() >> 56);
  return v;
}

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

inline std::string as_string(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

inline Status put_string(Storage& s, const std::string& key, const std::string& value) {
  return s.put(key, as_bytes(value));
}

inline std::vector<std::string> object_keys(const ListResult& r) {
  std::vector<std::string> keys;
  for (const auto& e : r.objects) keys.push_back(e.key);
  return keys;
}

}  // namespace ckptio::testutil
