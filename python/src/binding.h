// Shared parts of the extension module ckptio._ckptio: how a Status becomes
// a Python exception, and how dtypes and arrays cross the boundary.
//
// The module is a thin layer over the C++ API (include/ckptio/): the pure
// Python package (python/ckptio/) flattens pytrees, keeps borrowed arrays
// alive and runs the user's callbacks; this layer converts arrays to
// LeafViews and restored Buffers to numpy arrays without copying, and
// releases the GIL around every call that can block (I/O, waiting, copying).
// No thread of the library ever takes the GIL: nothing here hands a Python
// callable to the C++ side.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file of the module: type casters must agree

#include <stdexcept>
#include <string>

#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "ckptio/types.h"

namespace ckptio::python {

namespace py = pybind11;

// A non-OK Status on its way to Python; the translator registered in
// module.cc raises the ckptio.errors class of its code.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status s) : status_(std::move(s)), what_(status_.to_string()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T value_or_throw(Result<T>&& r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

// "float32" -> DType, or kInvalidArgument naming the leaf.
DType dtype_from_name(const std::string& name, const std::string& leaf);
// The numpy dtype that carries a ckptio dtype's bytes: its own where numpy
// has it, uint16 for bfloat16 and uint8 for the float8 kinds (the Python
// layer views them as ml_dtypes' types when it can).
py::dtype carrier_dtype(DType t);

// A numpy array over `buffer`'s bytes (no copy): the array owns a share of
// the buffer's memory.
py::array array_over(const Buffer& buffer, DType dtype, const Shape& shape);

// Storage options from a manager's `local` and `s3` dicts (manager.cc).
StorageOptions storage_options(py::dict local_d, py::dict s3_d);
void bind_manager(py::module_& m);
void bind_sharding(py::module_& m);  // sharding.cc

}  // namespace ckptio::python
