// Restore and verify of zarr v2 steps (contract in restore_zarr.h).
#include "src/restore/restore_zarr.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "src/layout/zarr/chunk_codec.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/zarray.h"
#include "src/restore/damage.h"
#include "src/restore/decode_crew.h"
#include "src/restore/read_executor.h"
#include "src/restore/destinations.h"
#include "src/restore/targets.h"
#include "src/transform/transform.h"
#include "src/util/box_runs.h"
#include "src/util/populate.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBatchBytes = 16ull << 20;  // compressed bytes requested per batch
constexpr uint64_t kHeldBytes = 64ull << 20;   // compressed bytes read and not yet decoded
constexpr size_t kMaxProblems = 20;

// One selected leaf and where it goes.
struct ZLeaf {
  std::string name;  // "model/layers.0.kernel"
  const LeafRecord* rec = nullptr;
  zarr::ZArray z;
  std::vector<Box> targets;
  std::vector<std::byte*> target_ptrs;
  PieceTransform transform;
  std::vector<std::byte> fill;  // one element of the fill value (saved dtype); empty: zeros
  bool fresh = false;           // targets allocated by the restore (not the caller's `into`)
};

// One chunk to decode: read (shard set) or missing (filled).
struct ChunkJob {
  uint32_t leaf = 0;
  std::vector<uint64_t> index;    // grid position
  const ShardRecord* shard = nullptr;
  std::vector<uint32_t> targets;  // the leaf's targets it overlaps
  std::byte* compressed = nullptr;  // from the consumer's pool while read and decoded
};

// Page-aligned buffers for compressed chunks, reused from chunk to chunk:
// a fresh buffer per chunk costs a page fault per 4 KiB (measured: half the
// system time of a verify), and a 4 KiB-aligned one lets direct I/O land in
// it without a bounce copy. Not thread-safe: the consumer locks.
class ChunkBuffers {
 public:
  ~ChunkBuffers() {  // after the executor returned (no read lands any more) and the crew stopped
    for (auto& [p, cap] : free_) std::free(p);
    for (auto& [p, cap] : cap_) std::free(p);
  }
  std::byte* take(uint64_t n) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= n && (best == free_.end() || it->second < best->second)) best = it;
    if (best != free_.end()) {
      std::byte* p = best->first;
      cap_[p] = best->second;
      free_bytes_ -= best->second;
      free_.erase(best);
      return p;
    }
    const uint64_t cap = std::max<uint64_t>((n + 4095) / 4096 * 4096, 4096);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, cap));
    if (!p) throw std::bad_alloc();
    try {
      cap_[p] = cap;
    } catch (...) {  // std::bad_alloc: the buffer is nobody's yet
      std::free(p);
      throw;
    }
    return p;
  }
  void give_back(std::byte* p) {
    auto it = cap_.find(p);
    const uint64_t cap = it->second;
    cap_.erase(it);
    if (free_bytes_ + cap > kKeep) {
      std::free(p);
      return;
    }
    free_.emplace_back(p, cap);
    free_bytes_ += cap;
  }

 private:
  static constexpr uint64_t kKeep = 256ull << 20;
  std::vector<std::pair<std::byte*, uint64_t>> free_;
  std::map<std::byte*, uint64_t> cap_;  // taken: capacity
  uint64_t free_bytes_ = 0;
};

// Reads every planned chunk into a buffer of its own (destination()), hands
// it to the crew when it lands, and bounds the compressed bytes held.
class ZarrConsumer : public ReadConsumer {
 public:
  // verify: decode only (no targets), note problems and go on. prefault:
  // each decoder faults the fresh memory a chunk goes to in at once
  // (MADV_POPULATE_WRITE) before it writes there, instead of one fault per
  // 4 KiB page in the middle of decoding (RestoreOptions::prefault).
  ZarrConsumer(Storage& storage, int64_t step, std::vector<ZLeaf>& leaves, std::vector<ChunkJob>& jobs,
               const std::vector<std::string>& keys, ProgressReport& progress, bool verify, bool prefault = false)
      : storage_(storage), step_(step), leaves_(leaves), jobs_(jobs), keys_(keys), progress_(progress),
        verify_(verify), prefault_(prefault), crew_(std::max(1u, std::thread::hardware_concurrency())) {}

  std::byte* destination(size_t i) override {
    const uint64_t n = jobs_[i].shard->length;
    {
      std::unique_lock lock(mu_);
      // Waits only for chunks the crew holds: they drain. Chunks of the batch
      // in flight land after this returns, so waiting for them would hang.
      cv_.wait(lock, [&] { return queued_ == 0 || held_ + n <= kHeldBytes; });
      held_ += n;
      jobs_[i].compressed = buffers_.take(n);
    }
    return jobs_[i].compressed;
  }

  Status landed(size_t i, const std::byte*) override {
    if (!verify_) CKPTIO_RETURN_IF_ERROR(crew_.error());
    {
      std::lock_guard lock(mu_);
      queued_ += jobs_[i].shard->length;
    }
    crew_.submit([this, i](zarr::ChunkDecoder* d, DecodeCrew::Scratch& scratch, bool skip) {
      // The chunk's compressed bytes go back on every way out, a throw from
      // decode() too (std::bad_alloc): before, a throw kept them counted, and
      // the reader's next destination() waited for them for ever.
      struct GiveBack {
        ZarrConsumer& c;
        size_t i;
        ~GiveBack() {
          const uint64_t n = c.jobs_[i].shard->length;
          {
            std::lock_guard lock(c.mu_);
            c.buffers_.give_back(std::exchange(c.jobs_[i].compressed, nullptr));
            c.held_ -= n;
            c.queued_ -= n;
          }
          c.cv_.notify_all();
        }
      };
      Status st;
      {
        GiveBack back{*this, i};
        st = skip ? Status::OK() : decode(jobs_[i], *d, scratch);
      }
      if (!st.ok() && verify_) {
        note(st.message());
        return Status::OK();
      }
      return st;
    });
    return Status::OK();
  }

  void delivered(size_t, uint64_t bytes) override { progress_.update(bytes); }

  Status failed(size_t i, Status st) override {
    const ChunkJob& j = jobs_[i];
    {  // never landed: gives its buffer back
      std::lock_guard lock(mu_);
      held_ -= j.shard->length;
      if (j.compressed) buffers_.give_back(std::exchange(jobs_[i].compressed, nullptr));
    }
    Status e = data_read_error(st, where(j), storage_.describe() + "/" + keys_[i]);
    if (!verify_ || !e.data_loss()) return e;
    note(e.message());
    return Status::OK();
  }

  // Decodes (or fills) one chunk and copies it into its targets.
  Status decode(ChunkJob& j, zarr::ChunkDecoder& d, DecodeCrew::Scratch& scratch) const {
    const ZLeaf& L = leaves_[j.leaf];
    const zarr::ZArray& z = L.z;
    const Box full = zarr::chunk_box(z, j.index);
    const Box valid = zarr::chunk_valid_box(z, j.index);
    const size_t item = dtype_size(z.dtype);
    std::span<const std::byte> src(j.compressed, j.shard ? j.shard->length : 0);
    // Straight into the target: one target, no cast, no padding, and the
    // chunk one contiguous run of it.
    if (j.shard && j.targets.size() == 1 && L.transform.identity() && full == valid &&
        box_contains(L.targets[j.targets[0]], full)) {
      auto layout = run_layout(full, 0, full, L.targets[j.targets[0]], item);
      if (!layout.ok()) return layout.status().annotate(where(j));
      if (layout->num_runs() == 1 && layout->run_bytes == z.chunk_bytes) {
        std::byte* dst = L.target_ptrs[j.targets[0]] + layout->dst_base;
        fault_in(L, dst, z.chunk_bytes);
        Status st = d.decode(z.compressor, src, {dst, z.chunk_bytes});
        return st.ok() ? st : st.annotate(where(j));
      }
    }
    if (j.shard) {  // checked before the scratch grows to what the chunk claims
      if (Status st = zarr::check_chunk(z.compressor, src, z.chunk_bytes); !st.ok()) return st.annotate(where(j));
    }
    const std::span<std::byte> buf = scratch.get(z.chunk_bytes);
    if (j.shard) {
      Status st = d.decode(z.compressor, src, buf);
      if (!st.ok()) return st.annotate(where(j));
    } else if (L.fill.empty()) {
      std::memset(buf.data(), 0, buf.size());
    } else {
      for (uint64_t at = 0; at + item <= buf.size(); at += item) std::memcpy(buf.data() + at, L.fill.data(), item);
    }
    for (uint32_t t : j.targets) {
      const std::optional<Box> region = intersect(valid, L.targets[t]);
      if (!region) continue;
      auto layout = run_layout(full, 0, *region, L.targets[t], item);
      if (!layout.ok()) return layout.status().annotate(where(j));
      std::byte* dst = L.target_ptrs[t];
      const uint64_t lo = L.transform.out_offset(layout->dst_base);  // the span of the target the runs write
      fault_in(L, dst + lo, L.transform.out_offset(layout->dst_base + layout->dst_span()) - lo);
      Status st;
      for_each_run(*layout, [&](uint64_t s, uint64_t o, uint64_t n) {
        if (st.ok()) st = L.transform.apply(buf.data() + s, dst + L.transform.out_offset(o), n);
      });
      if (!st.ok()) return st.annotate(where(j));
    }
    return Status::OK();
  }

  // Faults in [p, p + n) of a leaf's fresh memory before a decoder writes
  // there (the pages of the span other chunks write too: harmless, as
  // MADV_POPULATE_WRITE changes no byte). Counted in prefaulted().
  void fault_in(const ZLeaf& L, std::byte* p, uint64_t n) const {
    if (!prefault_ || !L.fresh || !populate_works_.load(std::memory_order_relaxed)) return;
    if (!populate_for_write(p, n)) return populate_works_.store(false);
    prefaulted_.fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t prefaulted() const { return prefaulted_.load(std::memory_order_relaxed); }

  std::string where(const ChunkJob& j) const {
    const ZLeaf& L = leaves_[j.leaf];
    return L.name + " chunk " + zarr::chunk_key(L.z, j.index) + " of step " + std::to_string(step_) + " (" +
           storage_.describe() + "/" + (j.shard ? keys_[&j - jobs_.data()] : std::string("missing")) + ")";
  }

  void note(std::string p) {
    std::lock_guard lock(mu_);
    if (problems_.size() < kMaxProblems) problems_.push_back(std::move(p));
    ++count_;
  }
  // Problems counted, not named.
  void note_more(uint64_t n) {
    std::lock_guard lock(mu_);
    count_ += n;
  }
  // After the reads: waits for the crew; its first error.
  Status finish() { return crew_.wait(); }
  std::vector<std::string> problems() const { return problems_; }
  uint64_t count() const { return count_; }
  DecodeCrew& crew() { return crew_; }

 private:
  Storage& storage_;
  const int64_t step_;
  std::vector<ZLeaf>& leaves_;
  std::vector<ChunkJob>& jobs_;
  const std::vector<std::string>& keys_;
  ProgressReport& progress_;
  const bool verify_;
  const bool prefault_;
  mutable std::atomic<bool> populate_works_{true};  // false once the kernel refused (before 5.14)
  mutable std::atomic<uint64_t> prefaulted_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t held_ = 0, queued_ = 0;
  ChunkBuffers buffers_;
  std::vector<std::string> problems_;
  uint64_t count_ = 0;
  DecodeCrew crew_;  // last: joined first, while the rest is alive
};

Result<zarr::ZArray> leaf_zarray(const std::string& name, const LeafRecord& rec) {
  auto z = zarr::parse_zarray(rec.zarray);
  if (!z.ok()) return z.status().annotate(name + " (.zarray)");
  if (z->shape != rec.shape || z->dtype != rec.dtype)
    return internal_error(name + ": the .zarray disagrees with the leaf record");
  return z;
}

// A chunk's grid position as its C-order rank in the leaf's grid, and back.
uint64_t chunk_rank(const zarr::ZArray& z, std::span<const uint64_t> idx) {
  uint64_t r = 0;
  for (size_t d = 0; d < idx.size(); ++d) r = r * z.grid[d] + idx[d];
  return r;
}
std::vector<uint64_t> chunk_index(const zarr::ZArray& z, uint64_t rank) {
  std::vector<uint64_t> idx(z.grid.size());
  for (size_t d = idx.size(); d-- > 0;) {
    idx[d] = rank % z.grid[d];
    rank /= z.grid[d];
  }
  return idx;
}

// The leaf's stored chunks by rank.
std::vector<std::pair<uint64_t, const ShardRecord*>> stored_chunks(const ZLeaf& L) {
  std::vector<std::pair<uint64_t, const ShardRecord*>> stored;
  stored.reserve(L.rec->shards.size());
  for (const ShardRecord& s : L.rec->shards) {
    std::vector<uint64_t> idx(s.box.start.size());
    for (size_t d = 0; d < idx.size(); ++d) idx[d] = static_cast<uint64_t>(s.box.start[d]) / L.z.chunks[d];
    stored.emplace_back(chunk_rank(L.z, idx), &s);
  }
  std::sort(stored.begin(), stored.end());
  return stored;
}

// A stored chunk's job with its read, once its listed size is plausible
// (checked before a buffer of that size is taken for it).
Status add_read(const ZLeaf& L, const std::string& step_dir, ChunkJob&& j, std::vector<ChunkJob>* jobs,
                std::vector<std::string>* keys, std::vector<ExecRead>* reads) {
  if (Status st = zarr::check_stored_size(L.z.compressor, j.shard->length, L.z.chunk_bytes); !st.ok())
    return st.annotate(L.name + " chunk " + zarr::chunk_key(L.z, j.index) + " (" + step_dir + "/" + j.shard->file + ")");
  reads->push_back(ExecRead{static_cast<uint32_t>(keys->size()), 0, j.shard->length});
  keys->push_back(step_dir + "/" + j.shard->file);
  jobs->push_back(std::move(j));
  return Status::OK();
}

// Beyond this many chunks overlapping a leaf's targets, only the stored
// chunks are walked, and the missing ones are counted from the grid: a
// .zarray may declare a grid of a billion 1-byte chunks and store a few,
// and a plan entry per missing chunk (some 100 bytes each) would take many
// times the leaf's own memory before the restore found out.
constexpr uint64_t kWalkChunks = 1 << 20;

// Chunks a restore needs and the store lacks: the first few (for the error
// and, when every missing chunk has one, to fill each), and how many in all.
struct Missing {
  std::vector<ChunkJob> jobs;    // every missing chunk, or (counted) only the first
  uint64_t count = 0;            // distinct chunks
  bool at_least = false;         // count is a lower bound (see union_count)
  std::vector<std::pair<uint32_t, uint32_t>> fill_targets;  // (leaf, target): fill whole first
};

bool in_range(const zarr::ChunkRange& r, std::span<const uint64_t> idx) {
  for (size_t d = 0; d < idx.size(); ++d)
    if (idx[d] < r.first[d] || idx[d] >= r.last[d]) return false;
  return true;
}

// The first chunk of `r` (C order) that is not in `stored` (sorted ranks):
// walks at most stored.size() + 1 positions.
std::vector<uint64_t> first_missing(const zarr::ZArray& z, const zarr::ChunkRange& r,
                                    const std::vector<std::pair<uint64_t, const ShardRecord*>>& stored) {
  std::vector<uint64_t> found;
  zarr::for_each_chunk(r, [&](std::span<const uint64_t> idx) {
    const uint64_t rank = chunk_rank(z, idx);
    auto it = std::lower_bound(stored.begin(), stored.end(), std::make_pair(rank, static_cast<const ShardRecord*>(nullptr)));
    if (it != stored.end() && it->first == rank) return true;
    found.assign(idx.begin(), idx.end());
    return false;
  });
  return found;
}

// How many distinct chunks the ranges cover together, exactly: identical
// ranges (replicated targets) count once, disjoint ones add up, and ranges
// that overlap otherwise are cut along every range's bounds into cells (at
// most kMaxCells of them). Beyond that, nullopt.
std::optional<uint64_t> union_count(std::vector<zarr::ChunkRange> ranges) {
  constexpr uint64_t kMaxCells = 1 << 16;
  std::erase_if(ranges, [](const zarr::ChunkRange& r) { return r.count == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return std::tie(a.first, a.last) < std::tie(b.first, b.last); });
  ranges.erase(std::unique(ranges.begin(), ranges.end(),
                           [](const auto& a, const auto& b) { return a.first == b.first && a.last == b.last; }),
               ranges.end());
  auto meet = [](const zarr::ChunkRange& a, const zarr::ChunkRange& b) {
    for (size_t d = 0; d < a.first.size(); ++d)
      if (std::max(a.first[d], b.first[d]) >= std::min(a.last[d], b.last[d])) return false;
    return true;
  };
  bool disjoint = true;
  for (size_t i = 0; i < ranges.size() && disjoint; ++i)
    for (size_t k = i + 1; k < ranges.size() && disjoint; ++k) disjoint = !meet(ranges[i], ranges[k]);
  uint64_t total = 0;
  if (disjoint) {
    for (const auto& r : ranges)
      if (__builtin_add_overflow(total, r.count, &total)) return std::nullopt;
    return total;
  }
  const size_t rank = ranges.front().first.size();
  std::vector<std::vector<uint64_t>> cuts(rank);
  uint64_t cells = 1;
  for (size_t d = 0; d < rank; ++d) {
    for (const auto& r : ranges) cuts[d].insert(cuts[d].end(), {r.first[d], r.last[d]});
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    if (__builtin_mul_overflow(cells, cuts[d].size() - 1, &cells) || cells > kMaxCells) return std::nullopt;
  }
  std::vector<size_t> at(rank, 0);  // the cell: [cuts[d][at[d]], cuts[d][at[d] + 1]) per dimension
  for (uint64_t c = 0; c < cells; ++c) {
    bool covered = false;
    for (const auto& r : ranges) {
      covered = true;
      for (size_t d = 0; d < rank && covered; ++d) covered = r.first[d] <= cuts[d][at[d]] && cuts[d][at[d]] < r.last[d];
      if (covered) break;
    }
    if (covered) {
      uint64_t v = 1;
      for (size_t d = 0; d < rank; ++d) v *= cuts[d][at[d] + 1] - cuts[d][at[d]];  // within a range's count
      if (__builtin_add_overflow(total, v, &total)) return std::nullopt;
    }
    for (size_t d = rank; d-- > 0;) {
      if (++at[d] + 1 < cuts[d].size()) break;
      at[d] = 0;
    }
  }
  return total;
}

// The chunks each leaf's targets overlap, in leaf order then C order: jobs
// for those the store holds (with reads) come first in `jobs`; the missing
// ones go to `missing`.
Status plan_chunks(std::vector<ZLeaf>& leaves, const std::string& step_dir, std::vector<ChunkJob>* jobs,
                   Missing* missing, std::vector<std::string>* keys, std::vector<ExecRead>* reads) {
  for (uint32_t l = 0; l < leaves.size(); ++l) {
    ZLeaf& L = leaves[l];
    const auto stored = stored_chunks(L);
    std::vector<zarr::ChunkRange> ranges;
    uint64_t overlapping = 0;
    for (const Box& target : L.targets) {
      auto range = zarr::chunks_overlapping(L.z, target);
      if (!range.ok()) return range.status().annotate(L.name);
      if (__builtin_add_overflow(overlapping, range->count, &overlapping)) overlapping = UINT64_MAX;
      ranges.push_back(std::move(*range));
    }
    const bool walk = overlapping <= kWalkChunks;
    // Chunk -> the targets it overlaps.
    std::vector<std::pair<uint64_t, uint32_t>> needs;  // (chunk rank, target)
    if (walk) {
      for (uint32_t t = 0; t < ranges.size(); ++t)
        zarr::for_each_chunk(ranges[t], [&](std::span<const uint64_t> idx) { needs.emplace_back(chunk_rank(L.z, idx), t); });
    } else {  // the stored chunks only (the index lists each), in rank order
      for (const auto& [r, shard] : stored) {
        const std::vector<uint64_t> idx = chunk_index(L.z, r);
        for (uint32_t t = 0; t < ranges.size(); ++t)
          if (in_range(ranges[t], idx)) needs.emplace_back(r, t);
      }
    }
    std::sort(needs.begin(), needs.end());
    std::vector<uint64_t> stored_in(ranges.size(), 0);  // per target (counted path)
    uint64_t stored_any = 0;                            // in any target (counted path)
    for (size_t k = 0; k < needs.size();) {
      ChunkJob j;
      j.leaf = l;
      const uint64_t r = needs[k].first;
      for (; k < needs.size() && needs[k].first == r; ++k) {
        j.targets.push_back(needs[k].second);
        ++stored_in[needs[k].second];
      }
      j.index = chunk_index(L.z, r);
      auto it = std::lower_bound(stored.begin(), stored.end(), std::make_pair(r, static_cast<const ShardRecord*>(nullptr)));
      if (it != stored.end() && it->first == r) {
        j.shard = it->second;
        ++stored_any;
        CKPTIO_RETURN_IF_ERROR(add_read(L, step_dir, std::move(j), jobs, keys, reads));
      } else {
        missing->jobs.push_back(std::move(j));
        ++missing->count;
      }
    }
    if (walk) continue;
    // Counted: each target with missing chunks is filled whole before the
    // stored chunks are decoded over it; the first missing one names them.
    // Where the union of the targets' chunks is too intricate to count, the
    // count is the most any one target misses, a lower bound.
    if (const std::optional<uint64_t> all = union_count(ranges)) {
      missing->count += *all - stored_any;
    } else {
      uint64_t most = 0;
      for (uint32_t t = 0; t < ranges.size(); ++t) most = std::max(most, ranges[t].count - stored_in[t]);
      missing->count += most;
      missing->at_least = true;
    }
    for (uint32_t t = 0; t < ranges.size(); ++t) {
      if (ranges[t].count == stored_in[t]) continue;
      missing->fill_targets.emplace_back(l, t);
      if (missing->jobs.empty()) {
        ChunkJob j;
        j.leaf = l;
        j.index = first_missing(L.z, ranges[t], stored);
        missing->jobs.push_back(std::move(j));
      }
    }
  }
  return Status::OK();
}

// Fills a whole target with the leaf's fill value (zeros when it has none),
// through the leaf's cast: a leaf whose missing chunks were counted, not
// listed, before the stored ones are decoded over it.
Status fill_target(const ZLeaf& L, uint32_t t) {
  const size_t item = dtype_size(L.z.dtype);
  const uint64_t in_bytes = *checked_num_bytes(L.targets[t], item);  // its buffer was allocated
  if (in_bytes == 0) return Status::OK();
  std::vector<std::byte> pattern(std::min<uint64_t>(in_bytes, 64 * 1024) / item * item);
  if (!L.fill.empty())
    for (uint64_t at = 0; at + item <= pattern.size(); at += item) std::memcpy(pattern.data() + at, L.fill.data(), item);
  for (uint64_t at = 0; at < in_bytes; at += pattern.size()) {
    const uint64_t n = std::min<uint64_t>(pattern.size(), in_bytes - at);
    CKPTIO_RETURN_IF_ERROR(L.transform.apply(pattern.data(), L.target_ptrs[t] + L.transform.out_offset(at), n));
  }
  return Status::OK();
}

// verify's plan: every stored chunk, to decode (no targets), and the missing
// ones counted from the size of the grid instead of walking it (a .zarray
// can declare 2^62 chunks); the first kMaxProblems named in `problems`, with
// the stored chunks whose listed size no encoding has. `*uncounted`: the
// problems beyond those named.
void plan_verify(const std::vector<ZLeaf>& leaves, const std::string& step_dir, std::vector<ChunkJob>* jobs,
                 std::vector<std::string>* keys, std::vector<ExecRead>* reads, std::vector<std::string>* problems,
                 uint64_t* uncounted) {
  auto note = [&](std::string p) {
    if (problems->size() < kMaxProblems) problems->push_back(std::move(p));
    else ++*uncounted;
  };
  for (uint32_t l = 0; l < leaves.size(); ++l) {
    const ZLeaf& L = leaves[l];
    const auto stored = stored_chunks(L);
    uint64_t total = 1;
    for (uint64_t g : L.z.grid)
      if (__builtin_mul_overflow(total, g, &total)) total = UINT64_MAX;
    for (const auto& [r, shard] : stored) {
      ChunkJob j;
      j.leaf = l;
      j.index = chunk_index(L.z, r);
      j.shard = shard;
      if (Status st = add_read(L, step_dir, std::move(j), jobs, keys, reads); !st.ok()) note(st.message());
    }
    // The missing ones: the first few by rank (stored ranks are skipped, so
    // this walks at most stored.size() + kMaxProblems positions), the rest
    // counted.
    uint64_t missing = total - std::min<uint64_t>(total, stored.size()), named = 0;
    auto next = stored.begin();
    for (uint64_t r = 0; r < total && named < missing && problems->size() < kMaxProblems; ++r) {
      while (next != stored.end() && next->first < r) ++next;
      if (next != stored.end() && next->first == r) continue;
      note(L.name + " chunk " + zarr::chunk_key(L.z, chunk_index(L.z, r)) +
           " is missing (restore with fill_missing_chunks reads it as the fill value)");
      ++named;
    }
    *uncounted += missing - named;
  }
}

}  // namespace

Status restore_zarr(Storage& storage, const std::string& step_dir, int64_t step,
                    const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                    const RestoreOptions& options, RestoredState* out) {
  const auto t0 = Clock::now();
  std::vector<ZLeaf> leaves(selected.size());
  std::vector<Buffer> buffers;                // owners of whole-leaf targets and device buffers
  std::vector<std::vector<uint32_t>> target_of(selected.size());
  std::optional<ShardingTargets> sharding;
  if (options.sharding) {
    if (!options.into.empty())
      return invalid_argument("restore into a sharding cannot also restore into caller memory (`into`)");
    CKPTIO_ASSIGN_OR_RETURN(ShardingTargets st, ShardingTargets::make(options));
    sharding.emplace(std::move(st));
  }
  CKPTIO_ASSIGN_OR_RETURN(auto dests, match_destinations(selected, options.into));
  const auto want = template_dtypes(options);
  std::vector<size_t> first_buffer(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    const auto& [prefix, rec] = selected[i];
    ZLeaf& L = leaves[i];
    L.rec = rec;
    L.name = prefix + "/" + rec->path;
    CKPTIO_ASSIGN_OR_RETURN(L.z, leaf_zarray(L.name, *rec));
    CKPTIO_ASSIGN_OR_RETURN(L.fill, zarr::fill_value_bytes(L.z));
    Tensor t;
    if (sharding) {
      CKPTIO_ASSIGN_OR_RETURN(LeafTargets lt, sharding->leaf(prefix, *rec));
      L.targets = std::move(lt.targets);
      target_of[i] = std::move(lt.target_of);
      t = std::move(lt.tensor);
    } else {
      t.prefix = prefix;
      t.path = rec->path;
      t.shape = rec->shape;
      t.dtype = restored_dtype(options, want, L.name, rec->dtype);
      L.targets.push_back(Box::whole(rec->shape));
    }
    const RestoreOptions::Destination* dest = dests.empty() ? nullptr : dests[i];
    if (dest && t.dtype != rec->dtype)
      return invalid_argument("restore destination for " + L.name + " cannot take a cast to " +
                              std::string(dtype_name(t.dtype)));
    L.transform = PieceTransform(rec->dtype, t.dtype);
    L.fresh = dest == nullptr;
    first_buffer[i] = buffers.size();
    CKPTIO_RETURN_IF_ERROR(check_restored_bytes(L.name, rec->shape, t.dtype));  // (each box lies inside)
    for (const Box& b : L.targets) {
      const uint64_t bytes = *checked_num_bytes(b, dtype_size(t.dtype));
      buffers.push_back(dest ? Buffer::wrap(dest->data, dest->size) : Buffer::allocate(bytes, 64));
      L.target_ptrs.push_back(buffers.back().data());
      out->stats.bytes_needed += *checked_num_bytes(b, dtype_size(rec->dtype));
    }
    out->leaves.push_back(std::move(t));
  }

  std::vector<ChunkJob> jobs;
  Missing missing;
  std::vector<std::string> keys;
  std::vector<ExecRead> reads;
  CKPTIO_RETURN_IF_ERROR(plan_chunks(leaves, step_dir, &jobs, &missing, &keys, &reads));
  if (missing.count && !options.fill_missing_chunks) {
    const ChunkJob& j = missing.jobs.front();
    return data_loss("restore " + leaves[j.leaf].name + " of step " + std::to_string(step) + ": chunk " +
                     zarr::chunk_key(leaves[j.leaf].z, j.index) + " is missing at " + storage.describe() + "/" +
                     step_dir +
                     (missing.count > 1 ? std::string(missing.at_least ? " (and at least " : " (and ") +
                                              std::to_string(missing.count - 1) + " more)"
                                        : "") +
                     "; restore with fill_missing_chunks to read missing chunks as the array's fill value");
  }
  // Leaves with too many missing chunks to list: filled whole, here, before
  // any chunk is decoded into them; their missing jobs are not decoded.
  for (const auto& [l, t] : missing.fill_targets) CKPTIO_RETURN_IF_ERROR(fill_target(leaves[l], t));
  if (!missing.fill_targets.empty()) {
    std::erase_if(missing.jobs, [&](const ChunkJob& j) {
      return std::any_of(missing.fill_targets.begin(), missing.fill_targets.end(),
                         [&](const auto& lt) { return lt.first == j.leaf; });
    });
  }
  uint64_t to_read = 0;
  for (const ExecRead& r : reads) to_read += r.length;
  out->stats.bytes_read = to_read;
  out->stats.requests = reads.size();
  out->stats.pieces_unverified = jobs.size();
  out->stats.bytes_unverified = to_read;
  const auto t_read = Clock::now();
  out->stats.plan_seconds = std::chrono::duration<double>(t_read - t0).count();

  ProgressReport progress(options.on_progress, to_read);
  ZarrConsumer consumer(storage, step, leaves, jobs, keys, progress, /*verify=*/false, options.prefault);
  for (ChunkJob& j : missing.jobs)
    consumer.crew().submit([&consumer, &j](zarr::ChunkDecoder* d, DecodeCrew::Scratch& s, bool skip) {
      return skip ? Status::OK() : consumer.decode(j, *d, s);
    });
  ReadExecutorLimits el;
  el.batch_bytes = kBatchBytes;
  el.align = 1;
  Status st = execute_reads(storage, keys, &reads, consumer, el, "restore step " + std::to_string(step));
  Status decoded = consumer.finish();
  CKPTIO_RETURN_IF_ERROR(st);
  CKPTIO_RETURN_IF_ERROR(decoded);
  progress.finish();
  out->stats.read_seconds = std::chrono::duration<double>(Clock::now() - t_read).count();
  out->stats.bytes_prefaulted = consumer.prefaulted();

  for (size_t i = 0; i < selected.size(); ++i) {
    Tensor& t = out->leaves[i];
    if (sharding) {
      for (size_t d = 0; d < t.device_shards.size(); ++d)
        t.device_shards[d].data = buffers[first_buffer[i] + target_of[i][d]];
    } else {
      t.data = buffers[first_buffer[i]];
    }
  }
  return Status::OK();
}

Status verify_zarr(Storage& storage, const std::string& step_dir, const Index& index,
                   const ProgressHook& on_progress) {
  std::vector<ZLeaf> leaves;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& rec : p.leaves) {
      ZLeaf L;
      L.rec = &rec;
      L.name = p.name + "/" + rec.path;
      CKPTIO_ASSIGN_OR_RETURN(L.z, leaf_zarray(L.name, rec));
      L.targets.push_back(Box::whole(rec.shape));
      leaves.push_back(std::move(L));
    }
  std::vector<ChunkJob> jobs;
  std::vector<std::string> keys, planned;
  std::vector<ExecRead> reads;
  uint64_t uncounted = 0;
  plan_verify(leaves, step_dir, &jobs, &keys, &reads, &planned, &uncounted);
  uint64_t to_read = 0;
  for (const ExecRead& r : reads) to_read += r.length;
  ProgressReport progress(on_progress, to_read);
  ZarrConsumer consumer(storage, index.step, leaves, jobs, keys, progress, /*verify=*/true);
  for (std::string& p : planned) consumer.note(std::move(p));
  consumer.note_more(uncounted);
  ReadExecutorLimits el;
  el.batch_bytes = kBatchBytes;
  Status st = execute_reads(storage, keys, &reads, consumer, el, "verify step " + std::to_string(index.step));
  Status decoded = consumer.finish();
  CKPTIO_RETURN_IF_ERROR(st);
  CKPTIO_RETURN_IF_ERROR(decoded);
  progress.finish();
  if (consumer.count() == 0) return Status::OK();
  std::string msg = "verify step " + std::to_string(index.step) + " at " + storage.describe() + "/" + step_dir +
                    " (eformer layout): " + std::to_string(consumer.count()) + " damaged or missing chunk(s): ";
  const auto problems = consumer.problems();
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  if (consumer.count() > problems.size()) msg += "; ...";
  return data_loss(msg);
}

}  // namespace ckptio
