// A sharded state for multi-process tests: global arrays (deterministic
// bytes from a seed), each with a partition spec, and the shards one process
// of a group writes (the boxes whose lowest-id holder is one of its devices,
// devices split in contiguous blocks, as JAX does).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckptio/ckptio.h"
#include "testutil/random_bytes.h"

namespace ckptio::testutil {

// The C-order bytes of `box` cut out of a whole array.
inline std::vector<std::byte> cut_box(const std::vector<std::byte>& whole, const Shape& shape,
                                      const Box& box, size_t item) {
  const size_t r = shape.size();
  const uint64_t n = checked_num_bytes(box.extent(), item).value();
  std::vector<std::byte> out(n);
  if (n == 0) return out;
  if (r == 0) {
    std::memcpy(out.data(), whole.data(), item);
    return out;
  }
  std::vector<int64_t> idx(box.start);
  const uint64_t run = static_cast<uint64_t>(box.stop[r - 1] - box.start[r - 1]) * item;
  size_t at = 0;
  for (;;) {
    uint64_t off = 0;
    for (size_t d = 0; d < r; ++d) off = off * static_cast<uint64_t>(shape[d]) + idx[d];
    std::memcpy(out.data() + at, whole.data() + off * item, run);
    at += run;
    size_t d = r - 1;
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++idx[d] < box.stop[d]) break;
      idx[d] = box.start[d];
    }
  }
}

struct GlobalLeaf {
  std::string prefix, path;
  DType dtype;
  Shape shape;
  PartitionSpec spec;
  std::vector<std::byte> bytes;
};

// `scale` multiplies the first dimension of the two largest leaves.
inline std::vector<GlobalLeaf> global_state(uint64_t seed, int64_t scale = 1) {
  std::vector<GlobalLeaf> s;
  auto add = [&](std::string prefix, std::string path, DType dt, Shape shape, PartitionSpec spec) {
    const size_t n = checked_num_bytes(shape, dtype_size(dt)).value();
    s.push_back({prefix, path, dt, shape, spec, random_bytes(n, seed + s.size())});
  };
  add("model", "params.w", DType::kFloat32, {64 * scale, 48}, PartitionSpec::of({{"dp"}, {"tp"}}));
  add("model", "params.v", DType::kBFloat16, {16 * scale, 8, 6}, PartitionSpec::of({{"dp", "tp"}}));
  add("model", "params.bias", DType::kFloat32, {48}, PartitionSpec::of({}));  // replicated
  add("model", "params.empty", DType::kInt32, {0, 8}, PartitionSpec::of({{}, {"tp"}}));
  add("tx", "count", DType::kInt32, {}, PartitionSpec::of({}));
  return s;
}

// The shards process `p` of `procs` writes: the boxes whose lowest-id holder
// is one of its devices (devices split in contiguous blocks, as JAX does).
struct ProcessState {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<LeafView> leaves;
};

inline ProcessState process_state(const std::vector<GlobalLeaf>& state, const Mesh& mesh, int p, int procs) {
  const int64_t n = static_cast<int64_t>(mesh.num_devices());
  const int64_t lo = n * p / procs, hi = n * (p + 1) / procs;
  ProcessState out;
  out.buffers.reserve(64);
  for (const GlobalLeaf& g : state) {
    LeafView v;
    v.prefix = g.prefix;
    v.path = g.path;
    v.dtype = g.dtype;
    v.shape = g.shape;
    auto shards = unique_shards(NamedSharding{mesh, g.spec}, g.shape);
    EXPECT_TRUE(shards.ok()) << shards.status().to_string();
    for (const UniqueShard& u : *shards) {
      const uint64_t bytes = checked_num_bytes(u.box.extent(), dtype_size(g.dtype)).value();
      if (bytes == 0 || u.writer_device_id < lo || u.writer_device_id >= hi) continue;
      out.buffers.push_back(cut_box(g.bytes, g.shape, u.box, dtype_size(g.dtype)));
      v.shards.push_back(ShardView{u.box, out.buffers.back().data()});
    }
    out.leaves.push_back(std::move(v));
  }
  return out;
}

}  // namespace ckptio::testutil
