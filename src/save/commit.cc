// The commit protocol. A step is committed exactly when its index is durable
// at its final name; data objects carry attempt-unique names, so a failed or
// concurrent attempt never overwrites what a committed index points to.
//
// POSIX (Storage::caps().atomic_rename):
//   1. data files are written under <step>.tmp-<attempt>/ and made durable
//      (WritableObject::finish = fsync) by the caller;
//   2. put(<stage>/ckptio_index.json): write a temporary, fsync, rename, fsync
//      the directory; this may run while the data files are still being
//      written (a stage directory is never discoverable as a step);
//   3. sync(<stage>): fsync the stage directory (all data file names), once
//      steps 1 and 2 are done;
//   4. rename(<stage>, <step>) with RENAME_NOREPLACE, or RENAME_EXCHANGE when
//      overwriting (the old step moves to the stage name in the same atomic
//      step, so there is no moment without a complete step), then fsync the
//      base directory (sync("")). An fsync error anywhere fails the step: the
//      caller discards the attempt and never retries the commit. One that
//      comes after the rename first moves the step back to its stage name
//      (take_back), so that a step reported failed is never discoverable.
//   5. after an exchange, the old step (now at the stage name) is deleted.
//
// Object store (no rename): data objects go to <step>/data-<attempt>-N.bin,
// then the index object <step>/ckptio_index.json is PUT last (S3 PUTs are
// atomic and read-after-write consistent), with Storage::put_new (S3:
// If-None-Match: *), so that of two writers committing the same step at once
// one fails with kAlreadyExists instead of replacing the other's index. An
// attempt that never wrote its index is invisible to discovery; gc removes
// its objects. Overwrite replaces the index in one PUT; the replaced step's
// data objects become garbage that gc removes (they are not referenced by
// the new index).
#include "src/save/commit.h"

#include "src/layout/layout.h"
#include "src/layout/zarr/eformer_index.h"

namespace ckptio {

AttemptPaths plan_attempt(const Storage& storage, const std::string& final_dir) {
  return plan_attempt(storage, final_dir, new_attempt_id());
}

AttemptPaths plan_attempt(const Storage& storage, const std::string& final_dir, const std::string& attempt) {
  AttemptPaths p;
  p.final_dir = final_dir;
  p.attempt = attempt;
  p.renames = storage.caps().atomic_rename;
  p.stage_dir = p.renames ? final_dir + ".tmp-" + p.attempt : final_dir;
  return p;
}

namespace {
std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
}  // namespace

Status commit_attempt(Storage& storage, const AttemptPaths& paths, const std::string& index_json,
                      bool overwrite, bool* outcome_unknown) {
  CKPTIO_RETURN_IF_ERROR(stage_index(storage, paths, index_json));
  return publish_attempt(storage, paths, index_json, overwrite, outcome_unknown);
}

Status stage_index(Storage& storage, const AttemptPaths& paths, const std::string& index_json) {
  if (!paths.renames) return Status::OK();
  return storage.put(index_key(paths.stage_dir), as_bytes(index_json));
}

namespace {

// A commit that failed once its attempt may have taken the step's final name
// (POSIX: the rename's fsync, or the base's after it) must not leave the step
// discoverable: a step reported failed would be restored, and retried saves
// of it refused. Whether the attempt is there is read from its marker (the
// index, or an eformer step's metadata.json, whose bytes are the attempt's
// own); if so, it is moved back to the stage name (after an exchange, the
// replaced step comes back with the same exchange) for the caller to
// discard. When even that fails, `*outcome_unknown` says so: the attempt's
// files are then left (a crash may yet show the step committed; gc removes
// them if not).
Status take_back(Storage& storage, const AttemptPaths& paths, std::string_view marker_name,
                 const std::string& marker, Status failure, bool* outcome_unknown) {
  const std::string final_dir = paths.final_dir + "/", stage_dir = paths.stage_dir + "/";
  auto there = storage.get(final_dir + std::string(marker_name), marker.size());
  if (there.ok() && *there != marker) return failure;  // another step's: ours never moved
  const Code code = there.ok() ? Code::kOk : there.status().code();
  if (code == Code::kNotFound || code == Code::kInvalidArgument) return failure;  // none, or a larger one: not ours
  Status back = there.status();
  if (back.ok()) back = storage.rename(final_dir, stage_dir, RenameMode::kNoReplace);
  if (back.code() == Code::kAlreadyExists) back = storage.rename(final_dir, stage_dir, RenameMode::kExchange);
  if (back.ok()) back = storage.sync("");
  if (back.ok()) return failure.annotate("step " + paths.final_dir + " was moved back to " + paths.stage_dir);
  if (outcome_unknown) *outcome_unknown = true;
  return failure.annotate("step " + paths.final_dir + " may or may not be committed (it could not be moved back: " +
                          back.to_string() + "); its files are left for gc");
}

}  // namespace

Status publish_attempt(Storage& storage, const AttemptPaths& paths, const std::string& index_json,
                       bool overwrite, bool* outcome_unknown, std::string_view marker_name) {
  const std::span<const std::byte> bytes = as_bytes(index_json);
  if (!paths.renames) {
    const std::string key = index_key(paths.final_dir);
    auto already = [&] { return Status(Code::kAlreadyExists, "step " + paths.final_dir + " is already committed"); };
    if (!overwrite) {
      // The check catches a step committed before, on every server; put_new
      // refuses one committed meanwhile by another writer, where the
      // backend can (S3: If-None-Match). A step in eformer's layout is
      // committed by its metadata.json (discovery): the index PUT would
      // shadow it.
      for (const std::string& marker : {key, paths.final_dir + "/" + std::string(zarr::kEformerMetadataName)}) {
        auto st = storage.stat(marker);
        if (st.ok()) return already();
        if (st.status().code() != Code::kNotFound) return st.status();
      }
    }
    Status put = overwrite ? storage.put(key, bytes) : storage.put_new(key, bytes);
    if (put.ok()) return put;
    // Refused (a PUT sent again may meet the index its first attempt
    // wrote), or failed with whatever error: a retried PUT whose first
    // attempt stored the object but lost its answer ends with the error of
    // its last attempt, which may be any (403 after a key rotation, 400,
    // quota). Whose index is there says whether the step is committed. The
    // index names this attempt's data files, so ours is ours.
    const bool refused = put.code() == Code::kAlreadyExists;
    auto there = storage.get(key, bytes.size());
    if (there.ok()) return *there == index_json ? Status::OK() : refused ? already() : put;
    const Code code = there.status().code();
    if (code == Code::kNotFound || code == Code::kInvalidArgument)  // none there, or a larger one: not ours
      return refused ? already() : put;
    if (outcome_unknown) *outcome_unknown = true;
    return put.annotate("step " + paths.final_dir + " may or may not be committed (its index could not be read "
                        "back: " + there.status().to_string() + "); its data is left for gc");
  }

  CKPTIO_RETURN_IF_ERROR(storage.sync(paths.stage_dir + "/").annotate("commit " + paths.final_dir));
  Status renamed = storage.rename(paths.stage_dir + "/", paths.final_dir + "/", RenameMode::kNoReplace);
  bool exchanged = false;
  if (renamed.code() == Code::kAlreadyExists && overwrite) {
    renamed = storage.rename(paths.stage_dir + "/", paths.final_dir + "/", RenameMode::kExchange);
    exchanged = renamed.ok();
  }
  // The new name made durable: its directory (the rename's own fsync does it
  // on local disk; a nested step format's parent, for every backend), then
  // the base. A failure here, or in the rename's own fsync, may come after
  // the attempt took its final name: take_back moves it away again.
  // (A rename refused for the name being taken moved nothing: another
  // writer's step is there, never to be taken back.)
  if (renamed.code() == Code::kAlreadyExists) return renamed.annotate("commit " + paths.final_dir);
  Status durable = renamed;
  if (const std::string parent = parent_of(paths.final_dir); durable.ok() && !parent.empty())
    durable = storage.sync(parent + "/");
  if (durable.ok()) durable = storage.sync("");
  if (!durable.ok())
    return take_back(storage, paths, marker_name, index_json, durable.annotate("commit " + paths.final_dir),
                     outcome_unknown);
  if (exchanged) {
    // The replaced step now sits at the stage name; it is not discoverable as
    // committed (temporary names never are), so a failure here only leaves
    // garbage for gc.
    (void)storage.remove_prefix(paths.stage_dir + "/");
  }
  return Status::OK();
}

void discard_attempt(Storage& storage, const AttemptPaths& paths,
                     const std::vector<std::string>& data_files) {
  if (paths.renames) {
    (void)storage.remove_prefix(paths.stage_dir + "/");
    return;
  }
  for (const auto& f : data_files) (void)storage.remove(paths.stage_dir + "/" + f);
}

Result<std::string> retire_committed_step(Storage& storage, const std::string& final_dir) {
  if (storage.caps().atomic_rename) {
    std::string doomed = final_dir + ".del-" + new_attempt_id();
    CKPTIO_RETURN_IF_ERROR(storage.rename(final_dir + "/", doomed + "/", RenameMode::kNoReplace));
    CKPTIO_RETURN_IF_ERROR(storage.sync(""));
    return doomed + "/";
  }
  CKPTIO_RETURN_IF_ERROR(storage.remove(index_key(final_dir)));
  // A step in eformer's layout has no ckptio index: it counts as committed
  // while its metadata.json is there (discovery), so that goes first too
  // (a DELETE of a key that is not there succeeds).
  CKPTIO_RETURN_IF_ERROR(storage.remove(final_dir + "/" + std::string(zarr::kEformerMetadataName)));
  return final_dir + "/";
}

Status delete_committed_step(Storage& storage, const std::string& final_dir) {
  CKPTIO_ASSIGN_OR_RETURN(std::string rest, retire_committed_step(storage, final_dir));
  return storage.remove_prefix(rest);
}

}  // namespace ckptio
