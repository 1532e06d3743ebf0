// Chunk geometry of a zarr v2 array: which chunks a box overlaps, each
// chunk's key and box. zarr v2 stores every chunk at its full size, edge
// chunks included (the part past the shape is padding, written with
// whatever the writer had: TensorStore the fill value, zarr-python too), so
// a chunk has two boxes: the full one, which is the layout of its decoded
// bytes, and the valid one, clipped to the shape, which holds data.
//
// Pure; O(rank) per call, except for_each_chunk (O(chunks * rank)).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"
#include "src/layout/zarr/zarray.h"

namespace ckptio::zarr {

// The chunk at grid position `index` (one entry per dimension, each below
// a.grid[d]): its key inside the array's directory ("2.0", "2/0" with the
// '/' separator; "0" for rank 0).
std::string chunk_key(const ZArray& a, std::span<const uint64_t> index);

// The grid position of a chunk key (chunk_key's inverse): decimal numbers
// without sign or leading zeros, one per dimension joined by the array's
// separator, each below its grid extent ("0" for rank 0); nullopt for any
// other name (".zattrs", a key outside the grid).
std::optional<std::vector<uint64_t>> parse_chunk_key(const ZArray& a, std::string_view key);

// The chunk's full box, [index * chunks, (index + 1) * chunks): the layout
// of its decoded bytes in C order. May extend past the shape (edge chunks).
Box chunk_box(const ZArray& a, std::span<const uint64_t> index);
// The part of chunk_box() inside the shape: the elements the chunk holds.
Box chunk_valid_box(const ZArray& a, std::span<const uint64_t> index);

// The chunks a box overlaps: grid positions [first[d], last[d]) per dimension.
struct ChunkRange {
  std::vector<uint64_t> first, last;
  uint64_t count = 0;  // product of (last - first); 0 if the box is empty
};

// The chunks `box` overlaps (a box of the array: same rank, inside the
// shape; kInvalidArgument otherwise). An empty box overlaps none; a rank-0
// array's box overlaps its one chunk.
Result<ChunkRange> chunks_overlapping(const ZArray& a, const Box& box);

// The chunk shape under which a leaf of `shape`, stored as `shards` (anything
// with a `.box`: ShardView, ShardRecord), keeps one chunk per shard: the
// largest shard's extent when every shard has it (cut by the shape at the
// far edges) and starts on a multiple of it, as a mesh sharding's device
// shards do (TensorStore's chunks), in whatever order they come; else the
// whole shape (one chunk). A dimension of size 0 gets chunks of 1, as zarr
// requires chunks of at least 1.
template <typename Shards>
Shape regular_chunk_shape(const Shape& shape, const Shards& shards) {
  Shape whole = shape;
  for (auto& d : whole) d = std::max<int64_t>(d, 1);
  if (shape.empty() || shards.empty()) return whole;
  Shape chunk(shape.size(), 0);
  for (const auto& s : shards)
    for (size_t d = 0; d < shape.size(); ++d) chunk[d] = std::max(chunk[d], s.box.stop[d] - s.box.start[d]);
  for (const auto& s : shards)
    for (size_t d = 0; d < shape.size(); ++d) {
      if (chunk[d] <= 0 || s.box.start[d] % chunk[d] != 0) return whole;
      if (s.box.stop[d] - s.box.start[d] != std::min(chunk[d], shape[d] - s.box.start[d])) return whole;
    }
  return chunk;
}

// Calls f(index) for every grid position of `range`, in C order (the last
// dimension fastest), with `index` a span of rank entries valid during the call.
// An f that returns bool stops the walk by returning false.
template <typename F>
void for_each_chunk(const ChunkRange& range, F&& f) {
  if (range.count == 0) return;
  const size_t rank = range.first.size();
  std::vector<uint64_t> idx = range.first;
  for (;;) {
    if constexpr (std::is_same_v<std::invoke_result_t<F&, std::span<const uint64_t>>, bool>) {
      if (!f(std::span<const uint64_t>(idx))) return;
    } else {
      f(std::span<const uint64_t>(idx));
    }
    size_t d = rank;
    while (d > 0) {
      --d;
      if (++idx[d] < range.last[d]) break;
      idx[d] = range.first[d];
      if (d == 0) return;
    }
    if (rank == 0) return;
  }
}

}  // namespace ckptio::zarr
