#include "src/util/populate.h"

#include <atomic>
#include <cerrno>

#include <sys/resource.h>
#include <unistd.h>

#include "src/util/async.h"

namespace ckptio {

bool populate_for_write(void* p, size_t len) {
  const uintptr_t page = 4096;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t z = (reinterpret_cast<uintptr_t>(p) + len) & ~(page - 1);
  if (z <= a) return true;
  return ::madvise(reinterpret_cast<void*>(a), z - a, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
}

std::future<void> populate_in_background(std::vector<std::pair<std::byte*, uint64_t>> ranges,
                                         std::atomic<uint64_t>* populated, const std::atomic<bool>* stop) {
  static std::atomic<bool> works{true};  // false once the kernel refused (before 5.14)
  if (ranges.empty() || !works.load(std::memory_order_relaxed)) return {};
  return try_async([ranges = std::move(ranges), populated, stop] {
    // Faulting ahead is a helper: the reads fault what it has not reached.
    // At nice 19 it takes only the CPU no one else wants, so a caller's own
    // threads (a data loader, a Python thread) keep their share during a
    // restore (docs/restart.md, "The prefault thread yields").
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    constexpr uint64_t kSlice = 8ull << 20;
    for (auto r = ranges.rbegin(); r != ranges.rend(); ++r) {
      const auto [p, len] = *r;
      for (uint64_t end = len; end > 0;) {
        if (stop && stop->load(std::memory_order_relaxed)) return;
        const uint64_t begin = end > kSlice ? end - kSlice : 0;
        if (!populate_for_write(p + begin, end - begin)) return works.store(false);
        if (populated) populated->fetch_add(end - begin, std::memory_order_relaxed);
        end = begin;
      }
    }
  });
}

}  // namespace ckptio
