// The read planner (contract in read_planner.h, algorithm in
// docs/read-planning.md). Steps, each a function below:
//   1. validate the input and intersect every piece with every target into
//      regions, counting elements per target to catch holes and overlaps;
//   2. per region, choose its read units: slabs fixing the dimensions outside
//      a level, as coarse as gaps <= max_gap allow (what coalescing would do
//      anyway, found in O(rank) instead of by listing runs); then, if the
//      reads these need exceed max_runs, coarsen the costliest regions
//      (counted first, in checked arithmetic; nothing is listed yet);
//   3. list the units (whole pieces for pieces widened to verify), sort them
//      per file, merge overlaps (the dedupe across targets), and cut the
//      merged intervals into reads under max_gap / max_read / direct_min_bytes;
//   4. clip each region's strided layout against the reads it spans into
//      strided copies (clip_layout: O(rank) per region and read, never per
//      run);
//   5. land each read whose bytes are one whole run of one target directly in
//      that target, stage the others, and mark verifiable pieces.
#include "src/restore/read_planner.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <tuple>

namespace ckptio {
namespace {

std::string box_string(const Box& b) {
  return shape_to_string(b.start) + ".." + shape_to_string(b.stop);
}

bool add_saturating(uint64_t& acc, uint64_t v) {
  if (v > UINT64_MAX - acc) {
    acc = UINT64_MAX;
    return false;
  }
  acc += v;
  return true;
}

// A box of `shape`: right rank, 0 <= start <= stop <= shape.
bool box_in_shape(const Box& b, const Shape& shape) {
  if (b.start.size() != shape.size() || b.stop.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (b.start[d] < 0 || b.start[d] > b.stop[d] || b.stop[d] > shape[d]) return false;
  return true;
}

bool overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d)
    if (a.stop[d] <= b.start[d] || b.stop[d] <= a.start[d]) return false;
  return true;
}

// A non-empty (piece, target) intersection and how its bytes are read.
struct Region {
  uint32_t piece = 0;
  uint32_t target = 0;
  Box box;
  RunLayout layout;              // both sides; src offsets are file offsets
  std::vector<uint64_t> ext;     // extent per dimension
  std::vector<uint64_t> ss, ds;  // byte strides of the piece and of the target
  uint64_t src_origin = 0;       // file offset of the region's first byte
  size_t level = 0;              // units fix dimensions < level
  uint64_t units = 1;            // product of ext[d] for d < level
  uint64_t span = 0;             // source bytes of one unit, gaps included
  bool widened = false;          // its piece is read whole instead

  uint64_t span_from(size_t k, const std::vector<uint64_t>& stride, size_t elem) const {
    uint64_t s = elem;
    for (size_t d = k; d < ext.size(); ++d) s += (ext[d] - 1) * stride[d];
    return s;
  }
  uint64_t bytes_from(size_t k, size_t elem) const {
    uint64_t s = elem;
    for (size_t d = k; d < ext.size(); ++d) s *= ext[d];
    return s;
  }
  // Reads this region needs at least: its units cut at max_read. Cannot
  // overflow: the units are disjoint ranges of the piece, so units * span
  // is at most the piece's bytes.
  uint64_t cost(uint64_t max_read) const { return units * ((span - 1) / max_read + 1); }
  // Lowers the level by one dimension of extent > 1 (and any extent-1 ones).
  void coarsen(size_t elem) {
    while (level > 0 && ext[level - 1] == 1) --level;
    if (level > 0) {
      units /= ext[--level];
      while (level > 0 && ext[level - 1] == 1) --level;
    }
    span = span_from(level, ss, elem);
  }
};

std::vector<uint64_t> byte_strides(const Box& b, size_t elem) {
  std::vector<uint64_t> s(b.rank());
  uint64_t acc = elem;
  for (size_t d = b.rank(); d-- > 0;) {
    s[d] = acc;
    acc *= static_cast<uint64_t>(b.stop[d] - b.start[d]);
  }
  return s;
}

Status validate(const SavedLeaf& leaf, std::span<const Box> targets) {
  const size_t elem = leaf.element_size;
  if (elem == 0) return invalid_argument("read plan: element size 0");
  for (int64_t e : leaf.shape)
    if (e < 0) return invalid_argument("read plan: negative dimension in shape " + shape_to_string(leaf.shape));
  if (!checked_num_bytes(leaf.shape, elem))
    return invalid_argument("read plan: shape " + shape_to_string(leaf.shape) + " overflows 64 bits");
  if (leaf.pieces.size() >= UINT32_MAX || targets.size() >= UINT32_MAX)
    return invalid_argument("read plan: too many pieces or targets");
  for (size_t i = 0; i < leaf.pieces.size(); ++i) {
    const SavedPiece& p = leaf.pieces[i];
    if (!box_in_shape(p.box, leaf.shape))
      return invalid_argument("read plan: piece " + std::to_string(i) + " box " + box_string(p.box) +
                              " is not a box of shape " + shape_to_string(leaf.shape));
    const uint64_t bytes = *box_elements(p.box) * elem;  // <= the shape's bytes
    if (p.length != bytes)
      return invalid_argument("read plan: piece " + std::to_string(i) + " length " +
                              std::to_string(p.length) + " is not its box's " + std::to_string(bytes) + " bytes");
    if (p.offset > UINT64_MAX - p.length)
      return invalid_argument("read plan: piece " + std::to_string(i) + " byte range overflows");
  }
  uint64_t total = 0;  // of all target buffers, so that every byte count fits
  for (size_t t = 0; t < targets.size(); ++t) {
    if (!box_in_shape(targets[t], leaf.shape))
      return invalid_argument("read plan: target " + std::to_string(t) + " box " + box_string(targets[t]) +
                              " is not a box of shape " + shape_to_string(leaf.shape));
    if (!add_saturating(total, *box_elements(targets[t]) * elem))
      return invalid_argument("read plan: the targets hold more than 2^64 bytes");
  }
  return Status::OK();
}

// Step 1.
Result<std::vector<Region>> make_regions(const SavedLeaf& leaf, std::span<const Box> targets) {
  const size_t elem = leaf.element_size;
  std::vector<uint64_t> covered(targets.size(), 0);
  std::vector<Region> regions;
  for (uint32_t p = 0; p < leaf.pieces.size(); ++p) {
    const SavedPiece& piece = leaf.pieces[p];
    if (box_is_empty(piece.box)) continue;
    std::vector<uint64_t> ss;
    for (uint32_t t = 0; t < targets.size(); ++t) {
      if (!overlaps(piece.box, targets[t])) continue;
      auto box = intersect(piece.box, targets[t]);
      if (!box) continue;
      Region r;
      r.piece = p;
      r.target = t;
      r.box = std::move(*box);
      CKPTIO_ASSIGN_OR_RETURN(r.layout, run_layout(piece.box, piece.offset, r.box, targets[t], elem));
      if (ss.empty()) ss = byte_strides(piece.box, elem);
      r.ss = ss;
      r.ds = byte_strides(targets[t], elem);
      for (size_t d = 0; d < r.box.rank(); ++d)
        r.ext.push_back(static_cast<uint64_t>(r.box.stop[d] - r.box.start[d]));
      r.src_origin = r.layout.src_base;
      add_saturating(covered[t], r.layout.bytes() / elem);
      regions.push_back(std::move(r));
    }
  }
  for (size_t t = 0; t < targets.size(); ++t) {
    const uint64_t want = *box_elements(targets[t]);
    if (covered[t] != want)
      return invalid_argument("read plan: target " + std::to_string(t) + " box " + box_string(targets[t]) +
                              " has " + std::to_string(want) + " elements, the saved pieces give " +
                              (covered[t] == UINT64_MAX ? std::string("more") : std::to_string(covered[t])) +
                              (covered[t] < want ? " (a hole)" : " (overlapping pieces)"));
  }
  if (regions.size() >= UINT32_MAX) return invalid_argument("read plan: too many regions");
  return regions;
}

// Step 2: the finest level at which every gap inside a unit is <= max_gap
// (so listing finer units would only have them coalesced again).
void choose_level(Region& r, uint64_t max_gap, size_t elem) {
  size_t k = r.ext.size();
  uint64_t span = elem;  // of a slab fixing dims < k
  while (k > 0) {
    const size_t d = k - 1;
    if (r.ext[d] != 1) {
      if (r.ss[d] - span > max_gap) break;  // ss[d] >= span: C order
      span += (r.ext[d] - 1) * r.ss[d];
    }
    k = d;
  }
  r.level = k;
  r.span = span;
  r.units = 1;
  for (size_t d = 0; d < k; ++d) r.units *= r.ext[d];
}

// Keeps the plan's reads under max(max_runs, one per region): coarsens the
// costliest regions first, a dimension at a time, as long as that lowers
// their cost (once units reach max_read, coarser ones only cost more bytes).
// The error is for layouts that need more reads than that even so, e.g. one
// byte per row of a 2^30 x 2^30 array.
Status coarsen_to_budget(std::vector<Region>& regions, const PlanOptions& o, uint64_t fixed_cost,
                         uint64_t fixed_count, size_t elem, ReadPlanStats& stats) {
  const uint64_t max_read = std::max<uint64_t>(o.max_read, 1);
  uint64_t total = fixed_cost;
  uint64_t live = 0;
  for (const Region& r : regions)
    if (!r.widened) add_saturating(total, r.cost(max_read)), ++live;
  const uint64_t limit = std::max(o.max_runs, live + fixed_count);
  if (total <= limit) return Status::OK();
  if (live + fixed_count >= o.max_runs) {
    // Not even one unit per region fits max_runs: one each, no heap needed.
    total = fixed_cost;
    for (Region& r : regions) {
      if (r.widened) continue;
      if (r.units > 1) ++stats.regions_coarsened;
      r.level = 0;
      r.units = 1;
      r.span = r.span_from(0, r.ss, elem);
      add_saturating(total, r.cost(max_read));
    }
  } else {
    using Item = std::pair<uint64_t, size_t>;
    std::priority_queue<Item> heap;
    for (size_t i = 0; i < regions.size(); ++i)
      if (!regions[i].widened && regions[i].level > 0) heap.emplace(regions[i].cost(max_read), i);
    std::vector<bool> touched(regions.size(), false);
    while (total > limit && !heap.empty()) {
      const size_t i = heap.top().second;
      heap.pop();
      Region& r = regions[i];
      const size_t old_level = r.level;
      const uint64_t old_units = r.units, old_span = r.span, old_cost = r.cost(max_read);
      r.coarsen(elem);
      const uint64_t new_cost = r.cost(max_read);
      if (new_cost >= old_cost) {  // units already at max_read: keep the finer plan
        r.level = old_level, r.units = old_units, r.span = old_span;
        continue;
      }
      total -= old_cost - new_cost;
      if (!touched[i]) touched[i] = true, ++stats.regions_coarsened;
      if (r.level > 0) heap.emplace(new_cost, i);
    }
  }
  if (total > limit)
    return Status(Code::kFailedPrecondition,
                  "read plan: the targets need at least " + std::to_string(total) + " reads of at most " +
                      std::to_string(max_read) + " bytes, more than the limit " + std::to_string(limit) +
                      " (PlanOptions::max_runs)");
  return Status::OK();
}

struct Unit {
  uint32_t file = 0;
  uint64_t begin = 0, end = 0;
  uint32_t direct = kStaging;  // a target holding these bytes as one run, if any
  auto key() const { return std::tie(file, begin, end); }
};

// Step 3a: the units of every region (or whole widened pieces).
std::vector<Unit> list_units(const SavedLeaf& leaf, const std::vector<Region>& regions,
                             const std::vector<bool>& widened_piece) {
  const size_t elem = leaf.element_size;
  std::vector<Unit> units;
  std::vector<size_t> unit_of_piece(leaf.pieces.size(), SIZE_MAX);
  for (uint32_t p = 0; p < leaf.pieces.size(); ++p) {
    if (!widened_piece[p]) continue;
    const SavedPiece& piece = leaf.pieces[p];
    unit_of_piece[p] = units.size();
    units.push_back(Unit{piece.file, piece.offset, piece.offset + piece.length, kStaging});
  }
  for (const Region& r : regions) {
    const SavedPiece& piece = leaf.pieces[r.piece];
    if (r.widened) {
      // A region that is the whole piece as one target run keeps the widened
      // unit eligible for a direct landing.
      Unit& u = units[unit_of_piece[r.piece]];
      if (r.box == piece.box && r.layout.dims.empty() && u.direct == kStaging) u.direct = r.target;
      continue;
    }
    const size_t k = r.level;
    const uint64_t slab = r.bytes_from(k, elem);
    const uint64_t span = r.span;
    const bool direct = span == slab && r.span_from(k, r.ds, elem) == slab;
    std::vector<uint64_t> idx(k, 0);
    uint64_t off = r.src_origin;
    for (bool more = true; more;) {
      units.push_back(Unit{piece.file, off, off + span, direct ? r.target : kStaging});
      more = false;
      for (size_t d = k; d-- > 0;) {  // odometer over the fixed dimensions
        if (++idx[d] < r.ext[d]) {
          off += r.ss[d];
          more = true;
          break;
        }
        off -= (r.ext[d] - 1) * r.ss[d];
        idx[d] = 0;
      }
    }
  }
  return units;
}

// Step 3b: merged, deduplicated intervals cut into reads.
std::vector<PlannedRead> build_reads(std::vector<Unit> units, const PlanOptions& o) {
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (a.key() != b.key()) return a.key() < b.key();
    return a.direct < b.direct;  // the lowest direct target first
  });
  std::vector<PlannedRead> reads;
  const uint64_t max_read = std::max<uint64_t>(o.max_read, 1);
  auto emit = [&](uint32_t f, uint64_t a, uint64_t z) { reads.push_back(PlannedRead{f, a, z - a}); };
  auto chunk = [&](uint32_t f, uint64_t a, uint64_t z) {  // emits all but the tail; returns its start
    while (z - a > max_read) emit(f, a, a + max_read), a += max_read;
    return a;
  };
  bool open = false;
  uint32_t of = 0;
  uint64_t oa = 0, oz = 0;
  for (size_t i = 0; i < units.size();) {
    // One interval: units overlapping the first (touching ones stay apart).
    const Unit& first = units[i];
    uint64_t end = first.end;
    bool same = true, direct = first.direct != kStaging;
    size_t j = i + 1;
    for (; j < units.size() && units[j].file == first.file && units[j].begin < end; ++j) {
      if (units[j].begin != first.begin || units[j].end != first.end) same = false;
      direct |= units[j].direct != kStaging;
      end = std::max(end, units[j].end);
    }
    const uint32_t f = first.file;
    const uint64_t s = first.begin;
    i = j;
    if (open && of != f) emit(of, oa, oz), open = false;
    if (same && direct && end - s >= o.direct_min_bytes) {
      if (open) emit(of, oa, oz), open = false;
      emit(f, chunk(f, s, end), end);
      continue;
    }
    if (open && s - oz <= o.max_gap && end - oa <= max_read) {
      oz = end;
      continue;
    }
    if (open) emit(of, oa, oz);
    of = f, oa = chunk(f, s, end), oz = end, open = true;
  }
  if (open) emit(of, oa, oz);
  return reads;
}

// Step 4: a part of a region's layout (clip_layout) as a copy out of read
// `read` starting at file offset `lo`. Loops that are a suffix of the
// region's own (stored once at region_dims) are shared, not stored again.
PlannedCopy to_copy(const RunLayout& part, const RunLayout& region, uint32_t region_dims, uint32_t read,
                    uint32_t target, uint64_t lo, std::vector<CopyDim>& dims) {
  PlannedCopy c{read, target, part.src_base - lo, part.dst_base, part.run_bytes, 0,
                static_cast<uint32_t>(part.dims.size())};
  const size_t m = region.dims.size(), k = part.dims.size();
  if (k == 0) return c;
  if (part.run_bytes == region.run_bytes && std::equal(part.dims.begin(), part.dims.end(), region.dims.end() - k)) {
    c.first_dim = region_dims + static_cast<uint32_t>(m - k);
  } else {
    c.first_dim = static_cast<uint32_t>(dims.size());
    dims.insert(dims.end(), part.dims.begin(), part.dims.end());
  }
  return c;
}

uint64_t copy_bytes(const ReadPlan& plan, const PlannedCopy& c) {
  uint64_t n = c.run_bytes;
  for (uint32_t i = 0; i < c.num_dims; ++i) n *= plan.copy_dims[c.first_dim + i].count;
  return n;
}

// The reads of `file` that overlap [a, z): [first, end) of plan.reads.
std::pair<size_t, size_t> reads_overlapping(const std::vector<PlannedRead>& reads, uint32_t file,
                                            uint64_t a, uint64_t z) {
  auto it = std::lower_bound(reads.begin(), reads.end(), std::make_pair(file, a),
                             [](const PlannedRead& r, const std::pair<uint32_t, uint64_t>& k) {
                               return r.file < k.first || (r.file == k.first && r.offset + r.length <= k.second);
                             });
  size_t first = static_cast<size_t>(it - reads.begin()), end = first;
  while (end < reads.size() && reads[end].file == file && reads[end].offset < z) ++end;
  return {first, end};
}

}  // namespace

SavedLeaf saved_leaf_from_record(const LeafRecord& leaf, std::vector<std::string>* files) {
  SavedLeaf out;
  out.shape = leaf.shape;
  out.element_size = dtype_size(leaf.dtype);
  out.pieces.reserve(leaf.shards.size());
  size_t last = SIZE_MAX;
  for (const ShardRecord& s : leaf.shards) {
    // Shards of a leaf mostly share a file: try the last one first.
    if (last == SIZE_MAX || (*files)[last] != s.file) {
      last = static_cast<size_t>(std::find(files->begin(), files->end(), s.file) - files->begin());
      if (last == files->size()) files->push_back(s.file);
    }
    out.pieces.push_back(SavedPiece{s.box, static_cast<uint32_t>(last), s.offset, s.length, s.crc32c});
  }
  return out;
}

// The steps of the file comment in order (~125 lines: each step is a call or
// a short loop over the plan being built; splitting it further would pass
// the half-built plan around).
Result<ReadPlan> plan_reads(const SavedLeaf& leaf, std::span<const Box> targets, const PlanOptions& o) {
  CKPTIO_RETURN_IF_ERROR(validate(leaf, targets));
  const size_t elem = leaf.element_size;
  ReadPlan plan;
  ReadPlanStats& st = plan.stats;
  for (const Box& t : targets) {
    plan.target_bytes.push_back(*box_elements(t) * elem);
    st.bytes_delivered += plan.target_bytes.back();
  }
  st.bytes_needed = union_elements(targets).value_or(0) * elem;  // <= the shape's bytes

  CKPTIO_ASSIGN_OR_RETURN(std::vector<Region> regions, make_regions(leaf, targets));
  st.regions = regions.size();

  // Which pieces are needed, and which are widened to be verified.
  plan.pieces.resize(leaf.pieces.size());
  std::vector<bool> widened(leaf.pieces.size(), false);
  std::vector<std::vector<const Box*>> parts(leaf.pieces.size());
  for (const Region& r : regions) {
    plan.pieces[r.piece].needed = true;
    parts[r.piece].push_back(&r.box);
  }
  uint64_t widened_count = 0, widened_cost = 0;
  for (size_t p = 0; p < leaf.pieces.size(); ++p) {
    const SavedPiece& piece = leaf.pieces[p];
    if (!o.verify || !plan.pieces[p].needed || !piece.crc32c || piece.length > o.verify_widen_max_bytes)
      continue;
    widened[p] = true;
    ++widened_count;
    add_saturating(widened_cost, (piece.length - 1) / std::max<uint64_t>(o.max_read, 1) + 1);
    std::vector<Box> boxes;
    for (const Box* b : parts[p]) boxes.push_back(*b);
    if (union_elements(boxes).value_or(0) * elem < piece.length) ++st.pieces_widened;
  }
  for (Region& r : regions) {
    r.widened = widened[r.piece];
    if (!r.widened) choose_level(r, o.max_gap, elem);
  }
  CKPTIO_RETURN_IF_ERROR(coarsen_to_budget(regions, o, widened_cost, widened_count, elem, st));

  std::vector<Unit> units = list_units(leaf, regions, widened);
  st.units = units.size();
  plan.reads = build_reads(std::move(units), o);
  if (plan.reads.size() >= UINT32_MAX) return invalid_argument("read plan: too many reads");

  // Copies, region by region, then grouped by read.
  std::vector<PlannedCopy> copies;
  for (const Region& r : regions) {
    const SavedPiece& piece = leaf.pieces[r.piece];
    const size_t before = copies.size();
    const uint32_t region_dims = static_cast<uint32_t>(plan.copy_dims.size());
    plan.copy_dims.insert(plan.copy_dims.end(), r.layout.dims.begin(), r.layout.dims.end());
    auto [first, end] = reads_overlapping(plan.reads, piece.file, r.src_origin, r.src_origin + r.layout.src_span());
    for (size_t i = first; i < end; ++i) {
      const PlannedRead& rd = plan.reads[i];
      for (const RunLayout& part : clip_layout(r.layout, rd.offset, rd.offset + rd.length))
        copies.push_back(to_copy(part, r.layout, region_dims, static_cast<uint32_t>(i), r.target, rd.offset,
                                 plan.copy_dims));
    }
    uint64_t got = 0;
    for (size_t i = before; i < copies.size(); ++i) got += copy_bytes(plan, copies[i]);
    if (got != r.layout.bytes())
      return internal_error("read plan: region " + box_string(r.box) + " of piece " + std::to_string(r.piece) +
                            " gets " + std::to_string(got) + " of its " + std::to_string(r.layout.bytes()) +
                            " bytes from the reads");
  }
  if (copies.size() >= UINT32_MAX || plan.copy_dims.size() >= UINT32_MAX)
    return invalid_argument("read plan: too many copies");
  std::stable_sort(copies.begin(), copies.end(), [](const PlannedCopy& a, const PlannedCopy& b) {
    return std::tie(a.read, a.target, a.dst_offset) < std::tie(b.read, b.target, b.dst_offset);
  });

  // Step 5: land directly where a copy is the whole read as one run.
  plan.copies.reserve(copies.size());
  for (size_t i = 0, c = 0; i < plan.reads.size(); ++i) {
    PlannedRead& rd = plan.reads[i];
    rd.first_copy = static_cast<uint32_t>(plan.copies.size());
    bool landed = false;
    for (; c < copies.size() && copies[c].read == i; ++c) {
      const PlannedCopy& cp = copies[c];
      if (!landed && cp.num_dims == 0 && cp.src_offset == 0 && cp.run_bytes == rd.length) {
        landed = true;
        rd.target = cp.target;
        rd.dst_offset = cp.dst_offset;
        st.bytes_direct += rd.length;
        continue;
      }
      plan.copies.push_back(cp);
      st.bytes_copied += copy_bytes(plan, cp);
    }
    rd.num_copies = static_cast<uint32_t>(plan.copies.size()) - rd.first_copy;
    if (!landed) {
      rd.dst_offset = plan.staging_bytes;
      plan.staging_bytes += rd.length;
    }
    st.bytes_read += rd.length;
  }
  st.requests = plan.reads.size();
  st.copies = plan.copies.size();
  if (st.bytes_direct + st.bytes_copied != st.bytes_delivered)
    return internal_error("read plan: delivers " + std::to_string(st.bytes_direct + st.bytes_copied) +
                          " bytes for targets of " + std::to_string(st.bytes_delivered));

  // Which needed pieces are read whole, hence verifiable.
  for (size_t p = 0; p < leaf.pieces.size(); ++p) {
    PieceReads& pr = plan.pieces[p];
    if (!pr.needed) continue;
    const SavedPiece& piece = leaf.pieces[p];
    auto [first, end] = reads_overlapping(plan.reads, piece.file, piece.offset, piece.offset + piece.length);
    pr.first_read = static_cast<uint32_t>(first);
    pr.end_read = static_cast<uint32_t>(end);
    uint64_t at = piece.offset;
    for (size_t i = first; i < end && plan.reads[i].offset <= at; ++i)
      at = std::max(at, plan.reads[i].offset + plan.reads[i].length);
    pr.verifiable = piece.crc32c.has_value() && at >= piece.offset + piece.length;
    if (piece.crc32c && !pr.verifiable) {
      ++st.pieces_unverified;
      for (size_t i = first; i < end; ++i) {
        const PlannedRead& rd = plan.reads[i];
        const uint64_t lo = std::max(rd.offset, piece.offset);
        const uint64_t hi = std::min(rd.offset + rd.length, piece.offset + piece.length);
        if (hi > lo) st.bytes_unverified += hi - lo;
      }
    }
  }
  return plan;
}

void apply_copies(const ReadPlan& plan, size_t read, const std::byte* landed,
                  std::span<std::byte* const> targets) {
  const PlannedRead& r = plan.reads[read];
  for (uint32_t i = r.first_copy; i < r.first_copy + r.num_copies; ++i) {
    const PlannedCopy& c = plan.copies[i];
    std::byte* dst = targets[c.target];
    for_each_copy_run(plan, c, [&](uint64_t s, uint64_t d, uint64_t n) { std::memcpy(dst + d, landed + s, n); });
  }
}

}  // namespace ckptio
