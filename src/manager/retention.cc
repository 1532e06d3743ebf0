// Retention: which committed steps a manager keeps (ManagerOptions::
// max_to_keep, keep_every), applied after each commit and on request.
#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "src/manager/manager_impl.h"
#include "src/save/commit.h"
#include "src/util/log.h"

namespace ckptio {

Status CheckpointManager::Impl::retain(int max_to_keep, int64_t keep_every, std::vector<int64_t>* deleted,
                                      std::vector<std::string>* reap, std::optional<int64_t> committed) {
  CKPTIO_ASSIGN_OR_RETURN(auto steps, committed_steps(/*parse=*/false, false));
  if (steps.empty() || max_to_keep <= 0) return Status::OK();
  // The newest max_to_keep steps whose index reads, and every step newer
  // than the oldest of them: a damaged step (an index truncated, or naming
  // another step) or one ckptio cannot read (an eformer step's codec it
  // lacks) is kept but not counted. Before, it was counted: a
  // damaged newest step made `max_to_keep = 1` delete the only intact one.
  // (Only the indexes of the steps kept are read, newest first.)
  std::set<int64_t> keep;
  int intact = 0;
  for (auto it = steps.rbegin(); it != steps.rend() && intact < max_to_keep; ++it) {
    keep.insert(*it);
    {
      std::lock_guard lock(mu);
      if (known_intact.count(*it)) {  // (committed or read whole here: no read after each commit)
        ++intact;
        continue;
      }
    }
    auto index = load_index(naming.name(*it));  // (no ckptio index: a whole eformer step, as listed)
    if (index.ok()) {
      ++intact;
      std::lock_guard lock(mu);
      known_intact.insert(*it);  // (what this throws fails this retention only)
    } else if (index.status().data_loss() || index.status().code() == Code::kUnimplemented) {
      logging::warn("ckptio: retention keeps step {} but does not count it among the {} to keep: {}", *it,
                    max_to_keep, index.status().to_string());
    } else if (index.status().code() != Code::kNotFound) {  // (gone meanwhile: not counted)
      return index.status().annotate("retention: read the index of step " + std::to_string(*it));
    }
  }
  if (keep_every > 0)
    for (int64_t s : steps)
      if (s % keep_every == 0) keep.insert(s);
  // A step saved older than the newest max_to_keep (a run resumed from an
  // older step) stays: before, its commit's own retention deleted it at once,
  // and in a group the other processes, not having seen its index yet, waited
  // for the outcome until their timeout. The next commit's retention counts
  // it as any other.
  if (committed) keep.insert(*committed);
  Status first;
  for (int64_t s : steps) {
    if (keep.count(s)) continue;
    {
      std::lock_guard lock(mu);
      if (restoring.count(s) || retiring.count(s)) continue;  // never under a reader, nor one replacing or removing it
      retiring.insert(s);                // and no reader marks it until it is out
    }
    // Out of the committed set first; then its bytes, now or by the reaper.
    // The mark goes as the retire returns, also when it throws (a reader
    // would wait on it forever).
    struct Unmark {
      Impl& impl;
      int64_t step;
      ~Unmark() {
        {
          std::lock_guard lock(impl.mu);
          impl.retiring.erase(step);
        }
        impl.cv.notify_all();
      }
    };
    auto rest = [&] {
      Unmark unmark{*this, s};
      return retire_committed_step(owner->storage(), naming.name(s));
    }();
    Status st = rest.status();
    if (rest.ok()) {
      std::lock_guard lock(mu);
      known_intact.erase(s);
    }
    if (rest.ok() && reap) reap->push_back(std::move(*rest));
    else if (rest.ok()) st = owner->storage().remove_prefix(*rest);
    if (st.ok() && deleted) deleted->push_back(s);
    if (!st.ok() && first.ok()) first = st.annotate("retention: delete step " + std::to_string(s));
  }
  return first;
}

Status CheckpointManager::Impl::remove_step(int64_t step) {
  const std::string dir = naming.name(step);
  // Not under a save of the step in flight here (on an object store it
  // writes under the prefix the removal deletes: it then committed an index
  // naming deleted data), and no save of it starts until the removal ends.
  {
    std::lock_guard lock(mu);
    if (saves_in_flight.count(dir))
      return Status(Code::kFailedPrecondition, "step " + std::to_string(step) +
                                                   " has a save in flight in this manager: wait for it first");
    if (!steps_being_removed.insert(dir).second)
      return Status(Code::kFailedPrecondition, "step " + std::to_string(step) + " is being removed already");
  }
  struct Unmark {
    Impl& impl;
    const std::string& dir;
    ~Unmark() {
      std::lock_guard lock(impl.mu);
      impl.steps_being_removed.erase(dir);
    }
  } unmark{*this, dir};
  ReplaceMark mark(this, step);  // waits for the step's readers, and holds new ones off
  {
    std::lock_guard lock(mu);
    known_intact.erase(step);
  }
  return delete_committed_step(owner->storage(), dir);
}

CheckpointManager::Impl::ReadMark::ReadMark(Impl* impl, int64_t step) : impl_(impl), step_(step) {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->retiring.count(step_) == 0; });
  impl_->restoring.insert(step_);
}

CheckpointManager::Impl::ReadMark::~ReadMark() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->restoring.erase(impl_->restoring.find(step_));
  }
  impl_->cv.notify_all();  // an overwrite of the step may wait for its readers
}

CheckpointManager::Impl::ReplaceMark::ReplaceMark(Impl* impl, int64_t step) : impl_(impl), step_(step) {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->restoring.count(step_) == 0 && impl_->retiring.count(step_) == 0; });
  impl_->retiring.insert(step_);
}

CheckpointManager::Impl::ReplaceMark::~ReplaceMark() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->retiring.erase(step_);
  }
  impl_->cv.notify_all();
}

}  // namespace ckptio
