// CheckpointManager and SaveHandle for Python (ckptio._ckptio.Manager,
// ckptio._ckptio.SaveHandle). The Python class ckptio.CheckpointManager
// wraps these; see python/ckptio/manager.py.
//
// GIL: every call that can block (open, save's planning and copying, waits,
// discovery, restore, verify, gc, close) runs with the GIL released. Arrays
// handed to save() and restore(into=) are held by the Python caller for as
// long as the C++ side reads or writes them: save() in copy mode returns
// once it has copied them; in borrow mode the Python SaveHandle keeps them
// until the save is done; restore() runs while its caller's frame holds them.
//
// Closing: close() takes the manager out of the object and destroys it with
// the GIL released (the destructor waits for every save). A call running in
// another thread at that moment holds its own reference and finishes first.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>


#include "ckptio/local.h"
#include "ckptio/manager.h"
#include "ckptio/s3.h"
#include "python/src/binding.h"
#include "python/src/sharding.h"

namespace ckptio::python {

namespace {

// ---- options ------------------------------------------------------------------

// Moves d[key] into `out` if present, and removes it from d, so that what is
// left over at the end is an unknown option.
template <typename T>
void take(py::dict& d, const char* key, T& out) {
  if (!d.contains(key)) return;
  py::object v = d[key];
  PyDict_DelItemString(d.ptr(), key);
  if (v.is_none()) return;
  try {
    out = v.cast<T>();
  } catch (const py::cast_error&) {
    throw StatusError(invalid_argument(std::string("option ") + key + ": cannot take " +
                                       std::string(py::str(py::repr(v)))));
  }
}

void reject_unknown(const py::dict& d, const std::string& what) {
  if (d.empty()) return;
  std::string names;
  for (auto item : d) names += (names.empty() ? "" : ", ") + std::string(py::str(item.first));
  throw StatusError(invalid_argument("unknown " + what + " option(s): " + names));
}

}  // namespace
std::shared_ptr<SaveBarrier> python_barrier(py::object barrier);  // barrier.cc
namespace {

ManagerOptions manager_options(py::dict d) {
  ManagerOptions o;
  take(d, "step_format", o.step_format);
  take(d, "layout", o.layout);
  std::string staging = "copy";
  take(d, "staging", staging);
  if (staging == "copy") o.staging = StagingMode::kCopy;
  else if (staging == "borrow") o.staging = StagingMode::kBorrow;
  else throw StatusError(invalid_argument("staging must be \"copy\" or \"borrow\", not \"" + staging + "\""));
  take(d, "staging_budget", o.staging_budget);
  take(d, "chunk_size", o.chunk_size);
  take(d, "max_in_flight", o.max_in_flight);
  take(d, "max_to_keep", o.max_to_keep);
  take(d, "keep_every", o.keep_every);
  take(d, "strict", o.strict);
  if (d.contains("processes")) {
    py::dict p = py::dict(d["processes"]);
    PyDict_DelItemString(d.ptr(), "processes");
    take(p, "index", o.processes.index);
    take(p, "count", o.processes.count);
    take(p, "run_id", o.processes.run_id);
    take(p, "timeout_seconds", o.processes.timeout_seconds);
    take(p, "poll_seconds", o.processes.poll_seconds);
    reject_unknown(p, "processes");
  }
  if (d.contains("barrier")) {  // a SaveBarrier made of a Python callable (barrier.cc)
    py::object b = d["barrier"];
    PyDict_DelItemString(d.ptr(), "barrier");
    if (!b.is_none()) o.processes.barrier = python_barrier(b);
  }
  reject_unknown(d, "manager");
  return o;
}

}  // namespace

// The local and S3 options of a manager or of the module-level tools
// (tools.cc): every key taken, any other refused.
StorageOptions storage_options(py::dict local_d, py::dict s3_d) {
  StorageOptions o;
  LocalOptions& local = o.get<LocalOptions>();
  take(local_d, "direct_io", local.direct_io);
  take(local_d, "read_mode", local.read_mode);
  take(local_d, "request_size", local.request_size);
  take(local_d, "queue_depth", local.queue_depth);
  reject_unknown(local_d, "local storage");
  S3Options& s3 = o.get<S3Options>();
  take(s3_d, "endpoint", s3.endpoint);
  take(s3_d, "region", s3.region);
  take(s3_d, "profile", s3.profile);
  take(s3_d, "access_key_id", s3.access_key_id);
  take(s3_d, "secret_access_key", s3.secret_access_key);
  take(s3_d, "session_token", s3.session_token);
  take(s3_d, "anonymous", s3.anonymous);
  take(s3_d, "addressing", s3.addressing);
  take(s3_d, "part_size", s3.part_size);
  take(s3_d, "max_connections", s3.max_connections);
  take(s3_d, "max_attempts", s3.max_attempts);
  take(s3_d, "retry_base_s", s3.retry_base_s);
  take(s3_d, "retry_cap_s", s3.retry_cap_s);
  take(s3_d, "timeout_s", s3.timeout_s);
  take(s3_d, "payload_signing", s3.payload_signing);
  take(s3_d, "checksums", s3.checksums);
  take(s3_d, "sse", s3.sse);
  take(s3_d, "sse_kms_key_id", s3.sse_kms_key_id);
  take(s3_d, "storage_class", s3.storage_class);
  reject_unknown(s3_d, "S3");
  return o;
}

namespace {

// ---- conversions ----------------------------------------------------------------

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

py::dict save_stats_dict(const SaveStats& s) {
  py::dict d;
  d["bytes"] = s.bytes;
  d["stall_seconds"] = s.stall_seconds;
  d["write_seconds"] = s.write_seconds;
  d["commit_seconds"] = s.commit_seconds;
  d["total_seconds"] = s.total_seconds;
  return d;
}

py::dict restore_stats_dict(const RestoreStats& s) {
  py::dict d;
  d["bytes_needed"] = s.bytes_needed;
  d["bytes_read"] = s.bytes_read;
  d["requests"] = s.requests;
  d["seconds"] = s.seconds;
  d["index_seconds"] = s.index_seconds;
  d["plan_seconds"] = s.plan_seconds;
  d["read_seconds"] = s.read_seconds;
  d["bytes_prefaulted"] = s.bytes_prefaulted;
  return d;
}

std::string leaf_name(const std::string& prefix, const std::string& path) { return prefix + "/" + path; }

// A C-contiguous array whose items are `dtype`'s size, or kInvalidArgument
// naming the leaf. (The Python layer has already turned tensors, scalars
// and buffers into numpy arrays, and ml_dtypes' types into their carriers.)
py::array checked_array(py::handle obj, DType dtype, const std::string& name, bool writable) {
  if (!py::isinstance<py::array>(obj))
    throw StatusError(invalid_argument("leaf '" + name + "': not a numpy array"));
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style))
    throw StatusError(invalid_argument("leaf '" + name + "': the array is not C-contiguous"));
  if (static_cast<size_t>(a.itemsize()) != dtype_size(dtype))
    throw StatusError(invalid_argument("leaf '" + name + "': items of " + std::to_string(a.itemsize()) +
                                       " bytes for dtype " + std::string(dtype_name(dtype))));
  if (writable && !a.writeable())
    throw StatusError(invalid_argument("leaf '" + name + "': the array is read-only"));
  return a;
}

// A save() refused before it reached the manager (the state could not be
// converted): counted for a group (CheckpointManager::refused_save), so that
// the other processes fail the attempt at once and the next save of the
// step has one attempt id everywhere. A failure to tell them is a warning
// in Python's log: the caller's own error is the one raised.
void refused_save(const std::shared_ptr<CheckpointManager>& m, int64_t step, const std::string& why) {
  Status st;
  {
    py::gil_scoped_release nogil;
    st = m->refused_save(step, invalid_argument(why));
  }
  if (!st.ok() && PyErr_WarnEx(PyExc_RuntimeWarning,
                               ("ckptio: could not tell the other processes that the save of step " +
                                std::to_string(step) + " was refused: " + st.to_string())
                                   .c_str(),
                               1) != 0)
    PyErr_Clear();  // (warnings as errors: the caller's own error is the one raised)
}

// ---- the classes ------------------------------------------------------------------

class PyManager {
 public:
  PyManager(const std::string& uri, py::dict manager, py::dict local, py::dict s3) {
    ManagerOptions mo = manager_options(std::move(manager));
    StorageOptions so = storage_options(std::move(local), std::move(s3));
    Result<std::unique_ptr<CheckpointManager>> opened = Status::OK();
    {
      py::gil_scoped_release nogil;
      opened = CheckpointManager::open(uri, std::move(mo), so);
    }
    m_ = value_or_throw(std::move(opened));
  }

  // Garbage collected without close(): the destructor of the manager waits
  // for every save, which needs no Python; let other threads run meanwhile.
  ~PyManager() {
    if (!m_) return;
    if (PyGILState_Check() && !_Py_IsFinalizing()) {
      py::gil_scoped_release nogil;
      m_.reset();
    }
  }

  // Each call holds its own reference, so that close() in another thread
  // cannot pull the manager from under it, and counts as in flight until it
  // returns: close() waits for those calls before it drops the manager.
  // Else a call's reference could be the last one, dropped as the call
  // returns with the GIL held, and the destructor's wait for every save would
  // run with the GIL (a deadlock when a save's barrier needs it), after a
  // close() that had returned before the save it raced was even queued.
  std::shared_ptr<CheckpointManager> get() {
    std::lock_guard lock(calls_mu_);
    if (!m_) throw StatusError(Status(Code::kFailedPrecondition, "the checkpoint manager is closed"));
    auto it = callers_.insert(std::this_thread::get_id());  // may throw: nothing to undo yet
    std::shared_ptr<Call> call;
    try {
      call = std::make_shared<Call>(this, m_);
    } catch (...) {
      callers_.erase(it);  // else close() would wait for this call forever
      throw;
    }
    return std::shared_ptr<CheckpointManager>(call, call->m.get());  // the call ends with its last copy
  }

  bool closed() const { return m_ == nullptr; }

  void close() {
    std::shared_ptr<CheckpointManager> m;
    {
      std::lock_guard lock(calls_mu_);
      if (callers_.count(std::this_thread::get_id()))
        throw StatusError(Status(Code::kFailedPrecondition,
                                 "close() from inside a call of the same checkpoint manager (a progress callback?)"));
      m = std::move(m_);
    }
    py::gil_scoped_release nogil;
    {
      std::unique_lock lock(calls_mu_);
      calls_done_.wait(lock, [&] { return callers_.empty(); });
    }
    m.reset();  // the destructor waits for every save
  }

  // leaves: [(prefix, path, dtype name, numpy array), ...]; a sharded leaf
  // is (prefix, path, dtype name, shape, [(start, stop, numpy array)]).
  SaveHandle save(int64_t step, const py::list& leaves, const std::string& metadata_json, bool overwrite,
                  std::optional<std::string> float_dtype) {
    auto m = get();
    std::vector<LeafView> views;
    SaveOptions so;
    try {  // a state refused here is a save() refused: counted for a group (refused_save)
      views.reserve(leaves.size());
      for (py::handle item : leaves) {
        auto t = py::reinterpret_borrow<py::tuple>(item);
        if (t.size() == 5) {
          views.push_back(sharded_leaf_from_python(t));
          continue;
        }
        LeafView v;
        v.prefix = t[0].cast<std::string>();
        v.path = t[1].cast<std::string>();
        v.dtype = dtype_from_name(t[2].cast<std::string>(), leaf_name(v.prefix, v.path));
        py::array a = checked_array(t[3], v.dtype, leaf_name(v.prefix, v.path), false);
        v.shape.assign(a.shape(), a.shape() + a.ndim());
        v.shards.push_back(ShardView{Box::whole(v.shape), a.data()});
        views.push_back(std::move(v));
      }
      so.metadata_json = metadata_json;
      so.overwrite = overwrite;
      if (float_dtype) so.float_dtype = dtype_from_name(*float_dtype, "");
    } catch (const std::exception& e) {
      refused_save(m, step, e.what());
      throw;
    }
    Result<SaveHandle> h = Status::OK();
    {
      py::gil_scoped_release nogil;
      h = m->save(step, std::move(views), so);
    }
    return value_or_throw(std::move(h));
  }

  // CheckpointManager::refused_save, for a save the Python layer refused.
  void refused(int64_t step, const std::string& why) { refused_save(get(), step, why); }

  void wait_until_finished() {
    auto m = get();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = m->wait_until_finished();
    }
    throw_if_error(s);
  }

  void prepare_staging(uint64_t bytes) {
    auto m = get();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = m->prepare_staging(bytes);
    }
    throw_if_error(s);
  }

  std::vector<int64_t> all_steps() {
    auto m = get();
    Result<std::vector<int64_t>> r = Status::OK();
    {
      py::gil_scoped_release nogil;
      r = m->all_steps();
    }
    return value_or_throw(std::move(r));
  }

  std::optional<int64_t> latest_step() {
    auto m = get();
    Result<std::optional<int64_t>> r = Status::OK();
    {
      py::gil_scoped_release nogil;
      r = m->latest_step();
    }
    return value_or_throw(std::move(r));
  }

  py::list list_step_dirs() {
    auto m = get();
    Result<std::vector<StepInfo>> r = Status::OK();
    {
      py::gil_scoped_release nogil;
      r = m->list_step_dirs();
    }
    py::list out;
    for (const StepInfo& s : value_or_throw(std::move(r))) {
      py::dict d;
      d["step"] = s.step;
      d["name"] = s.name;
      d["committed"] = s.committed;
      d["bytes"] = s.bytes;
      d["committed_unix_ns"] = s.committed_unix_ns;
      out.append(d);
    }
    return out;
  }

  py::dict read_index(int64_t step) {
    auto m = get();
    Result<Index> r = Status::OK();
    {
      py::gil_scoped_release nogil;
      r = m->read_index(step);
    }
    Index index = value_or_throw(std::move(r));
    py::dict d;
    d["step"] = index.step;
    d["created_unix_ns"] = index.created_unix_ns;
    d["committed_unix_ns"] = index.committed_unix_ns;
    d["metadata_json"] = index.metadata_json;
    d["total_bytes"] = index.total_bytes();
    py::list leaves;
    for (const PrefixRecord& p : index.prefixes)
      for (const LeafRecord& l : p.leaves)
        leaves.append(py::make_tuple(p.name, l.path, std::string(dtype_name(l.dtype)), shape_tuple(l.shape),
                                     l.num_bytes(), l.shards.size()));
    d["leaves"] = leaves;
    return d;
  }

  // expected: [(prefix, path, dtype, shape), ...]; into: [(prefix, path,
  // numpy array), ...]. Returns {step, metadata_json, leaves: [(prefix,
  // path, dtype, array)], stats, skipped: [(step, message)]}. sharding: the
  // dict of sharding.h's restore_sharding_from_python; each leaf is then
  // (prefix, path, dtype, shape, device_shards_to_python(...)).
  py::dict restore(std::optional<int64_t> step, std::vector<std::string> prefixes, std::string regex,
                   const py::list& expected, bool allow_cast, std::optional<std::string> float_dtype,
                   const py::list& into, bool verify, std::optional<py::dict> sharding, bool fill_missing_chunks) {
    auto m = get();
    RestoreOptions o;
    o.select.prefixes = std::move(prefixes);
    o.select.path_regex = std::move(regex);
    for (py::handle item : expected) {
      auto t = py::reinterpret_borrow<py::tuple>(item);
      LeafSpec s;
      s.prefix = t[0].cast<std::string>();
      s.path = t[1].cast<std::string>();
      s.dtype = dtype_from_name(t[2].cast<std::string>(), leaf_name(s.prefix, s.path));
      s.shape = t[3].cast<std::vector<int64_t>>();
      o.expected.push_back(std::move(s));
    }
    o.allow_cast = allow_cast;
    if (float_dtype) o.float_dtype = dtype_from_name(*float_dtype, "");
    o.verify = verify;
    o.fill_missing_chunks = fill_missing_chunks;
    for (py::handle item : into) {
      auto t = py::reinterpret_borrow<py::tuple>(item);
      RestoreOptions::Destination dst;
      dst.prefix = t[0].cast<std::string>();
      dst.path = t[1].cast<std::string>();
      const std::string name = leaf_name(dst.prefix, dst.path);
      if (!py::isinstance<py::array>(t[2]))
        throw StatusError(invalid_argument("into '" + name + "': not a numpy array"));
      auto a = py::reinterpret_borrow<py::array>(t[2]);
      if (!(a.flags() & py::array::c_style))
        throw StatusError(invalid_argument("into '" + name + "': the array is not C-contiguous"));
      if (!a.writeable()) throw StatusError(invalid_argument("into '" + name + "': the array is read-only"));
      dst.data = a.mutable_data();
      dst.size = static_cast<uint64_t>(a.nbytes());
      o.into.push_back(std::move(dst));
    }
    if (sharding) o.sharding = restore_sharding_from_python(*sharding);
    Result<RestoredState> r = Status::OK();
    {
      py::gil_scoped_release nogil;
      r = m->restore(step, o);
    }
    RestoredState state = value_or_throw(std::move(r));
    py::dict d;
    d["step"] = state.step;
    d["metadata_json"] = state.metadata_json;
    py::list leaves;
    for (const Tensor& t : state.leaves) {
      if (o.sharding) {  // (prefix, path, dtype, shape, (spec JSON, device shards))
        leaves.append(py::make_tuple(t.prefix, t.path, std::string(dtype_name(t.dtype)), shape_tuple(t.shape),
                                     device_shards_to_python(t, *o.sharding)));
        continue;
      }
      leaves.append(py::make_tuple(t.prefix, t.path, std::string(dtype_name(t.dtype)),
                                   array_over(t.data, t.dtype, t.shape)));
    }
    d["leaves"] = leaves;
    d["stats"] = restore_stats_dict(state.stats);
    py::list skipped;
    for (const SkippedStep& s : state.skipped) skipped.append(py::make_tuple(s.step, s.error.to_string()));
    d["skipped"] = skipped;
    return d;
  }

  void verify(int64_t step) { call([&](CheckpointManager& m) { return m.verify(step); }); }
  void remove_step(int64_t step) { call([&](CheckpointManager& m) { return m.remove_step(step); }); }
  void apply_retention(int max_to_keep, int64_t keep_every) {
    call([&](CheckpointManager& m) { return m.apply_retention(max_to_keep, keep_every); });
  }
  void gc(double min_age_seconds) {
    call([&](CheckpointManager& m) { return m.gc(GcOptions{.min_age_seconds = min_age_seconds}); });
  }

 private:
  template <typename F>
  void call(F&& f) {
    auto m = get();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = f(*m);
    }
    throw_if_error(s);
  }

  // One call in flight: drops its reference, then leaves callers_.
  struct Call {
    Call(PyManager* owner, std::shared_ptr<CheckpointManager> manager)
        : p(owner), m(std::move(manager)), thread(std::this_thread::get_id()) {}
    ~Call() {
      m.reset();  // never the last reference: close() keeps its own until callers_ is empty
      std::lock_guard lock(p->calls_mu_);
      p->callers_.erase(p->callers_.find(thread));
      if (p->callers_.empty()) p->calls_done_.notify_all();
    }
    PyManager* p;
    std::shared_ptr<CheckpointManager> m;
    std::thread::id thread;
  };

  std::shared_ptr<CheckpointManager> m_;
  std::mutex calls_mu_;
  std::condition_variable calls_done_;
  std::multiset<std::thread::id> callers_;  // the threads of the calls in flight
};

}  // namespace

void bind_manager(py::module_& m) {
  py::class_<SaveHandle>(m, "SaveHandle")
      .def_property_readonly("step", &SaveHandle::step)
      .def("done", &SaveHandle::done)
      .def("released", &SaveHandle::released)
      .def("wait", [](const SaveHandle& h) {
        Status s;
        {
          py::gil_scoped_release nogil;
          s = h.wait();
        }
        throw_if_error(s);
      }, "Waits until the save committed or failed; raises its error.")
      .def("wait_released", &SaveHandle::wait_released, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const SaveHandle& h) { return save_stats_dict(h.stats()); })
      .def("progress", [](const SaveHandle& h) {
        SaveProgress p = h.progress();
        py::dict d;
        d["total"] = p.total;
        d["staged"] = p.staged;
        d["written"] = p.written;
        d["durable"] = p.durable;
        return d;
      });

  py::class_<PyManager>(m, "Manager")
      .def(py::init<const std::string&, py::dict, py::dict, py::dict>(), py::arg("uri"),
           py::arg("manager") = py::dict(), py::arg("local") = py::dict(), py::arg("s3") = py::dict())
      .def_property_readonly("closed", &PyManager::closed)
      .def("close", &PyManager::close)
      .def("save", &PyManager::save, py::arg("step"), py::arg("leaves"), py::arg("metadata_json") = "{}",
           py::arg("overwrite") = false, py::arg("float_dtype") = py::none())
      .def("refused_save", &PyManager::refused, py::arg("step"), py::arg("why"))
      .def("wait_until_finished", &PyManager::wait_until_finished)
      .def("prepare_staging", &PyManager::prepare_staging)
      .def("all_steps", &PyManager::all_steps)
      .def("latest_step", &PyManager::latest_step)
      .def("list_step_dirs", &PyManager::list_step_dirs)
      .def("read_index", &PyManager::read_index)
      .def("restore", &PyManager::restore, py::arg("step"), py::arg("prefixes"), py::arg("regex"),
           py::arg("expected"), py::arg("allow_cast"), py::arg("float_dtype"), py::arg("into"),
           py::arg("verify"), py::arg("sharding") = py::none(), py::arg("fill_missing_chunks") = false)
      .def("verify", &PyManager::verify)
      .def("remove_step", &PyManager::remove_step)
      .def("apply_retention", &PyManager::apply_retention)
      .def("gc", &PyManager::gc, py::arg("min_age_seconds") = 0.0);
}

}  // namespace ckptio::python
