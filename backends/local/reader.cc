#include "backends/local/reader.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/local/fs.h"
#include "backends/local/keys.h"
#include "backends/local/read_plan.h"
#include "src/util/allocate.h"

namespace ckptio::local {

namespace {

constexpr uint64_t kDirectAlign = 4096;

struct OpenFile {
  std::string path;
  UniqueFd fd;
  uint64_t size = 0;
  bool direct = false;
};

// Requests for fewer bytes of a file than this never ask whether the page
// cache holds them (an eformer step's chunk files are read one at a time).
constexpr uint64_t kCachedCheckMin = 1ull << 20;

// True when the page cache holds at least 90% of the pages of the mapping
// [p, p + len) (p page-aligned).
bool mapping_cached(void* p, size_t len, uint64_t page) {
  std::vector<unsigned char> in((len + page - 1) / page);
  if (::mincore(p, len, in.data()) != 0) return false;
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * 10 >= in.size() * 9;
}

// True when the page cache holds at least 90% of bytes [lo, hi) of the file
// (mincore over a read-only mapping of them; false if it cannot be mapped).
bool mostly_cached(int fd, uint64_t lo, uint64_t hi) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  hi = std::min<uint64_t>(hi, static_cast<uint64_t>(st.st_size));
  const uint64_t start = lo / page * page;
  if (hi <= start) return false;
  const size_t len = hi - start;
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) return false;
  const bool cached = mapping_cached(p, len, page);
  ::munmap(p, len);
  return cached;
}

// A whole file mapped read-only (view_cached_file).
class MappedFile final : public ObjectView {
 public:
  MappedFile(void* p, size_t n) : p_(p), n_(n) {}
  ~MappedFile() override { ::munmap(p_, n_); }
  std::span<const std::byte> bytes() const override { return {static_cast<const std::byte*>(p_), n_}; }

 private:
  void* const p_;
  const size_t n_;
};

// Opens `key` beneath `root`, never through a symbolic link (open_beneath).
// With want_direct, O_DIRECT unless direct_io is auto and the page cache
// already holds the bytes [lo, hi) this call reads: a direct read would
// fetch them from the device again (and write dirty ones back first), so
// such a file is read through the cache (a step just written by a buffered
// writer such as TensorStore's, a source cp has just read).
Status open_for_read(const std::string& root, const std::string& key, bool want_direct, DirectIo direct_io,
                     uint64_t lo, uint64_t hi, OpenFile& f) {
  const std::string path = join_path(root, key);
  f.path = path;
  if (want_direct && direct_io == DirectIo::kAuto && hi > lo && hi - lo >= kCachedCheckMin) {
    auto fd = open_beneath(root, key, O_RDONLY);
    if (!fd.ok()) return fd.status();
    if (mostly_cached(fd->get(), lo, hi)) {
      f.fd = std::move(fd).value();
      want_direct = false;
    }
  }
  if (want_direct) {
    int err = 0;
    auto fd = open_beneath(root, key, O_RDONLY | O_DIRECT, &err);
    f.direct = fd.ok();
    if (fd.ok()) {
      f.fd = std::move(fd).value();
    } else if (err != EINVAL) {
      return fd.status();
    } else if (direct_io == DirectIo::kOn) {
      return Status(Code::kUnimplemented, "open " + path + ": the file system refuses O_DIRECT (direct_io=on)");
    }
  }
  if (!f.fd.valid()) {
    auto fd = open_beneath(root, key, O_RDONLY);
    if (!fd.ok()) return fd.status();
    f.fd = std::move(fd).value();
  }
  struct stat st;
  if (::fstat(f.fd.get(), &st) != 0) return Status::from_errno(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return Status::from_errno(EISDIR, "read " + path);
  f.size = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using Scratch = std::unique_ptr<std::byte, AlignedFree>;

Status read_through_ring(std::span<const ReadRequest> requests, const std::vector<OpenFile*>& files,
                         const ReadSettings& s, Ring& ring) {
  const uint64_t max_direct = std::max<uint64_t>(s.request_size, kDirectAlign);
  const uint64_t max_bounce = std::min<uint64_t>(max_direct, 4ull << 20);
  std::vector<ReadPiece> pieces;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    const uint64_t align = files[i]->direct ? kDirectAlign : 1;
    plan_read(static_cast<uint32_t>(i), r.offset, r.length, reinterpret_cast<uintptr_t>(r.dst), align,
              max_direct, max_bounce, pieces);
  }
  // Scratch buffers are as large as the largest bounced piece of this call
  // (one block for the head/tail of congruent requests).
  uint64_t scratch_size = 0;
  for (const ReadPiece& p : pieces)
    if (p.bounce) scratch_size = std::max(scratch_size, p.length);
  const size_t bounce_cap = std::max<uint64_t>(2, s.bounce_budget / std::max<uint64_t>(scratch_size, 1));

  // The completion callback runs on the ring's thread and must not throw:
  // `done` (and `batch`, swapped with it) hold room for every read in flight.
  struct Completions {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<size_t, RingResult>> done;
  } completions;
  completions.done.reserve(ring.queue_depth());
  std::vector<Scratch> scratch_owned;   // every scratch buffer this call allocated
  std::vector<std::byte*> scratch_free;
  std::vector<std::byte*> scratch_of(pieces.size(), nullptr);
  size_t next = 0, in_flight = 0, bounce_in_flight = 0;
  Status first;
  std::vector<std::pair<size_t, RingResult>> batch;
  batch.reserve(ring.queue_depth());
  size_t handled = 0;  // of `batch`
  auto wait_batch = [&] {
    std::unique_lock lock(completions.mu);
    completions.cv.wait(lock, [&] { return !completions.done.empty(); });
    batch.swap(completions.done);
  };
  // What the loop throws (std::bad_alloc) ends it; the reads in flight are
  // waited for before this frame, which their callbacks use, unwinds.
  try {
    while (true) {
      while (first.ok() && next < pieces.size() && in_flight < ring.queue_depth()) {
        const ReadPiece& p = pieces[next];
        std::byte* buf = nullptr;
        if (p.bounce) {
          if (bounce_in_flight >= bounce_cap) break;
          if (scratch_free.empty()) {
            auto* mem = static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, scratch_size));
            if (!mem) {
              first = out_of_memory("read: a scratch buffer of " + std::to_string(scratch_size) + " bytes");
              break;
            }
            Scratch owned(mem);  // freed if the pushes throw
            scratch_owned.push_back(std::move(owned));
            scratch_free.push_back(mem);
          }
          buf = scratch_free.back();
          scratch_free.pop_back();
          scratch_of[next] = buf;
          ++bounce_in_flight;
        } else {
          buf = requests[p.request].dst + p.dst_offset;
        }
        RingOp op;
        op.kind = RingOp::Kind::kRead;
        op.fd = files[p.request]->fd.get();
        op.buf = buf;
        op.len = p.length;
        op.offset = p.file_offset;
        op.min_len = p.needed();
        ring.submit(op, [&completions, index = next](const RingResult& r) {
          std::lock_guard lock(completions.mu);
          completions.done.emplace_back(index, r);
          completions.cv.notify_all();  // under the lock: the caller's frame may go away after
        });
        ++in_flight;
        ++next;
      }
      if (in_flight == 0) break;
      wait_batch();
      for (handled = 0; handled < batch.size(); ++handled) {
        const auto& [index, r] = batch[handled];
        const ReadPiece& p = pieces[index];
        const OpenFile& f = *files[p.request];
        if (first.ok() && r.err != 0) {
          first = Status::from_errno(r.err, "read " + f.path + " at offset " + std::to_string(p.file_offset));
        } else if (first.ok() && r.bytes < p.needed()) {
          first = data_loss("read " + f.path + ": file ended at " + std::to_string(p.file_offset + r.bytes) +
                            " while reading up to " + std::to_string(p.file_offset + p.needed()));
        } else if (first.ok() && p.bounce) {
          std::memcpy(requests[p.request].dst + p.dst_offset, scratch_of[index] + p.copy_from, p.wanted);
        }
        if (p.bounce) {
          scratch_free.push_back(scratch_of[index]);  // (within the capacity the buffer's own push made)
          --bounce_in_flight;
        }
        --in_flight;  // last: a throw above leaves this entry to the catch below
      }
      batch.clear();
      handled = 0;
    }
  } catch (...) {
    first = status_of_exception("read");
    for (;;) {
      in_flight -= batch.size() - handled;  // the completions not yet handled
      batch.clear();
      handled = 0;
      if (in_flight == 0) break;
      wait_batch();
    }
  }
  return first;
}

Status read_with_pool(std::span<const ReadRequest> requests, const std::vector<OpenFile*>& files,
                      const ReadSettings& s, PreadPool& pool) {
  struct Piece {
    size_t request;
    uint64_t at;  // offset within the request
    uint64_t len;
  };
  const uint64_t chunk = std::max<uint64_t>(s.request_size, 1ull << 20);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < requests.size(); ++i)
    for (uint64_t at = 0; at < requests[i].length; at += chunk)
      pieces.push_back({i, at, std::min(chunk, requests[i].length - at)});
  std::mutex mu;
  Status first;
  std::atomic<bool> failed{false};
  pool.parallel_for(pieces.size(), [&](size_t k) {
    if (failed.load(std::memory_order_relaxed)) return;
    const Piece& p = pieces[k];
    const ReadRequest& r = requests[p.request];
    const OpenFile& f = *files[p.request];
    Status st = read_fully(f.fd.get(), r.dst + p.at, p.len, r.offset + p.at, f.path);
    if (!st.ok()) {
      std::lock_guard lock(mu);
      if (first.ok()) first = std::move(st);
      failed = true;
    }
  });
  return first;
}

}  // namespace

Result<std::unique_ptr<ObjectView>> view_cached_file(const std::string& root, const std::string& key,
                                                     DirectIo direct_io) {
  std::unique_ptr<ObjectView> none;
  if (direct_io == DirectIo::kOn) return none;
  CKPTIO_ASSIGN_OR_RETURN(UniqueFd fd, open_beneath(root, key, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno(errno, "stat " + join_path(root, key));
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) return none;
  const auto len = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return none;
  if (!mapping_cached(p, len, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)))) {
    ::munmap(p, len);
    return none;
  }
  ::madvise(p, len, MADV_WILLNEED);  // the few pages not cached: read ahead now
  return std::unique_ptr<ObjectView>(std::make_unique<MappedFile>(p, len));
}

Status read_files(const std::string& root, std::span<const ReadRequest> requests,
                  const ReadSettings& settings, Ring& ring, PreadPool& pool) {
  const bool direct = settings.mode == ReadMode::kDirect && settings.direct_io != DirectIo::kOff;
  // The bytes each file is read over in this call: [first, end).
  std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> span;
  if (direct)
    for (const ReadRequest& r : requests) {
      auto [it, fresh] = span.try_emplace(r.key, r.offset, r.offset + r.length);
      it->second = {std::min(it->second.first, r.offset), std::max(it->second.second, r.offset + r.length)};
    }
  std::unordered_map<std::string, OpenFile> by_key;
  std::vector<OpenFile*> files(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    auto [it, fresh] = by_key.try_emplace(r.key);
    if (fresh) {
      CKPTIO_RETURN_IF_ERROR(check_key(r.key));
      const auto [lo, hi] = direct ? span.at(r.key) : std::pair<uint64_t, uint64_t>{0, 0};
      CKPTIO_RETURN_IF_ERROR(open_for_read(root, r.key, direct, settings.direct_io, lo, hi, it->second));
    }
    OpenFile& f = it->second;
    files[i] = &f;
    if (r.length > 0 && r.dst == nullptr)
      return invalid_argument("read " + f.path + ": null destination for " + std::to_string(r.length) + " bytes");
    if (r.offset > f.size || r.length > f.size - r.offset)
      return data_loss("read " + f.path + ": range [" + std::to_string(r.offset) + ", " +
                       std::to_string(r.offset + r.length) + ") is past the end of the file (" +
                       std::to_string(f.size) + " bytes)");
  }
  if (direct) return read_through_ring(requests, files, settings, ring);
  return read_with_pool(requests, files, settings, pool);
}

}  // namespace ckptio::local
