// Layout conversion of one step (contract in convert.h).
#include "src/copy/convert.h"

#include <nlohmann/json.hpp>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "src/copy/copy.h"
#include "src/layout/layout.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/save/eformer_writer.h"
#include "src/restore/restore_whole.h"
#include "src/restore/damage.h"
#include "src/restore/restore_zarr.h"
#include "src/save/commit.h"
#include "src/util/allocate.h"
#include "src/util/callback.h"
#include "src/util/clock.h"
#include "src/util/crc32c.h"
#include "src/util/json_free.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;
using Selected = std::vector<std::pair<std::string, LeafRecord*>>;
using GroupFn = std::function<Status(RestoredState&)>;

constexpr uint64_t kDefaultMaxMemory = 256ull << 20;
constexpr size_t kWriteBuffers = 4;

// Restores the leaves of `index` whole, in groups of at most half of
// `max_memory` bytes (a larger leaf alone), and hands each group to f on the
// calling thread, in order. A thread of its own restores the next group
// into the other half of the arena while f runs on this one: a restore waits
// on the disk and checks CRCs, f copies into the writer and its encoders
// compress, and one after the other they left a core idle (1 GiB into
// eformer's layout: 1.68 s restoring + 1.44 s in f, docs/benchmarks/history.md).
// The halves are reused (RestoreOptions::into): fresh memory for every
// group cost a page fault per 4 KiB of the step, a quarter of a
// conversion's time. A group's tensors are valid until f returns; a leaf
// larger than a half is restored alone into memory of its own (two such
// leaves may be held at once, the one f works on and the next).
// A leaf saved in one shard of a ckptio step is placed in its half at an
// address that agrees with the shard's file offset modulo the storage's
// read alignment, as restore places the leaves it allocates: direct reads
// land in it. At 64-byte offsets the local backend read every byte through
// a bounce buffer and copied it.
Status for_each_group(Storage& src, const std::string& src_dir, const Index& index, uint64_t max_memory,
                      const GroupFn& f) {
  Index copy = index;  // restore_whole moves names out of the records it restores (the restoring thread only)
  Selected all;
  uint64_t total = 0;
  for (PrefixRecord& p : copy.prefixes)
    for (LeafRecord& l : p.leaves) {
      all.emplace_back(p.name, &l);
      total += l.num_bytes();
    }
  const uint64_t half = std::max<uint64_t>(max_memory / 2, 4096);
  const uint64_t read_align = src.read_alignment();
  const uint64_t align = index.layout != zarr::kEformerLayout && read_align > 64 && (read_align & (read_align - 1)) == 0
                             ? read_align
                             : 64;
  // Where leaf `k` may start at or after `bytes`: in phase with its shard
  // when direct reads can land in it, else 64-byte aligned.
  auto place = [&](size_t k, uint64_t bytes) {
    const LeafRecord& l = *all[k].second;
    if (align > 64 && l.shards.size() == 1) return bytes + ((l.shards[0].offset - bytes) & (align - 1));
    return (bytes + 63) / 64 * 64;
  };
  // Groups [first, last) of `all`, and where each leaf lands in its half
  // (UINT64_MAX: restored into memory of its own).
  std::vector<std::pair<size_t, size_t>> groups;
  std::vector<uint64_t> at(all.size(), UINT64_MAX);
  const uint64_t arena_bytes = std::min(half, total + align * all.size());
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    uint64_t bytes = 0;
    for (; j < all.size(); ++j) {
      const uint64_t n = all[j].second->num_bytes();
      const uint64_t a = place(j, bytes);
      if (j > i && a + n > half) break;
      if (a + n <= arena_bytes) at[j] = a;
      bytes = a + n;
    }
    groups.emplace_back(i, j);
    i = j;
  }
  Buffer arenas[2];
  for (size_t h = 0; h < std::min<size_t>(2, groups.size()); ++h) arenas[h] = Buffer::allocate(arena_bytes, align);

  struct Slot {
    RestoredState out;
    Status status;
    bool ready = false;
  };
  std::mutex mu;
  std::condition_variable cv;
  Slot slots[2];          // group g lands in slot and arena g % 2
  size_t consumed = 0;    // groups f is done with
  bool stop = false;      // f failed (or threw): restore no more
  auto restore_group = [&](size_t g) {
    const auto [i, j] = groups[g];
    RestoreOptions ro;
    for (size_t k = i; k < j; ++k)
      if (at[k] != UINT64_MAX)
        ro.into.push_back({all[k].first, all[k].second->path, arenas[g % 2].data() + at[k], all[k].second->num_bytes()});
    const Selected group(all.begin() + static_cast<std::ptrdiff_t>(i), all.begin() + static_cast<std::ptrdiff_t>(j));
    Slot s;
    s.out.step = index.step;
    s.status = index.layout == zarr::kEformerLayout ? restore_zarr(src, src_dir, index.step, group, ro, &s.out)
                                                    : restore_whole(src, src_dir, copy, group, ro, &s.out);
    s.ready = true;
    return s;
  };
  std::thread restorer([&] {
    pthread_setname_np(pthread_self(), "ckptio-cp-read");  // (top -H, gdb; the allocation sweeps)
    for (size_t g = 0; g < groups.size(); ++g) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || g < consumed + 2; });  // its half is free
        if (stop) return;
      }
      // Nothing leaves this thread: what restoring a group throws
      // (std::bad_alloc: its options, its leaves) is the copy's error.
      Slot s;
      try {
        s = restore_group(g);
      } catch (...) {
        s.status = status_of_exception("restore a group of leaves to convert");
        s.ready = true;
      }
      const bool failed = !s.status.ok();
      {
        std::lock_guard lock(mu);
        slots[g % 2] = std::move(s);
      }
      cv.notify_all();
      if (failed) return;
    }
  });
  struct Join {  // stops and joins the restorer however this returns
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::thread& t;
    ~Join() {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      cv.notify_all();
      t.join();
    }
  } join{mu, cv, stop, restorer};
  for (size_t g = 0; g < groups.size(); ++g) {
    Slot s;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return slots[g % 2].ready; });
      s = std::move(slots[g % 2]);
      slots[g % 2].ready = false;
    }
    CKPTIO_RETURN_IF_ERROR(s.status);
    CKPTIO_RETURN_IF_ERROR(f(s.out));
    s = Slot{};  // the group's own memory (leaves larger than a half) goes now
    {
      std::lock_guard lock(mu);
      ++consumed;
    }
    cv.notify_all();
  }
  return Status::OK();
}

// One data file written front to back through a few aligned buffers of
// `chunk` bytes (a multiple of the object's granularity), each handed to
// write_async when full.
class DataFileWriter {
 public:
  DataFileWriter(std::unique_ptr<WritableObject> obj, uint64_t chunk) : obj_(std::move(obj)), chunk_(chunk) {
    for (size_t i = 0; i < kWriteBuffers; ++i) {
      buffers_.push_back(Buffer::allocate(chunk_, 4096));
      free_.push_back(i);
    }
  }
  ~DataFileWriter() {
    if (obj_) obj_->abort();
  }
  Status append(const std::byte* p, uint64_t n) {
    while (n > 0) {
      if (current_ == SIZE_MAX) CKPTIO_RETURN_IF_ERROR(take());
      const uint64_t k = std::min(n, chunk_ - fill_);
      std::memcpy(buffers_[current_].data() + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ == chunk_) put(chunk_);
    }
    return Status::OK();
  }
  uint64_t size() const { return written_ + fill_; }
  Status finish() {
    const uint64_t total = size();
    if (current_ != SIZE_MAX && fill_ > 0) {
      const uint64_t a = std::max<uint64_t>(obj_->alignment(), 1);
      const uint64_t len = (fill_ + a - 1) / a * a;
      std::memset(buffers_[current_].data() + fill_, 0, len - fill_);
      put(len);
    }
    Status st = obj_->finish(total);
    std::unique_ptr<WritableObject> done = std::move(obj_);
    std::lock_guard lock(mu_);
    return error_.ok() ? st : error_;
  }

 private:
  Status take() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || !error_.ok(); });
    if (!error_.ok()) return error_;
    current_ = free_.back();
    free_.pop_back();
    fill_ = 0;
    return Status::OK();
  }
  void put(uint64_t len) {
    const size_t b = current_;
    // On a backend thread: throws nothing (storage.h; free_ never outgrows
    // the capacity the constructor gave it).
    obj_->write_async(written_, {buffers_[b].data(), len}, [this, b](Status st) {
      std::lock_guard lock(mu_);
      if (!st.ok() && error_.ok()) error_ = std::move(st);
      free_.push_back(b);
      cv_.notify_all();
    });
    written_ += fill_;
    current_ = SIZE_MAX;
    fill_ = 0;
  }
  std::unique_ptr<WritableObject> obj_;
  const uint64_t chunk_;
  std::vector<Buffer> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> free_;
  Status error_;
  size_t current_ = SIZE_MAX;
  uint64_t fill_ = 0, written_ = 0;
};

// CopyOptions::on_progress, counted in the source's stored bytes (what it
// throws stops the copy).
// The bytes of every leaf decoded, what a conversion's progress counts (an
// eformer index's shard lengths are the chunks' compressed sizes; the bar
// was at its end almost at once). Saturates.
uint64_t decoded_bytes(const Index& index) {
  uint64_t total = 0;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves)
      if (__builtin_add_overflow(total, l.num_bytes(), &total)) return UINT64_MAX;
  return total;
}

// `total`: decoded_bytes(index).
Status progress(const CopyOptions& o, const Index& index, uint64_t done, uint64_t total) {
  if (!o.on_progress) return Status::OK();
  return call_callback("on_progress", [&] { o.on_progress(index.step, std::min(done, total), total); })
      .annotate("step " + std::to_string(index.step));
}

std::string canonical_metadata(const std::string& text) {
  try {
    nlohmann::ordered_json j;
    JsonFreer free_j(j);
    parse_json_into(j, text);
    if (j.is_object()) {
      std::string s = j.dump();
      if (check_metadata_json(s).ok()) return s;
    }
  } catch (const nlohmann::json::exception&) {  // not JSON: std::bad_alloc fails the copy
  }
  return "{}";
}

// `json` (an object) without `keys` (the eformer writer's own members of
// metadata.json: the step's are written anew).
std::string metadata_without(const std::string& json, std::initializer_list<const char*> keys) {
  nlohmann::ordered_json j, kept = nlohmann::ordered_json::object();
  JsonFreer free_j(j), free_kept(kept);
  parse_json_into(j, json);
  // A new object, not j.erase(k): nlohmann's ordered_map erases by copying
  // every later member's key over the one before, and a refused copy leaves
  // a member destroyed twice.
  // (Room for every member first: an ordered_map grows by copying too.)
  kept.get_ptr<nlohmann::ordered_json::object_t*>()->reserve(j.size());
  for (auto& member : j.items())
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return member.key() == k; }))
      kept.emplace(member.key(), std::move(member.value()));
  return kept.dump();
}

// eformer (or any layout) -> ckptio: one data file, a shard per leaf.
Result<CopyStats> to_ckptio(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                            const std::string& dst_dir, const CopyOptions& o) {
  CopyStats stats;
  stats.step = index.step;
  const uint64_t decoded_total = decoded_bytes(index);
  // What the ckptio layout cannot name, refused before anything is written:
  // arrays saved without a prefix (eformer's top-level "arrays"). (Two array
  // directories that name one leaf, "a/b.c" and "a/b/c", never load:
  // load_eformer_step refuses them.)
  for (const PrefixRecord& p : index.prefixes) {
    if (p.name.empty())
      return invalid_argument("step " + std::to_string(index.step) + " has arrays saved without a prefix (" +
                              (p.leaves.empty() ? std::string("none") : p.leaves.front().path) +
                              ", ...): the ckptio layout needs one for every leaf; keep this step in the eformer "
                              "layout (cp --format eformer)");
  }
  const AttemptPaths paths = plan_attempt(dst, dst_dir);
  const std::string file = data_file_name(paths.attempt, 0);
  Index out;
  out.step = index.step;
  out.created_unix_ns = index.created_unix_ns ? index.created_unix_ns : unix_ns_now();
  out.metadata_json = canonical_metadata(index.metadata_json);
  const auto t0 = Clock::now();
  bool outcome_unknown = false;
  // The size announced to the backend: every leaf, and at most 15 bytes of
  // alignment before each (S3 writes an object larger than one part as a
  // multipart upload only when told so up front).
  uint64_t size_hint = 0;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) {  // (saturating: an impossible size fails the create)
      const uint64_t n = l.num_bytes(), add = n > UINT64_MAX - 15 ? UINT64_MAX : n + dtype_alignment(l.dtype) - 1;
      size_hint = add > UINT64_MAX - size_hint ? UINT64_MAX : size_hint + add;
    }
  auto commit = [&]() -> Status {
    CKPTIO_ASSIGN_OR_RETURN(auto obj, dst.create_new(paths.stage_dir + "/" + file, size_hint));
    DataFileWriter w(std::move(obj), copy_chunk_size(dst, o.chunk_size));
    std::map<std::string, size_t> prefix_at;
    CKPTIO_RETURN_IF_ERROR(for_each_group(src, src_dir, index, o.max_memory ? o.max_memory : kDefaultMaxMemory,
                                          [&](RestoredState& group) -> Status {
      for (Tensor& t : group.leaves) {
        auto [it, fresh] = prefix_at.emplace(t.prefix, out.prefixes.size());
        if (fresh) out.prefixes.push_back(PrefixRecord{t.prefix, {}});
        // Each leaf at a multiple of its dtype's alignment, as a save places it.
        static constexpr std::byte kZeros[16] = {};
        const uint64_t a = dtype_alignment(t.dtype);
        if (const uint64_t pad = (a - w.size() % a) % a) CKPTIO_RETURN_IF_ERROR(w.append(kZeros, pad));
        ShardRecord s{Box::whole(t.shape), file, w.size(), t.data.size(), crc32c(t.data.data(), t.data.size())};
        CKPTIO_RETURN_IF_ERROR(w.append(t.data.data(), t.data.size()));
        out.prefixes[it->second].leaves.push_back(LeafRecord{t.path, t.dtype, t.shape, {std::move(s)}, {}});
        stats.shards += 1;
        CKPTIO_RETURN_IF_ERROR(progress(o, index, w.size(), decoded_total));
      }
      return Status::OK();
    }));
    CKPTIO_RETURN_IF_ERROR(w.finish());
    out.files.push_back(DataFileRecord{file, w.size()});
    stats.bytes = w.size();
    stats.files = 1;
    stats.data_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    out.committed_unix_ns = unix_ns_now();
    const auto t1 = Clock::now();
    // As every writer does: parsed back before it is committed.
    const std::string text = serialize_index(out);
    if (text.empty()) return out_of_memory("serialize the converted index");  // (serialize_index's failure)
    if (auto back = parse_index(text); !back.ok())
      return back.status().annotate("internal: the converted index of step " + std::to_string(index.step) +
                                    " fails to parse");
    Status st = commit_attempt(dst, paths, text, o.overwrite, &outcome_unknown);
    stats.commit_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    return st;
  };
  // What the conversion throws (std::bad_alloc from a write, a refused
  // thread) discards the attempt too: before, it stayed for gc, and on an
  // object store its objects refused a later conversion of the step.
  Status st;
  try {
    st = commit();
  } catch (...) {
    if (!outcome_unknown) discard_attempt_nothrow(dst, paths, {file});
    throw;
  }
  if (!st.ok()) {
    // Unless the index may be there (then the data is left for gc).
    if (!outcome_unknown) discard_attempt(dst, paths, {file});
    return st;
  }
  return stats;
}

// The data files of ckptio step `index` in place (Storage::view_cached),
// when every one of them is in the page cache and every leaf's shards are
// its chunks (one shard, or a regular grid: regular_chunk_shape), so that a
// conversion can compress each shard straight out of the cache. Empty when
// not, or when a view fails or is shorter than the index records (the reads
// then report what is wrong). A checked index puts every shard inside its
// listed file's recorded size, so each lies inside its view.
std::map<std::string, std::unique_ptr<ObjectView>> view_step(Storage& src, const std::string& src_dir,
                                                             const Index& index) {
  std::map<std::string, std::unique_ptr<ObjectView>> views;
  if (index.layout == zarr::kEformerLayout) return views;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves)
      if (l.shards.size() > 1 && zarr::regular_chunk_shape(l.shape, l.shards) == l.shape) return views;
  for (const DataFileRecord& f : index.files) {
    auto v = src.view_cached(src_dir + "/" + f.name);
    if (!v.ok() || !*v || (*v)->bytes().size() < f.size) return {};
    views.emplace(f.name, std::move(v).value());
  }
  return views;
}

// Waits, however the scope is left, until the writer reads no borrowed bytes.
struct WaitBorrowed {
  zarr::EformerStepWriter& w;
  ~WaitBorrowed() { w.wait_borrowed(); }
};

using ArrayIds = std::map<std::pair<std::string, std::string>, size_t>;

// Hands every shard of ckptio step `index` to `writer` out of `views` (its
// data files in place, view_step), each checked against its checksum first.
Status write_in_place(Storage& src, const std::string& src_dir, const Index& index,
                      const std::map<std::string, std::unique_ptr<ObjectView>>& views,
                      zarr::EformerStepWriter& writer, const ArrayIds& ids, const CopyOptions& o, CopyStats& stats) {
  WaitBorrowed wait{writer};  // the views outlive every chunk read from them
  const uint64_t decoded_total = decoded_bytes(index);
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves)
      for (size_t i = 0; i < l.shards.size(); ++i) {
        const ShardRecord& s = l.shards[i];
        const std::span<const std::byte> bytes = views.at(s.file)->bytes().subspan(s.offset, s.length);
        if (crc32c(bytes.data(), bytes.size()) != s.crc32c)
          return data_loss("checksum mismatch in " + p.name + "/" + l.path + " shard " + std::to_string(i) +
                           " (file " + s.file + ", " + byte_range(s.offset, s.length) + ") of step " +
                           std::to_string(index.step) + " at " + src.describe() + "/" + src_dir + "/" + s.file);
        CKPTIO_RETURN_IF_ERROR(writer.write_box_borrowed(ids.at({p.name, l.path}), s.box, bytes));
        stats.shards += 1;
        stats.bytes_in_place += s.length;
        CKPTIO_RETURN_IF_ERROR(progress(o, index, stats.bytes_in_place, decoded_total));
      }
  return Status::OK();
}

// ckptio -> eformer.
Result<CopyStats> to_eformer(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                             const std::string& dst_dir, const CopyOptions& o) {
  CopyStats stats;
  stats.step = index.step;
  const uint64_t decoded_total = decoded_bytes(index);
  zarr::EformerWriteOptions wo;
  wo.compressor.id = zarr::CodecId::kZstd;
  wo.compressor.level = o.zstd_level;
  wo.overwrite = o.overwrite;
  wo.extra_metadata_json = metadata_without(canonical_metadata(index.metadata_json), {"step", "timestamp", "is_temporary"});
  const auto t0 = Clock::now();
  // What can be refused is refused before the writer starts, which on an
  // object store removes a step that is there (no atomic replacement,
  // format.md §7): leaves eformer's layout cannot hold, and a conversion in
  // place there, which would remove its own source.
  zarr::EformerArrayLayout layout(wo.compressor, wo.separator);
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves)
      CKPTIO_RETURN_IF_ERROR(layout.add(p.name, l.path, l.dtype, l.shape, zarr::regular_chunk_shape(l.shape, l.shards))
                                 .status());
  if (o.overwrite && !dst.caps().atomic_rename && src.describe() == dst.describe() && src_dir == dst_dir)
    return invalid_argument("step " + std::to_string(index.step) + " cannot be converted in place at " +
                            dst.describe() + "/" + dst_dir + ": an object store has no atomic replacement, so the "
                            "step would be removed before it is read; copy it to another prefix");
  CKPTIO_ASSIGN_OR_RETURN(auto writer, zarr::EformerStepWriter::start(dst, dst_dir, index.step, wo));
  ArrayIds ids;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) {
      auto id = writer->add_array(p.name, l.path, l.dtype, l.shape, zarr::regular_chunk_shape(l.shape, l.shards));
      if (!id.ok()) {
        writer->abort();
        return id.status();
      }
      ids[{p.name, l.path}] = *id;
    }
  uint64_t done = 0;
  // A step the page cache holds is compressed where it lies: no copy into
  // memory of our own, which a conversion would fault in and fill first.
  const auto views = view_step(src, src_dir, index);
  Status st;
  if (!views.empty()) {
    st = write_in_place(src, src_dir, index, views, *writer, ids, o, stats);
    done = stats.bytes_in_place;
  } else {
    st = for_each_group(src, src_dir, index, o.max_memory ? o.max_memory : kDefaultMaxMemory,
                        [&](RestoredState& group) -> Status {
      WaitBorrowed wait{*writer};  // the group's memory is reused once this returns
      for (Tensor& t : group.leaves) {
        CKPTIO_RETURN_IF_ERROR(writer->write_box_borrowed(ids.at({t.prefix, t.path}), Box::whole(t.shape),
                                                          {t.data.data(), t.data.size()}));
        done += t.data.size();
        stats.shards += 1;
        CKPTIO_RETURN_IF_ERROR(progress(o, index, done, decoded_total));
      }
      return Status::OK();
    });
  }
  stats.data_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.ok()) {
    writer->abort();
    return st;
  }
  const auto t1 = Clock::now();
  CKPTIO_RETURN_IF_ERROR(writer->commit());
  stats.commit_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  stats.bytes = done;
  return stats;
}

}  // namespace

Result<CopyStats> convert_step(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                               const std::string& dst_dir, const std::string& layout, const CopyOptions& o) {
  if (layout == "ckptio") return to_ckptio(src, src_dir, index, dst, dst_dir, o);
  if (layout == zarr::kEformerLayout) return to_eformer(src, src_dir, index, dst, dst_dir, o);
  return invalid_argument("copy: unknown layout \"" + layout + "\" (ckptio or eformer)");
}

}  // namespace ckptio
