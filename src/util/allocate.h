// Buffer::allocate as a Status: where the system may refuse the memory and
// the caller must neither throw past its API nor end the process (a save's
// worker and writer threads), kResourceExhausted naming what it was for.
#pragma once

#include <cstddef>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

// `size` bytes of fresh anonymous memory at `alignment` (a power of two),
// mapped on their own: nothing of a heap, given back to the system by
// munmap(p, *mapped) (*mapped: `size` rounded up to whole pages). nullptr
// when the system refuses the mapping. Buffer::allocate maps its large
// buffers with it, the save's staging pool its chunks (types.cc).
std::byte* map_aligned(size_t size, size_t alignment, size_t* mapped);

// The Status `make()` builds, or, when building its message needs memory the
// system refuses too, a bare kResourceExhausted whose message fits the
// string's inline buffer (so that the fallback allocates nothing). For the
// paths that must report a failure and cannot throw: a write already
// partly in flight.
template <typename F>
Status status_or_out_of_memory(F&& make) noexcept {
  try {
    return make();
  } catch (...) {
    return Status(Code::kResourceExhausted, "out of memory");
  }
}

// Inside a catch block: the exception being handled as the Status of
// `what`: kResourceExhausted for std::bad_alloc (the system refused memory),
// kInternal for anything else. Throws nothing (status_or_out_of_memory).
inline Status status_of_exception(std::string_view what) noexcept {
  return status_or_out_of_memory([&] {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      return out_of_memory(std::string(what));
    } catch (const std::exception& e) {
      return internal_error(std::string(what) + ": " + e.what());
    } catch (...) {
      return internal_error(std::string(what) + ": an unknown exception");
    }
  });
}

// call()'s result, or what it throws as status_of_exception(what): for the
// API's calls that have nothing in flight when an exception unwinds them.
template <typename F>
auto returning_exceptions(std::string_view what, F&& call) -> decltype(call()) {
  try {
    return call();
  } catch (...) {
    return status_of_exception(what);
  }
}

inline Result<Buffer> allocate_or_status(size_t size, size_t alignment, const std::string& what) {
  try {
    return Buffer::allocate(size, alignment);
  } catch (const std::bad_alloc&) {
    return out_of_memory(what + " (" + std::to_string(size) + " bytes)");
  }
}

}  // namespace ckptio
