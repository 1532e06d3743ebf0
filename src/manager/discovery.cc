// Discovery: the committed steps of a base, and the index of each.

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "src/index/index_readers.h"
#include "src/layout/layout.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/manager/manager_impl.h"
#include "src/util/log.h"
#include "src/storage/own_objects.h"

namespace ckptio {

// A large index is read in two parts, and its first half parsed while the
// second is read (index_readers::parse_index_arriving): on local disk a cold
// 26 MB index (100,000 leaves) takes about as long to read as to parse.
// The text is never zero-filled first; one the storage holds in memory
// already is parsed there.
Result<std::optional<Index>> CheckpointManager::Impl::load_index(const std::string& dir) {
  constexpr uint64_t kInParts = 4ull << 20;
  const std::string key = index_key(dir);
  auto object = owner->storage().open(key, IndexLimits{}.max_bytes);
  if (!object.ok()) {
    if (object.status().code() != Code::kNotFound) return oversized_is_damage(object.status());
    // No ckptio index: a step eformer wrote (src/layout/zarr/eformer_step.h)?
    // One that is not complete is not committed.
    auto eformer = zarr::load_eformer_step(owner->storage(), dir, naming.parse(dir).value_or(0));
    if (!eformer.ok() && eformer.status().code() == Code::kNotFound) return std::optional<Index>();
    return eformer;
  }
  ObjectReader& r = **object;
  const std::optional<std::string_view> held = r.in_memory();  // (an object store's GET): parsed where it lies
  const uint64_t size = r.size();
  const uint64_t first = size < kInParts ? size : size / 2;  // the helper reads from its last leaf
  std::unique_ptr<char[]> text;
  if (!held) {
    text.reset(new char[std::max<uint64_t>(size, 1)]);
    CKPTIO_RETURN_IF_ERROR(r.read(0, first, reinterpret_cast<std::byte*>(text.get())));
  }
  const std::function<Status()> rest = [&] {
    return r.read(first, size - first, reinterpret_cast<std::byte*>(text.get() + first));
  };
  auto index = held ? parse_index(*held)
                    : index_readers::parse_index_arriving(std::string_view(text.get(), size), first, rest);
  if (!index.ok()) return index.status().annotate(owner->storage().describe() + "/" + key);
  // Restore reads the data of the step the index records: an index copied
  // or moved under another step's name would read another step's files.
  if (auto named = naming.parse(dir); named && *named != index->step)
    return data_loss(owner->storage().describe() + "/" + key + ": the index records step " +
                     std::to_string(index->step) + ", not " + std::to_string(*named) +
                     " (a step directory copied or renamed by hand? use `ckptio cp`)");
  return std::optional<Index>(std::move(index).value());
}

Status CheckpointManager::Impl::missing_index(const std::string& dir, int64_t step) {
  Storage& storage = owner->storage();
  const std::string location = storage.describe() + "/" + index_key(dir);
  Status not_committed =
      not_found("step " + std::to_string(step) + " is not committed at " + storage.describe());
  // On an object store a step prefix without an index is a save in progress
  // or a dead attempt; only a POSIX-like commit (rename of a directory that
  // already holds its index) makes it damage.
  if (!storage.caps().atomic_rename) return not_committed;
  auto objs = storage.list(dir + "/", /*delimiter=*/false);
  if (!objs.ok()) return objs.status().annotate("list " + storage.describe() + "/" + dir + "/");
  if (objs->objects.empty()) return not_committed;
  // eformer writes in place, with no commit record: a partial step is a save
  // in progress (or one that never finished), not damage.
  if (zarr::looks_like_eformer_step(dir, objs->objects)) return not_committed;
  return data_loss(location + " is missing, but " + storage.describe() + "/" + dir + "/ holds " +
                   std::to_string(objs->objects.size()) + " object(s) (" + objs->objects.front().key +
                   (objs->objects.size() > 1 ? ", ..." : "") +
                   "): the index of step " + std::to_string(step) +
                   " was deleted or lost, so the step is not committed");
}

Result<std::vector<int64_t>> CheckpointManager::Impl::committed_steps(bool parse, bool newest_only) {
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(owner->storage(), naming));
  std::vector<int64_t> steps;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->kind != StepDirKind::kFinal) continue;
    if (!parse) {
      auto st = owner->storage().stat(index_key(it->name));
      if (st.ok()) steps.push_back(it->step);
      else if (st.status().code() != Code::kNotFound) return st.status();
      if (st.ok()) continue;
      // No ckptio index: committed only if it is a complete eformer step
      // (one ckptio cannot read, kUnimplemented, is: retention counts steps
      // by age; before, one such step failed every retention).
      auto eformer = zarr::load_eformer_step(owner->storage(), it->name, it->step);
      if ((eformer.ok() && eformer->has_value()) || eformer.status().code() == Code::kUnimplemented)
        steps.push_back(it->step);
      else if (!eformer.ok() && eformer.status().code() != Code::kNotFound && !eformer.status().data_loss())
        return eformer.status();
      continue;
    }
    auto index = load_index(it->name);
    if (!index.ok() && index.status().code() == Code::kUnimplemented) {
      // Whole, and committed, though ckptio cannot read it (an eformer
      // step's codec it lacks): listed, as it is (restore-latest stops there
      // with this error). Before, one such step failed every listing.
      steps.push_back(it->step);
      if (newest_only) break;
      continue;
    }
    if (!index.ok()) {
      if (owner->options().strict || !index.status().data_loss()) return index.status();
      logging::warn("ckptio: skipping step {}: {}", it->step, index.status().to_string());
      continue;
    }
    if (!index->has_value()) {  // no index: not committed; damage on POSIX
      Status why = missing_index(it->name, it->step);
      if (why.code() == Code::kNotFound) continue;
      if (owner->options().strict || !why.data_loss()) return why;
      logging::warn("ckptio: skipping step {}: {}", it->step, why.to_string());
      continue;
    }
    steps.push_back(it->step);
    if (newest_only) break;
  }
  std::reverse(steps.begin(), steps.end());
  return steps;
}

Result<std::vector<StepInfo>> CheckpointManager::Impl::step_dirs() {
  Storage& storage = owner->storage();
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(storage, naming));
  std::vector<StepInfo> out;
  for (const StepDir& d : dirs) {
    StepInfo info;
    info.step = d.step;
    info.name = d.name;
    CKPTIO_ASSIGN_OR_RETURN(ListResult objs, storage.list(d.name + "/", false));
    for (const auto& o : objs.objects) info.bytes += o.size;
    if (d.kind == StepDirKind::kFinal) {
      auto index = load_index(d.name);
      if (index.ok() && index->has_value()) {
        info.committed = true;
        info.committed_unix_ns = (*index)->committed_unix_ns;
        info.layout = (*index)->layout;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace ckptio
