// CheckpointManager: the save pipeline, commit, callbacks and retention.
//
// save() on the caller's thread: validate, wait for an in-flight slot, cast
// (if asked), plan the data file and cut it into write ranges (src/staging.h;
// chunks are a multiple of the backend's write granularity), then
//   copy mode:   copy the state range by range into pool buffers, computing
//                the shards' crc32c on the way, and hand each buffer to the
//                worker (blocks only while the pool is full);
//   borrow mode: nothing more; the worker reads the caller's buffers.
// The worker thread, one job at a time, for each range in file order:
//   staged (copy mode): take the buffer the caller filled (and checksummed,
//                block by block as it copied), queue its write;
//   staged (borrow):   copy the pieces into a pool buffer and checksum them
//                block by block while they are hot in cache, queue the write;
//   direct (borrow):   queue the write straight from the caller's memory
//                (zero copy: on O_DIRECT files large shards are placed so
//                that their address and file offset agree modulo 4096, see
//                plan_save; object stores take any address), then
//                checksum those bytes while the device reads them.
// Then wait for the writes (borrow mode releases the caller's buffers only
// now: direct writes read them until they complete); finish() (fsync); write
// the index and commit (src/commit.cc); run the callback; retention.
#include "ckptio/manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

#include <unistd.h>

#include "src/async.h"
#include "src/callback.h"
#include "src/cast.h"
#include "src/commit.h"
#include "src/crc32c.h"
#include "src/group_commit.h"
#include "src/index_readers.h"
#include "src/layout.h"
#include "src/manager_impl.h"
#include "src/staging.h"

namespace ckptio {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t unix_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Copies and checksums in blocks this large, so that each block is still in
// cache when it is checksummed: measured here, copy + crc32c of 2 GiB this
// way took 1.0-1.2x the time of a plain memcpy, against ~1.5x for a memcpy
// followed by a checksum pass (and the state crosses the memory bus once).
constexpr uint64_t kCopyBlock = 128 << 10;

// Copies the shards' pieces of a staged range into `buf`, zero-fills the gaps
// between them (alignment padding of phase-aligned plans), and calls
// on_piece(shard, crc32c_of_piece, n) for each piece, checksummed from the
// copied bytes.
template <typename OnPiece>
void stage_range(StreamCursor& cursor, const WriteRange& r, std::byte* buf, OnPiece&& on_piece) {
  uint64_t filled = 0;
  cursor.range(r.offset, r.length, [&](size_t i, const std::byte* src, uint64_t n, uint64_t at) {
    if (at > filled) std::memset(buf + filled, 0, at - filled);
    uint32_t crc = 0;
    for (uint64_t done = 0; done < n; done += kCopyBlock) {
      const uint64_t k = std::min(kCopyBlock, n - done);
      std::memcpy(buf + at + done, src + done, k);
      crc = crc32c(buf + at + done, k, crc);
    }
    on_piece(i, crc, n);
    filled = at + n;
  });
  if (r.length > filled) std::memset(buf + filled, 0, r.length - filled);
}

// The checksum of one shard's piece inside a staged chunk.
struct PieceCrc {
  size_t shard = 0;
  uint32_t crc = 0;
  uint64_t length = 0;
};

// A caller's callback on the worker thread: what it throws is logged.
template <typename F>
void run_callback(const char* name, int64_t step, F&& call) {
  Status st = call_callback(name, std::forward<F>(call));
  if (!st.ok()) spdlog::error("ckptio: step {}: {}", step, st.message());
}

}  // namespace

// ---- SaveHandle --------------------------------------------------------------

// In a forked child the handle is a copy whose save runs (or ran) in the
// parent: it never changes there, and its lock may have been held at the
// fork. The child's own copy of the buffers is read by no one: released.
namespace {
bool forked_from(const SaveHandle::State& s) { return s.pid != static_cast<int>(::getpid()); }
}  // namespace

int64_t SaveHandle::step() const { return s_->step; }
bool SaveHandle::done() const {
  if (forked_from(*s_)) return true;
  std::lock_guard lock(s_->mu);
  return s_->done;
}
Status SaveHandle::wait() const {
  if (forked_from(*s_))
    return Status(Code::kFailedPrecondition, "save of step " + std::to_string(s_->step) + ": the handle of process " +
                                                 std::to_string(s_->pid) + ", waited on in its fork " +
                                                 std::to_string(::getpid()) + "; the outcome is known there");
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  return s_->status;
}
bool SaveHandle::released() const {
  if (forked_from(*s_)) return true;
  std::lock_guard lock(s_->mu);
  return s_->released;
}
void SaveHandle::wait_released() const {
  if (forked_from(*s_)) return;
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->released; });
}
SaveStats SaveHandle::stats() const {
  std::lock_guard lock(s_->mu);
  return s_->stats;
}

void SaveHandle::State::set_released() {
  {
    std::lock_guard lock(mu);
    released = true;
  }
  cv.notify_all();
}

void SaveHandle::State::set_stall(double seconds) {
  std::lock_guard lock(mu);
  stats.stall_seconds = seconds;
  stall_known = true;
}

void SaveHandle::State::finish(Status st, const SaveStats& s) {
  {
    std::lock_guard lock(mu);
    status = std::move(st);
    const double stall = stats.stall_seconds;
    stats = s;
    if (stall_known) stats.stall_seconds = stall;
    released = true;
    done = true;
  }
  cv.notify_all();
}

// ---- Job: one save on its way through the worker ------------------------------

struct SaveJob {
  int64_t step = 0;
  std::vector<LeafView> leaves;
  std::vector<Buffer> owned;  // cast copies the leaves point into
  SaveOptions options;
  AttemptPaths paths;
  std::vector<std::string> data_files;  // this process's data files in the step (plan.files)
  bool group = false;     // a multi-process save (ManagerOptions::processes)
  SavePlan plan;
  std::vector<WriteRange> ranges;  // the data files' write requests, in order
  uint64_t chunk = 0;
  uint64_t unit = 1;  // write_unit() of the backend's granularity
  bool copy_mode = true;
  Clock::time_point started;
  int64_t created_unix_ns = 0;
  std::atomic<double> stall_seconds{0};  // set by save() as it returns
  std::shared_ptr<SaveHandle::State> handle;
  std::atomic<bool> failed{false};

  // Copy mode: the caller's thread and the crew fill chunks (one per range)
  // and checksum them as they copy; the worker consumes them in range order.
  // A thread takes a pool buffer and then claims the next range, both under
  // claim_mu, so the lowest range not yet consumed always has its buffer and
  // a full pool cannot deadlock. Every claimed range is published (with a
  // null buffer when its copier saw `failed`).
  struct Chunk {
    std::byte* buf = nullptr;
    std::vector<PieceCrc> crcs;
    bool ready = false;
  };
  std::mutex claim_mu;       // guards next_claim
  size_t next_claim = 0;
  std::mutex mu;             // guards chunks, claimed, producer_done
  std::condition_variable cv;
  std::vector<Chunk> chunks;
  size_t claimed = 0;        // final once producer_done
  bool producer_done = false;

  void publish(size_t i, std::byte* buf, std::vector<PieceCrc> crcs) {
    {
      std::lock_guard lock(mu);
      chunks[i].buf = buf;
      chunks[i].crcs = std::move(crcs);
      chunks[i].ready = true;
    }
    cv.notify_all();
  }
  // Chunk i once published; nullptr when the copiers stopped before it.
  Chunk* wait_chunk(size_t i) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return chunks[i].ready || (producer_done && i >= claimed); });
    return chunks[i].ready ? &chunks[i] : nullptr;
  }
  void producer_finished(size_t n_claimed) {
    {
      std::lock_guard lock(mu);
      claimed = n_claimed;
      producer_done = true;
    }
    cv.notify_all();
  }
};

// ---- Manager ------------------------------------------------------------------

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::open(const std::string& uri,
                                                                   ManagerOptions options,
                                                                   const StorageOptions& storage) {
  CKPTIO_ASSIGN_OR_RETURN(auto backend, open_storage(uri, storage));
  auto naming = StepNaming::make(options.step_format);
  if (!naming.ok()) return naming.status();
  return std::make_unique<CheckpointManager>(std::move(backend), std::move(options));
}

CheckpointManager::CheckpointManager(std::shared_ptr<Storage> storage, ManagerOptions options)
    : storage_(std::move(storage)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  auto naming = StepNaming::make(options_.step_format);
  if (!naming.ok()) {
    spdlog::error("ckptio: {}; using run-{{step}}", naming.status().to_string());
    options_.step_format = "run-{step}";
    naming = StepNaming::make(options_.step_format);
  }
  impl_->naming = naming.value();
  impl_->owner = this;
  if (options_.max_in_flight < 1) options_.max_in_flight = 1;
  // Chunks are cut to a multiple of the backend's write granularity (an S3
  // part) and of 4096 (O_DIRECT, and the staging buffers' alignment), in
  // both staging modes, before anything is copied.
  impl_->unit = write_unit(std::max<uint64_t>(storage_->write_granularity(), 1));
  // Staging buffers are 4096-aligned, so that is the most a backend may ask
  // of a data pointer; anything else that is no power of two is treated as 4096.
  const uint64_t mem = std::max<uint64_t>(storage_->write_memory_alignment(), 1);
  impl_->memory_align = std::has_single_bit(mem) && mem <= 4096 ? mem : 4096;
  impl_->object_bytes = storage_->data_object_bytes();
  const uint64_t align = std::lcm<uint64_t>(impl_->unit, 4096);
  uint64_t chunk = options_.chunk_size ? options_.chunk_size : (8ull << 20);
  chunk = std::max<uint64_t>((chunk + align - 1) / align * align, align);
  impl_->chunk = chunk;
  impl_->pool = std::make_unique<BufferPool>(chunk, std::max<uint64_t>(2, options_.staging_budget / chunk));
  // Copy mode copies on the caller's thread and these helpers (one per
  // further core, up to four copiers): the copy is memory-bound, and more
  // than a few threads buy nothing.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool copies = options_.staging == StagingMode::kCopy;
  impl_->crew = std::make_unique<Crew>(copies ? std::min(cores, 4u) - 1 : 0);
  impl_->worker = std::thread([this] { impl_->worker_loop(); });
  made_by_pid_ = static_cast<int>(::getpid());
}

Status CheckpointManager::check_process() const {
  const int here = static_cast<int>(::getpid());
  if (here == made_by_pid_) return Status::OK();
  return Status(Code::kFailedPrecondition,
                "this checkpoint manager of " + storage_->describe() + " was made by process " +
                    std::to_string(made_by_pid_) + "; process " + std::to_string(here) +
                    " is a fork of it, where its threads do not exist: open a manager in this process");
}

CheckpointManager::~CheckpointManager() {
  if (!check_process().ok()) {
    // A forked child: the worker, the crew and the storage's threads live
    // only in the parent; joining or stopping them here would hang or abort.
    (void)impl_.release();
    (void)new std::shared_ptr<Storage>(std::move(storage_));
    return;
  }
  (void)wait_until_finished();
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
}

Status CheckpointManager::wait_until_finished() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->in_flight == 0; });
  Status first = impl_->first_error;
  impl_->first_error = Status::OK();
  return first;
}

Status CheckpointManager::prepare_staging(uint64_t state_bytes) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  if (options_.staging != StagingMode::kCopy) return Status::OK();
  impl_->pool->reserve(state_bytes / impl_->chunk + (state_bytes % impl_->chunk != 0));
  return Status::OK();
}

Result<SaveHandle> CheckpointManager::save(int64_t step, const std::vector<LeafView>& state,
                                           const SaveOptions& options) {
  const auto called = Clock::now();
  return save_taken(step, std::vector<LeafView>(state), options, called);
}

Result<SaveHandle> CheckpointManager::save(int64_t step, std::vector<LeafView>&& state,
                                           const SaveOptions& options) {
  return save_taken(step, std::move(state), options, Clock::now());
}

Result<SaveHandle> CheckpointManager::save_taken(int64_t step, std::vector<LeafView>&& state,
                                                 const SaveOptions& options, Clock::time_point t0) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  const int64_t created = unix_ns_now();
  if (step < 0) return invalid_argument("step must be >= 0, got " + std::to_string(step));
  const ProcessGroup& group = options_.processes;
  CKPTIO_RETURN_IF_ERROR(check_process_group(group));
  const bool multi = group.count > 1;
  CKPTIO_RETURN_IF_ERROR(validate_leaves(state, /*partial=*/multi));
  if (!options.metadata_json.empty()) CKPTIO_RETURN_IF_ERROR(check_metadata_json(options.metadata_json));
  if (options.float_dtype && !dtype_is_float(*options.float_dtype))
    return invalid_argument("float_dtype must be a float dtype");
  if (options.row_band_ways > kMaxRowBandWays)
    return invalid_argument("row_band_ways must be at most " + std::to_string(kMaxRowBandWays) + ", got " +
                            std::to_string(options.row_band_ways));

  // Wait for a slot: at most max_in_flight saves are queued or running.
  {
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait(lock, [&] { return impl_->in_flight < options_.max_in_flight; });
    ++impl_->in_flight;
  }
  auto release_slot = [&] {
    { std::lock_guard lock(impl_->mu); --impl_->in_flight; }
    impl_->cv.notify_all();
  };

  const std::string final_dir = impl_->naming.name(step);
  if (!options.overwrite) {
    auto st = storage_->stat(index_key(final_dir));
    if (st.ok()) {
      release_slot();
      return Status(Code::kAlreadyExists, "step " + std::to_string(step) + " is already committed at " +
                                              storage_->describe() + "/" + final_dir +
                                              " (pass overwrite to replace it)");
    }
  }

  auto job = std::make_shared<SaveJob>();
  job->step = step;
  job->leaves = std::move(state);
  job->options = options;
  job->copy_mode = options_.staging == StagingMode::kCopy;
  job->started = t0;
  job->created_unix_ns = created;
  job->handle = std::make_shared<SaveHandle::State>();
  job->handle->pid = made_by_pid_;
  job->handle->step = step;
  if (multi) {
    // Every process names this attempt alike (see src/group_commit.cc).
    uint64_t n = 0;
    {
      std::lock_guard lock(impl_->mu);
      n = impl_->group_saves[step]++;
    }
    job->paths = plan_attempt(*storage_, final_dir, group_attempt_id(group.run_id, step, n));
    job->group = true;
  } else {
    job->paths = plan_attempt(*storage_, final_dir);
  }
  job->chunk = impl_->chunk;

  // eformer's float_dtype: cast float leaves now, into owned buffers.
  if (options.float_dtype) {
    for (LeafView& leaf : job->leaves) {
      if (!dtype_is_float(leaf.dtype) || leaf.dtype == *options.float_dtype) continue;
      for (ShardView& sh : leaf.shards) {
        uint64_t n = checked_num_bytes(sh.box).value_or(0);
        Buffer b = Buffer::allocate(n * dtype_size(*options.float_dtype));
        Status st = cast_elements(leaf.dtype, *options.float_dtype, sh.data, b.data(), n);
        if (!st.ok()) { release_slot(); return st; }
        sh.data = b.data();
        job->owned.push_back(std::move(b));
      }
      leaf.dtype = *options.float_dtype;
    }
  }
  split_row_bands(job->leaves, options.row_band_ways, row_band_min_bytes());
  // Borrow mode writes large shards straight from the caller's memory. A
  // backend that needs aligned data pointers (O_DIRECT) gets their file
  // offsets following their addresses modulo that alignment, so that the
  // aligned middle of each qualifies; elsewhere (object stores, buffered
  // files) the shards are packed: padding would split the restore's reads.
  const bool zero_copy = !job->copy_mode;
  job->unit = impl_->unit;
  const uint64_t mem = impl_->memory_align;
  job->plan = plan_save(job->leaves, zero_copy && mem > 1 ? mem : 0, impl_->object_bytes, job->unit);
  job->ranges = plan_write_ranges(job->plan, job->chunk, job->unit, zero_copy, mem);
  for (size_t f = 0; f < job->plan.files.size(); ++f)
    job->data_files.push_back(multi ? group_data_file(job->paths.attempt, group.index, f)
                                    : data_file_name(job->paths.attempt, static_cast<int>(f)));
  if (job->copy_mode) job->chunks.resize(job->ranges.size());  // before the worker sees the job

  {
    std::lock_guard lock(impl_->mu);
    impl_->attempts_in_flight.insert(job->paths.attempt);
    impl_->queue.push_back(job);
  }
  impl_->cv.notify_all();

  if (job->copy_mode) {
    // Copy on the caller's thread and the crew; each chunk goes to the worker
    // as soon as it is full. Blocks only while every pool buffer is in use.
    // Checksums are computed here, block by block as each is copied (see
    // kCopyBlock), per piece; the worker joins them in order.
    impl_->pool->reserve(job->ranges.size());
    SaveJob& j = *job;
    BufferPool& pool = *impl_->pool;
    impl_->crew->run([&j, &pool] {
      StreamCursor cursor(j.plan);  // per thread: its ranges increase
      for (;;) {
        std::byte* buf = nullptr;
        size_t i = 0;
        {
          std::lock_guard lock(j.claim_mu);
          if (j.failed.load() || j.next_claim >= j.ranges.size()) return;
          buf = pool.acquire();
          i = j.next_claim++;
        }
        std::vector<PieceCrc> crcs;
        if (j.failed.load()) {
          pool.release(buf);
          buf = nullptr;
        } else {
          stage_range(cursor, j.ranges[i], buf,
                      [&](size_t shard, uint32_t crc, uint64_t n) { crcs.push_back({shard, crc, n}); });
        }
        j.publish(i, buf, std::move(crcs));
      }
    });
    job->producer_finished(job->next_claim);
    job->handle->set_released();
  }
  // The worker may already be done with a small save: the handle keeps the
  // stall whichever of the two writes its stats first.
  job->stall_seconds = seconds_since(t0);
  job->handle->set_stall(job->stall_seconds);
  return SaveHandle(job->handle);
}

void CheckpointManager::Impl::worker_loop() {
  for (;;) {
    std::shared_ptr<SaveJob> job;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      job = queue.front();
      queue.pop_front();
    }
    run_job(*job);
  }
}

Status CheckpointManager::Impl::write_data(SaveJob& job, std::vector<uint32_t>& crcs,
                                           double& write_seconds, const std::function<void()>& queued) {
  Storage& storage = owner->storage();
  const auto t0 = Clock::now();
  const std::vector<PlannedFile>& files = job.plan.files;
  auto key_of = [&](size_t f) { return job.paths.stage_dir + "/" + job.data_files[f]; };
  // Each data file is created when its first range comes up, so that on an
  // object store the round trip that starts a multipart upload overlaps the
  // writes of the files before it.
  std::vector<std::unique_ptr<WritableObject>> writers(files.size());
  auto open_file = [&](size_t f) -> Status {
    if (writers[f]) return Status::OK();
    auto created = storage.create_new(key_of(f), files[f].size);  // the attempt's own name
    if (!created.ok()) return created.status();
    writers[f] = std::move(created).value();
    const uint64_t align = std::max<uint64_t>(writers[f]->alignment(), 1);
    const uint64_t gran = std::max<uint64_t>(writers[f]->granularity(), 1);
    if (job.unit % gran != 0 || job.chunk % align != 0) {
      // The ranges were cut for Storage::write_granularity(); a writer that
      // disagrees with it would get misaligned parts: fail loudly instead.
      return internal_error("write ranges were cut for a granularity of " + std::to_string(job.unit) +
                            " bytes, but " + storage.describe() + "/" + key_of(f) + " asks for " +
                            std::to_string(gran) + " (alignment " + std::to_string(align) +
                            "): Storage::write_granularity() and the writer disagree");
    }
    return Status::OK();
  };

  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t count = 0;
    Status first;
  } pending;
  auto queue_write = [&](const WriteRange& r, const std::byte* data, uint64_t n, std::byte* pooled) {
    { std::lock_guard lock(pending.mu); ++pending.count; }
    writers[r.file]->write_async(r.offset - files[r.file].start, std::span<const std::byte>(data, n),
                                 [&, pooled](Status st) {
      if (pooled) pool->release(pooled);
      std::lock_guard lock(pending.mu);
      if (!st.ok() && pending.first.ok()) pending.first = st;
      if (--pending.count == 0) pending.cv.notify_all();
    });
  };
  auto write_failed = [&] {
    std::lock_guard lock(pending.mu);
    return !pending.first.ok();
  };
  auto fail = [&](Status st) {
    std::lock_guard lock(pending.mu);
    if (pending.first.ok()) pending.first = std::move(st);
  };

  StreamCursor cursor(job.plan);
  crcs.assign(job.plan.shards.size(), 0);
  for (const WriteRange& r : job.ranges) {
    if (!job.failed) {
      Status st = open_file(r.file);
      if (!st.ok()) fail(st.annotate("create " + storage.describe() + "/" + key_of(r.file)));
    }
    if (write_failed()) job.failed = true;
    if (job.failed && !job.copy_mode) break;
    // (Copy mode goes on consuming the copiers' chunks, below, so that none blocks.)
    const uint64_t align = writers[r.file] ? std::max<uint64_t>(writers[r.file]->alignment(), 1) : 1;
    const bool ends_file = r.offset + r.length == files[r.file].start + files[r.file].size;
    if (r.direct && !(ends_file && r.length % align != 0)) {
      if (job.failed) break;
      // Zero copy: the device reads the caller's bytes; checksum them
      // meanwhile (borrow mode: they do not change until released).
      queue_write(r, r.direct, r.length, nullptr);
      crcs[r.shard] = crc32c(r.direct, r.length, crcs[r.shard]);
      continue;
    }
    std::byte* buf = nullptr;
    if (job.copy_mode) {
      SaveJob::Chunk* c = job.wait_chunk(&r - job.ranges.data());
      if (!c) break;  // the copiers stopped after a failure
      buf = std::exchange(c->buf, nullptr);
      if (!buf) continue;
      if (job.failed) {
        pool->release(buf);
        continue;  // keep draining the caller's chunks so it never blocks
      }
      for (const PieceCrc& p : c->crcs) crcs[p.shard] = crc32c_combine(crcs[p.shard], p.crc, p.length);
    } else {
      if (job.failed) break;
      buf = pool->acquire();
      stage_range(cursor, r, buf, [&](size_t shard, uint32_t crc, uint64_t n) {
        crcs[shard] = crc32c_combine(crcs[shard], crc, n);
      });
    }
    const uint64_t padded = std::min<uint64_t>((r.length + align - 1) / align * align, pool->chunk());
    if (padded > r.length) std::memset(buf + r.length, 0, padded - r.length);
    queue_write(r, buf, padded, buf);
  }
  if (queued && !job.failed && !write_failed()) queued();
  {
    std::unique_lock lock(pending.mu);
    pending.cv.wait(lock, [&] { return pending.count == 0; });
  }
  drain_ready(job);
  // Direct writes read the caller's memory until they complete.
  if (!job.copy_mode) job.handle->set_released();
  Status st = pending.first;
  if (st.ok() && job.failed) st = internal_error("save stopped early");
  for (size_t f = 0; st.ok() && f < files.size(); ++f)  // files without ranges: empty ones
    st = open_file(f).annotate("create " + storage.describe() + "/" + key_of(f));
  if (!st.ok()) {
    for (auto& w : writers)
      if (w) w->abort();
    return st.annotate("write data");
  }
  for (size_t f = 0; f < files.size(); ++f) {
    st = writers[f]->finish(files[f].size).annotate("make durable " + storage.describe() + "/" + key_of(f));
    if (!st.ok()) {
      for (size_t g = f + 1; g < files.size(); ++g) writers[g]->abort();
      break;
    }
  }
  write_seconds = seconds_since(t0);
  return st;
}

void CheckpointManager::Impl::drain_ready(SaveJob& job) {
  if (!job.copy_mode) return;
  // Gives back the buffer of every chunk the write loop did not consume (after
  // a failure), as they are published: a copier may be waiting for one.
  std::unique_lock lock(job.mu);
  for (;;) {
    for (SaveJob::Chunk& c : job.chunks)
      if (c.buf) pool->release(std::exchange(c.buf, nullptr));
    if (job.producer_done) return;
    job.cv.wait(lock);
  }
}

Index CheckpointManager::Impl::build_index(const SaveJob& job, const std::vector<uint32_t>& crcs) {
  BuiltIndex b = build_index(job);
  for (size_t k = 0; k < crcs.size(); ++k) *b.crc_of[k] = crcs[k];
  return std::move(b.index);
}

CheckpointManager::Impl::BuiltIndex CheckpointManager::Impl::build_index(const SaveJob& job) {
  BuiltIndex built;
  Index& index = built.index;
  index.step = job.step;
  index.created_unix_ns = job.created_unix_ns;
  index.committed_unix_ns = unix_ns_now();
  index.metadata_json = job.options.metadata_json.empty() ? "{}" : job.options.metadata_json;
  for (size_t f = 0; f < job.plan.files.size(); ++f)
    index.files.push_back({job.data_files[f], job.plan.files[f].size});
  // Every leaf, in the caller's order, also one without shards (a process
  // of a multi-process save that writes none of it; a zero-size leaf).
  std::map<std::string, size_t> prefix_at;
  std::vector<std::pair<size_t, size_t>> where(job.leaves.size());  // (prefix, leaf) positions
  size_t p = 0;  // the prefix of the leaf before: leaves come in runs of one prefix
  for (size_t i = 0; i < job.leaves.size(); ++i) {
    const LeafView& leaf = job.leaves[i];
    if (index.prefixes.empty() || index.prefixes[p].name != leaf.prefix) {
      auto [it, fresh] = prefix_at.emplace(leaf.prefix, index.prefixes.size());
      if (fresh) index.prefixes.push_back(PrefixRecord{leaf.prefix, {}});
      p = it->second;
    }
    auto& leaves = index.prefixes[p].leaves;
    where[i] = {p, leaves.size()};
    leaves.push_back(LeafRecord{leaf.path, leaf.dtype, leaf.shape, {}});
  }
  for (const PlannedShard& ps : job.plan.shards) {
    const LeafView& leaf = job.leaves[ps.leaf];
    ShardRecord rec;
    rec.box = leaf.shards[ps.shard].box;
    rec.file = job.data_files[ps.file];
    rec.offset = ps.offset - job.plan.files[ps.file].start;
    rec.length = ps.length;
    index.prefixes[where[ps.leaf].first].leaves[where[ps.leaf].second].shards.push_back(std::move(rec));
  }
  // Every vector is final now: the records stay where they are.
  built.crc_of.reserve(job.plan.shards.size());
  std::vector<size_t> next_shard(job.leaves.size(), 0);
  for (const PlannedShard& ps : job.plan.shards)
    built.crc_of.push_back(
        &index.prefixes[where[ps.leaf].first].leaves[where[ps.leaf].second].shards[next_shard[ps.leaf]++].crc32c);
  return built;
}

Status CheckpointManager::Impl::commit_group(SaveJob& job, const std::vector<uint32_t>& crcs, Status own,
                                             double& commit_seconds) {
  const auto t0 = Clock::now();
  Storage& storage = owner->storage();
  const ProcessGroup& group = owner->options().processes;
  const GroupSave g{storage, group, job.paths, job.step};
  Status st = publish_manifest(g, own.ok() ? build_index(job, crcs) : Index{}, own);
  if (group.index != 0) {
    Status outcome = await_outcome(g);
    commit_seconds = seconds_since(t0);
    if (!own.ok()) return own;
    return st.ok() ? outcome : st;
  }
  if (!own.ok()) st = own;
  if (st.ok()) {
    auto merged = gather_manifests(g);
    if (merged.ok()) {
      Index& index = *merged;
      index.step = job.step;
      index.created_unix_ns = job.created_unix_ns;
      index.committed_unix_ns = unix_ns_now();
      index.metadata_json = job.options.metadata_json.empty() ? "{}" : job.options.metadata_json;
      std::string json = serialize_index(index);
      auto check = parse_index(json);
      st = check.ok() ? commit_attempt(storage, job.paths, json, job.options.overwrite)
                      : check.status().annotate("internal: merged index fails to parse");
    } else {
      st = merged.status();
    }
  }
  announce_outcome(g, st);
  commit_seconds = seconds_since(t0);
  return st;
}

namespace {

// After a multi-process save failed: whether the step's index may still name
// this process's data files (the coordinator's index PUT may have stored it
// although the step was reported failed, and the index cannot be read). Such
// files are left for gc, which removes them unless an index names them.
bool index_may_name(Storage& storage, const SaveJob& job) {
  if (job.data_files.empty()) return false;
  auto listed = index_lists(storage, job.paths.final_dir, job.data_files.front());
  return !listed.ok() || *listed;
}

}  // namespace

void CheckpointManager::Impl::run_job(SaveJob& job) {
  Storage& storage = owner->storage();
  SaveStats stats;
  stats.bytes = job.plan.bytes();
  stats.stall_seconds = job.stall_seconds;

  std::vector<uint32_t> crcs;
  // A single-process save prepares its index on a thread of its own while
  // the data is written: the records at once, the checksums once every write
  // is queued (and every checksum known), then the text, while the last
  // writes drain and the files are made durable. The text is then written to
  // the stage directory (POSIX; there no reader sees it before the rename)
  // while it is read back (the index we write must be one we can read back:
  // never commit a step that discovery would reject), both usually before
  // the data has drained (README "Many small leaves" measures what that
  // saves at 100,000 leaves). Nothing is published unless the writes
  // succeed and the text reads back.
  std::string json;
  std::promise<bool> checksums_known;  // false: the writes failed, give up
  std::future<bool> known = checksums_known.get_future();
  // The verdict (index staged and read back) comes before the two indexes
  // are freed (at 100,000 leaves ~20 ms of free() calls): they are freed off
  // the commit's path, while it publishes.
  std::promise<Status> verdict_promise;
  std::future<Status> verdict = verdict_promise.get_future();
  bool told = false;
  auto prepare_index = [&]() {
    bool said = false;
    auto say = [&](Status st) {
      said = true;
      verdict_promise.set_value(std::move(st));
    };
    try {
      BuiltIndex b = build_index(job);
      if (!known.get()) return say(internal_error("index not needed: the data writes failed"));
      for (size_t k = 0; k < crcs.size(); ++k) *b.crc_of[k] = crcs[k];
      b.index.committed_unix_ns = unix_ns_now();
      json = serialize_index(b.index);
      auto stage = [&] { return stage_index(storage, job.paths, json); };
      std::future<Status> staging;  // (object stores stage nothing: the index PUT is the commit)
      if (job.paths.renames) staging = try_async(stage);
      auto check = parse_index(json);
      Status staged = staging.valid() ? staging.get() : stage();
      if (!check.ok()) return say(check.status().annotate("internal: serialized index fails to parse"));
      say(staged);
    } catch (...) {  // (out of memory) the worker must not wait for a verdict that never comes
      if (!said) verdict_promise.set_exception(std::current_exception());
    }
  };
  // Invalid when no thread could be had: the index is then prepared on this
  // thread once the writes are done. (Its destructor waits for the thread
  // before anything above it is destroyed, on every path below.)
  std::future<void> prepared;
  if (!job.group) prepared = try_async(std::ref(prepare_index));
  auto tell = [&](bool ok) {
    if (job.group || std::exchange(told, true)) return;
    checksums_known.set_value(ok);
  };
  bool outcome_unknown = false;  // the index PUT failed, and reading it back too
  Status st = write_data(job, crcs, stats.write_seconds, [&] { tell(true); });
  tell(st.ok());  // (the writes failed before all were queued, or none was)
  if (job.group) {
    st = commit_group(job, crcs, st, stats.commit_seconds);
  } else {
    const auto t0 = Clock::now();
    if (!prepared.valid()) {  // no thread for it: prepared now, on this one
      prepared = std::async(std::launch::deferred, std::ref(prepare_index));
      prepared.wait();
    }
    Status prepared_index = verdict.get();  // (also when the writes failed: nothing may still be staging)
    if (st.ok()) st = prepared_index;
    if (st.ok()) st = publish_attempt(storage, job.paths, json, job.options.overwrite, &outcome_unknown);
    stats.commit_seconds = seconds_since(t0);
  }
  if (!st.ok()) {
    if (job.group) {  // the staging directory is shared: only this process's files
      if (!index_may_name(storage, job))
        for (const std::string& f : job.data_files) (void)storage.remove(job.paths.stage_dir + "/" + f);
    } else if (!outcome_unknown)  // (else a committed index may name them; gc removes them if not)
      discard_attempt(storage, job.paths, job.data_files);
    st = st.annotate("save step " + std::to_string(job.step));
    spdlog::error("ckptio: {}", st.to_string());
  } else {
    spdlog::debug("ckptio: committed step {} ({} bytes)", job.step, stats.bytes);
  }
  stats.stall_seconds = job.stall_seconds;
  stats.total_seconds = seconds_since(job.started);
  job.owned.clear();

  // The callback runs before the handle completes, so that a caller who
  // waited on the handle knows its callback has run.
  if (owner->options().on_commit)
    run_callback("on_commit", job.step, [&] { owner->options().on_commit(CommitEvent{job.step, st, stats}); });
  job.handle->finish(st, stats);
  // Retention is the committer's job: process 0 of a group.
  if (st.ok() && owner->options().processes.index == 0 &&
      (owner->options().max_to_keep > 0 || owner->options().keep_every > 0)) {
    RetentionEvent r;
    r.after_step = job.step;
    r.status = retain(owner->options().max_to_keep, owner->options().keep_every, &r.deleted);
    if (!r.status.ok()) spdlog::warn("ckptio: retention after step {}: {}", job.step, r.status.to_string());
    if (owner->options().on_retention)
      run_callback("on_retention", job.step, [&] { owner->options().on_retention(r); });
  }
  {
    std::lock_guard lock(mu);
    attempts_in_flight.erase(job.paths.attempt);
    if (!st.ok() && first_error.ok()) first_error = st;
    --in_flight;
  }
  cv.notify_all();
}

// ---- Discovery, retention, gc ---------------------------------------------------

// A large index is read in two parts, and its first half parsed while the
// second is read (index_readers::parse_index_arriving): on local disk a cold
// 26 MB index (100,000 leaves) takes about as long to read as to parse.
// The text is never zero-filled first; one the storage holds in memory
// already is parsed there.
Result<std::optional<Index>> CheckpointManager::Impl::load_index(const std::string& dir) {
  constexpr uint64_t kInParts = 4ull << 20;
  const std::string key = index_key(dir);
  auto object = owner->storage().open(key, IndexLimits{}.max_bytes);
  if (!object.ok()) {
    if (object.status().code() == Code::kNotFound) return std::optional<Index>();
    return object.status();
  }
  ObjectReader& r = **object;
  const std::optional<std::string_view> held = r.in_memory();  // (an object store's GET): parsed where it lies
  const uint64_t size = r.size();
  const uint64_t first = size < kInParts ? size : size / 2;  // the helper reads from its last leaf
  std::unique_ptr<char[]> text;
  if (!held) {
    text.reset(new char[std::max<uint64_t>(size, 1)]);
    CKPTIO_RETURN_IF_ERROR(r.read(0, first, reinterpret_cast<std::byte*>(text.get())));
  }
  const std::function<Status()> rest = [&] {
    return r.read(first, size - first, reinterpret_cast<std::byte*>(text.get() + first));
  };
  auto index = held ? parse_index(*held)
                    : index_readers::parse_index_arriving(std::string_view(text.get(), size), first, rest);
  if (!index.ok()) return index.status().annotate(owner->storage().describe() + "/" + key);
  return std::optional<Index>(std::move(index).value());
}

Status CheckpointManager::Impl::missing_index(const std::string& dir, int64_t step) {
  Storage& storage = owner->storage();
  const std::string location = storage.describe() + "/" + index_key(dir);
  Status not_committed =
      not_found("step " + std::to_string(step) + " is not committed at " + storage.describe());
  // On an object store a step prefix without an index is a save in progress
  // or a dead attempt; only a POSIX-like commit (rename of a directory that
  // already holds its index) makes it damage.
  if (!storage.caps().atomic_rename) return not_committed;
  auto objs = storage.list(dir + "/", /*delimiter=*/false);
  if (!objs.ok()) return objs.status().annotate("list " + storage.describe() + "/" + dir + "/");
  if (objs->objects.empty()) return not_committed;
  return data_loss(location + " is missing, but " + storage.describe() + "/" + dir + "/ holds " +
                   std::to_string(objs->objects.size()) + " object(s) (" + objs->objects.front().key +
                   (objs->objects.size() > 1 ? ", ..." : "") +
                   "): the index of step " + std::to_string(step) +
                   " was deleted or lost, so the step is not committed");
}

Result<std::vector<int64_t>> CheckpointManager::Impl::committed_steps(bool parse, bool newest_only) {
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(owner->storage(), naming));
  std::vector<int64_t> steps;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->kind != StepDirKind::kFinal) continue;
    if (!parse) {
      auto st = owner->storage().stat(index_key(it->name));
      if (st.ok()) steps.push_back(it->step);
      else if (st.status().code() != Code::kNotFound) return st.status();
      continue;
    }
    auto index = load_index(it->name);
    if (!index.ok()) {
      if (owner->options().strict || !index.status().data_loss()) return index.status();
      spdlog::warn("ckptio: skipping step {}: {}", it->step, index.status().to_string());
      continue;
    }
    if (!index->has_value()) {  // no index: not committed; damage on POSIX
      Status why = missing_index(it->name, it->step);
      if (why.code() == Code::kNotFound) continue;
      if (owner->options().strict || !why.data_loss()) return why;
      spdlog::warn("ckptio: skipping step {}: {}", it->step, why.to_string());
      continue;
    }
    steps.push_back(it->step);
    if (newest_only) break;
  }
  std::reverse(steps.begin(), steps.end());
  return steps;
}

Result<std::vector<int64_t>> CheckpointManager::all_steps() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return impl_->committed_steps(/*parse=*/true, /*newest_only=*/false);
}

Result<std::optional<int64_t>> CheckpointManager::latest_step() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  CKPTIO_ASSIGN_OR_RETURN(auto steps, impl_->committed_steps(true, true));
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}

Result<std::vector<StepInfo>> CheckpointManager::list_step_dirs() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(*storage_, impl_->naming));
  std::vector<StepInfo> out;
  for (const StepDir& d : dirs) {
    StepInfo info;
    info.step = d.step;
    info.name = d.name;
    CKPTIO_ASSIGN_OR_RETURN(ListResult objs, storage_->list(d.name + "/", false));
    for (const auto& o : objs.objects) info.bytes += o.size;
    if (d.kind == StepDirKind::kFinal) {
      auto index = impl_->load_index(d.name);
      if (index.ok() && index->has_value()) {
        info.committed = true;
        info.committed_unix_ns = (*index)->committed_unix_ns;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<Index> CheckpointManager::read_index(int64_t step) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  const std::string dir = impl_->naming.name(step);
  CKPTIO_ASSIGN_OR_RETURN(auto index, impl_->load_index(dir));
  if (!index) return impl_->missing_index(dir, step);
  return std::move(*index);
}

Status CheckpointManager::remove_step(int64_t step) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return delete_committed_step(*storage_, impl_->naming.name(step));
}

Status CheckpointManager::apply_retention(int max_to_keep, int64_t keep_every) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return impl_->retain(max_to_keep, keep_every, nullptr);
}

Status CheckpointManager::Impl::retain(int max_to_keep, int64_t keep_every, std::vector<int64_t>* deleted) {
  CKPTIO_ASSIGN_OR_RETURN(auto steps, committed_steps(/*parse=*/false, false));
  if (steps.empty() || max_to_keep <= 0) return Status::OK();
  std::set<int64_t> keep(steps.end() - std::min<size_t>(steps.size(), max_to_keep), steps.end());
  keep.insert(steps.back());  // never the latest
  if (keep_every > 0)
    for (int64_t s : steps)
      if (s % keep_every == 0) keep.insert(s);
  Status first;
  for (int64_t s : steps) {
    if (keep.count(s)) continue;
    {
      std::lock_guard lock(mu);
      if (restoring.count(s)) continue;  // never under a reader
    }
    Status st = owner->remove_step(s);
    if (st.ok() && deleted) deleted->push_back(s);
    if (!st.ok() && first.ok()) first = st.annotate("retention: delete step " + std::to_string(s));
  }
  return first;
}

Status CheckpointManager::gc(const GcOptions& options) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  if (!(options.min_age_seconds >= 0))
    return invalid_argument("gc: min_age_seconds must be >= 0, not " + std::to_string(options.min_age_seconds));
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(*storage_, impl_->naming));
  Status first;
  auto note = [&](Status st) { if (!st.ok() && first.ok()) first = st; };
  const int64_t now = unix_ns_now();
  const double min_age_ns = options.min_age_seconds * 1e9;
  // A change at `t` (0: unknown, counts as old) is too recent to remove.
  auto recent = [&](int64_t t) { return min_age_ns > 0 && t > 0 && static_cast<double>(now - t) < min_age_ns; };
  // Something under `prefix` changed too recently; an error keeps it too.
  auto live = [&](const std::string& prefix) {
    if (min_age_ns <= 0) return false;
    auto t = storage_->newest_change(prefix);
    if (!t.ok()) {
      note(t.status().annotate("gc: age of " + storage_->describe() + "/" + prefix));
      return true;
    }
    return t->has_value() && recent(**t);
  };
  auto in_flight_here = [&](const std::string& key) {
    std::lock_guard lock(impl_->mu);
    for (const auto& a : impl_->attempts_in_flight)
      if (key.find(a) != std::string::npos) return true;
    return false;
  };
  for (const StepDir& d : dirs) {
    {
      std::lock_guard lock(impl_->mu);
      if (impl_->attempts_in_flight.count(d.attempt)) continue;
    }
    if (d.kind != StepDirKind::kFinal) {
      if (!live(d.name + "/")) note(storage_->remove_prefix(d.name + "/"));
      continue;
    }
    // Object stores: remove data objects no committed index references
    // (failed attempts, replaced steps). Steps without an index are dead
    // attempts (or saves in progress elsewhere) and go whole. POSIX: a
    // committed directory came whole from one rename, but a multi-process
    // save's coordinator killed between that rename and removing the
    // processes' manifests leaves them there: anything but the index and
    // data files goes (the index is read only when something else is there).
    auto objs = storage_->list(d.name + "/", false);
    if (!objs.ok()) { note(objs.status()); continue; }
    const bool posix = storage_->caps().atomic_rename;
    if (posix && std::all_of(objs->objects.begin(), objs->objects.end(), [&](const ListEntry& o) {
          return o.key == index_key(d.name) || o.key.starts_with(d.name + "/data-");
        }))
      continue;
    auto index = impl_->load_index(d.name);
    if (!index.ok()) continue;  // damaged: leave it for a human
    if (!index->has_value() && (posix || live(d.name + "/"))) continue;  // POSIX: not ours; leave it
    std::set<std::string> referenced;
    if (index->has_value())
      for (const auto& f : (*index)->files) referenced.insert(d.name + "/" + f.name);
    for (const auto& o : objs->objects) {
      if (o.key == index_key(d.name) || referenced.count(o.key) || recent(o.modified_unix_ns)) continue;
      if (!in_flight_here(o.key)) note(storage_->remove(o.key));
    }
  }
  // Object stores: multipart uploads never completed nor aborted (a killed
  // saver) hold storage that list() does not show; abort those of attempts
  // not in flight here that began long enough ago.
  auto unfinished = storage_->list_unfinished("");
  if (unfinished.status().code() == Code::kUnimplemented) {
    spdlog::warn("ckptio: gc cannot list unfinished uploads at {}: {}", storage_->describe(),
                 unfinished.status().to_string());
    return first;
  }
  if (!unfinished.ok()) {
    note(unfinished.status());
    return first;
  }
  for (const ListEntry& u : *unfinished)
    if (!recent(u.modified_unix_ns) && !in_flight_here(u.key)) note(storage_->abort_unfinished(u.key));
  return first;
}

}  // namespace ckptio
