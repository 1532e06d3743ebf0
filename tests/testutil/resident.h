// Resident memory of the test process, from /proc/self/statm (0 if
// unreadable): what tests of fresh-memory handling watch grow.
#pragma once

#include <cstdint>
#include <fstream>

#include <unistd.h>

namespace ckptio::testutil {

inline uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace ckptio::testutil
