// Restore of whole leaves: plan reads per shard, cut into pieces of at most
// kPieceBytes so that checksumming overlaps reading even for one huge leaf,
// and hand them to the read executor (src/restore/read_executor.h), which
// reads two batches at once while this thread checksums the one that landed,
// scatters its non-contiguous shards into whole leaves and casts where asked
// (src/transform/transform.h, per piece).
//
// A leaf held in one shard is allocated so that its address agrees with the
// shard's file offset modulo the backend's read alignment, letting direct
// I/O land in it without a bounce copy. Small shards (<= 256 KiB) that lie
// next to each other in a file are read together, up to 8 MiB a request:
// straight into their leaves when those lie in memory as the shards lie in
// the file (leaves restore allocates: one allocation per group, each leaf a
// slice of it; caller destinations that happen to be adjacent), otherwise
// into the executor's staging arenas (up to 64 MiB per batch, two arenas,
// reused) and copied out.
//
// Planning goes in chunks of leaves: the reads of the first chunk start as
// soon as it is planned, and the rest is planned while they are in flight (a
// state of 100,000 small leaves spends ~30 ms planning, which otherwise the
// device would wait for). Chunks double from kFirstChunkLeaves leaves up to
// kMaxChunkLeaves and hold at most kBatchBytes of payload, or
// kFileOrderChunkBytes where a chunk's pieces are read in file order (unless
// one leaf is larger).
//
// Why not the box planner (src/restore/read_planner.h), as the restore into
// a sharding does: its plan is per leaf, and the whole point here is the
// requests shared across leaves (100,000 small leaves read in a few hundred
// requests, landing in place) at ~0.3 us of planning per leaf; one
// ReadPlan per leaf costs several allocations each. Both feed the same
// executor, transform stage and checksums.
#include "src/restore/restore_whole.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <tuple>

#include "src/restore/damage.h"
#include "src/restore/destinations.h"
#include "src/restore/read_executor.h"
#include "src/restore/targets.h"
#include "src/transform/transform.h"
#include "src/util/box_runs.h"
#include "src/util/crc32c.h"
#include "src/util/populate.h"

namespace ckptio {
namespace {

constexpr uint64_t kPieceBytes = 64ull << 20;
constexpr uint64_t kBatchBytes = 256ull << 20;
constexpr size_t kFirstChunkLeaves = 1024;
constexpr size_t kMaxChunkLeaves = 16384;
// Payload per chunk (unless one leaf is larger): one batch, or, where a
// chunk is read in file order (below), large, so that its reads cover long
// stretches of each data file even where the shards of all leaves
// interleave (row bands). The leaves of a chunk are allocated when it is
// planned, which a restore does for every leaf anyway.
constexpr uint64_t kFileOrderChunkBytes = 64ull << 30;
constexpr uint64_t kSmallShard = 256ull << 10;  // shards up to this size may be grouped
constexpr uint64_t kGroupGap = 4ull << 10;      // bytes between members read and discarded
constexpr uint64_t kGroupMax = 8ull << 20;      // per request
// Staged reads (groups that cannot land in place, pieces of cast leaves) per
// batch: with two batches in flight up to 16 reads of 8 MiB outstanding, and
// the two arenas reused from batch to batch.
constexpr uint64_t kScratchPerBatch = 64ull << 20;
constexpr uint64_t kPrefaultMin = 1ull << 20;  // smaller allocations: faulted by their reads

using Clock = std::chrono::steady_clock;

std::string leaf_name(const std::string& prefix, const LeafRecord& leaf) {
  return prefix + "/" + leaf.path;
}

// True if `box` occupies one contiguous byte range of the C-order array of
// `shape`; then `*element_offset` is where it starts.
bool box_is_contiguous(const Box& box, const Shape& shape, uint64_t* element_offset) {
  const size_t r = box.rank();
  size_t k = r;  // dims >= k are spanned fully
  while (k > 0 && box.start[k - 1] == 0 && box.stop[k - 1] == shape[k - 1]) --k;
  // dims < k-1 must have extent 1 (the one at k-1 may be partial)
  for (size_t d = 0; d + 1 < k; ++d)
    if (box.stop[d] - box.start[d] != 1) return false;
  uint64_t off = 0;
  for (size_t d = 0; d < r; ++d) off = off * static_cast<uint64_t>(shape[d]) + box.start[d];
  *element_offset = off;
  return true;
}

// Copies a shard's C-order bytes into its box of the whole array, through
// the leaf's transform: run by run, as src/util/box_runs.h lays them out.
Status scatter_box(const std::byte* src, const Box& box, const Shape& shape, size_t item,
                   const PieceTransform& tf, std::byte* dst) {
  if (box.rank() == 0) return tf.apply(src, dst, item);
  if (box_is_empty(box)) return Status::OK();
  CKPTIO_ASSIGN_OR_RETURN(RunLayout layout, run_layout(box, 0, box, Box::whole(shape), item));
  Status st;
  for_each_run(layout, [&](uint64_t from, uint64_t to, uint64_t n) {
    if (st.ok()) st = tf.apply(src + from, dst + tf.out_offset(to), n);
  });
  return st;
}

struct ShardTask {
  const std::string* prefix = nullptr;
  const LeafRecord* leaf_rec = nullptr;
  size_t shard = 0;                 // index in leaf_rec->shards
  uint32_t file = 0;                // ordinal of its data file (the executor's key index)
  const ShardRecord* rec = nullptr;
  std::byte* bytes = nullptr;   // where the shard's bytes land (leaf or temp; none when staged)
  uint64_t at = 0;              // of a contiguous shard: its byte offset in the saved leaf
  Buffer temp;                  // when the shard is scattered afterwards
  bool scatter = false;
  bool staged = false;          // contiguous, into a cast leaf: lands in staging, transformed out
  size_t leaf = 0;              // index into the output leaves
  uint32_t crc = 0;             // running checksum
};

struct Piece {
  size_t task = 0;
  uint64_t at = 0;   // offset inside the shard
  uint64_t len = 0;
  int64_t group = -1;  // >= 0: one read of a Group (task, at unused)
};

// Small shards next to each other in one data file, read with one request:
// a state of 100,000 small leaves is then read in a few hundred requests
// instead of 100,000. A direct group lands in its leaves themselves (they lie
// in memory as in the file); any other is staged and each shard copied out.
struct Group {
  uint32_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  std::vector<size_t> tasks;
  bool direct = false;
  Buffer slab;                 // direct, leaves restore allocates: all of them
  std::byte* bytes = nullptr;  // direct: where byte `offset` lands
};

uint64_t selected_bytes(const std::vector<std::pair<std::string, LeafRecord*>>& selected) {
  uint64_t n = 0;
  for (const auto& sel : selected) n += sel.second->num_bytes();  // the index checked the sum fits
  return n;
}

class WholeRestore : public ReadConsumer {
 public:
  WholeRestore(Storage& storage, const std::string& step_dir, const Index& index,
               const std::vector<std::pair<std::string, LeafRecord*>>& selected, const RestoreOptions& options,
               std::vector<const RestoreOptions::Destination*> dests, RestoredState* out)
      : storage_(storage), selected_(selected), options_(options), dests_(std::move(dests)),
        out_(*out), align_(std::max<uint64_t>(storage.read_alignment(), 1)),
        of_step_(" of step " + std::to_string(index.step)),
        progress_(options.on_progress, options.on_progress ? selected_bytes(selected) : 0) {
    // One key per data file, numbered in index order.
    for (const DataFileRecord& f : index.files) {
      file_ordinal_.try_emplace(f.name, static_cast<uint32_t>(keys_.size()));
      keys_.push_back(step_dir + "/" + f.name);
    }
    tasks_.reserve(selected.size());
    out_.leaves.reserve(selected.size());
    // Object stores, for steps whose leaves were saved in several pieces each
    // (shards of several processes, row bands): there leaf order scatters a
    // batch over the data files. A step of whole leaves lies in leaf order.
    size_t shards = 0;
    for (const auto& sel : selected) shards += sel.second->shards.size();
    file_order_ = !storage.caps().atomic_rename && shards > selected.size();
    want_ = template_dtypes(options);
  }

  const std::vector<std::string>& keys() const { return keys_; }
  Clock::time_point first_planned() const { return first_planned_; }
  uint64_t prefaulted() const { return prefaulted_.load(std::memory_order_relaxed); }

  Result<bool> more(std::vector<ExecRead>* reads) override {
    CKPTIO_RETURN_IF_ERROR(plan_chunk(reads));
    if (chunk_ends_.size() == 1) first_planned_ = Clock::now();
    return next_leaf_ < selected_.size();
  }

  std::byte* destination(size_t i) override {
    const Piece& p = pieces_[i];
    if (p.group >= 0) return groups_[p.group].direct ? groups_[p.group].bytes : nullptr;
    ShardTask& t = tasks_[p.task];
    if (t.staged) return nullptr;
    if (t.scatter && p.at == 0) {  // its temporary, made as its first piece is launched
      t.temp = Buffer::allocate(t.rec->length, std::max<uint64_t>(align_, 64), t.rec->offset % align_);
      t.bytes = t.temp.data();
    }
    return t.bytes + p.at;
  }

  // Checksums a piece (a group: each member) and completes shards at their
  // end: a non-contiguous shard is scattered into its leaf and its temporary
  // freed, so temporaries live only while their shard is in flight and a
  // step saved in non-contiguous shards (a 2x4 mesh) restores in memory
  // bounded by the batches, the scatter overlapping the reads.
  Status landed(size_t i, const std::byte* bytes) override {
    const Piece& p = pieces_[i];
    if (p.group >= 0) {
      const Group& g = groups_[p.group];
      for (size_t ti : g.tasks) {
        ShardTask& t = tasks_[ti];
        const std::byte* in = bytes + (t.rec->offset - g.offset);
        if (options_.verify && crc32c(in, t.rec->length, 0) != t.rec->crc32c) return checksum_mismatch(t);
        payload_ += t.rec->length;
        if (g.direct) continue;
        CKPTIO_RETURN_IF_ERROR(t.scatter ? scatter(t, in) : deliver(t, in, 0, t.rec->length));
      }
      return Status::OK();
    }
    ShardTask& t = tasks_[p.task];
    if (options_.verify) t.crc = crc32c(bytes, p.len, t.crc);
    payload_ += p.len;
    if (t.staged) CKPTIO_RETURN_IF_ERROR(deliver(t, bytes, p.at, p.len));
    if (p.at + p.len != t.rec->length) return Status::OK();
    if (options_.verify && t.crc != t.rec->crc32c) return checksum_mismatch(t);
    if (t.scatter) {
      CKPTIO_RETURN_IF_ERROR(scatter(t, t.bytes));
      t.temp = Buffer();
      t.bytes = nullptr;
    }
    return Status::OK();
  }

  // Leaves whose reads are all delivered: their names and shapes move from
  // the index to the result and their shard records are freed, on this
  // thread while later reads are in flight. (The index is ours to take
  // apart: the caller discards it; `selected` points into it.)
  void delivered(size_t end, uint64_t) override {
    size_t leaf_end = released_;
    while (chunks_done_ < chunk_ends_.size() && chunk_ends_[chunks_done_].first <= end)
      leaf_end = chunk_ends_[chunks_done_++].second;
    release(leaf_end);
    progress_.update(payload_);
  }
  // A restore that failed (a read's error, damage, a throwing progress
  // hook) stops the prefault thread too, before prefaults_ waits for it:
  // before, it went on faulting in every fresh leaf (GiBs) first.
  ~WholeRestore() override { reads_done_.store(true, std::memory_order_relaxed); }
  // Every leaf's cast is one it can take, checked before any read (a
  // destination in `into` takes none: before, the check came chunk by
  // chunk, after earlier chunks had overwritten the caller's buffers).
  Status check_casts() const {
    for (size_t i = 0; i < selected_.size(); ++i) {
      CKPTIO_ASSIGN_OR_RETURN(DType to, restored_dtype(i));
      const auto& [prefix, leaf] = selected_[i];
      CKPTIO_RETURN_IF_ERROR(check_restored_bytes(leaf_name(prefix, *leaf), leaf->shape, to));
    }
    return Status::OK();
  }
  void finish() {
    reads_done_.store(true, std::memory_order_relaxed);  // the prefault thread stops at its next slice
    for (auto& f : prefaults_) f.wait();
    release(out_.leaves.size());
    progress_.finish();
  }

  // Read i failed on its own: names the shard (for a group of small shards,
  // the member that fails on its own). The group is halved, each half read
  // as one span, and a failing half kept, so that a file cut short names
  // its member in about 2 log2(members) requests: one read per member took
  // 2,932 GETs on moto for a group of ~3,000 shards.
  Status failed(size_t i, Status st) override {
    const Piece& p = pieces_[i];
    if (p.group < 0) {
      const ShardTask& t = tasks_[p.task];
      return data_read_error(st, "restore " + where(t) + of_step_, storage_.describe() + "/" + keys_[t.file]);
    }
    const Group& g = groups_[p.group];
    // Reads the members [from, to) of g as one span.
    auto read_members = [&](size_t from, size_t to) {
      const ShardRecord& first = *tasks_[g.tasks[from]].rec;
      const ShardRecord& last = *tasks_[g.tasks[to - 1]].rec;
      const uint64_t length = last.offset + last.length - first.offset;
      Buffer scratch = Buffer::allocate(length, std::max<uint64_t>(align_, 64), first.offset % align_);
      ReadRequest r{keys_[g.file], first.offset, length, scratch.data()};
      return storage_.read(std::span<const ReadRequest>(&r, 1));
    };
    size_t lo = 0, hi = g.tasks.size();  // [lo, hi): members whose span failed (the whole group first)
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (Status left = read_members(lo, mid); !left.ok()) {
        hi = mid;
        st = left;
      } else if (Status right = read_members(mid, hi); !right.ok()) {
        lo = mid;
        st = right;
      } else {  // (a transient failure) the span failed as a whole only
        return data_read_error(st, "restore the " + std::to_string(hi - lo) + " small shards from " +
                                       where(tasks_[g.tasks[lo]]) + " on" + of_step_,
                               storage_.describe() + "/" + keys_[g.file]);
      }
    }
    const ShardTask& t = tasks_[g.tasks[lo]];  // its own read failed with st
    return data_read_error(st, "restore " + where(t) + of_step_, storage_.describe() + "/" + keys_[t.file]);
  }

 private:
  // "model/params.w shard 0 (file data-...bin, bytes [0, 64))", for messages:
  // built only when one is needed (a restore of 100,000 leaves builds none).
  static std::string where(const ShardTask& t) {
    return leaf_name(*t.prefix, *t.leaf_rec) + " shard " + std::to_string(t.shard) + " (file " + t.rec->file +
           ", " + byte_range(t.rec->offset, t.rec->length) + ")";
  }
  Status checksum_mismatch(const ShardTask& t) const {
    return data_loss("checksum mismatch in " + where(t) + of_step_ + " at " + storage_.describe() + "/" +
                     keys_[t.file]);
  }
  Status scatter(const ShardTask& t, const std::byte* from) {
    Tensor& leaf = out_.leaves[t.leaf];
    return scatter_box(from, t.rec->box, t.leaf_rec->shape, dtype_size(t.leaf_rec->dtype), transforms_[t.leaf],
                       leaf.data.data());
  }
  // Bytes [at, at + len) of contiguous shard t, landed at `in`, into its leaf.
  Status deliver(const ShardTask& t, const std::byte* in, uint64_t at, uint64_t len) {
    const PieceTransform& tf = transforms_[t.leaf];
    return tf.apply(in, out_.leaves[t.leaf].data.data() + tf.out_offset(t.at + at), len);
  }

  // The dtype leaf i is restored in (targets.h's restored_dtype, as every
  // restore path chooses it); a destination in `into` takes no cast.
  Result<DType> restored_dtype(size_t i) const {
    const auto& [prefix, leaf] = selected_[i];
    const DType to = ckptio::restored_dtype(options_, want_, leaf_name(prefix, *leaf), leaf->dtype);
    if (to != leaf->dtype && !dests_.empty() && dests_[i])
      return invalid_argument("restore destination for " + leaf_name(prefix, *leaf) + " cannot take a cast to " +
                              std::string(dtype_name(to)));
    return to;
  }

  Status plan_chunk(std::vector<ExecRead>* reads);
  void group_small_shards(size_t task_begin, std::vector<int64_t>* group_of);
  void allocate(size_t leaf_begin, size_t group_begin);
  void prefault(size_t leaf_begin, size_t group_begin);

  void release(size_t leaf_end) {
    for (; released_ < leaf_end; ++released_) {
      LeafRecord& leaf = *selected_[released_].second;
      out_.leaves[released_].path = std::move(leaf.path);
      out_.leaves[released_].shape = std::move(leaf.shape);
      std::vector<ShardRecord>().swap(leaf.shards);
    }
  }

  Storage& storage_;
  const std::vector<std::pair<std::string, LeafRecord*>>& selected_;
  const RestoreOptions& options_;
  const std::vector<const RestoreOptions::Destination*> dests_;
  RestoredState& out_;
  const uint64_t align_;
  const std::string of_step_;
  std::vector<std::string> keys_;
  std::map<std::string, uint32_t, std::less<>> file_ordinal_;
  std::map<std::string, DType> want_;
  bool file_order_ = false;

  std::vector<ShardTask> tasks_;
  std::vector<Group> groups_;
  std::vector<Piece> pieces_;               // parallel to the executor's reads
  std::vector<PieceTransform> transforms_;  // per leaf
  std::vector<bool> allocate_later_;        // per leaf: no caller's destination, not yet allocated
  std::vector<bool> allocated_;             // per leaf: a buffer of its own that restore allocated
  std::atomic<bool> reads_done_{false};       // (before prefaults_, whose threads read it)
  std::vector<std::future<void>> prefaults_;  // prefault(): one per chunk that allocated enough
  std::atomic<uint64_t> prefaulted_{0};
  // Per chunk: its reads end at .first, its leaves at .second.
  std::vector<std::pair<size_t, size_t>> chunk_ends_;
  size_t chunks_done_ = 0;
  size_t next_leaf_ = 0;  // the first leaf not yet planned
  size_t chunk_leaves_ = kFirstChunkLeaves;
  size_t released_ = 0;
  Clock::time_point first_planned_;
  uint64_t payload_ = 0;  // bytes of shards delivered
  ProgressReport progress_;
};

// Plans the next chunk: one task per shard, groups of small shards, the
// allocation of the leaves, pieces and their reads.
Status WholeRestore::plan_chunk(std::vector<ExecRead>* reads) {
  const size_t leaf_begin = next_leaf_, task_begin = tasks_.size(), group_begin = groups_.size();
  const uint64_t chunk_max = file_order_ ? kFileOrderChunkBytes : kBatchBytes;
  uint64_t chunk_bytes = 0;
  auto file = file_ordinal_.end();  // of the shard before: shards come in runs of one file
  for (; next_leaf_ < selected_.size() && next_leaf_ - leaf_begin < chunk_leaves_; ++next_leaf_) {
    const auto& [prefix, leaf] = selected_[next_leaf_];
    if (next_leaf_ > leaf_begin && chunk_bytes + leaf->num_bytes() > chunk_max) break;
    Tensor t;
    t.prefix = prefix;  // path and shape: moved from the index once the data is in
    CKPTIO_ASSIGN_OR_RETURN(t.dtype, restored_dtype(next_leaf_));
    transforms_.emplace_back(leaf->dtype, t.dtype);
    const bool cast = t.dtype != leaf->dtype;
    const size_t item = dtype_size(leaf->dtype);
    const RestoreOptions::Destination* dest = dests_.empty() ? nullptr : dests_[next_leaf_];
    if (dest) t.data = Buffer::wrap(dest->data, dest->size);
    allocate_later_.push_back(dest == nullptr);
    allocated_.push_back(false);
    for (size_t i = 0; i < leaf->shards.size(); ++i) {
      const ShardRecord& rec = leaf->shards[i];
      ShardTask task;
      task.prefix = &prefix;
      task.leaf_rec = leaf;
      task.shard = i;
      if (file == file_ordinal_.end() || file->first != rec.file) file = file_ordinal_.find(rec.file);
      if (file == file_ordinal_.end())  // the index reader checks every reference
        return internal_error("shard of " + leaf_name(prefix, *leaf) + " names unlisted file " + rec.file);
      task.file = file->second;
      task.rec = &rec;
      task.leaf = out_.leaves.size();
      uint64_t elem = 0;
      if (box_is_contiguous(rec.box, leaf->shape, &elem)) {
        task.at = elem * item;
        task.staged = cast;
        if (dest) task.bytes = t.data.data() + task.at;
      } else {
        task.scatter = true;  // its temporary comes with its first read (destination())
      }
      tasks_.push_back(std::move(task));
    }
    out_.leaves.push_back(std::move(t));
    out_.stats.bytes_needed += leaf->num_bytes();
    chunk_bytes += leaf->num_bytes();
  }
  chunk_leaves_ = std::min(2 * chunk_leaves_, kMaxChunkLeaves);

  std::vector<int64_t> group_of(tasks_.size() - task_begin, -1);  // per task of the chunk
  group_small_shards(task_begin, &group_of);
  allocate(leaf_begin, group_begin);

  std::vector<Piece> chunk;
  for (size_t i = task_begin; i < tasks_.size(); ++i) {
    ShardTask& t = tasks_[i];
    if (!t.scatter && !t.staged && !t.bytes) t.bytes = out_.leaves[t.leaf].data.data() + t.at;
    const int64_t gi = group_of[i - task_begin];
    if (gi >= 0) {
      if (groups_[gi].tasks.front() == i) chunk.push_back(Piece{i, 0, groups_[gi].length, gi});
      continue;
    }
    for (uint64_t at = 0; at < t.rec->length; at += kPieceBytes)
      chunk.push_back(Piece{i, at, std::min(kPieceBytes, t.rec->length - at)});
  }
  // In file order (object stores, steps of leaves in several pieces), so
  // that a batch holds neighbouring ranges of a data file, which the store
  // serves with one GET, even where the file interleaves the shards of many
  // leaves (row bands). Stable: a shard's pieces keep their order, which its
  // streaming checksum needs. Local disk keeps leaf order: a request costs
  // little there, and a batch's scatters then stay within a few leaves (file
  // order measured ~25% slower on a 2x4-saved step, docs/read-planning.md
  // "Row bands").
  auto position = [&](const Piece& p) {
    if (p.group >= 0) return std::pair(groups_[p.group].file, groups_[p.group].offset);
    const ShardTask& t = tasks_[p.task];
    return std::pair(t.file, t.rec->offset + p.at);
  };
  if (file_order_)
    std::stable_sort(chunk.begin(), chunk.end(),
                     [&](const Piece& a, const Piece& b) { return position(a) < position(b); });
  for (const Piece& p : chunk) {
    const auto [f, offset] = position(p);
    reads->push_back(ExecRead{f, offset, p.len});
    pieces_.push_back(p);
  }
  // A batch never spans two chunks: the first batches stay as small as the
  // first chunks, so checksums start early (measured: batches of up to
  // 256 MiB across chunks restored 100,000 leaves ~10% slower).
  if (!reads->empty()) reads->back().ends_batch = true;
  chunk_ends_.emplace_back(reads->size(), next_leaf_);
  return Status::OK();
}

// Groups the chunk's small shards by file position.
void WholeRestore::group_small_shards(size_t task_begin, std::vector<int64_t>* group_of) {
  std::vector<size_t> order;
  for (size_t i = task_begin; i < tasks_.size(); ++i)
    if (tasks_[i].rec->length > 0 && tasks_[i].rec->length <= kSmallShard) order.push_back(i);
  auto by_position = [&](size_t a, size_t b) {
    return std::tie(tasks_[a].file, tasks_[a].rec->offset) < std::tie(tasks_[b].file, tasks_[b].rec->offset);
  };
  if (!std::is_sorted(order.begin(), order.end(), by_position))  // usually they are: saved in this order
    std::sort(order.begin(), order.end(), by_position);
  Group g;
  auto close = [&] {
    if (g.tasks.size() >= 2) {
      for (size_t t : g.tasks) (*group_of)[t - task_begin] = static_cast<int64_t>(groups_.size());
      groups_.push_back(std::move(g));
    }
    g = Group{};
  };
  for (size_t i : order) {
    const ShardRecord& r = *tasks_[i].rec;
    const bool fits = !g.tasks.empty() && tasks_[i].file == g.file && r.offset >= g.offset + g.length &&
                      r.offset <= g.offset + g.length + kGroupGap && r.offset + r.length - g.offset <= kGroupMax;
    if (!fits) {
      close();
      g.file = tasks_[i].file;
      g.offset = r.offset;
    }
    g.tasks.push_back(i);
    g.length = r.offset + r.length - g.offset;
  }
  close();
}

// Direct groups, and the allocation of the leaves left. A group is direct
// when every member is a whole leaf restore allocates, in the dtype it was
// saved in (one allocation for the group, placed so that its address agrees
// with the group's file offset modulo the read alignment, as a leaf's own
// would be; each leaf a slice of it, so the group's memory is freed with its
// last leaf), or when every member's destination follows the one before
// exactly as its shard follows in the file (no gap: the caller's bytes only).
void WholeRestore::allocate(size_t leaf_begin, size_t group_begin) {
  const uint64_t alignment = std::max<uint64_t>(align_, 64);
  for (size_t gi = group_begin; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    bool ours = true, theirs = true;
    for (size_t k = 0; k < g.tasks.size() && (ours || theirs); ++k) {
      const ShardTask& t = tasks_[g.tasks[k]];
      const bool later = allocate_later_[t.leaf];
      // (Each member's slice must start aligned for its dtype: in a step saved
      // before shards were aligned, a float64 may follow a 3-byte leaf.)
      ours = ours && later && t.leaf_rec->shards.size() == 1 && !t.staged &&
             (g.offset % align_ + (t.rec->offset - g.offset)) % dtype_alignment(t.leaf_rec->dtype) == 0;
      if (k == 0) {
        theirs = theirs && !later && !t.scatter;
        continue;
      }
      const ShardTask& before = tasks_[g.tasks[k - 1]];
      theirs = theirs && !later && !t.scatter && t.rec->offset == before.rec->offset + before.rec->length &&
               t.bytes == before.bytes + before.rec->length;
    }
    if (ours) {
      g.direct = true;
      g.slab = Buffer::allocate(g.length, alignment, g.offset % align_);
      g.bytes = g.slab.data();
      for (size_t ti : g.tasks) {
        ShardTask& t = tasks_[ti];
        out_.leaves[t.leaf].data = g.slab.slice(t.rec->offset - g.offset, t.rec->length);
        allocate_later_[t.leaf] = false;
      }
    } else if (theirs) {
      g.direct = true;
      g.bytes = tasks_[g.tasks.front()].bytes;
    }
  }
  for (size_t i = leaf_begin; i < next_leaf_; ++i) {
    if (!allocate_later_[i]) continue;
    const LeafRecord& leaf = *selected_[i].second;
    const PieceTransform& tf = transforms_[i];
    uint64_t phase = tf.identity() && leaf.shards.size() == 1 ? leaf.shards[0].offset % align_ : 0;
    if (phase % dtype_alignment(leaf.dtype) != 0) phase = 0;  // (an odd offset of an older step: a bounce)
    out_.leaves[i].data = Buffer::allocate(tf.out_offset(leaf.num_bytes()), alignment, phase);
    allocate_later_[i] = false;
    allocated_[i] = true;
  }
  prefault(leaf_begin, group_begin);
}

// The memory this chunk allocated, faulted in on a thread of its own while
// the reads land in it (populate_in_background: from the last range
// backwards, meeting the reads coming from the front). Without it, each 4 KiB
// page of fresh memory is faulted by the kernel inside the read's submission
// (get_user_pages for O_DIRECT, copy_to_user otherwise), one after another on
// the thread that submits every read. On this VM, against a device faster
// than one core faults pages in (7 GB/s), the thread made restores 1.08-1.70x
// faster and took away most of their worst runs; where the disk is the limit
// it is neutral (0.91-1.03x). MADV_HUGEPAGE was tried too and not kept:
// fast only while the VM's host already backs the memory, and 0.45x with
// every restore started alike (docs/restart.md, "Allocating and
// first-touching fresh memory", "Where the 2 GiB restart's time goes").
// Leaves under kPrefaultMin are left to the reads: too small to pay for the
// call. So are leaves saved in several shards (by several processes): with
// the thread a step saved by 8 processes restored 9% slower (8 pairs, 0 of
// them faster; 13-19% in an earlier trial, docs/benchmarks/history.md), and
// faulting ahead in the reads' own order was slower too in a restore into a
// sharding (0.80x). Why is not known: on local disk the reads go leaf by
// leaf there as well, each leaf's shards from several files.
void WholeRestore::prefault(size_t leaf_begin, size_t group_begin) {
  if (!options_.prefault) return;
  std::vector<std::pair<std::byte*, uint64_t>> ranges;
  for (size_t gi = group_begin; gi < groups_.size(); ++gi)
    if (Buffer& slab = groups_[gi].slab; slab.size() >= kPrefaultMin) ranges.emplace_back(slab.data(), slab.size());
  for (size_t i = leaf_begin; i < next_leaf_; ++i) {
    Buffer& b = out_.leaves[i].data;
    if (!allocated_[i] || b.size() < kPrefaultMin || selected_[i].second->shards.size() != 1) continue;
    ranges.emplace_back(b.data(), b.size());
  }
  std::future<void> f = populate_in_background(std::move(ranges), &prefaulted_, &reads_done_);
  if (f.valid()) prefaults_.push_back(std::move(f));
}

}  // namespace

Status restore_whole(Storage& storage, const std::string& step_dir, const Index& index,
                     const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                     const RestoreOptions& options, RestoredState* out) {
  const auto t0 = Clock::now();
  CKPTIO_ASSIGN_OR_RETURN(auto dests, match_destinations(selected, options.into));
  WholeRestore restore(storage, step_dir, index, selected, options, std::move(dests), out);
  CKPTIO_RETURN_IF_ERROR(restore.check_casts());
  ReadExecutorLimits limits;
  limits.batch_bytes = kBatchBytes;
  limits.staging_bytes = kScratchPerBatch;
  limits.align = std::max<uint64_t>(storage.read_alignment(), 1);
  std::vector<ExecRead> reads;
  ReadExecutorStats stats;
  CKPTIO_RETURN_IF_ERROR(execute_reads(storage, restore.keys(), &reads, restore, limits,
                                       "restore step " + std::to_string(index.step), &stats));
  restore.finish();
  const auto t1 = Clock::now();
  out->stats.bytes_read = stats.bytes_read;
  out->stats.requests = stats.requests;
  // Until the first chunk was planned: what the reads waited for.
  out->stats.plan_seconds = std::chrono::duration<double>(restore.first_planned() - t0).count();
  out->stats.read_seconds = std::chrono::duration<double>(t1 - restore.first_planned()).count();
  out->stats.bytes_prefaulted = restore.prefaulted();
  return Status::OK();
}

}  // namespace ckptio
