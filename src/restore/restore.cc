// Restore: pick the step, parse its index (strictly), select leaves, check
// them against a template, plan reads, read in batches through the backend
// while the previous batch is checksummed and its non-contiguous shards are
// scattered into whole leaves, cast if asked. Restore into a sharding
// branches off after the template check to src/restore/restore_sharded.cc.
//
// Reads are planned per shard and cut into pieces of at most kPieceBytes so
// that checksumming overlaps reading even for one huge leaf; a leaf held in
// one shard is allocated so that its address agrees with the shard's file
// offset modulo the backend's read alignment, letting direct I/O land in it
// without a bounce copy. Small shards (<= 256 KiB) that lie next to each other
// in a file are read together, up to 8 MiB a request: straight into their
// leaves when those lie in memory as the shards lie in the file (leaves
// restore allocates: one allocation per group, each leaf a slice of it;
// caller destinations that happen to be adjacent), otherwise into a scratch
// arena (up to 64 MiB per batch; two arenas, reused) and copied out.
//
// Restore-latest tries committed steps newest first and moves past a step
// whose index or data is damaged (Status::data_loss(); a missing data file
// counts, src/restore/damage.h), recording it in RestoredState::skipped; strict mode
// and every other error stop there. verify() reads every shard and lists
// every damaged file and shard instead of stopping at the first.
#include <re2/re2.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <set>
#include <tuple>

#include "ckptio/manager.h"
#include "src/util/async.h"
#include "src/transform/cast.h"
#include "src/util/crc32c.h"
#include "src/restore/damage.h"
#include "src/layout/layout.h"
#include "src/manager/manager_impl.h"
#include "src/util/position_table.h"
#include "src/restore/restore_sharded.h"
#include "src/sharding/regex.h"

namespace ckptio {
namespace {

constexpr uint64_t kPieceBytes = 64ull << 20;
constexpr uint64_t kBatchBytes = 256ull << 20;
// Leaves in the first chunk of a restore's plan, then doubling up to the
// most (restore_index).
constexpr size_t kFirstChunkLeaves = 1024;
constexpr size_t kMaxChunkLeaves = 16384;
// Payload per chunk (unless one leaf is larger): one batch, or, where a
// chunk is read in file order (below), large, so that its reads cover long
// stretches of each data file even where the shards of all leaves
// interleave (row bands). The leaves of a chunk are allocated when it is
// planned, which a restore does for every leaf anyway.
constexpr uint64_t kFileOrderChunkBytes = 64ull << 30;

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

// Copies a shard's C-order bytes into its box of the whole array.
void scatter_box(const std::byte* src, const Box& box, const Shape& shape, size_t item,
                 std::byte* dst) {
  const size_t r = box.rank();
  if (r == 0) { std::memcpy(dst, src, item); return; }
  Shape ext = box.extent();
  for (int64_t e : ext) if (e == 0) return;
  // Innermost contiguous run: the last dim (merge full trailing dims).
  size_t inner = r - 1;
  uint64_t run = static_cast<uint64_t>(ext[inner]) * item;
  while (inner > 0 && box.start[inner] == 0 && box.stop[inner] == shape[inner]) {
    --inner;
    run *= static_cast<uint64_t>(ext[inner]);
  }
  // Strides of the whole array, in bytes.
  std::vector<uint64_t> stride(r);
  uint64_t s = item;
  for (size_t d = r; d-- > 0;) { stride[d] = s; s *= static_cast<uint64_t>(shape[d]); }
  std::vector<int64_t> idx(box.start.begin(), box.start.begin() + inner);
  for (;;) {
    uint64_t off = 0;
    for (size_t d = 0; d < inner; ++d) off += static_cast<uint64_t>(idx[d]) * stride[d];
    off += static_cast<uint64_t>(box.start[inner]) * stride[inner];
    std::memcpy(dst + off, src, run);
    src += run;
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < box.stop[d]) break;
      idx[d] = box.start[d];
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

struct ShardTask {
  const std::string* prefix = nullptr;
  const LeafRecord* leaf_rec = nullptr;
  size_t shard = 0;                 // index in leaf_rec->shards
  const std::string* key = nullptr; // data object (one string per file)
  size_t file = 0;                  // ordinal of `key`, for sorting
  const ShardRecord* rec = nullptr;
  std::byte* bytes = nullptr;   // where the shard's bytes land (leaf or temp)
  uint64_t at = 0;              // of a contiguous shard: its byte offset in the leaf
  Buffer temp;                  // when the shard is scattered afterwards
  bool scatter = false;
  size_t leaf = 0;              // index into the output leaves
  uint32_t crc = 0;             // running checksum
};

// "model/params.w shard 0 (file data-...bin, bytes [0, 64))", for messages:
// built only when one is needed (a restore of 100,000 leaves builds none).
std::string where(const ShardTask& t) {
  return leaf_name(*t.prefix, *t.leaf_rec) + " shard " + std::to_string(t.shard) + " (file " + t.rec->file +
         ", " + byte_range(t.rec->offset, t.rec->length) + ")";
}

struct Piece {
  size_t task = 0;
  uint64_t at = 0;   // offset inside the shard
  uint64_t len = 0;
  int64_t group = -1;  // >= 0: one read of a Group (task, at unused)
};

// Small shards next to each other in one data file, read with one request:
// a state of 100,000 small leaves is then read in a few hundred requests
// instead of 100,000. A direct group lands in its leaves themselves (they lie
// in memory as in the file); any other lands in a scratch arena and each
// shard is copied out.
struct Group {
  const std::string* key = nullptr;
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  std::vector<size_t> tasks;
  bool direct = false;
  Buffer slab;                 // direct, leaves restore allocates: all of them
  std::byte* bytes = nullptr;  // where byte `offset` lands: the first leaf, or the scratch while in flight
};

constexpr uint64_t kSmallShard = 256ull << 10;  // shards up to this size may be grouped
constexpr uint64_t kGroupGap = 4ull << 10;      // bytes between members read and discarded
constexpr uint64_t kGroupMax = 8ull << 20;      // per request
// The groups of one batch share one scratch arena of at most this much
// (each group counted with its alignment slack). With two batches in flight
// that is up to 16 reads of 8 MiB outstanding, and the two arenas are reused
// from batch to batch instead of faulting fresh memory for every group.
constexpr uint64_t kScratchPerBatch = 64ull << 20;

Status check_template(const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                      const RestoreOptions& options) {
  if (options.expected.empty()) return Status::OK();
  std::map<std::string, const LeafRecord*> saved;
  for (const auto& [prefix, leaf] : selected) saved[leaf_name(prefix, *leaf)] = leaf;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> expected_names;
  for (const LeafSpec& e : options.expected) {
    std::string name = e.prefix + "/" + e.path;
    expected_names.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) { missing.push_back(name); continue; }
    const LeafRecord& got = *it->second;
    if (got.shape != e.shape)
      mismatched.push_back(name + ": shape " + shape_to_string(got.shape) + " saved, " +
                           shape_to_string(e.shape) + " expected");
    if (got.dtype != e.dtype && !(options.allow_cast && can_cast(got.dtype, e.dtype)))
      mismatched.push_back(name + ": dtype " + std::string(dtype_name(got.dtype)) + " saved, " +
                           std::string(dtype_name(e.dtype)) + " expected");
  }
  for (const auto& [name, leaf] : saved)
    if (!expected_names.count(name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return Status::OK();
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 50; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 50) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  std::string msg = "state does not match the template:";
  if (!missing.empty()) msg += " missing leaves [" + join(missing) + "];";
  if (!unexpected.empty()) msg += " unexpected leaves [" + join(unexpected) + "];";
  if (!mismatched.empty()) msg += " mismatches [" + join(mismatched) + "];";
  msg.pop_back();
  return Status(Code::kFailedPrecondition, msg);
}

}  // namespace

ArenaLayout restore_arena_layout(const Index& index, uint64_t read_alignment) {
  ArenaLayout out;
  const uint64_t align = std::max<uint64_t>(read_alignment, 1);
  out.alignment = std::max<uint64_t>(align, 64);
  const ShardRecord* before = nullptr;  // the previous leaf's one shard
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& leaf : p.leaves) {
      const ShardRecord* one = leaf.shards.size() == 1 ? &leaf.shards[0] : nullptr;
      uint64_t at = out.bytes;
      const bool follows =
          one && before && before->file == one->file && one->offset == before->offset + before->length;
      if (!follows) {
        at = (at + 63) / 64 * 64;
        if (one) at += (one->offset % align + align - at % align) % align;
      }
      out.offsets.push_back(at);
      out.bytes = at + leaf.num_bytes();
      before = one;
    }
  return out;
}

Result<RestoredState> CheckpointManager::restore(std::optional<int64_t> step,
                                                 const RestoreOptions& options) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  // The index's fetch and parse, counted into the restore's stats.
  auto with_index_time = [](Result<RestoredState> r, Clock::time_point t0, Clock::time_point t1) {
    if (r.ok()) {
      r->stats.index_seconds = std::chrono::duration<double>(t1 - t0).count();
      r->stats.seconds += r->stats.index_seconds;
    }
    return r;
  };
  if (step) {
    const auto t0 = Clock::now();
    CKPTIO_ASSIGN_OR_RETURN(Index index, read_index(*step));
    const auto t1 = Clock::now();
    return with_index_time(impl_->restore_index(index, options), t0, t1);
  }
  // Restore-latest: committed steps newest first; damage (kDataLoss, in the
  // index or the data) moves on to the next older step unless strict; any
  // other error is the caller's (options) or transient, and is returned.
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(*storage_, impl_->naming));
  std::vector<SkippedStep> skipped;
  auto with_skipped = [&](const Status& st) {
    if (skipped.empty()) return st;
    std::string steps;
    for (const SkippedStep& s : skipped) steps += (steps.empty() ? "" : ", ") + std::to_string(s.step);
    return st.annotate("restore-latest, after skipping damaged step(s) " + steps);
  };
  auto skip = [&](int64_t s, const Status& st) {
    spdlog::warn("ckptio: restore-latest skips damaged step {}: {}", s, st.to_string());
    skipped.push_back(SkippedStep{s, st});
  };
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->kind != StepDirKind::kFinal) continue;
    const auto t0 = Clock::now();
    auto loaded = impl_->load_index(it->name);
    const auto t1 = Clock::now();
    if (loaded.ok() && !loaded->has_value()) {  // no index: not committed, or lost (POSIX)
      Status why = impl_->missing_index(it->name, it->step);
      if (why.code() == Code::kNotFound) continue;
      loaded = why;
    }
    if (!loaded.ok()) {
      if (options_.strict || !loaded.status().data_loss()) return with_skipped(loaded.status());
      skip(it->step, loaded.status());
      continue;
    }
    auto restored = with_index_time(impl_->restore_index(**loaded, options), t0, t1);
    if (restored.ok()) {
      if (!skipped.empty())
        spdlog::warn("ckptio: restore-latest restored step {} after skipping {} damaged newer step(s)",
                     it->step, skipped.size());
      restored->skipped = std::move(skipped);
      return restored;
    }
    if (options_.strict || !restored.status().data_loss()) return with_skipped(restored.status());
    skip(it->step, restored.status());
  }
  if (skipped.empty()) return not_found("no committed step at " + storage_->describe());
  std::string all;
  for (const SkippedStep& s : skipped)
    all += "; step " + std::to_string(s.step) + ": " + s.error.message();
  return data_loss("restore-latest: every committed step at " + storage_->describe() + " is damaged" + all);
}

Result<RestoredState> CheckpointManager::Impl::restore_index(Index& index,
                                                            const RestoreOptions& options) {
  const auto t0 = Clock::now();
  Storage& storage = owner->storage();
  const int64_t the_step = index.step;
  {
    std::lock_guard lock(mu);
    restoring.insert(the_step);
  }
  struct Unmark {
    Impl* impl; int64_t s;
    ~Unmark() { std::lock_guard lock(impl->mu); impl->restoring.erase(impl->restoring.find(s)); }
  } unmark{this, the_step};

  // Selection.
  // RE2 with Python's syntax, as partition rules: leaf paths come from the
  // index, outside data, and std::regex's backtracking overflows the stack on
  // long ones (a 100,000-character path against "(a|b)*c").
  std::unique_ptr<const RE2> re;
  if (!options.select.path_regex.empty()) {
    CKPTIO_ASSIGN_OR_RETURN(re, compile_python_regex(options.select.path_regex, "path regex"));
  }
  std::vector<std::pair<std::string, LeafRecord*>> selected;
  for (PrefixRecord& p : index.prefixes) {
    if (!options.select.prefixes.empty() &&
        std::find(options.select.prefixes.begin(), options.select.prefixes.end(), p.name) ==
            options.select.prefixes.end())
      continue;
    for (LeafRecord& leaf : p.leaves)
      if (!re || RE2::PartialMatch(leaf.path, *re)) selected.emplace_back(p.name, &leaf);
  }
  CKPTIO_RETURN_IF_ERROR(check_template(selected, options));

  if (options.sharding) {  // one buffer per local device (src/restore/restore_sharded.cc)
    RestoredState out;
    out.step = the_step;
    out.metadata_json = index.metadata_json;
    CKPTIO_RETURN_IF_ERROR(
        restore_sharded(storage, naming.name(the_step), the_step, selected, options, &out));
    out.stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }

  // Plan and read, in chunks of leaves: the reads of the first chunk start
  // as soon as it is planned, and the rest is planned while they are in
  // flight (a state of 100,000 small leaves spends ~30 ms planning, which
  // otherwise the device would wait for). Chunks double from
  // kFirstChunkLeaves leaves up to kMaxChunkLeaves and hold at most
  // kBatchBytes of payload, or kFileOrderChunkBytes where a chunk's pieces
  // are read in file order (unless one leaf is larger); batches hold at most
  // kBatchBytes; a batch never spans two chunks, nor does a group of small
  // shards.
  const std::string dir = naming.name(the_step);
  const uint64_t align = std::max<uint64_t>(storage.read_alignment(), 1);
  RestoredState out;
  out.step = the_step;
  out.metadata_json = index.metadata_json;
  // The caller's destinations by name (a later one for the same leaf wins).
  // Usually the caller lists every selected leaf in the order the index
  // does: then each destination is its leaf's, none repeats (the index's
  // names are unique), and no table is needed.
  const auto& into = options.into;
  std::vector<const RestoreOptions::Destination*> dests(into.empty() ? 0 : selected.size());
  size_t wrong_size = SIZE_MAX;  // the first leaf whose destination is of the wrong size
  bool in_order = into.size() == selected.size();
  for (size_t i = 0; in_order && i < into.size(); ++i) {  // one pass over names and sizes
    const LeafRecord& leaf = *selected[i].second;
    in_order = into[i].path == leaf.path && into[i].prefix == selected[i].first;
    if (wrong_size == SIZE_MAX && into[i].size != leaf.num_bytes()) wrong_size = i;
    dests[i] = &into[i];
  }
  if (!in_order) {
    wrong_size = SIZE_MAX;
    PositionTable destinations(into.size());
    for (size_t i = 0; i < into.size(); ++i)
      destinations.slot(hash_names(into[i].prefix, into[i].path), [&](size_t j) {
        return into[j].path == into[i].path && into[j].prefix == into[i].prefix;
      }) = i + 1;
    for (size_t i = 0; i < dests.size(); ++i) {
      const std::string& prefix = selected[i].first;  // (not a structured binding: clang 14 cannot capture one)
      const LeafRecord* leaf = selected[i].second;
      const size_t slot = destinations.slot(hash_names(prefix, leaf->path), [&](size_t j) {
        return into[j].path == leaf->path && into[j].prefix == prefix;
      });
      dests[i] = slot ? &into[slot - 1] : nullptr;
      if (wrong_size == SIZE_MAX && dests[i] && dests[i]->size != leaf->num_bytes()) wrong_size = i;
    }
  }
  if (wrong_size != SIZE_MAX) {  // refused before any read
    const auto& [prefix, leaf] = selected[wrong_size];
    return invalid_argument("restore destination for " + leaf_name(prefix, *leaf) + " holds " +
                            std::to_string(dests[wrong_size]->size) + " bytes, the leaf has " +
                            std::to_string(leaf->num_bytes()));
  }
  // One key string per data file, shared by its shards' tasks.
  std::map<std::string, std::pair<std::string, size_t>, std::less<>> file_keys;
  for (const DataFileRecord& f : index.files) file_keys.try_emplace(f.name, dir + "/" + f.name, file_keys.size());
  decltype(file_keys)::iterator file = file_keys.end();  // of the shard before: shards come in runs of one file
  std::vector<ShardTask> tasks;
  tasks.reserve(selected.size());
  out.leaves.reserve(selected.size());
  // Leaves without a caller's destination are allocated once the groups are
  // known (a direct group's leaves share one allocation).
  std::vector<bool> allocate_later, has_destination;
  allocate_later.reserve(selected.size());
  has_destination.reserve(selected.size());
  std::vector<Group> groups;
  std::vector<Piece> pieces;
  std::vector<std::pair<size_t, size_t>> batches;  // of pieces, in order
  std::vector<size_t> done_after;  // per batch: the leaves complete once it is verified
  size_t next_leaf = 0;                            // the first leaf not yet planned
  size_t chunk_leaves = kFirstChunkLeaves;
  // Object stores, for steps whose leaves were saved in several pieces each
  // (shards of several processes, row bands): there leaf order scatters a
  // batch over the data files. A step of whole leaves lies in leaf order.
  size_t selected_shards = 0;
  for (const auto& sel : selected) selected_shards += sel.second->shards.size();
  const bool file_order = !storage.caps().atomic_rename && selected_shards > selected.size();
  const uint64_t chunk_max = file_order ? kFileOrderChunkBytes : kBatchBytes;

  // Plans the next chunk: one task per shard, groups of small shards, the
  // allocation of the leaves, pieces and batches.
  auto plan_chunk = [&]() -> Status {
    const size_t leaf_begin = next_leaf, task_begin = tasks.size(), group_begin = groups.size(),
                 piece_begin = pieces.size();
    uint64_t chunk_bytes = 0;
    for (; next_leaf < selected.size() && next_leaf - leaf_begin < chunk_leaves; ++next_leaf) {
      const auto& [prefix, leaf] = selected[next_leaf];
      if (next_leaf > leaf_begin && chunk_bytes + leaf->num_bytes() > chunk_max) break;
      Tensor t;
      t.prefix = prefix;  // path and shape: moved from the index once the data is in
      t.dtype = leaf->dtype;
      const size_t item = dtype_size(leaf->dtype);
      const RestoreOptions::Destination* dest = dests.empty() ? nullptr : dests[next_leaf];
      if (dest) t.data = Buffer::wrap(dest->data, dest->size);
      allocate_later.push_back(dest == nullptr);
      has_destination.push_back(dest != nullptr);
      for (size_t i = 0; i < leaf->shards.size(); ++i) {
        const ShardRecord& rec = leaf->shards[i];
        ShardTask task;
        task.prefix = &prefix;
        task.leaf_rec = leaf;
        task.shard = i;
        if (file == file_keys.end() || file->first != rec.file) file = file_keys.find(rec.file);
        if (file == file_keys.end())  // the index reader checks every reference
          return internal_error("shard of " + leaf_name(prefix, *leaf) + " names unlisted file " + rec.file);
        task.key = &file->second.first;
        task.file = file->second.second;
        task.rec = &rec;
        task.leaf = out.leaves.size();
        uint64_t elem = 0;
        if (box_is_contiguous(rec.box, leaf->shape, &elem)) {
          task.at = elem * item;
          if (dest) task.bytes = t.data.data() + task.at;
        } else {
          task.scatter = true;  // its temporary comes with its first read (launch, below)
        }
        tasks.push_back(std::move(task));
      }
      out.leaves.push_back(std::move(t));
      out.stats.bytes_needed += leaf->num_bytes();
      chunk_bytes += leaf->num_bytes();
    }
    chunk_leaves = std::min(2 * chunk_leaves, kMaxChunkLeaves);

    // Group small shards by file position.
    std::vector<int64_t> group_of(tasks.size() - task_begin, -1);  // per task of the chunk
    {
      std::vector<size_t> order;
      for (size_t i = task_begin; i < tasks.size(); ++i)
        if (tasks[i].rec->length > 0 && tasks[i].rec->length <= kSmallShard) order.push_back(i);
      auto by_position = [&](size_t a, size_t b) {
        return std::tie(tasks[a].file, tasks[a].rec->offset) < std::tie(tasks[b].file, tasks[b].rec->offset);
      };
      if (!std::is_sorted(order.begin(), order.end(), by_position))  // usually they are: saved in this order
        std::sort(order.begin(), order.end(), by_position);
      Group g;
      auto close = [&] {
        if (g.tasks.size() >= 2) {
          for (size_t t : g.tasks) group_of[t - task_begin] = static_cast<int64_t>(groups.size());
          groups.push_back(std::move(g));
        }
        g = Group{};
      };
      for (size_t i : order) {
        const ShardRecord& r = *tasks[i].rec;
        const bool fits = !g.tasks.empty() && tasks[i].key == g.key && r.offset >= g.offset + g.length &&
                          r.offset <= g.offset + g.length + kGroupGap &&
                          r.offset + r.length - g.offset <= kGroupMax;
        if (!fits) {
          close();
          g.key = tasks[i].key;
          g.offset = r.offset;
        }
        g.tasks.push_back(i);
        g.length = r.offset + r.length - g.offset;
      }
      close();
    }
    // Direct groups, and the allocation of the leaves left. A group is
    // direct when every member is a whole leaf restore allocates (one
    // allocation for the group, placed so that its address agrees with the
    // group's file offset modulo the read alignment, as a leaf's own would
    // be; each leaf a slice of it, so the group's memory is freed with its
    // last leaf), or when every member's destination follows the one before
    // exactly as its shard follows in the file (no gap: the caller's bytes
    // only).
    for (size_t gi = group_begin; gi < groups.size(); ++gi) {
      Group& g = groups[gi];
      bool ours = true, theirs = true;
      for (size_t k = 0; k < g.tasks.size() && (ours || theirs); ++k) {
        const ShardTask& t = tasks[g.tasks[k]];
        const bool later = allocate_later[t.leaf];
        ours = ours && later && t.leaf_rec->shards.size() == 1;
        if (k == 0) {
          theirs = theirs && !later && !t.scatter;
          continue;
        }
        const ShardTask& before = tasks[g.tasks[k - 1]];
        theirs = theirs && !later && !t.scatter && t.rec->offset == before.rec->offset + before.rec->length &&
                 t.bytes == before.bytes + before.rec->length;
      }
      if (ours) {
        g.direct = true;
        g.slab = Buffer::allocate(g.length, std::max<uint64_t>(align, 64), g.offset % align);
        g.bytes = g.slab.data();
        for (size_t ti : g.tasks) {
          ShardTask& t = tasks[ti];
          out.leaves[t.leaf].data = g.slab.slice(t.rec->offset - g.offset, t.rec->length);
          allocate_later[t.leaf] = false;
        }
      } else if (theirs) {
        g.direct = true;
        g.bytes = tasks[g.tasks.front()].bytes;
      }
    }
    for (size_t i = leaf_begin; i < next_leaf; ++i) {
      if (!allocate_later[i]) continue;
      const LeafRecord& leaf = *selected[i].second;
      const uint64_t phase = leaf.shards.size() == 1 ? leaf.shards[0].offset % align : 0;
      out.leaves[i].data = Buffer::allocate(leaf.num_bytes(), std::max<uint64_t>(align, 64), phase);
    }
    for (size_t i = task_begin; i < tasks.size(); ++i) {
      ShardTask& t = tasks[i];
      if (!t.scatter && !t.bytes) t.bytes = out.leaves[t.leaf].data.data() + t.at;
      const int64_t gi = group_of[i - task_begin];
      if (gi >= 0) {
        if (groups[gi].tasks.front() == i) pieces.push_back(Piece{i, 0, groups[gi].length, gi});
        continue;
      }
      for (uint64_t at = 0; at < t.rec->length; at += kPieceBytes)
        pieces.push_back(Piece{i, at, std::min(kPieceBytes, t.rec->length - at)});
    }
    // In file order (object stores, steps of leaves in several pieces), so
    // that a batch holds neighbouring ranges of a data file, which the store
    // serves with one GET, even where the file interleaves the shards of
    // many leaves (row bands). Stable: a shard's pieces keep their order,
    // which its streaming checksum needs. Local disk keeps leaf order: a
    // request costs little there, and a batch's scatters then stay within a
    // few leaves (file order measured ~25% slower on a 2x4-saved step,
    // docs/read-planning.md "Row bands").
    auto position = [&](const Piece& p) {
      if (p.group >= 0) {
        const Group& g = groups[p.group];
        return std::pair(tasks[g.tasks.front()].file, g.offset);
      }
      const ShardTask& t = tasks[p.task];
      return std::pair(t.file, t.rec->offset + p.at);
    };
    if (file_order)
      std::stable_sort(pieces.begin() + static_cast<std::ptrdiff_t>(piece_begin), pieces.end(),
                       [&](const Piece& a, const Piece& b) { return position(a) < position(b); });
    for (size_t begin = piece_begin; begin < pieces.size();) {
      size_t end = begin;
      uint64_t bytes = 0;
      uint64_t scratch = 0;
      while (end < pieces.size()) {
        const int64_t gi = pieces[end].group;
        const uint64_t s = gi >= 0 && !groups[gi].direct ? pieces[end].len + align - 1 : 0;
        if (end > begin && (bytes + pieces[end].len > kBatchBytes || scratch + s > kScratchPerBatch)) break;
        bytes += pieces[end].len;
        scratch += s;
        ++end;
      }
      batches.emplace_back(begin, end);
      done_after.push_back(end == pieces.size() ? next_leaf : leaf_begin);  // a chunk's leaves, at its end
      out.stats.bytes_read += bytes;
      out.stats.requests += end - begin;
      begin = end;
    }
    return Status::OK();
  };
  // Leaves whose reads are all verified: their names and shapes move from
  // the index to the result and their shard records are freed, on this
  // thread while later reads are in flight. (The index is ours to take
  // apart: the caller discards it; `selected` points into it.)
  size_t released = 0;
  auto release = [&](size_t leaf_end) {
    for (; released < leaf_end; ++released) {
      LeafRecord& leaf = *selected[released].second;
      out.leaves[released].path = std::move(leaf.path);
      out.leaves[released].shape = std::move(leaf.shape);
      std::vector<ShardRecord>().swap(leaf.shards);
    }
  };

  // Checksums a batch of pieces, in order; completes shards at their end,
  // scattering a non-contiguous shard into its leaf and freeing its
  // temporary: temporaries live only while their shard is in flight, so a
  // step saved in non-contiguous shards (a 2x4 mesh) restores whole in
  // memory bounded by the batches, with the scatter overlapping the reads.
  auto verify_batch = [&](size_t begin, size_t end) -> Status {
    auto checksum_mismatch = [&](const ShardTask& t) {
      return data_loss("checksum mismatch in " + where(t) + " of step " + std::to_string(the_step) + " at " +
                       storage.describe() + "/" + *t.key);
    };
    auto scatter = [&](ShardTask& t, const std::byte* from) {
      Tensor& leaf = out.leaves[t.leaf];
      scatter_box(from, t.rec->box, t.leaf_rec->shape, dtype_size(leaf.dtype), leaf.data.data());
    };
    for (size_t p = begin; p < end; ++p) {
      if (pieces[p].group >= 0) {  // checksum each member (in the scratch: copy it out)
        Group& g = groups[pieces[p].group];
        for (size_t ti : g.tasks) {
          ShardTask& t = tasks[ti];
          const std::byte* in = g.bytes + (t.rec->offset - g.offset);
          if (options.verify && crc32c(in, t.rec->length, 0) != t.rec->crc32c) return checksum_mismatch(t);
          if (g.direct) continue;
          if (t.scatter) scatter(t, in);
          else std::memcpy(t.bytes, in, t.rec->length);
        }
        if (!g.direct) g.bytes = nullptr;
        continue;
      }
      ShardTask& t = tasks[pieces[p].task];
      if (options.verify) t.crc = crc32c(t.bytes + pieces[p].at, pieces[p].len, t.crc);
      if (pieces[p].at + pieces[p].len != t.rec->length) continue;
      if (options.verify && t.crc != t.rec->crc32c) return checksum_mismatch(t);
      if (t.scatter) {
        scatter(t, t.bytes);
        t.temp = Buffer();
        t.bytes = nullptr;
      }
    }
    return Status::OK();
  };
  // After a batch's read failed (`st`): names the shard by reading the
  // batch's requests one at a time (for a group of small shards, its
  // members), on this thread. The scratch buffers are reused: the batch
  // failed, nothing of it is kept.
  auto name_failure = [&](size_t begin, size_t end, const std::vector<ReadRequest>& reqs, Status st) -> Status {
    const std::string of_step = " of step " + std::to_string(the_step);
    auto read_one = [&](const ShardTask& t, uint64_t at, uint64_t len, std::byte* dst) -> Status {
      ReadRequest r{*t.key, t.rec->offset + at, len, dst};
      Status one = storage.read(std::span<const ReadRequest>(&r, 1));
      if (one.ok()) return one;
      return data_read_error(one, "restore " + where(t) + of_step, storage.describe() + "/" + *t.key);
    };
    for (size_t p = begin; p < end; ++p) {
      if (pieces[p].group < 0) {
        Status one = read_one(tasks[pieces[p].task], pieces[p].at, pieces[p].len, reqs[p - begin].dst);
        if (!one.ok()) return one;
        continue;
      }
      Group& g = groups[pieces[p].group];
      Status whole = storage.read(std::span<const ReadRequest>(&reqs[p - begin], 1));
      if (whole.ok()) continue;
      for (size_t ti : g.tasks) {
        const ShardTask& t = tasks[ti];
        Status one = read_one(t, 0, t.rec->length, reqs[p - begin].dst + (t.rec->offset - g.offset));
        if (!one.ok()) return one;
      }
      return data_read_error(whole, "restore the " + std::to_string(g.tasks.size()) + " small shards from " +
                                        where(tasks[g.tasks.front()]) + " on" + of_step,
                             storage.describe() + "/" + *g.key);
    }
    return st.annotate("restore step " + std::to_string(the_step));
  };

  // Two batches are read at once, so the device never waits for one
  // batch's last request before it sees the next; this thread plans ahead
  // and checksums each batch, in order, as soon as it has landed. The
  // reading threads see only their requests (built here, at launch): the
  // plan's vectors grow on this thread meanwhile.
  constexpr size_t kBatchesInFlight = 2;
  // Batch i lays its groups out in arena i % kBatchesInFlight: batch i + 2 is
  // launched only after batch i has been verified. (Declared before
  // `reading`, whose futures wait for their reads as they are destroyed.)
  Buffer arenas[kBatchesInFlight];
  struct InFlight {
    std::vector<ReadRequest> reqs;
    std::future<Status> done;
  };
  std::deque<InFlight> reading;
  size_t launched = 0;
  auto launch = [&] {
    Buffer& arena = arenas[launched % kBatchesInFlight];
    auto [b, e] = batches[launched++];
    uint64_t need = 0;
    for (size_t p = b; p < e; ++p)
      if (pieces[p].group >= 0 && !groups[pieces[p].group].direct) need += pieces[p].len + align - 1;
    if (need > arena.size()) arena = Buffer::allocate(need, std::max<uint64_t>(align, 64));
    uint64_t pos = 0;  // arena offsets; the arena starts aligned
    // The groups' places in the arena, and temporaries of the non-contiguous
    // shards whose first piece this batch reads (a later batch may read
    // their next pieces).
    InFlight f;
    f.reqs.reserve(e - b);
    for (size_t p = b; p < e; ++p) {
      if (pieces[p].group >= 0) {  // at an address that agrees with its file offset
        Group& g = groups[pieces[p].group];
        if (!g.direct) {
          pos += (g.offset % align + align - pos % align) % align;
          g.bytes = arena.data() + pos;
          pos += g.length;
        }
        f.reqs.push_back(ReadRequest{*g.key, g.offset, g.length, g.bytes});
        continue;
      }
      ShardTask& t = tasks[pieces[p].task];
      if (pieces[p].at == 0 && t.scatter) {
        t.temp = Buffer::allocate(t.rec->length, align, t.rec->offset % align);
        t.bytes = t.temp.data();
      }
      f.reqs.push_back(ReadRequest{*t.key, t.rec->offset + pieces[p].at, pieces[p].len, t.bytes + pieces[p].at});
    }
    // (The span stays valid as f moves into `reading`: a vector's elements
    // move with it.)
    f.done = async_or_deferred([&storage, reqs = std::span<const ReadRequest>(f.reqs)] {
      return storage.read(reqs);
    });
    reading.push_back(std::move(f));
  };
  Status first = plan_chunk();
  const auto t_reads = Clock::now();
  out.stats.plan_seconds = std::chrono::duration<double>(t_reads - t0).count();  // what the reads wait for
  size_t verified = 0;
  while (first.ok()) {
    while (launched < batches.size() && launched < verified + kBatchesInFlight) launch();
    if (next_leaf < selected.size() && batches.size() - launched < kBatchesInFlight) {
      first = plan_chunk();  // while the reads are in flight
      continue;
    }
    if (verified == launched) break;  // all planned, read and verified
    InFlight f = std::move(reading.front());
    reading.pop_front();
    Status st = f.done.get();
    const auto [b, e] = batches[verified++];
    first = st.ok() ? verify_batch(b, e) : name_failure(b, e, f.reqs, std::move(st));
    if (first.ok()) release(done_after[verified - 1]);
  }
  for (auto& f : reading) (void)f.done.get();  // never leave a read writing into freed memory
  CKPTIO_RETURN_IF_ERROR(first);
  out.stats.read_seconds = std::chrono::duration<double>(Clock::now() - t_reads).count();
  release(out.leaves.size());

  // Casts: to the template's dtypes (allow_cast) or to float_dtype.
  std::map<std::string, DType> want;
  for (const LeafSpec& e : options.expected) want[e.prefix + "/" + e.path] = e.dtype;
  for (size_t i = 0; i < out.leaves.size(); ++i) {
    Tensor& leaf = out.leaves[i];
    if (want.empty() && !options.float_dtype) break;  // nothing to cast: no string work per leaf
    std::optional<DType> to;
    auto it = want.find(leaf.prefix + "/" + leaf.path);
    if (it != want.end() && it->second != leaf.dtype) to = it->second;
    else if (options.float_dtype && dtype_is_float(leaf.dtype) && leaf.dtype != *options.float_dtype)
      to = options.float_dtype;
    if (!to) continue;
    if (has_destination[i])
      return invalid_argument("restore destination for " + leaf.prefix + "/" + leaf.path +
                              " cannot take a cast to " + std::string(dtype_name(*to)));
    uint64_t n = checked_num_bytes(leaf.shape).value_or(0);
    Buffer b = Buffer::allocate(n * dtype_size(*to));
    CKPTIO_RETURN_IF_ERROR(cast_elements(leaf.dtype, *to, leaf.data.data(), b.data(), n));
    leaf.data = std::move(b);
    leaf.dtype = *to;
  }
  out.stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

Status CheckpointManager::verify(int64_t step) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  CKPTIO_ASSIGN_OR_RETURN(Index index, read_index(step));
  const std::string dir = impl_->naming.name(step);
  const std::string at = storage_->describe() + "/" + dir + "/";
  // Every problem found, in index order; errors that are not damage
  // (transient, I/O, permission) end the verification at once.
  constexpr size_t kMaxProblems = 20;
  std::vector<std::string> problems;
  size_t count = 0;
  auto note = [&](std::string p) {
    if (problems.size() < kMaxProblems) problems.push_back(std::move(p));
    ++count;
  };
  // Data files first: a missing or short file is named once with the shards
  // it takes down, instead of once per shard.
  std::map<std::string, uint64_t> sizes;  // intact or longer files: their size
  std::map<std::string, std::vector<std::string>> lost;  // file -> shards it takes down
  std::map<std::string, std::string> file_problem;
  for (const DataFileRecord& f : index.files) {
    auto size = storage_->stat(dir + "/" + f.name);
    const Status& err = size.status();
    if (!size.ok() && err.code() != Code::kNotFound && !err.data_loss())
      return err.annotate("verify step " + std::to_string(step) + ": data file " + at + f.name);
    if (!size.ok()) {  // missing, or not to be read (a symbolic link on local disk)
      file_problem[f.name] = err.data_loss() ? "data file " + at + f.name + " is unreadable: " + err.message()
                                             : "data file " + at + f.name + " is missing";
      sizes[f.name] = 0;
    } else if (*size != f.size) {
      file_problem[f.name] = "data file " + at + f.name + " has " + std::to_string(*size) + " bytes, the index records " +
                             std::to_string(f.size) + (*size < f.size ? " (short file)" : " (longer than recorded)");
      sizes[f.name] = *size;
    } else {
      sizes[f.name] = *size;
    }
  }
  // Stream every readable shard through a bounded scratch buffer.
  Buffer scratch = Buffer::allocate(kPieceBytes, 4096);
  for (const PrefixRecord& p : index.prefixes) {
    for (const LeafRecord& leaf : p.leaves) {
      for (size_t i = 0; i < leaf.shards.size(); ++i) {
        const ShardRecord& rec = leaf.shards[i];
        const std::string where = p.name + "/" + leaf.path + " shard " + std::to_string(i) + " (file " +
                                  rec.file + ", " + byte_range(rec.offset, rec.length) + ")";
        if (rec.length > 0 && rec.offset + rec.length > sizes[rec.file]) {
          lost[rec.file].push_back(where);
          continue;
        }
        uint32_t crc = 0;
        Status failed;
        for (uint64_t off = 0; off < rec.length && failed.ok(); off += kPieceBytes) {
          uint64_t len = std::min(kPieceBytes, rec.length - off);
          ReadRequest req{dir + "/" + rec.file, rec.offset + off, len, scratch.data()};
          Status st = storage_->read(std::span<const ReadRequest>(&req, 1));
          if (!st.ok()) failed = data_read_error(st, "verify " + where, at + rec.file);
          else crc = crc32c(scratch.data(), len, crc);
        }
        if (!failed.ok() && !failed.data_loss()) return failed.annotate("verify step " + std::to_string(step));
        if (!failed.ok()) note(failed.message());
        else if (crc != rec.crc32c)
          note("checksum mismatch in " + where);
      }
    }
  }
  // Files named before shards: they are usually the cause.
  std::vector<std::string> file_lines;
  for (const auto& [name, problem] : file_problem) {
    std::string line = problem;
    auto it = lost.find(name);
    if (it != lost.end()) {
      line += ", losing " + std::to_string(it->second.size()) + " shard(s): ";
      for (size_t k = 0; k < it->second.size() && k < 3; ++k) line += (k ? ", " : "") + it->second[k];
      if (it->second.size() > 3) line += ", ...";
    }
    file_lines.push_back(std::move(line));
  }
  // A file of the recorded size never loses shards (the index checks every
  // shard lies inside its file's recorded size), so `lost` has no others.
  if (file_lines.empty() && count == 0) return Status::OK();
  std::string msg = "verify step " + std::to_string(step) + " at " + at + ": " +
                    std::to_string(file_lines.size() + count) + " problem(s): ";
  size_t shown = 0;
  for (const std::string& l : file_lines) msg += (shown++ ? "; " : "") + l;
  for (const std::string& l : problems) msg += (shown++ ? "; " : "") + l;
  if (count > problems.size()) msg += "; ... and " + std::to_string(count - problems.size()) + " more";
  return data_loss(msg);
}

}  // namespace ckptio
