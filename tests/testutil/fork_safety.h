// Helpers for tests that fork(): is this a ThreadSanitizer build, and which
// threads besides the caller are running (a parent must fork single-threaded).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ckptio::testutil {

inline bool under_thread_sanitizer() {
#if defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return true;
#endif
#endif
  return false;
}

// fork() copies only the calling thread: a parent with other threads (a
// manager's worker, a ring's completion thread, an HTTP loop) could hand the
// child a lock held forever. io_uring's kernel workers (iou-wrk-*, iou-sqp-*)
// are listed as threads of the process and linger a moment after their ring
// closed; they hold no user space lock, so they do not count. Returns the
// names of the others.
inline std::vector<std::string> other_threads() {
  std::vector<std::string> names;
  const std::string self = std::to_string(::gettid());
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    if (e.path().filename() == self) continue;
    std::ifstream in(e.path() / "comm");
    std::string comm;
    std::getline(in, comm);
    if (comm.rfind("iou-", 0) == 0) continue;
    names.push_back(comm + " (" + e.path().filename().string() + ")");
  }
  return names;
}

}  // namespace ckptio::testutil
