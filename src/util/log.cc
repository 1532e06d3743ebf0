// The one translation unit of the library that includes spdlog (log.h).
#include "src/util/log.h"

#include <spdlog/spdlog.h>

namespace ckptio::logging {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
  }
  return spdlog::level::err;
}

}  // namespace

bool enabled(Level level) noexcept { return spdlog::default_logger_raw()->should_log(to_spdlog(level)); }

void write(Level level, std::string_view message) noexcept {
  try {  // (spdlog reports its own failures to its error handler; this is for what that throws)
    spdlog::default_logger_raw()->log(to_spdlog(level), message);
  } catch (...) {
  }
}

}  // namespace ckptio::logging
