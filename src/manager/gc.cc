// gc: what failed and abandoned saves left behind, removed.

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "src/layout/layout.h"
#include "src/layout/zarr/eformer_step.h"
#include "src/manager/manager_impl.h"
#include "src/util/clock.h"
#include "src/util/log.h"

namespace ckptio {
namespace {

// A name ckptio gives what it writes into a step directory: data-, manifest-
// or failed- and a 16-hex-digit attempt id. gc removes nothing else, even
// under a directory whose name parses as a step: the base may be shared (a
// bucket's root; step_format "{step}" makes "2024/" a step directory).
bool ckptio_object_name(std::string_view key) {
  const std::string_view base = key.substr(key.rfind('/') + 1);
  for (std::string_view kind : {"data-", "manifest-", "failed-"}) {
    if (!base.starts_with(kind)) continue;
    const std::string_view id = base.substr(kind.size());
    return id.size() > 16 && (id[16] == '-' || id[16] == '.') &&
           std::all_of(id.begin(), id.begin() + 16, [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  }
  return false;
}

}  // namespace

Status CheckpointManager::Impl::gc(const GcOptions& options) {
  Storage& storage = owner->storage();
  if (!(options.min_age_seconds >= 0))
    return invalid_argument("gc: min_age_seconds must be >= 0, not " + std::to_string(options.min_age_seconds));
  // From here to the end, every attempt in flight is remembered (before the
  // scan: what it lists may belong to a save that commits meanwhile).
  {
    std::lock_guard lock(mu);
    if (gcs_running++ == 0) {
      attempts_seen_by_gc = attempts_in_flight;
      eformer_steps_seen_by_gc = {eformer_steps_in_flight.begin(), eformer_steps_in_flight.end()};
    } else {
      attempts_seen_by_gc.insert(attempts_in_flight.begin(), attempts_in_flight.end());
      eformer_steps_seen_by_gc.insert(eformer_steps_in_flight.begin(), eformer_steps_in_flight.end());
    }
  }
  struct EndGc {
    Impl& impl;
    ~EndGc() {
      std::lock_guard lock(impl.mu);
      if (--impl.gcs_running == 0) {
        impl.attempts_seen_by_gc.clear();
        impl.eformer_steps_seen_by_gc.clear();
      }
    }
  } end_gc{*this};
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
  // In flight here at some moment of this gc (a superset of those in
  // flight now).
  auto in_flight_here = [&](const std::string& key) {
    std::lock_guard lock(mu);
    for (const auto& a : attempts_seen_by_gc)
      if (key.find(a) != std::string::npos) return true;
    for (const auto& dir : eformer_steps_seen_by_gc)
      if (key.starts_with(dir + "/")) return true;
    return false;
  };
  for (const StepDir& d : dirs) {
    {
      std::lock_guard lock(mu);
      if (attempts_seen_by_gc.count(d.attempt) || eformer_steps_seen_by_gc.count(d.name)) continue;
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
          return o.key == index_key(d.name) || o.key.starts_with(d.name + "/data-") || !ckptio_object_name(o.key);
        }))
      continue;
    auto index = load_index(d.name);
    if (!index.ok()) continue;  // damaged: leave it for a human
    if (!index->has_value() && (posix || live(d.name + "/"))) continue;  // POSIX: not ours; leave it
    std::set<std::string> referenced;
    if (index->has_value())
      for (const auto& f : (*index)->files) referenced.insert(d.name + "/" + f.name);
    for (const auto& o : objs->objects) {
      if (o.key == index_key(d.name) || referenced.count(o.key) || recent(o.modified_unix_ns) ||
          !ckptio_object_name(o.key))
        continue;
      if (!in_flight_here(o.key)) note(storage.remove(o.key));
    }
  }
  // Object stores: multipart uploads never completed nor aborted (a killed
  // saver) hold storage that list() does not show; abort those of attempts
  // not in flight here that began long enough ago.
  auto unfinished = storage.list_unfinished("");
  if (unfinished.status().code() == Code::kUnimplemented) {
    logging::warn("ckptio: gc cannot list unfinished uploads at {}: {}", storage.describe(),
                 unfinished.status().to_string());
    return first;
  }
  if (!unfinished.ok()) {
    note(unfinished.status());
    return first;
  }
  // Only uploads into step directories: the base may be shared with
  // another program's uploads.
  auto in_a_step_dir = [&](const std::string& key) {
    const size_t slash = key.find('/');
    return slash != std::string::npos && classify_step_dir(naming, std::string_view(key).substr(0, slash));
  };
  for (const ListEntry& u : *unfinished)
    if (in_a_step_dir(u.key) && !recent(u.modified_unix_ns) && !in_flight_here(u.key))
      note(storage.abort_unfinished(u.key));
  return first;
}

}  // namespace ckptio
