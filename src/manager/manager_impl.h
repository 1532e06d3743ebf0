// Internals of CheckpointManager, shared by the stages it is a facade over:
// the save pipeline (src/save/submit.cc, src/save/pipeline.cc), discovery
// (discovery.cc), retention and gc (retention.cc, gc.cc) and restore
// (src/restore/restore.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/manager.h"
#include "src/layout/layout.h"
#include "src/save/buffer_pool.h"
#include "src/save/crew.h"

namespace ckptio {

struct SaveJob;

struct CheckpointManager::Impl {
  // Set by the constructor, then read-only.
  CheckpointManager* owner = nullptr;
  StepNaming naming = StepNaming::make("run-{step}").value();
  uint64_t chunk = 0;  // bytes per write request: a multiple of `unit`
  uint64_t unit = 1;   // write_unit() of the storage's write granularity
  uint64_t memory_align = 1;  // Storage::write_memory_alignment(), 1..4096
  uint64_t object_bytes = 0;  // Storage::data_object_bytes(): 0 = one data file
  std::unique_ptr<BufferPool> pool;
  std::unique_ptr<Crew> crew;  // copy mode's copiers beside the caller
  // Copy mode: saves queue and copy in the same order, one at a time. The
  // worker takes chunks in queue order; a save copying ahead of one queued
  // before it would fill the pool with chunks the worker never reaches.
  std::mutex copy_turn;
  std::thread worker;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<std::shared_ptr<SaveJob>> queue;
  int in_flight = 0;
  int retaining = 0;  // retention runs after a save's slot is free (finish_job)
  bool stopping = false;
  Status first_error;
  // What retention after a commit retired (a step out of the committed set)
  // and has yet to remove (its objects or .del- directory): the reaper thread
  // removes them while the next save writes (reap_loop).
  std::deque<std::string> to_reap;  // prefixes queued for the reaper
  int reaping = 0;                  // queued or being removed
  bool reaper_stopping = false;     // set once the worker ended: nothing more to queue
  std::thread reaper;               // when retention is on (max_to_keep, keep_every)
  std::set<std::string> attempts_in_flight;
  // The final directories of eformer saves in flight: on an object store
  // they write there in place, under no attempt id, and gc spares them.
  std::multiset<std::string> eformer_steps_in_flight;
  // The final directories of every save in flight, and of the steps
  // remove_step() is removing: a step is not removed under its own save (on
  // an object store the save writes under the step's prefix, which the
  // removal deletes), nor saved while it is being removed.
  std::multiset<std::string> saves_in_flight;
  std::set<std::string> steps_being_removed;
  // Steps whose index this manager wrote or read whole: retention counts
  // them as intact without reading their index again (retain()).
  std::set<int64_t> known_intact;
  // While a gc runs: every attempt (and eformer step) in flight at any
  // moment of it. gc spares these, not only those in flight when it looks:
  // a save that commits after gc found its step without an index has left
  // the sets above by the time gc removes what it listed.
  int gcs_running = 0;
  std::set<std::string> attempts_seen_by_gc;
  std::set<std::string> eformer_steps_seen_by_gc;
  std::multiset<int64_t> restoring;  // steps restore or verify read now (ReadMark)
  std::set<int64_t> retiring;        // steps retention moves out of the committed set now
  // A step read by restore or verify, from before its index is read until
  // its data is in: retention leaves a marked step alone, and a mark waits
  // for a retirement of its step that has begun (src/manager/retention.cc).
  // Without it a restore that had read step N's index could have N renamed
  // away by the retention after N+1's commit, and report N as damaged.
  class ReadMark {
   public:
    ReadMark(Impl* impl, int64_t step);
    ~ReadMark();
    ReadMark(const ReadMark&) = delete;
    ReadMark& operator=(const ReadMark&) = delete;

   private:
    Impl* impl_;
    int64_t step_;
  };
  // An overwrite's commit of a step (the old step's files move away on
  // POSIX, by RENAME_EXCHANGE): waits until no restore or verify reads the
  // step, and holds new readers off until the commit is done, as retention
  // does. Held only around the publish itself.
  class ReplaceMark {
   public:
    ReplaceMark(Impl* impl, int64_t step);
    ~ReplaceMark();
    ReplaceMark(const ReplaceMark&) = delete;
    ReplaceMark& operator=(const ReplaceMark&) = delete;

   private:
    Impl* impl_;
    int64_t step_;
  };

  // ---- Save (src/save/submit.cc, src/save/pipeline.cc) ----
  // save() after check_process(): takes a slot, queues the job and, in copy
  // mode, copies the state; `called` is when save() was called.
  Result<SaveHandle> submit(int64_t step, std::vector<LeafView>&& state, const SaveOptions& options,
                            std::chrono::steady_clock::time_point called);
  // CheckpointManager::remove_step (src/manager/retention.cc).
  Status remove_step(int64_t step);
  // CheckpointManager::refused_save; and submit's for a save it refused:
  // records the refusal of attempt `n` where the others look.
  Status refused_save(int64_t step, const Status& why);
  Status announce_refusal(int64_t step, const std::string& final_dir, uint64_t n, const Status& why);
  // submit's work once a multi-process save is numbered (`n`, 0 otherwise).
  Result<SaveHandle> submit_attempt(int64_t step, std::vector<LeafView>&& state, const SaveOptions& options,
                                    std::chrono::steady_clock::time_point called, const std::string& final_dir,
                                    uint64_t n);
  // The job of one save, planned: attempt names, float cast, row bands, the
  // data files' layout and write ranges. `group_save`: a multi-process save's
  // count of this process's earlier save() calls of the step (submit.cc).
  Result<std::shared_ptr<SaveJob>> make_job(int64_t step, std::vector<LeafView>&& state,
                                            const SaveOptions& options, const std::string& final_dir,
                                            uint64_t group_save);
  void worker_loop();
  void reap_loop();  // removes what retention after a commit retired
  void run_job(SaveJob& job);
  // ManagerOptions::layout "eformer" (src/save/eformer_save.cc): the job
  // (copy mode: every shard copied now), and its run on the worker.
  Result<std::shared_ptr<SaveJob>> make_eformer_job(int64_t step, std::vector<LeafView>&& state,
                                                    const SaveOptions& options, const std::string& final_dir);
  void run_eformer_job(SaveJob& job);
  // After the commit (or its failure): the callbacks, the handle, retention,
  // and the job's slot.
  void finish_job(SaveJob& job, const Status& st, const SaveStats& stats);

  // ---- Discovery (discovery.cc) ----
  // Index of a step directory: nullopt if it has none (not committed).
  Result<std::optional<Index>> load_index(const std::string& dir);
  // Why step directory `dir` (final name) has no index: kNotFound (not
  // committed), or kDataLoss on a POSIX-like store when it holds objects
  // (a final directory always holds its index there: it was lost).
  Status missing_index(const std::string& dir, int64_t step);
  // Committed steps ascending; with `parse`, steps whose index fails to
  // parse or is missing from a directory holding data (POSIX) are skipped
  // with a warning (an error when strict).
  Result<std::vector<int64_t>> committed_steps(bool parse, bool newest_only);
  // Every step directory, committed or not, with sizes (list_step_dirs()).
  Result<std::vector<StepInfo>> step_dirs();

  // ---- Retention and gc (retention.cc, gc.cc) ----
  // Retention (apply_retention); the steps deleted go to `deleted` when given.
  // With `reap`, each step is only retired (out of the committed set, at
  // once) and the prefix left to remove is added to *reap; without, it is
  // deleted whole before this returns. `committed`: the step whose commit
  // ran this retention, kept whatever its number (not counted among the
  // newest max_to_keep when older than them).
  Status retain(int max_to_keep, int64_t keep_every, std::vector<int64_t>* deleted,
                std::vector<std::string>* reap = nullptr, std::optional<int64_t> committed = std::nullopt);
  // gc() in the process that made the manager.
  Status gc(const GcOptions& options);

  // ---- Restore (src/restore/restore.cc) ----
  // Restores the step `index` describes (restore() after choosing it). Once
  // the data is read, the selected leaves' paths and shapes are moved out of
  // `index` into the result (no copy per leaf): the caller discards it.
  Result<RestoredState> restore_index(Index& index, const RestoreOptions& options);
  Result<RestoredState> restore_index_taking_memory(Index& index, const RestoreOptions& options);
};

}  // namespace ckptio
