// The library's log: spdlog's default logger, reached through one translation
// unit (log.cc). A caller includes this header and fmt's core only, so that
// spdlog's headers are compiled once: under ThreadSanitizer spdlog is
// header-only (CMakeLists.txt says why), and its implementation then cost
// ~15 s of compile time in each of the 18 files that logged.
//
//   logging::warn("ckptio: skipping step {}: {}", step, why);
//
// A message below the logger's level is not formatted.
#pragma once

#include <fmt/core.h>

#include <string_view>
#include <utility>

namespace ckptio::logging {

enum class Level { kDebug, kInfo, kWarn, kError };

bool enabled(Level level) noexcept;                        // the default logger's level lets it through
void write(Level level, std::string_view message) noexcept;  // to the default logger

// Never throws: a line the system has no memory to format is dropped (a
// logger must not change the control flow of the threads that must not
// throw: the worker, the reaper, a backend's threads, a failure's path).
template <typename... Args>
void emit(Level level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!enabled(level)) return;
  try {
    write(level, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
  }
}
// Runs `log`, a logging call, and drops what it throws: the arguments of a
// call are built before it runs (a Status's to_string(), a time's text) and
// may throw std::bad_alloc. For the threads that must not throw.
template <typename F>
void quietly(F&& log) noexcept {
  try {
    log();
  } catch (...) {
  }
}
template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  emit(Level::kDebug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  emit(Level::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  emit(Level::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  emit(Level::kError, format, std::forward<Args>(args)...);
}

}  // namespace ckptio::logging
