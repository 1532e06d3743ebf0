#include "src/util/populate.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include <sys/resource.h>
#include <unistd.h>

#include "src/util/async.h"
#include "src/util/log.h"

namespace ckptio {

namespace {

constexpr uintptr_t kPage = 4096;

// The whole pages of [p, p + len): [first, end), empty when first >= end.
std::pair<uintptr_t, uintptr_t> whole_pages(const void* p, size_t len) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  return {(at + kPage - 1) & ~(kPage - 1), (at + len) & ~(kPage - 1)};
}

// One load from each whole page of [p, p + len), from user space, its value
// unused. On a VM whose host shadows the guest's page tables (a PVM guest),
// the first user access of each 4 KiB page traps to the host, about 5 us,
// even after MADV_POPULATE_WRITE faulted it in: 2.6 s per 2 GiB, which the
// restore's checksums paid on the thread that delivers every read. Taken
// here, it is paid on this thread's core instead (2 GiB restart 1.31x faster
// there, 11 pairs; docs/restart.md, "The prefault thread also touches each
// page"). Elsewhere a load of a mapped page costs a TLB miss. The loads are
// asm, not C++ accesses: the bytes may be landing at the same time.
inline void load_byte(uintptr_t q) {
#if defined(__x86_64__)
  unsigned char v;
  asm volatile("movb (%1), %0" : "=r"(v) : "r"(q) : "memory");
#elif defined(__aarch64__)
  unsigned v;
  asm volatile("ldrb %w0, [%1]" : "=r"(v) : "r"(q) : "memory");
#else
  (void)*reinterpret_cast<const volatile unsigned char*>(q);
#endif
}

void touch_pages(const std::byte* p, size_t len) {
  const auto [a, z] = whole_pages(p, len);
  for (uintptr_t q = a; q < z; q += kPage) load_byte(q);
}

// A first load costing more than this over a second one is a trap, not a
// TLB miss (a few hundred nanoseconds at worst).
constexpr double kTrapNs = 1000;

std::mutex probe_mu;
std::optional<bool> first_touch_verdict;  // under probe_mu

}  // namespace

FirstTouchProbe probe_first_touch() {
  constexpr size_t kPages = 64;
  FirstTouchProbe out;
  void* m = ::mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return out;
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  if (::madvise(m, kPages * kPage, MADV_POPULATE_WRITE) == 0) {
    auto median_load_ns = [&] {
      std::array<double, kPages> ns;
      for (size_t i = 0; i < kPages; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        load_byte(base + i * kPage);
        ns[i] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      }
      std::nth_element(ns.begin(), ns.begin() + kPages / 2, ns.end());
      return ns[kPages / 2];
    };
    out.first_ns = median_load_ns();
    out.again_ns = median_load_ns();
    out.traps = out.first_ns - out.again_ns > kTrapNs;
  }
  ::munmap(m, kPages * kPage);
  return out;
}

bool first_touch_traps() {
  std::lock_guard lock(probe_mu);
  if (first_touch_verdict) return *first_touch_verdict;
  const char* env = std::getenv("CKPTIO_FIRST_TOUCH");
  if (env && std::strcmp(env, "trap") == 0) {
    first_touch_verdict = true;
  } else if (env && std::strcmp(env, "cheap") == 0) {
    first_touch_verdict = false;
  } else {
    const FirstTouchProbe p = probe_first_touch();
    first_touch_verdict = p.traps;
    logging::debug("ckptio: a first load from a freshly populated page takes {:.0f} ns, a second {:.0f} ns: {}",
                   p.first_ns, p.again_ns, p.traps ? "a trap to the host (faulting ahead pays)" : "no trap");
  }
  return *first_touch_verdict;
}

void set_first_touch_traps_for_testing(std::optional<bool> traps) {
  std::lock_guard lock(probe_mu);
  first_touch_verdict = traps;
}

bool populate_for_write(void* p, size_t len) {
  const auto [a, z] = whole_pages(p, len);
  if (z <= a) return true;
  return ::madvise(reinterpret_cast<void*>(a), z - a, MADV_POPULATE_WRITE) == 0 || errno != EINVAL;
}

std::future<void> populate_in_background(std::vector<std::pair<std::byte*, uint64_t>> ranges,
                                         std::atomic<uint64_t>* populated, const std::atomic<bool>* stop) {
  static std::atomic<bool> works{true};  // false once the kernel refused (before 5.14)
  if (ranges.empty() || !works.load(std::memory_order_relaxed)) return {};
  return try_async("ckptio-prefault", [ranges = std::move(ranges), populated, stop] {
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
        touch_pages(p + begin, end - begin);
        if (populated) populated->fetch_add(end - begin, std::memory_order_relaxed);
        end = begin;
      }
    }
  });
}

}  // namespace ckptio
