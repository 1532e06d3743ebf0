// gc: what failed and abandoned saves left behind, removed.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "src/layout/layout.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/manager/manager_impl.h"
#include "src/util/clock.h"

namespace ckptio {

Status CheckpointManager::Impl::gc(const GcOptions& options) {
  Storage& storage = owner->storage();
  if (!(options.min_age_seconds >= 0))
    return invalid_argument("gc: min_age_seconds must be >= 0, not " + std::to_string(options.min_age_seconds));
  CKPTIO_ASSIGN_OR_RETURN(auto dirs, scan_step_dirs(storage, naming));
  Status first;
  auto note = [&](Status st) { if (!st.ok() && first.ok()) first = st; };
  const int64_t now = unix_ns_now();
  const double min_age_ns = options.min_age_seconds * 1e9;
  // A change at `t` (0: unknown, counts as old) is too recent to remove.
  auto recent = [&](int64_t t) { return min_age_ns > 0 && t > 0 && static_cast<double>(now - t) < min_age_ns; };
  // Something under `prefix` changed too recently; an error keeps it too.
  auto live = [&](const std::string& prefix) {
    if (min_age_ns <= 0) return false;
    auto t = storage.newest_change(prefix);
    if (!t.ok()) {
      note(t.status().annotate("gc: age of " + storage.describe() + "/" + prefix));
      return true;
    }
    return t->has_value() && recent(**t);
  };
  auto in_flight_here = [&](const std::string& key) {
    std::lock_guard lock(mu);
    for (const auto& a : attempts_in_flight)
      if (key.find(a) != std::string::npos) return true;
    for (const auto& dir : eformer_steps_in_flight)
      if (key.starts_with(dir + "/")) return true;
    return false;
  };
  for (const StepDir& d : dirs) {
    {
      std::lock_guard lock(mu);
      if (attempts_in_flight.count(d.attempt) || eformer_steps_in_flight.count(d.name)) continue;
    }
    if (d.kind != StepDirKind::kFinal) {
      if (!live(d.name + "/")) note(storage.remove_prefix(d.name + "/"));
      continue;
    }
    // Object stores: remove data objects no committed index references
    // (failed attempts, replaced steps). Steps without an index are dead
    // attempts (or saves in progress elsewhere) and go whole. POSIX: a
    // committed directory came whole from one rename, but a multi-process
    // save's coordinator killed between that rename and removing the
    // processes' manifests leaves them there: anything but the index and
    // data files goes (the index is read only when something else is there).
    auto objs = storage.list(d.name + "/", false);
    if (!objs.ok()) { note(objs.status()); continue; }
    // Steps eformer wrote are its own (no attempts, no garbage): left alone,
    // complete or not.
    if (zarr::looks_like_eformer_step(d.name, objs->objects)) continue;
    const bool posix = storage.caps().atomic_rename;
    if (posix && std::all_of(objs->objects.begin(), objs->objects.end(), [&](const ListEntry& o) {
          return o.key == index_key(d.name) || o.key.starts_with(d.name + "/data-");
        }))
      continue;
    auto index = load_index(d.name);
    if (!index.ok()) continue;  // damaged: leave it for a human
    if (!index->has_value() && (posix || live(d.name + "/"))) continue;  // POSIX: not ours; leave it
    std::set<std::string> referenced;
    if (index->has_value())
      for (const auto& f : (*index)->files) referenced.insert(d.name + "/" + f.name);
    for (const auto& o : objs->objects) {
      if (o.key == index_key(d.name) || referenced.count(o.key) || recent(o.modified_unix_ns)) continue;
      if (!in_flight_here(o.key)) note(storage.remove(o.key));
    }
  }
  // Object stores: multipart uploads never completed nor aborted (a killed
  // saver) hold storage that list() does not show; abort those of attempts
  // not in flight here that began long enough ago.
  auto unfinished = storage.list_unfinished("");
  if (unfinished.status().code() == Code::kUnimplemented) {
    spdlog::warn("ckptio: gc cannot list unfinished uploads at {}: {}", storage.describe(),
                 unfinished.status().to_string());
    return first;
  }
  if (!unfinished.ok()) {
    note(unfinished.status());
    return first;
  }
  for (const ListEntry& u : *unfinished)
    if (!recent(u.modified_unix_ns) && !in_flight_here(u.key)) note(storage.abort_unfinished(u.key));
  return first;
}

}  // namespace ckptio
