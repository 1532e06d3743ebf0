// The progress line: redrawn on stderr every 200 ms by its own thread, only
// when stderr is a terminal.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "tools/cli/cli.h"

namespace ckptio::cli {

bool Progress::enabled() {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  return tty;
}

Progress::Progress(std::string label, uint64_t total, std::function<uint64_t()> done)
    : label_(std::move(label)), done_(std::move(done)), total_(total) {
  if (enabled()) thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() { stop(); }

void Progress::set_label(std::string label) {
  std::lock_guard lock(mu_);
  label_ = std::move(label);
}

void Progress::watch(std::function<uint64_t()> done, std::function<uint64_t()> total) {
  std::lock_guard lock(mu_);
  done_ = std::move(done);
  total_fn_ = std::move(total);
}

void Progress::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

std::string Progress::line(double elapsed, int tick) {
  static const char kSpin[] = {'|', '/', '-', '\\'};
  std::string s;
  std::function<uint64_t()> done_fn, total_fn;
  {
    std::lock_guard lock(mu_);
    s = label_;
    done_fn = done_;
    total_fn = total_fn_;
  }
  uint64_t total = total_fn ? total_fn() : 0;
  if (total == 0) total = total_;
  char buf[64];
  if (done_fn) {
    const uint64_t done = done_fn();
    s += ": " + format_bytes(done);
    if (total > 0) {
      std::snprintf(buf, sizeof buf, " / %s (%.0f%%)", format_bytes(total).c_str(),
                    100.0 * static_cast<double>(done) / static_cast<double>(total));
      s += buf;
    }
    s += ", " + format_gbps(done, elapsed);
  } else {
    s += std::string(" ") + kSpin[tick % 4];
    if (total > 0) s += " " + format_bytes(total);
  }
  std::snprintf(buf, sizeof buf, ", %.1f s", elapsed);
  return s + buf;
}

void Progress::loop() {
  const auto t0 = std::chrono::steady_clock::now();
  for (int tick = 0;; ++tick) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_; })) return;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string l = line(elapsed, tick);
    std::fprintf(stderr, "\r\033[K%s", l.c_str());
    std::fflush(stderr);
  }
}

}  // namespace ckptio::cli
