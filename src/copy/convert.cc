// Layout conversion of one step (contract in convert.h).
#include "src/copy/convert.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "src/copy/copy.h"
#include "src/layout/layout.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/save/eformer_writer.h"
#include "src/restore/restore_whole.h"
#include "src/restore/restore_zarr.h"
#include "src/save/commit.h"
#include "src/util/callback.h"
#include "src/util/clock.h"
#include "src/util/crc32c.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;
using Selected = std::vector<std::pair<std::string, LeafRecord*>>;
using GroupFn = std::function<Status(RestoredState&)>;

constexpr uint64_t kDefaultMaxMemory = 256ull << 20;
constexpr size_t kWriteBuffers = 4;

// Restores the leaves of `index` whole, in groups of at most `max_memory`
// bytes (a larger leaf alone), and hands each group to f. The groups land
// in one arena, reused (RestoreOptions::into): fresh memory for every group
// cost a page fault per 4 KiB of the step, a quarter of a conversion's time.
// A group's tensors are valid until f returns.
Status for_each_group(Storage& src, const std::string& src_dir, const Index& index, uint64_t max_memory,
                      const GroupFn& f) {
  Index copy = index;  // restore_whole moves names out of the records it restores
  Selected all;
  uint64_t total = 0;
  for (PrefixRecord& p : copy.prefixes)
    for (LeafRecord& l : p.leaves) {
      all.emplace_back(p.name, &l);
      total += l.num_bytes();
    }
  // Leaves start 64-byte aligned in it; a leaf larger than the arena is restored alone into memory of its own.
  Buffer arena = Buffer::allocate(std::min(max_memory, total + 64 * all.size()), 4096);
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    uint64_t bytes = 0;
    RestoreOptions ro;
    for (; j < all.size(); ++j) {
      const uint64_t n = all[j].second->num_bytes();
      const uint64_t at = (bytes + 63) / 64 * 64;
      if (j > i && at + n > max_memory) break;
      if (at + n <= arena.size())
        ro.into.push_back({all[j].first, all[j].second->path, arena.data() + at, n});
      bytes = at + n;
    }
    const Selected group(all.begin() + static_cast<std::ptrdiff_t>(i), all.begin() + static_cast<std::ptrdiff_t>(j));
    RestoredState out;
    out.step = index.step;
    CKPTIO_RETURN_IF_ERROR(index.layout == zarr::kEformerLayout
                               ? restore_zarr(src, src_dir, index.step, group, ro, &out)
                               : restore_whole(src, src_dir, copy, group, ro, &out));
    CKPTIO_RETURN_IF_ERROR(f(out));
    i = j;
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
    obj_->write_async(written_, {buffers_[b].data(), len}, [this, b](Status st) {
      std::lock_guard lock(mu_);
      if (!st.ok() && error_.ok()) error_ = st;
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
Status progress(const CopyOptions& o, const Index& index, uint64_t done) {
  if (!o.on_progress) return Status::OK();
  const uint64_t total = index.total_bytes();
  return call_callback("on_progress", [&] { o.on_progress(index.step, std::min(done, total), total); })
      .annotate("step " + std::to_string(index.step));
}

std::string canonical_metadata(const std::string& text) {
  try {
    auto j = nlohmann::ordered_json::parse(text);
    if (j.is_object()) {
      std::string s = j.dump();
      if (check_metadata_json(s).ok()) return s;
    }
  } catch (const std::exception&) {
  }
  return "{}";
}

// `json` (an object) without `keys` (the eformer writer's own members of
// metadata.json: the step's are written anew).
std::string metadata_without(const std::string& json, std::initializer_list<const char*> keys) {
  auto j = nlohmann::ordered_json::parse(json);
  for (const char* k : keys) j.erase(k);
  return j.dump();
}

// eformer (or any layout) -> ckptio: one data file, a shard per leaf.
Result<CopyStats> to_ckptio(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                            const std::string& dst_dir, const CopyOptions& o) {
  CopyStats stats;
  stats.step = index.step;
  const AttemptPaths paths = plan_attempt(dst, dst_dir);
  const std::string file = data_file_name(paths.attempt, 0);
  Index out;
  out.step = index.step;
  out.created_unix_ns = index.created_unix_ns ? index.created_unix_ns : unix_ns_now();
  out.metadata_json = canonical_metadata(index.metadata_json);
  const auto t0 = Clock::now();
  auto commit = [&]() -> Status {
    CKPTIO_ASSIGN_OR_RETURN(auto obj, dst.create_new(paths.stage_dir + "/" + file, 0));
    DataFileWriter w(std::move(obj), copy_chunk_size(dst, o.chunk_size));
    std::map<std::string, size_t> prefix_at;
    CKPTIO_RETURN_IF_ERROR(for_each_group(src, src_dir, index, o.max_memory ? o.max_memory : kDefaultMaxMemory,
                                          [&](RestoredState& group) -> Status {
      for (Tensor& t : group.leaves) {
        auto [it, fresh] = prefix_at.emplace(t.prefix, out.prefixes.size());
        if (fresh) out.prefixes.push_back(PrefixRecord{t.prefix, {}});
        ShardRecord s{Box::whole(t.shape), file, w.size(), t.data.size(), crc32c(t.data.data(), t.data.size())};
        CKPTIO_RETURN_IF_ERROR(w.append(t.data.data(), t.data.size()));
        out.prefixes[it->second].leaves.push_back(LeafRecord{t.path, t.dtype, t.shape, {std::move(s)}, {}});
        stats.shards += 1;
        CKPTIO_RETURN_IF_ERROR(progress(o, index, w.size()));
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
    bool unknown = false;
    Status st = commit_attempt(dst, paths, serialize_index(out), o.overwrite, &unknown);
    stats.commit_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
    if (!st.ok() && unknown) return st;  // the index may be there: leave the data for gc
    return st;
  };
  Status st = commit();
  if (!st.ok()) {
    discard_attempt(dst, paths, {file});
    return st;
  }
  return stats;
}

// ckptio -> eformer.
Result<CopyStats> to_eformer(Storage& src, const std::string& src_dir, const Index& index, Storage& dst,
                             const std::string& dst_dir, const CopyOptions& o) {
  CopyStats stats;
  stats.step = index.step;
  zarr::EformerWriteOptions wo;
  wo.compressor.id = zarr::CodecId::kZstd;
  wo.compressor.level = o.zstd_level;
  wo.overwrite = o.overwrite;
  wo.extra_metadata_json = metadata_without(canonical_metadata(index.metadata_json), {"step", "timestamp", "is_temporary"});
  const auto t0 = Clock::now();
  CKPTIO_ASSIGN_OR_RETURN(auto writer, zarr::EformerStepWriter::start(dst, dst_dir, index.step, wo));
  std::map<std::pair<std::string, std::string>, size_t> ids;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) {
      CKPTIO_ASSIGN_OR_RETURN(size_t id, writer->add_array(p.name, l.path, l.dtype, l.shape, zarr::regular_chunk_shape(l.shape, l.shards)));
      ids[{p.name, l.path}] = id;
    }
  uint64_t done = 0;
  Status st = for_each_group(src, src_dir, index, o.max_memory ? o.max_memory : kDefaultMaxMemory,
                             [&](RestoredState& group) -> Status {
    for (Tensor& t : group.leaves) {
      CKPTIO_RETURN_IF_ERROR(writer->write_box(ids.at({t.prefix, t.path}), Box::whole(t.shape),
                                               {t.data.data(), t.data.size()}));
      done += t.data.size();
      stats.shards += 1;
      CKPTIO_RETURN_IF_ERROR(progress(o, index, done));
    }
    return Status::OK();
  });
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
