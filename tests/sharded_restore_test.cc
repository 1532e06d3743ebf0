// Restore into a sharding (RestoreOptions::sharding) end to end, over the
// memory backends (POSIX-like and object-store-like) and the local io_uring
// backend: property tests (save with sharding A through sharded_leaf_view,
// restore with sharding B, compare every device buffer with the global
// array), statistics (only the needed bytes are read), partition rules,
// checksums, casts and errors. sharded_leaf_view's own cases are in
// ShardedLeafView.
//
// The property tests run a fixed list of seeds; CKPTIO_PROPERTY_SEED=N runs
// only seed N. A failure names its seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <span>
#include <string>
#include <vector>

#include "ckptio/ckptio.h"
#include "src/util/box_runs.h"
#include "src/util/populate.h"
#include "src/transform/cast.h"
#include "src/restore/restore_sharded.h"
#include "src/save/save_plan.h"
#include "testutil/backend_fixture.h"
#include "testutil/forwarding_storage.h"
#include "testutil/random_bytes.h"
#include "testutil/resident.h"

namespace ckptio {
namespace {

// ---- The global array and its boxes ---------------------------------------------

// The C-order bytes of `box` of the global array `global` of `shape`, a
// row (the last dimension's run) at a time: tests compile at -O0 under the
// sanitizers, where an element at a time took most of a test's 2 minutes.
std::vector<std::byte> box_bytes(const std::vector<std::byte>& global, const Shape& shape, size_t elem,
                                 const Box& box) {
  std::vector<std::byte> out;
  if (box_is_empty(box)) return out;
  out.resize(box_elements(box).value() * elem);
  const size_t rank = box.rank();
  if (rank == 0) {
    std::memcpy(out.data(), global.data(), elem);
    return out;
  }
  const size_t row = static_cast<size_t>(box.stop[rank - 1] - box.start[rank - 1]) * elem;
  std::vector<int64_t> idx = box.start;
  for (size_t at = 0;; at += row) {
    uint64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat = flat * static_cast<uint64_t>(shape[d]) + idx[d];
    std::memcpy(out.data() + at, global.data() + flat * elem, row);
    size_t d = rank - 1;  // the next row: every dimension but the last, in C order
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++idx[d] < box.stop[d]) break;
      idx[d] = box.start[d];
    }
  }
}

uint64_t box_nbytes(const Box& box, size_t elem) { return box_elements(box).value() * elem; }

// A leaf saved from per-device buffers (kept alive until the save is done).
struct SavedArray {
  std::string prefix, path;
  DType dtype = DType::kUInt8;
  Shape shape;
  std::vector<std::byte> global;
  std::vector<std::vector<std::byte>> device_bytes;
};

// The LeafView that saves `a` laid out as `sharding`, every device local.
LeafView save_view(SavedArray& a, const NamedSharding& sharding) {
  auto boxes = devices_indices_map(sharding, a.shape, Uneven::kPad);
  EXPECT_TRUE(boxes.ok()) << boxes.status().to_string();
  std::vector<DeviceData> local;
  a.device_bytes.clear();
  a.device_bytes.reserve(boxes->size());
  for (const DeviceBox& db : *boxes) {
    a.device_bytes.push_back(box_bytes(a.global, a.shape, dtype_size(a.dtype), db.box));
    if (a.device_bytes.back().empty()) a.device_bytes.back().resize(1);  // a non-null pointer
    local.push_back(DeviceData{db.device_id, a.device_bytes.back().data()});
  }
  std::shuffle(local.begin(), local.end(), std::mt19937_64(a.global.size()));  // order is irrelevant
  auto view = sharded_leaf_view(a.prefix, a.path, a.dtype, a.shape, sharding, local, Uneven::kPad);
  EXPECT_TRUE(view.ok()) << view.status().to_string();
  return view.ok() ? *view : LeafView{};
}

// Every device buffer of `t` against the global array, under `sharding`
// restricted to `devices` (empty: all).
void expect_device_shards(const Tensor& t, const SavedArray& a, const NamedSharding& sharding,
                          const std::vector<int64_t>& devices) {
  SCOPED_TRACE(t.prefix + "/" + t.path + " restored as " + sharding.spec.to_string() + " on " +
               sharding.mesh.to_string());
  EXPECT_EQ(t.shape, a.shape);
  EXPECT_EQ(t.data.size(), 0u);
  auto boxes = devices_indices_map(sharding, a.shape, Uneven::kPad);
  ASSERT_TRUE(boxes.ok()) << boxes.status().to_string();
  std::set<int64_t> local(devices.begin(), devices.end());
  std::vector<const DeviceBox*> want;
  for (const DeviceBox& db : *boxes)
    if (local.empty() || local.count(db.device_id)) want.push_back(&db);
  ASSERT_EQ(t.device_shards.size(), want.size());
  std::map<std::vector<int64_t>, const std::byte*> buffer_of_box;
  for (size_t i = 0; i < want.size(); ++i) {
    const DeviceShard& ds = t.device_shards[i];
    EXPECT_EQ(ds.device_id, want[i]->device_id);
    ASSERT_EQ(ds.box, want[i]->box) << "device " << ds.device_id;
    const std::vector<std::byte> expect = box_bytes(a.global, a.shape, dtype_size(t.dtype), ds.box);
    ASSERT_EQ(ds.data.size(), expect.size()) << "device " << ds.device_id;
    if (!expect.empty()) {
      EXPECT_EQ(std::memcmp(ds.data.data(), expect.data(), expect.size()), 0) << "device " << ds.device_id;
    }
    std::vector<int64_t> key(ds.box.start);
    key.insert(key.end(), ds.box.stop.begin(), ds.box.stop.end());
    auto [it, fresh] = buffer_of_box.emplace(key, ds.data.data());
    if (!fresh) {
      EXPECT_EQ(it->second, ds.data.data()) << "replicas share one buffer (device " << ds.device_id << ")";
    }
  }
}

// ---- Random meshes, specs, shapes -------------------------------------------------

Mesh random_mesh(std::mt19937_64& rng) {
  static const char* kNames[] = {"dp", "fsdp", "tp"};
  const int naxes = 1 + static_cast<int>(rng() % 3);
  std::vector<MeshAxis> axes;
  int64_t devices = 1;
  for (int i = 0; i < naxes; ++i) {
    int64_t size = 1 + static_cast<int64_t>(rng() % 4);
    while (devices * size > 12) --size;
    axes.push_back(MeshAxis{kNames[i], size});
    devices *= size;
  }
  std::shuffle(axes.begin(), axes.end(), rng);
  // Ids not in order and not 0..N-1, so that mesh order and id order differ.
  std::vector<int64_t> ids(static_cast<size_t>(devices * 2));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<size_t>(devices));
  if (rng() % 3 == 0) std::sort(ids.begin(), ids.end());
  auto mesh = Mesh::create(axes, ids);
  EXPECT_TRUE(mesh.ok()) << mesh.status().to_string();
  return *mesh;
}

PartitionSpec random_spec(std::mt19937_64& rng, const Mesh& mesh, size_t rank) {
  std::vector<std::string> unused;
  for (const MeshAxis& a : mesh.axes()) unused.push_back(a.name);
  std::shuffle(unused.begin(), unused.end(), rng);
  PartitionSpec spec;
  const size_t len = rank == 0 ? 0 : static_cast<size_t>(rng() % (rank + 1));
  for (size_t d = 0; d < len; ++d) {
    DimSharding ds;
    const int kind = static_cast<int>(rng() % 5);  // 0-1: None, 2-3: one axis, 4: a tuple
    size_t take = kind < 2 ? 0 : kind < 4 ? 1 : 2 + rng() % 2;
    take = std::min(take, unused.size());
    for (size_t k = 0; k < take; ++k) {
      ds.axes.push_back(unused.back());
      unused.pop_back();
    }
    spec.dims.push_back(ds);
  }
  return spec;
}

Shape random_shape(std::mt19937_64& rng) {
  static const int64_t kSizes[] = {1, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 16, 17, 23, 31, 64, 97};
  const size_t rank = static_cast<size_t>(rng() % 6);
  Shape shape;
  for (size_t d = 0; d < rank; ++d)
    shape.push_back(rng() % 25 == 0 ? 0 : kSizes[rng() % std::size(kSizes)]);
  // At most ~40k elements: shrink the largest dimensions.
  while (checked_num_bytes(shape).value() > 40000) {
    auto it = std::max_element(shape.begin(), shape.end());
    *it = std::max<int64_t>(1, *it / 3);
  }
  return shape;
}

DType random_dtype(std::mt19937_64& rng) {
  static const DType kTypes[] = {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                                 DType::kComplex128};
  return kTypes[rng() % std::size(kTypes)];
}

std::vector<uint64_t> property_seeds(uint64_t count) {
  if (const char* env = std::getenv("CKPTIO_PROPERTY_SEED")) return {std::strtoull(env, nullptr, 10)};
  std::vector<uint64_t> seeds;
  for (uint64_t s = 1; s <= count; ++s) seeds.push_back(s);
  return seeds;
}

// ---- Fixture: one storage per backend --------------------------------------------

using testutil::Backend;

// base_ and dir_ for the local backend: testutil/backend_fixture.h. The
// manager works on base_ itself (these tests inject no faults).
class ShardedRestore : public testutil::BackendTest {
 protected:
  ShardedRestore() : BackendTest("ckptio-sharded-") {}
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ManagerOptions o;
    o.chunk_size = 64 * 1024;
    manager_ = std::make_unique<CheckpointManager>(base_, std::move(o));
  }
  void TearDown() override {
    sharded_restore_limits() = ShardedRestoreLimits{};
    manager_.reset();
    BackendTest::TearDown();
  }

  void save(int64_t step, std::vector<SavedArray>& arrays, const std::vector<NamedSharding>& shardings,
            const SaveOptions& options = {}) {
    std::vector<LeafView> views;
    for (size_t i = 0; i < arrays.size(); ++i) views.push_back(save_view(arrays[i], shardings[i]));
    auto h = manager_->save(step, views, options);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    Status st = h->wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }

  // Flips byte `at` of the shard of leaf `path` of `step` whose box starts
  // at row `row`; *shard is its position in the index.
  void corrupt(int64_t step, const std::string& path, int64_t row, uint64_t at, size_t* shard) {
    auto index = manager_->read_index(step);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    const ShardRecord* rec = nullptr;
    for (const PrefixRecord& p : index->prefixes)
      for (const LeafRecord& l : p.leaves)
        for (size_t i = 0; i < l.shards.size(); ++i)
          if (l.path == path && l.shards[i].box.start.at(0) == row) {
            rec = &l.shards[i];
            *shard = i;
          }
    ASSERT_NE(rec, nullptr);
    const std::string key = "run-" + std::to_string(step) + "/" + rec->file;
    auto bytes = base_->get(key, 1ull << 30);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    (*bytes)[rec->offset + at] ^= 0x5a;
    Status st = base_->put(key, std::as_bytes(std::span<const char>(bytes->data(), bytes->size())));
    ASSERT_TRUE(st.ok()) << st.to_string();
  }

  std::unique_ptr<CheckpointManager> manager_;
};

SavedArray make_array(std::string path, DType dtype, Shape shape, uint64_t seed) {
  SavedArray a;
  a.prefix = "model";
  a.path = std::move(path);
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.global = testutil::random_bytes(checked_num_bytes(a.shape, dtype_size(dtype)).value(), seed);
  return a;
}

NamedSharding sharding(const std::string& mesh, std::vector<std::vector<std::string>> spec) {
  return NamedSharding{Mesh::parse(mesh).value(), PartitionSpec::of(std::move(spec))};
}

RestoreOptions::Sharding into(const NamedSharding& s, const std::vector<SavedArray>& arrays,
                              std::vector<int64_t> devices = {}) {
  RestoreOptions::Sharding r;
  r.mesh = s.mesh;
  for (const SavedArray& a : arrays) r.leaves.push_back(LeafSharding{a.prefix, a.path, a.shape, s.spec, -1});
  r.devices = std::move(devices);
  return r;
}

// ---- Property: save with sharding A, restore with sharding B ---------------------

TEST_P(ShardedRestore, PropertySaveAnyShardingRestoreAnyOther) {
  const uint64_t count = GetParam() == Backend::kLocal ? 24 : 48;
  int64_t step = 0;
  for (uint64_t seed : property_seeds(count)) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with CKPTIO_PROPERTY_SEED=" + std::to_string(seed) +
                 " --gtest_filter='*PropertySaveAnyShardingRestoreAnyOther*')");
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(GetParam()));
    // Sharding A: one mesh for the save, a spec per leaf.
    const Mesh mesh_a = random_mesh(rng);
    const size_t nleaves = 1 + rng() % 3;
    std::vector<SavedArray> arrays;
    std::vector<NamedSharding> saved_as;
    for (size_t i = 0; i < nleaves; ++i) {
      arrays.push_back(make_array("params.leaf" + std::to_string(i), random_dtype(rng), random_shape(rng),
                                  seed * 100 + i));
      saved_as.push_back(NamedSharding{mesh_a, random_spec(rng, mesh_a, arrays.back().shape.size())});
    }
    // Row bands of any width down to one element, or none.
    SaveOptions so;
    static const uint32_t kWays[] = {0, 2, 3, 8, 64};
    so.row_band_ways = kWays[rng() % std::size(kWays)];
    row_band_min_bytes() = 1 + rng() % 512;
    ASSERT_NO_FATAL_FAILURE(save(++step, arrays, saved_as, so));
    row_band_min_bytes() = kRowBandMinBytes;

    // Sharding B: another mesh, a subset of its devices, per-leaf specs
    // given explicitly or through rules.
    const Mesh mesh_b = random_mesh(rng);
    RestoreOptions o;
    RestoreOptions::Sharding& sh = o.sharding.emplace();
    sh.mesh = mesh_b;
    if (rng() % 3 != 0) {
      for (int64_t id : mesh_b.device_ids())
        if (rng() % 2) sh.devices.push_back(id);
      if (sh.devices.empty()) sh.devices.push_back(mesh_b.device_ids()[rng() % mesh_b.num_devices()]);
      std::shuffle(sh.devices.begin(), sh.devices.end(), rng);
    }
    std::vector<NamedSharding> restored_as;
    std::vector<PartitionRule> rules;
    for (const SavedArray& a : arrays) {
      restored_as.push_back(NamedSharding{mesh_b, random_spec(rng, mesh_b, a.shape.size())});
      if (rng() % 2)
        sh.leaves.push_back(LeafSharding{a.prefix, a.path, a.shape, restored_as.back().spec, -1});
      else
        rules.push_back(PartitionRule{"/" + a.path.substr(a.path.find('.') + 1) + "$", restored_as.back().spec});
    }
    auto compiled = PartitionRules::compile(rules);
    ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
    sh.rules = *compiled;
    sh.rule_options.min_size = 0;
    static const std::optional<uint64_t> kGaps[] = {std::nullopt, 0, 1, 100, 4096, 1 << 20};
    o.coalesce_gap = kGaps[rng() % std::size(kGaps)];
    o.verify = rng() % 4 != 0;
    if (rng() % 3 == 0) sharded_restore_limits() = ShardedRestoreLimits{1024 + rng() % 8192, 256 + rng() % 4096};
    else sharded_restore_limits() = ShardedRestoreLimits{};

    // Progress: on this thread, never backwards, ending at its total once.
    std::vector<std::pair<uint64_t, uint64_t>> progress;
    const std::thread::id caller = std::this_thread::get_id();
    bool other_thread = false;
    o.on_progress = [&](uint64_t done, uint64_t total) {
      other_thread |= std::this_thread::get_id() != caller;
      progress.emplace_back(done, total);
    };
    auto r = manager_->restore(step, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), arrays.size());
    EXPECT_FALSE(other_thread);
    ASSERT_FALSE(progress.empty());
    for (size_t k = 0; k < progress.size(); ++k) {
      EXPECT_EQ(progress[k].second, progress.back().second);
      EXPECT_LE(progress[k].first, progress[k].second);
      if (k > 0) EXPECT_GE(progress[k].first, progress[k - 1].first);
      if (k + 1 < progress.size()) EXPECT_LT(progress[k].first, progress[k].second);
    }
    EXPECT_EQ(progress.back().first, progress.back().second);
    EXPECT_GE(progress.back().second, r->stats.bytes_needed);  // the reads, bridging aside
    EXPECT_LE(progress.back().second, r->stats.bytes_read);
    uint64_t needed = 0;
    for (size_t i = 0; i < arrays.size(); ++i) {
      SCOPED_TRACE("saved as " + saved_as[i].spec.to_string() + " on " + mesh_a.to_string() + ", shape " +
                   shape_to_string(arrays[i].shape));
      ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], restored_as[i], sh.devices));
      std::set<std::vector<int64_t>> distinct;
      for (const DeviceShard& ds : r->leaves[i].device_shards) {
        std::vector<int64_t> key(ds.box.start);
        key.insert(key.end(), ds.box.stop.begin(), ds.box.stop.end());
        if (distinct.insert(key).second) needed += box_nbytes(ds.box, dtype_size(arrays[i].dtype));
      }
    }
    EXPECT_EQ(r->stats.bytes_needed, needed);
    EXPECT_GE(r->stats.bytes_read, r->stats.bytes_needed);
    if (needed > 0) {
      EXPECT_GE(r->stats.requests, 1u);
    }
    if (o.coalesce_gap == 0 && !o.verify) {
      EXPECT_EQ(r->stats.bytes_read, needed);  // no gaps, no widening
    }
  }
}

// ---- Statistics: only what the local boxes need is read ---------------------------

// Row bands (SaveOptions::row_band_ways): a restore that splits dimension 0
// into a number of ways the save banded for reads one range per data file,
// every byte of it needed and checked; without bands the same restore reads
// a range per leaf and saved shard, and delivers parts of shards unchecked.
TEST_P(ShardedRestore, RowBandsLetASplitOfDimensionZeroReadWholeCheckedPiecesInFewRanges) {
  // Saved on a 2x4 mesh (dim 0 over a, dim 1 over b): shards of 1/8 of each
  // leaf, 512-800 KiB, rows of 16 KiB. Restored 3 ways on dim 0 (uneven:
  // XLA's tiles), each device's rows cut through the saved shards.
  std::vector<SavedArray> arrays = {make_array("params.a", DType::kFloat32, {64, 16384}, 51),
                                    make_array("params.b", DType::kFloat32, {96, 16384}, 52),
                                    make_array("params.c", DType::kBFloat16, {100, 32768}, 53)};
  const NamedSharding saved_as = sharding("a=2,b=4", {{"a"}, {"b"}});
  const std::vector<NamedSharding> all(arrays.size(), saved_as);
  SaveOptions plain, bands;
  plain.row_band_ways = 0;  // one piece per shard
  ASSERT_EQ(bands.row_band_ways, 8u);  // the default
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, all, plain));
  ASSERT_NO_FATAL_FAILURE(save(2, arrays, all, bands));
  row_band_min_bytes() = 1;  // bands of any size
  ASSERT_NO_FATAL_FAILURE(save(3, arrays, all, bands));
  row_band_min_bytes() = kRowBandMinBytes;

  const NamedSharding three = sharding("x=3", {{"x"}});
  for (int64_t device = 0; device < 3; ++device) {
    SCOPED_TRACE("device " + std::to_string(device) + " of 3");
    RestoreOptions o;
    o.sharding = into(three, arrays, {device});
    o.coalesce_gap = 0;
    RestoreStats st[3];
    for (int64_t step = 1; step <= 3; ++step) {
      auto r = manager_->restore(step, o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      for (size_t i = 0; i < arrays.size(); ++i)
        ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], three, {device}));
      st[step - 1] = r->stats;
    }
    // Without bands: parts of large shards, unchecked, a range each.
    EXPECT_EQ(st[0].bytes_read, st[0].bytes_needed);
    EXPECT_GT(st[0].pieces_unverified, 0u);
    EXPECT_GE(st[0].requests, 8u);
    for (int b : {1, 2}) {
      SCOPED_TRACE(b == 1 ? "bands of at least 96 KiB" : "bands of any size");
      EXPECT_EQ(st[b].bytes_needed, st[0].bytes_needed);
      EXPECT_EQ(st[b].bytes_read, st[b].bytes_needed);  // whole bands, nothing else
      EXPECT_EQ(st[b].pieces_unverified, 0u);
      EXPECT_EQ(st[b].bytes_unverified, 0u);
      // Object stores serve touching reads of neighbouring leaves with one
      // request; POSIX files take a read per leaf's band group, cheap there.
      if (GetParam() == Backend::kMemoryObject)
        EXPECT_LE(st[b].requests * 3, st[0].requests) << st[b].requests << " vs " << st[0].requests;
    }
  }
  // With the default coalescing gap (1 MiB on object stores) too: a leaf's
  // plan must not bridge over other leaves' bands, which their own plans
  // read (restore_sharded plans such leaves again without gaps).
  for (const char* mesh : {"x=1", "x=3"}) {
    SCOPED_TRACE(std::string(mesh) + ", default gap");
    const NamedSharding s = sharding(mesh, {{"x"}});
    RestoreOptions o;
    o.sharding = into(s, arrays);
    auto r = manager_->restore(2, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (size_t i = 0; i < arrays.size(); ++i)
      ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], s, {}));
    EXPECT_EQ(r->stats.bytes_read, r->stats.bytes_needed);
    EXPECT_EQ(r->stats.pieces_unverified, 0u);
  }
  // Splits into other numbers of ways stay exact and bit for bit.
  for (const char* mesh : {"x=2", "x=5", "x=8", "x=11"}) {
    SCOPED_TRACE(mesh);
    const NamedSharding s = sharding(mesh, {{"x"}});
    RestoreOptions o;
    o.sharding = into(s, arrays);
    o.coalesce_gap = 0;
    auto r = manager_->restore(2, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (size_t i = 0; i < arrays.size(); ++i)
      ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], s, {}));
    EXPECT_EQ(r->stats.bytes_read, r->stats.bytes_needed);
  }
}

TEST_P(ShardedRestore, ALeafsSpecIsForItsShapeUnlessTheShapeIsTheSteps) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {8, 16}, 11)};
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=2", {{"x"}})}));
  const NamedSharding rows = sharding("y=2", {{"y"}});
  RestoreOptions o;
  o.sharding = into(rows, arrays);
  o.sharding->leaves[0].shape = {16, 16};  // computed for another step's shape
  auto r = manager_->restore(1, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is for shape [16, 16]"), std::string::npos) << r.status().to_string();
  // A caller that names specs only (the Python package) takes the step's shape.
  o.sharding->leaf_shapes_from_step = true;
  o.sharding->leaves[0].shape.clear();
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], rows, {});
}

TEST_P(ShardedRestore, ReadsOnlyTheNeededPartOfEachSavedShard) {
  // 64 x 4096 float32 (1 MiB) saved 8-way on dim 0: shards of 8 rows, 128 KiB.
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {64, 4096}, 7)};
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=8", {{"x"}})}));
  const uint64_t total = 64 * 4096 * 4;

  // One device of a 2-way split on dim 1: half of every row, 8 KiB runs 8 KiB apart.
  const NamedSharding cols = sharding("y=2", {{}, {"y"}});
  RestoreOptions o;
  o.sharding = into(cols, arrays, {0});
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], cols, {0});
  EXPECT_EQ(r->stats.bytes_needed, total / 2);
  if (GetParam() == Backend::kMemoryObject) {
    // Object stores coalesce gaps up to 1 MiB by default: fewer, larger GETs.
    EXPECT_GT(r->stats.bytes_read, total * 9 / 10);
    EXPECT_LE(r->stats.requests, 8u);
  } else {
    EXPECT_EQ(r->stats.bytes_read, total / 2);  // 4 KiB gap: no saved shard read whole
    EXPECT_EQ(r->stats.requests, 64u);
  }
  o.coalesce_gap = 0;
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->stats.bytes_read, total / 2);
  expect_device_shards(r->leaves[0], arrays[0], cols, {0});

  // Grid-aligned targets read exactly what they need.
  struct Case {
    NamedSharding s;
    std::vector<int64_t> devices;
    uint64_t needed;
  };
  const std::vector<Case> cases = {
      {sharding("x=2", {{"x"}}), {}, total},
      {sharding("x=2", {{"x"}}), {1}, total / 2},
      {sharding("a=2,b=4", {{"a"}, {"b"}}), {}, total},
      {sharding("a=2,b=4", {{"b"}}), {5}, total / 4},  // replicated over a: one local device
      {sharding("x=3", {{"x"}}), {}, total},            // uneven (kPad): 22, 22, 20 rows
      {sharding("x=3", {{"x"}}), {2}, total / 64 * 20},
      {sharding("x=1", {}), {}, total},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.s.spec.to_string() + " on " + c.s.mesh.to_string());
    RestoreOptions oc;
    oc.sharding = into(c.s, arrays, c.devices);
    oc.coalesce_gap = 4096;  // the local default, on every backend
    auto rc = manager_->restore(1, oc);
    ASSERT_TRUE(rc.ok()) << rc.status().to_string();
    expect_device_shards(rc->leaves[0], arrays[0], c.s, c.devices);
    EXPECT_EQ(rc->stats.bytes_needed, c.needed);
    EXPECT_GE(rc->stats.bytes_read, c.needed);
    EXPECT_LE(rc->stats.bytes_read, c.needed + c.needed / 50);  // read / needed <= 1.02
  }
}

// Object stores: the reads of neighbouring leaves are bridged across small
// gaps (smallest first, while everything read stays within 1.9% of the bytes
// needed) so the backend can serve them with one request; stores with cheap
// requests read exactly.
TEST_P(ShardedRestore, ObjectStoresBridgeSmallGapsBetweenLeavesWithinTheAllowance) {
  // 100 leaves of 1 x 1024 float32 (4 KiB), saved whole, back to back.
  std::vector<SavedArray> arrays;
  for (int i = 0; i < 100; ++i) arrays.push_back(make_array("w" + std::to_string(1000 + i), DType::kFloat32, {1, 1024}, i));
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, std::vector<NamedSharding>(arrays.size(), sharding("x=1", {}))));
  // Devices 0..61 of 64 column blocks: all but the last 128 bytes of each leaf.
  const NamedSharding s = sharding("y=64", {{}, {"y"}});
  std::vector<int64_t> devices;
  for (int64_t d = 0; d < 62; ++d) devices.push_back(d);
  RestoreOptions o;
  o.sharding = into(s, arrays, devices);
  o.verify = false;  // else each leaf (partly needed, 4 KiB) is read whole to check its crc
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t i = 0; i < arrays.size(); ++i) expect_device_shards(r->leaves[i], arrays[i], s, devices);
  const uint64_t needed = 100u * 3968;
  EXPECT_EQ(r->stats.bytes_needed, needed);
  if (GetParam() == Backend::kMemoryObject) {
    // Allowance needed * 19 / 1000 = 7539 bytes: 58 of the 99 gaps of 128 bytes.
    EXPECT_EQ(r->stats.bytes_read, needed + 58 * 128);
    EXPECT_EQ(r->stats.requests, 100u - 58);
  } else {
    EXPECT_EQ(r->stats.bytes_read, needed);
    EXPECT_EQ(r->stats.requests, 100u);
  }
  // Gaps wider than the coalescing gap are never bridged.
  o.coalesce_gap = 127;
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t i = 0; i < arrays.size(); ++i) expect_device_shards(r->leaves[i], arrays[i], s, devices);
  EXPECT_EQ(r->stats.bytes_read, needed);
  EXPECT_EQ(r->stats.requests, 100u);
}

// Every device of a 4-way replicated sharding gets the leaf, read once.
TEST_P(ShardedRestore, ReplicasShareOneReadAndOneBuffer) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kBFloat16, {100, 33}, 8)};
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=4", {{"x"}})}));
  const NamedSharding s = sharding("dp=4,tp=2", {{}, {"tp"}});
  RestoreOptions o;
  o.sharding = into(s, arrays);
  o.coalesce_gap = 0;
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], s, {});
  EXPECT_EQ(r->stats.bytes_needed, 100u * 33 * 2);
  EXPECT_EQ(r->stats.bytes_read, 100u * 33 * 2);
}

// ---- Partition rules ------------------------------------------------------------------

TEST_P(ShardedRestore, RulesChooseTheShardingAndNoMatchNamesTheLeaf) {
  std::vector<SavedArray> arrays = {
      make_array("params.layers.0.attn.q_proj.kernel", DType::kFloat32, {64, 48}, 11),
      make_array("params.layers.0.norm.scale", DType::kFloat32, {48}, 12),
      make_array("opt_state.count", DType::kInt32, {}, 13),
  };
  const NamedSharding whole = sharding("x=1", {});
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {whole, whole, whole}));

  const Mesh mesh = Mesh::parse("x=2,y=3").value();
  auto rules = PartitionRules::from_json(
      R"([["attn/(q|k|v)_proj/kernel", ["x", "y", "tp"]], ["norm", ["y"]], [".*", []]])");
  ASSERT_TRUE(rules.ok()) << rules.status().to_string();
  RestoreOptions o;
  o.sharding.emplace();
  o.sharding->mesh = mesh;
  o.sharding->rules = *rules;
  o.sharding->devices = {4, 1};

  // eformer's default min_size (16384): these small leaves are replicated.
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t i = 0; i < arrays.size(); ++i)
    expect_device_shards(r->leaves[i], arrays[i], NamedSharding{mesh, PartitionSpec{}}, {1, 4});

  // min_size 0: the rules apply; the 3-entry spec is trimmed to the rank.
  o.sharding->rule_options.min_size = 0;
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], NamedSharding{mesh, PartitionSpec::of({{"x"}, {"y"}})}, {1, 4});
  expect_device_shards(r->leaves[1], arrays[1], NamedSharding{mesh, PartitionSpec::of({{"y"}})}, {1, 4});
  expect_device_shards(r->leaves[2], arrays[2], NamedSharding{mesh, PartitionSpec{}}, {1, 4});

  // An explicit LeafSharding overrides the rules.
  o.sharding->leaves = {LeafSharding{"model", arrays[1].path, arrays[1].shape, PartitionSpec::of({{"x"}}), -1}};
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[1], arrays[1], NamedSharding{mesh, PartitionSpec::of({{"x"}})}, {1, 4});

  // No rule matches the norm scale (the scalar needs none under strict).
  o.sharding->leaves.clear();
  o.sharding->rules = PartitionRules::from_json(R"([["attn", []]])").value();
  r = manager_->restore(1, o);
  ASSERT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("no partition rule matches leaf 'params.layers.0.norm.scale'"),
            std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().message().find("model/params.layers.0.norm.scale"), std::string::npos);
}

// ---- Checksums ------------------------------------------------------------------------

TEST_P(ShardedRestore, CorruptedByteIsDataLossWhenThePieceIsVerifiable) {
  // 64 x 256 float32 saved 4-way on dim 0: 16 KiB shards.
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {64, 256}, 21)};
  const NamedSharding saved_as = sharding("x=4", {{"x"}});
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {saved_as}));
  // The last byte of the shard of rows 32-47 (device 2's): column 255 of row 47.
  size_t shard = 0;
  ASSERT_NO_FATAL_FAILURE(corrupt(1, "params.w", 32, 16 * 1024 - 1, &shard));
  auto index = manager_->read_index(1).value();
  const std::string file = index.prefixes[0].leaves[0].shards[shard].file;

  // Restored as saved: every piece is read whole.
  RestoreOptions o;
  o.sharding = into(saved_as, arrays);
  auto r = manager_->restore(1, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  for (const std::string& part : {std::string("model/params.w"), "shard " + std::to_string(shard), file})
    EXPECT_NE(r.status().message().find(part), std::string::npos) << part << " in " << r.status().to_string();

  // Columns 0-127 on one device: the byte is not needed, but the 16 KiB
  // pieces are widened to whole reads to be verified.
  const NamedSharding left = sharding("y=2", {{}, {"y"}});
  o.sharding = into(left, arrays, {0});
  r = manager_->restore(1, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();

  // Without verification the damaged byte comes through (and only it differs).
  o.verify = false;
  o.sharding = into(saved_as, arrays, {2});
  r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Buffer& got = r->leaves[0].device_shards.at(0).data;
  std::vector<std::byte> want = box_bytes(arrays[0].global, arrays[0].shape, 4, r->leaves[0].device_shards[0].box);
  ASSERT_EQ(got.size(), want.size());
  want.back() ^= std::byte{0x5a};
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
}

// Restore-latest by a process that builds part of a sharding (a subset of
// the devices, or one of a process group) does not skip a step whose data
// it finds damaged: the processes reading other bytes would restore it, and
// the group would go on from two steps. The whole mesh in one process
// skips it, as a single-process restore-latest does.
TEST_P(ShardedRestore, RestoreLatestOfPartOfAShardingDoesNotSkipDamagedData) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {64, 256}, 31)};
  const NamedSharding saved_as = sharding("x=4", {{"x"}});
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {saved_as}));
  ASSERT_NO_FATAL_FAILURE(save(2, arrays, {saved_as}));
  size_t shard = 0;
  ASSERT_NO_FATAL_FAILURE(corrupt(2, "params.w", 32, 5, &shard));  // device 2's rows

  RestoreOptions o;
  o.sharding = into(saved_as, arrays, {2});
  auto r = manager_->restore(std::nullopt, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("step 2 is damaged in the bytes this process reads"), std::string::npos)
      << r.status().to_string();
  // Device 0 finds no damage in step 2 and restores it: what device 2's
  // process would have missed had it skipped to step 1.
  o.sharding = into(saved_as, arrays, {0});
  r = manager_->restore(std::nullopt, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 2);
  // A member of a process group: the same, whatever devices it names.
  ManagerOptions member;
  member.processes.index = 1;
  member.processes.count = 2;
  member.processes.run_id = "restore-latest-test";
  CheckpointManager grouped(base_, member);
  o.sharding = into(saved_as, arrays);
  r = grouped.restore(std::nullopt, o);
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  // The whole mesh in one process: skipped, step 1 restored.
  r = manager_->restore(std::nullopt, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 1);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].step, 2);
}

// A saved shard larger than verify_widen_max_bytes that is needed only in
// part is delivered without a checksum check, and the statistics say so;
// with verify_widen_max_bytes = UINT64_MAX it is read whole and checked.
TEST_P(ShardedRestore, PartlyNeededLargeShardsAreCountedUnverifiedOrReadWholeToCheckThem) {
  // 64 x 4096 float32 saved 8-way on dim 0: 8 shards of 128 KiB.
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {64, 4096}, 41)};
  const NamedSharding saved_as = sharding("x=8", {{"x"}});
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {saved_as}));
  const uint64_t total = 64 * 4096 * 4;
  const NamedSharding cols = sharding("y=2", {{}, {"y"}});  // device 0: columns 0-2047 of every row

  RestoreOptions o;
  o.sharding = into(cols, arrays, {0});
  o.coalesce_gap = 0;
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], cols, {0});
  EXPECT_EQ(r->stats.bytes_read, total / 2);
  EXPECT_EQ(r->stats.pieces_unverified, 8u);
  EXPECT_EQ(r->stats.bytes_unverified, total / 2);

  RestoreOptions whole = o;
  whole.verify_widen_max_bytes = UINT64_MAX;
  r = manager_->restore(1, whole);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_device_shards(r->leaves[0], arrays[0], cols, {0});
  EXPECT_EQ(r->stats.bytes_read, total);
  EXPECT_EQ(r->stats.pieces_unverified, 0u);
  EXPECT_EQ(r->stats.bytes_unverified, 0u);

  RestoreOptions as_saved;
  as_saved.sharding = into(saved_as, arrays);
  r = manager_->restore(1, as_saved);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->stats.pieces_unverified, 0u);

  // A damaged byte that device 0 needs (row 3, column 5).
  size_t shard = 0;
  ASSERT_NO_FATAL_FAILURE(corrupt(1, "params.w", 0, (3 * 4096 + 5) * 4, &shard));
  r = manager_->restore(1, o);  // unchecked: the damage comes through, counted
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->stats.pieces_unverified, 8u);
  const Buffer& got = r->leaves[0].device_shards.at(0).data;
  std::vector<std::byte> want = box_bytes(arrays[0].global, arrays[0].shape, 4, r->leaves[0].device_shards[0].box);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_NE(std::memcmp(got.data(), want.data(), want.size()), 0);
  r = manager_->restore(1, whole);  // read whole: caught
  ASSERT_EQ(r.status().code(), Code::kDataLoss) << r.status().to_string();
  EXPECT_NE(r.status().message().find("model/params.w"), std::string::npos) << r.status().to_string();
}

// ---- Casts --------------------------------------------------------------------------

TEST_P(ShardedRestore, FloatDtypeCastsEveryDeviceBuffer) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {30, 10}, 31)};
  for (size_t i = 0; i < arrays[0].global.size(); i += 4) {  // finite floats
    const float f = static_cast<float>(i) * 0.37f - 100.0f;
    std::memcpy(&arrays[0].global[i], &f, 4);
  }
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=3", {{"x"}})}));
  const NamedSharding s = sharding("a=2,b=2", {{"a"}});
  RestoreOptions o;
  o.sharding = into(s, arrays);
  o.float_dtype = DType::kBFloat16;
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tensor& t = r->leaves[0];
  EXPECT_EQ(t.dtype, DType::kBFloat16);
  ASSERT_EQ(t.device_shards.size(), 4u);
  for (const DeviceShard& ds : t.device_shards) {
    std::vector<std::byte> f32 = box_bytes(arrays[0].global, arrays[0].shape, 4, ds.box);
    const uint64_t n = f32.size() / 4;
    std::vector<std::byte> bf16(n * 2);
    ASSERT_TRUE(cast_elements(DType::kFloat32, DType::kBFloat16, f32.data(), bf16.data(), n).ok());
    ASSERT_EQ(ds.data.size(), bf16.size());
    EXPECT_EQ(std::memcmp(ds.data.data(), bf16.data(), bf16.size()), 0) << "device " << ds.device_id;
  }
  EXPECT_EQ(t.device_shards[0].data.data(), t.device_shards[1].data.data());  // replicas over b
  EXPECT_NE(t.device_shards[0].data.data(), t.device_shards[2].data.data());
}

// Reads are cut at most staging_bytes long: a cut inside an element of a
// leaf being cast dropped its bytes (the first piece cast whole elements
// only) and shifted every element after it. Cuts now fall on multiples of
// 64 bytes from a read's start, a whole element of any dtype.
TEST_P(ShardedRestore, ACastLeafReadInPiecesOfAnOddSizeIsCastWhole) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {500}, 37)};
  for (size_t i = 0; i < arrays[0].global.size(); i += 4) {  // finite floats
    const float f = static_cast<float>(i) * 0.37f - 100.0f;
    std::memcpy(&arrays[0].global[i], &f, 4);
  }
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=1", {{}})}));
  sharded_restore_limits() = ShardedRestoreLimits{4096, 1001};
  struct Reset {
    ~Reset() { sharded_restore_limits() = ShardedRestoreLimits{}; }
  } reset;
  const NamedSharding s = sharding("a=1", {{}});
  RestoreOptions o;
  o.sharding = into(s, arrays);
  o.float_dtype = DType::kBFloat16;
  o.coalesce_gap = 0;
  auto r = manager_->restore(1, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const DeviceShard& ds = r->leaves[0].device_shards.at(0);
  std::vector<std::byte> bf16(500 * 2);
  ASSERT_TRUE(cast_elements(DType::kFloat32, DType::kBFloat16, arrays[0].global.data(), bf16.data(), 500).ok());
  ASSERT_EQ(ds.data.size(), bf16.size());
  EXPECT_EQ(std::memcmp(ds.data.data(), bf16.data(), bf16.size()), 0);
}

// Fixes first_touch_traps() for the scope of a test, then lets the probe decide again.
struct FirstTouchIs {
  explicit FirstTouchIs(bool traps) { set_first_touch_traps_for_testing(traps); }
  ~FirstTouchIs() { set_first_touch_traps_for_testing(std::nullopt); }
};

// Holds every read back until this process's resident memory has grown by
// `grow` bytes since the first read arrived, or for 1 s (memory the heap
// reuses is resident already): memory that no read has landed in yet is
// faulted in only by a thread that does it ahead of the reads.
class ReadsWaitForResidentGrowth final : public testutil::ForwardingStorage {
 public:
  ReadsWaitForResidentGrowth(std::shared_ptr<Storage> inner, uint64_t grow)
      : ForwardingStorage(std::move(inner)), grow_(grow) {}
  Status read(std::span<const ReadRequest> requests) override {
    {
      std::unique_lock lock(mu_);
      if (!started_) {
        started_ = true;
        const uint64_t at = testutil::resident_bytes();
        // (5 s: on two cores shared with a build and an ASan suite, 1 s once
        // passed before the faulting thread ran, 2026-12-02.)
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (testutil::resident_bytes() < at + grow_ && std::chrono::steady_clock::now() < deadline) {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          lock.lock();
        }
        open_ = true;
        opened_.notify_all();
      }
      opened_.wait(lock, [&] { return open_; });
    }
    return ForwardingStorage::read(requests);
  }

 private:
  const uint64_t grow_;
  std::mutex mu_;
  std::condition_variable opened_;
  bool started_ = false, open_ = false;
};

// A restore into a sharding faults the device buffers that copies fill (a
// cast: every read is staged, then converted into its buffer) in on a
// thread of its own while the reads land (RestoreOptions::prefault). With
// the reads held back until memory grows, only that thread can grow it: it
// must have faulted some in (RestoreStats::bytes_prefaulted > 0), no more
// than the buffers hold. Buffers that reads land in directly are left to
// the reads where a first touch is cheap (faulting them ahead measured
// slower there: docs/restart.md), as this test makes it. The bytes are the
// saved ones either way, and with prefault off nothing is faulted ahead.
TEST_P(ShardedRestore, PrefaultsTheDeviceBuffersCopiesFillAndIsOffOnRequest) {
  std::vector<std::byte> probe(8192);
  if (!populate_for_write(probe.data(), probe.size()))
    GTEST_SKIP() << "SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  FirstTouchIs cheap(false);
  std::vector<SavedArray> arrays = {make_array("params.a", DType::kFloat32, {256, 4096}, 61),   // 4 MiB
                                    make_array("params.b", DType::kFloat32, {512, 1024}, 62)};  // 2 MiB
  const NamedSharding saved_as = sharding("dp=8", {{"dp"}});  // a file per process, rows of every leaf
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {saved_as, saved_as}));
  for (const char* mesh : {"x=1", "x=3"}) {
    const NamedSharding s = sharding(mesh, {{"x"}});
    for (bool cast : {true, false})
      for (bool prefault : {true, false}) {
        SCOPED_TRACE(std::string(mesh) + (cast ? ", cast to bfloat16" : ", as saved") +
                     (prefault ? ", prefault" : ", prefault off"));
        RestoreOptions o;
        o.sharding = into(s, arrays);
        o.prefault = prefault;
        if (cast) o.float_dtype = DType::kBFloat16;
        std::optional<CheckpointManager> gated;
        if (cast && prefault && std::string(mesh) == "x=1")
          gated.emplace(std::make_shared<ReadsWaitForResidentGrowth>(base_, 192u << 10), ManagerOptions{});
        auto r = (gated ? *gated : *manager_).restore(1, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        uint64_t allocated = 0;
        for (size_t i = 0; i < arrays.size(); ++i) {
          if (!cast) {
            ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], s, {}));
          } else {
            for (const DeviceShard& ds : r->leaves[i].device_shards) {
              std::vector<std::byte> f32 = box_bytes(arrays[i].global, arrays[i].shape, 4, ds.box);
              std::vector<std::byte> bf16(f32.size() / 2);
              ASSERT_TRUE(cast_elements(DType::kFloat32, DType::kBFloat16, f32.data(), bf16.data(),
                                        f32.size() / 4).ok());
              ASSERT_EQ(ds.data.size(), bf16.size());
              EXPECT_EQ(std::memcmp(ds.data.data(), bf16.data(), bf16.size()), 0) << "device " << ds.device_id;
            }
          }
          for (const DeviceShard& ds : r->leaves[i].device_shards) allocated += ds.data.size();  // no replicas
        }
        EXPECT_LE(r->stats.bytes_prefaulted, allocated);
        if (gated) EXPECT_GT(r->stats.bytes_prefaulted, 0u) << "the reads waited for a thread faulting ahead";
        if (!prefault || !cast) EXPECT_EQ(r->stats.bytes_prefaulted, 0u);
      }
  }
}

// Where the first load of a freshly faulted page traps to the host
// (first_touch_traps(): a PVM guest), the buffers reads land in directly are
// faulted in ahead too, so that the checksum thread does not take every
// trap: with the reads held back until memory grows, the thread must have
// faulted some in. Where it does not, they are left to the reads.
TEST_P(ShardedRestore, PrefaultsTheBuffersReadsLandInOnlyWhereTheFirstTouchTraps) {
  std::vector<std::byte> probe(8192);
  if (!populate_for_write(probe.data(), probe.size()))
    GTEST_SKIP() << "SKIPPED: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  std::vector<SavedArray> arrays = {make_array("params.a", DType::kFloat32, {256, 4096}, 63),   // 4 MiB
                                    make_array("params.b", DType::kFloat32, {512, 1024}, 64)};  // 2 MiB
  const NamedSharding saved_as = sharding("dp=8", {{"dp"}});
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {saved_as, saved_as}));
  const NamedSharding s = sharding("x=1", {{"x"}});
  for (bool traps : {true, false}) {
    SCOPED_TRACE(traps ? "the first touch traps" : "the first touch is cheap");
    FirstTouchIs first_touch(traps);
    RestoreOptions o;
    o.sharding = into(s, arrays);
    CheckpointManager gated(std::make_shared<ReadsWaitForResidentGrowth>(base_, 192u << 10), ManagerOptions{});
    auto r = gated.restore(1, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (size_t i = 0; i < arrays.size(); ++i)
      ASSERT_NO_FATAL_FAILURE(expect_device_shards(r->leaves[i], arrays[i], s, {}));
    if (traps) {
      EXPECT_GT(r->stats.bytes_prefaulted, 0u) << "the reads waited for a thread faulting ahead";
      EXPECT_LE(r->stats.bytes_prefaulted, (4u << 20) + (2u << 20));
    } else {
      EXPECT_EQ(r->stats.bytes_prefaulted, 0u);
    }
  }
}

// ---- Errors ---------------------------------------------------------------------------

TEST_P(ShardedRestore, BadShardingOptionsAreRefusedNamingTheProblem) {
  std::vector<SavedArray> arrays = {make_array("params.w", DType::kFloat32, {64, 8}, 41)};
  ASSERT_NO_FATAL_FAILURE(save(1, arrays, {sharding("x=2", {{"x"}})}));
  const NamedSharding s = sharding("x=2", {{"x"}});
  auto expect_invalid = [&](const RestoreOptions& o, const std::string& part) {
    auto r = manager_->restore(1, o);
    ASSERT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().to_string();
  };
  RestoreOptions o;
  o.sharding = into(s, arrays, {5});
  expect_invalid(o, "device 5 is not in the mesh");
  o.sharding = into(s, arrays, {1, 1});
  expect_invalid(o, "device 1 is listed twice");
  o.sharding = into(s, arrays);
  o.sharding->leaves[0].shape = {64, 9};
  expect_invalid(o, "model/params.w");
  o.sharding = into(sharding("x=3", {{"x"}}), arrays);
  o.sharding->uneven = Uneven::kReject;
  expect_invalid(o, "model/params.w");
  o.sharding = into(sharding("x=2", {{"y"}}), arrays);
  expect_invalid(o, "model/params.w");
  o.sharding = into(s, arrays);
  float dst[64 * 8];
  o.into = {RestoreOptions::Destination{"model", "params.w", dst, sizeof(dst)}};
  expect_invalid(o, "into");
  // A `leaves` entry for a leaf the step lacks (misspelt) is refused, naming
  // it, rather than leaving the leaf to the rules in silence; one for a leaf
  // the step has but `select` leaves out is not.
  o = RestoreOptions{};
  o.sharding = into(s, arrays);
  o.sharding->leaves.push_back(LeafSharding{"model", "params.wq", {64, 8}, PartitionSpec::of({{"x"}}), -1});
  expect_invalid(o, "`leaves` names model/params.wq, which step 1 does not have");
  o.sharding = into(s, arrays);
  o.select.path_regex = "^nothing$";
  EXPECT_TRUE(manager_->restore(1, o).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardedRestore, testutil::local_backends(), testutil::backend_name);

// ---- sharded_leaf_view ------------------------------------------------------------------

TEST(ShardedLeafView, OneShardPerDistinctBoxFromItsLowestIdHolder) {
  // x=2, y=2 with ids [7, 3, 5, 1]; P("x"): boxes [0:2] on 7, 3 and [2:4] on 5, 1.
  const NamedSharding s{Mesh::create({{"x", 2}, {"y", 2}}, {7, 3, 5, 1}).value(), PartitionSpec::of({{"x"}})};
  char b7, b3, b5, b1;
  auto all = sharded_leaf_view("model", "w", DType::kUInt8, {4}, s,
                               {{7, &b7}, {3, &b3}, {5, &b5}, {1, &b1}});
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_EQ(all->shards.size(), 2u);
  EXPECT_EQ(all->shards[0].box, (Box{{0}, {2}}));
  EXPECT_EQ(all->shards[0].data, &b3);
  EXPECT_EQ(all->shards[1].box, (Box{{2}, {4}}));
  EXPECT_EQ(all->shards[1].data, &b1);
  EXPECT_EQ(all->prefix, "model");
  EXPECT_EQ(all->shape, Shape{4});

  // A process with devices 7 and 5 writes nothing: 3 and 1 are the writers.
  auto none = sharded_leaf_view("model", "w", DType::kUInt8, {4}, s, {{7, &b7}, {5, &b5}});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->shards.empty());
}

TEST(ShardedLeafView, EmptyBoxesAreSkipped) {
  // 5 over 4 under kPad: [0:2] [2:4] [4:5] [5:5].
  const NamedSharding s{Mesh::parse("x=4").value(), PartitionSpec::of({{"x"}})};
  char d[4];
  std::vector<DeviceData> local = {{0, &d[0]}, {1, &d[1]}, {2, &d[2]}, {3, &d[3]}};
  auto v = sharded_leaf_view("model", "w", DType::kUInt8, {5}, s, local, Uneven::kPad);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  ASSERT_EQ(v->shards.size(), 3u);
  EXPECT_EQ(v->shards[2].box, (Box{{4}, {5}}));
  EXPECT_EQ(sharded_leaf_view("model", "w", DType::kUInt8, {5}, s, local).status().code(),
            Code::kInvalidArgument);  // kReject by default

  // A leaf without elements has only empty boxes: no shards, which save() accepts.
  auto e = sharded_leaf_view("model", "w", DType::kUInt8, {0, 3}, s, local);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_TRUE(e->shards.empty());
}

TEST(ShardedLeafView, RefusesUnknownDuplicateAndNullDevices) {
  const NamedSharding s{Mesh::parse("x=2").value(), PartitionSpec::of({{"x"}})};
  char d[2];
  auto unknown = sharded_leaf_view("model", "w", DType::kUInt8, {4}, s, {{2, &d[0]}});
  EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("device 2 is not in the mesh"), std::string::npos)
      << unknown.status().to_string();
  auto twice = sharded_leaf_view("model", "w", DType::kUInt8, {4}, s, {{1, &d[0]}, {1, &d[1]}});
  EXPECT_EQ(twice.status().code(), Code::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos);
  auto null = sharded_leaf_view("model", "w", DType::kUInt8, {4}, s, {{0, nullptr}});
  EXPECT_EQ(null.status().code(), Code::kInvalidArgument);
  EXPECT_NE(null.status().message().find("null buffer"), std::string::npos);
  auto bad_axis = sharded_leaf_view("model", "w", DType::kUInt8, {4},
                                    NamedSharding{s.mesh, PartitionSpec::of({{"y"}})}, {{0, &d[0]}});
  EXPECT_EQ(bad_axis.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad_axis.status().message().find("model/w"), std::string::npos);
}

}  // namespace
}  // namespace ckptio
