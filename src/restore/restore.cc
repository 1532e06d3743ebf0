// Restore: pick the step, parse its index (strictly), select leaves, check
// them against a template, then read: whole leaves (src/restore/restore_whole.cc)
// or into a sharding (src/restore/restore_sharded.cc), both through the read
// executor (src/restore/read_executor.h) and the transform stage
// (src/transform/transform.h). verify() is in src/restore/verify.cc.
//
// Restore-latest tries committed steps newest first and moves past a step
// whose index or data is damaged (Status::data_loss(); a missing data file
// counts, src/restore/damage.h), recording it in RestoredState::skipped; strict mode
// and every other error stop there.
#include <re2/re2.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <new>
#include <set>

#include "ckptio/manager.h"
#include "src/layout/layout.h"
#include "src/manager/manager_impl.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/restore/restore_sharded.h"
#include "src/restore/restore_zarr.h"
#include "src/restore/restore_whole.h"
#include "src/sharding/regex.h"
#include "src/transform/cast.h"
#include "src/util/allocate.h"
#include "src/util/log.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;

std::string leaf_name(const std::string& prefix, const LeafRecord& leaf) {
  return prefix + "/" + leaf.path;
}

// Up to `most` names joined by ", ", then how many there are in all.
template <typename Names>
std::string join_names(const Names& names, size_t most) {
  std::string s;
  size_t n = 0;
  for (const std::string& name : names) {
    if (n++ == most) return s + ", ... (" + std::to_string(names.size()) + " in all)";
    s += (n > 1 ? ", " : "") + name;
  }
  return s;
}

Status check_template(const std::vector<std::pair<std::string, LeafRecord*>>& selected,
                      const RestoreOptions& options) {
  if (options.expected.empty()) return Status::OK();
  std::map<std::string, const LeafRecord*> saved;
  for (const auto& [prefix, leaf] : selected) saved[leaf_name(prefix, *leaf)] = leaf;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> expected_names;
  for (const LeafSpec& e : options.expected) {
    std::string name = e.prefix + "/" + e.path;
    expected_names.insert(name);
    auto it = saved.find(name);
    if (it == saved.end()) { missing.push_back(name); continue; }
    const LeafRecord& got = *it->second;
    if (got.shape != e.shape)
      mismatched.push_back(name + ": shape " + shape_to_string(got.shape) + " saved, " +
                           shape_to_string(e.shape) + " expected");
    if (got.dtype != e.dtype && !(options.allow_cast && can_cast(got.dtype, e.dtype)))
      mismatched.push_back(name + ": dtype " + std::string(dtype_name(got.dtype)) + " saved, " +
                           std::string(dtype_name(e.dtype)) + " expected");
  }
  for (const auto& [name, leaf] : saved)
    if (!expected_names.count(name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return Status::OK();
  std::string msg = "state does not match the template:";
  if (!missing.empty()) msg += " missing leaves [" + join_names(missing, 50) + "];";
  if (!unexpected.empty()) msg += " unexpected leaves [" + join_names(unexpected, 50) + "];";
  if (!mismatched.empty()) msg += " mismatches [" + join_names(mismatched, 50) + "];";
  msg.pop_back();
  return Status(Code::kFailedPrecondition, msg);
}

// Whether this restore builds only part of a sharding whose other parts
// other processes restore: it is one of a group (ManagerOptions::processes),
// or restores a subset of the mesh's devices. Restore-latest must then not
// skip a step for damage found in the data this process reads: another
// process, reading other bytes, finds none and restores the step, and the
// group would go on from two different steps. Damage in the index is the
// same for all (each reads it whole), so that is still skipped.
bool builds_part_of_a_sharding(const RestoreOptions& options, const ProcessGroup& processes) {
  if (!options.sharding) return false;
  if (processes.count > 1) return true;
  const auto& s = *options.sharding;
  return !s.devices.empty() && s.devices.size() < s.mesh.device_ids().size();
}

// Every leaf that RestoreOptions::Sharding::leaves names is one of the step's
// (selected or not): an entry for a leaf it does not have is a misspelt
// name, whose leaf would otherwise take a rule's spec without a word.
Status check_sharding_names(const Index& index, const RestoreOptions& options) {
  if (!options.sharding || options.sharding->leaves.empty()) return Status::OK();
  std::set<std::string> unknown;
  for (const LeafSharding& l : options.sharding->leaves) unknown.insert(l.prefix + "/" + l.path);
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& leaf : p.leaves) {
      if (unknown.empty()) return Status::OK();
      unknown.erase(leaf_name(p.name, leaf));
    }
  if (unknown.empty()) return Status::OK();
  return invalid_argument("restore into a sharding: `leaves` names " + join_names(unknown, 20) + ", which step " +
                          std::to_string(index.step) + " does not have");
}

}  // namespace

ArenaLayout restore_arena_layout(const Index& index, uint64_t read_alignment) {
  ArenaLayout out;
  const uint64_t align = std::max<uint64_t>(read_alignment, 1);
  out.alignment = std::max<uint64_t>(align, 64);
  const ShardRecord* before = nullptr;  // the previous leaf's one shard
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& leaf : p.leaves) {
      const ShardRecord* one = leaf.shards.size() == 1 ? &leaf.shards[0] : nullptr;
      uint64_t at = out.bytes;
      const bool follows =
          one && before && before->file == one->file && one->offset == before->offset + before->length;
      if (!follows) {
        at = (at + 63) / 64 * 64;
        if (one) at += (one->offset % align + align - at % align) % align;
      }
      out.offsets.push_back(at);
      out.bytes = at + leaf.num_bytes();
      before = one;
    }
  return out;
}

Result<RestoredState> CheckpointManager::restore(std::optional<int64_t> step,
                                                 const RestoreOptions& options) {
  // The reads in flight are the read executor's, which drains them before
  // anything unwinds past it (restore_index).
  return returning_exceptions("restore", [&] { return restore_or_throw(step, options); });
}

Result<RestoredState> CheckpointManager::restore_or_throw(std::optional<int64_t> step,
                                                          const RestoreOptions& options) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  // The index's fetch and parse, counted into the restore's stats.
  auto with_index_time = [](Result<RestoredState> r, Clock::time_point t0, Clock::time_point t1) {
    if (r.ok()) {
      r->stats.index_seconds = std::chrono::duration<double>(t1 - t0).count();
      r->stats.seconds += r->stats.index_seconds;
    }
    return r;
  };
  if (step) {
    const auto t0 = Clock::now();
    Impl::ReadMark mark(impl_.get(), *step);  // before its index: retention leaves it alone
    CKPTIO_ASSIGN_OR_RETURN(Index index, read_index(*step));
    const auto t1 = Clock::now();
    return with_index_time(impl_->restore_index(index, options), t0, t1);
  }
  // Restore-latest: committed steps newest first; damage (kDataLoss, in the
  // index or the data) moves on to the next older step unless strict; any
  // other error is the caller's (options) or transient, and is returned.
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(*storage_, impl_->naming));
  std::vector<SkippedStep> skipped;
  auto with_skipped = [&](const Status& st) {
    if (skipped.empty()) return st;
    std::string steps;
    for (const SkippedStep& s : skipped) steps += (steps.empty() ? "" : ", ") + std::to_string(s.step);
    return st.annotate("restore-latest, after skipping damaged step(s) " + steps);
  };
  auto skip = [&](int64_t s, const Status& st) {
    logging::warn("ckptio: restore-latest skips damaged step {}: {}", s, st.to_string());
    skipped.push_back(SkippedStep{s, st});
  };
  // Nothing restored from the steps listed: a step committed since is tried
  // too (once), as retention after its commit may have retired the ones the
  // listing saw before this restore marked them.
  int64_t seen = -1;  // the newest step tried
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t tried_up_to = seen;
    for (auto it = dirs.rbegin(); it != dirs.rend() && it->step > tried_up_to; ++it) {
      if (it->kind != StepDirKind::kFinal) continue;
      seen = std::max(seen, it->step);
      const auto t0 = Clock::now();
      Impl::ReadMark mark(impl_.get(), it->step);  // before its index: retention leaves it alone
      auto loaded = impl_->load_index(it->name);
      const auto t1 = Clock::now();
      if (loaded.ok() && !loaded->has_value()) {  // no index: not committed, or lost (POSIX)
        Status why = impl_->missing_index(it->name, it->step);
        if (why.code() == Code::kNotFound) continue;
        loaded = why;
      }
      if (!loaded.ok()) {
        if (options_.strict || !loaded.status().data_loss()) return with_skipped(loaded.status());
        skip(it->step, loaded.status());
        continue;
      }
      auto restored = with_index_time(impl_->restore_index(**loaded, options), t0, t1);
      if (restored.ok()) {
        if (!skipped.empty())
          logging::warn("ckptio: restore-latest restored step {} after skipping {} damaged newer step(s)",
                       it->step, skipped.size());
        restored->skipped = std::move(skipped);
        return restored;
      }
      if (options_.strict || !restored.status().data_loss()) return with_skipped(restored.status());
      if (builds_part_of_a_sharding(options, options_.processes))
        return with_skipped(restored.status().annotate(
            "restore-latest: step " + std::to_string(it->step) +
            " is damaged in the bytes this process reads, which the group's other processes may not "
            "read; not skipped in a restore of part of a sharding, so that they do not restore "
            "different steps (docs/multiprocess.md, \"Restore-latest across processes\")"));
      skip(it->step, restored.status());
    }
    if (pass == 1) break;
    CKPTIO_ASSIGN_OR_RETURN(dirs, scan_step_dirs(*storage_, impl_->naming));
  }
  if (skipped.empty()) return not_found("no committed step at " + storage_->describe());
  std::string all;
  for (const SkippedStep& s : skipped)
    all += "; step " + std::to_string(s.step) + ": " + s.error.message();
  return data_loss("restore-latest: every committed step at " + storage_->describe() + " is damaged" + all);
}

Result<RestoredState> CheckpointManager::Impl::restore_index(Index& index,
                                                            const RestoreOptions& options) {
  // The restore takes its memory as it goes (leaves, staging, decoders' and
  // the planner's tables), and the system may refuse it. Reads in flight
  // are the read executor's, which drains them before it returns an error
  // (out_of_memory too): nothing still writes into memory this unwinds.
  try {
    return restore_index_taking_memory(index, options);
  } catch (const std::bad_alloc&) {
    return out_of_memory("restore step " + std::to_string(index.step) + " at " + owner->storage().describe());
  }
}

Result<RestoredState> CheckpointManager::Impl::restore_index_taking_memory(Index& index,
                                                                          const RestoreOptions& options) {
  const auto t0 = Clock::now();
  Storage& storage = owner->storage();
  const int64_t the_step = index.step;  // its callers hold a ReadMark on it

  // Selection.
  // A float_dtype that is not a float dtype: refused before any read, as
  // save() refuses it (before, the reads ran first).
  if (options.float_dtype && !dtype_is_float(*options.float_dtype))
    return invalid_argument("float_dtype must be a float dtype, not " +
                            std::string(dtype_name(*options.float_dtype)));
  // RE2 with Python's syntax, as partition rules: leaf paths come from the
  // index, outside data, and std::regex's backtracking overflows the stack on
  // long ones (a 100,000-character path against "(a|b)*c").
  std::unique_ptr<const RE2> re;
  if (!options.select.path_regex.empty()) {
    CKPTIO_ASSIGN_OR_RETURN(re, compile_python_regex(options.select.path_regex, "path regex"));
  }
  std::vector<std::pair<std::string, LeafRecord*>> selected;
  for (PrefixRecord& p : index.prefixes) {
    if (!options.select.prefixes.empty() &&
        std::find(options.select.prefixes.begin(), options.select.prefixes.end(), p.name) ==
            options.select.prefixes.end())
      continue;
    for (LeafRecord& leaf : p.leaves)
      if (!re || RE2::PartialMatch(leaf.path, *re)) selected.emplace_back(p.name, &leaf);
  }
  CKPTIO_RETURN_IF_ERROR(check_template(selected, options));
  CKPTIO_RETURN_IF_ERROR(check_sharding_names(index, options));

  if (index.layout == zarr::kEformerLayout) {  // zarr chunks (src/restore/restore_zarr.cc)
    RestoredState out;
    out.step = the_step;
    out.metadata_json = index.metadata_json;
    CKPTIO_RETURN_IF_ERROR(restore_zarr(storage, naming.name(the_step), the_step, selected, options, &out));
    out.stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }
  if (options.sharding) {  // one buffer per local device (src/restore/restore_sharded.cc)
    RestoredState out;
    out.step = the_step;
    out.metadata_json = index.metadata_json;
    CKPTIO_RETURN_IF_ERROR(
        restore_sharded(storage, naming.name(the_step), the_step, selected, options, &out));
    out.stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }

  RestoredState out;
  out.step = the_step;
  out.metadata_json = index.metadata_json;
  const auto t_read = Clock::now();
  CKPTIO_RETURN_IF_ERROR(restore_whole(storage, naming.name(the_step), index, selected, options, &out));
  // Selection and the template check count as planning.
  out.stats.plan_seconds += std::chrono::duration<double>(t_read - t0).count();
  out.stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace ckptio
