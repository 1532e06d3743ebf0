#include "src/layout/zarr/chunk_grid.h"

#include <algorithm>

namespace ckptio::zarr {

std::string chunk_key(const ZArray& a, std::span<const uint64_t> index) {
  if (index.empty()) return "0";
  std::string key;
  for (size_t d = 0; d < index.size(); ++d) {
    if (d > 0) key.push_back(a.separator);
    key += std::to_string(index[d]);
  }
  return key;
}

std::optional<std::vector<uint64_t>> parse_chunk_key(const ZArray& a, std::string_view key) {
  const size_t rank = a.shape.size();
  std::vector<uint64_t> index;
  if (rank == 0) {
    if (key != "0") return std::nullopt;
    return index;
  }
  index.reserve(rank);
  size_t at = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (d > 0) {
      if (at >= key.size() || key[at] != a.separator) return std::nullopt;
      ++at;
    }
    const size_t begin = at;
    uint64_t v = 0;
    while (at < key.size() && key[at] >= '0' && key[at] <= '9') {
      if (at - begin >= 19) return std::nullopt;  // more digits than any grid extent has
      v = v * 10 + static_cast<uint64_t>(key[at] - '0');
      ++at;
    }
    if (at == begin || (key[begin] == '0' && at - begin > 1) || v >= a.grid[d]) return std::nullopt;
    index.push_back(v);
  }
  if (at != key.size()) return std::nullopt;
  return index;
}

// parse_zarray / make_zarray proved that grid * chunks fits an int64, so a
// position below the grid gives coordinates that do too.
Box chunk_box(const ZArray& a, std::span<const uint64_t> index) {
  Box b;
  b.start.resize(index.size());
  b.stop.resize(index.size());
  for (size_t d = 0; d < index.size(); ++d) {
    b.start[d] = static_cast<int64_t>(index[d]) * a.chunks[d];
    b.stop[d] = b.start[d] + a.chunks[d];
  }
  return b;
}

Box chunk_valid_box(const ZArray& a, std::span<const uint64_t> index) {
  Box b = chunk_box(a, index);
  for (size_t d = 0; d < index.size(); ++d) b.stop[d] = std::min(b.stop[d], a.shape[d]);
  return b;
}

Result<ChunkRange> chunks_overlapping(const ZArray& a, const Box& box) {
  const size_t rank = a.shape.size();
  if (box.start.size() != rank || box.stop.size() != rank)
    return invalid_argument("zarr: a box of rank " + std::to_string(box.start.size()) + " for an array of rank " +
                            std::to_string(rank));
  ChunkRange r;
  r.first.resize(rank);
  r.last.resize(rank);
  r.count = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (box.start[d] < 0 || box.start[d] > box.stop[d] || box.stop[d] > a.shape[d])
      return invalid_argument("zarr: box [" + std::to_string(box.start[d]) + ", " + std::to_string(box.stop[d]) +
                              ") in dimension " + std::to_string(d) + " is outside the shape " +
                              shape_to_string(a.shape));
    const uint64_t c = static_cast<uint64_t>(a.chunks[d]);
    r.first[d] = static_cast<uint64_t>(box.start[d]) / c;
    r.last[d] = box.start[d] == box.stop[d] ? r.first[d] : (static_cast<uint64_t>(box.stop[d]) - 1) / c + 1;
    // Cannot overflow: the product is at most a.num_chunks.
    r.count *= r.last[d] - r.first[d];
  }
  return r;
}

}  // namespace ckptio::zarr
