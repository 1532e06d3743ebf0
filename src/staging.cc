#include "src/staging.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string_view>
#include <string>
#include <utility>

#include <sys/mman.h>

#include "src/async.h"
#include "src/position_table.h"

namespace ckptio {

BufferPool::BufferPool(uint64_t chunk, uint64_t capacity)
    : chunk_(chunk), capacity_(std::max<uint64_t>(capacity, 1)) {}

BufferPool::~BufferPool() {
  for (std::byte* b : free_) std::free(b);
}

std::byte* BufferPool::acquire() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty() || allocated_ < capacity_; });
  if (!free_.empty()) {
    std::byte* b = free_.back();
    free_.pop_back();
    return b;
  }
  ++allocated_;
  lock.unlock();
  // Faulted in whole now, as reserve() does: a buffer kept for later saves
  // must not take fresh page faults (and resident memory) save after save
  // as larger slices of it get used.
  std::byte* b = allocate_buffer();
  populate(b);
  return b;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

bool populate_for_write(void* p, size_t len) {
  const uintptr_t page = 4096;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t z = (reinterpret_cast<uintptr_t>(p) + len) & ~(page - 1);
  if (z <= a) return true;
  return ::madvise(reinterpret_cast<void*>(a), z - a, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
}

std::future<void> populate_in_background(std::vector<std::pair<std::byte*, uint64_t>> ranges) {
  static std::atomic<bool> works{true};  // false once the kernel refused (before 5.14)
  if (ranges.empty() || !works.load(std::memory_order_relaxed)) return {};
  return try_async([ranges = std::move(ranges)] {
    constexpr uint64_t kSlice = 8ull << 20;
    for (auto r = ranges.rbegin(); r != ranges.rend(); ++r) {
      const auto [p, len] = *r;
      for (uint64_t end = len; end > 0;) {
        const uint64_t begin = end > kSlice ? end - kSlice : 0;
        if (!populate_for_write(p + begin, end - begin)) return works.store(false);
        end = begin;
      }
    }
  });
}

void BufferPool::populate(std::byte* b) const {
  if (::madvise(b, chunk_, MADV_POPULATE_WRITE) != 0) std::memset(b, 0, chunk_);  // older kernels
}

std::byte* BufferPool::allocate_buffer() const {
  // 2 MiB-aligned huge pages when the chunk allows: fewer page faults on
  // the first save and fewer TLB misses on every copy.
  const size_t huge = 2u << 20;
  const size_t align = chunk_ % huge == 0 ? huge : 4096;
  void* p = std::aligned_alloc(align, chunk_);
  if (!p) std::abort();  // out of memory for a bounded, configured pool
  if (align == huge) (void)::madvise(p, chunk_, MADV_HUGEPAGE);
  return static_cast<std::byte*>(p);
}

void BufferPool::reserve(uint64_t n) {
  uint64_t make = 0;
  {
    std::lock_guard lock(mu_);
    n = std::min(n, capacity_);
    if (allocated_ >= n) return;
    make = n - allocated_;
    allocated_ = n;
  }
  std::vector<std::byte*> made;
  for (uint64_t i = 0; i < make; ++i) {
    std::byte* b = allocate_buffer();
    populate(b);
    made.push_back(b);
  }
  {
    std::lock_guard lock(mu_);
    free_.insert(free_.end(), made.begin(), made.end());
  }
  cv_.notify_all();
}

void BufferPool::release(std::byte* buf) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(buf);
  }
  cv_.notify_one();
}

Crew::Crew(unsigned helpers) {
  for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
}

Crew::~Crew() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Crew::run(const std::function<void()>& fn) {
  std::lock_guard run_lock(run_mu_);
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    busy_ = static_cast<unsigned>(threads_.size());
    ++generation_;
  }
  wake_.notify_all();
  fn();
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

void Crew::loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void()>* fn = nullptr;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      fn = fn_;
    }
    (*fn)();
    std::lock_guard lock(mu_);
    if (--busy_ == 0) done_.notify_all();
  }
}

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

namespace {

bool boxes_intersect(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d)
    if (std::max(a.start[d], b.start[d]) >= std::min(a.stop[d], b.stop[d])) return false;
  return true;
}

Status validate_leaf(const LeafView& leaf, bool partial) {
  // For messages only: built when one is (a state may hold millions of leaves).
  auto name = [&] { return leaf.prefix + "/" + leaf.path; };
  if (leaf.prefix.empty() || leaf.path.empty())
    return invalid_argument("leaf '" + name() + "': prefix and path must be non-empty");
  if (leaf.prefix.find_first_of(std::string("/\\\0", 3)) != std::string::npos ||
      leaf.path.find('\0') != std::string::npos)
    return invalid_argument("leaf '" + name() + "': prefix has '/', '\\' or NUL");
  if (static_cast<int>(leaf.dtype) >= kNumDTypes)
    return invalid_argument("leaf '" + name() + "': unknown dtype");
  auto total = checked_num_bytes(leaf.shape, dtype_size(leaf.dtype));
  if (!total)
    return invalid_argument("leaf '" + name() + "': shape " + shape_to_string(leaf.shape) +
                            " is negative or overflows 64 bits");
  if (leaf.shards.empty() && *total != 0 && !partial)
    return invalid_argument("leaf '" + name() + "' has no shards");
  uint64_t covered = 0;
  for (size_t i = 0; i < leaf.shards.size(); ++i) {
    const Box& b = leaf.shards[i].box;
    if (b.start.size() != leaf.shape.size() || b.stop.size() != leaf.shape.size())
      return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) + ": box rank differs from shape");
    for (size_t d = 0; d < b.rank(); ++d)
      if (b.start[d] < 0 || b.start[d] > b.stop[d] || b.stop[d] > leaf.shape[d])
        return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) +
                                ": box lies outside shape " + shape_to_string(leaf.shape));
    uint64_t bytes = checked_num_bytes(b, dtype_size(leaf.dtype)).value_or(0);
    if (bytes > 0 && leaf.shards[i].data == nullptr)
      return invalid_argument("leaf '" + name() + "' shard " + std::to_string(i) + ": null data");
    covered += bytes;
  }
  // Pairwise overlap check: save() receives few shards per leaf per process.
  for (size_t i = 0; i < leaf.shards.size(); ++i)
    for (size_t j = i + 1; j < leaf.shards.size(); ++j)
      if (boxes_intersect(leaf.shards[i].box, leaf.shards[j].box))
        return invalid_argument("leaf '" + name() + "': shards " + std::to_string(i) + " and " +
                                std::to_string(j) + " overlap");
  if (covered != *total && !partial)
    return invalid_argument("leaf '" + name() + "': shards do not cover the whole shape " +
                            shape_to_string(leaf.shape));
  return Status::OK();
}

}  // namespace

namespace {

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF),
// as the index reader demands of every name.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; min = 0x10000; }
    else return false;
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

Status validate_leaves(const std::vector<LeafView>& leaves, bool partial) {
  // The names' hashes in one array: a probe compares them before it reads
  // another leaf, whose strings are a cache miss each (at 100,000 leaves
  // most of what this check cost; bench/micro_bench BM_SaveStallTinyLeaves).
  std::vector<size_t> hashes(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafView& leaf = leaves[i];
    if (!valid_utf8(leaf.prefix) || !valid_utf8(leaf.path))
      return invalid_argument("leaf names must be valid UTF-8 (the index stores them as JSON strings)");
    CKPTIO_RETURN_IF_ERROR(validate_leaf(leaf, partial));
    hashes[i] = hash_names(leaf.prefix, leaf.path);
  }
  PositionTable seen(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafView& leaf = leaves[i];
    size_t& slot = seen.slot(hashes[i], [&](size_t j) {
      return hashes[j] == hashes[i] && leaves[j].path == leaf.path && leaves[j].prefix == leaf.prefix;
    });
    if (slot != 0) return invalid_argument("leaf '" + leaf.prefix + "/" + leaf.path + "' appears twice");
    slot = i + 1;
  }
  return Status::OK();
}

}  // namespace ckptio
