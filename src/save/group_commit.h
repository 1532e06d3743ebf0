// The commit of a multi-process save (ManagerOptions::processes; the
// protocol is written out in group_commit.cc and docs/multiprocess.md).
#pragma once

#include <cstdint>
#include <string>

#include "ckptio/index.h"
#include "ckptio/manager.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "src/save/commit.h"

namespace ckptio {

// The attempt id every process of a group derives alike for the n-th save
// (n counted per step from 0) of `step`: 16 hex digits of a hash of
// (run_id, step, n). A restarted job has a new run_id, so it never reuses a
// dead run's names.
std::string group_attempt_id(const std::string& run_id, int64_t step, uint64_t n);

// OK if `group` is usable (index in range, run_id present and safe when
// count > 1, a positive timeout); kInvalidArgument otherwise.
Status check_process_group(const ProcessGroup& group);

// The data file one process writes: "data-<attempt>-p<index>-0.bin".
std::string group_data_file(const std::string& attempt, int process_index, size_t n = 0);

// Whether the committed index at `final_dir` lists data file `file`: false
// when there is no index (or one that does not parse); the read's error when
// it cannot be read.
Result<bool> index_lists(Storage& storage, const std::string& final_dir, const std::string& file);

struct GroupSave {
  Storage& storage;
  const ProcessGroup& group;
  const AttemptPaths& paths;
  int64_t step = 0;
};

// Every process, after its data is durable (or its writes failed: `own`):
// writes its manifest, with `partial` (its leaves and data file) or the
// error. Then, with a trainer's barrier, waits at "written".
Status publish_manifest(const GroupSave& g, const Index& partial, const Status& own);

// The coordinator, after publish_manifest: every manifest of the attempt,
// merged and checked (merge_manifests). Without a barrier it polls the
// storage until all are present, one reports an error, or the timeout.
Result<Index> gather_manifests(const GroupSave& g);

// The coordinator, once it committed (`outcome` OK) or gave up: records a
// failure for the others, waits at the barrier's "decided" if there is one,
// and removes the manifests of a committed step.
void announce_outcome(const GroupSave& g, const Status& outcome);

// The other processes: waits until the coordinator committed this attempt
// (OK), recorded a failure (kFailedPrecondition with its message), or the
// timeout passed (kUnavailable). `*decided` is set only for the first two:
// after a timeout or a storage or barrier error the coordinator may still
// commit the step, naming this process's data files.
Status await_outcome(const GroupSave& g, bool* decided);

}  // namespace ckptio
