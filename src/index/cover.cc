// The exact-cover check of a leaf's shards (check_exact_cover, which
// check_leaf in checks.cc ends with). docs/format.md is the contract: §2.3
// states the rule, §3.4 how it is verified.
//
// The non-empty shard boxes of a leaf must partition its shape. Every box is
// already inside the shape, so that holds exactly when their volumes sum to
// the leaf's and no two of them intersect. The intersection test picks an
// algorithm by how many dimensions the boxes actually split (dimensions that
// every box spans whole cannot separate two boxes):
//   - few boxes: pairwise;
//   - one split dimension: sort by start, compare neighbours, O(n log n);
//   - two: sweep along one with an ordered set of the other's intervals,
//     O(n log n);
//   - three or more: mark the cells of the coordinate-compressed grid. Grid
//     layouts (what sharding produces) have exactly n cells; irregular
//     layouts beyond kMaxGridCells cells are refused as unverifiable.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "src/index/index_internal.h"

namespace ckptio::index_internal {
namespace {

constexpr size_t kPairwiseBoxes = 16;
constexpr uint64_t kMaxGridCells = 1ull << 27;  // a 16 MiB bitmap

struct OverlapCheck {
  enum Kind { kNone, kOverlap, kTooIrregular } kind = kNone;
  size_t a = 0, b = 0;  // positions in the box list, for kOverlap
};

bool intersects(const Box& x, const Box& y) {
  for (size_t d = 0; d < x.rank(); ++d)
    if (std::max(x.start[d], y.start[d]) >= std::min(x.stop[d], y.stop[d])) return false;
  return true;
}

OverlapCheck overlap_pairwise(const std::vector<const Box*>& boxes) {
  for (size_t i = 0; i < boxes.size(); ++i)
    for (size_t j = i + 1; j < boxes.size(); ++j)
      if (intersects(*boxes[i], *boxes[j])) return {OverlapCheck::kOverlap, i, j};
  return {};
}

OverlapCheck overlap_1d(const std::vector<const Box*>& boxes, size_t d) {
  std::vector<size_t> order(boxes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return boxes[x]->start[d] < boxes[y]->start[d]; });
  for (size_t i = 1; i < order.size(); ++i)
    if (boxes[order[i - 1]]->stop[d] > boxes[order[i]]->start[d])
      return {OverlapCheck::kOverlap, order[i - 1], order[i]};
  return {};
}

// Sweeps dimension x; the boxes open at each x must have disjoint y
// intervals, kept in a map from y start to box.
OverlapCheck overlap_2d(const std::vector<const Box*>& boxes, size_t x, size_t y) {
  struct Event {
    int64_t at;
    bool open;  // closes sort first: boxes are half-open
    size_t box;
  };
  std::vector<Event> events;
  events.reserve(2 * boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    events.push_back({boxes[i]->start[x], true, i});
    events.push_back({boxes[i]->stop[x], false, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& p, const Event& q) {
    return p.at != q.at ? p.at < q.at : p.open < q.open;
  });
  std::map<int64_t, size_t> open;
  for (const Event& e : events) {
    const Box& b = *boxes[e.box];
    if (!e.open) {
      open.erase(b.start[y]);
      continue;
    }
    auto next = open.lower_bound(b.start[y]);
    if (next != open.end() && next->first < b.stop[y])
      return {OverlapCheck::kOverlap, next->second, e.box};
    if (next != open.begin()) {
      auto prev = std::prev(next);
      if (boxes[prev->second]->stop[y] > b.start[y])
        return {OverlapCheck::kOverlap, prev->second, e.box};
    }
    open.emplace_hint(next, b.start[y], e.box);
  }
  return {};
}

OverlapCheck overlap_grid(const std::vector<const Box*>& boxes, const Shape& shape,
                          const std::vector<size_t>& dims) {
  const size_t r = dims.size();
  std::vector<std::vector<int64_t>> cuts(r);
  uint64_t cells = 1;
  for (size_t k = 0; k < r; ++k) {
    auto& c = cuts[k];
    c.reserve(2 * boxes.size() + 2);
    c.push_back(0);
    c.push_back(shape[dims[k]]);
    for (const Box* b : boxes) {
      c.push_back(b->start[dims[k]]);
      c.push_back(b->stop[dims[k]]);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (__builtin_mul_overflow(cells, c.size() - 1, &cells) || cells > kMaxGridCells)
      return {OverlapCheck::kTooIrregular};
  }
  std::vector<uint64_t> marked((cells + 63) / 64);
  std::vector<size_t> lo(r), hi(r), idx(r);
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t k = 0; k < r; ++k) {
      const auto& c = cuts[k];
      lo[k] = std::lower_bound(c.begin(), c.end(), boxes[i]->start[dims[k]]) - c.begin();
      hi[k] = std::lower_bound(c.begin(), c.end(), boxes[i]->stop[dims[k]]) - c.begin();
    }
    idx = lo;
    while (true) {  // every cell of the box, odometer order
      uint64_t cell = 0;
      for (size_t k = 0; k < r; ++k) cell = cell * (cuts[k].size() - 1) + idx[k];
      uint64_t& word = marked[cell / 64];
      const uint64_t bit = 1ull << (cell % 64);
      if (word & bit) {  // find who marked it first: one linear scan
        for (size_t j = 0; j < i; ++j)
          if (intersects(*boxes[j], *boxes[i])) return {OverlapCheck::kOverlap, j, i};
        return {OverlapCheck::kOverlap, i, i};  // unreachable
      }
      word |= bit;
      size_t k = r;
      while (k > 0 && ++idx[k - 1] == hi[k - 1]) {
        idx[k - 1] = lo[k - 1];
        --k;
      }
      if (k == 0) break;
    }
  }
  return {};
}

OverlapCheck find_overlap(const std::vector<const Box*>& boxes, const Shape& shape) {
  if (boxes.size() <= kPairwiseBoxes) return overlap_pairwise(boxes);
  std::vector<size_t> split;  // dimensions some box does not span whole
  for (size_t d = 0; d < shape.size(); ++d)
    for (const Box* b : boxes)
      if (b->start[d] != 0 || b->stop[d] != shape[d]) {
        split.push_back(d);
        break;
      }
  switch (split.size()) {
    case 0: return {OverlapCheck::kOverlap, 0, 1};  // all whole; n > 1
    case 1: return overlap_1d(boxes, split[0]);
    case 2: return overlap_2d(boxes, split[0], split[1]);
    default: return overlap_grid(boxes, shape, split);
  }
}

}  // namespace

std::optional<Problem> check_exact_cover(const LeafRecord& leaf, bool partial) {
  const uint64_t volume = *checked_num_bytes(leaf.shape);  // fits: checked with the itemsize
  if (leaf.shards.size() == 1 && box_volume(leaf.shards[0].box) == volume) return std::nullopt;
  uint64_t covered = 0;
  std::vector<const Box*> boxes;
  std::vector<size_t> shard_of;  // box list position -> shard index
  for (size_t i = 0; i < leaf.shards.size(); ++i) {
    const uint64_t v = box_volume(leaf.shards[i].box);
    if (v == 0) continue;
    if (__builtin_add_overflow(covered, v, &covered) || covered > volume)
      return Problem{"[" + std::to_string(i) + "]",
                     "shards overlap: the boxes up to here hold more than the leaf's " +
                         std::to_string(volume) + " elements"};
    boxes.push_back(&leaf.shards[i].box);
    shard_of.push_back(i);
  }
  if (covered < volume && !partial)
    return Problem{"", "shards leave a hole: their boxes hold " + std::to_string(covered) +
                           " of the leaf's " + std::to_string(volume) + " elements"};
  const OverlapCheck o = find_overlap(boxes, leaf.shape);
  switch (o.kind) {
    case OverlapCheck::kNone: return std::nullopt;
    case OverlapCheck::kOverlap:
      return Problem{"[" + std::to_string(shard_of[o.b]) + "]",
                     "box overlaps that of shards[" + std::to_string(shard_of[o.a]) +
                         (partial ? "]" : "] (and so the shards leave a hole too)")};
    case OverlapCheck::kTooIrregular:
      return Problem{"", "shard layout too irregular to verify: its compressed grid has more than " +
                             std::to_string(kMaxGridCells) + " cells"};
  }
  return std::nullopt;
}

}  // namespace ckptio::index_internal
