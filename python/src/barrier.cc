// A SaveBarrier (include/ckptio/manager.h) made of a Python callable, for
// CheckpointManager(barrier=...): ckptio.TorchBarrier (python/ckptio/
// distributed.py) or any object with wait(name, timeout_seconds).
//
// The library calls wait() from a manager's worker thread, twice per
// multi-process save ("<...>/written", "<...>/decided"). This is the one
// place where a thread of the library takes the GIL: for the Python call
// only, never while it waits for anything else. The callable is expected to
// release the GIL while it blocks (torch's store calls do), or it stalls the
// trainer's threads for as long as it waits.
//
// The contract, as the Python side sees it: wait(name, timeout_seconds)
// returns once every process of the group called it with `name`; raises
// TimeoutError (or returns False) after timeout_seconds, which the save
// reports as Unavailable; a ckptio.Error it raises keeps its code; anything
// else it raises fails the save as Cancelled ("the barrier callback
// raised"). A failure fails the save on this process; the others learn it
// from the storage or their own barrier timeout.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "ckptio/manager.h"
#include "python/src/binding.h"

namespace ckptio::python {

namespace {

bool interpreter_alive() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

// With the GIL: the Status for what the barrier raised. (The library names
// the barrier in its message.)
Status status_of_exception(py::error_already_set& e) {
  // What raises while the exception is read (its __str__, its `code`) is
  // told as such: nothing leaves this function but a Status.
  std::string type = "an exception";
  try {
    type = std::string(py::str(e.type().attr("__name__")));
    py::object value = e.value();
    const std::string text = std::string(py::str(value));
    if (e.matches(PyExc_TimeoutError)) return Status(Code::kUnavailable, text.empty() ? type : text);
    if (py::hasattr(value, "code")) {
      py::object code = value.attr("code");
      if (py::isinstance<py::str>(code)) {
        const std::string c = code.cast<std::string>();
        for (int i = 1; i <= static_cast<int>(kLastCode); ++i)
          if (c == code_name(static_cast<Code>(i))) return Status(static_cast<Code>(i), text);
      }
    }
    return Status(Code::kCancelled, "the barrier callback raised " + type + (text.empty() ? "" : ": " + text));
  } catch (py::error_already_set& inner) {
    inner.discard_as_unraisable("ckptio: reading the exception a barrier raised");
  } catch (const std::exception&) {
  }
  return Status(Code::kCancelled, "the barrier callback raised " + type + " (which could not be shown)");
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

class PyBarrier : public SaveBarrier {
 public:
  explicit PyBarrier(py::object wait) : wait_(std::move(wait)) {}

  // The last reference may go on any thread (the manager's destructor runs
  // with the GIL released); without an interpreter the object is leaked.
  ~PyBarrier() override {
    if (interpreter_alive()) {
      py::gil_scoped_acquire gil;
      wait_ = py::object();
    } else {
      wait_.release();
    }
  }

  Status wait(const std::string& name, double timeout_seconds) override {
    if (!interpreter_alive())
      return Status(Code::kCancelled, "the Python interpreter is shutting down");
    py::gil_scoped_acquire gil;
    try {
      py::object r = wait_(name, timeout_seconds);
      // False, or numpy's False: not every process came. (Other values are
      // what a barrier returns on arrival: threading.Barrier.wait's index.)
      const bool is_bool = py::isinstance<py::bool_>(r) ||
                           std::string(Py_TYPE(r.ptr())->tp_name) == "numpy.bool_";
      if (is_bool && !r.cast<bool>())
        return Status(Code::kUnavailable, "not every process arrived within " + seconds_text(timeout_seconds) + " s");
      return Status::OK();
    } catch (py::error_already_set& e) {
      return status_of_exception(e);
    } catch (const std::exception& e) {
      return Status(Code::kCancelled, std::string("the barrier callback threw: ") + e.what());
    }
  }

 private:
  py::object wait_;
};

}  // namespace

// For manager.cc's barrier= option: a callable(name, timeout_seconds), or an
// object with such a wait method.
std::shared_ptr<SaveBarrier> python_barrier(py::object barrier) {
  py::object fn = barrier;
  if (py::hasattr(barrier, "wait")) fn = barrier.attr("wait");
  if (!PyCallable_Check(fn.ptr()))
    throw StatusError(invalid_argument("barrier: expected an object with wait(name, timeout_seconds) or a "
                                       "callable, not " + std::string(py::str(py::repr(barrier)))));
  return std::make_shared<PyBarrier>(std::move(fn));
}

void bind_barrier(py::module_& m) {
  // Calls a barrier as the library does, from a thread that is not Python's
  // (tests): returns None or (code, message).
  m.def("_barrier_wait_on_thread", [](py::object barrier, const std::string& name, double timeout_seconds) {
    std::shared_ptr<SaveBarrier> b = python_barrier(std::move(barrier));
    Status st;
    {
      py::gil_scoped_release nogil;
      std::thread t([&] { st = b->wait(name, timeout_seconds); });
      t.join();
      // The last reference to the barrier goes here, without the GIL, as in
      // a manager's destructor.
      b.reset();
    }
    if (st.ok()) return py::object(py::none());
    return py::object(py::make_tuple(std::string(code_name(st.code())), st.message()));
  }, py::arg("barrier"), py::arg("name"), py::arg("timeout_seconds"));
}

}  // namespace ckptio::python
