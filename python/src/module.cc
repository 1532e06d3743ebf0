// The extension module ckptio._ckptio: error translation, dtypes, and the
// manager (manager.cc). See binding.h for the division of work with the pure
// Python package.
#include <cstring>

#include "python/src/binding.h"

namespace ckptio::python {

void bind_tools(py::module_& m);    // tools.cc
void bind_barrier(py::module_& m);  // barrier.cc

namespace {
// code name -> exception class, filled by ckptio/errors.py through
// _set_error_classes. Never freed: a static py::object would be released
// after the interpreter is gone.
py::dict* error_classes = nullptr;

void raise_status(const Status& s) {
  const std::string msg = s.message().empty() ? std::string(code_name(s.code())) : s.message();
  PyObject* cls = PyExc_RuntimeError;
  if (error_classes != nullptr && error_classes->contains(code_name(s.code())))
    cls = (*error_classes)[code_name(s.code())].ptr();
  PyErr_SetString(cls, msg.c_str());
}
}  // namespace

DType dtype_from_name(const std::string& name, const std::string& leaf) {
  auto t = parse_dtype(name);
  if (!t) {
    std::string where = leaf.empty() ? "" : "leaf '" + leaf + "': ";
    throw StatusError(invalid_argument(where + "dtype '" + name + "' is not one a checkpoint can hold"));
  }
  return *t;
}

py::dtype carrier_dtype(DType t) {
  switch (t) {
    case DType::kBFloat16: return py::dtype("uint16");
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2: return py::dtype("uint8");
    default: return py::dtype(std::string(dtype_name(t)));
  }
}

py::array array_over(const Buffer& buffer, DType dtype, const Shape& shape) {
  // The capsule owns a copy of the Buffer, i.e. a share of its memory.
  auto* owner = new Buffer(buffer);
  py::capsule base(owner, [](void* p) { delete static_cast<Buffer*>(p); });
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  return py::array(carrier_dtype(dtype), dims, owner->data(), base);
}

}  // namespace ckptio::python

PYBIND11_MODULE(_ckptio, m) {
  using namespace ckptio;
  using namespace ckptio::python;
  m.doc() = "ckptio's C++ core; use the package `ckptio`, not this module.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      raise_status(e.status());
    }
  });
  m.def("_set_error_classes", [](py::dict classes) {
    if (error_classes == nullptr) error_classes = new py::dict();
    error_classes->clear();
    for (auto item : classes) (*error_classes)[item.first] = item.second;
  });
  m.def("_raise_status", [](const std::string& code, const std::string& message) {
    for (int c = 0; c <= static_cast<int>(kLastCode); ++c)
      if (code == code_name(static_cast<Code>(c))) throw StatusError(Status(static_cast<Code>(c), message));
    throw StatusError(Status(Code::kInternal, message));
  }, "Raises the ckptio.Error of a status code (tests).");
  m.def("dtype_names", [] {
    std::vector<std::string> names;
    for (int i = 0; i < kNumDTypes; ++i) names.emplace_back(dtype_name(static_cast<DType>(i)));
    return names;
  }, "The dtypes a checkpoint can hold, as the index spells them.");
  m.def("dtype_size", [](const std::string& name) { return dtype_size(dtype_from_name(name, "")); });

  bind_manager(m);
  bind_sharding(m);
  bind_tools(m);    // tools.cc: cp, verify, inspect, gc
  bind_barrier(m);  // barrier.cc
}
