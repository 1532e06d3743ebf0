#include "alloc/failing_new.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <thread>

namespace ckptio::testutil {
namespace {

std::atomic<bool> g_armed{false};
std::atomic<std::thread::id> g_thread{};
std::atomic<pid_t> g_task{0};  // when not 0, the thread is chosen by task id
std::atomic<bool> g_by_name{false};  // when true, the threads are chosen by name
char g_name[16] = {};  // (written only while disarmed)
std::atomic<int64_t> g_countdown{0};
std::atomic<bool> g_fired{false};

pid_t my_task() {
  static thread_local pid_t tid = 0;
  if (tid == 0) tid = gettid();
  return tid;
}

bool chosen() {
  if (g_by_name.load()) {
    char name[16] = {};
    return pthread_getname_np(pthread_self(), name, sizeof name) == 0 && std::strcmp(name, g_name) == 0;
  }
  const pid_t task = g_task.load();
  return task != 0 ? my_task() == task : std::this_thread::get_id() == g_thread.load();
}

void* allocate(std::size_t size, bool nothrow) {
  if (g_armed.load(std::memory_order_acquire) && chosen() && g_countdown.fetch_sub(1) == 1) {
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
  g_by_name.store(false);
  g_task.store(0);
  g_thread.store(thread);
  g_countdown.store(n);
  g_armed.store(true, std::memory_order_release);
}

void fail_nth_allocation_of_task(pid_t tid, int64_t n) {
  g_armed.store(false);
  g_fired.store(false);
  g_by_name.store(false);
  g_task.store(tid);
  g_countdown.store(n);
  g_armed.store(true, std::memory_order_release);
}

void fail_nth_allocation_of_threads_named(const std::string& name, int64_t n) {
  g_armed.store(false);
  g_fired.store(false);
  std::strncpy(g_name, name.c_str(), sizeof g_name - 1);
  g_by_name.store(true);
  g_countdown.store(n);
  g_armed.store(true, std::memory_order_release);
}

std::optional<pid_t> task_named(const std::string& name) {
  std::optional<pid_t> found;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string line;
    if (!std::getline(comm, line) || line != name) continue;
    if (found) return std::nullopt;  // several
    found = static_cast<pid_t>(std::stol(e.path().filename().string()));
  }
  return found;
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
