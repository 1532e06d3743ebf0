// A save in eformer's layout (ManagerOptions::layout "eformer") on the
// worker: each leaf becomes a zarr array whose chunks are its shards' shape
// when they form a regular grid (TensorStore's: one chunk per device shard),
// else the whole leaf; each shard goes to the eformer writer
// (src/save/eformer_writer.h), which encodes and writes its chunks
// and commits the step (POSIX: a temporary directory renamed; object
// stores: metadata.json last). Borrow mode releases the caller's buffers
// once the writer has read every shard, before the commit; copy mode
// released them when save() returned (make_eformer_job copied them).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "src/layout/zarr/chunk_grid.h"
#include "src/save/eformer_writer.h"
#include "src/manager/manager_impl.h"
#include "src/save/save_job.h"
#include "src/util/allocate.h"
#include "src/util/box_runs.h"
#include "src/util/json_free.h"
#include "src/util/log.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The metadata.json members a save adds: the caller's metadata object,
// without the writer's own "step", "timestamp" and "is_temporary".
Result<std::string> extra_metadata(const std::string& json) {
  if (json.empty()) return std::string("{}");
  nlohmann::ordered_json j;
  JsonFreer free_j(j);
  try {
    parse_json_into(j, json);  // save() checked it is an object
  } catch (const nlohmann::json::exception& e) {  // (std::bad_alloc is the caller's)
    return invalid_argument(std::string("SaveOptions::metadata_json: ") + e.what());
  }
  for (const char* own : {"step", "timestamp", "is_temporary"})
    if (j.contains(own))
      return invalid_argument(std::string("an eformer save writes \"") + own +
                              "\" in metadata.json itself: leave it out of SaveOptions::metadata_json");
  return json;
}

// Whether every shard of `leaf` is whole chunks of `chunks` (the grid's
// edge chunks cut by the shape), as the writer takes boxes.
bool whole_chunks(const LeafView& leaf, const Shape& chunks) {
  for (const ShardView& s : leaf.shards)
    for (size_t d = 0; d < chunks.size(); ++d)
      if (s.box.start[d] % chunks[d] != 0 || (s.box.stop[d] % chunks[d] != 0 && s.box.stop[d] != leaf.shape[d]))
        return false;
  return true;
}

// The leaf whole, in C order, from its shards (validate_leaves checked that
// they tile it).
Result<Buffer> assemble(const LeafView& leaf) {
  const size_t item = dtype_size(leaf.dtype);
  const Box whole = Box::whole(leaf.shape);
  const std::optional<uint64_t> n = checked_num_bytes(whole, item);
  if (!n) return invalid_argument(leaf.prefix + "/" + leaf.path + ": too large");
  // (On the worker: the system refusing memory fails this save, not the process.)
  CKPTIO_ASSIGN_OR_RETURN(Buffer b, allocate_or_status(std::max<uint64_t>(*n, 1), 64,
                                                      "assembling " + leaf.prefix + "/" + leaf.path));
  for (const ShardView& s : leaf.shards) {
    if (box_is_empty(s.box)) continue;
    CKPTIO_ASSIGN_OR_RETURN(RunLayout runs, run_layout(s.box, 0, s.box, whole, item));
    const auto* src = static_cast<const std::byte*>(s.data);
    for_each_run(runs, [&](uint64_t from, uint64_t to, uint64_t len) { std::memcpy(b.data() + to, src + from, len); });
  }
  return b;
}

}  // namespace

void CheckpointManager::Impl::run_eformer_job(SaveJob& job) {
  Storage& storage = owner->storage();
  SaveStats stats;
  stats.bytes = job.handle->total.load(std::memory_order_acquire);
  const auto t0 = Clock::now();
  auto release = [&] {
    if (!job.copy_mode) job.handle->set_released();
  };
  // What this throws (std::bad_alloc where the system refuses memory) fails
  // this save, not the process: the writer's destructor, run as it unwinds,
  // waits for the chunks in flight and discards the attempt.
  Status st;
  try {
    st = [&]() -> Status {
      zarr::EformerWriteOptions wo;
      wo.overwrite = job.options.overwrite;
      wo.attempt = job.paths.attempt;  // the id gc spares while the save is in flight
      CKPTIO_ASSIGN_OR_RETURN(wo.extra_metadata_json, extra_metadata(job.options.metadata_json));
      // Leaves assembled into one chunk: declared before the writer, so that on
      // an error path they outlive its destructor's wait for borrowed reads.
      std::vector<Buffer> assembled;
      // An overwrite waits for the step's readers, and keeps new ones out,
      // from the moment the old step starts going: on an object store the
      // writer removes its objects as it starts (before, the mark was taken
      // only at the commit, and a restore in flight lost its chunks); on
      // POSIX the commit's exchange. (Declared before the writer: released
      // after its destructor's discard.)
      std::optional<ReplaceMark> replacing;
      if (job.options.overwrite && !job.paths.renames) replacing.emplace(this, job.step);
      CKPTIO_ASSIGN_OR_RETURN(auto writer, zarr::EformerStepWriter::start(storage, job.paths.final_dir, job.step, wo));
      std::vector<size_t> ids;
      std::vector<Shape> chunks;
      for (const LeafView& leaf : job.leaves) {
        chunks.push_back(zarr::regular_chunk_shape(leaf.shape, leaf.shards));
        CKPTIO_ASSIGN_OR_RETURN(size_t id, writer->add_array(leaf.prefix, leaf.path, leaf.dtype, leaf.shape, chunks.back()));
        ids.push_back(id);
      }
      for (size_t i = 0; i < job.leaves.size(); ++i) {
        const LeafView& leaf = job.leaves[i];
        const size_t item = dtype_size(leaf.dtype);
        if (!whole_chunks(leaf, chunks[i])) {
          // Shards cut off any one grid (regular_chunk_shape made the leaf one
          // chunk): assembled into it first.
          CKPTIO_ASSIGN_OR_RETURN(Buffer b, assemble(leaf));
          assembled.push_back(std::move(b));
          const Buffer& whole = assembled.back();
          Status w = writer->write_box_borrowed(ids[i], Box::whole(leaf.shape), {whole.data(), whole.size()});
          if (!w.ok()) return w.annotate(leaf.prefix + "/" + leaf.path);
          continue;
        }
        for (const ShardView& s : leaf.shards) {
          const uint64_t n = checked_num_bytes(s.box, item).value_or(0);
          // Borrowed: the writer compresses each chunk straight from the
          // shard (the caller's memory in borrow mode, the job's copy in copy
          // mode), which lives until release() / job.owned.clear(); the
          // writer's destruction at this lambda's end waits on error paths.
          Status w = writer->write_box_borrowed(ids[i], s.box, {static_cast<const std::byte*>(s.data), n});
          if (!w.ok()) return w.annotate(leaf.prefix + "/" + leaf.path);
        }
      }
      writer->wait_borrowed();
      release();  // the writer has read every shard
      stats.write_seconds = since(t0);
      const auto t1 = Clock::now();
      if (job.options.overwrite && !replacing) replacing.emplace(this, job.step);
      Status c = writer->commit();
      stats.commit_seconds = since(t1);
      return c;
    }();
  } catch (...) {
    st = status_of_exception("write the step");
  }
  release();
  if (!st.ok()) {
    st = st.annotate("save step " + std::to_string(job.step) + " (eformer layout)");
    logging::error("ckptio: {}", st.to_string());
  }
  stats.stall_seconds = job.stall_seconds;
  stats.total_seconds = std::chrono::duration<double>(Clock::now() - job.started).count();
  job.owned.clear();
  finish_job(job, st, stats);
}

}  // namespace ckptio
