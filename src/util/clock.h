// The two clocks a save's statistics and index read.
#pragma once

#include <chrono>
#include <cstdint>

namespace ckptio {

// Seconds of the steady clock since `t`.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Wall-clock time as Unix nanoseconds (an index's created/committed times).
inline int64_t unix_ns_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ckptio
