#include "src/save/write_data.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "src/save/stage.h"
#include "src/util/allocate.h"
#include "src/util/clock.h"
#include "src/util/crc32c.h"

namespace ckptio {
namespace {

// The data files of one save. Each is created when its first range comes
// up, so that on an object store the round trip that starts a multipart
// upload overlaps the writes of the files before it.
class DataFiles {
 public:
  DataFiles(Storage& storage, const SaveJob& job)
      : storage_(storage), job_(job), writers_(job.plan.files.size()) {}

  std::string key(size_t f) const { return job_.paths.stage_dir + "/" + job_.data_files[f]; }
  std::string where(size_t f) const { return storage_.describe() + "/" + key(f); }
  WritableObject& writer(size_t f) { return *writers_[f]; }
  // The padding unit of file f's writes; 1 until it is created.
  uint64_t alignment(size_t f) const {
    return writers_[f] ? std::max<uint64_t>(writers_[f]->alignment(), 1) : 1;
  }

  // Creates file f (the attempt's own name) unless it exists.
  Status open(size_t f) {
    if (writers_[f]) return Status::OK();
    Status st = create(f);
    return st.ok() ? st : st.annotate("create " + where(f));
  }

  void abort_all() {
    for (auto& w : writers_)
      if (w) w->abort();
  }
  // After a failure: what is queued and not yet sent is not sent (S3: each
  // part would otherwise spend its retries first, hours against an endpoint
  // that stopped answering).
  void cancel_all() noexcept {
    for (auto& w : writers_)
      if (w) w->cancel();
  }

  // Makes every file durable in turn; after a failure the rest are aborted.
  Status finish_all() {
    const std::vector<PlannedFile>& files = job_.plan.files;
    for (size_t f = 0; f < files.size(); ++f) {
      Status st = writers_[f]->finish(files[f].size);
      if (!st.ok()) {
        for (size_t g = f + 1; g < files.size(); ++g) writers_[g]->abort();
        return st.annotate("make durable " + where(f));
      }
      job_.handle->durable.fetch_add(files[f].size, std::memory_order_release);
    }
    return Status::OK();
  }

 private:
  Status create(size_t f) {
    auto created = storage_.create_new(key(f), job_.plan.files[f].size);
    if (!created.ok()) return created.status();
    writers_[f] = std::move(created).value();
    const uint64_t align = std::max<uint64_t>(writers_[f]->alignment(), 1);
    const uint64_t gran = std::max<uint64_t>(writers_[f]->granularity(), 1);
    if (job_.unit % gran != 0 || job_.chunk % align != 0) {
      // The ranges were cut for Storage::write_granularity(); a writer that
      // disagrees with it would get misaligned parts: fail loudly instead.
      return internal_error("write ranges were cut for a granularity of " + std::to_string(job_.unit) +
                            " bytes, but " + where(f) + " asks for " + std::to_string(gran) + " (alignment " +
                            std::to_string(align) + "): Storage::write_granularity() and the writer disagree");
    }
    return Status::OK();
  }

  Storage& storage_;
  const SaveJob& job_;
  std::vector<std::unique_ptr<WritableObject>> writers_;
};

// The writes in flight, counted, and the first error among them (or one the
// write loop records). Each write's bytes count into the handle's progress:
// staged as it is queued, written as it completes.
class PendingWrites {
 public:
  PendingWrites(BufferPool& pool, SaveHandle::State& progress) : pool_(pool), progress_(progress) {}

  // Writes [data, data + n) at `offset` of `w`; `pooled`, a pool buffer or
  // null, goes back to the pool once written. `payload` (<= n) is what the
  // range holds of the file; the rest is the padding of its last write.
  //
  // Never throws: a write the backend refuses to accept for want of memory
  // (write_async throws having accepted nothing, storage.h) is a failed
  // write, and `pooled` goes back to the pool here.
  void queue(WritableObject& w, uint64_t offset, const std::byte* data, uint64_t n, std::byte* pooled,
             uint64_t payload) {
    { std::lock_guard lock(mu_); ++count_; }
    progress_.staged.fetch_add(payload, std::memory_order_release);
    try {
      w.write_async(offset, std::span<const std::byte>(data, n), [this, pooled, payload](Status st) {
        if (pooled) pool_.release(pooled);
        if (st.ok()) progress_.written.fetch_add(payload, std::memory_order_release);
        std::lock_guard lock(mu_);
        if (!st.ok() && first_.ok()) {
          first_ = std::move(st);
          cv_.notify_all();  // (wait()'s on_failure)
        }
        if (--count_ == 0) cv_.notify_all();
      });
    } catch (...) {
      Status st = status_of_exception("queue a write");
      progress_.staged.fetch_sub(payload, std::memory_order_release);
      if (pooled) pool_.release(pooled);
      std::lock_guard lock(mu_);
      if (first_.ok()) first_ = std::move(st);
      if (--count_ == 0) cv_.notify_all();
    }
  }
  bool failed() {
    std::lock_guard lock(mu_);
    return !first_.ok();
  }
  void fail(Status st) {
    std::lock_guard lock(mu_);
    if (first_.ok()) first_ = std::move(st);
    cv_.notify_all();
  }
  // Once no write is in flight: the first error. `on_failure` runs once, on
  // this thread, as soon as a write fails while others are in flight.
  Status wait(const std::function<void()>& on_failure = {}) {
    std::unique_lock lock(mu_);
    if (on_failure) {
      cv_.wait(lock, [&] { return count_ == 0 || !first_.ok(); });
      if (count_ != 0) {
        lock.unlock();
        on_failure();
        lock.lock();
      }
    }
    cv_.wait(lock, [&] { return count_ == 0; });
    return first_;
  }

 private:
  BufferPool& pool_;
  SaveHandle::State& progress_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  uint64_t count_ = 0;
  Status first_;
};

// Queues the write of every range in file order, and sums each shard's
// checksum into `crcs` from its pieces.
void queue_writes(BufferPool& pool, SaveJob& job, DataFiles& files, PendingWrites& pending,
                  std::vector<uint32_t>& crcs) {
  const std::vector<PlannedFile>& planned = job.plan.files;
  StreamCursor cursor(job.plan);
  crcs.assign(job.plan.shards.size(), 0);
  for (const WriteRange& r : job.ranges) {
    if (!job.failed) {
      Status st = files.open(r.file);
      if (!st.ok()) pending.fail(st);
    }
    if (pending.failed()) job.failed = true;
    if (job.failed && !job.copy_mode) break;
    // (Copy mode goes on consuming the copiers' chunks, below, so that none blocks.)
    const uint64_t align = files.alignment(r.file);
    const uint64_t in_file = r.offset - planned[r.file].start;
    const bool ends_file = r.offset + r.length == planned[r.file].start + planned[r.file].size;
    if (r.direct && !(ends_file && r.length % align != 0)) {
      if (job.failed) break;
      // Zero copy: the device reads the caller's bytes; checksum them
      // meanwhile (borrow mode: they do not change until released).
      pending.queue(files.writer(r.file), in_file, r.direct, r.length, nullptr, r.length);
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
        pool.release(buf);
        continue;  // keep draining the caller's chunks so it never blocks
      }
      for (const PieceCrc& p : c->crcs) crcs[p.shard] = crc32c_combine(crcs[p.shard], p.crc, p.length);
    } else {
      if (job.failed) break;
      buf = pool.acquire();
      if (!buf) {
        pending.fail(pool.out_of_memory());
        job.failed = true;
        break;
      }
      stage_range(cursor, r, buf, [&](size_t shard, uint32_t crc, uint64_t n) {
        crcs[shard] = crc32c_combine(crcs[shard], crc, n);
      });
    }
    const uint64_t padded = std::min<uint64_t>((r.length + align - 1) / align * align, pool.chunk());
    if (padded > r.length) std::memset(buf + r.length, 0, padded - r.length);
    pending.queue(files.writer(r.file), in_file, buf, padded, buf, r.length);
  }
}

// Copy mode: gives back the buffer of every chunk the write loop did not
// consume (after a failure), as they are published: a copier may be waiting
// for one.
void drain_ready(SaveJob& job, BufferPool& pool) {
  if (!job.copy_mode) return;
  std::unique_lock lock(job.mu);
  for (;;) {
    for (SaveJob::Chunk& c : job.chunks)
      if (c.buf) pool.release(std::exchange(c.buf, nullptr));
    if (job.producer_done) return;
    job.cv.wait(lock);
  }
}

}  // namespace

Status write_data(Storage& storage, BufferPool& pool, SaveJob& job, std::vector<uint32_t>& crcs,
                  double& write_seconds, const std::function<void()>& queued) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<DataFiles> files_of_job;
  try {
    files_of_job.emplace(storage, job);  // (allocates)
  } catch (...) {
    // Nothing queued yet, but in copy mode the copiers are staging chunks
    // into pool buffers that only the writes give back: stopped, and their
    // buffers taken back, before the error leaves (else they, and save(),
    // waited for a buffer for good).
    Status st = status_of_exception("write data");
    job.failed = true;
    drain_ready(job, pool);
    if (!job.copy_mode) job.handle->set_released();
    return st;
  }
  DataFiles& files = *files_of_job;
  PendingWrites pending(pool, *job.handle);
  // What queueing throws (std::bad_alloc from a file's creation, a staging
  // copy's bookkeeping) fails the save here, before `files` and `pending`
  // go: the writes already queued land first (pending.wait()).
  try {
    queue_writes(pool, job, files, pending, crcs);
  } catch (...) {
    pending.fail(status_of_exception("queue the writes"));
    job.failed = true;
  }
  if (queued && !job.failed && !pending.failed()) queued();
  Status st = pending.wait([&] { files.cancel_all(); });
  drain_ready(job, pool);
  // Direct writes read the caller's memory until they complete.
  if (!job.copy_mode) job.handle->set_released();
  if (st.ok() && job.failed) st = job.copy_failure();
  if (st.ok() && job.failed) st = internal_error("save stopped early");
  for (size_t f = 0; st.ok() && f < job.plan.files.size(); ++f)  // files without ranges: empty ones
    st = files.open(f);
  if (!st.ok()) {
    files.abort_all();
    return st.annotate("write data");
  }
  st = files.finish_all();
  write_seconds = seconds_since(t0);
  return st;
}

}  // namespace ckptio
