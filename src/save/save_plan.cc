#include "src/save/save_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace ckptio {

uint64_t SavePlan::bytes() const {
  uint64_t n = 0;
  for (const PlannedFile& f : files) n += f.size;
  return n;
}

namespace {

// Where a shard starts along dimension 0 of its leaf, as the fraction
// start / size (0 for scalars and empty dimensions).
struct RowFraction {
  uint64_t num = 0, den = 1;
  bool operator<(const RowFraction& o) const {
    return static_cast<unsigned __int128>(num) * o.den < static_cast<unsigned __int128>(o.num) * den;
  }
};

// One shard covering the leaf: unsharded and replicated leaves.
bool held_whole(const LeafView& leaf) {
  return leaf.shards.size() == 1 && leaf.shards[0].box.is_whole(leaf.shape);
}

RowFraction row_fraction(const LeafView& leaf, const ShardView& shard) {
  if (leaf.shape.empty() || leaf.shape[0] <= 0 || shard.box.start.empty()) return {};
  return {static_cast<uint64_t>(shard.box.start[0]), static_cast<uint64_t>(leaf.shape[0])};
}

}  // namespace

SavePlan plan_save(const std::vector<LeafView>& leaves, uint64_t phase_align, uint64_t object_bytes,
                   uint64_t file_align) {
  SavePlan plan;
  plan.files.push_back({});
  file_align = std::max<uint64_t>(file_align, 1);
  // The leaves held whole first, in leaf order; then the shards of the other
  // leaves by where they start along dimension 0 (stable: leaf order, then
  // shard order, among equals).
  std::vector<std::pair<size_t, size_t>> order;  // (leaf, shard)
  for (size_t l = 0; l < leaves.size(); ++l)
    if (held_whole(leaves[l])) order.emplace_back(l, 0);
  const size_t first_sharded = order.size();
  for (size_t l = 0; l < leaves.size(); ++l)
    if (!held_whole(leaves[l]))
      for (size_t s = 0; s < leaves[l].shards.size(); ++s) order.emplace_back(l, s);
  std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(first_sharded), order.end(),
                   [&](const auto& a, const auto& b) {
                     return row_fraction(leaves[a.first], leaves[a.first].shards[a.second]) <
                            row_fraction(leaves[b.first], leaves[b.first].shards[b.second]);
                   });
  plan.shards.reserve(order.size());
  for (auto [l, s] : order) {
    const LeafView& leaf = leaves[l];
    PlannedShard p;
    p.leaf = l;
    p.shard = s;
    p.src = static_cast<const std::byte*>(leaf.shards[s].data);
    p.length = checked_num_bytes(leaf.shards[s].box, dtype_size(leaf.dtype)).value_or(0);
    const uint64_t used = plan.total - plan.files.back().start;
    if (object_bytes > 0 && used > 0 && p.length > object_bytes - std::min(used, object_bytes)) {
      plan.files.back().size = used;
      plan.total = (plan.total + file_align - 1) / file_align * file_align;
      plan.files.push_back({plan.total, 0});
    }
    p.file = plan.files.size() - 1;
    if (phase_align > 1 && p.length >= kPhaseAlignMinBytes) {
      const uint64_t want = reinterpret_cast<uintptr_t>(p.src) & (phase_align - 1);
      plan.total += (want - plan.total) & (phase_align - 1);
    } else {
      // (Restores place a leaf as its shard lies in the file: a float64 after
      // a 3-byte leaf came back at an odd address, which numpy marks
      // unaligned and torch must not be given.)
      const uint64_t a = dtype_alignment(leaf.dtype);
      plan.total += (a - (plan.total - plan.files.back().start) % a) % a;
    }
    p.offset = plan.total;
    plan.total += p.length;
    plan.shards.push_back(p);
  }
  plan.files.back().size = plan.total - plan.files.back().start;
  return plan;
}

uint64_t& row_band_min_bytes() {
  static uint64_t bytes = kRowBandMinBytes;
  return bytes;
}

void split_row_bands(std::vector<LeafView>& leaves, uint32_t ways, uint64_t min_band_bytes) {
  min_band_bytes = std::max<uint64_t>(min_band_bytes, 1);
  if (ways < 2) return;
  std::vector<int64_t> cuts, kept;
  std::vector<ShardView> out;
  for (LeafView& leaf : leaves) {
    if (leaf.shape.empty() || leaf.shape[0] < 2) continue;
    if (held_whole(leaf)) continue;
    const int64_t rows = leaf.shape[0];
    // XLA's ceil-division tiles (JAX's chunks when n divides the rows), the
    // splits into fewer devices first: they win when cuts crowd.
    cuts.clear();
    for (int64_t n = 2; n <= static_cast<int64_t>(ways) && n <= rows; ++n) {
      const int64_t tile = rows / n + (rows % n != 0);
      for (int64_t k = 1; k < n && k * tile < rows; ++k) cuts.push_back(k * tile);
    }
    const size_t item = dtype_size(leaf.dtype);
    out.clear();
    for (const ShardView& sh : leaf.shards) {
      const Shape ext = sh.box.extent();
      const uint64_t bytes = checked_num_bytes(ext, item).value_or(0);
      if (bytes < 2 * min_band_bytes || ext[0] < 2) {
        out.push_back(sh);
        continue;
      }
      const uint64_t row_bytes = bytes / static_cast<uint64_t>(ext[0]);
      const int64_t lo = sh.box.start[0], hi = sh.box.stop[0];
      const int64_t min_rows = static_cast<int64_t>((min_band_bytes + row_bytes - 1) / row_bytes);
      kept.assign({lo, hi});
      for (int64_t c : cuts) {
        if (c - lo < min_rows || hi - c < min_rows) continue;
        auto at = std::lower_bound(kept.begin(), kept.end(), c);
        if (*at == c || *at - c < min_rows || c - *(at - 1) < min_rows) continue;
        kept.insert(at, c);
      }
      for (size_t i = 0; i + 1 < kept.size(); ++i) {
        ShardView b = sh;
        b.box.start[0] = kept[i];
        b.box.stop[0] = kept[i + 1];
        b.data = static_cast<const std::byte*>(sh.data) + static_cast<uint64_t>(kept[i] - lo) * row_bytes;
        out.push_back(std::move(b));
      }
    }
    leaf.shards.swap(out);
  }
}

uint64_t write_unit(uint64_t granularity) {
  if (granularity <= 1) return 1;
  return std::lcm<uint64_t>(granularity, 4096);
}

std::vector<WriteRange> plan_write_ranges(const SavePlan& plan, uint64_t chunk, uint64_t granularity,
                                          bool zero_copy, uint64_t memory_align) {
  const uint64_t unit = write_unit(granularity);
  chunk = std::max<uint64_t>((chunk + unit - 1) / unit * unit, unit);
  std::vector<WriteRange> out;
  size_t file = 0;
  auto staged = [&](uint64_t from, uint64_t to) {
    for (uint64_t at = from; at < to; at += chunk)
      out.push_back({at, std::min(chunk, to - at), nullptr, 0, file});
  };
  // Everything before pos is planned; pos is a multiple of unit (files
  // start at unit multiples when there are several).
  uint64_t pos = plan.files.empty() ? 0 : plan.files[0].start;
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const PlannedShard& s = plan.shards[i];
    while (file < s.file) {  // close the files before this shard's
      staged(pos, plan.files[file].start + plan.files[file].size);
      pos = plan.files[++file].start;
    }
    if (!zero_copy || s.length < kMinDirectRunBytes) continue;
    // Direct I/O reads the caller's bytes in place: the address of every
    // range start must be aligned, and ranges start at unit multiples (which
    // are multiples of 4096, so of any memory_align the manager accepts).
    if (memory_align > 1 && (reinterpret_cast<uintptr_t>(s.src) - s.offset) % memory_align != 0) continue;
    const uint64_t end = s.offset + s.length;
    const uint64_t a = std::max(pos, (s.offset + unit - 1) / unit * unit);
    const uint64_t b = end / unit * unit;  // a tail would need padding past the caller's bytes
    if (b <= a || b - a < kMinDirectRunBytes) continue;
    staged(pos, a);
    for (uint64_t at = a; at < b; at += chunk)
      out.push_back({at, std::min(chunk, b - at), s.src + (at - s.offset), i, file});
    pos = b;
  }
  for (; file < plan.files.size(); ++file) {  // the rest of the last shard's file, and the files after
    staged(pos, plan.files[file].start + plan.files[file].size);
    if (file + 1 < plan.files.size()) pos = plan.files[file + 1].start;
  }
  return out;
}

}  // namespace ckptio
