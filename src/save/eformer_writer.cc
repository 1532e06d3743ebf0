// Writing one step in eformer's layout (contract in eformer_writer.h).
#include "src/save/eformer_writer.h"
#include "src/save/eformer_writer_impl.h"

#include <pthread.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "src/layout/layout.h"
#include "src/util/allocate.h"
#include "src/layout/zarr/chunk_codec.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_index.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/save/commit.h"
#include "src/util/box_runs.h"
#include "src/util/json_free.h"
#include "src/util/log.h"

namespace ckptio::zarr {
namespace {

using Json = nlohmann::ordered_json;

// Chunk buffers are aligned and padded for O_DIRECT writes (local backend).
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kDefaultIoThreads = 16;
// A grid larger than this is refused (the writer keeps one bit per chunk).
constexpr uint64_t kMaxChunksPerArray = 1ull << 32;

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// The size of the buffers that hold a chunk of `chunk_bytes`, raw or encoded
// (zstd's bound on an incompressible chunk: the size + 1/256 + a little), so
// that one freed by either fits the next of both.
uint64_t buffer_class(uint64_t chunk_bytes) {
  return round_up(chunk_bytes + chunk_bytes / 128 + 4096, kAlign);
}

// metadata.json's extra members (", \"key\": value" each, Python's separators
// at the top level), from a JSON object; kInvalidArgument otherwise.
Result<std::string> extra_members(const std::string& text) {
  Json j;
  JsonFreer free_j(j);
  try {
    parse_json_into(j, text);
  } catch (const Json::parse_error&) {
    j = Json(Json::value_t::discarded);
  }
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("extra_metadata_json is not a JSON object: " + text.substr(0, 80));
  std::string out;
  for (const auto& [key, value] : j.items()) {
    if (key == "step" || key == "timestamp" || key == "is_temporary")
      return invalid_argument("extra_metadata_json sets \"" + key + "\", which the writer writes");
    out += ", " + Json(key).dump(-1, ' ', true) + ": " + value.dump(-1, ' ', true);
  }
  return out;
}

// The C-order bytes of chunk `idx` (its full box, zeros past the shape) out
// of `bytes`, which hold `box` (a box containing the chunk's valid box).
Status copy_chunk(const ZArray& z, const Box& box, std::span<const std::byte> bytes,
                  std::span<const uint64_t> idx, std::byte* dst) {
  const size_t item = dtype_size(z.dtype);
  if (z.shape.empty()) {
    std::memcpy(dst, bytes.data(), item);
    return Status::OK();
  }
  const Box full = chunk_box(z, idx);
  const Box valid = chunk_valid_box(z, idx);
  if (box == full) {
    std::memcpy(dst, bytes.data(), z.chunk_bytes);
    return Status::OK();
  }
  if (!(valid == full)) std::memset(dst, 0, z.chunk_bytes);
  CKPTIO_ASSIGN_OR_RETURN(RunLayout layout, run_layout(box, 0, valid, full, item));
  for_each_run(layout, [&](uint64_t src, uint64_t to, uint64_t n) { std::memcpy(dst + to, bytes.data() + src, n); });
  return Status::OK();
}

// Chunk `idx` as one contiguous run of `bytes` (which hold `box`), when it
// is one: a chunk inside the shape whose rows are whole rows of the box (a
// device shard written as its own box, a row band of a leaf written whole).
// Empty otherwise.
std::span<const std::byte> contiguous_chunk(const ZArray& z, const Box& box, std::span<const std::byte> bytes,
                                            std::span<const uint64_t> idx) {
  if (z.shape.empty() || z.chunk_bytes == 0) return {};
  const Box full = chunk_box(z, idx);
  if (!(chunk_valid_box(z, idx) == full)) return {};
  auto layout = run_layout(box, 0, full, full, dtype_size(z.dtype));
  if (!layout.ok() || layout->num_runs() != 1 || layout->run_bytes != z.chunk_bytes) return {};
  const uint64_t at = layout->src_base;
  if (at > bytes.size() || bytes.size() - at < z.chunk_bytes) return {};
  return bytes.subspan(at, z.chunk_bytes);
}

// kInvalidArgument unless `box` is a union of whole chunks of `z`'s grid
// (clipped to the shape) and `size` its byte count.
Status check_box(const ZArray& z, const std::string& name, const Box& box, uint64_t size) {
  auto bad = [&](const std::string& why) { return invalid_argument("array " + name + ": box " + why); };
  if (box.start.size() != z.shape.size() || box.stop.size() != z.shape.size())
    return bad("has rank " + std::to_string(box.start.size()) + ", the array " + std::to_string(z.shape.size()));
  // An empty box (a shard of a zero-size leaf) is a no-op wherever it lies
  // inside the shape: it names no chunk.
  bool empty = false;
  for (size_t d = 0; d < z.shape.size(); ++d) empty = empty || box.start[d] == box.stop[d];
  uint64_t elements = 1;
  for (size_t d = 0; d < z.shape.size(); ++d) {
    const int64_t a = box.start[d], b = box.stop[d], n = z.shape[d], c = z.chunks[d];
    if (a < 0 || a > b || b > n)
      return bad("[" + std::to_string(a) + ", " + std::to_string(b) + ") in dimension " + std::to_string(d) +
                 " is not inside the shape (" + std::to_string(n) + ")");
    if (!empty && (a % c != 0 || (b % c != 0 && b != n)))
      return bad("[" + std::to_string(a) + ", " + std::to_string(b) + ") in dimension " + std::to_string(d) +
                 " does not fall on chunk boundaries (chunks of " + std::to_string(c) + ")");
    elements *= static_cast<uint64_t>(b - a);
  }
  if (size != elements * dtype_size(z.dtype))
    return bad("holds " + std::to_string(elements * dtype_size(z.dtype)) + " bytes, given " + std::to_string(size));
  return Status::OK();
}

}  // namespace

std::string python_isoformat_local(int64_t unix_ns) {
  const time_t secs = static_cast<time_t>(unix_ns / 1'000'000'000);
  const long micros = static_cast<long>((unix_ns % 1'000'000'000) / 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[48];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  if (micros != 0) std::snprintf(buf + n, sizeof buf - n, ".%06ld", micros);
  return buf;
}

// ---- Buffers ------------------------------------------------------------------

Result<Buffer> EformerStepWriter::Impl::take_buffer(uint64_t chunk_bytes, uint64_t size) {
  const uint64_t cls = buffer_class(chunk_bytes);
  Buffer b;
  if (size <= cls) {
    std::lock_guard lock(mu);
    auto it = free_buffers.find(cls);
    if (it != free_buffers.end()) {
      b = std::move(it->second);
      pooled -= cls;
      free_buffers.erase(it);
    }
  }
  if (b.size() == 0) {
    CKPTIO_ASSIGN_OR_RETURN(b, allocate_or_status(std::max(cls, round_up(size, kAlign)), kAlign, "a chunk buffer"));
  }
  std::memset(b.data() + size, 0, round_up(std::max<uint64_t>(size, 1), kAlign) - size);
  return b;
}

void EformerStepWriter::Impl::give_back_locked(Buffer b) {
  const uint64_t n = b.size(), cap = options.max_pending_bytes / 2;
  if (n == 0 || n > cap) return;
  // Full: buffers of other sizes make room (chunk sizes change from array to
  // array, and the pool follows the ones being written now).
  while (pooled + n > cap) {
    auto other = std::prev(free_buffers.end());
    if (other->first == n) other = free_buffers.begin();
    if (other->first == n) return;  // all of this size already
    pooled -= other->first;
    free_buffers.erase(other);
  }
  pooled += n;
  free_buffers.emplace(n, std::move(b));
}

// ---- Threads ------------------------------------------------------------------

// A process at its thread or memory limit may refuse some: the writer goes
// on with those it got, one of each kind at least.
Status EformerStepWriter::Impl::start_threads() {
  const unsigned enc = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const unsigned io = options.io_threads ? options.io_threads : kDefaultIoThreads;
  auto start = [&](unsigned n, void (Impl::*loop)()) {
    unsigned got = 0;
    try {
      threads.reserve(threads.size() + n);
      for (; got < n; ++got) threads.emplace_back([this, loop] { (this->*loop)(); });
    } catch (const std::exception&) {  // std::system_error (EAGAIN), std::bad_alloc
    }
    if (got < n && got > 0) logging::warn("ckptio: the eformer writer got {} of {} threads", got, n);
    return got;
  };
  if (start(enc, &Impl::encoder_loop) == 0 || start(io, &Impl::io_loop) == 0) {
    stop_threads();
    return Status(Code::kResourceExhausted, "eformer writer: the system refused a thread");
  }
  return Status::OK();
}

void EformerStepWriter::Impl::stop_threads() {
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  encode_cv.notify_all();
  io_cv.notify_all();
  for (std::thread& t : threads) t.join();
  threads.clear();
}

// What a job owes as it ends: its input (a borrowed one, counted in
// `borrowed`) and its place in `outstanding` with the bytes it holds, unless
// it was handed on to the I/O threads. Paid on every way out, an exception's
// too (std::bad_alloc), so that drain() and wait_borrowed() never wait for a
// job that is gone.
struct EformerStepWriter::Impl::Owed {
  Impl& s;
  const EncodeJob& job;
  bool input = true, outstanding = true;
  uint64_t held;
  void input_done() {
    if (std::exchange(input, false)) s.input_done(job);
  }
  ~Owed() {
    input_done();
    if (outstanding) s.job_done(held);
  }
};

void EformerStepWriter::Impl::encoder_loop() {
  // Named for top -H, gdb and perf, and for the allocation sweeps (tests/alloc/).
  pthread_setname_np(pthread_self(), "ckptio-encode");
  std::optional<ChunkEncoder> encoder;  // made by the first job (what it throws fails that job)
  for (;;) {
    EncodeJob job;
    {
      std::unique_lock lock(mu);
      encode_cv.wait(lock, [&] { return stopping || !encode_q.empty(); });
      if (encode_q.empty()) return;
      job = std::move(encode_q.front());
      encode_q.pop_front();
    }
    Owed owed{*this, job, true, true, job.reserved};
    try {
      if (!error().ok()) continue;
      if (!encoder) encoder.emplace();
      Result<Encoded> e = encode(*encoder, job);
      owed.input_done();
      if (!e.ok()) {
        fail(e.status().annotate("encode " + storage.describe() + "/" + job.key));
        continue;
      }
      {
        std::lock_guard lock(mu);
        pending = pending - job.reserved + e->held;
        owed.held = e->held;
        if (job.raw.size() && job.raw.data() != e->data.data()) give_back_locked(std::move(job.raw));
        progress_cv.notify_all();
      }
      push_io(
          [this, key = std::move(job.key), e = *e] {
            Status st = write_object(key, e.data, e.size);
            if (st.ok()) {  // written and done with: the next chunk's
              std::lock_guard lock(mu);
              give_back_locked(e.data);
            }
            return st;
          },
          e->held, /*counted=*/true);
      owed.outstanding = false;  // the I/O job's now
    } catch (...) {
      fail(status_of_exception("encode a chunk"));
    }
  }
}

// The bytes to write for one chunk: the raw buffer itself when nothing is
// compressed (it is aligned and padded), else encoded straight into an
// aligned, zero-padded buffer of the pool (its size class holds zstd's bound),
// which O_DIRECT and object stores both write from; no copy on either side.
Result<EformerStepWriter::Impl::Encoded> EformerStepWriter::Impl::encode(ChunkEncoder& encoder, const EncodeJob& job) {
  if (options.compressor.id == CodecId::kNone && job.raw.size()) return Encoded{job.raw, job.bytes, job.raw.size()};
  CKPTIO_ASSIGN_OR_RETURN(const size_t bound, encoded_bound(options.compressor, job.bytes));
  Encoded e;
  CKPTIO_ASSIGN_OR_RETURN(e.data, take_buffer(job.bytes, bound));
  CKPTIO_ASSIGN_OR_RETURN(e.size, encoder.encode_into(options.compressor, job.input(), {e.data.data(), e.data.size()}));
  std::memset(e.data.data() + e.size, 0, round_up(std::max<uint64_t>(e.size, 1), kAlign) - e.size);
  e.held = e.data.size();
  return e;
}

void EformerStepWriter::Impl::io_loop() {
  pthread_setname_np(pthread_self(), "ckptio-zarr-io");
  for (;;) {
    IoJob job;
    {
      std::unique_lock lock(mu);
      io_cv.wait(lock, [&] { return stopping || !io_q.empty(); });
      if (io_q.empty()) return;
      job = std::move(io_q.front());
      io_q.pop_front();
    }
    try {
      if (error().ok()) {
        Status st = job.run();
        if (!st.ok()) fail(st);
      }
    } catch (...) {  // (the chunk's object, if made, was aborted as it unwound)
      fail(status_of_exception("write a chunk"));
    }
    job.run = nullptr;  // frees the chunk's buffer before the reservation is released
    job_done(job.reserved);
  }
}

// One chunk object: created, written in one range, made durable.
Status EformerStepWriter::Impl::write_object(const std::string& key, const Buffer& data, uint64_t size) {
  const std::string where = "write " + storage.describe() + "/" + key;
  auto created = storage.create_new(key, size);
  if (!created.ok()) return created.status().annotate(where);
  std::unique_ptr<WritableObject> obj = std::move(*created);
  const uint64_t len = round_up(size, std::max<uint64_t>(obj->alignment(), 1));
  Buffer src = data;
  if (len > src.size()) {  // an alignment above kAlign: pad a copy
    CKPTIO_ASSIGN_OR_RETURN(src, allocate_or_status(len, kAlign, "a padded copy of a chunk"));
    std::memset(src.data(), 0, len);
    std::memcpy(src.data(), data.data(), size);
  }
  struct Done {
    std::mutex mu;
    Status st;
  };
  auto done = std::make_shared<Done>();
  obj->write_async(0, std::span<const std::byte>(src.data(), len), [done](Status s) {
    std::lock_guard lock(done->mu);
    done->st = std::move(s);
  });
  Status fin = obj->finish(size);
  Status wrote;
  {
    std::lock_guard lock(done->mu);
    wrote = done->st;
  }
  if (!wrote.ok()) return wrote.annotate(where);
  return fin.ok() ? fin : fin.annotate(where);
}

// Waits until `n` more bytes fit the budget (or nothing is held), then takes them.
Status EformerStepWriter::Impl::reserve(uint64_t n) {
  std::unique_lock lock(mu);
  progress_cv.wait(lock, [&] {
    return !first_error.ok() || pending == 0 || pending + n <= options.max_pending_bytes;
  });
  if (!first_error.ok()) return first_error;
  pending += n;
  return Status::OK();
}

// ---- Public -------------------------------------------------------------------

EformerStepWriter::EformerStepWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EformerStepWriter::~EformerStepWriter() {
  if (!impl_) return;
  abort();
  impl_->stop_threads();
}

const std::string& EformerStepWriter::stage_dir() const { return impl_->paths.stage_dir; }

Result<std::unique_ptr<EformerStepWriter>> EformerStepWriter::start(Storage& storage, std::string final_dir,
                                                                    int64_t step, EformerWriteOptions options) {
  CKPTIO_RETURN_IF_ERROR(check_storage_key(final_dir));
  if (options.separator != '.' && options.separator != '/')
    return invalid_argument(std::string("dimension separator '") + options.separator + "': '.' or '/'");
  if (options.compressor.id != CodecId::kZstd && options.compressor.id != CodecId::kNone)
    return Status(Code::kUnimplemented, "eformer writer: chunks are encoded with zstd or none only");
  CKPTIO_ASSIGN_OR_RETURN(std::string extra, extra_members(options.extra_metadata_json));
  AttemptPaths paths = options.attempt.empty() ? plan_attempt(storage, final_dir)
                                                : plan_attempt(storage, final_dir, options.attempt);
  CKPTIO_ASSIGN_OR_RETURN(ListResult there, storage.list(final_dir + "/", true));
  const bool exists = !there.objects.empty() || !there.prefixes.empty();
  if (exists && !options.overwrite) {
    // On an object store, a step eformer's writer began and never finished
    // (a killed save: no metadata.json, nothing but the layout's objects) is
    // no step to any reader, and would refuse this step for good (a
    // preempted job that resumes reaches the same step again): removed.
    // Two writers of one step at once are refused by the manager here;
    // across processes the layout has no way to tell them apart.
    bool unfinished = false;
    if (!paths.renames) {
      CKPTIO_ASSIGN_OR_RETURN(ListResult all, storage.list(final_dir + "/", false));
      unfinished = is_unfinished_eformer_step(final_dir, all.objects);
    }
    if (!unfinished) {
      // No commit marker there: other leftovers (a ckptio save or copy of
      // the step that did not finish), which `ls` does not show as a step.
      bool committed = false;
      for (const ListEntry& e : there.objects)
        committed |= e.key == final_dir + "/" + std::string(kEformerMetadataName) || e.key == index_key(final_dir);
      return Status(Code::kAlreadyExists,
                    storage.describe() + "/" + final_dir +
                        (committed ? " already exists (overwrite not set)"
                                   : " holds objects but no committed step (leftovers of a save or copy that did "
                                     "not finish: gc removes them once older than its minimum age; or set "
                                     "overwrite)"));
    }
    logging::warn("ckptio: {}/{} holds a step a save began and never finished (no metadata.json): removing it",
                  storage.describe(), final_dir);
    CKPTIO_RETURN_IF_ERROR(storage.remove_prefix(final_dir + "/"));
  }
  if (exists && !paths.renames) {
    // No atomic replacement on an object store: the old step stops being
    // one first (its commit markers go), then its objects.
    CKPTIO_RETURN_IF_ERROR(storage.remove(final_dir + "/" + std::string(kEformerMetadataName)));
    CKPTIO_RETURN_IF_ERROR(storage.remove(index_key(final_dir)));
    CKPTIO_RETURN_IF_ERROR(storage.remove_prefix(final_dir + "/"));
  }
  // The writer first, its threads then: on every way out from here (a
  // refused thread, an exception) its destructor stops them.
  std::unique_ptr<EformerStepWriter> writer(new EformerStepWriter(
      std::make_unique<Impl>(storage, std::move(paths), step, std::move(options), std::move(extra))));
  CKPTIO_RETURN_IF_ERROR(writer->impl_->start_threads());
  return writer;
}

Result<EformerArrayLayout::Array> EformerArrayLayout::add(const std::string& prefix, const std::string& path,
                                                          DType dtype, Shape shape, Shape chunks) {
  const std::string name = prefix.empty() ? path : prefix + "/" + path;
  if (path.empty() || path.find('/') != std::string::npos || prefix.find('/') != std::string::npos)
    return invalid_argument("array " + name + ": prefix and path are dotted key paths (no '/'; path not empty)");
  auto z = make_zarray(std::move(shape), std::move(chunks), dtype, compressor_, separator_);
  if (!z.ok()) return z.status().annotate("array " + name);
  if (z->num_chunks > kMaxChunksPerArray)
    return invalid_argument("array " + name + ": " + std::to_string(z->num_chunks) + " chunks (at most 2^32)");
  auto dir = array_dir_of_key_path(prefix.empty() ? path : prefix + "." + path);
  if (!dir.ok()) return invalid_argument("array " + name + ": " + dir.status().message());
  // No array's directory may equal or lie inside another's. (Those inside
  // start with dir + "/"; in byte order names such as "a/b-c" sort between
  // "a/b" and them, so the range is looked up from dir + "/", not dir.)
  auto clash = names_by_dir_.find(*dir);
  if (clash == names_by_dir_.end()) {
    clash = names_by_dir_.lower_bound(*dir + "/");
    if (clash != names_by_dir_.end() && !clash->first.starts_with(*dir + "/")) clash = names_by_dir_.end();
  }
  if (clash != names_by_dir_.end())
    return invalid_argument("array " + name + ": its directory " + *dir + " holds array " + clash->second + "'s");
  for (std::string up = parent_of(*dir); !up.empty(); up = parent_of(up))
    if (auto it = names_by_dir_.find(up); it != names_by_dir_.end())
      return invalid_argument("array " + name + ": its directory " + *dir + " lies inside array " + it->second +
                              "'s");
  names_by_dir_.emplace(*dir, name);
  return Array{std::move(*z), std::move(*dir)};
}

Result<size_t> EformerStepWriter::add_array(const std::string& prefix, const std::string& path, DType dtype,
                                            Shape shape, Shape chunks) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (s.state != Impl::State::kOpen) return Status(Code::kFailedPrecondition, "add_array after commit or abort");
  CKPTIO_ASSIGN_OR_RETURN(EformerArrayLayout::Array laid, s.layout.add(prefix, path, dtype, std::move(shape),
                                                                        std::move(chunks)));
  // (A throw from here on leaves the leaf's directory taken and no array:
  // the caller's save fails on the exception anyway.)
  const size_t id = s.arrays.size();
  Impl::Array a{prefix, path, std::move(laid.dir), std::move(laid.z), {}, 0};
  a.written.assign(a.z.num_chunks, false);
  const std::string key = s.key_of(a.dir + "/.zarray");
  const std::string text = serialize_zarray(a.z);
  Impl::IoJob put{[&s, key, text] {
                    return s.storage.put(key, as_bytes(text)).annotate("write " + s.storage.describe() + "/" + key);
                  },
                  0};
  s.arrays.push_back(std::move(a));
  s.io_q.push_back(std::move(put));
  ++s.outstanding;  // after what may throw: drain() waits for queued jobs only
  s.io_cv.notify_one();
  return id;
}

Status EformerStepWriter::write_box(size_t id, const Box& box, std::span<const std::byte> bytes) {
  return write_chunks(id, box, bytes, /*borrow=*/false);
}

Status EformerStepWriter::write_box_borrowed(size_t id, const Box& box, std::span<const std::byte> bytes) {
  return write_chunks(id, box, bytes, /*borrow=*/true);
}

void EformerStepWriter::wait_borrowed() {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  s.progress_cv.wait(lock, [&] { return s.borrowed == 0; });
}

Status EformerStepWriter::write_chunks(size_t id, const Box& box, std::span<const std::byte> bytes, bool borrow) {
  Impl& s = *impl_;
  ZArray z;  // a copy: add_array may move the arrays meanwhile
  std::string name, dir;
  std::vector<std::vector<uint64_t>> chunks;
  {
    std::lock_guard lock(s.mu);
    if (s.state != Impl::State::kOpen) return Status(Code::kFailedPrecondition, "write_box after commit or abort");
    if (!s.first_error.ok()) return s.first_error;
    if (id >= s.arrays.size()) return invalid_argument("write_box: no array " + std::to_string(id));
    Impl::Array& a = s.arrays[id];
    name = a.name();
    CKPTIO_RETURN_IF_ERROR(check_box(a.z, name, box, bytes.size()));
    CKPTIO_ASSIGN_OR_RETURN(ChunkRange range, chunks_overlapping(a.z, box));
    std::vector<uint64_t> flats;
    for_each_chunk(range, [&](std::span<const uint64_t> idx) {
      uint64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat = flat * a.z.grid[d] + idx[d];
      flats.push_back(flat);
      chunks.emplace_back(idx.begin(), idx.end());
    });
    for (size_t i = 0; i < flats.size(); ++i)
      if (a.written[flats[i]])
        return invalid_argument("array " + name + ": chunk " + chunk_key(a.z, chunks[i]) + " was written already");
    z = a.z;  // (what may throw first: the chunks are then not marked)
    dir = a.dir;
    for (uint64_t f : flats) a.written[f] = true;
    a.written_count += flats.size();
  }
  // The box's chunks are marked written: whatever stops this before all are
  // queued fails the writer, so that commit() cannot pass without them.
  Status queued;
  try {
    queued = [&]() -> Status {
      const uint64_t reserved = buffer_class(z.chunk_bytes);
      for (const auto& idx : chunks) {
        Impl::EncodeJob job;
        job.key = s.key_of(dir + "/" + chunk_key(z, idx));
        job.bytes = z.chunk_bytes;
        job.reserved = reserved;
        // Borrowed: encoded from the caller's memory (no copy); but a chunk that
        // is not one run of it, or is stored raw (its buffer is written as is),
        // is copied.
        if (borrow && s.options.compressor.id != CodecId::kNone) job.borrowed = contiguous_chunk(z, box, bytes, idx);
        CKPTIO_RETURN_IF_ERROR(s.reserve(reserved));
        // Until the job is queued, the reservation is this call's to give back
        // (on an error, or as an exception unwinds).
        auto unreserve = [&] {
          std::lock_guard lock(s.mu);
          s.pending -= reserved;
          s.progress_cv.notify_all();
        };
        Status copied;
        try {
          if (job.borrowed.empty()) {
            Result<Buffer> raw = s.take_buffer(z.chunk_bytes, z.chunk_bytes);
            copied = raw.status();
            if (raw.ok()) {
              job.raw = std::move(raw).value();
              copied = copy_chunk(z, box, bytes, idx, job.raw.data());
            }
          }
          if (copied.ok()) {
            std::lock_guard lock(s.mu);
            const bool borrowed = !job.borrowed.empty();
            s.encode_q.push_back(std::move(job));
            ++s.outstanding;  // after what may throw: drain() waits for queued jobs only
            if (borrowed) ++s.borrowed;
            s.encode_cv.notify_one();
            continue;
          }
        } catch (...) {
          unreserve();
          throw;
        }
        unreserve();
        return copied.annotate("array " + name);
      }
      return Status::OK();
    }();
  } catch (...) {
    s.fail(status_of_exception("array " + name));
    throw;
  }
  if (!queued.ok()) s.fail(queued);
  return queued;
}

Status EformerStepWriter::flush() {
  impl_->drain();
  return impl_->error();
}

Status EformerStepWriter::commit() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.state != Impl::State::kOpen) return Status(Code::kFailedPrecondition, "commit after commit or abort");
    s.state = Impl::State::kCommitting;
  }
  s.drain();
  bool keep = false, publishing = false;
  Status st;
  try {
    st = s.error();
    if (st.ok()) st = s.check_coverage();
    if (st.ok()) st = s.write_index();
    if (st.ok() && s.paths.renames) st = s.sync_dirs();
    if (st.ok()) {
      auto metadata = s.metadata_text();
      publishing = metadata.ok();
      st = metadata.ok() ? s.publish(*metadata, &keep) : metadata.status();
    }
  } catch (...) {  // std::bad_alloc
    st = status_of_exception("commit");
    // Once publishing began the step may be committed. On POSIX its
    // directory was renamed whole or not at all (the discard removes only
    // the staging directory). An object store's is committed if its
    // metadata.json is there: kept unless it is surely not (gc leaves an
    // eformer step's objects alone, complete or not).
    if (publishing && !s.paths.renames) {
      keep = true;
      try {
        keep = s.storage.stat(s.paths.final_dir + "/" + std::string(kEformerMetadataName)).status().code() !=
               Code::kNotFound;
      } catch (...) {
      }
    }
  }
  if (st.ok()) {
    std::lock_guard lock(s.mu);
    s.state = Impl::State::kCommitted;
    return st;
  }
  if (!keep) s.discard();
  std::lock_guard lock(s.mu);
  s.state = Impl::State::kAborted;
  return st;
}

void EformerStepWriter::abort() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.state == Impl::State::kCommitted || s.state == Impl::State::kAborted) return;
    s.state = Impl::State::kAborted;
  }
  s.discard();
}

}  // namespace ckptio::zarr
