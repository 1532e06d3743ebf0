// Work on a thread of its own, when a thread can be had. std::async with
// std::launch::async throws std::system_error when the system refuses a new
// thread (a process at its thread limit); a storage engine must not turn
// that into an exception out of restore, or into std::terminate on the save
// worker. Each caller picks what happens instead.
//
// Each thread gets a name (at most 15 characters: "ckptio-read"), seen in
// top -H and gdb and used by the allocation sweeps (tests/alloc/) to pick
// it; the work deferred to a caller's thread does not rename it. What the
// work throws goes to the future, never out of the thread.
#pragma once

#include <pthread.h>

#include <future>
#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

namespace ckptio {

// f on a new thread named `name`, or no future (invalid) when no thread can
// be had (nor the memory to start one): the caller then does the work itself,
// on its own thread.
template <class F>
std::future<std::invoke_result_t<F>> try_async(const char* name, F&& f) {
  try {
    return std::async(std::launch::async, [name, f = std::forward<F>(f)]() mutable {
      pthread_setname_np(pthread_self(), name);
      return f();
    });
  } catch (const std::system_error&) {
    return {};
  } catch (const std::bad_alloc&) {
    return {};
  }
}

// f on a new thread named `name` or, when no thread can be had, on the
// thread that waits on the future (std::launch::deferred), so the work is
// done either way: for work that needs nothing else from its caller to
// finish (a batch of reads).
// f is kept outside the first attempt, which may consume what it is given.
template <class F>
std::future<std::invoke_result_t<F>> async_or_deferred(const char* name, F&& f) {
  auto work = std::make_shared<std::decay_t<F>>(std::forward<F>(f));
  try {
    return std::async(std::launch::async, [name, work] {
      pthread_setname_np(pthread_self(), name);
      return (*work)();
    });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [work] { return (*work)(); });
  }
}

}  // namespace ckptio
