// save() on the caller's thread: checks, an in-flight slot, the job planned
// and queued for the worker, and in copy mode the copy into the pool (the
// whole pipeline is described at the top of pipeline.cc).

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "src/layout/layout.h"
#include "src/manager/manager_impl.h"
#include "src/save/commit.h"
#include "src/save/group_commit.h"
#include "src/save/save_job.h"
#include "src/save/save_plan.h"
#include "src/save/stage.h"
#include <cstring>

#include "src/layout/zarr/eformer_index.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/save/validate.h"
#include "src/transform/cast.h"
#include "src/util/clock.h"
#include "src/util/log.h"

namespace ckptio {
namespace {

// What save() refuses before it takes a slot.
Status check_save(int64_t step, const std::vector<LeafView>& state, const SaveOptions& options,
                  const ProcessGroup& group) {
  if (step < 0) return invalid_argument("step must be >= 0, got " + std::to_string(step));
  CKPTIO_RETURN_IF_ERROR(check_process_group(group));
  CKPTIO_RETURN_IF_ERROR(validate_leaves(state, /*partial=*/group.count > 1));
  if (!options.metadata_json.empty()) CKPTIO_RETURN_IF_ERROR(check_metadata_json(options.metadata_json));
  if (options.float_dtype && !dtype_is_float(*options.float_dtype))
    return invalid_argument("float_dtype must be a float dtype");
  if (options.row_band_ways > kMaxRowBandWays)
    return invalid_argument("row_band_ways must be at most " + std::to_string(kMaxRowBandWays) + ", got " +
                            std::to_string(options.row_band_ways));
  return Status::OK();
}

// The n of group_attempt_id: this process's save() calls of `final_dir` at
// `where` under the group's run id and index. Counted for the process, not
// per manager: a manager made anew in the same run would otherwise name its
// attempt like an earlier, failed one of the step, whose manifests and
// failure record are still there; another process then took that old
// failure for this attempt's and deleted its data file under the step the
// coordinator went on to commit. (Never freed: at exit a save may still run.)
uint64_t next_group_save(const std::string& where, const ProcessGroup& group, const std::string& final_dir) {
  struct Counts {
    std::mutex mu;
    std::map<std::string, uint64_t> saves;
  };
  static Counts& counts = *new Counts;
  std::lock_guard lock(counts.mu);
  return counts.saves[where + '\n' + group.run_id + '\n' + std::to_string(group.index) + '\n' + final_dir]++;
}

// eformer's float_dtype: casts the job's float leaves now, into buffers the
// job owns.
Status cast_floats(SaveJob& job, DType to) {
  for (LeafView& leaf : job.leaves) {
    if (!dtype_is_float(leaf.dtype) || leaf.dtype == to) continue;
    for (ShardView& sh : leaf.shards) {
      uint64_t n = checked_num_bytes(sh.box).value_or(0);
      Buffer b = Buffer::allocate(n * dtype_size(to));
      CKPTIO_RETURN_IF_ERROR(cast_elements(leaf.dtype, to, sh.data, b.data(), n));
      sh.data = b.data();
      job.owned.push_back(std::move(b));
    }
    leaf.dtype = to;
  }
  return Status::OK();
}

// A job's fields every save sets alike, whatever its layout.
std::shared_ptr<SaveJob> new_job(int64_t step, std::vector<LeafView>&& state, const SaveOptions& options,
                                 bool copy_mode, int pid) {
  auto job = std::make_shared<SaveJob>();
  job->step = step;
  job->leaves = std::move(state);
  job->options = options;
  job->copy_mode = copy_mode;
  job->handle = std::make_shared<SaveHandle::State>();
  job->handle->pid = pid;
  job->handle->step = step;
  return job;
}

}  // namespace

Result<SaveHandle> CheckpointManager::Impl::submit(int64_t step, std::vector<LeafView>&& state,
                                                   const SaveOptions& options,
                                                   std::chrono::steady_clock::time_point t0) {
  const std::string final_dir = naming.name(step);
  const ProcessGroup& group = owner->options().processes;
  if (group.count <= 1) return submit_attempt(step, std::move(state), options, t0, final_dir, 0);
  // A multi-process save's attempt is numbered before anything may refuse
  // it: every process counts every save() of a step, so that one refused on
  // some process only (an invalid state there, a step committed meanwhile)
  // leaves the next save of the step with the same attempt id everywhere.
  const uint64_t n = next_group_save(owner->storage().describe(), group, final_dir);
  Result<SaveHandle> h = submit_attempt(step, std::move(state), options, t0, final_dir, n);
  if (!h.ok()) {
    if (Status st = announce_refusal(step, final_dir, n, h.status().annotate("save() refused it")); !st.ok())
      logging::warn("ckptio: could not tell the other processes that save() of step {} was refused: {}", step,
                    st.to_string());
  }
  return h;
}

Status CheckpointManager::Impl::refused_save(int64_t step, const Status& why) {
  const ProcessGroup& group = owner->options().processes;
  if (group.count <= 1) return Status::OK();
  const std::string final_dir = naming.name(step);
  const uint64_t n = next_group_save(owner->storage().describe(), group, final_dir);
  return announce_refusal(step, final_dir, n, why.ok() ? invalid_argument("refused by the caller") : why);
}

Status CheckpointManager::Impl::announce_refusal(int64_t step, const std::string& final_dir, uint64_t n,
                                                 const Status& why) {
  const ProcessGroup& group = owner->options().processes;
  if (step < 0 || group.barrier || !check_process_group(group).ok()) return Status::OK();
  // The others would wait for this process's manifest (process 0's
  // outcome) until the timeout: record the refusal where they look, so
  // that the attempt fails at once on every process. (With a trainer's
  // barrier they wait at it instead, as for a process that died.)
  const AttemptPaths paths = plan_attempt(owner->storage(), final_dir, group_attempt_id(group.run_id, step, n));
  const GroupSave g{owner->storage(), group, paths, step};
  if (group.index == 0) {
    announce_outcome(g, why);
    return Status::OK();
  }
  return publish_manifest(g, Index{}, why);
}

Result<SaveHandle> CheckpointManager::Impl::submit_attempt(int64_t step, std::vector<LeafView>&& state,
                                                           const SaveOptions& options,
                                                           std::chrono::steady_clock::time_point t0,
                                                           const std::string& final_dir, uint64_t n) {
  const int64_t created = unix_ns_now();
  const ProcessGroup& group = owner->options().processes;
  CKPTIO_RETURN_IF_ERROR(check_save(step, state, options, group));
  // The worker runs on_commit and on_retention: a save from there would wait
  // for a slot (or, in copy mode, for pool buffers) that only the worker frees.
  if (std::this_thread::get_id() == worker.get_id())
    return Status(Code::kFailedPrecondition,
                  "save() from a callback of the same checkpoint manager (on_commit, on_retention): it would "
                  "wait for the worker that runs the callback; save from the training thread instead");

  // Wait for a slot: at most max_in_flight saves are queued or running.
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return in_flight < owner->options().max_in_flight; });
    ++in_flight;
  }
  // The slot goes back when the save is refused, also by what throws
  // (std::bad_alloc: CheckpointManager::save turns it into a Status), until
  // the job is queued. Once queued, nothing below throws (copy_state
  // publishes every range it claims), and the worker frees the slot.
  struct Slot {
    Impl& impl;
    bool held = true;
    void release() {
      if (!std::exchange(held, false)) return;
      {
        std::lock_guard lock(impl.mu);
        --impl.in_flight;
      }
      impl.cv.notify_all();
    }
    ~Slot() { release(); }
  } slot{*this};

  const bool eformer = owner->options().layout == zarr::kEformerLayout;
  if (!options.overwrite && !eformer) {  // (the eformer writer refuses an existing step itself)
    Storage& storage = owner->storage();
    // Its index, or the metadata.json of a step in eformer's layout (which
    // discovery counts as committed).
    auto st = storage.stat(index_key(final_dir));
    if (!st.ok()) st = storage.stat(final_dir + "/" + std::string(zarr::kEformerMetadataName));
    if (st.ok()) {
      slot.release();
      return Status(Code::kAlreadyExists, "step " + std::to_string(step) + " is already committed at " +
                                              storage.describe() + "/" + final_dir +
                                              " (pass overwrite to replace it)");
    }
  }
  Result<std::shared_ptr<SaveJob>> planned = internal_error("unplanned");
  try {  // (the plan's vectors, float_dtype's cast copies, the eformer layout's copies)
    planned = eformer ? make_eformer_job(step, std::move(state), options, final_dir)
                      : make_job(step, std::move(state), options, final_dir, n);
  } catch (const std::bad_alloc&) {
    planned = out_of_memory("planning the save of step " + std::to_string(step));
  }
  if (!planned.ok()) {
    slot.release();
    return planned.status();
  }
  std::shared_ptr<SaveJob> job = std::move(planned).value();
  job->started = t0;
  job->created_unix_ns = created;

  // Copy mode: this save's turn to queue and copy (see copy_turn).
  std::unique_lock<std::mutex> turn;
  if (job->copy_mode && !job->eformer) turn = std::unique_lock(copy_turn);
  {
    std::lock_guard lock(mu);
    // All or nothing: a throw takes back what was inserted (the attempt id
    // is new; the step's name may be in flight already, so only this one).
    if (steps_being_removed.count(job->paths.final_dir))
      return Status(Code::kFailedPrecondition, "step " + std::to_string(step) +
                                                   " is being removed (remove_step) in this manager");
    std::multiset<std::string>::iterator eformer_step = eformer_steps_in_flight.end(), save = saves_in_flight.end();
    bool in_flight_set = false, seen_by_gc = false, step_seen_by_gc = false;
    try {
      save = saves_in_flight.insert(job->paths.final_dir);
      in_flight_set = attempts_in_flight.insert(job->paths.attempt).second;
      if (job->eformer) eformer_step = eformer_steps_in_flight.insert(job->paths.final_dir);
      if (gcs_running > 0) {
        seen_by_gc = attempts_seen_by_gc.insert(job->paths.attempt).second;
        if (job->eformer) step_seen_by_gc = eformer_steps_seen_by_gc.insert(job->paths.final_dir).second;
      }
      queue.push_back(job);
    } catch (...) {
      if (save != saves_in_flight.end()) saves_in_flight.erase(save);
      if (in_flight_set) attempts_in_flight.erase(job->paths.attempt);
      if (eformer_step != eformer_steps_in_flight.end()) eformer_steps_in_flight.erase(eformer_step);
      if (seen_by_gc) attempts_seen_by_gc.erase(job->paths.attempt);
      if (step_seen_by_gc) eformer_steps_seen_by_gc.erase(job->paths.final_dir);
      throw;
    }
    slot.held = false;  // the worker's now
  }
  cv.notify_all();

  if (job->copy_mode && job->eformer) {
    job->handle->set_released();  // make_eformer_job copied every shard
  } else if (job->copy_mode) {
    // Copy on the caller's thread and the crew; each chunk goes to the worker
    // as soon as it is full. Blocks only while every pool buffer is in use.
    // Checksums are computed here, block by block as each is copied (see
    // kCopyBlock), per piece; the worker joins them in order.
    (void)pool->reserve(job->ranges.size());  // refused: the pool goes on with what it has, or the copy fails
    copy_state(*job, *pool, *crew);
    job->handle->set_released();
  }
  // The worker may already be done with a small save: the handle keeps the
  // stall whichever of the two writes its stats first.
  job->stall_seconds = seconds_since(t0);
  job->handle->set_stall(job->stall_seconds);
  return SaveHandle(job->handle);
}

Result<std::shared_ptr<SaveJob>> CheckpointManager::Impl::make_job(int64_t step, std::vector<LeafView>&& state,
                                                                   const SaveOptions& options,
                                                                   const std::string& final_dir,
                                                                   uint64_t group_save) {
  Storage& storage = owner->storage();
  const ProcessGroup& group = owner->options().processes;
  const bool multi = group.count > 1;
  auto job = new_job(step, std::move(state), options, owner->options().staging == StagingMode::kCopy,
                     owner->made_by_pid_);
  if (multi) {
    // Every process names this attempt alike (see src/save/group_commit.cc).
    job->paths = plan_attempt(storage, final_dir, group_attempt_id(group.run_id, step, group_save));
    job->group = true;
  } else {
    job->paths = plan_attempt(storage, final_dir);
  }
  job->chunk = chunk;

  if (options.float_dtype) CKPTIO_RETURN_IF_ERROR(cast_floats(*job, *options.float_dtype));
  split_row_bands(job->leaves, options.row_band_ways, row_band_min_bytes());
  // Borrow mode writes large shards straight from the caller's memory. A
  // backend that needs aligned data pointers (O_DIRECT) gets their file
  // offsets following their addresses modulo that alignment, so that the
  // aligned middle of each qualifies; elsewhere (object stores, buffered
  // files) the shards are packed: padding would split the restore's reads.
  const bool zero_copy = !job->copy_mode;
  job->unit = unit;
  const uint64_t mem = memory_align;
  job->plan = plan_save(job->leaves, zero_copy && mem > 1 ? mem : 0, object_bytes, job->unit);
  job->ranges = plan_write_ranges(job->plan, job->chunk, job->unit, zero_copy, mem);
  job->handle->total.store(job->plan.bytes(), std::memory_order_release);
  for (size_t f = 0; f < job->plan.files.size(); ++f)
    job->data_files.push_back(multi ? group_data_file(job->paths.attempt, group.index, f)
                                    : data_file_name(job->paths.attempt, static_cast<int>(f)));
  if (job->copy_mode) job->chunks.resize(job->ranges.size());  // before the worker sees the job
  return job;
}

// An eformer save (ManagerOptions::layout): no data file plan; the worker
// hands each shard to the eformer writer (src/save/eformer_save.cc). Copy
// mode copies every shard now, so that save() returns with the caller's
// memory free; borrow mode keeps the views until the writer has read them.
Result<std::shared_ptr<SaveJob>> CheckpointManager::Impl::make_eformer_job(int64_t step,
                                                                           std::vector<LeafView>&& state,
                                                                           const SaveOptions& options,
                                                                           const std::string& final_dir) {
  if (owner->options().processes.count > 1)
    return Status(Code::kUnimplemented, "multi-process saves in the eformer layout are not supported yet "
                                        "(ManagerOptions::layout \"eformer\"; save in \"ckptio\" and "
                                        "convert with `ckptio cp --format eformer`)");
  auto job = new_job(step, std::move(state), options, owner->options().staging == StagingMode::kCopy,
                     owner->made_by_pid_);
  job->eformer = true;
  job->paths.final_dir = final_dir;
  job->paths.attempt = new_attempt_id();
  if (options.float_dtype) CKPTIO_RETURN_IF_ERROR(cast_floats(*job, *options.float_dtype));
  uint64_t total = 0;
  for (LeafView& leaf : job->leaves) {
    const size_t item = dtype_size(leaf.dtype);
    for (ShardView& sh : leaf.shards) {
      const uint64_t n = checked_num_bytes(sh.box, item).value_or(0);
      total += n;
      if (!job->copy_mode) continue;
      Buffer b = Buffer::allocate(std::max<uint64_t>(n, 1));
      if (n) std::memcpy(b.data(), sh.data, n);  // (an empty shard's data may be null: memcpy's UB)
      sh.data = b.data();
      job->owned.push_back(std::move(b));
    }
  }
  job->handle->total.store(total, std::memory_order_release);
  return job;
}

}  // namespace ckptio
