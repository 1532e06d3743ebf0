// Helpers for tests that fork(): is this a ThreadSanitizer (or
// AddressSanitizer) build, and which threads besides the caller are running
// (a parent must fork single-threaded).
#pragma once

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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

inline bool under_address_sanitizer() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
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

// other_threads(), polled until it is empty or `patience` has passed. A
// thread that was just joined can still be listed for a moment (the kernel
// wakes the joiner before it removes the task), and so can a library's
// helper thread that is finishing on its own; a thread that is still there
// after the wait is a real one.
inline std::vector<std::string> other_threads_after(std::chrono::milliseconds patience =
                                                        std::chrono::seconds(3)) {
  const auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    auto names = other_threads();
    if (names.empty() || std::chrono::steady_clock::now() >= until) return names;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace ckptio::testutil
