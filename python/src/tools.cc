// The CLI's maintenance commands as functions of ckptio._ckptio, wrapped by
// python/ckptio/tools.py as ckptio.cp, ckptio.verify, ckptio.inspect and
// ckptio.gc. Each does what its `ckptio` subcommand does (tools/cli/cp.cc,
// verify.cc, inspect.cc, gc.cc) and returns what the subcommand's --json
// prints, as Python objects; failures come back as ("Code", message) pairs
// in the result so that the Python layer can raise them with what was done
// before them (the steps copied or verified).
//
// GIL: released for the whole of every call (opening the storage included);
// a progress callback takes it back, on the calling thread, for its call.
// A callback that raises: cp stops (its on_progress is the library's
// cancellation point; nothing of the step is committed), verify runs to the
// end (its hook must not throw) and calls the callback no more; either way
// the callback's exception is raised afterwards, unchanged.
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptio/copy.h"
#include "ckptio/local.h"
#include "ckptio/manager.h"
#include "ckptio/s3.h"
#include "python/src/binding.h"
#include "src/util/iso8601.h"

namespace ckptio::python {

namespace {

// A location and how to reach it: built with the GIL (it reads dicts), used
// without it.
struct Location {
  std::string uri;
  std::string step_format = "run-{step}";
  bool strict = false;
  StorageOptions storage;
};

Location location(const std::string& uri, const std::string& step_format, bool strict, py::dict local,
                  py::dict s3) {
  Location l;
  l.uri = uri;
  l.step_format = step_format;
  l.strict = strict;
  l.storage = storage_options(std::move(local), std::move(s3));
  return l;
}

// What the CLI does before reading: opening a local location creates a
// missing directory, which a command that only reads must not do.
Status check_readable(const std::string& uri) {
  if (uri.empty()) return invalid_argument("empty URI");
  std::optional<std::string> path;
  if (uri.rfind("file://", 0) == 0) {
    if (uri.size() > 7 && uri[7] == '/') path = uri.substr(7);
  } else if (uri.find("://") == std::string::npos) {
    path = uri;
  }
  if (!path) return Status::OK();
  struct stat st {};
  if (::stat(path->c_str(), &st) != 0) {
    if (errno == ENOENT) return not_found("no such directory: " + uri);
    return Status::from_errno(errno, *path);
  }
  if (!S_ISDIR(st.st_mode)) return invalid_argument("not a directory: " + uri);
  return Status::OK();
}

Result<std::unique_ptr<CheckpointManager>> open_for_reading(const Location& l) {
  CKPTIO_RETURN_IF_ERROR(check_readable(l.uri));
  ManagerOptions mo;
  mo.step_format = l.step_format;
  mo.strict = l.strict;
  return CheckpointManager::open(l.uri, std::move(mo), l.storage);
}

std::string join_uri(const std::string& uri, const std::string& name) {
  if (!uri.empty() && uri.back() == '/') return uri + name;
  return uri + "/" + name;
}

std::string step_dir_name(const std::string& format, int64_t step) {
  std::string s = format;
  if (size_t at = s.find("{step}"); at != std::string::npos) s.replace(at, 6, std::to_string(step));
  return s;
}

// None for a time not recorded (<= 0: an eformer step whose metadata.json
// has no timestamp), as the CLI's --json says null.
py::object time_iso(int64_t unix_ns) {
  if (unix_ns <= 0) return py::none();
  return py::str(format_iso8601_ns(unix_ns));
}

py::object error_pair(const Status& s) {
  if (s.ok()) return py::none();
  const std::string msg = s.message().empty() ? std::string(code_name(s.code())) : s.message();
  return py::make_tuple(std::string(code_name(s.code())), msg);
}

// A Python callback called from a blocking call's hook on the calling thread
// (the GIL released around the call): takes the GIL, and keeps the first
// exception it raises for the caller to re-raise.
class Callback {
 public:
  explicit Callback(py::object fn) : fn_(std::move(fn)) {}
  bool active() const { return !fn_.is_none() && !failed_; }
  bool failed() const { return failed_; }

  // False when the callback raised (now or before).
  template <typename... Args>
  bool operator()(Args&&... args) {
    if (!active()) return !failed_;
    py::gil_scoped_acquire gil;
    try {
      fn_(std::forward<Args>(args)...);
      return true;
    } catch (py::error_already_set& e) {
      failed_ = true;
      message_ = e.what();
      error_ = std::make_unique<py::error_already_set>(std::move(e));
      return false;
    }
  }

  const std::string& message() const { return message_; }
  // With the GIL: raise what the callback raised, if it did.
  void rethrow() {
    if (error_) {
      std::unique_ptr<py::error_already_set> e = std::move(error_);
      throw std::move(*e);
    }
  }

 private:
  py::object fn_;
  bool failed_ = false;
  std::string message_;
  std::unique_ptr<py::error_already_set> error_;
};

// ---- cp -------------------------------------------------------------------------

py::dict copy_stats_dict(const CopyStats& s) {
  py::dict d;
  d["step"] = s.step;
  d["skipped"] = s.skipped;
  d["bytes"] = s.bytes;
  d["files"] = s.files;
  d["shards"] = s.shards;
  d["bytes_in_place"] = s.bytes_in_place;
  d["data_seconds"] = s.data_seconds;
  d["commit_seconds"] = s.commit_seconds;
  d["seconds"] = s.seconds;
  return d;
}

// Returns {steps: [CopyStats as dicts, one per step copied or skipped],
// seconds, error: None | (code, message)}.
py::dict cp(const std::string& src_uri, const std::string& dst_uri, std::optional<int64_t> step, bool all,
            bool overwrite, bool skip_identical, const std::string& src_step_format,
            const std::string& dst_step_format, const std::string& format, int zstd_level,
            uint64_t chunk_size, uint64_t max_memory, py::dict src_local,
            py::dict src_s3, py::dict dst_local, py::dict dst_s3, py::object on_progress) {
  if (all && step) throw StatusError(invalid_argument("cp: pass either step or all=True, not both"));
  const Location src = location(src_uri, src_step_format, false, std::move(src_local), std::move(src_s3));
  const Location dst = location(dst_uri, dst_step_format, false, std::move(dst_local), std::move(dst_s3));
  CopyOptions co;
  co.src_step_format = src.step_format;
  co.dst_step_format = dst.step_format;
  co.format = format;
  co.zstd_level = zstd_level;
  co.overwrite = overwrite;
  co.skip_identical = skip_identical;
  co.chunk_size = chunk_size;
  co.max_memory = max_memory;
  Callback progress(std::move(on_progress));
  if (progress.active())
    co.on_progress = [&progress](int64_t s, uint64_t done, uint64_t total) {
      if (!progress(s, done, total)) throw std::runtime_error("on_progress raised: " + progress.message());
    };
  std::vector<CopyStats> finished;
  co.on_step = [&finished](const CopyStats& s) { finished.push_back(s); };

  Status st;
  double seconds = 0;
  {
    py::gil_scoped_release nogil;
    const auto t0 = std::chrono::steady_clock::now();
    st = check_readable(src.uri);
    std::shared_ptr<Storage> from, to;
    if (st.ok()) {
      auto s = open_storage(src.uri, src.storage);
      if (s.ok()) from = std::move(s).value();
      else st = s.status().annotate("open " + src.uri);
    }
    if (st.ok()) {
      auto s = open_storage(dst.uri, dst.storage);
      if (s.ok()) to = std::move(s).value();
      else st = s.status().annotate("open " + dst.uri);
    }
    if (st.ok()) st = all ? copy_all_steps(*from, *to, co).status() : copy_step(*from, *to, step, co).status();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  progress.rethrow();
  py::dict out;
  py::list steps;
  for (const CopyStats& s : finished) steps.append(copy_stats_dict(s));
  out["steps"] = steps;
  out["seconds"] = seconds;
  out["error"] = error_pair(st);
  return out;
}

// ---- verify -----------------------------------------------------------------------

// The steps `ckptio verify` checks: `step` if given (it must be committed);
// else every committed step, including those whose index is damaged (which
// discovery and restore-latest pass over), or with all=false the newest.
Result<std::vector<int64_t>> steps_to_verify(CheckpointManager& m, const std::string& uri,
                                             std::optional<int64_t> step, bool all) {
  if (step) {
    CKPTIO_RETURN_IF_ERROR(m.read_index(*step).status().annotate("step " + std::to_string(*step)));
    return std::vector<int64_t>{*step};
  }
  CKPTIO_ASSIGN_OR_RETURN(std::vector<StepInfo> dirs, m.list_step_dirs());
  std::vector<int64_t> steps;
  for (const StepInfo& d : dirs) {
    if (d.name.find(".tmp-") != std::string::npos || d.name.find(".del-") != std::string::npos) continue;
    if (d.committed) {
      steps.push_back(d.step);
      continue;
    }
    const Status st = m.read_index(d.step).status();
    if (st.code() == Code::kNotFound) continue;  // a save in progress, a dead attempt
    if (!st.data_loss()) return st.annotate("step " + std::to_string(d.step));
    steps.push_back(d.step);
  }
  if (steps.empty()) return not_found("no committed step at " + uri);
  if (!all) steps.erase(steps.begin(), steps.end() - 1);
  return steps;
}

// Returns {results: [{step, ok, bytes, seconds, error: None | (code,
// message)}], error: None | (code, message)} (the error of finding the steps).
py::dict verify(const std::string& uri, std::optional<int64_t> step, bool all, const std::string& step_format,
                py::dict local, py::dict s3, py::object on_progress) {
  if (all && step) throw StatusError(invalid_argument("verify: pass either step or all=True, not both"));
  const Location l = location(uri, step_format, false, std::move(local), std::move(s3));
  Callback progress(std::move(on_progress));
  struct One {
    int64_t step;
    uint64_t bytes;
    double seconds;
    Status status;
  };
  std::vector<One> done;
  Status st;
  {
    py::gil_scoped_release nogil;
    auto m = open_for_reading(l);
    if (!m.ok()) {
      st = m.status().annotate("open " + uri);
    } else {
      auto steps = steps_to_verify(**m, uri, step, all);
      if (!steps.ok()) st = steps.status();
      for (int64_t s : steps.ok() ? *steps : std::vector<int64_t>{}) {
        const auto t0 = std::chrono::steady_clock::now();
        auto index = (*m)->read_index(s);
        Status r = index.status();
        const uint64_t bytes = index.ok() ? index->total_bytes() : 0;
        if (r.ok())
          r = (*m)->verify(s, [&progress, s](uint64_t d, uint64_t t) { (void)progress(s, d, t); });
        done.push_back({s, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                        std::move(r)});
      }
    }
  }
  progress.rethrow();
  py::list results;
  for (const One& o : done) {
    py::dict d;
    d["step"] = o.step;
    d["ok"] = o.status.ok();
    d["bytes"] = o.bytes;
    d["seconds"] = o.seconds;
    d["error"] = error_pair(o.status);
    results.append(d);
  }
  py::dict out;
  out["results"] = results;
  out["error"] = error_pair(st);
  return out;
}

// ---- inspect ----------------------------------------------------------------------

py::dict inspect(const std::string& uri, std::optional<int64_t> step, const std::string& step_format, bool strict,
                 py::dict local, py::dict s3) {
  const Location l = location(uri, step_format, strict, std::move(local), std::move(s3));
  Result<Index> r = Status::OK();
  {
    py::gil_scoped_release nogil;
    r = [&]() -> Result<Index> {
      auto m = open_for_reading(l);
      if (!m.ok()) return m.status().annotate("open " + uri);
      std::optional<int64_t> s = step;
      if (!s) {
        CKPTIO_ASSIGN_OR_RETURN(s, (*m)->latest_step());
        if (!s) return not_found("no committed step at " + uri);
      }
      auto index = (*m)->read_index(*s);
      if (!index.ok()) return index.status().annotate("step " + std::to_string(*s));
      return index;
    }();
  }
  const Index index = value_or_throw(std::move(r));
  py::dict d;
  d["step"] = index.step;
  d["layout"] = index.layout;
  d["path"] = join_uri(uri, step_dir_name(step_format, index.step));
  d["bytes"] = index.total_bytes();
  d["created_unix_ns"] = index.created_unix_ns;
  d["committed_unix_ns"] = index.committed_unix_ns;
  d["created_at"] = time_iso(index.created_unix_ns);
  d["committed_at"] = time_iso(index.committed_unix_ns);
  d["metadata_json"] = index.metadata_json;
  py::list files;
  for (const DataFileRecord& f : index.files) {
    py::dict fd;
    fd["name"] = f.name;
    fd["bytes"] = f.size;
    files.append(fd);
  }
  d["files"] = files;
  py::list leaves;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& leaf : p.leaves) {
      py::dict ld;
      ld["prefix"] = p.name;
      ld["path"] = leaf.path;
      ld["dtype"] = std::string(dtype_name(leaf.dtype));
      py::tuple shape(leaf.shape.size());
      for (size_t i = 0; i < leaf.shape.size(); ++i) shape[i] = py::int_(leaf.shape[i]);
      ld["shape"] = shape;
      ld["bytes"] = leaf.num_bytes();
      ld["shards"] = leaf.shards.size();
      leaves.append(ld);
    }
  d["leaves"] = leaves;
  return d;
}

// ---- gc ---------------------------------------------------------------------------

// Returns {removed: [{step, name, committed, bytes, path}], freed_bytes,
// kept_steps, error: None | (code, message)}; raises when the location
// cannot be opened or listed.
py::dict gc(const std::string& uri, int keep_last, int64_t keep_every, double min_age_seconds,
            const std::string& step_format, py::dict local, py::dict s3) {
  if (keep_last < 0 || keep_every < 0) throw StatusError(invalid_argument("gc: keep_last and keep_every must be >= 0"));
  // As the CLI's: keep_last=0 deletes no step, so keep_every would keep nothing more.
  if (keep_every > 0 && keep_last == 0)
    throw StatusError(invalid_argument("gc: keep_every needs keep_last > 0 (keep_last=0 deletes no step)"));
  if (!(min_age_seconds >= 0)) throw StatusError(invalid_argument("gc: min_age_seconds must be >= 0"));
  const Location l = location(uri, step_format, false, std::move(local), std::move(s3));
  std::vector<StepInfo> before, after;
  Status st;
  {
    py::gil_scoped_release nogil;
    st = [&]() -> Status {
      auto m = open_for_reading(l);
      if (!m.ok()) return m.status().annotate("open " + uri);
      CKPTIO_ASSIGN_OR_RETURN(before, (*m)->list_step_dirs());
      Status run;
      if (keep_last > 0) run = (*m)->apply_retention(keep_last, keep_every).annotate("retention");
      if (run.ok()) run = (*m)->gc(GcOptions{min_age_seconds}).annotate("gc");
      CKPTIO_ASSIGN_OR_RETURN(after, (*m)->list_step_dirs());
      return run;
    }();
  }
  if (before.empty() && after.empty() && !st.ok()) throw StatusError(st);
  std::set<std::string> left;
  for (const StepInfo& s : after) left.insert(s.name);
  py::list removed, kept;
  uint64_t freed = 0;
  for (const StepInfo& s : before) {
    if (left.count(s.name)) continue;
    py::dict d;
    d["step"] = s.step;
    d["name"] = s.name;
    d["committed"] = s.committed;
    d["bytes"] = s.bytes;
    d["path"] = join_uri(uri, s.name);
    removed.append(d);
    freed += s.bytes;
  }
  for (const StepInfo& s : after)
    if (s.committed) kept.append(s.step);
  py::dict out;
  out["removed"] = removed;
  out["freed_bytes"] = freed;
  out["kept_steps"] = kept;
  out["error"] = error_pair(st);
  return out;
}

}  // namespace

void bind_tools(py::module_& m) {
  m.def("cp", &cp, py::arg("src"), py::arg("dst"), py::arg("step"), py::arg("all"), py::arg("overwrite"),
        py::arg("skip_identical"), py::arg("src_step_format"), py::arg("dst_step_format"), py::arg("format"),
        py::arg("zstd_level"), py::arg("chunk_size"),
        py::arg("max_memory"), py::arg("src_local"), py::arg("src_s3"), py::arg("dst_local"), py::arg("dst_s3"),
        py::arg("on_progress"), "ckptio cp (see ckptio.cp)");
  m.def("verify", &verify, py::arg("uri"), py::arg("step"), py::arg("all"), py::arg("step_format"),
        py::arg("local"), py::arg("s3"), py::arg("on_progress"), "ckptio verify (see ckptio.verify)");
  m.def("inspect", &inspect, py::arg("uri"), py::arg("step"), py::arg("step_format"), py::arg("strict"),
        py::arg("local"), py::arg("s3"), "ckptio inspect (see ckptio.inspect)");
  m.def("gc", &gc, py::arg("uri"), py::arg("keep_last"), py::arg("keep_every"), py::arg("min_age_seconds"),
        py::arg("step_format"), py::arg("local"), py::arg("s3"), "ckptio gc (see ckptio.gc)");
}

}  // namespace ckptio::python
