// Steps in the eformer / TensorStore zarr v2 layout, written by zarr-python
// (Debian's python3-zarr and python3-numcodecs, run with /usr/bin/python3 at
// the start of each test) as TensorStore writes them: one zarr array per
// leaf under its key path, chunks of the shard shape, zstd level 1 (blosc,
// zlib and none for a few leaves, '.' and '/' separators, bfloat16 stored
// as uint16 with the dtype name set to "bfloat16"), tensorstore_index.json
// and metadata.json as eformer writes them. The files are put into each
// backend as objects; CheckpointManager then lists, restores (whole, cast,
// into a sharding), verifies and gc's them as it does its own steps.
// Without zarr-python the tests skip loudly (fail under CI=true).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include "backends/fault/fault_storage.h"
#include "ckptio/ckptio.h"
#include "src/transform/cast.h"
#include "src/util/iso8601.h"
#include "testutil/backend_fixture.h"
#include "testutil/forwarding_storage.h"
#include "testutil/random_bytes.h"
#include "testutil/eformer_steps.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

// cp --format ckptio of an eformer step into "conv-{step}" beside it.
CopyOptions to_ckptio_as_conv() {
  CopyOptions o;
  o.format = "ckptio";
  o.dst_step_format = "conv-{step}";
  return o;
}

// ... and back: conv-{step} to eformer's layout at back-{step}.
CopyOptions back_to_eformer() {
  CopyOptions o;
  o.format = "eformer";
  o.src_step_format = "conv-{step}";
  o.dst_step_format = "back-{step}";
  return o;
}

namespace fs = std::filesystem;
using testutil::Backend;



std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Leaves as the script writes them: "prefix/path" -> dtype, shape.
struct LeafInfo {
  DType dtype;
  Shape shape;
};
const std::map<std::string, LeafInfo>& leaves() {
  static const std::map<std::string, LeafInfo> m = {
      {"model/layers.0.kernel", {DType::kBFloat16, {64, 48}}},
      {"model/layers.0.bias", {DType::kFloat32, {48}}},
      {"model/embed", {DType::kFloat32, {50, 30}}},
      {"tx/mu.kernel", {DType::kFloat32, {64, 48}}},
      {"tx/count", {DType::kInt32, {}}},
      {"tx/nu", {DType::kUInt16, {9, 11}}},
  };
  return m;
}

class EformerStepTest : public testutil::S3BackendTest {
 protected:
  EformerStepTest() : S3BackendTest("ckptio-eformer-") {}
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    std::string log;
    bool missing = false;
    fixture_ = testutil::eformer_steps_fixture(&log, &missing);
    if (fixture_.empty() && missing) {
      const char* ci = std::getenv("CI");
      if (ci && *ci) FAIL() << "zarr-python is missing under CI: tools/setup-deps installs python3-zarr\n" << log;
      GTEST_SKIP() << "zarr-python is missing: install python3-zarr and python3-numcodecs (tools/setup-deps does)";
    }
    ASSERT_FALSE(fixture_.empty()) << "zarr-python writing the steps failed:\n" << log;
    work_ = fs::temp_directory_path() / ("ckptio-eformer-src-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter_++));
    fs::remove_all(work_);
    fs::create_directories(work_);
    // Every file, as an object of the backend under test.
    for (const auto& e : fs::recursive_directory_iterator(fixture_ / "base")) {
      if (!e.is_regular_file()) continue;
      const std::string key = fs::relative(e.path(), fixture_ / "base").generic_string();
      const std::string bytes = read_file(e.path());
      keys_.push_back(key);
      ASSERT_TRUE(base_->put(key, std::as_bytes(std::span(bytes.data(), bytes.size()))).ok()) << key;
    }
  }
  void TearDown() override {
    if (!work_.empty()) fs::remove_all(work_);
    BackendTest::TearDown();
  }
  // Rewrites the JSON object at `key` through `change`.
  template <typename F>
  void edit_json(const std::string& key, F&& change) {
    auto text = base_->get(key, 1 << 20);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    nlohmann::json j = nlohmann::json::parse(*text);
    change(j);
    const std::string out = j.dump();
    ASSERT_TRUE(base_->put(key, std::as_bytes(std::span(out.data(), out.size()))).ok());
  }
  std::unique_ptr<CheckpointManager> manager(ManagerOptions o = {}) {
    return std::make_unique<CheckpointManager>(base_, o);
  }
  std::string expected(int64_t step, const std::string& name) const {
    return read_file(fixture_ / "expected" / std::to_string(step) / (name + ".raw"));
  }
  // The expected bytes of `box` of a leaf (C order), cut out of the whole.
  std::string expected_box(int64_t step, const std::string& name, const Box& box) const {
    const std::string all = expected(step, name);
    const LeafInfo& info = leaves().at(name);
    const size_t item = dtype_size(info.dtype);
    std::string out;
    const size_t rank = info.shape.size();
    if (rank == 0) return all;
    std::vector<int64_t> idx(box.start);
    if (box_is_empty_(box)) return out;
    for (;;) {
      int64_t flat = 0;
      for (size_t d = 0; d < rank; ++d) flat = flat * info.shape[d] + idx[d];
      out.append(all, flat * item, item);
      size_t d = rank;
      while (d > 0) {
        --d;
        if (++idx[d] < box.stop[d]) break;
        idx[d] = box.start[d];
        if (d == 0) return out;
      }
    }
  }
  static bool box_is_empty_(const Box& b) {
    for (size_t d = 0; d < b.start.size(); ++d)
      if (b.stop[d] <= b.start[d]) return true;
    return false;
  }
  static std::string bytes_of(const Buffer& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

  fs::path fixture_;  // zarr-python's steps, shared (testutil::eformer_steps_fixture)
  fs::path work_;     // this test's own scratch
  std::vector<std::string> keys_;
  static inline int counter_ = 0;
};

TEST_P(EformerStepTest, ListsCompleteStepsAndRestoresTheLatestBitExact) {
  auto m = manager();
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  EXPECT_EQ(*steps, (std::vector<int64_t>{100, 200}));  // 300 has no metadata.json yet

  auto index = m->read_index(200);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  EXPECT_EQ(index->layout, "eformer");
  EXPECT_NE(index->metadata_json.find("\"step\": 200"), std::string::npos) << index->metadata_json;
  EXPECT_GT(index->committed_unix_ns, 0);

  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 200);
  ASSERT_EQ(r->leaves.size(), leaves().size());
  std::map<std::string, const Tensor*> got;
  for (const Tensor& t : r->leaves) got[t.prefix + "/" + t.path] = &t;
  for (const auto& [name, info] : leaves()) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& t = *got[name];
    EXPECT_EQ(t.dtype, info.dtype) << name;
    EXPECT_EQ(t.shape, info.shape) << name;
    EXPECT_TRUE(bytes_of(t.data) == expected(200, name)) << name << " differs from what zarr-python wrote";
  }
  // zarr has no checksums: every chunk is delivered unverified.
  EXPECT_GT(r->stats.pieces_unverified, 0u);
  EXPECT_EQ(r->stats.bytes_unverified, r->stats.bytes_read);

  // An older step, a subset of it, and a cast.
  RestoreOptions o;
  o.select.prefixes = {"model"};
  o.float_dtype = DType::kFloat32;
  auto old = m->restore(100, o);
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  ASSERT_EQ(old->leaves.size(), 3u);
  for (const Tensor& t : old->leaves) {
    const std::string name = t.prefix + "/" + t.path;
    EXPECT_EQ(t.dtype, DType::kFloat32) << name;
    const std::string saved = expected(100, name);
    std::string want = saved;
    if (leaves().at(name).dtype == DType::kBFloat16) {
      want.resize(saved.size() * 2);
      ASSERT_TRUE(cast_elements(DType::kBFloat16, DType::kFloat32, reinterpret_cast<const std::byte*>(saved.data()),
                                reinterpret_cast<std::byte*>(want.data()), saved.size() / 2)
                      .ok());
    }
    EXPECT_TRUE(bytes_of(t.data) == want) << name;
  }
}

// The decoders fault in the memory the restore allocated, chunk by chunk,
// before decoding into it (RestoreOptions::prefault), and never the
// caller's `into` memory; the bytes are the same either way.
// metadata.json's timestamp is the step's commit time when it is one an
// index can hold (Unix nanoseconds, never negative). Before, a time before
// 1970 went into the index as is, and converting the step to ckptio failed
// as damage ("created_unix_ns: expected a non-negative integer").
TEST_P(EformerStepTest, ATimestampBefore1970IsNoCommitTime) {
  edit_json("run-200/metadata.json", [](nlohmann::json& j) { j["timestamp"] = "1970-01-01T00:30:00+01:00"; });
  auto index = manager()->read_index(200);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  EXPECT_EQ(index->committed_unix_ns, 0);
  EXPECT_EQ(index->created_unix_ns, 0);
  CopyOptions to_ckptio = to_ckptio_as_conv();
  auto c = copy_step(*base_, *base_, 200, to_ckptio);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ManagerOptions o;
  o.step_format = "conv-{step}";
  EXPECT_TRUE(manager(o)->verify(200).ok());
}

TEST_P(EformerStepTest, DecodersFaultInOnlyTheMemoryTheRestoreAllocated) {
  auto m = manager();
  auto check = [&](const RestoredState& r, const char* how) {
    ASSERT_EQ(r.leaves.size(), leaves().size()) << how;
    for (const Tensor& t : r.leaves) {
      const std::string name = t.prefix + "/" + t.path;
      EXPECT_TRUE(bytes_of(t.data) == expected(200, name)) << name << " (" << how << ")";
    }
  };
  auto on = m->restore(200);
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  check(*on, "prefault on");
  // Every byte of every leaf was in a span faulted in before its chunk was decoded.
  EXPECT_GE(on->stats.bytes_prefaulted, on->stats.bytes_needed);

  RestoreOptions off;
  off.prefault = false;
  auto r = m->restore(200, off);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  check(*r, "prefault off");
  EXPECT_EQ(r->stats.bytes_prefaulted, 0u);

  std::vector<std::string> mine;
  mine.reserve(leaves().size());  // no reallocation: `into` points into these strings
  RestoreOptions into;
  for (const auto& [name, info] : leaves()) {
    mine.emplace_back(expected(200, name).size(), '\0');
    const size_t slash = name.find('/');
    into.into.push_back({name.substr(0, slash), name.substr(slash + 1), mine.back().data(), mine.back().size()});
  }
  auto in = m->restore(200, into);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  EXPECT_EQ(in->stats.bytes_prefaulted, 0u) << "faulted in the caller's memory";
  size_t i = 0;
  for (const auto& [name, info] : leaves()) EXPECT_TRUE(mine[i++] == expected(200, name)) << name << " (into)";
}

TEST_P(EformerStepTest, RestoresIntoAShardingReadingOnlyTheChunksItsBoxesTouch) {
  auto m = manager();
  RestoreOptions o;
  o.sharding.emplace();
  o.sharding->mesh = Mesh::parse("x=2,y=2").value();
  auto rules = PartitionRules::from_json(R"([["kernel", ["x", "y"]], ["embed", ["y", "x"]], [".*", []]])");
  ASSERT_TRUE(rules.ok()) << rules.status().to_string();
  o.sharding->rules = *rules;
  o.sharding->rule_options.min_size = 0;
  o.sharding->devices = {1};  // one of four devices: a quarter of each split leaf
  auto r = m->restore(200, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Tensor& t : r->leaves) {
    const std::string name = t.prefix + "/" + t.path;
    ASSERT_EQ(t.device_shards.size(), 1u) << name;
    const DeviceShard& d = t.device_shards[0];
    EXPECT_EQ(d.device_id, 1);
    EXPECT_TRUE(bytes_of(d.data) == expected_box(200, name, d.box)) << name;
  }
  // Device 1 holds rows [0, 32) and columns [24, 48) of the kernels: of
  // model's kernel (row bands of 16) 2 of 4 chunks, of tx's (32 x 24) 1 of 4.
  auto index = m->read_index(200);
  ASSERT_TRUE(index.ok());
  uint64_t all = 0;
  for (const auto& f : index->files) all += f.size;
  EXPECT_LT(r->stats.bytes_read, all * 3 / 4) << "read more chunks than the boxes touch";
}

TEST_P(EformerStepTest, AMissingChunkIsAnErrorUnlessFilled) {
  ASSERT_TRUE(base_->remove("run-200/model/embed/1/1").ok());
  auto m = manager();
  RestoreOptions o;
  o.select.path_regex = "^embed$";
  auto r = m->restore(200, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find("chunk 1/1 is missing"), std::string::npos) << r.status().to_string();
  EXPECT_NE(m->verify(200).message().find("chunk 1/1 is missing"), std::string::npos);

  o.fill_missing_chunks = true;  // fill_value null: zeros, as TensorStore reads them
  auto f = m->restore(200, o);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->leaves.size(), 1u);
  std::string want = expected(200, "model/embed");
  for (int64_t i = 16; i < 32; ++i)
    for (int64_t j = 16; j < 30; ++j) std::memset(&want[(i * 30 + j) * 4], 0, 4);
  EXPECT_TRUE(bytes_of(f->leaves[0].data) == want);
}

// A .zarray whose bytes fit in 64 bits as saved (bfloat16 [2^62 + 1]) but
// not once cast (float32): refused, before any allocation. Before, the
// restore read an empty optional as the buffer's size.
TEST_P(EformerStepTest, ACastWhoseBytesOverflowIsRefused) {
  for (const std::string& k : keys_)
    if (k.rfind("run-200/model/layers/0/kernel/", 0) == 0 && k != "run-200/model/layers/0/kernel/.zarray")
      ASSERT_TRUE(base_->remove(k).ok()) << k;
  const int64_t huge = (int64_t{1} << 62) + 1;
  edit_json("run-200/model/layers/0/kernel/.zarray", [&](nlohmann::json& j) {
    j["chunks"] = {int64_t{1} << 20};  // (a chunk holds at most 16 GiB)
    j["shape"] = {huge};
  });
  edit_json("run-200/tensorstore_index.json", [&](nlohmann::json& j) {
    for (auto& a : j["prefixes"]["model"])
      if (a["path"] == "model/layers/0/kernel") a["shape"] = {huge};
  });
  RestoreOptions o;
  o.select.path_regex = "^layers\\.0\\.kernel$";
  o.fill_missing_chunks = true;
  o.float_dtype = DType::kFloat32;
  auto r = manager()->restore(200, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
}

// A .zarray may declare a grid of millions of tiny chunks and store a few.
// A restore planned an entry per chunk its targets overlap, stored or not
// (a billion 1-byte chunks: 16 GiB of plan before the first error); beyond
// 2^20 it walks only the stored chunks, counts the missing ones, and fills
// the targets whole when asked to.
TEST_P(EformerStepTest, AGridOfABillionChunksIsNotWalked) {
  // tx/nu as 4096 x 4096 uint16 in 1 x 1 chunks (2^24 of them, a 32 MiB
  // leaf), uncompressed, with two chunks stored.
  for (const std::string& k : keys_)
    if (k.rfind("run-200/tx/nu/", 0) == 0 && k != "run-200/tx/nu/.zarray") ASSERT_TRUE(base_->remove(k).ok()) << k;
  const uint16_t first = 0x1234, last = 0xbeef;
  ASSERT_TRUE(base_->put("run-200/tx/nu/0/0", std::as_bytes(std::span(&first, 1))).ok());
  ASSERT_TRUE(base_->put("run-200/tx/nu/4095/4095", std::as_bytes(std::span(&last, 1))).ok());
  edit_json("run-200/tx/nu/.zarray", [](nlohmann::json& j) {
    j["chunks"] = {1, 1};
    j["shape"] = {4096, 4096};
    j["compressor"] = nullptr;
  });
  edit_json("run-200/tensorstore_index.json", [](nlohmann::json& j) {
    for (auto& a : j["prefixes"]["tx"])
      if (a["path"] == "tx/nu") a["shape"] = {4096, 4096};
  });
  auto m = manager();
  RestoreOptions o;
  o.select.path_regex = "^nu$";
  auto r = m->restore(200, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("chunk 0/1 is missing"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(and 16777213 more)"), std::string::npos) << r.status().to_string();

  o.fill_missing_chunks = true;  // fill_value null: zeros
  r = m->restore(200, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 1u);
  const Buffer& got = r->leaves[0].data;
  ASSERT_EQ(got.size(), 4096u * 4096 * 2);
  std::vector<uint16_t> want(4096 * 4096, 0);
  want.front() = first;
  want.back() = last;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  EXPECT_EQ(r->stats.requests, 2u);

  // Into a sharding: two devices, a target each, each with one stored chunk.
  o.sharding.emplace();
  o.sharding->mesh = Mesh::parse("x=2").value();
  o.sharding->rules = PartitionRules::from_json(R"([[".*", ["x"]]])").value();
  r = m->restore(200, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.at(0).device_shards.size(), 2u);
  for (const DeviceShard& d : r->leaves[0].device_shards) {
    const auto* p = reinterpret_cast<const uint16_t*>(d.data.data());
    const size_t n = d.data.size() / 2;
    ASSERT_EQ(n, 2048u * 4096);
    EXPECT_EQ(d.box.start[0] == 0 ? p[0] : p[n - 1], d.box.start[0] == 0 ? first : last);
    EXPECT_EQ(std::count(p, p + n, uint16_t{0}), static_cast<std::ptrdiff_t>(n - 1)) << "device " << d.device_id;
  }
  o.fill_missing_chunks = false;
  r = m->restore(200, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(and 16777213 more)"), std::string::npos) << r.status().to_string();
  // Replicated on both devices: each missing chunk is counted once, not
  // once per device (the count was 33554427).
  o.sharding->rules = PartitionRules::from_json(R"([[".*", []]])").value();
  r = m->restore(200, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(and 16777213 more)"), std::string::npos) << r.status().to_string();
  // Chunks of 3 x 1 (1366 x 4096 of them): the two devices' rows meet inside
  // chunk row 682, which both overlap. Still counted once each (the count
  // was 5599229).
  const uint16_t three[3] = {first, 0, 0};
  ASSERT_TRUE(base_->remove("run-200/tx/nu/4095/4095").ok());
  ASSERT_TRUE(base_->put("run-200/tx/nu/0/0", std::as_bytes(std::span(three))).ok());
  ASSERT_TRUE(base_->put("run-200/tx/nu/1365/4095", std::as_bytes(std::span(three))).ok());
  edit_json("run-200/tx/nu/.zarray", [](nlohmann::json& j) { j["chunks"] = {3, 1}; });
  o.sharding->rules = PartitionRules::from_json(R"([[".*", ["x"]]])").value();
  r = m->restore(200, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(and 5595133 more)"), std::string::npos) << r.status().to_string();
  ASSERT_TRUE(base_->remove("run-200/tx/nu/1365/4095").ok());
  ASSERT_TRUE(base_->put("run-200/tx/nu/0/0", std::as_bytes(std::span(&first, 1))).ok());
  ASSERT_TRUE(base_->put("run-200/tx/nu/4095/4095", std::as_bytes(std::span(&last, 1))).ok());
  edit_json("run-200/tx/nu/.zarray", [](nlohmann::json& j) { j["chunks"] = {1, 1}; });

  // 32768 x 32768 chunks (2^30; the 2 GiB leaf is allocated, never
  // touched): the missing chunk is named at once. Walking the grid took a
  // plan of 16 GiB before (on this 24 GiB machine: minutes, then the
  // process killed).
  auto grow = [](nlohmann::json& j) { j["shape"] = {32768, 32768}; };
  edit_json("run-200/tx/nu/.zarray", grow);
  edit_json("run-200/tensorstore_index.json", [&](nlohmann::json& j) {
    for (auto& a : j["prefixes"]["tx"])
      if (a["path"] == "tx/nu") grow(a);
  });
  o = RestoreOptions{};
  o.select.path_regex = "^nu$";
  r = m->restore(200, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("chunk 0/1 is missing"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(and 1073741821 more)"), std::string::npos) << r.status().to_string();
}

// Sizes no encoding has are refused from the sizes alone, before anything is
// allocated for them: a .zarray whose chunk is 8 GiB where a few hundred
// stored bytes would have to decode into it (the decoder's scratch once grew
// to it first), a chunk file of a terabyte (local disk: sparse; a buffer of
// its size was once taken to read it), and a grid of 2^60 chunks that verify
// once walked one by one.
TEST_P(EformerStepTest, SizesNoEncodingHasAreRefusedBeforeAnythingIsAllocated) {
  auto m = manager();
  RestoreOptions o;
  o.select.path_regex = "^nu$";
  auto edit = [&](const std::string& key, auto&& change) { edit_json(key, change); };
  if (GetParam() == Backend::kLocal) {  // the original .zarray, a 1 TiB chunk 0/0
    fs::resize_file(dir_ / "run-200/tx/nu/0/0", uint64_t{1} << 40);
    auto r = m->restore(200, o);
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
    EXPECT_NE(r.status().message().find("more than any encoding"), std::string::npos) << r.status().to_string();
    EXPECT_NE(m->verify(200).message().find("more than any encoding"), std::string::npos);
  }
  // One chunk of 65536 x 65536 uint16 (8 GiB), stored as the few hundred
  // bytes of the old chunk 0/0 (the others removed).
  for (const std::string& k : keys_)
    if (k.rfind("run-200/tx/nu/", 0) == 0 && k != "run-200/tx/nu/.zarray") ASSERT_TRUE(base_->remove(k).ok()) << k;
  const std::string tiny(300, '\x01');
  ASSERT_TRUE(base_->put("run-200/tx/nu/0/0", std::as_bytes(std::span(tiny.data(), tiny.size()))).ok());
  edit("run-200/tx/nu/.zarray", [](nlohmann::json& j) { j["chunks"] = {65536, 65536}; });
  auto r = m->restore(200, o);
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("cannot decode into"), std::string::npos) << r.status().to_string();
  EXPECT_NE(m->verify(200).message().find("cannot decode into"), std::string::npos);
  // 2^58 x 11 elements in chunks of 4 x 4: verify counts the missing chunks.
  edit("run-200/tx/nu/.zarray", [](nlohmann::json& j) {
    j["chunks"] = {4, 4};
    j["shape"] = {int64_t{1} << 58, 11};
  });
  edit("run-200/tensorstore_index.json", [](nlohmann::json& j) {
    for (auto& a : j["prefixes"]["tx"])
      if (a["path"] == "tx/nu") a["shape"] = {int64_t{1} << 58, 11};
  });
  Status v = m->verify(200);
  EXPECT_FALSE(v.ok());
  EXPECT_NE(v.message().find("is missing"), std::string::npos) << v.to_string();
}

// An array inside another's directory, listed by another index file (an
// older per-prefix one): its chunks would be taken for the outer array's
// ("model/embed" is stored with '/', so "model/embed/1/0" is its chunk 1/0).
TEST_P(EformerStepTest, AnArrayInsideAnotherListedByAnotherIndexFileIsRefused) {
  const std::string extra =
      R"({"format":"tensorstore","version":"1.0","arrays":[{"path":"model/embed/1","shape":[14],"dtype":"float32"}]})";
  ASSERT_TRUE(base_->put("run-200/model_tensorstore_index.json", std::as_bytes(std::span(extra.data(), extra.size()))).ok());
  auto m = manager();
  auto r = m->restore(200);
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("lies inside array"), std::string::npos) << r.status().to_string();
}

TEST_P(EformerStepTest, VerifyDecodesEveryChunkAndRestoreLatestPassesADamagedStep) {
  auto m = manager();
  EXPECT_TRUE(m->verify(200).ok());
  EXPECT_TRUE(m->verify(100).ok());
  // A chunk whose zstd frame is damaged.
  auto chunk = base_->get("run-200/model/layers/0/kernel/2.0", 1 << 20);
  ASSERT_TRUE(chunk.ok());
  std::string bad = *chunk;
  bad.resize(bad.size() / 2);
  ASSERT_TRUE(base_->put("run-200/model/layers/0/kernel/2.0", std::as_bytes(std::span(bad.data(), bad.size()))).ok());
  Status v = m->verify(200);
  EXPECT_EQ(v.code(), Code::kDataLoss);
  EXPECT_NE(v.message().find("model/layers.0.kernel chunk 2.0"), std::string::npos) << v.to_string();

  auto r = m->restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 100);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].step, 200);
}

// A newest step ckptio cannot read (a .zarray of zarr v3: Unimplemented) is
// whole, not damaged: restore-latest stops there with that error instead of
// resuming from an older step (which would lose the training since), and
// the older one is still restored by number (docs/format.md §7).
TEST_P(EformerStepTest, RestoreLatestStopsAtAStepItCannotRead) {
  edit_json("run-200/tx/nu/.zarray", [](nlohmann::json& j) { j["zarr_format"] = 3; });
  auto m = manager();
  auto r = m->restore(std::nullopt);
  ASSERT_FALSE(r.ok()) << "restored step " << r->step;
  EXPECT_EQ(r.status().code(), Code::kUnimplemented) << r.status().to_string();
  // Committed all the same: listed (before, its error failed every listing).
  auto steps = m->all_steps();
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  EXPECT_EQ(*steps, (std::vector<int64_t>{100, 200}));
  auto latest = m->latest_step();
  ASSERT_TRUE(latest.ok()) << latest.status().to_string();
  EXPECT_EQ(latest->value_or(-1), 200);
  auto older = m->restore(100);
  ASSERT_TRUE(older.ok()) << older.status().to_string();
}

TEST_P(EformerStepTest, GcLeavesEformerStepsAloneCompleteOrNot) {
  auto m = manager();
  GcOptions g;
  g.min_age_seconds = 0;
  ASSERT_TRUE(m->gc(g).ok());
  for (const std::string& k : keys_) EXPECT_TRUE(base_->stat(k).ok()) << k << " was removed by gc";
  auto dirs = m->list_step_dirs();
  ASSERT_TRUE(dirs.ok());
  ASSERT_EQ(dirs->size(), 3u);
  EXPECT_TRUE((*dirs)[0].committed);
  EXPECT_TRUE((*dirs)[1].committed);
  EXPECT_FALSE((*dirs)[2].committed);  // 300: in progress
}

// What the ckptio layout cannot name is refused before anything is written:
// arrays saved without a prefix, and two array directories that name one
// leaf. (Both were converted and committed as a step no reader accepts.)
// The twins are refused by every reader of the step: a restore filled the
// one leaf from both arrays, whichever came last winning, and returned OK.
TEST_P(EformerStepTest, ConversionToCkptioRefusesWhatItCannotName) {
  CopyOptions to_ckptio = to_ckptio_as_conv();
  auto edit = [&](const std::string& key, auto&& change) { edit_json(key, change); };
  auto nothing_converted = [&] {
    ManagerOptions o;
    o.step_format = "conv-{step}";
    auto steps = manager(o)->all_steps();
    ASSERT_TRUE(steps.ok()) << steps.status().to_string();
    EXPECT_TRUE(steps->empty());
    auto left = base_->list("conv-200/", false);
    ASSERT_TRUE(left.ok());
    EXPECT_TRUE(left->objects.empty()) << left->objects.front().key;
  };
  // "model/layers.0/kernel" names the leaf "layers.0.kernel" too.
  auto objs = base_->list("run-200/model/layers/0/kernel/", false);
  ASSERT_TRUE(objs.ok());
  for (const auto& o : objs->objects) {
    auto bytes = base_->get(o.key, 1 << 30);
    ASSERT_TRUE(bytes.ok());
    const std::string to = "run-200/model/layers.0/kernel/" + o.key.substr(std::string("run-200/model/layers/0/kernel/").size());
    ASSERT_TRUE(base_->put(to, std::as_bytes(std::span(bytes->data(), bytes->size()))).ok());
  }
  edit("run-200/tensorstore_index.json", [](nlohmann::json& j) {
    for (const auto& a : j["prefixes"]["model"])
      if (a["path"] == "model/layers/0/kernel") {
        nlohmann::json twin = a;
        twin["path"] = "model/layers.0/kernel";
        j["prefixes"]["model"].push_back(twin);
        break;
      }
  });
  const std::string twins = "arrays model/layers/0/kernel and model/layers.0/kernel of prefix model both name the "
                            "leaf layers.0.kernel";
  auto c = copy_step(*base_, *base_, 200, to_ckptio);
  EXPECT_EQ(c.status().code(), Code::kDataLoss) << c.status().to_string();
  EXPECT_NE(c.status().message().find(twins), std::string::npos) << c.status().to_string();
  nothing_converted();
  auto r = manager()->restore(200);
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find(twins), std::string::npos) << r.status().to_string();
  EXPECT_EQ(manager()->verify(200).code(), Code::kDataLoss);
  // Top-level "arrays": no prefix.
  edit("run-200/tensorstore_index.json", [](nlohmann::json& j) {
    nlohmann::json arrays = nlohmann::json::array();
    for (const auto& [prefix, list] : j["prefixes"].items())
      for (const auto& a : list)
        if (a["path"] != "model/layers.0/kernel") arrays.push_back(a);
    j.erase("prefixes");
    j["arrays"] = arrays;
  });
  ASSERT_TRUE(manager()->restore(200).ok()) << "the step itself reads";
  c = copy_step(*base_, *base_, 200, to_ckptio);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().to_string();
  EXPECT_NE(c.status().message().find("without a prefix"), std::string::npos) << c.status().to_string();
  nothing_converted();
}

// cp --format: eformer -> ckptio -> eformer, bit-exact, each end committed
// as its layout commits, read back by ckptio (and, on local disk, the last
// one by zarr-python).
TEST_P(EformerStepTest, ConvertsToCkptioAndBackBitExact) {
  CopyOptions to_ckptio = to_ckptio_as_conv();
  auto c = copy_step(*base_, *base_, 200, to_ckptio);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto b = copy_step(*base_, *base_, std::nullopt, back_to_eformer());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->step, 200);

  for (const char* format : {"conv-{step}", "back-{step}"}) {
    ManagerOptions o;
    o.step_format = format;
    auto m = manager(o);
    auto index = m->read_index(200);
    ASSERT_TRUE(index.ok()) << format << ": " << index.status().to_string();
    EXPECT_EQ(index->layout, std::string(format) == "conv-{step}" ? "ckptio" : "eformer");
    EXPECT_TRUE(m->verify(200).ok()) << format;
    auto r = m->restore(200);
    ASSERT_TRUE(r.ok()) << format << ": " << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), leaves().size());
    for (const Tensor& t : r->leaves) {
      const std::string name = t.prefix + "/" + t.path;
      EXPECT_EQ(t.dtype, leaves().at(name).dtype) << format << " " << name;
      EXPECT_TRUE(bytes_of(t.data) == expected(200, name)) << format << " " << name;
    }
  }
  // Once there, a second copy is refused without overwrite, and replaces with it.
  auto again = copy_step(*base_, *base_, 200, to_ckptio);
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists) << again.status().to_string();
  to_ckptio.overwrite = true;
  EXPECT_TRUE(copy_step(*base_, *base_, 200, to_ckptio).ok());

  if (GetParam() != Backend::kLocal) return;
  const std::string check = R"PY(
import sys, numpy as np, zarr
class Store(zarr.DirectoryStore):
    def __getitem__(self, key):
        v = super().__getitem__(key)
        return v.replace(b'"bfloat16"', b'"<u2"') if key.endswith(".zarray") else v
step, expected = sys.argv[1], sys.argv[2]
for path, name in [("model/layers/0/kernel", "model/layers.0.kernel"), ("model/layers/0/bias", "model/layers.0.bias"),
                   ("model/embed", "model/embed"), ("tx/mu/kernel", "tx/mu.kernel"), ("tx/count", "tx/count"),
                   ("tx/nu", "tx/nu")]:
    z = zarr.open_array(store=Store(step + "/" + path), mode="r")
    if np.ascontiguousarray(z[...]).tobytes() != open(expected + "/200/" + name + ".raw", "rb").read():
        sys.exit(name + " differs")
)PY";
  { std::ofstream(work_ / "check.py") << check; }
  const std::string cmd = "/usr/bin/python3 '" + (work_ / "check.py").string() + "' '" + (dir_ / "back-200").string() +
                          "' '" + (fixture_ / "expected").string() + "' >'" + (work_ / "check.log").string() + "' 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "zarr-python on what ckptio wrote: " << read_file(work_ / "check.log");
}

// A conversion into the ckptio layout writes one data file of every leaf:
// on S3 (5 MiB parts in the tests) one larger than a part must be announced
// as such, or the backend takes it for a single PUT and refuses the second
// range. Before, every such conversion on S3 failed ("a single-part object
// must be written in one range"). Back to eformer too, bit-exact.
TEST_P(EformerStepTest, AConversionLargerThanAnS3PartIsWrittenInParts) {
  ManagerOptions eo;
  eo.layout = "eformer";
  eo.step_format = "big-{step}";
  // 3 leaves of 4 MiB (random: zstd keeps their size), and an odd one.
  std::vector<std::string> bytes;
  auto random_string = [](size_t n, uint64_t seed) {
    const auto b = testutil::random_bytes(n, seed);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  for (int i = 0; i < 3; ++i) bytes.push_back(random_string(4 << 20, 300 + i));
  bytes.push_back(random_string(3 * 1001, 310));
  std::vector<LeafView> state;
  for (int i = 0; i < 3; ++i)
    state.push_back(LeafView::full("model", "w" + std::to_string(i), DType::kFloat32, {1024, 1024}, bytes[i].data()));
  state.push_back(LeafView::full("tx", "odd", DType::kUInt8, {3, 1001}, bytes[3].data()));
  auto h = manager(eo)->save(5, state);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  CopyOptions to_ckptio = to_ckptio_as_conv();
  to_ckptio.src_step_format = "big-{step}";
  auto c = copy_step(*base_, *base_, 5, to_ckptio);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto b = copy_step(*base_, *base_, 5, back_to_eformer());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  for (const char* format : {"conv-{step}", "back-{step}"}) {
    ManagerOptions o;
    o.step_format = format;
    auto r = manager(o)->restore(5);
    ASSERT_TRUE(r.ok()) << format << ": " << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), 4u);
    for (const Tensor& t : r->leaves) {
      const size_t i = t.prefix == "tx" ? 3 : static_cast<size_t>(t.path[1] - '0');
      EXPECT_TRUE(bytes_of(t.data) == bytes[i]) << format << " " << t.prefix << "/" << t.path;
    }
  }
}

// A copy must not take a step it cannot replace for absent, nor remove one
// it then fails to write. On an object store an eformer step has no atomic
// replacement (the old one goes first, format.md §7), so a conversion in
// place and a state eformer's layout cannot hold are refused before
// anything is removed; a step in eformer's layout at the destination stops
// a copy without overwrite (an index PUT would have shadowed it).
TEST_P(EformerStepTest, ACopyNeitherHidesNorRemovesAStepItCannotReplace) {
  const std::string want = expected(200, "model/embed");
  auto step_200_is_eformers = [&](const char* where) {
    auto index = manager()->read_index(200);
    ASSERT_TRUE(index.ok()) << where << ": " << index.status().to_string();
    EXPECT_EQ(index->layout, "eformer") << where;
    auto r = manager()->restore(200);
    ASSERT_TRUE(r.ok()) << where << ": " << r.status().to_string();
    for (const Tensor& t : r->leaves)
      if (t.prefix + "/" + t.path == "model/embed") EXPECT_TRUE(bytes_of(t.data) == want) << where;
  };
  // A ckptio step 200 elsewhere, copied onto run-200 (eformer's) without overwrite.
  ASSERT_TRUE(copy_step(*base_, *base_, 200, to_ckptio_as_conv()).ok());
  CopyOptions onto;
  onto.src_step_format = "conv-{step}";
  auto c = copy_step(*base_, *base_, 200, onto);
  EXPECT_EQ(c.status().code(), Code::kAlreadyExists) << c.status().to_string();
  EXPECT_NE(c.status().message().find("in the eformer layout"), std::string::npos) << c.status().to_string();
  step_200_is_eformers("after a copy without overwrite");
  onto.format = "ckptio";  // (a conversion's own check)
  EXPECT_EQ(copy_step(*base_, *base_, 200, onto).status().code(), Code::kAlreadyExists);
  step_200_is_eformers("after a conversion without overwrite");

  // Leaves eformer cannot hold side by side ("a" and "a.b": one directory
  // inside the other's), converted onto run-200 with overwrite.
  ManagerOptions co;
  co.step_format = "odd-{step}";
  const float x[2] = {1, 2};
  auto h = manager(co)->save(200, {LeafView::full("model", "a", DType::kFloat32, {2}, x),
                                   LeafView::full("model", "a.b", DType::kFloat32, {2}, x)});
  ASSERT_TRUE(h.ok() && h->wait().ok());
  CopyOptions odd;
  odd.format = "eformer";
  odd.overwrite = true;
  odd.src_step_format = "odd-{step}";
  c = copy_step(*base_, *base_, 200, odd);
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().to_string();
  EXPECT_NE(c.status().message().find("lies inside array"), std::string::npos) << c.status().to_string();
  step_200_is_eformers("after a conversion of leaves eformer cannot hold");

  // In place: run-200 onto itself, re-encoded, with overwrite.
  CopyOptions in_place;
  in_place.format = "eformer";
  in_place.overwrite = true;
  c = copy_step(*base_, *base_, 200, in_place);
  if (base_->caps().atomic_rename) {
    EXPECT_TRUE(c.ok()) << c.status().to_string();  // a stage directory, then an exchange
  } else {
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find("in place"), std::string::npos) << c.status().to_string();
  }
  step_200_is_eformers("after a conversion in place");
}

// A save in the ckptio layout onto a step committed in eformer's layout,
// without overwrite, is refused at once, as one onto a ckptio step is.
// Before, on an object store it committed, its index shadowing the eformer
// step (on a file system it failed only at the rename, its data written).
TEST_P(EformerStepTest, ASaveWithoutOverwriteDoesNotReplaceAnEformerStep) {
  const float x = 1;
  auto m = manager();
  auto h = m->save(200, {LeafView::full("model", "x", DType::kFloat32, {}, &x)});
  EXPECT_EQ(h.status().code(), Code::kAlreadyExists) << h.status().to_string();
  auto index = m->read_index(200);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  EXPECT_EQ(index->layout, "eformer");
}

// cp of the latest step, or of all, never passes over a damaged eformer
// step in silence, as for a damaged ckptio index (copy.h). Before, the
// newest step, damaged, was left out: cp copied step 100 and exited 0.
TEST_P(EformerStepTest, ACopyDoesNotPassOverADamagedEformerStep) {
  edit_json("run-200/tensorstore_index.json", [](nlohmann::json& j) {
    for (auto& a : j["prefixes"]["model"])
      if (a["path"] == "model/embed") a["shape"][0] = a["shape"][0].get<int64_t>() + 1;  // not its .zarray's
  });
  auto latest = copy_step(*base_, *base_, std::nullopt, to_ckptio_as_conv());
  EXPECT_EQ(latest.status().code(), Code::kDataLoss) << latest.status().to_string();
  auto all = copy_all_steps(*base_, *base_, to_ckptio_as_conv());
  EXPECT_EQ(all.status().code(), Code::kDataLoss) << all.status().to_string();
  ManagerOptions o;
  o.step_format = "conv-{step}";
  EXPECT_EQ(manager(o)->all_steps().value(), std::vector<int64_t>{});
}

// An index PUT whose answer was lost, and the index unreadable after: the
// step may be committed, so the conversion must leave its data file (gc
// removes it if no index names it). Before, it was deleted: the step, once
// the storage answered again, restored as data loss.
TEST_P(EformerStepTest, AConversionWhoseCommitIsUnknownLeavesItsData) {
  if (base_->caps().atomic_rename) return;  // (a file system commits with the rename, not a PUT)
  faults_->add_rule(FaultRule{.op = FaultOp::kPut, .key_substr = "conv-200/ckptio_index.json",
                              .code = Code::kUnavailable, .after = true});
  faults_->set_hook([this](FaultOp op, const std::string& key) {  // from the index PUT on, no GET of it answers
    if (op == FaultOp::kPut && key.find("conv-200/ckptio_index.json") != std::string::npos)
      faults_->add_rule(FaultRule{.op = FaultOp::kGet, .key_substr = "conv-200/ckptio_index.json",
                                  .code = Code::kUnavailable});
  });
  auto c = copy_step(*base_, *faults_, 200, to_ckptio_as_conv());
  faults_->set_hook(nullptr);
  faults_->clear_rules();
  ASSERT_FALSE(c.ok());
  ManagerOptions o;
  o.step_format = "conv-{step}";
  auto m = manager(o);
  EXPECT_NE(c.status().message().find("may or may not be committed"), std::string::npos) << c.status().to_string();
  auto r = m->restore(200);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Tensor& t : r->leaves)
    EXPECT_TRUE(bytes_of(t.data) == expected(200, t.prefix + "/" + t.path)) << t.prefix << "/" << t.path;
}

// A conversion of a ckptio step the page cache holds compresses its shards
// where they lie (Storage::view_cached, local disk only): bytes_in_place
// counts them, and the result is as bit-exact as through reads. A step on
// the device, or read through a wrapper (the fault injector), is read as
// before. A damaged byte or a short data file is still data loss, and
// leaves the step committed at the destination as it was.
// A leaf of zero elements saved as two shards (boxes [0, 0) x [0, 4) and
// [0, 0) x [4, 8)), converted into eformer's layout. Before, a source the
// page cache held (read in place, shard by shard) failed: the empty box
// [4, 8) "does not fall on chunk boundaries (chunks of 8)".
TEST_P(EformerStepTest, AConversionOfAShardedZeroSizeLeafWritesIt) {
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  const float none = 0;
  LeafView empty{"model", "empty", DType::kFloat32, {0, 8}, {}};
  empty.shards.push_back({Box{{0, 0}, {0, 4}}, &none});
  empty.shards.push_back({Box{{0, 4}, {0, 8}}, &none});
  ManagerOptions co;
  co.step_format = "conv-{step}";
  auto h = manager(co)->save(300, {empty, LeafView::full("model", "w", DType::kFloat32, {8, 8}, w.data())});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  if (GetParam() == Backend::kLocal)  // into the page cache: the conversion reads the shards in place
    for (const auto& e : fs::directory_iterator(dir_ / "conv-300"))
      if (e.path().extension() == ".bin") ASSERT_FALSE(read_file(e.path()).empty()) << e.path();
  CopyOptions back;
  back.format = "eformer";
  back.src_step_format = "conv-{step}";
  back.dst_step_format = "back-{step}";
  auto b = copy_step(*base_, *base_, 300, back);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ManagerOptions mo;
  mo.step_format = "back-{step}";
  auto r = manager(mo)->restore(300);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 2u);
  for (const Tensor& t : r->leaves) {
    if (t.path == "empty") {
      EXPECT_EQ(t.shape, (Shape{0, 8}));
      EXPECT_EQ(t.data.size(), 0u);
    } else {
      ASSERT_EQ(t.data.size(), w.size() * sizeof(float));
      EXPECT_EQ(std::memcmp(t.data.data(), w.data(), t.data.size()), 0);
    }
  }
}

TEST_P(EformerStepTest, AConversionOfACachedStepCompressesItInPlace) {
  CopyOptions to_ckptio = to_ckptio_as_conv();
  ASSERT_TRUE(copy_step(*base_, *base_, 200, to_ckptio).ok());
  const bool local = GetParam() == Backend::kLocal;
  std::vector<fs::path> files;  // conv-200's data files (local)
  if (local)
    for (const auto& e : fs::directory_iterator(dir_ / "conv-200"))
      if (e.path().extension() == ".bin") files.push_back(e.path());
  auto cache = [&] {
    for (const fs::path& f : files) ASSERT_FALSE(read_file(f).empty()) << f;
  };
  auto uncache = [&] {
    for (const fs::path& f : files) {
      const int fd = ::open(f.c_str(), O_RDONLY);
      ASSERT_GE(fd, 0) << f;
      ::fdatasync(fd);
      ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
      ::close(fd);
    }
  };
  uint64_t total = 0;
  for (const auto& [name, info] : leaves()) {
    uint64_t n = dtype_size(info.dtype);
    for (int64_t d : info.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  CopyOptions back;
  back.format = "eformer";
  back.src_step_format = "conv-{step}";
  back.dst_step_format = "back-{step}";
  ManagerOptions mo;
  mo.step_format = "back-{step}";
  auto restores_as_written = [&] {
    auto r = manager(mo)->restore(200);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), leaves().size());
    for (const Tensor& t : r->leaves)
      EXPECT_TRUE(bytes_of(t.data) == expected(200, t.prefix + "/" + t.path)) << t.prefix << "/" << t.path;
  };
  if (local) {
    ASSERT_FALSE(files.empty());
    cache();
  }
  auto b = copy_step(*base_, *base_, 200, back);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes, total);
  EXPECT_EQ(b->bytes_in_place, local ? total : 0) << "only a local step the page cache holds is read in place";
  restores_as_written();
  if (!local) return;

  back.overwrite = true;
  uncache();
  b = copy_step(*base_, *base_, 200, back);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes_in_place, 0u) << "a step on the device is read";
  cache();
  b = copy_step(*faults_, *base_, 200, back);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes_in_place, 0u) << "wrappers lend no views: their reads are what they inject faults into";
  restores_as_written();

  // One byte of the first shard flipped in the cached file.
  ManagerOptions co;
  co.step_format = "conv-{step}";
  auto index = manager(co)->read_index(200);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  const ShardRecord& first = index->prefixes.front().leaves.front().shards.front();
  const fs::path damaged = dir_ / "conv-200" / first.file;
  const std::string good = read_file(damaged);
  {
    std::string bad = good;
    bad[first.offset] = static_cast<char>(bad[first.offset] ^ 0x40);
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bad;
  }
  cache();
  auto c = copy_step(*base_, *base_, 200, back);
  EXPECT_EQ(c.status().code(), Code::kDataLoss) << c.status().to_string();
  EXPECT_NE(c.status().message().find("checksum mismatch in " + index->prefixes.front().name + "/" +
                                      index->prefixes.front().leaves.front().path),
            std::string::npos)
      << c.status().to_string();
  restores_as_written();
  // Shorter than its shards.
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 1);
  cache();
  c = copy_step(*base_, *base_, 200, back);
  EXPECT_EQ(c.status().code(), Code::kDataLoss) << c.status().to_string();
  restores_as_written();
}

// A conversion restores the source in groups of half its memory bound, the
// next group on a thread of its own while the last one is written: with a
// bound of 16 KiB the step's ~25 KB take several groups, the 12 KiB moment
// is larger than a half and goes alone into memory of its own, and both
// directions stay bit-exact. A failure on the calling thread (on_progress
// throwing, after the first group) stops the restoring thread and commits
// nothing; the copy then runs again.
TEST_P(EformerStepTest, ConvertsInGroupsOfItsMemoryBoundAndStopsCleanly) {
  for (const char* format : {"ckptio", "eformer"}) {
    SCOPED_TRACE(format);
    const std::string src = std::string(format) == "ckptio" ? "run-{step}" : "mid-{step}";
    const std::string dst = std::string(format) == "ckptio" ? "mid-{step}" : "out-{step}";
    CopyOptions o;
    o.format = format;
    o.src_step_format = src;
    o.dst_step_format = dst;
    // Object stores write in parts (5 MiB on S3) and a copy's bound holds
    // two: there the step is one group, and only the stop and the bytes are
    // checked.
    const uint64_t unit = std::max<uint64_t>(base_->write_granularity(), 4096);
    o.chunk_size = unit;
    o.max_memory = std::max<uint64_t>(16 << 10, 2 * unit);
    int calls = 0;
    o.on_progress = [&](int64_t, uint64_t done, uint64_t) {
      if (done > 0 && ++calls == 2) throw std::runtime_error("stop here");
    };
    auto stopped = copy_step(*base_, *base_, 200, o);
    EXPECT_EQ(stopped.status().code(), Code::kCancelled) << stopped.status().to_string();
    EXPECT_NE(stopped.status().message().find("stop here"), std::string::npos) << stopped.status().to_string();
    ManagerOptions mo;
    mo.step_format = dst;
    EXPECT_EQ(manager(mo)->read_index(200).status().code(), Code::kNotFound);
    std::vector<uint64_t> seen;
    uint64_t decoded = 0;  // what the progress counts to: the leaves' bytes, decoded
    for (const auto& [name, info] : leaves()) decoded += expected(200, name).size();
    o.on_progress = [&](int64_t, uint64_t done, uint64_t total) {
      EXPECT_EQ(total, decoded) << "(an eformer index's compressed sizes were the total before)";
      EXPECT_TRUE(seen.empty() || done >= seen.back());
      seen.push_back(done);
    };
    auto c = copy_step(*base_, *base_, 200, o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_GE(seen.size(), 4u);  // leaf by leaf, through several groups
    EXPECT_EQ(seen.back(), decoded);
    auto r = manager(mo)->restore(200);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), leaves().size());
    for (const Tensor& t : r->leaves) {
      const std::string name = t.prefix + "/" + t.path;
      EXPECT_TRUE(bytes_of(t.data) == expected(200, name)) << name;
    }
  }
}

// Reads the wrapped storage as if direct reads needed 4 KiB alignment, and
// notes, for every read, whether its memory agreed with its file offset
// modulo that (direct I/O then lands in place; else a bounce copy).
class PhaseRecordingStorage final : public testutil::ForwardingStorage {
 public:
  using ForwardingStorage::ForwardingStorage;
  uint64_t read_alignment() const override { return 4096; }
  Status read(std::span<const ReadRequest> requests) override {
    {
      std::lock_guard lock(mu_);
      for (const ReadRequest& r : requests)
        (((reinterpret_cast<uintptr_t>(r.dst) - r.offset) % 4096 == 0) ? in_phase_ : out_of_phase_) += 1;
    }
    return ForwardingStorage::read(requests);
  }
  std::mutex mu_;
  int in_phase_ = 0, out_of_phase_ = 0;
};

// A conversion restores a ckptio step's leaves into its two halves at
// addresses in phase with their shards' file offsets, as restore places the
// leaves it allocates: every read can land in place. At 64-byte offsets a
// leaf after one of 1000 bytes was out of phase, and the local backend
// bounced each of its bytes through scratch and copied it. Bounds of one
// group and of many.
TEST_P(EformerStepTest, AConversionReadsInPhaseWithTheFileOffsets) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<LeafView> state;
  const std::vector<int64_t> sizes = {1000, 70001, 12, 300000, 4096, 5};
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.emplace_back(static_cast<size_t>(sizes[i]));
    for (size_t k = 0; k < data[i].size(); ++k) data[i][k] = static_cast<uint8_t>(k * 131 + i * 7);
    state.push_back(LeafView::full("model", "w" + std::to_string(i), DType::kUInt8, {sizes[i]}, data[i].data()));
  }
  ManagerOptions so;
  so.step_format = "odd-{step}";
  {
    auto m = manager(so);
    auto h = m->save(3, state);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  }
  for (uint64_t memory : {uint64_t{256} << 20, uint64_t{160} << 10}) {
    SCOPED_TRACE("max_memory " + std::to_string(memory));
    auto src = std::make_shared<PhaseRecordingStorage>(base_);
    CopyOptions o;
    o.format = "eformer";
    o.src_step_format = "odd-{step}";
    o.dst_step_format = "odd-out-{step}";
    o.overwrite = true;
    const uint64_t unit = std::max<uint64_t>(base_->write_granularity(), 4096);
    o.chunk_size = unit;
    o.max_memory = std::max<uint64_t>(memory, 2 * unit);
    auto c = copy_step(*src, *base_, 3, o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_GT(src->in_phase_, 0);
    EXPECT_EQ(src->out_of_phase_, 0) << "reads into memory out of phase with the file";
    ManagerOptions mo;
    mo.step_format = "odd-out-{step}";
    auto r = manager(mo)->restore(3);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), data.size());
    for (const Tensor& t : r->leaves) {
      const size_t i = std::stoul(t.path.substr(1));
      EXPECT_TRUE(bytes_of(t.data) == std::string(data[i].begin(), data[i].end())) << t.path;
    }
  }
}

// eformer -> eformer keeps the source's chunk shapes (the device shards).
TEST_P(EformerStepTest, AConversionKeepsRegularChunkGrids) {
  CopyOptions o;
  o.format = "eformer";
  o.dst_step_format = "copy-{step}";
  ASSERT_TRUE(copy_step(*base_, *base_, 100, o).ok());
  auto z = base_->get("copy-100/model/embed/.zarray", 1 << 20);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_NE(z->find("\"chunks\":[16,16]"), std::string::npos) << *z;
  auto k = base_->get("copy-100/model/layers/0/kernel/.zarray", 1 << 20);
  ASSERT_TRUE(k.ok());
  EXPECT_NE(k->find("\"chunks\":[16,48]"), std::string::npos) << *k;
  EXPECT_NE(k->find("\"dtype\":\"bfloat16\""), std::string::npos) << *k;
  ManagerOptions mo;
  mo.step_format = "copy-{step}";
  auto r = manager(mo)->restore(100);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const Tensor& t : r->leaves)
    EXPECT_TRUE(bytes_of(t.data) == expected(100, t.prefix + "/" + t.path)) << t.path;
}

// ManagerOptions::layout "eformer": saves write eformer's layout (shards as
// chunks), in copy and borrow mode, and restore back bit-exact.
TEST_P(EformerStepTest, SavesInTheEformerLayout) {
  for (StagingMode mode : {StagingMode::kCopy, StagingMode::kBorrow}) {
    ManagerOptions o;
    o.layout = "eformer";
    o.staging = mode;
    o.step_format = mode == StagingMode::kCopy ? "copy-{step}" : "borrow-{step}";
    auto m = manager(o);
    // A [6, 8] float32 leaf as four [3, 4] shards, a scalar, a whole [5] int16 leaf.
    std::vector<float> w(48);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f - 3;
    std::vector<std::vector<float>> quarters(4, std::vector<float>(12));
    for (int q = 0; q < 4; ++q)
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 4; ++c) quarters[q][r * 4 + c] = w[((q / 2) * 3 + r) * 8 + (q % 2) * 4 + c];
    LeafView sharded{"model", "dense.kernel", DType::kFloat32, {6, 8}, {}};
    for (int q = 0; q < 4; ++q)
      sharded.shards.push_back(ShardView{Box{{(q / 2) * 3, (q % 2) * 4}, {(q / 2) * 3 + 3, (q % 2) * 4 + 4}},
                                         quarters[q].data()});
    const int32_t count = 17;
    const std::vector<int16_t> bias = {1, -2, 3, -4, 5};
    std::vector<LeafView> state = {sharded,
                                   LeafView::full("tx", "count", DType::kInt32, {}, &count),
                                   LeafView::full("model", "dense.bias", DType::kInt16, {5}, bias.data())};
    SaveOptions so;
    so.metadata_json = R"({"epoch": 3})";
    auto h = m->save(7, state, so);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
    auto index = m->read_index(7);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    EXPECT_EQ(index->layout, "eformer");
    EXPECT_NE(index->metadata_json.find("\"epoch\": 3"), std::string::npos) << index->metadata_json;
    const std::string dir = mode == StagingMode::kCopy ? "copy-7" : "borrow-7";
    auto z = base_->get(dir + "/model/dense/kernel/.zarray", 1 << 20);
    ASSERT_TRUE(z.ok()) << z.status().to_string();
    EXPECT_NE(z->find("\"chunks\":[3,4]"), std::string::npos) << *z;  // one chunk per shard, as TensorStore
    EXPECT_TRUE(m->verify(7).ok());
    auto r = m->restore(7);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), 3u);
    for (const Tensor& t : r->leaves) {
      const std::string name = t.prefix + "/" + t.path;
      if (name == "model/dense.kernel") EXPECT_EQ(std::memcmp(t.data.data(), w.data(), 48 * 4), 0) << name;
      else if (name == "tx/count") EXPECT_EQ(std::memcmp(t.data.data(), &count, 4), 0) << name;
      else EXPECT_EQ(std::memcmp(t.data.data(), bias.data(), 10), 0) << name;
    }
    // A second save of the step is refused; overwrite replaces it.
    auto again = m->save(7, state);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->wait().code(), Code::kAlreadyExists) << again->wait().to_string();
    so.overwrite = true;
    auto over = m->save(7, state, so);
    ASSERT_TRUE(over.ok());
    EXPECT_TRUE(over->wait().ok()) << over->wait().to_string();
  }
}

// Retention of steps in eformer's layout: an old step leaves the committed
// set at once (POSIX: renamed away; object stores: its metadata.json deleted,
// which is what makes an eformer step committed) and only then are its
// chunks removed, so no reader ever takes a half-removed step for complete.
TEST_P(EformerStepTest, RetentionRetiresAStepBeforeRemovingItsChunks) {
  auto faults = make_fault_storage(base_);
  std::promise<void> reached, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> armed{true};
  faults->set_hook([&](FaultOp op, const std::string& key) {
    if (op == FaultOp::kRemove && key.rfind("ret-1", 0) == 0 && key.ends_with("/") && armed.exchange(false)) {
      reached.set_value();
      go_f.wait();  // the removal of step 1's chunks holds here
    }
  });
  ManagerOptions o;
  o.layout = "eformer";
  o.max_to_keep = 1;
  o.step_format = "ret-{step}";
  CheckpointManager m(faults, o);
  std::vector<float> w(64, 1.5f);
  std::vector<LeafView> state = {LeafView::full("model", "dense.kernel", DType::kFloat32, {8, 8}, w.data())};
  for (int64_t s = 1; s <= 2; ++s) {
    auto h = m.save(s, state);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  }
  const bool held = reached.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  auto steps = m.all_steps();
  auto old = m.restore(1);
  go.set_value();
  ASSERT_TRUE(held) << "retention never removed step 1";
  ASSERT_TRUE(steps.ok()) << steps.status().to_string();
  EXPECT_EQ(*steps, std::vector<int64_t>{2}) << "step 1 still counted as committed while its chunks were removed";
  EXPECT_EQ(old.status().code(), Code::kNotFound) << old.status().to_string();
  ASSERT_TRUE(m.wait_until_finished().ok());
  faults->set_hook(nullptr);
  auto left = base_->list("ret-1", false);
  ASSERT_TRUE(left.ok()) << left.status().to_string();
  for (const auto& e : left->objects) ADD_FAILURE() << e.key << " left after retention";
  auto r = m.restore(std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 2);
}

// Leaves an eformer save once refused: shards listed with the cut edge shard
// first (a mesh's devices in another order), shards off any one grid (saved
// as one chunk), and a leaf of size 0 (zarr's chunks are at least 1).
TEST_P(EformerStepTest, SavesShardsInAnyOrderOffAGridAndEmptyLeaves) {
  ManagerOptions o;
  o.layout = "eformer";
  o.step_format = "odd-{step}";
  auto m = manager(o);
  std::vector<float> w(10);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) + 0.25f;
  auto shards_of = [&](std::vector<std::pair<int64_t, int64_t>> cuts) {
    LeafView v{"model", "", DType::kFloat32, {10}, {}};
    for (auto [a, b] : cuts) v.shards.push_back(ShardView{Box{{a}, {b}}, w.data() + a});
    return v;
  };
  LeafView edge_first = shards_of({{9, 10}, {0, 3}, {3, 6}, {6, 9}});
  edge_first.path = "edge_first";
  LeafView off_grid = shards_of({{4, 10}, {0, 4}});
  off_grid.path = "off_grid";
  LeafView empty{"model", "empty", DType::kFloat32, {0, 3}, {}};
  auto h = m->save(1, {edge_first, off_grid, empty});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  auto z = base_->get("odd-1/model/edge_first/.zarray", 1 << 20);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_NE(z->find("\"chunks\":[3]"), std::string::npos) << *z;
  z = base_->get("odd-1/model/off_grid/.zarray", 1 << 20);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_NE(z->find("\"chunks\":[10]"), std::string::npos) << *z;
  EXPECT_TRUE(m->verify(1).ok());
  auto r = m->restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 3u);
  for (const Tensor& t : r->leaves) {
    if (t.path == "empty") {
      EXPECT_EQ(t.shape, (Shape{0, 3}));
      continue;
    }
    ASSERT_EQ(t.data.size(), 40u) << t.path;
    EXPECT_EQ(std::memcmp(t.data.data(), w.data(), 40), 0) << t.path;
  }
}

// gc() with no minimum age spares the saves in flight in its own manager: an
// eformer save's stage directory too (its writer once drew an attempt id of
// its own, not the one gc spares, and gc removed the .zarray files of a save
// that then committed without them).
TEST_P(EformerStepTest, GcSparesAnEformerSaveInFlight) {
  auto faults = make_fault_storage(base_);
  std::promise<void> reached, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> armed{true};
  faults->set_hook([&](FaultOp op, const std::string& key) {
    if ((op == FaultOp::kCreate || op == FaultOp::kPut) && key.find("/model/") != std::string::npos &&
        armed.exchange(false)) {
      reached.set_value();
      go_f.wait();  // the save's first array write holds here
    }
  });
  ManagerOptions o;
  o.layout = "eformer";
  o.step_format = "gc-{step}";
  CheckpointManager m(faults, o);
  std::vector<float> w(64, 2.5f);
  std::vector<LeafView> state = {LeafView::full("model", "dense.kernel", DType::kFloat32, {8, 8}, w.data())};
  auto h = m.save(1, state);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const bool held = reached.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  Status gc = held ? m.gc({}) : Status::OK();
  go.set_value();
  ASSERT_TRUE(held) << "the save never wrote an array";
  EXPECT_TRUE(gc.ok()) << gc.to_string();
  ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  faults->set_hook(nullptr);
  EXPECT_EQ(m.all_steps().value(), std::vector<int64_t>{1});
  auto r = m.restore(1);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->leaves.size(), 1u);
  EXPECT_EQ(std::memcmp(r->leaves[0].data.data(), w.data(), w.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, EformerStepTest, testutil::all_backends(), testutil::backend_name);

// metadata.json's "timestamp" (Python's datetime.isoformat()) is outside
// data: read at fixed places, digits only, never overflowing
// (src/util/iso8601.h, S3's reader too). Before, eformer's own reader took
// "-1" as an hour (sscanf), moved February 30 into March (timegm), and a
// year past 2262 overflowed the nanoseconds (undefined behaviour).
TEST(EformerTimestamp, ReadsWhatPythonWritesAndRefusesTheRest) {
  auto parse_iso8601_ns = [](std::string_view t) { return ckptio::parse_iso8601_ns(t, TimeZones::kAny); };
  constexpr int64_t kAt = 1762078830LL * 1'000'000'000;  // 2025-11-02T10:20:30Z
  EXPECT_EQ(parse_iso8601_ns("1970-01-01T00:00:00"), 0);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30"), kAt);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30Z"), kAt);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30.123456"), kAt + 123456000);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30.123456+01:00"), kAt + 123456000 - 3600LL * 1'000'000'000);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30-00:30"), kAt + 1800LL * 1'000'000'000);
  EXPECT_EQ(parse_iso8601_ns("2025-11-02T10:20:30.1234567891"), kAt + 123456789);  // (past ns: dropped)
  EXPECT_EQ(parse_iso8601_ns("2025-11-02t10:20:60"), kAt + 30LL * 1'000'000'000);  // (a leap second)
  EXPECT_EQ(parse_iso8601_ns("2024-02-29T00:00:00"), 1709164800LL * 1'000'000'000);
  // The edges of int64 nanoseconds.
  EXPECT_EQ(parse_iso8601_ns("2262-04-11T23:47:16.854775807"), INT64_MAX);
  EXPECT_EQ(parse_iso8601_ns("2262-04-11T23:47:16.854775808"), std::nullopt);
  EXPECT_EQ(parse_iso8601_ns("2262-04-11T23:47:17"), std::nullopt);
  EXPECT_EQ(parse_iso8601_ns("2262-04-11T23:47:16-00:01"), std::nullopt);
  EXPECT_EQ(parse_iso8601_ns("1677-09-21T00:12:44"), -9223372036LL * 1'000'000'000);
  EXPECT_EQ(parse_iso8601_ns("1677-09-21T00:12:43"), std::nullopt);
  EXPECT_EQ(parse_iso8601_ns("9999-12-31T23:59:59"), std::nullopt);
  for (const char* bad : {"", "2025-11-02", "2025-11-02 10:20:30", "2025-11-02T10:20:30.", "2025-11-02T-1:20:30",
                          "2025-11-02T 1:20:30", "+025-11-02T10:20:30", "2025-02-30T00:00:00", "2023-02-29T00:00:00",
                          "2025-13-01T00:00:00", "2025-11-02T24:00:00", "2025-11-02T10:60:00", "2025-11-02T10:20:61",
                          "2025-11-02T10:20:30+1:00", "2025-11-02T10:20:30+01:60", "2025-11-02T10:20:30+01:00x",
                          "2025-11-02T10:20:30Zx", "2025-11-02T10:20:30+01"})
    EXPECT_EQ(parse_iso8601_ns(bad), std::nullopt) << bad;
}

}  // namespace
}  // namespace ckptio
