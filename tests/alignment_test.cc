// Restored leaves start at a multiple of their dtype's alignment, whole or
// into a sharding, on the memory backend and on local disk (O_DIRECT, which
// lands reads in memory placed at the phase of their file offsets). Saves
// start each shard aligned in its data file; a step saved before that (a
// float64 right after a 3-byte leaf, at an odd offset) still restores
// aligned, its reads going through a bounce buffer. Before, the Python
// package handed out such leaves as numpy arrays flagged unaligned (and
// torch tensors over them).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/local/local_storage.h"
#include "backends/memory/memory_storage.h"
#include "ckptio/ckptio.h"
#include "src/layout/layout.h"

namespace ckptio {
namespace {

namespace fs = std::filesystem;

struct Leaf {
  std::string path;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

// Odd sizes first, so that packed the next leaf would start misaligned; one
// float64 leaf large enough for the phase alignment of a save (1 MiB).
std::vector<Leaf> leaves() {
  std::vector<Leaf> out = {{"a", DType::kUInt8, {3}, {}},         {"b", DType::kFloat64, {1000}, {}},
                           {"c", DType::kUInt16, {1}, {}},        {"d", DType::kFloat32, {7}, {}},
                           {"e", DType::kComplex128, {3}, {}},    {"f", DType::kUInt8, {5}, {}},
                           {"g", DType::kFloat64, {4096, 33}, {}}, {"h", DType::kInt32, {9, 2}, {}}};
  uint8_t v = 1;
  for (Leaf& l : out) {
    l.bytes.resize(checked_num_bytes(l.shape, dtype_size(l.dtype)).value());
    for (std::byte& b : l.bytes) b = static_cast<std::byte>(v = static_cast<uint8_t>(v * 73 + 11));
  }
  return out;
}

class Alignment : public ::testing::TestWithParam<bool> {  // local disk?
 protected:
  void SetUp() override {
    if (GetParam()) {
      dir_ = fs::path(::testing::TempDir()) / ("ckptio_alignment_" + std::to_string(::getpid()));
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      auto s = make_local_storage(dir_.string());
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      storage_ = *s;
    } else {
      storage_ = make_memory_storage(/*posix_like=*/true);
    }
    m_ = std::make_unique<CheckpointManager>(storage_, ManagerOptions{});
  }
  void TearDown() override {
    m_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Every leaf (whole, or each device's part) starts aligned and holds the
  // bytes saved.
  void expect_aligned(int64_t step, const std::vector<Leaf>& want) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto r = m_->restore(step);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->leaves.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const Tensor& t = r->leaves[i];
      ASSERT_EQ(t.path, want[i].path);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data.data()) % dtype_alignment(t.dtype), 0u)
          << t.path << " (" << dtype_name(t.dtype) << ") restored at an unaligned address";
      ASSERT_EQ(t.data.size(), want[i].bytes.size());
      EXPECT_EQ(std::memcmp(t.data.data(), want[i].bytes.data(), t.data.size()), 0) << t.path;
    }
    // Into a sharding: dimension 0 over two devices (row boundaries of an
    // odd leaf fall at odd offsets of the file).
    RestoreOptions o;
    RestoreOptions::Sharding& sh = o.sharding.emplace();
    sh.mesh = Mesh::parse("x=2").value();
    sh.rules = PartitionRules::compile({PartitionRule{".*", PartitionSpec::of({{"x"}})}}).value();
    sh.rule_options.min_size = 0;
    auto s = m_->restore(step, o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    for (const Tensor& t : s->leaves)
      for (const DeviceShard& d : t.device_shards)
        EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data.data()) % dtype_alignment(t.dtype), 0u)
            << t.path << " on device " << d.device_id << " restored at an unaligned address";
  }

  void save(int64_t step, const std::vector<Leaf>& state) {
    std::vector<LeafView> views;
    for (const Leaf& l : state) views.push_back(LeafView::full("p", l.path, l.dtype, l.shape, l.bytes.data()));
    auto h = m_->save(step, views);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok()) << h->wait().to_string();
  }

  fs::path dir_;
  std::shared_ptr<Storage> storage_;
  std::unique_ptr<CheckpointManager> m_;
};

TEST_P(Alignment, ShardsAreSavedAlignedAndLeavesRestoreAligned) {
  const std::vector<Leaf> want = leaves();
  ASSERT_NO_FATAL_FAILURE(save(1, want));
  auto index = m_->read_index(1);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  for (const LeafRecord& l : index->prefixes.at(0).leaves)
    for (const ShardRecord& s : l.shards)
      EXPECT_EQ(s.offset % dtype_alignment(l.dtype), 0u) << l.path << " saved at offset " << s.offset;
  expect_aligned(1, want);
}

// Step 2 as a save laid it out before shards were aligned: the same leaves
// packed end to end, its index rewritten to match.
TEST_P(Alignment, AStepWithShardsAtOddOffsetsRestoresAligned) {
  const std::vector<Leaf> want = leaves();
  ASSERT_NO_FATAL_FAILURE(save(1, want));
  auto text = storage_->get(index_key("run-1"), 1 << 20);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  nlohmann::json j = nlohmann::json::parse(*text);
  ASSERT_EQ(j["files"].size(), 1u);
  const std::string file = j["files"][0]["name"].get<std::string>();
  std::vector<std::byte> packed;
  bool odd = false;
  auto& listed = j["prefixes"]["p"];
  ASSERT_EQ(listed.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    auto& leaf = listed[i];
    const Leaf& l = want[i];
    ASSERT_EQ(leaf["path"].get<std::string>(), l.path);
    ASSERT_EQ(leaf["shards"].size(), 1u);
    leaf["shards"][0]["offset"] = packed.size();
    odd = odd || packed.size() % dtype_alignment(l.dtype) != 0;
    packed.insert(packed.end(), l.bytes.begin(), l.bytes.end());
  }
  ASSERT_TRUE(odd) << "the packed layout puts no leaf at an odd offset: the test tests nothing";
  j["files"][0]["size"] = packed.size();
  j["step"] = 2;
  ASSERT_TRUE(storage_->put("run-2/" + file, packed).ok());
  const std::string rewritten = j.dump();
  ASSERT_TRUE(storage_->put(index_key("run-2"), std::as_bytes(std::span(rewritten))).ok());
  ASSERT_TRUE(m_->verify(2).ok()) << m_->verify(2).to_string();
  expect_aligned(2, want);
}

INSTANTIATE_TEST_SUITE_P(Backends, Alignment, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Local" : "Memory"; });

}  // namespace
}  // namespace ckptio
