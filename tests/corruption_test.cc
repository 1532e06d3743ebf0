// Damage to committed steps (issue 5, "Corruption"): bits flipped in,
// truncation of, and deletion of data files and indexes, on the memory
// backends (POSIX-like and object store) and on local disk. verify() and
// restore() must name exactly what is damaged (leaf, shard, byte range, data
// file, what is wrong); restore-latest falls back past damaged steps, lists
// them in RestoredState::skipped, and refuses in strict mode; errors that are
// not damage (transient, the caller's options) are returned, never skipped.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "backends/local/fs.h"
#include "backends/local/local_storage.h"
#include "backends/fault/fault_storage.h"
#include "ckptio/ckptio.h"
#include "testutil/backend_fixture.h"
#include "testutil/forwarding_storage.h"
#include "testutil/owned_leaves.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

using testutil::Backend;
using testutil::OwnedLeaf;
using testutil::expect_restored;
using testutil::make_leaf;
using testutil::views;

// Small leaves (read in groups) and one large leaf (read on its own).
std::vector<OwnedLeaf> sample_state(uint64_t seed) {
  std::vector<OwnedLeaf> s;
  s.push_back(make_leaf("model", "params.embed", DType::kFloat32, {300, 17}, seed + 1));
  s.push_back(make_leaf("model", "params.big", DType::kFloat32, {512, 300}, seed + 2));  // 600 KiB
  s.push_back(make_leaf("model", "params.scalar", DType::kFloat64, {}, seed + 3));
  s.push_back(make_leaf("tx", "opt_state.count", DType::kInt32, {}, seed + 4));
  s.push_back(make_leaf("tx", "opt_state.mu.kernel", DType::kFloat32, {1000, 33}, seed + 5));
  return s;
}

// Expects `text` to contain `part`.
#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) \
    << "expected \"" << (part) << "\" in: " << (text)

// base_, faults_ over it, dir_ for the local backend: testutil/backend_fixture.h.
// Moto and Ceph: the run's S3 test server (testutil/s3_store.h); without one
// the tests skip, or fail in CI.
// Counts the calls of read() (each a set of requests read in parallel).
class ReadCalls final : public testutil::ForwardingStorage {
 public:
  using ForwardingStorage::ForwardingStorage;
  Status read(std::span<const ReadRequest> requests) override {
    ++calls;
    return ForwardingStorage::read(requests);
  }
  std::atomic<int> calls{0};
};

class CorruptionTest : public testutil::S3BackendTest {
 protected:
  CorruptionTest() : S3BackendTest("ckptio-corrupt-") {}
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    m_ = manager();
    ASSERT_TRUE(m_->save(1, views(s1_)).value().wait().ok());
    ASSERT_TRUE(m_->save(2, views(s2_)).value().wait().ok());
    auto idx = m_->read_index(2);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    index2_ = *idx;
    ASSERT_EQ(index2_.files.size(), 1u);
    file_ = index2_.files[0].name;
    key_ = "run-2/" + file_;
    where_ = m_->storage().describe() + "/run-2/";
  }
  std::unique_ptr<CheckpointManager> manager(ManagerOptions o = {}) {
    return std::make_unique<CheckpointManager>(faults_, std::move(o));
  }
  bool posix_like() const {
    return GetParam() != Backend::kMemoryObject && GetParam() != Backend::kS3Moto && GetParam() != Backend::kS3Ceph;
  }

  const ShardRecord& shard_of(const std::string& prefix, const std::string& path) const {
    for (const auto& p : index2_.prefixes)
      for (const auto& l : p.leaves)
        if (p.name == prefix && l.path == path) return l.shards.at(0);
    ADD_FAILURE() << "no leaf " << prefix << "/" << path;
    static ShardRecord none;
    return none;
  }
  static std::string where(const std::string& leaf, const ShardRecord& r) {
    return leaf + " shard 0 (file " + r.file + ", bytes [" + std::to_string(r.offset) + ", " +
           std::to_string(r.offset + r.length) + "))";
  }

  // ---- Damage, in place on disk for the local backend ----
  std::string read_object(const std::string& key) {
    auto data = base_->get(key, 1ull << 30);
    EXPECT_TRUE(data.ok()) << data.status().to_string();
    return data.ok() ? *data : std::string();
  }
  void write_object(const std::string& key, const std::string& bytes) {
    if (key.ends_with(kIndexFileName)) {
      ASSERT_TRUE(base_->put(key, {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}).ok());
      return;
    }
    ASSERT_TRUE(base_->remove(key).ok());
    auto w = base_->create(key, bytes.size());
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    std::promise<Status> done;
    (*w)->write_async(0, {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()},
                      [&](Status st) { done.set_value(st); });
    ASSERT_TRUE(done.get_future().get().ok());
    ASSERT_TRUE((*w)->finish(bytes.size()).ok());
  }
  void flip_bit(const std::string& key, uint64_t at, uint8_t mask) {
    if (!dir_.empty()) {
      std::fstream f(dir_ / key, std::ios::in | std::ios::out | std::ios::binary);
      ASSERT_TRUE(f.good()) << dir_ / key;
      f.seekg(static_cast<std::streamoff>(at));
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ mask);
      f.seekp(static_cast<std::streamoff>(at));
      f.write(&c, 1);
      return;
    }
    std::string data = read_object(key);
    ASSERT_LT(at, data.size());
    data[at] = static_cast<char>(data[at] ^ mask);
    write_object(key, data);
  }
  void truncate(const std::string& key, uint64_t size) {
    if (!dir_.empty()) {
      fs::resize_file(dir_ / key, size);
      return;
    }
    std::string data = read_object(key);
    data.resize(size);
    write_object(key, data);
  }
  void remove(const std::string& key) {
    if (!dir_.empty()) {
      ASSERT_TRUE(fs::remove(dir_ / key)) << dir_ / key;
      return;
    }
    ASSERT_TRUE(base_->remove(key).ok());
  }

  // Restore-latest falls back to step 1, bit-exact, and says so; strict
  // refuses with the same error. Returns the skip's error.
  Status expect_fallback_to_step_1() {
    auto r = m_->restore(std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return r.status();
    EXPECT_EQ(r->step, 1);
    expect_restored(*r, s1_);
    EXPECT_EQ(r->skipped.size(), 1u);
    if (r->skipped.size() != 1) return Status::OK();
    EXPECT_EQ(r->skipped[0].step, 2);
    EXPECT_EQ(r->skipped[0].error.code(), Code::kDataLoss) << r->skipped[0].error.to_string();
    auto strict = manager({.strict = true});
    auto refused = strict->restore(std::nullopt);
    EXPECT_FALSE(refused.ok()) << "strict restore-latest restored step " << refused->step;
    if (!refused.ok()) {
      EXPECT_EQ(refused.status().code(), Code::kDataLoss);
      EXPECT_EQ(refused.status().message(), r->skipped[0].error.message());
    }
    return r->skipped[0].error;
  }

  std::vector<OwnedLeaf> s1_ = sample_state(100), s2_ = sample_state(200);
  std::unique_ptr<CheckpointManager> m_;
  Index index2_;
  std::string file_, key_, where_;  // step 2's data file, its key, "<base>/run-2/"
};

TEST_P(CorruptionTest, FlippedBitInDataIsNamedAndSkipped) {
  for (const auto& [prefix, path] : {std::pair<std::string, std::string>{"tx", "opt_state.mu.kernel"},  // grouped read
                                     {"model", "params.big"}}) {                                      // read alone
    SCOPED_TRACE(prefix + "/" + path);
    const ShardRecord& r = shard_of(prefix, path);
    flip_bit(key_, r.offset + r.length / 2, 0x10);
    const std::string mismatch = "checksum mismatch in " + where(prefix + "/" + path, r);

    Status v = m_->verify(2);
    EXPECT_EQ(v.code(), Code::kDataLoss);
    EXPECT_EQ(v.message(), "verify step 2 at " + where_ + ": 1 problem(s): " + mismatch);
    auto restored = m_->restore(2);
    ASSERT_FALSE(restored.ok());
    EXPECT_EQ(restored.status().code(), Code::kDataLoss);
    EXPECT_EQ(restored.status().message(), mismatch + " of step 2 at " + where_ + file_);
    Status skipped = expect_fallback_to_step_1();
    EXPECT_EQ(skipped.message(), restored.status().message());
    EXPECT_TRUE(m_->verify(1).ok());
    flip_bit(key_, r.offset + r.length / 2, 0x10);  // repair
    ASSERT_TRUE(m_->verify(2).ok());
  }
}

TEST_P(CorruptionTest, VerifyListsEveryDamagedShard) {
  const ShardRecord& a = shard_of("model", "params.embed");
  const ShardRecord& b = shard_of("tx", "opt_state.mu.kernel");
  flip_bit(key_, a.offset, 0x01);
  flip_bit(key_, b.offset + b.length - 1, 0x80);
  Status v = m_->verify(2);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  EXPECT_EQ(v.message(), "verify step 2 at " + where_ + ": 2 problem(s): checksum mismatch in " +
                             where("model/params.embed", a) + "; checksum mismatch in " +
                             where("tx/opt_state.mu.kernel", b));
}

TEST_P(CorruptionTest, TruncatedDataFileIsNamedAndSkipped) {
  // Cut the file inside its last shard: exactly that shard is lost.
  const ShardRecord* last = nullptr;
  std::string last_leaf;
  for (const auto& p : index2_.prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards)
        if (s.length > 0 && (!last || s.offset > last->offset)) last = &s, last_leaf = p.name + "/" + l.path;
  ASSERT_NE(last, nullptr);
  const uint64_t cut = last->offset + last->length / 2;
  const uint64_t size = index2_.files[0].size;
  truncate(key_, cut);

  Status v = m_->verify(2);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  EXPECT_EQ(v.message(), "verify step 2 at " + where_ + ": 1 problem(s): data file " + where_ + file_ + " has " +
                             std::to_string(cut) + " bytes, the index records " + std::to_string(size) +
                             " (short file), losing 1 shard(s): " + where(last_leaf, *last));
  auto restored = m_->restore(2);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), Code::kDataLoss);
  const std::string& msg = restored.status().message();
  EXPECT_EQ(msg.rfind("restore " + where(last_leaf, *last) + " of step 2: ", 0), 0u) << msg;
  EXPECT_HAS(msg, file_);
  EXPECT_HAS(msg, "past the end");
  Status skipped = expect_fallback_to_step_1();
  EXPECT_EQ(skipped.message(), msg);
}

// A restore of many small leaves plans them in chunks, the later ones while
// the first are read (src/restore/restore.cc): damage in a late chunk is still
// named exactly, by its checksum and by a short read, and a repaired step
// restores bit-exact.
TEST_P(CorruptionTest, DamageAmongManySmallLeavesIsNamed) {
  std::vector<OwnedLeaf> many;
  for (int i = 0; i < 6000; ++i)
    many.push_back(make_leaf("model", "leaf." + std::to_string(i), DType::kFloat32,
                             {static_cast<int64_t>(1 + i % 97)}, 1000 + i));
  ASSERT_TRUE(m_->save(3, views(many)).value().wait().ok());
  auto idx = m_->read_index(3);
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  const auto& leaves = idx->prefixes.at(0).leaves;
  ASSERT_EQ(leaves.size(), many.size());
  const std::string at = m_->storage().describe() + "/run-3/";
  // The 5,901st leaf: in the third chunk (leaves 3,072 to 7,167).
  const LeafRecord& hit = leaves.at(5900);
  const ShardRecord& r = hit.shards.at(0);
  flip_bit("run-3/" + r.file, r.offset + r.length / 2, 0x04);
  auto restored = m_->restore(3);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), Code::kDataLoss);
  EXPECT_EQ(restored.status().message(),
            "checksum mismatch in " + where("model/" + hit.path, r) + " of step 3 at " + at + r.file);
  flip_bit("run-3/" + r.file, r.offset + r.length / 2, 0x04);  // repair
  restored = m_->restore(3);
  ASSERT_TRUE(restored.ok()) << restored.status().to_string();
  expect_restored(*restored, many);

  // Cut the file of the last leaf inside its last shard.
  const std::string& file = leaves.back().shards.at(0).file;
  const ShardRecord* last = nullptr;
  std::string last_leaf;
  for (const LeafRecord& l : leaves)
    if (l.shards.at(0).file == file && (!last || l.shards[0].offset > last->offset))
      last = &l.shards[0], last_leaf = "model/" + l.path;
  ASSERT_GT(last->length, 1u);
  truncate("run-3/" + file, last->offset + last->length / 2);
  // The failing member of a group of thousands is found by halving the
  // group, not by reading each member (2,932 GETs on moto before).
  std::atomic<int> reads{0};
  faults_->set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kRead && key.find("run-3/") != std::string::npos) ++reads;
  });
  restored = m_->restore(3);
  faults_->set_hook(nullptr);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), Code::kDataLoss);
  const std::string& msg = restored.status().message();
  EXPECT_EQ(msg.rfind("restore " + where(last_leaf, *last) + " of step 3: ", 0), 0u) << msg;
  EXPECT_HAS(msg, "past the end");
  EXPECT_LE(reads.load(), 100) << "read requests of the damaged step";

  // A restore into a sharding reads each leaf as a read of its own, all in
  // one batch of the read executor. The batch fails; the read that fails on
  // its own is found by halving the batch, in a few read() calls, not by
  // reading the batch read by read (6,000 read() calls before, one GET each
  // on an object store).
  RestoreOptions o;
  auto& sh = o.sharding.emplace();
  sh.mesh = Mesh::parse("dp=1").value();
  for (const LeafRecord& l : leaves) sh.leaves.push_back(LeafSharding{"model", l.path, l.shape, PartitionSpec::of({{}}), -1});
  auto counting = std::make_shared<ReadCalls>(faults_);
  CheckpointManager counted(counting, {});
  auto sharded = counted.restore(3, o);
  ASSERT_FALSE(sharded.ok());
  EXPECT_EQ(sharded.status().code(), Code::kDataLoss);
  EXPECT_EQ(sharded.status().message().rfind("restore " + last_leaf + " (bytes [", 0), 0u) << sharded.status().message();
  EXPECT_HAS(sharded.status().message(), "past the end");
  EXPECT_LE(counting->calls.load(), 40) << "read() calls of the sharded restore of the damaged step";
}

TEST_P(CorruptionTest, DeletedDataFileIsNamedAndSkipped) {
  remove(key_);
  size_t shards = 0;
  for (const auto& p : index2_.prefixes)
    for (const auto& l : p.leaves)
      for (const auto& s : l.shards) shards += s.length > 0;
  Status v = m_->verify(2);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  const std::string missing = "data file " + where_ + file_ + " is missing";
  EXPECT_EQ(v.message().rfind("verify step 2 at " + where_ + ": 1 problem(s): " + missing + ", losing " +
                                  std::to_string(shards) + " shard(s): model/params.embed shard 0 (file " + file_,
                              0),
            0u)
      << v.message();
  auto restored = m_->restore(2);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), Code::kDataLoss);
  EXPECT_HAS(restored.status().message(), "restore model/");
  EXPECT_HAS(restored.status().message(), "of step 2: " + missing + " (");
  // Without checksums too: a missing file is never silently zeros.
  auto unverified = m_->restore(2, {.verify = false});
  ASSERT_FALSE(unverified.ok());
  EXPECT_EQ(unverified.status().code(), Code::kDataLoss);
  Status skipped = expect_fallback_to_step_1();
  EXPECT_HAS(skipped.message(), missing);
}

TEST_P(CorruptionTest, ShardedRestoreNamesTheMissingFileAndFallsBack) {
  remove(key_);
  RestoreOptions o;
  o.select.prefixes = {"tx"};
  o.select.path_regex = "mu";
  auto& sh = o.sharding.emplace();
  sh.mesh = Mesh::parse("dp=2").value();
  sh.leaves.push_back(LeafSharding{"tx", "opt_state.mu.kernel", {1000, 33}, PartitionSpec::of({{"dp"}, {}}), -1});
  auto restored = m_->restore(2, o);
  ASSERT_FALSE(restored.ok());
  EXPECT_EQ(restored.status().code(), Code::kDataLoss);
  EXPECT_HAS(restored.status().message(), "restore tx/opt_state.mu.kernel (bytes [");
  EXPECT_HAS(restored.status().message(), "data file " + where_ + file_ + " is missing");
  auto latest = m_->restore(std::nullopt, o);
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_EQ(latest->skipped[0].error.message(), restored.status().message());
}

TEST_P(CorruptionTest, FlippedBitInIndexIsNamedAndSkipped) {
  const std::string key = "run-2/" + std::string(kIndexFileName);
  const std::string text = read_object(key);
  const size_t at = text.find("\"ckptio\"");
  ASSERT_NE(at, std::string::npos);
  flip_bit(key, at + 1, 0x01);  // "ckptio" -> "bkptio"
  auto idx = m_->read_index(2);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_HAS(idx.status().message(), m_->storage().describe() + "/" + key);
  EXPECT_HAS(idx.status().message(), "format");
  EXPECT_EQ(m_->verify(2).message(), idx.status().message());
  EXPECT_EQ(m_->restore(2).status().message(), idx.status().message());
  Status skipped = expect_fallback_to_step_1();
  EXPECT_EQ(skipped.message(), idx.status().message());
  EXPECT_EQ(m_->all_steps().value(), std::vector<int64_t>{1});
  EXPECT_EQ(manager({.strict = true})->all_steps().status().code(), Code::kDataLoss);
}

TEST_P(CorruptionTest, TruncatedIndexIsNamedAndSkipped) {
  const std::string key = "run-2/" + std::string(kIndexFileName);
  const std::string text = read_object(key);
  truncate(key, text.size() / 2);
  auto idx = m_->read_index(2);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_EQ(idx.status().message().rfind(m_->storage().describe() + "/" + key + ": ", 0), 0u)
      << idx.status().message();
  EXPECT_EQ(m_->verify(2).message(), idx.status().message());
  Status skipped = expect_fallback_to_step_1();
  EXPECT_EQ(skipped.message(), idx.status().message());
}

// An index larger than IndexLimits::max_bytes (256 MiB) is not one ckptio
// wrote: damage, passed over by restore-latest and reported by cp as data
// (exit 1). Before, the storage's "exceeds the limit" (kInvalidArgument)
// failed restore-latest outright and made cp exit 2, a usage error. (Local
// disk only: a sparse file; the other backends would hold 256 MiB.)
TEST_P(CorruptionTest, AnIndexLargerThanTheLimitIsDamageAndSkipped) {
  if (GetParam() != Backend::kLocal) return;
  const std::string key = "run-2/" + std::string(kIndexFileName);
  truncate(key, IndexLimits{}.max_bytes + 1);
  auto idx = m_->read_index(2);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), Code::kDataLoss) << idx.status().to_string();
  Status skipped = expect_fallback_to_step_1();
  EXPECT_EQ(skipped.code(), Code::kDataLoss) << skipped.to_string();
  auto dst = make_memory_storage(false);
  auto copied = copy_step(*faults_, *dst, 2, {});
  EXPECT_EQ(copied.status().code(), Code::kDataLoss) << copied.status().to_string();
}

TEST_P(CorruptionTest, DeletedIndexIsDamageOnPosixAndUncommittedOnObjectStores) {
  const std::string key = "run-2/" + std::string(kIndexFileName);
  remove(key);
  if (!posix_like()) {
    // An object-store prefix without an index is also what a save in
    // progress looks like: not committed, not damage.
    EXPECT_EQ(m_->verify(2).code(), Code::kNotFound);
    auto r = m_->restore(std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->step, 1);
    EXPECT_TRUE(r->skipped.empty());
    EXPECT_TRUE(manager({.strict = true})->restore(std::nullopt).ok());
    return;
  }
  // POSIX: a final directory always holds its index; data without one is a
  // lost index.
  Status v = m_->verify(2);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  EXPECT_EQ(v.message(), m_->storage().describe() + "/" + key + " is missing, but " + where_ + " holds 1 object(s) (" +
                             key_ + "): the index of step 2 was deleted or lost, so the step is not committed");
  Status skipped = expect_fallback_to_step_1();
  EXPECT_EQ(skipped.message(), v.message());
  EXPECT_EQ(m_->all_steps().value(), std::vector<int64_t>{1});
  EXPECT_EQ(manager({.strict = true})->all_steps().status().message(), v.message());
}

TEST_P(CorruptionTest, EveryStepDamagedIsDataLossListingThem) {
  remove(key_);
  auto idx1 = m_->read_index(1);
  ASSERT_TRUE(idx1.ok());
  remove("run-1/" + idx1->files[0].name);
  auto r = m_->restore(std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_EQ(r.status().message().rfind("restore-latest: every committed step at " +
                                           m_->storage().describe() + " is damaged; step 2: restore ",
                                       0),
            0u)
      << r.status().message();
  EXPECT_HAS(r.status().message(), "; step 1: restore ");
  EXPECT_HAS(r.status().message(), "run-1/" + idx1->files[0].name + " is missing");
}

TEST_P(CorruptionTest, TransientAndPermissionErrorsAreReturnedNotSkipped) {
  for (Code code : {Code::kUnavailable, Code::kIOError, Code::kPermissionDenied}) {
    SCOPED_TRACE(code_name(code));
    faults_->clear_rules();
    faults_->add_rule({.op = FaultOp::kRead, .key_substr = "run-2/", .code = code, .message = "injected"});
    auto r = m_->restore(std::nullopt);
    ASSERT_FALSE(r.ok()) << "fell back to step " << r->step;
    EXPECT_EQ(r.status().code(), code);
    EXPECT_HAS(r.status().message(), "of step 2");
    faults_->clear_rules();
    faults_->add_rule({.op = FaultOp::kGet, .key_substr = "run-2/", .code = code, .message = "injected"});
    r = m_->restore(std::nullopt);
    ASSERT_FALSE(r.ok()) << "fell back to step " << r->step;
    EXPECT_EQ(r.status().code(), code);
    // A read error is not damage in verify either: returned at once.
    faults_->clear_rules();
    faults_->add_rule({.op = FaultOp::kRead, .key_substr = "run-2/", .code = code, .message = "injected"});
    EXPECT_EQ(m_->verify(2).code(), code);
  }
  faults_->clear_rules();
  auto ok = m_->restore(std::nullopt);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->step, 2);
  EXPECT_TRUE(ok->skipped.empty());
  expect_restored(*ok, s2_);
}

// A hostile index whose leaf's bytes fit in 64 bits but not as a wider dtype
// (bfloat16 [2^62 + 1], 2^63 + 2 bytes, restored as float64: 2^65 + 8, which
// wrapped to 8): refused before any allocation or read, whole and sharded.
// Before, the destination's size wrapped, and the first read overran it.
TEST_P(CorruptionTest, ACastWhoseBytesOverflowIsRefusedBeforeAnyRead) {
  const int64_t huge = (int64_t{1} << 62) + 1;
  Index idx = index2_;
  LeafRecord leaf = idx.prefixes.at(0).leaves.at(0);
  leaf.dtype = DType::kBFloat16;
  leaf.shape = {huge};
  leaf.shards.resize(1);
  leaf.shards[0].box = Box{{0}, {huge}};
  leaf.shards[0].offset = 0;
  leaf.shards[0].length = static_cast<uint64_t>(huge) * 2;
  idx.prefixes = {PrefixRecord{idx.prefixes[0].name, {leaf}}};
  idx.files = {DataFileRecord{leaf.shards[0].file, leaf.shards[0].length}};
  ASSERT_NO_FATAL_FAILURE(write_object("run-2/" + std::string(kIndexFileName), serialize_index(idx)));
  ASSERT_TRUE(m_->read_index(2).ok()) << m_->read_index(2).status().to_string();
  RestoreOptions o;
  o.float_dtype = DType::kFloat64;
  auto r = m_->restore(2, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  EXPECT_HAS(r.status().message(), "float64 bytes do not fit in 64 bits");
  RestoreOptions::Sharding sh;
  sh.mesh = Mesh::parse("dp=2").value();
  sh.leaves.push_back(LeafSharding{idx.prefixes[0].name, leaf.path, leaf.shape, PartitionSpec::of({{"dp"}}), -1});
  o.sharding = sh;
  r = m_->restore(2, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  EXPECT_HAS(r.status().message(), "float64 bytes do not fit in 64 bits");
}

TEST_P(CorruptionTest, BadOptionsAreReturnedNotSkippedPastDamage) {
  flip_bit(key_, shard_of("model", "params.big").offset, 0x04);  // step 2 is damaged
  // (Options built member by member: GCC 12 warns, wrongly, that a
  // designated-initializer temporary's select.path_regex may be uninitialized.)
  RestoreOptions bad_regex;
  bad_regex.select.path_regex = "(";
  auto r = m_->restore(std::nullopt, bad_regex);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  RestoreOptions unknown_leaf;
  unknown_leaf.expected = {LeafSpec{"model", "no.such.leaf", DType::kFloat32, {1}}};
  r = m_->restore(std::nullopt, unknown_leaf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  std::vector<std::byte> small(8);
  RestoreOptions into;
  into.into = {{"model", "params.big", small.data(), small.size()}};
  r = m_->restore(std::nullopt, into);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  // A caller error found on the older step after a skip says what was skipped.
  RestoreOptions tmpl;
  for (const auto& l : s2_) tmpl.expected.push_back(LeafSpec{l.prefix, l.path, l.dtype, l.shape});
  tmpl.expected[1].shape = {1, 1};  // matches neither step
  r = m_->restore(std::nullopt, tmpl);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(r.status().message().find("restore-latest, after skipping damaged step(s) 2"), std::string::npos)
      << "a template mismatch on step 2 itself must not skip it: " << r.status().message();
}

INSTANTIATE_TEST_SUITE_P(Backends, CorruptionTest, testutil::all_backends(), testutil::backend_name);

// ---- Hostile symbolic links inside a step directory (local disk) ----------------

class LocalHostileSymlinks : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("ckptio-links-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter_++));
    fs::remove_all(base_);
    root_ = base_ / "ckpt";
    outside_ = base_ / "outside";
    fs::create_directories(outside_);
    auto s = make_local_storage(root_.string());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    m_ = std::make_unique<CheckpointManager>(*s, ManagerOptions{});
    ASSERT_TRUE(m_->save(1, views(s1_)).value().wait().ok());
    ASSERT_TRUE(m_->save(2, views(s2_)).value().wait().ok());
    file_ = m_->read_index(2).value().files[0].name;
  }
  void TearDown() override { fs::remove_all(base_); }

  fs::path base_, root_, outside_;
  std::vector<OwnedLeaf> s1_ = sample_state(300), s2_ = sample_state(400);
  std::unique_ptr<CheckpointManager> m_;
  std::string file_;
  static inline int counter_ = 0;
};

// The data file moved outside and replaced by a link to it: the bytes
// behind the link are exactly right, so only refusing the link stops the
// read (a link to /etc/passwd would fail its checksums anyway).
TEST_F(LocalHostileSymlinks, DataFileLinkedOutsideIsRefusedNamingTheKey) {
  const fs::path data = root_ / "run-2" / file_;
  for (const fs::path& target : {outside_ / file_, fs::path("/etc/passwd")}) {
    SCOPED_TRACE(target.string());
    if (!fs::exists(outside_ / file_)) fs::rename(data, outside_ / file_);
    fs::remove(data);
    fs::create_symlink(target, data);
    const std::string refused = "open " + data.string() + ": a symbolic link inside the checkpoint";
    Status v = m_->verify(2);
    EXPECT_EQ(v.code(), Code::kDataLoss);
    EXPECT_HAS(v.message(), "data file " + data.string() + " is unreadable: " + refused);
    auto r = m_->restore(2);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kDataLoss);
    EXPECT_HAS(r.status().message(), "of step 2: " + refused);
    auto latest = m_->restore(std::nullopt);
    ASSERT_TRUE(latest.ok()) << latest.status().to_string();
    EXPECT_EQ(latest->step, 1);
    expect_restored(*latest, s1_);
    ASSERT_EQ(latest->skipped.size(), 1u);
    EXPECT_HAS(latest->skipped[0].error.message(), refused);
  }
  // Put the real file back: step 2 is whole again.
  fs::remove(data);
  fs::rename(outside_ / file_, data);
  EXPECT_TRUE(m_->verify(2).ok());
}

TEST_F(LocalHostileSymlinks, StepDirectoryLinkedElsewhereIsRefused) {
  fs::rename(root_ / "run-2", outside_ / "run-2");
  fs::create_directory_symlink(outside_ / "run-2", root_ / "run-2");
  const std::string index = (root_ / "run-2" / kIndexFileName).string();
  auto idx = m_->read_index(2);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_HAS(idx.status().message(), "open " + index + ": a symbolic link inside the checkpoint");
  auto latest = m_->restore(std::nullopt);
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_EQ(latest->skipped[0].error.message(), idx.status().message());
}

TEST_F(LocalHostileSymlinks, ALinkedRootIsTheUsersChoiceAndIsFollowed) {
  const fs::path link = base_ / "link-to-ckpt";
  fs::create_directory_symlink(root_, link);
  auto s = make_local_storage(link.string());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  CheckpointManager m(*s, ManagerOptions{});
  EXPECT_TRUE(m.verify(2).ok());
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 2);
  expect_restored(*r, s2_);
}

// open_beneath itself, with openat2 and with the component walk that
// kernels before 5.6 get.
TEST_F(LocalHostileSymlinks, OpenBeneathRefusesEveryLinkBelowTheRoot) {
  using local::Beneath;
  const std::string root = root_.string();
  fs::create_directory_symlink(root_ / "run-1", root_ / "dir-link");      // a link to a directory inside
  fs::create_symlink(root_ / "run-1" / kIndexFileName, root_ / "run-1" / "file-link");  // to a file inside
  fs::create_symlink("/etc/passwd", root_ / "run-1" / "abs-link");
  fs::create_symlink("../../outside", root_ / "run-1" / "rel-link");
  for (Beneath how : {Beneath::kAuto, Beneath::kWalk}) {
    SCOPED_TRACE(how == Beneath::kAuto ? "openat2" : "walk");
    int err = 0;
    auto ok = local::open_beneath(root, "run-1/" + std::string(kIndexFileName), O_RDONLY, &err, how);
    EXPECT_TRUE(ok.ok()) << ok.status().to_string();
    for (const std::string& key : {"dir-link/" + std::string(kIndexFileName), std::string("run-1/file-link"),
                                  std::string("run-1/abs-link"), std::string("run-1/rel-link/x")}) {
      for (int flags : {O_RDONLY, O_RDONLY | O_DIRECT, O_PATH}) {
        err = 0;
        auto r = local::open_beneath(root, key, flags, &err, how);
        ASSERT_FALSE(r.ok()) << key << " opened through a link";
        EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
        EXPECT_EQ(err, ELOOP) << key;
        EXPECT_HAS(r.status().message(), "open " + root + "/" + key + ": a symbolic link inside the checkpoint");
      }
    }
    auto missing = local::open_beneath(root, "run-1/nothing", O_RDONLY, &err, how);
    EXPECT_EQ(missing.status().code(), Code::kNotFound);
    EXPECT_EQ(err, ENOENT);
  }
}

}  // namespace
}  // namespace ckptio
