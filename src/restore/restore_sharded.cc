// Restore into a sharding: every selected leaf comes back as one buffer per
// distinct box the local devices hold, read from whatever sharding saved it.
//
// Per leaf: the target sharding (an explicit LeafSharding, else the partition
// rules), its boxes for the local devices (devices_indices_map), the distinct
// boxes as planner targets, and a read plan over the saved shards
// (src/restore/read_planner.h). All plans' reads then go through the read
// executor (src/restore/read_executor.h) in batches bounded in bytes and in
// staging memory, two in flight while this thread checksums and copies out
// the one that landed. Reads the plan lands in a target go straight into
// that device buffer (at an address agreeing with the file offset modulo the
// backend's read alignment, so direct I/O takes no bounce copy); the others
// land in the executor's staging arenas and are copied out through the
// leaf's transform (identity, or the cast asked for: then every read is
// staged and each buffer is allocated once, in the dtype asked for). Every
// piece the plan marks verifiable is checksummed streaming over its slices
// as they land. On object stores small gaps between the reads of
// neighbouring leaves are bridged (the whole read staying within 1.9% of the
// bytes needed) so that neighbours share a GET.

#include "src/restore/restore_sharded.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <tuple>

#include "src/restore/read_executor.h"
#include "src/util/box_runs.h"
#include "src/transform/transform.h"
#include "src/util/crc32c.h"
#include "src/restore/damage.h"
#include "src/restore/read_planner.h"
#include "src/restore/targets.h"
#include "src/util/populate.h"
#include "src/util/log.h"

namespace ckptio {

ShardedRestoreLimits& sharded_restore_limits() {
  static ShardedRestoreLimits limits;
  return limits;
}

namespace {

constexpr uint64_t kMaxRead = 64ull << 20;
constexpr uint64_t kLocalGap = 4ull << 10;
constexpr uint64_t kObjectStoreGap = 1ull << 20;
// Object stores: bridging between leaves stops once everything read exceeds
// the bytes needed by this much (per mille).
constexpr uint64_t kBridgeAllowancePermille = 19;

// One selected leaf: where its boxes go and how they are read.
struct LeafJob {
  std::string name;  // "model/params.w"
  std::string spec;  // its target PartitionSpec, for messages
  const LeafRecord* rec = nullptr;
  SavedLeaf saved;
  std::vector<Box> targets;         // the distinct boxes of the local devices
  std::vector<uint32_t> target_of;  // per local device (Tensor::device_shards order)
  std::vector<Buffer> buffers;      // per target
  std::vector<std::byte*> target_ptrs;
  ReadPlan plan;
  // The verifiable pieces each read holds a slice of: pieces
  // verify_pieces[verify_first[r], verify_first[r + 1]) for read r.
  std::vector<uint32_t> verify_first;
  std::vector<uint32_t> verify_pieces;
  std::vector<uint32_t> crc;        // per piece, running
  std::vector<uint64_t> crc_bytes;  // per piece, bytes checksummed so far
  PieceTransform transform;         // saved dtype -> the dtype restored
};

struct ReadRef {
  uint32_t leaf = 0;
  uint32_t read = 0;
};

struct Batch {
  size_t begin = 0, end = 0;  // into the ReadRefs
};

// The smallest pos >= cursor with pos == offset modulo align (a power of two).
uint64_t place(uint64_t cursor, uint64_t offset, uint64_t align) {
  return cursor + ((offset - cursor) & (align - 1));
}


// Every selected leaf's targets and read plan (and out->leaves, without
// buffers). `files` numbers the step's data files.
Status plan_leaves(const std::vector<std::pair<std::string, LeafRecord*>>& selected, const RestoreOptions& options,
                   const PlanOptions& po, std::vector<std::string>* files, std::vector<LeafJob>* jobs,
                   RestoredState* out) {
  CKPTIO_ASSIGN_OR_RETURN(ShardingTargets where, ShardingTargets::make(options));
  jobs->reserve(selected.size());
  for (const auto& [prefix, rec] : selected) {
    CKPTIO_ASSIGN_OR_RETURN(LeafTargets lt, where.leaf(prefix, *rec));
    LeafJob job;
    job.name = std::move(lt.name);
    job.spec = std::move(lt.spec);
    job.rec = rec;
    job.targets = std::move(lt.targets);
    job.target_of = std::move(lt.target_of);
    Tensor t = std::move(lt.tensor);
    job.transform = PieceTransform(rec->dtype, t.dtype);
    job.saved = saved_leaf_from_record(*rec, files);
    auto plan = plan_reads(job.saved, job.targets, po);
    if (!plan.ok()) return plan.status().annotate("restore " + job.name + " into " + job.spec);
    job.plan = std::move(*plan);
    out->leaves.push_back(std::move(t));
    jobs->push_back(std::move(job));
  }
  return Status::OK();
}

// A leaf's plan bridges gaps of up to max_gap between its own needed
// ranges, blind to the other leaves: where a data file interleaves the
// pieces of several leaves (shards of one process sorted by where they
// start, row bands), such a gap may hold another leaf's needed bytes, which
// that leaf's plan reads again. Leaves whose reads overlap another leaf's
// are planned again without gaps; on object stores the bridging between
// reads (bridge_gaps) then joins neighbours within its allowance.
Status replan_overlapping(const PlanOptions& po, std::vector<LeafJob>* jobs) {
  if (po.max_gap == 0) return Status::OK();
  struct Span {
    uint32_t file;
    uint64_t begin, end;
    size_t leaf;
    bool operator<(const Span& o) const { return std::tie(file, begin) < std::tie(o.file, o.begin); }
  };
  std::vector<Span> spans;
  for (size_t j = 0; j < jobs->size(); ++j)
    for (const PlannedRead& r : (*jobs)[j].plan.reads) spans.push_back({r.file, r.offset, r.offset + r.length, j});
  std::sort(spans.begin(), spans.end());
  std::vector<bool> replan(jobs->size(), false);
  for (size_t k = 1, reach = 0; k < spans.size(); ++k) {  // reach: the span reaching furthest so far
    if (spans[reach].file != spans[k].file) {
      reach = k;
      continue;
    }
    if (spans[k].begin < spans[reach].end && spans[k].leaf != spans[reach].leaf)
      replan[spans[k].leaf] = replan[spans[reach].leaf] = true;
    if (spans[k].end > spans[reach].end) reach = k;
  }
  PlanOptions exact = po;
  exact.max_gap = 0;
  size_t replanned = 0;
  for (size_t j = 0; j < jobs->size(); ++j) {
    if (!replan[j]) continue;
    LeafJob& job = (*jobs)[j];
    auto plan = plan_reads(job.saved, job.targets, exact);
    if (!plan.ok()) return plan.status().annotate("restore " + job.name + " into " + job.spec);
    job.plan = std::move(*plan);
    ++replanned;
  }
  if (replanned > 0)
    logging::debug("ckptio: {} of {} leaves planned again without gaps (their reads overlapped other leaves')",
                  replanned, jobs->size());
  return Status::OK();
}

// The target buffers (in the restored dtype; where reads land directly, at
// the phase of their file offsets), which verifiable pieces each read
// holds, and the plans' totals into out->stats.
void prepare_targets(uint64_t align, bool verify, std::vector<LeafJob>* jobs, RestoredState* out) {
  for (LeafJob& job : *jobs) {
    std::vector<uint64_t> phase(job.targets.size(), 0);
    std::vector<bool> phased(job.targets.size(), false);
    for (const PlannedRead& r : job.plan.reads)
      if (r.target != kStaging && !phased[r.target]) {
        phase[r.target] = (r.offset - r.dst_offset) & (align - 1);
        phased[r.target] = true;
      }
    for (size_t i = 0; i < job.targets.size(); ++i) {
      const uint64_t bytes = job.transform.out_offset(job.plan.target_bytes[i]);
      // A phase that would misalign the elements (an odd offset: a step saved
      // before shards were aligned) gives way: the reads then go through a
      // bounce buffer.
      const bool phased_ok = job.transform.identity() && phase[i] % dtype_alignment(job.rec->dtype) == 0;
      job.buffers.push_back(Buffer::allocate(bytes, std::max<uint64_t>(align, 64), phased_ok ? phase[i] : 0));
      job.target_ptrs.push_back(job.buffers.back().data());
    }

    const size_t nreads = job.plan.reads.size();
    job.verify_first.assign(nreads + 1, 0);
    if (verify) {
      for (size_t i = 0; i < job.plan.pieces.size(); ++i) {
        const PieceReads& pr = job.plan.pieces[i];
        if (!pr.verifiable || job.saved.pieces[i].length == 0) continue;
        for (uint32_t r = pr.first_read; r < pr.end_read; ++r) ++job.verify_first[r + 1];
      }
      for (size_t r = 0; r < nreads; ++r) job.verify_first[r + 1] += job.verify_first[r];
      job.verify_pieces.resize(job.verify_first[nreads]);
      std::vector<uint32_t> fill(job.verify_first.begin(), job.verify_first.end() - 1);
      for (size_t i = 0; i < job.plan.pieces.size(); ++i) {
        const PieceReads& pr = job.plan.pieces[i];
        if (!pr.verifiable || job.saved.pieces[i].length == 0) continue;
        for (uint32_t r = pr.first_read; r < pr.end_read; ++r)
          job.verify_pieces[fill[r]++] = static_cast<uint32_t>(i);
      }
      job.crc.assign(job.plan.pieces.size(), 0);
      job.crc_bytes.assign(job.plan.pieces.size(), 0);
      out->stats.pieces_unverified += job.plan.stats.pieces_unverified;
      out->stats.bytes_unverified += job.plan.stats.bytes_unverified;
    }
    out->stats.bytes_needed += job.plan.stats.bytes_needed;
    out->stats.bytes_read += job.plan.stats.bytes_read;
    out->stats.requests += job.plan.stats.requests;
  }
}

// Every plan's reads as the executor's, cut into batches as the executor
// would cut them (so that the gaps bridged below lie within one batch) and,
// on object stores, in file order with small gaps between neighbours
// bridged by filler reads. refs[i] is the plan read behind reads[i]
// (fillers: none, leaf == UINT32_MAX).
std::vector<ExecRead> executor_reads(const std::vector<LeafJob>& jobs, bool object_store, uint64_t max_gap,
                                     uint64_t align, const ShardedRestoreLimits& limits, std::vector<ReadRef>* refs,
                                     RestoredState* out) {
  std::vector<ReadRef> order;
  for (size_t j = 0; j < jobs.size(); ++j)
    for (size_t r = 0; r < jobs[j].plan.reads.size(); ++r)
      order.push_back(ReadRef{static_cast<uint32_t>(j), static_cast<uint32_t>(r)});
  // Object stores: in file order, so that the reads of neighbouring leaves
  // in a data file share a batch and the store serves touching ones with one
  // GET (with row bands a file interleaves the bands of all its leaves).
  // Stable: a leaf's reads of one file keep their order, which the streaming
  // checksums need. Local disk keeps leaf order, as the unsharded restore
  // (src/restore/restore.cc).
  auto read_of = [&](const ReadRef& ref) -> const PlannedRead& { return jobs[ref.leaf].plan.reads[ref.read]; };
  if (object_store)
    std::stable_sort(order.begin(), order.end(), [&](const ReadRef& a, const ReadRef& b) {
      return std::tie(read_of(a).file, read_of(a).offset) < std::tie(read_of(b).file, read_of(b).offset);
    });
  auto staged = [&](const ReadRef& ref) {
    return read_of(ref).target == kStaging || !jobs[ref.leaf].transform.identity();
  };
  std::vector<Batch> batches;
  for (size_t i = 0; i < order.size();) {
    Batch b{i, i};
    uint64_t bytes = 0, staging = 0;
    for (; i < order.size(); ++i) {
      const PlannedRead& r = read_of(order[i]);
      const uint64_t pos = staged(order[i]) ? place(staging, r.offset, align) : 0;
      if (i > b.begin && (bytes + r.length > limits.batch_bytes ||
                          (staged(order[i]) && pos + r.length > limits.staging_bytes)))
        break;
      if (staged(order[i])) staging = pos + r.length;
      bytes += r.length;
    }
    b.end = i;
    batches.push_back(b);
  }
  // Object stores: a request costs far more than the bytes around it, and
  // each leaf's plan ends at the leaf, so the reads of neighbouring leaves in
  // a data file stay separate requests even when only alignment padding
  // (< 4 KiB) or a small unneeded stretch lies between them. Bridge such gaps
  // (each <= the coalescing gap) with filler reads, smallest first, while
  // everything read stays within 1.9% of the bytes needed (the plans' own
  // coalescing counts against it; issue 4 allows 2%): the backend then
  // serves the neighbours with one request (S3 merges adjacent ranges into
  // one GET). Bridged bytes count in bytes_read; requests counts contiguous
  // ranges.
  std::vector<std::vector<ExecRead>> fillers(batches.size());
  if (object_store) {
    struct Gap {
      uint32_t file = 0;
      uint64_t offset = 0, length = 0;
      size_t batch = 0;
    };
    std::vector<Gap> candidates;
    uint64_t touching = 0;
    std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> spans;  // file, [offset, end)
    for (size_t b = 0; b < batches.size(); ++b) {
      spans.clear();
      for (size_t i = batches[b].begin; i < batches[b].end; ++i) {
        const PlannedRead& r = read_of(order[i]);
        spans.push_back({r.file, {r.offset, r.offset + r.length}});
      }
      std::sort(spans.begin(), spans.end());
      for (size_t k = 1; k < spans.size(); ++k) {
        const auto& [file, prev] = spans[k - 1];
        const auto& [next_file, next] = spans[k];
        if (file != next_file) continue;
        if (next.first == prev.second) ++touching;
        else if (next.first > prev.second && next.first - prev.second <= max_gap)
          candidates.push_back(Gap{file, prev.second, next.first - prev.second, b});
      }
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Gap& x, const Gap& y) { return x.length < y.length; });
    const uint64_t allowed = out->stats.bytes_needed * kBridgeAllowancePermille / 1000;
    const uint64_t waste = out->stats.bytes_read > out->stats.bytes_needed
                               ? out->stats.bytes_read - out->stats.bytes_needed : 0;
    const uint64_t budget = allowed > waste ? allowed - waste : 0;
    uint64_t bridged = 0, joins = 0;
    for (const Gap& g : candidates) {
      if (g.length > budget - bridged) break;
      bridged += g.length;
      ++joins;
      ExecRead f;
      f.file = g.file;
      f.offset = g.offset;
      f.length = g.length;
      f.filler = true;
      fillers[g.batch].push_back(f);
    }
    logging::debug("ckptio: bridging {} of {} gaps between reads ({} bytes; budget {})", joins,
                  candidates.size(), bridged, budget);
    out->stats.bytes_read += bridged;
    // Requests: the contiguous ranges asked for; each bridged gap and each
    // pair of touching reads joins two of them.
    out->stats.requests = order.size() - touching - joins;
  }
  std::vector<ExecRead> reads;
  reads.reserve(order.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    for (size_t i = batches[b].begin; i < batches[b].end; ++i) {
      const LeafJob& job = jobs[order[i].leaf];
      const PlannedRead& r = read_of(order[i]);
      ExecRead e;
      e.file = r.file;
      e.offset = r.offset;
      e.length = r.length;
      if (!staged(order[i])) e.dst = job.target_ptrs[r.target] + r.dst_offset;
      reads.push_back(e);
      refs->push_back(order[i]);
    }
    for (const ExecRead& f : fillers[b]) {
      reads.push_back(f);
      refs->push_back(ReadRef{UINT32_MAX, 0});
    }
    reads.back().ends_batch = true;
  }
  return reads;
}

// Checksums the slices of verifiable pieces each read holds and copies its
// bytes out through the leaf's transform, read by read.
class ShardedConsumer : public ReadConsumer {
 public:
  ShardedConsumer(Storage& storage, int64_t step, bool verify, std::vector<LeafJob>& jobs,
                  const std::vector<ReadRef>& refs, const std::vector<std::string>& files,
                  const std::vector<std::string>& keys, ProgressReport& progress)
      : storage_(storage), step_(step), verify_(verify), jobs_(jobs), refs_(refs), files_(files), keys_(keys),
        progress_(progress) {}

  void delivered(size_t, uint64_t bytes) override { progress_.update(bytes); }

  Status landed(size_t i, const std::byte* landed) override {
    LeafJob& job = jobs_[refs_[i].leaf];
    const uint32_t ri = refs_[i].read;
    const PlannedRead& r = job.plan.reads[ri];
    if (verify_) {
      for (uint32_t k = job.verify_first[ri]; k < job.verify_first[ri + 1]; ++k) {
        const uint32_t p = job.verify_pieces[k];
        const SavedPiece& piece = job.saved.pieces[p];
        const uint64_t lo = std::max(r.offset, piece.offset);
        const uint64_t hi = std::min(r.offset + r.length, piece.offset + piece.length);
        if (lo >= hi) continue;
        job.crc[p] = crc32c(landed + (lo - r.offset), hi - lo, job.crc[p]);
        job.crc_bytes[p] += hi - lo;
        if (job.crc_bytes[p] == piece.length && job.crc[p] != piece.crc32c.value_or(job.crc[p]))
          return data_loss("checksum mismatch in " + job.name + " shard " + std::to_string(p) + " (file " +
                           files_[piece.file] + ") of step " + std::to_string(step_) + " at " +
                           storage_.describe() + "/" + keys_[piece.file]);
      }
    }
    if (job.transform.identity()) {
      apply_copies(job.plan, ri, landed, job.target_ptrs);
      return Status::OK();
    }
    const PieceTransform& t = job.transform;
    Status st;
    if (r.target != kStaging)  // planned to land in the target: staged only for the transform
      st = t.apply(landed, job.target_ptrs[r.target] + t.out_offset(r.dst_offset), r.length);
    for (uint32_t c = r.first_copy; st.ok() && c < r.first_copy + r.num_copies; ++c) {
      const PlannedCopy& copy = job.plan.copies[c];
      std::byte* dst = job.target_ptrs[copy.target];
      for_each_copy_run(job.plan, copy, [&](uint64_t s, uint64_t d, uint64_t n) {
        if (st.ok()) st = t.apply(landed + s, dst + t.out_offset(d), n);
      });
    }
    return st.ok() ? st : st.annotate("restore " + job.name);
  }

  Status failed(size_t i, Status st) override {
    const LeafJob& job = jobs_[refs_[i].leaf];
    const PlannedRead& r = job.plan.reads[refs_[i].read];
    return data_read_error(st,
                           "restore " + job.name + " (" + byte_range(r.offset, r.length) + " of file " +
                               files_[r.file] + ") of step " + std::to_string(step_),
                           storage_.describe() + "/" + keys_[r.file]);
  }

 private:
  Storage& storage_;
  const int64_t step_;
  const bool verify_;
  std::vector<LeafJob>& jobs_;
  const std::vector<ReadRef>& refs_;
  const std::vector<std::string>& files_;
  const std::vector<std::string>& keys_;
  ProgressReport& progress_;
};

// Target buffers filled only by copies out of the staging arenas would take
// their first touch (a page fault per 4 KiB) on the delivering thread,
// between checksums: with RestoreOptions::prefault they are faulted in on a
// thread of its own while the reads go on. The targets reads land in
// directly are faulted in by the kernel as each read is submitted; a thread
// faulting them ahead as well measured slower where a first touch after that
// is cheap (0.80x on two earlier VMs, 8 pairs: docs/restart.md, "Sharded
// restarts: faulting ahead in read order, not kept"), and faster where the
// first load from user space of each page traps to the host, which the
// checksum thread then pays for every page (1.08-1.27x with one process,
// 0.99-1.19x with two: "Sharded restarts, prefaulted where the first touch
// traps"). So they are faulted in too where first_touch_traps().
std::future<void> prefault_targets(const std::vector<LeafJob>& jobs, std::atomic<uint64_t>* populated,
                                   const std::atomic<bool>* stop) {
  const bool all = first_touch_traps();
  std::vector<std::pair<std::byte*, uint64_t>> ranges;
  for (const LeafJob& job : jobs) {
    std::vector<bool> direct(job.target_ptrs.size(), false);
    if (!all && job.transform.identity())
      for (const PlannedRead& r : job.plan.reads)
        if (r.target != kStaging) direct[r.target] = true;
    for (size_t i = 0; i < job.target_ptrs.size(); ++i)
      if (!direct[i]) ranges.emplace_back(job.target_ptrs[i], job.buffers[i].size());
  }
  return populate_in_background(std::move(ranges), populated, stop);
}

}  // namespace

Status restore_sharded(Storage& storage, const std::string& step_dir, int64_t step,
                       const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                       const RestoreOptions& options, RestoredState* out) {
  const ShardedRestoreLimits limits = sharded_restore_limits();
  if (!options.into.empty())
    return invalid_argument("restore into a sharding cannot also restore into caller memory (`into`)");
  const bool object_store = !storage.caps().atomic_rename;
  PlanOptions po;
  po.max_gap = options.coalesce_gap.value_or(object_store ? kObjectStoreGap : kLocalGap);
  // A multiple of 64 bytes, a whole number of elements of every dtype: the
  // planner cuts a read every max_read bytes from its start (an element
  // boundary), and a cut inside an element of a leaf being cast lost its
  // bytes (the staging limit is any size in tests).
  po.max_read = std::max<uint64_t>(64, std::min(kMaxRead, limits.staging_bytes) / 64 * 64);
  po.verify = options.verify;
  po.verify_widen_max_bytes = options.verify_widen_max_bytes;
  const uint64_t align = std::max<uint64_t>(storage.read_alignment(), 1);

  std::vector<std::string> files;  // one numbering for the step
  std::vector<LeafJob> jobs;
  CKPTIO_RETURN_IF_ERROR(plan_leaves(selected, options, po, &files, &jobs, out));
  CKPTIO_RETURN_IF_ERROR(replan_overlapping(po, &jobs));
  prepare_targets(align, options.verify, &jobs, out);
  if (out->stats.pieces_unverified > 0)
    logging::debug("ckptio: restore of step {} into a sharding: {} saved shards read only in part ({} bytes), "
                  "not verified against their checksums", step, out->stats.pieces_unverified,
                  out->stats.bytes_unverified);

  std::vector<std::string> keys;
  keys.reserve(files.size());
  for (const std::string& f : files) keys.push_back(step_dir + "/" + f);
  std::vector<ReadRef> refs;
  std::vector<ExecRead> reads = executor_reads(jobs, object_store, po.max_gap, align, limits, &refs, out);

  // Declared after `jobs`, which owns the buffers: joined before they are freed.
  std::atomic<bool> reads_done{false};
  std::atomic<uint64_t> prefaulted{0};
  std::future<void> prefault;
  if (options.prefault) prefault = prefault_targets(jobs, &prefaulted, &reads_done);
  struct StopPrefault {  // on every way out, a throw too: before `prefault` waits for its thread
    std::atomic<bool>& done;
    ~StopPrefault() { done.store(true, std::memory_order_relaxed); }
  } stop_prefault{reads_done};
  uint64_t to_read = 0;
  for (const ExecRead& r : reads)
    if (!r.filler) to_read += r.length;
  ProgressReport progress(options.on_progress, to_read);
  ShardedConsumer consumer(storage, step, options.verify, jobs, refs, files, keys, progress);
  ReadExecutorLimits el;
  el.batch_bytes = limits.batch_bytes;
  el.staging_bytes = limits.staging_bytes;
  el.align = align;
  Status st = execute_reads(storage, keys, &reads, consumer, el, "restore step " + std::to_string(step));
  reads_done.store(true, std::memory_order_relaxed);
  if (prefault.valid()) prefault.wait();
  out->stats.bytes_prefaulted = prefaulted.load();
  CKPTIO_RETURN_IF_ERROR(st);
  progress.finish();

  for (size_t j = 0; j < jobs.size(); ++j) {
    Tensor& t = out->leaves[j];
    for (size_t d = 0; d < t.device_shards.size(); ++d) t.device_shards[d].data = jobs[j].buffers[jobs[j].target_of[d]];
  }
  return Status::OK();
}

}  // namespace ckptio
