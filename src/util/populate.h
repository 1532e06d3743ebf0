// Faulting memory in ahead of its first write, without changing its bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <utility>
#include <vector>

#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ckptio {

// Faults in the whole pages of [p, p + len) as writable without changing
// their contents (MADV_POPULATE_WRITE), so that it is safe while a read is
// landing in the same memory. False when the kernel cannot (before 5.14):
// then nothing was done, and the caller must not fall back to writing.
bool populate_for_write(void* p, size_t len);

// Whether the first load from user space of a page that
// MADV_POPULATE_WRITE has just faulted in costs a trap to the host: on a VM
// whose host shadows the guest's page tables (a PVM guest, about 5 us a
// page), not on bare metal or under EPT/NPT (a TLB miss). Measured once per
// process, the first time it is asked (64 fresh pages, well under a
// millisecond either way), unless CKPTIO_FIRST_TOUCH is "trap" or "cheap".
// Restores that would leave fresh memory to the reads fault it in ahead
// only where it traps (restore_sharded.cc; docs/restart.md).
bool first_touch_traps();

// The probe itself: the median time of a first and of a second load from
// each of 64 freshly populated pages (0 when it could not run), and whether
// the first costs a trap (over a microsecond more).
struct FirstTouchProbe {
  double first_ns = 0, again_ns = 0;
  bool traps = false;
};
FirstTouchProbe probe_first_touch();

// For tests: fixes first_touch_traps() (std::nullopt: the probe again).
void set_first_touch_traps_for_testing(std::optional<bool> traps);

// Fresh allocations of a restore, faulted in on a thread of their own
// (populate_for_write, then one load from each page, at nice 19: it yields
// to every other thread) while
// the restore fills them: the ranges from the
// last backwards, each in 8 MiB slices from its end, so that this thread
// and copies filling them from the front meet in the middle. Invalid when
// there is nothing to do, no thread to be had, or the kernel cannot. The
// caller waits on it before freeing the ranges. With `populated`, adds the
// bytes of each slice faulted in as it goes. With `stop` (which must outlive
// the wait), it ends before its next slice once *stop is true: the caller
// sets it when the reads have landed, so that the wait is for one slice at
// most, not for a nice-19 thread to walk pages the reads faulted in already.
std::future<void> populate_in_background(std::vector<std::pair<std::byte*, uint64_t>> ranges,
                                         std::atomic<uint64_t>* populated = nullptr,
                                         const std::atomic<bool>* stop = nullptr);

}  // namespace ckptio
