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

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ckptio/ckptio.h"
#include "src/transform/cast.h"
#include "testutil/backend_fixture.h"
#include "testutil/s3_store.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;
using testutil::Backend;

// argv[1]: the base directory to write steps into; argv[2]: where to put each
// leaf's expected bytes, <step>/<prefix>/<leaf path>.raw (C order).
constexpr const char* kWriteSteps = R"PY(
import datetime, json, os, sys
import numpy as np
import numcodecs, zarr
from zarr.storage import DirectoryStore

base, expected = sys.argv[1], sys.argv[2]

def write_array(step_dir, path, data, chunks, compressor, sep=".", dtype_name=None):
    p = os.path.join(step_dir, path)
    store = DirectoryStore(p, dimension_separator=sep)
    z = zarr.open_array(store=store, mode="w", shape=data.shape, chunks=chunks, dtype=data.dtype,
                        compressor=compressor, fill_value=None)
    z[...] = data
    meta = json.load(open(os.path.join(p, ".zarray")))
    if dtype_name:
        meta["dtype"] = dtype_name
    meta["dimension_separator"] = sep
    open(os.path.join(p, ".zarray"), "w").write(json.dumps(meta, sort_keys=True, separators=(",", ":")))

def write_step(step, complete=True):
    rng = np.random.default_rng(step)
    step_dir = os.path.join(base, "run-%d" % step)
    f32 = lambda shape: rng.standard_normal(shape).astype("<f4")
    kernel32 = f32((64, 48))
    leaves = {
        # prefix, ckptio leaf path, zarr dir, data, chunks, compressor, sep, dtype name
        "model/layers.0.kernel": ("model", "model/layers/0/kernel", (kernel32.view("<u4") >> 16).astype("<u2"),
                                  (16, 48), numcodecs.Zstd(level=1), ".", "bfloat16"),
        "model/layers.0.bias": ("model", "model/layers/0/bias", f32((48,)), (48,), numcodecs.Zstd(level=1), ".", None),
        "model/embed": ("model", "model/embed", f32((50, 30)), (16, 16), numcodecs.Zstd(level=1), "/", None),
        "tx/mu.kernel": ("tx", "tx/mu/kernel", f32((64, 48)), (32, 24), numcodecs.Blosc(), ".", None),
        "tx/count": ("tx", "tx/count", np.array(step, dtype="<i4"), (), None, ".", None),
        "tx/nu": ("tx", "tx/nu", rng.integers(0, 2**16, size=(9, 11), dtype="<u2"), (4, 4), numcodecs.Zlib(level=5),
                  "/", None),
    }
    index = {"format": "tensorstore", "version": "0.0.95", "prefixes": {}}
    for name, (prefix, path, data, chunks, comp, sep, dtype_name) in leaves.items():
        write_array(step_dir, path, data, chunks, comp, sep, dtype_name)
        index["prefixes"].setdefault(prefix, []).append(
            {"path": path, "shape": list(data.shape), "dtype": dtype_name or str(data.dtype)})
        out = os.path.join(expected, str(step), name + ".raw")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        open(out, "wb").write(np.ascontiguousarray(data).tobytes())
    open(os.path.join(step_dir, "tensorstore_index.json"), "w").write(json.dumps(index, indent=2))
    if complete:
        json.dump({"step": step, "timestamp": datetime.datetime(2025, 11, 2, 10, 0, step % 60).isoformat(),
                   "is_temporary": False}, open(os.path.join(step_dir, "metadata.json"), "w"))

write_step(100)
write_step(200)
write_step(300, complete=False)  # a save in progress: no metadata.json yet
)PY";

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

class EformerStepTest : public testutil::BackendTest {
 protected:
  EformerStepTest() : BackendTest("ckptio-eformer-") {}
  Result<std::shared_ptr<Storage>> open_remote(Backend) override {
    auto s = testutil::open_s3_test_store();
    if (!s.ok()) return s.status();
    return std::shared_ptr<Storage>(*s);
  }
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (std::system("/usr/bin/python3 -c 'import zarr, numcodecs' >/dev/null 2>&1") != 0) {
      const char* ci = std::getenv("CI");
      if (ci && *ci) FAIL() << "zarr-python is missing under CI: tools/setup-deps installs python3-zarr";
      GTEST_SKIP() << "zarr-python is missing: install python3-zarr and python3-numcodecs (tools/setup-deps does)";
    }
    work_ = fs::temp_directory_path() / ("ckptio-eformer-src-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter_++));
    fs::remove_all(work_);
    fs::create_directories(work_ / "base");
    { std::ofstream(work_ / "write.py") << kWriteSteps; }
    const std::string cmd = "/usr/bin/python3 '" + (work_ / "write.py").string() + "' '" +
                            (work_ / "base").string() + "' '" + (work_ / "expected").string() + "' >'" +
                            (work_ / "log").string() + "' 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(work_ / "log");
    // Every file, as an object of the backend under test.
    for (const auto& e : fs::recursive_directory_iterator(work_ / "base")) {
      if (!e.is_regular_file()) continue;
      const std::string key = fs::relative(e.path(), work_ / "base").generic_string();
      const std::string bytes = read_file(e.path());
      keys_.push_back(key);
      ASSERT_TRUE(base_->put(key, std::as_bytes(std::span(bytes.data(), bytes.size()))).ok()) << key;
    }
  }
  void TearDown() override {
    if (!work_.empty()) fs::remove_all(work_);
    BackendTest::TearDown();
  }
  std::unique_ptr<CheckpointManager> manager(ManagerOptions o = {}) {
    return std::make_unique<CheckpointManager>(base_, o);
  }
  std::string expected(int64_t step, const std::string& name) const {
    return read_file(work_ / "expected" / std::to_string(step) / (name + ".raw"));
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

  fs::path work_;
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

INSTANTIATE_TEST_SUITE_P(Backends, EformerStepTest, testutil::all_backends(), testutil::backend_name);

}  // namespace
}  // namespace ckptio
