// The commit protocol, chosen from the backend's capabilities (see commit.cc).
#pragma once

#include <string>
#include <string_view>

#include "ckptio/index.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"

namespace ckptio {

// Where one save attempt puts its objects.
struct AttemptPaths {
  std::string final_dir;  // "run-12"
  std::string stage_dir;  // "run-12.tmp-<attempt>" (POSIX) or == final_dir
  std::string attempt;
  bool renames = false;   // POSIX protocol (stage, then rename)
};

AttemptPaths plan_attempt(const Storage& storage, const std::string& final_dir);
// The same with a given attempt id (a multi-process save's shared one).
AttemptPaths plan_attempt(const Storage& storage, const std::string& final_dir, const std::string& attempt);

// Makes the staged step visible at its final name. Every data object must be
// durable already. `overwrite` replaces a committed step atomically. On an
// object store, an index PUT that failed in a way that may come after the
// object was stored is settled by reading the index back (ours: committed);
// when even that fails, the error comes with `*outcome_unknown` set: the
// caller must then not discard the attempt's data (a committed index may
// point to it; gc removes it if not).
Status commit_attempt(Storage& storage, const AttemptPaths& paths, const std::string& index_json,
                      bool overwrite, bool* outcome_unknown = nullptr);

// commit_attempt in two halves, for a caller that writes the index while the
// data is still being written and checks it meanwhile: stage_index writes it
// where no reader looks yet (POSIX: into the stage directory, made durable;
// an object store: nothing, since there writing the index is the commit);
// publish_attempt, once every data object is durable and the index staged,
// makes the stage directory's names durable and the step visible.
Status stage_index(Storage& storage, const AttemptPaths& paths, const std::string& index_json);
// `index_json` is what the stage holds at `marker_name` (an eformer step:
// its metadata.json): a failure once the step may have been renamed is
// settled by reading it back, and such a step is moved back to its stage
// name, for the caller to discard (or *outcome_unknown set).
Status publish_attempt(Storage& storage, const AttemptPaths& paths, const std::string& index_json,
                       bool overwrite, bool* outcome_unknown = nullptr,
                       std::string_view marker_name = kIndexFileName);

// Removes what a failed attempt wrote (never a committed step's objects).
void discard_attempt(Storage& storage, const AttemptPaths& paths,
                     const std::vector<std::string>& data_files);
// discard_attempt() while an exception unwinds: what it throws itself
// (std::bad_alloc) leaves the rest for gc.
inline void discard_attempt_nothrow(Storage& storage, const AttemptPaths& paths,
                                    const std::vector<std::string>& data_files) noexcept {
  try {
    discard_attempt(storage, paths, data_files);
  } catch (...) {
  }
}

// Takes a committed step out of the committed set in one atomic, durable
// step: POSIX renames it to <dir>.del-<id> and syncs the parent; an object
// store deletes its index (and an eformer step's metadata.json). Returns the
// prefix whose objects are left to remove (remove_prefix); gc removes them if
// nobody does.
Result<std::string> retire_committed_step(Storage& storage, const std::string& final_dir);

// Deletes a committed step so that no reader ever sees it half-deleted: the
// step stops being committed first (retire_committed_step), then its objects go.
Status delete_committed_step(Storage& storage, const std::string& final_dir);

}  // namespace ckptio
