// copy_step / copy_all_steps (include/ckptio/copy.h) between every pair of
// backend kinds: POSIX-like memory, object-store memory and local disk; and
// to, from and between real S3 servers (moto, s3rver, Ceph's radosgw).
// Sources are written by CheckpointManager (or by hand, for layouts the
// manager never produces); destinations are checked by a fresh
// CheckpointManager restoring bit for bit, and by listing what is left.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "testutil/owned_leaves.h"
#include "testutil/random_bytes.h"
#include "backends/local/local_storage.h"
#include "backends/fault/fault_storage.h"
#include "backends/memory/memory_storage.h"
#include "backends/s3/s3_storage.h"
#include "ckptio/ckptio.h"
#include "src/copy/copy.h"
#include "src/util/crc32c.h"
#include "testutil/s3_server.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

// ---- States --------------------------------------------------------------------

using testutil::expect_restored;
using testutil::make_leaf;
using testutil::OwnedLeaf;
using testutil::random_bytes;
using testutil::views;

// A state of a few hundred KiB: many chunks at the tests' small chunk size.
std::vector<OwnedLeaf> sample_state(uint64_t seed) {
  std::vector<OwnedLeaf> s;
  s.push_back(make_leaf("model", "params.embed.embedding", DType::kFloat32, {300, 170}, seed + 1));
  s.push_back(make_leaf("model", "params.layers.0.attn.q_proj.kernel", DType::kBFloat16, {64, 129}, seed + 2));
  s.push_back(make_leaf("model", "params.scalar", DType::kFloat64, {}, seed + 3));
  s.push_back(make_leaf("model", "params.empty", DType::kInt32, {0, 5}, seed + 4));
  s.push_back(make_leaf("tx", "opt_state.count", DType::kInt32, {}, seed + 5));
  s.push_back(make_leaf("tx", "opt_state.mu.kernel", DType::kFloat32, {1000, 33}, seed + 6));
  return s;
}

// A 60x50 float32 leaf saved as a 2x2 grid of uneven shards; returns the
// whole array and the view (which points into `parts`).
LeafView grid_leaf(std::vector<float>& full, std::vector<std::vector<float>>& parts) {
  full.resize(60 * 50);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i) * 0.5f;
  auto box = [&](int r0, int r1, int c0, int c1) {
    std::vector<float> v;
    for (int r = r0; r < r1; ++r)
      for (int c = c0; c < c1; ++c) v.push_back(full[r * 50 + c]);
    return v;
  };
  parts = {box(0, 40, 0, 13), box(0, 40, 13, 50), box(40, 60, 0, 13), box(40, 60, 13, 50)};
  LeafView leaf;
  leaf.prefix = "model";
  leaf.path = "grid";
  leaf.dtype = DType::kFloat32;
  leaf.shape = {60, 50};
  leaf.shards = {{{{0, 0}, {40, 13}}, parts[0].data()},
                 {{{0, 13}, {40, 50}}, parts[1].data()},
                 {{{40, 0}, {60, 13}}, parts[2].data()},
                 {{{40, 13}, {60, 50}}, parts[3].data()}};
  return leaf;
}

// ---- Raw objects ------------------------------------------------------------------

// Writes `bytes` as one object through the WritableObject contract (aligned,
// padded buffer).
Status put_object(Storage& s, const std::string& key, const std::string& bytes) {
  auto w = s.create(key, bytes.size());
  if (!w.ok()) return w.status();
  const uint64_t align = std::max<uint64_t>((*w)->alignment(), 1);
  const uint64_t padded = (bytes.size() + align - 1) / align * align;
  Buffer buf = Buffer::allocate(std::max<uint64_t>(padded, 1), 4096);
  std::memcpy(buf.data(), bytes.data(), bytes.size());
  std::memset(buf.data() + bytes.size(), 0, padded - bytes.size());
  if (!bytes.empty()) {
    std::promise<Status> done;
    (*w)->write_async(0, {buf.data(), padded}, [&](Status st) { done.set_value(st); });
    Status st = done.get_future().get();
    if (!st.ok()) {
      (*w)->abort();
      return st;
    }
  }
  return (*w)->finish(bytes.size());
}

Status flip_byte(Storage& s, const std::string& key, uint64_t at) {
  auto data = s.get(key, 1ull << 30);
  if (!data.ok()) return data.status();
  (*data)[at] ^= 0x10;
  CKPTIO_RETURN_IF_ERROR(s.remove(key));
  return put_object(s, key, *data);
}

std::string text_of(Storage& s, const std::string& key) {
  auto t = s.get(key, 1ull << 30);
  return t.ok() ? *t : "<" + t.status().to_string() + ">";
}

// Every object key and every top-level directory (a stage left behind shows
// up as a prefix even when empty).
std::set<std::string> everything(Storage& s) {
  std::set<std::string> out;
  auto top = s.list("", true);
  if (top.ok()) {
    for (const auto& p : top->prefixes) {
      out.insert(p);
      auto objs = s.list(p, false);
      if (objs.ok())
        for (const auto& o : objs->objects) out.insert(o.key);
    }
    for (const auto& o : top->objects) out.insert(o.key);
  }
  return out;
}

// ---- A backend whose writers have a large granularity and check the contract ----

// Forwards to `base`, but its writers report granularity `gran` and alignment
// 4096 (like S3 parts / O_DIRECT) and fail any write that breaks the
// WritableObject contract of storage.h; padding past the object's size is
// trimmed before it reaches `base`.
class StrictWriter final : public WritableObject {
 public:
  StrictWriter(std::unique_ptr<WritableObject> base, uint64_t gran, uint64_t size,
               std::vector<std::string>* violations)
      : base_(std::move(base)), gran_(gran), size_(size), violations_(violations) {}
  uint64_t granularity() const override { return gran_; }
  uint64_t alignment() const override { return 4096; }
  void write_async(uint64_t offset, std::span<const std::byte> data, IoDone done) override {
    std::string bad;
    if (reinterpret_cast<uintptr_t>(data.data()) % 4096 != 0) bad = "unaligned buffer";
    if (offset % gran_ != 0) bad = "offset " + std::to_string(offset) + " not a multiple of " + std::to_string(gran_);
    const bool last = offset + data.size() >= size_;
    if (!last && data.size() % gran_ != 0) bad = "length " + std::to_string(data.size()) + " of a middle range";
    if (last && data.size() % 4096 != 0) bad = "last range not padded to 4096";
    if (last && offset + data.size() >= size_ + 4096) bad = "padding beyond one alignment unit";
    if (!bad.empty()) {
      violations_->push_back(bad);
      done(internal_error("contract: " + bad));
      return;
    }
    base_->write_async(offset, data.first(std::min<uint64_t>(data.size(), size_ - offset)), std::move(done));
  }
  Status finish(uint64_t final_size) override { return base_->finish(final_size); }
  void abort() override { base_->abort(); }

 private:
  std::unique_ptr<WritableObject> base_;
  const uint64_t gran_, size_;
  std::vector<std::string>* violations_;
};

class StrictStorage final : public Storage {
 public:
  StrictStorage(std::shared_ptr<Storage> base, uint64_t gran) : base_(std::move(base)), gran_(gran) {}
  StorageCaps caps() const override { return base_->caps(); }
  std::string describe() const override { return "strict+" + base_->describe(); }
  uint64_t write_granularity() const override { return gran_; }
  Result<std::unique_ptr<WritableObject>> create(const std::string& key, uint64_t size_hint) override {
    auto w = base_->create(key, size_hint);
    if (!w.ok()) return w.status();
    return std::unique_ptr<WritableObject>(
        std::make_unique<StrictWriter>(std::move(w).value(), gran_, size_hint, &violations));
  }
  Status put(const std::string& k, std::span<const std::byte> d) override { return base_->put(k, d); }
  Result<std::string> get(const std::string& k, uint64_t m) override { return base_->get(k, m); }
  Result<uint64_t> stat(const std::string& k) override { return base_->stat(k); }
  Status read(std::span<const ReadRequest> r) override { return base_->read(r); }
  Result<ListResult> list(const std::string& p, bool d) override { return base_->list(p, d); }
  Status remove(const std::string& k) override { return base_->remove(k); }
  Status remove_prefix(const std::string& p) override { return base_->remove_prefix(p); }
  Status rename(const std::string& f, const std::string& t, RenameMode m) override {
    return base_->rename(f, t, m);
  }
  Status sync(const std::string& p) override { return base_->sync(p); }

  std::vector<std::string> violations;  // written on the copying thread only (memory base)

 private:
  std::shared_ptr<Storage> base_;
  const uint64_t gran_;
};

// ---- Fixture -----------------------------------------------------------------------

// Local disk in a new directory under the temporary directory, which `dirs`
// records for removal.
std::shared_ptr<Storage> temp_local_storage(const std::string& tag, std::vector<fs::path>& dirs) {
  static int counter = 0;
  fs::path dir = fs::temp_directory_path() / (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(dir);
  dirs.push_back(dir);
  auto s = make_local_storage(dir.string());
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : nullptr;
}

enum class Kind { kMemPosix, kMemObject, kLocal };

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::kMemPosix: return "MemPosix";
    case Kind::kMemObject: return "MemObject";
    case Kind::kLocal: return "Local";
  }
  return "?";
}

class CopyTest : public ::testing::TestWithParam<std::tuple<Kind, Kind>> {
 protected:
  void SetUp() override {
    src_ = open(std::get<0>(GetParam()));
    dst_base_ = open(std::get<1>(GetParam()));
    dst_ = make_fault_storage(dst_base_);
  }
  void TearDown() override {
    for (const auto& d : dirs_) fs::remove_all(d);
  }
  std::shared_ptr<Storage> open(Kind k) {
    switch (k) {
      case Kind::kMemPosix: return make_memory_storage(true);
      case Kind::kMemObject: return make_memory_storage(false);
      case Kind::kLocal: return temp_local_storage("ckptio-copy", dirs_);
    }
    return nullptr;
  }
  static std::unique_ptr<CheckpointManager> manager(std::shared_ptr<Storage> s, ManagerOptions o = {}) {
    if (o.chunk_size == 0) o.chunk_size = 64 * 1024;
    return std::make_unique<CheckpointManager>(std::move(s), std::move(o));
  }
  static void save(std::shared_ptr<Storage> s, int64_t step, const std::vector<OwnedLeaf>& state,
                   SaveOptions so = {}) {
    auto m = manager(std::move(s));
    auto h = m->save(step, views(state), so);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  }
  void save_src(int64_t step, const std::vector<OwnedLeaf>& state, SaveOptions so = {}) {
    save(src_, step, state, so);
  }
  void save_dst(int64_t step, const std::vector<OwnedLeaf>& state, SaveOptions so = {}) {
    save(dst_base_, step, state, so);
  }
  // Small requests and a tight memory bound: many chunks, several batches,
  // buffers recycled through the writes.
  static CopyOptions small() {
    CopyOptions o;
    o.chunk_size = 8192;
    o.max_memory = 6 * 8192;
    return o;
  }
  Index src_index(int64_t step) { return manager(src_)->read_index(step).value(); }

  std::shared_ptr<Storage> src_, dst_base_;
  std::shared_ptr<FaultStorage> dst_;
  std::vector<fs::path> dirs_;
};

TEST_P(CopyTest, MultiShardStepRestoresBitExactAtTheDestination) {
  std::vector<float> full;
  std::vector<std::vector<float>> parts;
  auto state = sample_state(1);
  std::vector<LeafView> v = views(state);
  v.push_back(grid_leaf(full, parts));
  {
    auto m = manager(src_);
    ASSERT_TRUE(m->save(3, views(sample_state(9))).value().wait().ok());
    SaveOptions so;
    so.metadata_json = R"({"data_pos": 1234, "note": "é"})";
    ASSERT_TRUE(m->save(7, v, so).value().wait().ok());
  }

  std::vector<std::pair<uint64_t, uint64_t>> progress;
  CopyOptions o = small();
  o.on_progress = [&](int64_t step, uint64_t done, uint64_t total) {
    EXPECT_EQ(step, 7);
    progress.emplace_back(done, total);
  };
  auto stats = copy_step(*src_, *dst_, std::nullopt, o);  // the latest
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  const Index src = src_index(7);
  EXPECT_EQ(stats->step, 7);
  EXPECT_FALSE(stats->skipped);
  EXPECT_EQ(stats->files, 1u);
  EXPECT_EQ(stats->bytes, src.files[0].size);
  EXPECT_EQ(stats->shards, 10u);  // 6 leaves + 4 grid shards
  EXPECT_GT(stats->bytes, 40 * 8192u) << "the state should span many chunks";
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front().first, 0u);
  EXPECT_EQ(progress.back().first, progress.back().second);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));

  auto m = manager(dst_);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{7});
  const Index copied = m->read_index(7).value();
  EXPECT_TRUE(same_step(src, copied));
  EXPECT_NE(copied.files[0].name, src.files[0].name) << "data files get the copy's attempt name";
  EXPECT_EQ(copied.files[0].name.rfind("data-", 0), 0u);
  EXPECT_EQ(copied.created_unix_ns, src.created_unix_ns);
  EXPECT_EQ(copied.committed_unix_ns, src.committed_unix_ns);
  EXPECT_EQ(copied.metadata_json, src.metadata_json);
  EXPECT_TRUE(m->verify(7).ok());

  auto r = m->restore(7);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Restore lists leaves by prefix, in written order: the grid is model's last.
  OwnedLeaf grid{"model", "grid", DType::kFloat32, {60, 50}, std::vector<std::byte>(full.size() * 4)};
  std::memcpy(grid.bytes.data(), full.data(), grid.bytes.size());
  state.insert(state.begin() + 4, std::move(grid));
  expect_restored(*r, state);

  // Nothing but the step: no stage, no stray objects.
  for (const std::string& k : everything(*dst_))
    EXPECT_EQ(k.rfind("run-7/", 0), 0u) << "left behind: " << k;
}

TEST_P(CopyTest, CorruptSourceShardCommitsNothing) {
  auto old = sample_state(2);
  save_dst(1, old);
  save_src(2, sample_state(3));
  const std::set<std::string> before = everything(*dst_);
  const Index src = src_index(2);
  const ShardRecord& victim = src.prefixes[1].leaves[1].shards[0];  // tx/opt_state.mu.kernel
  ASSERT_TRUE(flip_byte(*src_, "run-2/" + victim.file, victim.offset + victim.length - 3).ok());

  auto stats = copy_step(*src_, *dst_, 2, small());
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kDataLoss) << stats.status().to_string();
  const std::string& msg = stats.status().message();
  EXPECT_NE(msg.find("checksum mismatch in tx/opt_state.mu.kernel shard 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find(victim.file), std::string::npos) << msg;
  EXPECT_NE(msg.find("step 2"), std::string::npos) << msg;

  auto m = manager(dst_);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
  EXPECT_EQ(everything(*dst_), before) << "the failed attempt left objects behind";
  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, old);
}

TEST_P(CopyTest, WriteFaultAtTheDestinationDiscardsTheAttempt) {
  auto old = sample_state(4);
  save_dst(1, old);
  save_src(5, sample_state(5));
  const std::set<std::string> before = everything(*dst_);
  for (FaultOp op : {FaultOp::kCreate, FaultOp::kWrite, FaultOp::kFinish, FaultOp::kPut, FaultOp::kRename}) {
    if (op == FaultOp::kRename && !dst_->caps().atomic_rename) continue;
    SCOPED_TRACE(static_cast<int>(op));
    dst_->clear_rules();
    // kWrite: let a few chunks through first, so some writes were queued.
    dst_->add_rule(FaultRule{.op = op, .key_substr = "run-5", .code = Code::kIOError,
                             .message = "injected", .skip = op == FaultOp::kWrite ? 5u : 0u});
    auto stats = copy_step(*src_, *dst_, 5, small());
    ASSERT_FALSE(stats.ok());
    EXPECT_NE(stats.status().message().find("injected"), std::string::npos) << stats.status().to_string();
    dst_->clear_rules();
    auto m = manager(dst_);
    EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
    EXPECT_EQ(everything(*dst_), before);
    auto r = m->restore(std::nullopt);
    ASSERT_TRUE(r.ok());
    expect_restored(*r, old);
  }
  // And then it works.
  ASSERT_TRUE(copy_step(*src_, *dst_, 5, small()).ok());
  EXPECT_EQ(manager(dst_)->all_steps().value(), (std::vector<int64_t>{1, 5}));
}

// A progress callback that throws (a Python callback raising through a
// binding) stops the copy as a failure would: no exception leaves copy_step
// (it would unwind the stack the reads and writes in flight point into),
// nothing is committed, the attempt is discarded.
TEST_P(CopyTest, AProgressCallbackThatThrowsFailsTheCopyAndLeavesNothing) {
  auto old = sample_state(4);
  save_dst(1, old);
  save_src(5, sample_state(5));
  const std::set<std::string> before = everything(*dst_);
  for (int throw_at : {0, 1, 3}) {  // at the first call (before any byte), and mid-stream
    SCOPED_TRACE(throw_at);
    int calls = 0;
    CopyOptions o = small();
    o.on_progress = [&](int64_t, uint64_t, uint64_t) {
      if (calls++ == throw_at) {
        if (throw_at == 3) throw 42;  // not a std::exception
        throw std::runtime_error("stop the copy");
      }
    };
    auto stats = copy_step(*src_, *dst_, 5, o);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), Code::kCancelled) << stats.status().to_string();
    EXPECT_NE(stats.status().message().find("on_progress callback threw"), std::string::npos)
        << stats.status().to_string();
    if (throw_at != 3)
      EXPECT_NE(stats.status().message().find("stop the copy"), std::string::npos) << stats.status().to_string();
    EXPECT_GT(calls, throw_at);
    auto m = manager(dst_);
    EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
    EXPECT_EQ(everything(*dst_), before) << "the stopped attempt left objects behind";
  }
  // on_step runs once the step is at DST: it stays, and the error says so.
  CopyOptions o = small();
  o.on_step = [](const CopyStats&) { throw std::runtime_error("after the step"); };
  auto stats = copy_step(*src_, *dst_, 5, o);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kCancelled);
  EXPECT_NE(stats.status().message().find("step 5 was copied, then"), std::string::npos) << stats.status().to_string();
  EXPECT_NE(stats.status().message().find("after the step"), std::string::npos) << stats.status().to_string();
  EXPECT_EQ(manager(dst_)->all_steps().value(), (std::vector<int64_t>{1, 5}));
  EXPECT_TRUE(manager(dst_)->verify(5).ok());
}

TEST_P(CopyTest, CommittedStepNeedsOverwrite) {
  auto first = sample_state(6), second = sample_state(7);
  save_src(1, first);
  ASSERT_TRUE(copy_step(*src_, *dst_, 1, small()).ok());

  // Again: refused, or skipped as identical when asked.
  auto again = copy_step(*src_, *dst_, 1, small());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_NE(again.status().message().find("the same step"), std::string::npos) << again.status().to_string();
  CopyOptions skip = small();
  skip.skip_identical = true;
  auto skipped = copy_step(*src_, *dst_, 1, skip);
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(skipped->skipped);

  // A different step 1 at the source: refused even with skip_identical.
  SaveOptions replace;
  replace.overwrite = true;
  save_src(1, second, replace);
  auto differ = copy_step(*src_, *dst_, 1, skip);
  EXPECT_EQ(differ.status().code(), Code::kAlreadyExists);
  EXPECT_NE(differ.status().message().find("different contents"), std::string::npos);
  auto r = manager(dst_)->restore(1);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, first);

  CopyOptions over = small();
  over.overwrite = true;
  auto replaced = copy_step(*src_, *dst_, 1, over);
  ASSERT_TRUE(replaced.ok()) << replaced.status().to_string();
  EXPECT_FALSE(replaced->skipped);
  auto m = manager(dst_);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{1});
  r = m->restore(1);
  ASSERT_TRUE(r.ok());
  expect_restored(*r, second);
  EXPECT_TRUE(same_step(src_index(1), m->read_index(1).value()));
  // Object stores keep the replaced data objects until gc; POSIX swaps dirs.
  ASSERT_TRUE(m->gc().ok());
  for (const std::string& k : everything(*dst_)) {
    if (k.back() == '/') continue;
    EXPECT_TRUE(k == "run-1/ckptio_index.json" || k == "run-1/" + m->read_index(1).value().files[0].name)
        << "left behind: " << k;
  }
}

TEST_P(CopyTest, AllStepsOldestFirstSkippingIdenticalAndRefusingConflicts) {
  auto s1 = sample_state(11), s2 = sample_state(12), s3 = sample_state(13), other = sample_state(99);
  save_src(1, s1);
  save_src(2, s2);
  save_src(3, s3);
  ASSERT_TRUE(copy_step(*src_, *dst_, 1, small()).ok());
  save_dst(2, other);  // a conflict
  save_dst(8, other);  // only at the destination: left alone

  auto refused = copy_all_steps(*src_, *dst_, small());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kAlreadyExists);
  EXPECT_NE(refused.status().message().find("step 2 is already committed"), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(manager(dst_)->all_steps().value(), (std::vector<int64_t>{1, 2, 8})) << "copied before refusing";

  std::vector<int64_t> order;
  CopyOptions o = small();
  o.overwrite = true;
  o.on_step = [&](const CopyStats& s) { order.push_back(s.step); };
  auto all = copy_all_steps(*src_, *dst_, o);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(all->size(), 3u);
  EXPECT_TRUE((*all)[0].skipped);
  EXPECT_FALSE((*all)[1].skipped);
  EXPECT_FALSE((*all)[2].skipped);
  auto m = manager(dst_);
  EXPECT_EQ(m->all_steps().value(), (std::vector<int64_t>{1, 2, 3, 8}));
  expect_restored(m->restore(1).value(), s1);
  expect_restored(m->restore(2).value(), s2);
  expect_restored(m->restore(3).value(), s3);
  expect_restored(m->restore(8).value(), other);

  // Everything is there now: all skipped.
  auto none = copy_all_steps(*src_, *dst_, small());
  ASSERT_TRUE(none.ok());
  for (const CopyStats& s : *none) EXPECT_TRUE(s.skipped) << s.step;
}

TEST_P(CopyTest, AllStepsStopsAtAFailureKeepingWhatWasCopied) {
  save_src(1, sample_state(21));
  save_src(2, sample_state(22));
  save_src(3, sample_state(23));
  dst_->add_rule(FaultRule{.op = FaultOp::kWrite, .key_substr = "run-2", .code = Code::kIOError});
  auto all = copy_all_steps(*src_, *dst_, small());
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("copy step 2"), std::string::npos) << all.status().to_string();
  EXPECT_NE(all.status().message().find("step 1 copied before it"), std::string::npos) << all.status().to_string();
  dst_->clear_rules();
  EXPECT_EQ(manager(dst_)->all_steps().value(), std::vector<int64_t>{1});
}

TEST_P(CopyTest, MissingAndDamagedSourceSteps) {
  auto none = copy_step(*src_, *dst_, std::nullopt, small());
  EXPECT_EQ(none.status().code(), Code::kNotFound) << none.status().to_string();
  EXPECT_EQ(copy_all_steps(*src_, *dst_, small()).status().code(), Code::kNotFound);

  save_src(1, sample_state(31));
  save_src(2, sample_state(32));
  auto missing = copy_step(*src_, *dst_, 5, small());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("step 5 is not committed"), std::string::npos);

  // A damaged latest index is named, never silently passed over.
  const std::string junk = "{\"format\": \"ckptio\", \"version\": 1, broken";
  ASSERT_TRUE(src_->put("run-2/ckptio_index.json", {reinterpret_cast<const std::byte*>(junk.data()), junk.size()}).ok());
  auto damaged = copy_step(*src_, *dst_, std::nullopt, small());
  EXPECT_EQ(damaged.status().code(), Code::kDataLoss);
  EXPECT_NE(damaged.status().message().find("run-2/ckptio_index.json"), std::string::npos)
      << damaged.status().to_string();
  auto all = copy_all_steps(*src_, *dst_, small());
  EXPECT_EQ(all.status().code(), Code::kDataLoss);
  EXPECT_NE(all.status().message().find("copy nothing"), std::string::npos) << all.status().to_string();
  EXPECT_TRUE(manager(dst_)->all_steps().value().empty());

  // A data file the index lists but the source lacks is damage, not "not found".
  const Index one = src_index(1);
  ASSERT_TRUE(src_->remove("run-1/" + one.files[0].name).ok());
  auto gone = copy_step(*src_, *dst_, 1, small());
  EXPECT_EQ(gone.status().code(), Code::kDataLoss) << gone.status().to_string();
  EXPECT_TRUE(manager(dst_)->all_steps().value().empty());
  EXPECT_TRUE(everything(*dst_).empty());
}

TEST_P(CopyTest, EmptyStepAndStepFormats) {
  std::vector<OwnedLeaf> empty = {make_leaf("model", "nothing", DType::kFloat32, {0, 3}, 1)};
  {
    ManagerOptions mo;
    mo.step_format = "{step}";
    auto m = manager(src_, mo);
    ASSERT_TRUE(m->save(4, views(empty)).value().wait().ok());
  }
  CopyOptions o = small();
  o.src_step_format = "{step}";
  o.dst_step_format = "ckpt_{step}";
  auto stats = copy_step(*src_, *dst_, std::nullopt, o);
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(stats->bytes, 0u);
  ManagerOptions mo;
  mo.step_format = "ckpt_{step}";
  auto m = manager(dst_, mo);
  EXPECT_EQ(m->all_steps().value(), std::vector<int64_t>{4});
  expect_restored(m->restore(4).value(), empty);

  o.dst_step_format = "no-step-here";
  EXPECT_EQ(copy_step(*src_, *dst_, 4, o).status().code(), Code::kInvalidArgument);
}

TEST_P(CopyTest, MemoryBoundMustHoldTwoChunks) {
  save_src(1, sample_state(41));
  CopyOptions o;
  o.chunk_size = 64 * 1024;
  o.max_memory = 64 * 1024;
  auto refused = copy_step(*src_, *dst_, 1, o);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().to_string();
  EXPECT_TRUE(everything(*dst_).empty());
  // A chunk size that rounding up to the write unit would wrap to 0 (it
  // divided by zero: SIGFPE).
  o.chunk_size = UINT64_MAX;
  refused = copy_step(*src_, *dst_, 1, o);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().to_string();
  o.chunk_size = 64 * 1024;
  o.max_memory = 2 * 64 * 1024;  // two buffers: one reading, one writing
  auto ok = copy_step(*src_, *dst_, 1, o);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  expect_restored(manager(dst_)->restore(1).value(), sample_state(41));
}

// A layout CheckpointManager never writes but format.md allows: several data
// files, shards in any order inside a file, a gap no shard covers, an empty
// file, and fields this version does not know (which must survive the copy).
TEST_P(CopyTest, HandWrittenLayoutWithUnknownFieldsSurvives) {
  const std::string a = "data-00000000000000aa-0.bin", b = "data-00000000000000aa-1.bin",
                    e = "data-00000000000000aa-2.bin";
  std::vector<std::byte> w1 = random_bytes(40000, 1), w2 = random_bytes(24 * 4, 2);
  // File a: [gap 100][w2 tail half][w1][gap 7]; file b: [w2 head half].
  std::string fa(100, 'g'), fb;
  const uint64_t w2_half = w2.size() / 2;
  fa.append(reinterpret_cast<const char*>(w2.data()) + w2_half, w2_half);
  const uint64_t w1_at = fa.size();
  fa.append(reinterpret_cast<const char*>(w1.data()), w1.size());
  fa.append(7, 'h');
  fb.append(reinterpret_cast<const char*>(w2.data()), w2_half);
  ASSERT_TRUE(put_object(*src_, "run-4/" + a, fa).ok());
  ASSERT_TRUE(put_object(*src_, "run-4/" + b, fb).ok());
  ASSERT_TRUE(put_object(*src_, "run-4/" + e, "").ok());

  Index idx;
  idx.step = 4;
  idx.created_unix_ns = 1'700'000'000'000'000'000;
  idx.committed_unix_ns = 1'700'000'001'000'000'000;
  idx.metadata_json = R"({"k":[1,2.5,"x"]})";
  idx.files = {{a, fa.size()}, {b, fb.size()}, {e, 0}};
  auto crc = [](const std::byte* p, size_t n) { return crc32c(p, n); };
  LeafRecord l1{"w1", DType::kUInt8, {40000}, {{Box{{0}, {40000}}, a, w1_at, 40000, crc(w1.data(), w1.size())}}};
  LeafRecord l2{"w2", DType::kFloat32, {2, 12}, {
      {Box{{1, 0}, {2, 12}}, a, 100, w2_half, crc(w2.data() + w2_half, w2_half)},
      {Box{{0, 0}, {1, 12}}, b, 0, w2_half, crc(w2.data(), w2_half)},
      {Box{{0, 5}, {2, 5}}, e, 0, 0, 0}}};
  idx.prefixes = {{"p", {l1, l2}}};
  std::string text = serialize_index(idx);
  ASSERT_TRUE(parse_index(text).ok()) << parse_index(text).status().to_string();
  text.replace(text.find("{\n"), 2, "{\n  \"x_future\": {\"list\": [1, 2, {\"deep\": null}]},\n");
  const size_t crc_at = text.find("\"crc32c\"");
  text.insert(crc_at, "\"x_hint\": \"zstd\", ");
  ASSERT_TRUE(parse_index(text).ok()) << parse_index(text).status().to_string();
  ASSERT_TRUE(src_->put("run-4/ckptio_index.json", {reinterpret_cast<const std::byte*>(text.data()), text.size()}).ok());

  auto stats = copy_step(*src_, *dst_, 4, small());
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(stats->files, 3u);
  EXPECT_EQ(stats->shards, 4u);
  EXPECT_EQ(stats->bytes, fa.size() + fb.size());
  const std::string copied = text_of(*dst_, "run-4/ckptio_index.json");
  EXPECT_NE(copied.find(R"("x_future":{"list":[1,2,{"deep":null}]})"), std::string::npos) << copied;
  EXPECT_NE(copied.find(R"("x_hint":"zstd")"), std::string::npos) << copied;
  auto back = parse_index(copied);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(same_step(idx, *back));
  EXPECT_EQ(back->metadata_json, idx.metadata_json);
  auto m = manager(dst_);
  EXPECT_TRUE(m->verify(4).ok());
  auto r = m->restore(4);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 2u);
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), w1.data(), w1.size()), 0);
  EXPECT_EQ(std::memcmp(r->leaves[1].data.data(), w2.data(), w2.size()), 0);
  // The gap bytes came along verbatim.
  const std::string new_a = text_of(*dst_, "run-4/" + back->files[0].name);
  EXPECT_EQ(new_a, fa);

  // The tail shard of w2 lies before w1 in file a; damage it: named.
  ASSERT_TRUE(flip_byte(*src_, "run-4/" + a, 100 + 3).ok());
  CopyOptions over = small();
  over.overwrite = true;
  auto bad = copy_step(*src_, *dst_, 4, over);
  EXPECT_EQ(bad.status().code(), Code::kDataLoss);
  EXPECT_NE(bad.status().message().find("p/w2 shard 0 (file " + a + ")"), std::string::npos)
      << bad.status().to_string();
}

// A step of many small data files (one per process of a large job): every
// read takes a whole chunk buffer however short it is, so a batch cut by
// bytes alone asked for more buffers than the pool held and waited forever.
TEST_P(CopyTest, ManySmallDataFilesDoNotHang) {
  constexpr int kFiles = 40;
  Index idx;
  idx.step = 5;
  idx.created_unix_ns = 1;
  idx.committed_unix_ns = 2;
  PrefixRecord model{"model", {}};
  for (int i = 0; i < kFiles; ++i) {
    const std::string name = "data-00000000000000ab-" + std::to_string(i) + ".bin";
    std::vector<std::byte> v = random_bytes(4 + i, 100 + i);
    ASSERT_TRUE(put_object(*src_, "run-5/" + name, std::string(reinterpret_cast<const char*>(v.data()), v.size())).ok());
    idx.files.push_back({name, v.size()});
    const int64_t n = static_cast<int64_t>(v.size());
    model.leaves.push_back(LeafRecord{"w" + std::to_string(i), DType::kUInt8, {n},
                                      {{Box{{0}, {n}}, name, 0, v.size(), crc32c(v.data(), v.size())}}});
  }
  idx.prefixes = {model};
  const std::string text = serialize_index(idx);
  ASSERT_TRUE(src_->put("run-5/ckptio_index.json", {reinterpret_cast<const std::byte*>(text.data()), text.size()}).ok());

  // Six buffers (one read each per batch) and the defaults (32 buffers).
  for (const CopyOptions& o : {small(), CopyOptions{}}) {
    auto done = std::make_shared<std::promise<Result<CopyStats>>>();
    auto result = done->get_future();
    CopyOptions over = o;
    over.overwrite = true;
    std::thread([done, over, src = src_, dst = dst_] { done->set_value(copy_step(*src, *dst, 5, over)); }).detach();
    if (result.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "copy_step of " << kFiles << " small files hangs";
      std::abort();  // the copy's thread cannot be joined
    }
    auto stats = result.get();
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    EXPECT_EQ(stats->files, static_cast<uint64_t>(kFiles));
    EXPECT_EQ(stats->shards, static_cast<uint64_t>(kFiles));
  }
  auto m = manager(dst_);
  EXPECT_TRUE(m->verify(5).ok());
  auto r = m->restore(5);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), static_cast<size_t>(kFiles));
  for (int i = 0; i < kFiles; ++i) {
    std::vector<std::byte> v = random_bytes(4 + i, 100 + i);
    EXPECT_EQ(std::memcmp(r->leaves[i].data.data(), v.data(), v.size()), 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    CopyBetween, CopyTest,
    ::testing::Values(std::make_tuple(Kind::kMemPosix, Kind::kMemObject),
                      std::make_tuple(Kind::kMemObject, Kind::kMemPosix),
                      std::make_tuple(Kind::kMemPosix, Kind::kMemPosix),
                      std::make_tuple(Kind::kMemObject, Kind::kMemObject),
                      std::make_tuple(Kind::kLocal, Kind::kMemObject),
                      std::make_tuple(Kind::kMemObject, Kind::kLocal),
                      std::make_tuple(Kind::kLocal, Kind::kLocal)),
    [](const auto& info) {
      return kind_name(std::get<0>(info.param)) + "To" + kind_name(std::get<1>(info.param));
    });

// ---- Not parameterized -----------------------------------------------------------------

// The WritableObject contract against a destination that writes in large
// units (S3 parts): every offset a multiple of the unit, middle ranges whole
// units, 4096-aligned buffers, the last range padded to the alignment.
TEST(CopyContract, LargeWriteGranularityIsRespected) {
  auto src = make_memory_storage(false);
  auto dst = std::make_shared<StrictStorage>(make_memory_storage(false), 3 * 4096);
  auto state = sample_state(51);
  {
    ManagerOptions mo;
    mo.chunk_size = 64 * 1024;
    CheckpointManager m(src, mo);
    ASSERT_TRUE(m.save(1, views(state)).value().wait().ok());
  }
  CopyOptions o;
  o.chunk_size = 8192;  // rounded up to 12288, the unit
  o.max_memory = 4 * 12288;
  EXPECT_EQ(copy_chunk_size(*dst, 8192), 12288u);
  EXPECT_EQ(copy_chunk_size(*dst, 0), ((8ull << 20) + 12287) / 12288 * 12288);
  auto stats = copy_step(*src, *dst, 1, o);
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_TRUE(dst->violations.empty()) << dst->violations.front();
  CheckpointManager m(dst, ManagerOptions{});
  expect_restored(m.restore(1).value(), state);
}

// An index may declare any file size; a copy must neither allocate nor loop
// in proportion to it, and the short object is damage.
TEST(CopyHostile, DeclaredSizeBeyondTheObjectIsDataLoss) {
  auto src = make_memory_storage(false), dst = make_memory_storage(true);
  const std::string file = "data-00000000000000bb-0.bin";
  ASSERT_TRUE(put_object(*src, "run-1/" + file, std::string(5000, 'x')).ok());
  Index idx;
  idx.step = 1;
  idx.files = {{file, 1ull << 62}};
  idx.prefixes = {{"m", {LeafRecord{"x", DType::kUInt8, {5000}, {{Box{{0}, {5000}}, file, 0, 5000,
                                                                   crc32c(std::string(5000, 'x').data(), 5000)}}}}}};
  const std::string text = serialize_index(idx);
  ASSERT_TRUE(src->put("run-1/ckptio_index.json", {reinterpret_cast<const std::byte*>(text.data()), text.size()}).ok());
  auto st = copy_step(*src, *dst, 1, {});
  EXPECT_EQ(st.status().code(), Code::kDataLoss) << st.status().to_string();
  EXPECT_TRUE(everything(*dst).empty());
}

TEST(CopyIndex, RewriteKeepsEverythingButTheNames) {
  Index idx;
  idx.step = 2;
  idx.files = {{"data-1111111111111111-0.bin", 8}};
  idx.prefixes = {{"m", {LeafRecord{"x", DType::kInt64, {}, {{Box{{}, {}}, "data-1111111111111111-0.bin", 0, 8, 77}}}}}};
  const std::string text = serialize_index(idx);
  std::map<std::string, std::string> renames = {{"data-1111111111111111-0.bin", "data-2222222222222222-0.bin"}};
  auto out = rewrite_index_text(text, idx, renames);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->find("1111111111111111"), std::string::npos);
  auto back = parse_index(*out);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, rename_data_files(idx, renames));
  EXPECT_TRUE(same_step(idx, *back));
  // A name without a new name is a bug, reported as such.
  EXPECT_EQ(rewrite_index_text(text, idx, {}).status().code(), Code::kInternal);
  // same_step notices any difference but the names.
  Index other = *back;
  other.prefixes[0].leaves[0].shards[0].crc32c = 78;
  EXPECT_FALSE(same_step(idx, other));
  other = *back;
  other.created_unix_ns = 1;
  EXPECT_FALSE(same_step(idx, other));
}

// ---- S3 -------------------------------------------------------------------------------
// Copies to, from and between real S3 servers (tests/testutil/s3_server.h):
// 5 MiB parts and a state of ~3 parts plus a tail, so that multipart
// uploads, single-part PutObjects and the last range are all hit.

std::vector<OwnedLeaf> s3_state(uint64_t seed) {
  std::vector<OwnedLeaf> s = sample_state(seed);
  // 16 MB, among the model's leaves (restore lists a prefix's leaves together).
  s.insert(s.begin() + 4, make_leaf("model", "params.big", DType::kFloat32, {4000, 1000}, seed + 9));
  return s;
}

class S3CopyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    CKPTIO_REQUIRE_S3_SERVER(srv);
    srv_ = srv;
    prefix_ = testutil::s3_test_prefix();
  }
  void TearDown() override {
    for (const auto& d : dirs_) fs::remove_all(d);
  }
  std::shared_ptr<Storage> s3_at(const std::string& name) {
    auto s = s3::make_s3_storage("s3://" + srv_.bucket + "/" + prefix_ + name, testutil::s3_test_config(srv_));
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::shared_ptr<Storage>(*s) : nullptr;
  }
  std::shared_ptr<Storage> local() { return temp_local_storage("ckptio-s3copy", dirs_); }
  static void save(std::shared_ptr<Storage> s, int64_t step, const std::vector<OwnedLeaf>& state) {
    CheckpointManager m(std::move(s), {});
    auto h = m.save(step, views(state));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  }
  static void expect_step(std::shared_ptr<Storage> s, int64_t step, const std::vector<OwnedLeaf>& state) {
    CheckpointManager m(std::move(s), {});
    EXPECT_TRUE(m.verify(step).ok());
    auto r = m.restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_restored(*r, state);
  }
  // Nothing at all under an S3 storage: no object, no unfinished upload
  // (where the server can list them).
  static void expect_empty(Storage& s) {
    auto listed = s.list("", false);
    ASSERT_TRUE(listed.ok()) << listed.status().to_string();
    EXPECT_TRUE(listed->objects.empty()) << listed->objects.size() << " objects, first " << listed->objects[0].key;
    auto uploads = s.list_unfinished("");
    if (uploads.status().code() != Code::kUnimplemented) {  // s3rver cannot list them
      ASSERT_TRUE(uploads.ok()) << uploads.status().to_string();
      EXPECT_TRUE(uploads->empty()) << uploads->size() << " unfinished uploads";
    }
  }

  testutil::S3TestServer srv_;
  std::string prefix_;
  std::vector<fs::path> dirs_;
};

TEST_P(S3CopyTest, LocalToS3ToAnotherLocalDirectoryRestoresBitExact) {
  const auto state = s3_state(1);
  auto src = local();
  ASSERT_NO_FATAL_FAILURE(save(src, 3, state));
  auto bucket = s3_at("a");
  auto up = copy_step(*src, *bucket, 3);
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  EXPECT_GT(up->bytes, 16'000'000u);
  EXPECT_EQ(up->shards, state.size());  // one shard a leaf, the empty leaf's too
  ASSERT_NO_FATAL_FAILURE(expect_step(bucket, 3, state));

  auto back = local();
  auto down = copy_step(*bucket, *back, std::nullopt);
  ASSERT_TRUE(down.ok()) << down.status().to_string();
  EXPECT_EQ(down->step, 3);
  EXPECT_EQ(down->bytes, up->bytes);
  ASSERT_NO_FATAL_FAILURE(expect_step(back, 3, state));
}

TEST_P(S3CopyTest, BetweenTwoPrefixesTheSecondCopyAllSkipsEverything) {
  auto a = s3_at("a");
  const auto s1 = s3_state(2), s2 = sample_state(3);
  ASSERT_NO_FATAL_FAILURE(save(a, 1, s1));
  ASSERT_NO_FATAL_FAILURE(save(a, 2, s2));
  auto b = s3_at("b");
  CopyOptions o;
  o.skip_identical = true;
  auto first = copy_all_steps(*a, *b, o);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_EQ(first->size(), 2u);
  for (const CopyStats& st : *first) EXPECT_FALSE(st.skipped) << "step " << st.step;
  auto second = copy_all_steps(*a, *b, o);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_EQ(second->size(), 2u);
  for (const CopyStats& st : *second) EXPECT_TRUE(st.skipped) << "step " << st.step;
  ASSERT_NO_FATAL_FAILURE(expect_step(b, 1, s1));
  ASSERT_NO_FATAL_FAILURE(expect_step(b, 2, s2));
}

// The shard of model/params.big in `step` of `s`.
ShardRecord big_shard(std::shared_ptr<Storage> s, int64_t step) {
  Index idx = CheckpointManager(std::move(s), {}).read_index(step).value();
  for (const LeafRecord& l : idx.prefixes.at(0).leaves)
    if (l.path == "params.big") return l.shards.at(0);
  ADD_FAILURE() << "no params.big in step " << step;
  return {};
}

TEST_P(S3CopyTest, DamageAtEitherEndsSourceCommitsNothing) {
  const auto state = s3_state(4);
  auto bucket = s3_at("a");
  ASSERT_NO_FATAL_FAILURE(save(bucket, 5, state));
  ShardRecord big = big_shard(bucket, 5);
  ASSERT_TRUE(flip_byte(*bucket, "run-5/" + big.file, big.offset + big.length / 2).ok());

  // S3 -> local: refused, nothing at the destination.
  auto dst = local();
  auto r = copy_step(*bucket, *dst, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("model/params.big shard 0"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(everything(*dst).empty());

  // local -> S3, damaged in the local copy: no object and no upload left in the bucket.
  auto src = local();
  ASSERT_NO_FATAL_FAILURE(save(src, 6, state));
  big = big_shard(src, 6);
  ASSERT_TRUE(flip_byte(*src, "run-6/" + big.file, big.offset + big.length - 1).ok());
  auto into = s3_at("b");
  r = copy_step(*src, *into, 6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  ASSERT_NO_FATAL_FAILURE(expect_empty(*into));
  EXPECT_TRUE(CheckpointManager(into, {}).all_steps().value().empty());
}

INSTANTIATE_TEST_SUITE_P(S3Moto, S3CopyTest, ::testing::Values("Moto"));
INSTANTIATE_TEST_SUITE_P(S3S3rver, S3CopyTest, ::testing::Values("S3rver"));
INSTANTIATE_TEST_SUITE_P(S3Ceph, S3CopyTest, ::testing::Values("Ceph"));

}  // namespace
}  // namespace ckptio
