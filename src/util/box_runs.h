// Box geometry for read planning: intersections, and the byte runs that a
// region of a C-order box occupies in its source and in a destination box.
//
// Everything here is pure and O(rank) per call, except the functions that
// enumerate runs, which are O(number of runs) and never per element. Counts
// use checked arithmetic: a region whose innermost extent is one element over
// a huge array has as many runs as elements, so callers either work with the
// strided description (RunLayout: O(rank) whatever the count) or ask for the
// explicit list with a limit and get an error above it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

// Number of elements of `box` (1 for rank 0, 0 if any extent is <= 0), or
// nullopt if the product overflows 64 bits.
std::optional<uint64_t> box_elements(const Box& box);

// True if the box holds no element (some stop <= start). A rank-0 box is a
// single element, never empty.
bool box_is_empty(const Box& box);

// The common part of `a` and `b`, or nullopt if it holds no element (either
// is empty, they are disjoint, or their ranks differ). Rank 0 boxes intersect
// in the rank-0 box.
std::optional<Box> intersect(const Box& a, const Box& b);

// True if `inner` lies inside `outer` (same rank, every dimension nested).
bool box_contains(const Box& outer, const Box& inner);

// One loop of a strided copy: `count` repetitions, the source advancing by
// `src_stride` bytes and the destination by `dst_stride` bytes each time.
struct CopyDim {
  uint64_t count = 0;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
  bool operator==(const CopyDim&) const = default;
};

// The bytes of a region as runs contiguous in both the source and the
// destination: runs of `run_bytes` at src_base + sum(i_k * dims[k].src_stride)
// -> dst_base + sum(i_k * dims[k].dst_stride), i_k in [0, dims[k].count),
// dims outermost first. Maximal merging: extent-1 dimensions are dropped,
// dimensions spanned fully in both layouts fold into the run, and adjacent
// dimensions that are contiguous with each other in both layouts fuse into
// one loop; so the number of runs, num_runs(), is the minimum for this pair of
// layouts.
struct RunLayout {
  uint64_t src_base = 0;
  uint64_t dst_base = 0;
  uint64_t run_bytes = 0;
  std::vector<CopyDim> dims;  // outermost first; every count >= 2
  uint64_t num_runs() const;  // product of counts (cannot overflow: <= elements)
  uint64_t bytes() const;     // run_bytes * num_runs()
  // From the first source byte to one past the last; the same of the destination.
  uint64_t src_span() const;
  uint64_t dst_span() const;
};

// The layout of `region` read from a saved box stored in C order at byte
// `saved_offset` of its file, written into a buffer holding `target` in C
// order (offset 0 = the target's first element). Requires: same rank,
// region non-empty, region inside both saved and target, element_size > 0,
// and saved's bytes fit in 64 bits past saved_offset; otherwise
// kInvalidArgument.
Result<RunLayout> run_layout(const Box& saved, uint64_t saved_offset, const Box& region,
                             const Box& target, size_t element_size);

// One explicit run: `length` bytes at `src_offset` (in the file) go to
// `dst_offset` (in the target buffer).
struct ByteRun {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const ByteRun&) const = default;
};

// Calls f(src_offset, dst_offset, length) for every run of `layout` in
// increasing source order. O(num_runs * (1 + amortised odometer)).
template <typename F>
void for_each_run(const RunLayout& layout, F&& f) {
  const size_t m = layout.dims.size();
  std::vector<uint64_t> idx(m, 0);
  uint64_t src = layout.src_base, dst = layout.dst_base;
  for (;;) {
    f(src, dst, layout.run_bytes);
    size_t d = m;
    while (d > 0) {
      --d;
      const CopyDim& c = layout.dims[d];
      if (++idx[d] < c.count) {
        src += c.src_stride;
        dst += c.dst_stride;
        break;
      }
      src -= (c.count - 1) * c.src_stride;
      dst -= (c.count - 1) * c.dst_stride;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (m == 0) return;
  }
}

// The part of `layout` whose source bytes lie in [lo, hi), as layouts in
// increasing source order that together hold exactly those bytes (a run cut
// by lo or hi becomes a shorter run). At most two partial sub-boxes per loop
// level plus one whole block between them: O(rank) layouts, O(rank^2) time,
// whatever the number of runs. Empty if nothing of `layout` is inside.
std::vector<RunLayout> clip_layout(const RunLayout& layout, uint64_t lo, uint64_t hi);

// The explicit runs of run_layout(...), or kFailedPrecondition when there
// would be more than `max_runs` of them (counted before anything is
// allocated). Meant for tests and for callers that know their boxes are
// tame; the planner itself works on RunLayout and never enumerates these.
Result<std::vector<ByteRun>> byte_runs(const Box& saved, uint64_t saved_offset,
                                       const Box& region, const Box& target,
                                       size_t element_size, uint64_t max_runs);

// Number of elements in the union of `boxes` (all of one rank; empty ones
// count nothing). Identical boxes count once. Sweeps one dimension at a time
// over the coordinates where boxes start or stop, recursing on the boxes
// active in each slab, and short-cuts sets of pairwise-disjoint boxes; so
// the boxes of a mesh sharding (any two identical or disjoint) cost
// O(n^2 * rank), and arbitrary overlaps at most O((2n)^rank * n). nullopt
// only if a count overflows 64 bits (impossible for boxes inside a shape
// whose element count fits).
std::optional<uint64_t> union_elements(std::span<const Box> boxes);

}  // namespace ckptio
