// Internals of CheckpointManager shared by manager.cc and restore.cc.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ckptio/manager.h"
#include "src/layout.h"
#include "src/staging.h"

namespace ckptio {

struct SaveHandle::State {
  int64_t step = 0;
  int pid = 0;  // the process whose manager runs the save (a forked child's copy never finishes)
  mutable std::mutex mu;  // guards the fields below
  mutable std::condition_variable cv;
  bool done = false;
  bool released = false;
  bool stall_known = false;  // save() returned and set stats.stall_seconds
  Status status;
  SaveStats stats;

  void set_released();
  void set_stall(double seconds);
  void finish(Status st, const SaveStats& s);
};

struct SaveJob;

struct CheckpointManager::Impl {
  CheckpointManager* owner = nullptr;
  StepNaming naming = StepNaming::make("run-{step}").value();
  uint64_t chunk = 0;  // bytes per write request: a multiple of `unit`
  uint64_t unit = 1;   // write_unit() of the storage's write granularity
  uint64_t memory_align = 1;  // Storage::write_memory_alignment(), 1..4096
  uint64_t object_bytes = 0;  // Storage::data_object_bytes(): 0 = one data file
  std::unique_ptr<BufferPool> pool;
  std::unique_ptr<Crew> crew;  // copy mode's copiers beside the caller
  std::thread worker;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<std::shared_ptr<SaveJob>> queue;
  int in_flight = 0;
  bool stopping = false;
  Status first_error;
  std::set<std::string> attempts_in_flight;
  std::multiset<int64_t> restoring;
  std::map<int64_t, uint64_t> group_saves;  // multi-process saves begun, per step

  void worker_loop();
  void run_job(SaveJob& job);
  // `queued` runs once every write is queued and every checksum in `crcs`
  // is known, while the writes drain and the files are made durable.
  Status write_data(SaveJob& job, std::vector<uint32_t>& crcs, double& write_seconds,
                    const std::function<void()>& queued = {});
  void drain_ready(SaveJob& job);
  Index build_index(const SaveJob& job, const std::vector<uint32_t>& crcs);
  // The index with every checksum 0, and where each planned shard's goes.
  struct BuiltIndex {
    Index index;
    std::vector<uint32_t*> crc_of;  // per job.plan.shards
  };
  BuiltIndex build_index(const SaveJob& job);
  // A multi-process save after this process's writes (`own`): manifest,
  // then the coordinator merges and commits, the others learn the outcome.
  Status commit_group(SaveJob& job, const std::vector<uint32_t>& crcs, Status own, double& commit_seconds);

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
  // Retention (apply_retention); the steps deleted go to `deleted` when given.
  Status retain(int max_to_keep, int64_t keep_every, std::vector<int64_t>* deleted);
  // Restores the step `index` describes (restore() after choosing it). Once
  // the data is read, the selected leaves' paths and shapes are moved out of
  // `index` into the result (no copy per leaf): the caller discards it.
  Result<RestoredState> restore_index(Index& index, const RestoreOptions& options);
};

}  // namespace ckptio
