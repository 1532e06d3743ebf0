#include "alloc/failing_new.h"

#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>

namespace ckptio::testutil {
namespace {

std::atomic<bool> g_armed{false};
std::atomic<std::thread::id> g_thread{};
std::atomic<int64_t> g_countdown{0};
std::atomic<bool> g_fired{false};

void* allocate(std::size_t size, bool nothrow) {
  if (g_armed.load(std::memory_order_acquire) && std::this_thread::get_id() == g_thread.load() &&
      g_countdown.fetch_sub(1) == 1) {
    g_armed.store(false);
    g_fired.store(true);
    if (nothrow) return nullptr;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size ? size : 1)) return p;
  if (nothrow) return nullptr;
  throw std::bad_alloc();
}

}  // namespace

void fail_nth_allocation(std::thread::id thread, int64_t n) {
  g_armed.store(false);
  g_fired.store(false);
  g_thread.store(thread);
  g_countdown.store(n);
  g_armed.store(true, std::memory_order_release);
}

bool disarm_allocation_failure() {
  g_armed.store(false);
  return g_fired.load();
}

}  // namespace ckptio::testutil

// The replaceable forms that allocate and free with malloc (the aligned forms
// keep the library's, which pair among themselves).
void* operator new(std::size_t n) { return ckptio::testutil::allocate(n, false); }
void* operator new[](std::size_t n) { return ckptio::testutil::allocate(n, false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ckptio::testutil::allocate(n, true);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ckptio::testutil::allocate(n, true);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
