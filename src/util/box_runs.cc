// Box geometry for read planning (see box_runs.h).
#include "src/util/box_runs.h"

#include <algorithm>
#include <string>

namespace ckptio {
namespace {

std::string box_string(const Box& b) {
  return shape_to_string(b.start) + ".." + shape_to_string(b.stop);
}

// Byte strides of a C-order buffer over `box`, or nullopt on overflow.
std::optional<std::vector<uint64_t>> strides(const Box& box, size_t element_size) {
  std::vector<uint64_t> s(box.rank());
  uint64_t acc = element_size;
  for (size_t d = box.rank(); d-- > 0;) {
    s[d] = acc;
    const uint64_t e = static_cast<uint64_t>(box.stop[d] - box.start[d]);
    if (e != 0 && acc > UINT64_MAX / e) return std::nullopt;
    acc *= e;
  }
  return s;
}

}  // namespace

std::optional<uint64_t> box_elements(const Box& box) {
  uint64_t n = 1;
  for (size_t d = 0; d < box.rank(); ++d) {
    if (box.stop[d] <= box.start[d]) return 0;
  }
  for (size_t d = 0; d < box.rank(); ++d) {
    const uint64_t e = static_cast<uint64_t>(box.stop[d] - box.start[d]);
    if (n > UINT64_MAX / e) return std::nullopt;
    n *= e;
  }
  return n;
}

bool box_is_empty(const Box& box) {
  for (size_t d = 0; d < box.rank(); ++d)
    if (box.stop[d] <= box.start[d]) return true;
  return false;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  if (a.start.size() != a.stop.size() || b.start.size() != b.stop.size() || a.rank() != b.rank())
    return std::nullopt;
  Box r;
  r.start.resize(a.rank());
  r.stop.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    r.start[d] = std::max(a.start[d], b.start[d]);
    r.stop[d] = std::min(a.stop[d], b.stop[d]);
    if (r.stop[d] <= r.start[d]) return std::nullopt;
  }
  return r;
}

bool box_contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank() || outer.stop.size() != outer.rank() ||
      inner.stop.size() != inner.rank())
    return false;
  for (size_t d = 0; d < outer.rank(); ++d)
    if (inner.start[d] < outer.start[d] || inner.stop[d] > outer.stop[d] ||
        inner.start[d] > inner.stop[d])
      return false;
  return true;
}

uint64_t RunLayout::num_runs() const {
  uint64_t n = 1;
  for (const CopyDim& c : dims) n *= c.count;
  return n;
}

uint64_t RunLayout::bytes() const { return run_bytes * num_runs(); }

uint64_t RunLayout::src_span() const {
  uint64_t s = run_bytes;
  for (const CopyDim& c : dims) s += (c.count - 1) * c.src_stride;
  return s;
}

uint64_t RunLayout::dst_span() const {
  uint64_t s = run_bytes;
  for (const CopyDim& c : dims) s += (c.count - 1) * c.dst_stride;
  return s;
}

Result<RunLayout> run_layout(const Box& saved, uint64_t saved_offset, const Box& region,
                             const Box& target, size_t element_size) {
  if (element_size == 0) return invalid_argument("run_layout: element size 0");
  if (box_is_empty(region) || !box_contains(saved, region) || !box_contains(target, region))
    return invalid_argument("run_layout: region " + box_string(region) +
                            " is empty or not inside saved " + box_string(saved) +
                            " and target " + box_string(target));
  auto ss = strides(saved, element_size);
  auto ds = strides(target, element_size);
  const auto saved_elems = box_elements(saved);
  if (!ss || !ds || !saved_elems || *saved_elems > (UINT64_MAX - saved_offset) / element_size)
    return invalid_argument("run_layout: box bytes overflow 64 bits");
  RunLayout l;
  l.src_base = saved_offset;
  l.run_bytes = element_size;
  const size_t r = region.rank();
  for (size_t d = 0; d < r; ++d) {
    l.src_base += static_cast<uint64_t>(region.start[d] - saved.start[d]) * (*ss)[d];
    l.dst_base += static_cast<uint64_t>(region.start[d] - target.start[d]) * (*ds)[d];
  }
  // Innermost first: fold into the run while contiguous on both sides, then
  // fuse loops that continue each other; reversed at the end.
  std::vector<CopyDim> inner_first;
  for (size_t d = r; d-- > 0;) {
    const uint64_t e = static_cast<uint64_t>(region.stop[d] - region.start[d]);
    if (e == 1) continue;
    if (inner_first.empty() && (*ss)[d] == l.run_bytes && (*ds)[d] == l.run_bytes) {
      l.run_bytes *= e;
      continue;
    }
    if (!inner_first.empty()) {
      CopyDim& in = inner_first.back();
      if ((*ss)[d] == in.count * in.src_stride && (*ds)[d] == in.count * in.dst_stride) {
        in.count *= e;
        continue;
      }
    }
    inner_first.push_back(CopyDim{e, (*ss)[d], (*ds)[d]});
  }
  l.dims.assign(inner_first.rbegin(), inner_first.rend());
  return l;
}

Result<std::vector<ByteRun>> byte_runs(const Box& saved, uint64_t saved_offset,
                                       const Box& region, const Box& target,
                                       size_t element_size, uint64_t max_runs) {
  CKPTIO_ASSIGN_OR_RETURN(RunLayout l, run_layout(saved, saved_offset, region, target, element_size));
  const uint64_t n = l.num_runs();
  if (n > max_runs)
    return Status(Code::kFailedPrecondition,
                  "region " + box_string(region) + " of " + box_string(saved) + " has " +
                      std::to_string(n) + " byte runs, more than the limit " +
                      std::to_string(max_runs));
  std::vector<ByteRun> runs;
  runs.reserve(n);
  for_each_run(l, [&](uint64_t s, uint64_t d, uint64_t len) { runs.push_back({s, d, len}); });
  return runs;
}

namespace {

// clip_layout's recursion: the elements of the sub-box at loop `level` based
// at (src, dst) whose source bytes lie in [lo, hi). Sub-box j of a loop holds
// [src + j*stride, src + j*stride + span): only the first and last that
// overlap can be partial; the whole ones between are one block.
class Clip {
 public:
  Clip(const RunLayout& l, uint64_t lo, uint64_t hi) : l_(l), lo_(lo), hi_(hi), spans_(l.dims.size() + 1) {
    spans_[l.dims.size()] = l.run_bytes;
    for (size_t i = l.dims.size(); i-- > 0;)
      spans_[i] = spans_[i + 1] + (l.dims[i].count - 1) * l.dims[i].src_stride;
  }
  std::vector<RunLayout> run() {
    at(0, l_.src_base, l_.dst_base);
    return std::move(out_);
  }

 private:
  void block(size_t level, uint64_t count, uint64_t src, uint64_t dst) {
    RunLayout part;
    part.src_base = src;
    part.dst_base = dst;
    part.run_bytes = l_.run_bytes;
    if (count > 1) part.dims.push_back(CopyDim{count, l_.dims[level].src_stride, l_.dims[level].dst_stride});
    part.dims.insert(part.dims.end(), l_.dims.begin() + level + 1, l_.dims.end());
    out_.push_back(std::move(part));
  }
  void at(size_t level, uint64_t src, uint64_t dst) {
    if (level == l_.dims.size()) {  // one run, cut at lo / hi if need be
      const uint64_t a = std::max(lo_, src), z = std::min(hi_, src + l_.run_bytes);
      if (a < z) out_.push_back(RunLayout{a, dst + (a - src), z - a, {}});
      return;
    }
    const CopyDim& c = l_.dims[level];
    const uint64_t span = spans_[level + 1];
    const uint64_t jb = lo_ < src + span ? 0 : (lo_ - src - span) / c.src_stride + 1;
    const uint64_t je = std::min<uint64_t>(c.count, hi_ <= src ? 0 : (hi_ - src - 1) / c.src_stride + 1);
    if (jb >= je) return;
    uint64_t jl = jb, jh = je;
    if (src + jl * c.src_stride < lo_) {
      at(level + 1, src + jl * c.src_stride, dst + jl * c.dst_stride);
      ++jl;
    }
    const bool high_partial = jh > jl && src + (jh - 1) * c.src_stride + span > hi_;
    if (high_partial) --jh;
    if (jl < jh) block(level, jh - jl, src + jl * c.src_stride, dst + jl * c.dst_stride);
    if (high_partial) at(level + 1, src + jh * c.src_stride, dst + jh * c.dst_stride);
  }

  const RunLayout& l_;
  const uint64_t lo_, hi_;
  std::vector<uint64_t> spans_;  // spans_[i]: source bytes of a sub-box at loop i
  std::vector<RunLayout> out_;
};

bool same_from(const Box& a, const Box& b, size_t d0) {
  return std::equal(a.start.begin() + d0, a.start.end(), b.start.begin() + d0) &&
         std::equal(a.stop.begin() + d0, a.stop.end(), b.stop.begin() + d0);
}

bool disjoint_from(const Box& a, const Box& b, size_t d0) {
  for (size_t d = d0; d < a.rank(); ++d)
    if (a.stop[d] <= b.start[d] || b.stop[d] <= a.start[d]) return true;
  return false;
}

std::optional<uint64_t> elements_from(const Box& b, size_t d0) {
  uint64_t n = 1;
  for (size_t d = d0; d < b.rank(); ++d) {
    const uint64_t e = static_cast<uint64_t>(b.stop[d] - b.start[d]);
    if (e != 0 && n > UINT64_MAX / e) return std::nullopt;
    n *= e;
  }
  return n;
}

bool add_to(uint64_t& acc, uint64_t v) {
  if (v > UINT64_MAX - acc) return false;
  acc += v;
  return true;
}

// Union volume over dimensions >= d of non-empty boxes.
std::optional<uint64_t> union_from(std::vector<const Box*> boxes, size_t d) {
  if (boxes.empty()) return 0;
  const size_t r = boxes[0]->rank();
  if (d == r) return 1;
  // Identical boxes (replicas) count once.
  std::sort(boxes.begin(), boxes.end(), [d](const Box* a, const Box* b) {
    for (size_t k = d; k < a->rank(); ++k) {
      if (a->start[k] != b->start[k]) return a->start[k] < b->start[k];
      if (a->stop[k] != b->stop[k]) return a->stop[k] < b->stop[k];
    }
    return false;
  });
  boxes.erase(std::unique(boxes.begin(), boxes.end(),
                          [d](const Box* a, const Box* b) { return same_from(*a, *b, d); }),
              boxes.end());
  bool disjoint = true;
  for (size_t i = 0; i < boxes.size() && disjoint; ++i)
    for (size_t j = i + 1; j < boxes.size() && disjoint; ++j)
      disjoint = disjoint_from(*boxes[i], *boxes[j], d);
  uint64_t total = 0;
  if (disjoint) {
    for (const Box* b : boxes) {
      auto n = elements_from(*b, d);
      if (!n || !add_to(total, *n)) return std::nullopt;
    }
    return total;
  }
  std::vector<int64_t> cuts;
  for (const Box* b : boxes) {
    cuts.push_back(b->start[d]);
    cuts.push_back(b->stop[d]);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    std::vector<const Box*> active;
    for (const Box* b : boxes)
      if (b->start[d] <= cuts[i] && b->stop[d] >= cuts[i + 1]) active.push_back(b);
    if (active.empty()) continue;
    auto inner = union_from(std::move(active), d + 1);
    const uint64_t w = static_cast<uint64_t>(cuts[i + 1] - cuts[i]);
    if (!inner || (*inner != 0 && w > UINT64_MAX / *inner) || !add_to(total, w * *inner))
      return std::nullopt;
  }
  return total;
}

}  // namespace

std::vector<RunLayout> clip_layout(const RunLayout& layout, uint64_t lo, uint64_t hi) {
  if (lo >= hi) return {};
  return Clip(layout, lo, hi).run();
}

std::optional<uint64_t> union_elements(std::span<const Box> boxes) {
  std::vector<const Box*> live;
  for (const Box& b : boxes)
    if (!box_is_empty(b)) live.push_back(&b);
  return union_from(std::move(live), 0);
}

}  // namespace ckptio
