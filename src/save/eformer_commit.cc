// Committing one step in eformer's layout, or discarding it (the writer's
// state: eformer_writer_impl.h; the contract: eformer_writer.h).
#include <set>

#include "src/layout/layout.h"
#include "src/layout/zarr/chunk_grid.h"
#include "src/layout/zarr/eformer_index.h"
#include "src/save/eformer_writer_impl.h"

namespace ckptio::zarr {

Status EformerStepWriter::Impl::check_coverage() {
  for (const Array& a : arrays) {
    if (a.written_count == a.z.num_chunks) continue;
    uint64_t flat = 0;
    while (flat < a.written.size() && a.written[flat]) ++flat;
    std::vector<uint64_t> idx(a.z.grid.size());
    for (size_t d = idx.size(); d-- > 0;) {
      idx[d] = flat % a.z.grid[d];
      flat /= a.z.grid[d];
    }
    const std::string key = chunk_key(a.z, idx);
    return Status(Code::kFailedPrecondition,
                  "array " + a.name() + ": chunk " + key + " (" + a.dir + "/" + key + ") was never written; " +
                      std::to_string(a.z.num_chunks - a.written_count) + " of " + std::to_string(a.z.num_chunks) +
                      " chunks missing");
  }
  return Status::OK();
}

Status EformerStepWriter::Impl::write_index() {
  EformerIndex index;
  for (const Array& a : arrays) {
    EformerArray e{a.dir, a.z.shape, "", a.z.dtype};
    if (a.prefix.empty()) {
      if (!index.arrays) index.arrays.emplace();
      index.arrays->push_back(std::move(e));
      continue;
    }
    auto it = std::find_if(index.prefixes.begin(), index.prefixes.end(),
                           [&](const EformerPrefix& p) { return p.name == a.prefix; });
    if (it == index.prefixes.end()) it = index.prefixes.insert(index.prefixes.end(), EformerPrefix{a.prefix, {}});
    it->arrays.push_back(std::move(e));
  }
  const std::string key = key_of(std::string(kEformerIndexName));
  return storage.put(key, as_bytes(serialize_eformer_index(index))).annotate("write " + storage.describe() + "/" + key);
}

// POSIX: fsyncs every directory the step created, on the I/O threads.
Status EformerStepWriter::Impl::sync_dirs() {
  std::set<std::string> dirs = {""};
  auto add_with_parents = [&](std::string d) {
    while (!d.empty() && dirs.insert(d).second) d = parent_of(d);
  };
  for (const Array& a : arrays) {
    add_with_parents(a.dir);
    if (a.z.separator != '/' || a.z.grid.size() < 2) continue;
    ChunkRange all{std::vector<uint64_t>(a.z.grid.size(), 0), a.z.grid, a.z.num_chunks};
    for_each_chunk(all, [&](std::span<const uint64_t> idx) { add_with_parents(a.dir + "/" + parent_of(chunk_key(a.z, idx))); });
  }
  for (const std::string& d : dirs) {
    const std::string prefix = paths.stage_dir + "/" + (d.empty() ? "" : d + "/");
    push_io([this, prefix] { return storage.sync(prefix).annotate("sync " + storage.describe() + "/" + prefix); }, 0,
            /*counted=*/false);
  }
  drain();
  return error();
}

Result<std::string> EformerStepWriter::Impl::metadata_text() const {
  EformerStepMetadata m;
  m.step = step;
  m.timestamp = python_isoformat_local(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  m.is_temporary = options.is_temporary;
  std::string text = serialize_eformer_metadata(m);
  if (text.empty() || text.back() != '}') return internal_error("metadata.json does not end in '}': " + text);
  text.insert(text.size() - 1, extra);
  return text;
}

// Object stores: metadata.json PUT last, settled by reading it back when the
// PUT's outcome is unclear (as commit.cc settles an index). *keep: leave the
// step's objects (they may be committed, or be another writer's).
Status EformerStepWriter::Impl::publish_object_store(const std::string& metadata, bool* keep) {
  const std::string key = paths.final_dir + "/" + std::string(kEformerMetadataName);
  const std::span<const std::byte> bytes = as_bytes(metadata);
  Status put = options.overwrite ? storage.put(key, bytes) : storage.put_new(key, bytes);
  if (put.ok()) return put;
  put = put.annotate("write " + storage.describe() + "/" + key);
  // Refused, or failed with whatever error: a retried PUT whose first
  // attempt stored the object ends with its last attempt's error, which may
  // be any (403 after a key rotation, a quota): read back, as commit.cc does
  // for an index. (Only kUnavailable, kIOError, kInternal and kCancelled
  // were read back: a stored metadata.json behind a 403 was discarded.)
  const bool refused = put.code() == Code::kAlreadyExists;
  auto already = [&] {
    *keep = true;  // another writer committed this step into the same prefix meanwhile
    return Status(Code::kAlreadyExists, "step " + paths.final_dir + " was committed by another writer meanwhile");
  };
  auto there = storage.get(key, bytes.size());
  if (there.ok()) return *there == metadata ? Status::OK() : refused ? already() : put;
  const Code code = there.status().code();
  if (code == Code::kNotFound || code == Code::kInvalidArgument) return refused ? already() : put;
  *keep = true;
  return put.annotate("step " + paths.final_dir + " may or may not be committed (its metadata.json could not be "
                      "read back: " + there.status().to_string() + "); its objects are left");
}

Status EformerStepWriter::Impl::publish(const std::string& metadata, bool* keep) {
  if (!paths.renames) return publish_object_store(metadata, keep);
  const std::string key = key_of(std::string(kEformerMetadataName));
  CKPTIO_RETURN_IF_ERROR(storage.put(key, as_bytes(metadata)).annotate("write " + storage.describe() + "/" + key));
  return publish_attempt(storage, paths, metadata, options.overwrite, keep, kEformerMetadataName);
}

// Drops queued work, waits for running jobs, removes what was written.
// Throws nothing (the writer's destructor calls it): a removal the system
// refuses memory for leaves the attempt's objects to gc.
void EformerStepWriter::Impl::discard() noexcept {
  {
    std::lock_guard lock(mu);
    if (first_error.ok())
      first_error = status_or_out_of_memory([&] { return Status(Code::kCancelled, "step " + paths.final_dir + " aborted"); });
    for (const EncodeJob& j : encode_q) {  // what each would have paid as it ended (Impl::Owed)
      pending -= j.reserved;
      if (!j.borrowed.empty()) --borrowed;
    }
    for (const IoJob& j : io_q) pending -= j.reserved;
    outstanding -= encode_q.size() + io_q.size();
    encode_q.clear();
    io_q.clear();
    progress_cv.notify_all();
  }
  drain();
  try {
    if (!paths.renames) {
      // An object store's attempt writes under the step's own prefix. A
      // metadata.json there now is another writer's commit (this attempt's
      // own was settled by publish_object_store before a discard): its step
      // shares the chunk keys, so nothing under the prefix is removed. Nor
      // when that cannot be told (gc leaves eformer steps alone; a leftover
      // costs space, a removal could cost a committed step).
      auto meta = storage.stat(paths.final_dir + "/" + std::string(kEformerMetadataName));
      if (meta.ok() || meta.status().code() != Code::kNotFound) return;
    }
    (void)storage.remove_prefix(paths.stage_dir + "/");
  } catch (...) {
  }
}

}  // namespace ckptio::zarr
