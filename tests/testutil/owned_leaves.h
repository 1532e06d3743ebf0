// A state of leaves that own their (deterministic, random) bytes, the views a
// save takes of them, and the check that a restore gave them back bit-exact.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ckptio/ckptio.h"
#include "testutil/random_bytes.h"

namespace ckptio::testutil {

// A leaf with owned random bytes.
struct OwnedLeaf {
  std::string prefix, path;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

inline OwnedLeaf make_leaf(std::string prefix, std::string path, DType dtype, Shape shape, uint64_t seed) {
  const size_t n = checked_num_bytes(shape, dtype_size(dtype)).value();
  return OwnedLeaf{std::move(prefix), std::move(path), dtype, std::move(shape), random_bytes(n, seed)};
}

// Whole-leaf views of `leaves` (they point into it: keep it alive while saving).
inline std::vector<LeafView> views(const std::vector<OwnedLeaf>& leaves) {
  std::vector<LeafView> v;
  for (const auto& l : leaves) v.push_back(LeafView::full(l.prefix, l.path, l.dtype, l.shape, l.bytes.data()));
  return v;
}

// `r` holds exactly `want`, in order: names, dtypes, shapes and bytes.
inline void expect_restored(const RestoredState& r, const std::vector<OwnedLeaf>& want) {
  ASSERT_EQ(r.leaves.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Tensor& t = r.leaves[i];
    EXPECT_EQ(t.prefix, want[i].prefix);
    EXPECT_EQ(t.path, want[i].path);
    EXPECT_EQ(t.dtype, want[i].dtype);
    EXPECT_EQ(t.shape, want[i].shape);
    ASSERT_EQ(t.data.size(), want[i].bytes.size()) << t.path;
    if (!want[i].bytes.empty())
      EXPECT_EQ(std::memcmp(t.data.data(), want[i].bytes.data(), want[i].bytes.size()), 0) << t.path;
  }
}

}  // namespace ckptio::testutil
