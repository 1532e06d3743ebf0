// The save pipeline: one save's path from save() to its callbacks.
//
// save() on the caller's thread (submit.cc): validate, wait for an in-flight
// slot, cast (if asked), plan the data file and cut it into write ranges
// (save_plan.h; chunks are a multiple of the backend's write granularity),
// then
//   copy mode:   copy the state range by range into pool buffers, computing
//                the shards' crc32c on the way, and hand each buffer to the
//                worker (blocks only while the pool is full; stage.h);
//   borrow mode: nothing more; the worker reads the caller's buffers.
// The worker thread (this file), one job at a time, for each range in file
// order (write_data.cc):
//   staged (copy mode): take the buffer the caller filled (and checksummed,
//                block by block as it copied), queue its write;
//   staged (borrow):   copy the pieces into a pool buffer and checksum them
//                block by block while they are hot in cache, queue the write;
//   direct (borrow):   queue the write straight from the caller's memory
//                (zero copy: on O_DIRECT files large shards are placed so
//                that their address and file offset agree modulo 4096, see
//                plan_save; object stores take any address), then
//                checksum those bytes while the device reads them.
// Then wait for the writes (borrow mode releases the caller's buffers only
// now: direct writes read them until they complete); finish() (fsync); write
// the index (prepare_index.cc, alongside the writes) and commit (commit.cc;
// a multi-process save through group_commit.cc); run the callback; retention.

#include <pthread.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckptio/index.h"
#include "src/manager/manager_impl.h"
#include "src/save/build_index.h"
#include "src/save/commit.h"
#include "src/save/group_commit.h"
#include "src/save/prepare_index.h"
#include "src/save/save_job.h"
#include "src/save/write_data.h"
#include "src/util/allocate.h"
#include "src/util/callback.h"
#include "src/util/clock.h"
#include "src/util/log.h"

namespace ckptio {
namespace {

// A single-process save's commit: once the index prepared alongside the
// writes is staged and reads back, and the writes succeeded (`written`),
// the step is published.
Status commit_single(CheckpointManager::Impl& impl, Storage& storage, const SaveJob& job, IndexPreparer& index,
                     Status written, double& commit_seconds, bool* outcome_unknown) {
  const auto t0 = std::chrono::steady_clock::now();
  Status st = std::move(written);
  Status prepared_index = index.verdict();  // (also when the writes failed: nothing may still be staging)
  if (st.ok()) st = prepared_index;
  std::optional<CheckpointManager::Impl::ReplaceMark> replacing;  // (an overwrite waits for the step's readers)
  if (st.ok() && job.options.overwrite) replacing.emplace(&impl, job.step);
  if (st.ok()) st = publish_attempt(storage, job.paths, index.json(), job.options.overwrite, outcome_unknown);
  commit_seconds = seconds_since(t0);
  return st;
}

// A multi-process save after this process's writes (`own`): manifest, then
// the coordinator merges and commits, the others learn the outcome.
// `*outcome_unknown`: the step may yet be committed naming this process's
// data files (a process that timed out waiting for the coordinator, which
// may be about to commit), so they must be left for gc.
Status commit_group(CheckpointManager::Impl& impl, Storage& storage, const ProcessGroup& group, const SaveJob& job,
                    const std::vector<uint32_t>& crcs, Status own, double& commit_seconds,
                    bool* outcome_unknown) {
  const auto t0 = std::chrono::steady_clock::now();
  const GroupSave g{storage, group, job.paths, job.step};
  Status st = publish_manifest(g, own.ok() ? build_index(job, crcs) : Index{}, own);
  if (group.index != 0) {
    bool decided = false;
    Status outcome = await_outcome(g, &decided);
    commit_seconds = seconds_since(t0);
    // A manifest that reports our failure (or none) keeps our files out of
    // any index the coordinator commits.
    if (!own.ok()) return own;
    // Committed with our manifest, even if its put reported an error after
    // it took effect (a failed directory fsync after the rename): the step
    // holds our data, durable before the manifest was written.
    if (outcome.ok()) return outcome;
    if (!decided) *outcome_unknown = true;
    return st.ok() ? outcome : st;
  }
  if (!own.ok()) st = own;
  if (st.ok()) {
    auto merged = gather_manifests(g);
    if (merged.ok()) {
      Index& index = *merged;
      index.step = job.step;
      index.created_unix_ns = job.created_unix_ns;
      index.committed_unix_ns = unix_ns_now();
      index.metadata_json = job.options.metadata_json.empty() ? "{}" : job.options.metadata_json;
      std::string json = serialize_index(index);
      auto check = json.empty() ? Result<Index>(out_of_memory("serialize the merged index")) : parse_index(json);
      std::optional<CheckpointManager::Impl::ReplaceMark> replacing;  // (an overwrite waits for the step's readers)
      if (check.ok() && job.options.overwrite) replacing.emplace(&impl, job.step);
      st = check.ok() ? commit_attempt(storage, job.paths, json, job.options.overwrite, outcome_unknown)
                      : check.status().annotate("internal: merged index fails to parse");
    } else {
      st = merged.status();
    }
  }
  announce_outcome(g, st);
  commit_seconds = seconds_since(t0);
  return st;
}

// After a multi-process save failed: whether the step's index may still name
// this process's data files (the coordinator's index PUT may have stored it
// although the step was reported failed, and the index cannot be read). Such
// files are left for gc, which removes them unless an index names them.
bool index_may_name(Storage& storage, const SaveJob& job) {
  if (job.data_files.empty()) return false;
  auto listed = index_lists(storage, job.paths.final_dir, job.data_files.front());
  return !listed.ok() || *listed;
}

// Removes what a failed save wrote, unless a committed index may name it.
void discard_failed(Storage& storage, const SaveJob& job, bool outcome_unknown) {
  if (job.group) {  // the staging directory is shared: only this process's files
    if (!outcome_unknown && !index_may_name(storage, job))
      for (const std::string& f : job.data_files) (void)storage.remove(job.paths.stage_dir + "/" + f);
  } else if (!outcome_unknown) {  // (else a committed index may name them; gc removes them if not)
    discard_attempt(storage, job.paths, job.data_files);
  }
}

// A caller's callback on the worker thread: what it throws is logged.
template <typename F>
void run_callback(const char* name, int64_t step, F&& call) {
  Status st = call_callback(name, std::forward<F>(call));
  if (!st.ok()) logging::error("ckptio: step {}: {}", step, st.message());
}

}  // namespace

void CheckpointManager::Impl::worker_loop() {
  pthread_setname_np(pthread_self(), "ckptio-save");
  for (;;) {
    std::shared_ptr<SaveJob> job;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      job = queue.front();
      queue.pop_front();
      // Removal keeps pace with the saves: a save's writes may overlap the
      // removal of what retention retired after the commit before it, not
      // more, so that old steps' bytes cannot pile up on the disk when
      // removing is slower than saving.
      cv.wait(lock, [&] { return reaping <= 1; });
    }
    run_job(*job);
  }
}

void CheckpointManager::Impl::run_job(SaveJob& job) {
  if (job.eformer) {
    run_eformer_job(job);
    return;
  }
  Storage& storage = owner->storage();
  SaveStats stats;
  stats.bytes = job.plan.bytes();
  stats.stall_seconds = job.stall_seconds;

  std::vector<uint32_t> crcs;
  // A single-process save's index is prepared while the data is written
  // (IndexPreparer). It lives to the end of the job: its thread frees the
  // indexes while the commit publishes, and is waited for only here.
  // Without the memory for it the save fails, once the write stage has
  // drained what the copiers staged (job.fail stops them).
  std::optional<IndexPreparer> index;
  try {
    if (!job.group) index.emplace(storage, job, crcs);
  } catch (...) {
    job.fail(status_of_exception("prepare the index"));
  }
  auto tell = [&](bool ok) {
    if (index) index->checksums_known(ok);
  };
  bool outcome_unknown = false;  // the step may still be (or have been) committed: keep the files
  // What the write stage throws (std::bad_alloc where the system refuses
  // memory) fails this save, not the process: write_data catches it while
  // queueing, and waits for what is in flight before anything it throws
  // later (finishing the files) can unwind.
  Status st;
  try {
    st = write_data(storage, *pool, job, crcs, stats.write_seconds, [&] { tell(true); });
  } catch (...) {
    st = status_of_exception("write data");
  }
  tell(st.ok());  // (the writes failed before all were queued, or none was)
  // What the commit throws fails this save too: nothing of the commit is in
  // flight then. The step may have been committed before the throw, so its
  // files stay for gc, as after an answer lost on its way back.
  try {
    if (job.group)
      st = commit_group(*this, storage, owner->options().processes, job, crcs, st, stats.commit_seconds,
                        &outcome_unknown);
    else if (index)  // (else the save failed without one: st says why)
      st = commit_single(*this, storage, job, *index, st, stats.commit_seconds, &outcome_unknown);
  } catch (...) {
    st = status_of_exception("commit");
    outcome_unknown = true;
  }
  if (!st.ok()) {
    discard_failed(storage, job, outcome_unknown);
    st = st.annotate("save step " + std::to_string(job.step));
    logging::error("ckptio: {}", st.to_string());
  } else {
    logging::debug("ckptio: committed step {} ({} bytes)", job.step, stats.bytes);
  }
  stats.stall_seconds = job.stall_seconds;
  stats.total_seconds = seconds_since(job.started);
  job.owned.clear();
  finish_job(job, st, stats);
}

void CheckpointManager::Impl::finish_job(SaveJob& job, const Status& st, const SaveStats& stats) {
  const ManagerOptions& options = owner->options();
  // The callback runs before the handle completes, so that a caller who
  // waited on the handle knows its callback has run.
  if (options.on_commit)
    run_callback("on_commit", job.step, [&] { options.on_commit(CommitEvent{job.step, st, stats}); });
  // Nothing from here may throw (the worker goes on to the next save): the
  // copies of an error fall back to a bare kResourceExhausted, and what
  // retention throws is its failure.
  // The step is no longer under a save here before the handle completes: a
  // caller who waited on the handle may remove the step (or save it again)
  // at once.
  {
    std::lock_guard lock(mu);
    attempts_in_flight.erase(job.paths.attempt);
    if (auto it = saves_in_flight.find(job.paths.final_dir); it != saves_in_flight.end()) saves_in_flight.erase(it);
    if (auto it = eformer_steps_in_flight.find(job.paths.final_dir); job.eformer && it != eformer_steps_in_flight.end())
      eformer_steps_in_flight.erase(it);
  }
  job.handle->finish(status_or_out_of_memory([&] { return st; }), stats);
  Status kept = st.ok() ? Status() : status_or_out_of_memory([&] { return st; });
  // Retention is the committer's job: process 0 of a group (the reaper
  // runs only there).
  const bool retention = st.ok() && reaper.joinable();
  // The save's slot is free before retention deletes old steps: a save()
  // called as soon as this one's handle completed would otherwise block
  // until the deletions are done (245-365 ms per 2 GiB step measured from
  // Python with max_to_keep=2). wait_until_finished() still waits for
  // retention (`retaining`).
  {
    std::lock_guard lock(mu);
    try {
      if (st.ok()) known_intact.insert(job.step);
    } catch (...) {  // (std::bad_alloc: retention reads its index instead)
    }
    if (!kept.ok() && first_error.ok()) first_error = std::move(kept);
    --in_flight;
    if (retention) ++retaining;
  }
  cv.notify_all();
  if (!retention) return;
  // Here, in commit order, old steps only leave the committed set (a
  // rename, or an index deleted); the reaper removes their bytes while the
  // next save writes (the next save waited for that before: 0.1-0.2 s per
  // GiB on local disk, bench/back_to_back.py).
  // (What it throws retired some steps at most: their bytes stay for gc.)
  RetentionEvent r;
  r.after_step = job.step;
  std::vector<std::string> reap;
  try {
    r.status = retain(options.max_to_keep, options.keep_every, &r.deleted, &reap, job.step);
    if (!reap.empty()) {
      {
        std::lock_guard lock(mu);
        to_reap.insert(to_reap.end(), reap.begin(), reap.end());  // all or nothing
        reaping += static_cast<int>(reap.size());
      }
      cv.notify_all();
    }
  } catch (...) {
    r.status = status_of_exception("retention (gc removes what it retired)");
  }
  if (!r.status.ok()) logging::warn("ckptio: retention after step {}: {}", job.step, r.status.to_string());
  if (options.on_retention) run_callback("on_retention", job.step, [&] { options.on_retention(r); });
  {
    std::lock_guard lock(mu);
    --retaining;
  }
  cv.notify_all();
}

void CheckpointManager::Impl::reap_loop() {
  pthread_setname_np(pthread_self(), "ckptio-reap");  // (top -H, gdb; the allocation sweeps find it so)
  for (;;) {
    std::string prefix;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return reaper_stopping || !to_reap.empty(); });
      if (to_reap.empty()) return;
      prefix = std::move(to_reap.front());
      to_reap.pop_front();
    }
    // The step is retired already: a failure here leaves bytes for gc (a
    // .del- directory, or objects no index references), never a step. What
    // the removal throws (std::bad_alloc) is such a failure: nothing leaves
    // this thread.
    Status st = returning_exceptions("remove a retired step", [&] { return owner->storage().remove_prefix(prefix); });
    if (!st.ok())
      logging::quietly([&] {
        logging::warn("ckptio: retention: removing {}: {} (gc removes what is left)", prefix, st.to_string());
      });
    {
      std::lock_guard lock(mu);
      --reaping;
    }
    cv.notify_all();
  }
}

}  // namespace ckptio
