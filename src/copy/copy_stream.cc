// Streaming a step's data files from one storage to another in bounded
// memory, verifying every shard on the way.
//
// The files are cut into chunks of copy_chunk_size() bytes (a multiple of the
// destination's write granularity, so every chunk is a legal write range,
// e.g. whole S3 parts) and moved through at most max_memory / chunk buffers,
// 4096-aligned for direct I/O. The calling thread drives a pipeline:
//   read    batches of chunks through the read executor
//           (src/restore/read_executor.h: two batches in flight, the backend
//           reading a batch's requests in parallel), each chunk landing in a
//           buffer taken from the pool as its batch is launched;
//   verify  each batch, in file order, as it lands: every shard's crc32c is
//           updated with the bytes of it that the chunk holds, and checked
//           when its last byte has passed (shards may lie in any order and
//           even overlap in a file, format.md §2.3, so each keeps its own
//           running checksum);
//   write   each verified chunk with WritableObject::write_async at the same
//           offset; the completion callback returns the buffer. The last
//           range of a file is padded with zeros to the writer's alignment().
// A file is finished (fsync / CompleteMultipartUpload) once its last chunk is
// queued, so the next file's reads keep going while it drains.
//
// Nothing is written before it is verified except bytes no shard covers
// (alignment gaps, unspecified by the format); a shard that fails stops the
// copy before its last chunk is written.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>

#include "src/copy/copy.h"
#include "src/util/allocate.h"
#include "src/restore/read_executor.h"
#include "src/util/crc32c.h"

namespace ckptio {
namespace {

constexpr uint64_t kDefaultChunk = 8ull << 20;
constexpr uint64_t kAlign = 4096;

// Chunk buffers, allocated on first use, at most `capacity`.
class ChunkBuffers {
 public:
  ChunkBuffers(uint64_t chunk, size_t capacity) : chunk_(chunk), capacity_(capacity) {
    free_.reserve(capacity_);  // release(), on a backend thread, never allocates
  }

  // `n` buffers, waiting for releases (n <= capacity).
  std::vector<std::byte*> acquire(size_t n) {
    std::unique_lock lock(mu_);
    std::vector<std::byte*> got;
    cv_.wait(lock, [&] { return !(got = take(n)).empty(); });
    return got;
  }
  void release(std::byte* b) noexcept {
    {
      std::lock_guard lock(mu_);
      free_.push_back(b);
    }
    cv_.notify_all();
  }

 private:
  std::vector<std::byte*> take(size_t n) {  // mu_ held
    if (free_.size() + (capacity_ - owned_.size()) < n) return {};
    while (free_.size() < n) {
      owned_.push_back(Buffer::allocate(chunk_, kAlign));
      free_.push_back(owned_.back().data());
    }
    std::vector<std::byte*> out(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    return out;
  }

  const uint64_t chunk_;
  const size_t capacity_;
  std::mutex mu_;  // guards owned_, free_
  std::condition_variable cv_;
  std::vector<Buffer> owned_;
  std::vector<std::byte*> free_;
};

// One shard of a data file, as the stream checks it.
struct ShardCheck {
  uint64_t begin = 0, end = 0;  // byte range in the file
  uint32_t want = 0, crc = 0;
  size_t prefix = 0, leaf = 0, shard = 0;  // where in the index
};

// Checks the shards of one data file while its bytes pass in file order.
class FileVerifier {
 public:
  void add(const ShardCheck& s) { shards_.push_back(s); }
  void sort() {
    std::stable_sort(shards_.begin(), shards_.end(),
                     [](const ShardCheck& a, const ShardCheck& b) { return a.begin < b.begin; });
  }
  // Feeds bytes [at, at + len) (the stream's next ones). Returns the first
  // shard that completed with a wrong checksum, or nullptr.
  const ShardCheck* feed(const std::byte* data, uint64_t at, uint64_t len) {
    const uint64_t stop = at + len;
    while (next_ < shards_.size() && shards_[next_].begin < stop) active_.push_back(next_++);
    const ShardCheck* bad = nullptr;
    size_t kept = 0;
    for (size_t i : active_) {
      ShardCheck& s = shards_[i];
      const uint64_t lo = std::max(s.begin, at), hi = std::min(s.end, stop);
      if (lo < hi) s.crc = crc32c(data + (lo - at), hi - lo, s.crc);
      if (s.end > stop) {
        active_[kept++] = i;
        continue;
      }
      ++verified_;
      if (s.crc != s.want && !bad) bad = &s;
    }
    active_.resize(kept);
    return bad;
  }
  // After the file's last byte: the shards not completed yet (empty ones at
  // its very end, or every shard of an empty file).
  const ShardCheck* finish() {
    const ShardCheck* bad = nullptr;
    for (; next_ < shards_.size(); ++next_) active_.push_back(next_);
    for (size_t i : active_) {
      ++verified_;
      if (shards_[i].crc != shards_[i].want && !bad) bad = &shards_[i];
    }
    active_.clear();
    return bad;
  }
  uint64_t verified() const { return verified_; }

 private:
  std::vector<ShardCheck> shards_;
  size_t next_ = 0;             // shards_[next_..] have not started
  std::vector<size_t> active_;  // started, not complete
  uint64_t verified_ = 0;
};

struct Chunk {
  size_t file = 0;
  uint64_t offset = 0, length = 0;
  std::byte* buf = nullptr;
};

// Walks the files' chunks in order without materializing them (an index may
// declare files of any size; memory must not follow).
class ChunkCursor {
 public:
  ChunkCursor(const std::vector<DataFileRecord>& files, uint64_t chunk) : files_(files), chunk_(chunk) {
    for (const DataFileRecord& f : files)
      if (__builtin_add_overflow(remaining_, f.size / chunk + (f.size % chunk != 0), &remaining_))
        remaining_ = UINT64_MAX;  // reading fails long before this matters
    skip_empty();
  }
  bool done() const { return file_ == files_.size(); }
  uint64_t remaining() const { return remaining_; }  // chunks, saturating
  Chunk next() {
    Chunk c{file_, at_, std::min(chunk_, files_[file_].size - at_)};
    at_ += c.length;
    --remaining_;
    if (at_ == files_[file_].size) {
      ++file_;
      at_ = 0;
      skip_empty();
    }
    return c;
  }

 private:
  void skip_empty() {
    while (file_ < files_.size() && files_[file_].size == 0) ++file_;
  }
  const std::vector<DataFileRecord>& files_;
  const uint64_t chunk_;
  size_t file_ = 0;
  uint64_t at_ = 0;
  uint64_t remaining_ = 0;
};

// Writes in flight; written to by the writers' completion callbacks.
struct Pending {
  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  uint64_t count = 0;
  uint64_t bytes_done = 0;
  Status first;

  void add() {
    std::lock_guard lock(mu);
    ++count;
  }
  void done(Status st, uint64_t bytes) {
    {
      std::lock_guard lock(mu);
      if (st.ok()) bytes_done += bytes;
      else if (first.ok()) first = std::move(st);
      --count;
    }
    cv.notify_all();
  }
  void wait_idle() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return count == 0; });
  }
  // The same, calling tick(bytes_done) every 100 ms and at the end, until
  // it fails (it still waits); returns its first error.
  Status wait_idle(const std::function<Status(uint64_t)>& tick) {
    Status st;
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return count == 0; })) {
      if (!st.ok()) continue;
      const uint64_t b = bytes_done;
      lock.unlock();
      st = tick(b);
      lock.lock();
    }
    const uint64_t b = bytes_done;
    lock.unlock();
    return st.ok() ? tick(b) : st;
  }
  Status error() {
    std::lock_guard lock(mu);
    return first;
  }
  uint64_t bytes() {
    std::lock_guard lock(mu);
    return bytes_done;
  }
};

struct OutFile {
  std::unique_ptr<WritableObject> writer;
  bool finished = false;
};


// The executor's consumer: chunks planned lazily from the cursor (an index
// may declare files of any size; memory must not follow), each landing in a
// pool buffer, verified in file order and written at the same offset.
class StreamCopy : public ReadConsumer {
 public:
  StreamCopy(Storage& src, Storage& dst, const Index& index, const StreamPlan& plan, ChunkCursor& cursor,
             ChunkBuffers& buffers, Pending& pending, std::vector<FileVerifier> verifiers, uint64_t per_batch)
      : src_(src), dst_(dst), index_(index), plan_(plan), cursor_(cursor), buffers_(buffers), pending_(pending),
        verifiers_(std::move(verifiers)), out_(index.files.size()), per_batch_(per_batch) {}

  // Empty files have no chunks: created and finished up front.
  Status empty_files() {
    for (size_t f = 0; f < index_.files.size(); ++f)
      if (index_.files[f].size == 0) {
        CKPTIO_RETURN_IF_ERROR(create(f));
        CKPTIO_RETURN_IF_ERROR(finish(f));
      }
    return Status::OK();
  }

  // Two batches at a time. A batch holds at most per_batch reads, not only
  // per_batch chunks' bytes: every read takes a whole buffer, however short
  // (a small file, a file's tail), and a batch asking for more buffers than
  // the pool has waited forever for ones that only its own delivery frees.
  Result<bool> more(std::vector<ExecRead>* reads) override {
    for (uint64_t n = 0; n < 2 * per_batch_ && !cursor_.done(); ++n) {
      Chunk c = cursor_.next();
      chunks_.push_back(c);
      reads->push_back(ExecRead{static_cast<uint32_t>(c.file), c.offset, c.length});
      reads->back().ends_batch = chunks_.size() % per_batch_ == 0;
    }
    return !cursor_.done();
  }
  std::byte* destination(size_t i) override {
    chunks_[i].buf = buffers_.acquire(1).front();  // waits for a write to give one back
    return chunks_[i].buf;
  }
  Status landed(size_t i, const std::byte*) override {
    CKPTIO_RETURN_IF_ERROR(error_);
    return write(chunks_[i]);
  }
  void delivered(size_t, uint64_t) override {
    if (error_.ok()) error_ = write_error();
    if (error_.ok() && plan_.on_progress) error_ = plan_.on_progress(pending_.bytes());
  }
  Status failed(size_t, Status st) override {
    // The index lists the file: a missing one is damage, not "no such step".
    if (st.code() == Code::kNotFound) st = data_loss(st.message());
    return st.annotate("read " + plan_.what + " from " + src_.describe());
  }

  Status error() const { return error_; }
  Status write_error() { return pending_.error().annotate("write " + plan_.what + " to " + dst_.describe()); }
  uint64_t shards() const { return shards_; }
  void release_unwritten() {
    for (Chunk& c : chunks_)
      if (c.buf) buffers_.release(std::exchange(c.buf, nullptr));
  }
  void abort_unfinished() {
    for (OutFile& f : out_)
      if (f.writer && !f.finished) f.writer->abort();
  }

 private:
  Status mismatch(size_t file, const ShardCheck& s) const {
    const PrefixRecord& p = index_.prefixes[s.prefix];
    return data_loss("checksum mismatch in " + p.name + "/" + p.leaves[s.leaf].path + " shard " +
                     std::to_string(s.shard) + " (file " + index_.files[file].name + ") of " + plan_.what +
                     " at " + src_.describe() + "/" + plan_.src_keys[file]);
  }
  Status create(size_t f) {
    auto w = dst_.create(plan_.dst_keys[f], index_.files[f].size);
    if (!w.ok()) return w.status().annotate("create " + dst_.describe() + "/" + plan_.dst_keys[f]);
    out_[f].writer = std::move(w).value();
    const uint64_t gran = std::max<uint64_t>(out_[f].writer->granularity(), 1);
    const uint64_t align = std::max<uint64_t>(out_[f].writer->alignment(), 1);
    if (plan_.chunk % gran != 0 || plan_.chunk % align != 0)
      return internal_error("copy chunk " + std::to_string(plan_.chunk) + " is not a multiple of " +
                            dst_.describe() + "'s write granularity " + std::to_string(gran) +
                            " and alignment " + std::to_string(align));
    return Status::OK();
  }
  Status finish(size_t f) {
    if (const ShardCheck* bad = verifiers_[f].finish()) return mismatch(f, *bad);
    // Only this file's writes are in flight (files are written in order and
    // earlier ones are finished): let progress follow them, then fsync.
    if (plan_.on_progress) CKPTIO_RETURN_IF_ERROR(pending_.wait_idle(plan_.on_progress));  // (aborted after)
    Status st = out_[f].writer->finish(index_.files[f].size);
    out_[f].finished = true;  // finish() consumed the object, failed or not
    shards_ += verifiers_[f].verified();
    return st.annotate("make durable " + dst_.describe() + "/" + plan_.dst_keys[f]);
  }
  // Verifies a chunk that has landed and queues its write.
  Status write(Chunk& c) {
    if (!out_[c.file].writer) CKPTIO_RETURN_IF_ERROR(create(c.file));
    if (const ShardCheck* bad = verifiers_[c.file].feed(c.buf, c.offset, c.length)) return mismatch(c.file, *bad);
    WritableObject& w = *out_[c.file].writer;
    const uint64_t align = std::max<uint64_t>(w.alignment(), 1);
    const uint64_t padded = (c.length + align - 1) / align * align;  // <= chunk: chunk % align == 0
    if (padded > c.length) std::memset(c.buf + c.length, 0, padded - c.length);
    pending_.add();
    std::byte* buf = std::exchange(c.buf, nullptr);
    const uint64_t length = c.length;
    try {
      w.write_async(c.offset, std::span<const std::byte>(buf, padded),
                    [&buffers = buffers_, &pending = pending_, buf, length](Status st) {
                      buffers.release(buf);
                      pending.done(std::move(st), length);
                    });
    } catch (...) {  // std::bad_alloc: write_async accepted nothing (storage.h)
      const Status st = status_of_exception("queue a write of a copied chunk");
      buffers_.release(buf);
      pending_.done(status_or_out_of_memory([&] { return st; }), 0);
      return st;
    }
    if (c.offset + c.length == index_.files[c.file].size) return finish(c.file);
    return Status::OK();
  }

  Storage& src_;
  Storage& dst_;
  const Index& index_;
  const StreamPlan& plan_;
  ChunkCursor& cursor_;
  ChunkBuffers& buffers_;
  Pending& pending_;
  std::vector<FileVerifier> verifiers_;
  std::vector<OutFile> out_;
  const uint64_t per_batch_;  // reads (buffers) per batch
  std::vector<Chunk> chunks_;  // parallel to the executor's reads
  Status error_;
  uint64_t shards_ = 0;
};

}  // namespace

uint64_t copy_chunk_size(const Storage& dst, uint64_t requested) {
  const uint64_t unit = std::lcm(std::max<uint64_t>(dst.write_granularity(), 1), kAlign);
  const uint64_t want = requested ? requested : kDefaultChunk;
  // (Rounding up a size near 2^64 would wrap to 0: the largest multiple
  // instead, which no memory bound holds twice, so plan_buffers refuses it.)
  if (want > UINT64_MAX - (unit - 1)) return UINT64_MAX / unit * unit;
  return (want + unit - 1) / unit * unit;
}

Result<StreamResult> stream_data_files(Storage& src, Storage& dst, const Index& index,
                                       const StreamPlan& plan) {
  const size_t nfiles = index.files.size();
  const uint64_t nbuf = plan.chunk ? plan.max_memory / plan.chunk : 0;
  if (plan.src_keys.size() != nfiles || plan.dst_keys.size() != nfiles || plan.chunk == 0 ||
      plan.chunk % kAlign != 0 || nbuf < 2)
    return internal_error("stream_data_files: bad plan");

  // Shards by file.
  std::map<std::string, size_t> file_at;
  for (size_t i = 0; i < nfiles; ++i) file_at[index.files[i].name] = i;
  std::vector<FileVerifier> verifiers(nfiles);
  for (size_t p = 0; p < index.prefixes.size(); ++p)
    for (size_t l = 0; l < index.prefixes[p].leaves.size(); ++l) {
      const LeafRecord& leaf = index.prefixes[p].leaves[l];
      for (size_t s = 0; s < leaf.shards.size(); ++s) {
        const ShardRecord& r = leaf.shards[s];
        auto it = file_at.find(r.file);
        if (it == file_at.end()) return internal_error("shard names an unlisted file " + r.file);
        verifiers[it->second].add(ShardCheck{r.offset, r.offset + r.length, r.crc32c, 0, p, l, s});
      }
    }
  for (FileVerifier& v : verifiers) v.sort();

  ChunkCursor cursor(index.files, plan.chunk);
  // A quarter of the buffers per read batch: two batches reading, the rest
  // (at least half) carrying writes.
  const uint64_t per_batch = std::max<uint64_t>(1, nbuf / 4);
  const size_t capacity = static_cast<size_t>(std::min(nbuf, std::max<uint64_t>(cursor.remaining(), 1)));
  ChunkBuffers buffers(plan.chunk, capacity);
  Pending pending;
  StreamCopy copy(src, dst, index, plan, cursor, buffers, pending, std::move(verifiers), per_batch);

  Status st = copy.empty_files();
  if (st.ok()) {
    ReadExecutorLimits limits;
    limits.batch_bytes = per_batch * plan.chunk;
    limits.align = kAlign;
    std::vector<ExecRead> reads;
    st = execute_reads(src, plan.src_keys, &reads, copy, limits, "read " + plan.what + " from " + src.describe());
    if (st.ok()) st = copy.error();
  }
  // Leave nothing running that points into our buffers or our stack (the
  // executor has drained its reads).
  copy.release_unwritten();
  copy.abort_unfinished();
  pending.wait_idle();
  if (st.ok()) st = copy.write_error();
  if (!st.ok()) return st;
  if (plan.on_progress) CKPTIO_RETURN_IF_ERROR(plan.on_progress(pending.bytes()));
  StreamResult result;
  result.shards = copy.shards();
  for (const auto& f : index.files) result.bytes += f.size;  // all read: no overflow
  return result;
}

}  // namespace ckptio
