// The state of one EformerStepWriter, shared by its two files:
// eformer_writer.cc (start, chunks, the encoder and I/O threads) and
// eformer_commit.cc (the coverage check, the index, the directories'
// fsyncs, metadata.json published last, and discard).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "src/save/eformer_writer.h"
#include "src/layout/layout.h"
#include "src/layout/zarr/chunk_codec.h"
#include "src/layout/zarr/zarray.h"
#include "src/save/commit.h"
#include "src/util/allocate.h"

namespace ckptio::zarr {

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

struct EformerStepWriter::Impl {
  struct Array {
    std::string prefix, path, dir;  // dir: the array's directory under the step
    ZArray z;
    std::vector<bool> written;      // per chunk, C order over the grid
    uint64_t written_count = 0;
    std::string name() const { return prefix.empty() ? path : prefix + "/" + path; }
  };
  struct EncodeJob {
    std::string key;
    Buffer raw;         // the full chunk, padded (empty when borrowed)
    std::span<const std::byte> borrowed;  // the chunk in the caller's memory (write_box_borrowed)
    uint64_t bytes = 0; // the chunk's bytes (ZArray::chunk_bytes)
    uint64_t reserved = 0;  // of pending, as write_box reserved it
    std::span<const std::byte> input() const {
      return raw.size() ? std::span<const std::byte>(raw.data(), bytes) : borrowed;
    }
  };
  // A chunk ready to be written: `size` bytes at data.data(), padded with
  // zeros to the alignment; `held` bytes of memory counted in pending.
  struct Encoded {
    Buffer data;
    uint64_t size = 0;
    uint64_t held = 0;
  };
  struct IoJob {
    std::function<Status()> run;
    uint64_t reserved = 0;  // of pending, released when done
  };
  enum class State { kOpen, kCommitting, kCommitted, kAborted };

  Storage& storage;
  AttemptPaths paths;
  int64_t step;
  EformerWriteOptions options;
  std::string extra;  // metadata.json's extra members

  std::mutex mu;
  std::condition_variable encode_cv, io_cv, progress_cv;
  std::vector<Array> arrays;
  EformerArrayLayout layout{options.compressor, options.separator};  // (after options)
  std::deque<EncodeJob> encode_q;
  std::deque<IoJob> io_q;
  uint64_t pending = 0;      // bytes of chunk buffers held (queued, encoding, writing)
  // Chunk buffers done with, by size, handed out again (take_buffer): fresh
  // memory for every chunk cost a page fault per 4 KiB of the step, twice
  // (raw and encoded), and as much again to give it back. At most half of
  // options.max_pending_bytes is pooled: a quarter dropped buffers that the
  // next chunks then took fresh (cp of a cached 2 GiB step, 288-292k faults
  // against 210-261k with half; docs/benchmarks/history.md).
  std::multimap<uint64_t, Buffer> free_buffers;  // by size class (buffer_class)
  uint64_t pooled = 0;
  uint64_t outstanding = 0;  // jobs queued or running
  uint64_t borrowed = 0;     // jobs queued or encoding that read the caller's memory
  Status first_error;
  bool stopping = false;
  State state = State::kOpen;
  std::vector<std::thread> threads;

  Impl(Storage& s, AttemptPaths p, int64_t st, EformerWriteOptions o, std::string e)
      : storage(s), paths(std::move(p)), step(st), options(std::move(o)), extra(std::move(e)) {}

  std::string key_of(const std::string& rel) const { return paths.stage_dir + "/" + rel; }

  // Throws nothing (the I/O and encoder threads call it from their catch
  // blocks): a copy of `s` the system refuses memory for is a bare
  // kResourceExhausted.
  void fail(const Status& s) noexcept {
    std::lock_guard lock(mu);
    if (first_error.ok()) first_error = status_or_out_of_memory([&] { return s; });
    progress_cv.notify_all();
  }
  Status error() {
    std::lock_guard lock(mu);
    return first_error;
  }
  // One job done: its reservation released.
  void job_done(uint64_t reserved) {
    std::lock_guard lock(mu);
    pending -= reserved;
    --outstanding;
    progress_cv.notify_all();
  }
  void push_io(std::function<Status()> run, uint64_t reserved, bool counted) {
    std::lock_guard lock(mu);
    io_q.push_back(IoJob{std::move(run), reserved});
    if (!counted) ++outstanding;  // after what may throw
    io_cv.notify_one();
  }
  void drain() {
    std::unique_lock lock(mu);
    progress_cv.wait(lock, [&] { return outstanding == 0; });
  }
  // An encode job is done with its input (encoded, or dropped after an error).
  void input_done(const EncodeJob& job) {
    if (job.borrowed.empty()) return;
    std::lock_guard lock(mu);
    --borrowed;
    progress_cv.notify_all();
  }

  // An aligned buffer for `size` bytes of a chunk of `chunk_bytes` (raw or
  // encoded; zeros from `size` to the next multiple of the alignment), from
  // the pool when one of its size class is there.
  Result<Buffer> take_buffer(uint64_t chunk_bytes, uint64_t size);
  // `b` back to the pool (mu held), unless the pool would hold too much.
  void give_back_locked(Buffer b);

  Status start_threads();  // kResourceExhausted when no thread of a kind can be had
  void stop_threads();
  struct Owed;  // what an encode job owes as it ends (eformer_writer.cc)
  void encoder_loop();
  Result<Encoded> encode(ChunkEncoder& encoder, const EncodeJob& job);
  void io_loop();
  Status write_object(const std::string& key, const Buffer& data, uint64_t size);
  Status reserve(uint64_t n);
  Status check_coverage();
  Status write_index();
  Status sync_dirs();
  Result<std::string> metadata_text() const;
  Status publish(const std::string& metadata, bool* keep);
  Status publish_object_store(const std::string& metadata, bool* keep);
  void discard() noexcept;
};

}  // namespace ckptio::zarr
