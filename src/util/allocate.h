// Buffer::allocate as a Status: where the system may refuse the memory and
// the caller must neither throw past its API nor end the process (a save's
// worker and writer threads), kResourceExhausted naming what it was for.
#pragma once

#include <cstddef>
#include <new>
#include <string>

#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

inline Result<Buffer> allocate_or_status(size_t size, size_t alignment, const std::string& what) {
  try {
    return Buffer::allocate(size, alignment);
  } catch (const std::bad_alloc&) {
    return out_of_memory(what + " (" + std::to_string(size) + " bytes)");
  }
}

}  // namespace ckptio
