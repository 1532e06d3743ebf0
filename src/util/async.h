// Work on a thread of its own, when a thread can be had. std::async with
// std::launch::async throws std::system_error when the system refuses a new
// thread (a process at its thread limit); a storage engine must not turn
// that into an exception out of restore, or into std::terminate on the save
// worker. Each caller picks what happens instead.
#pragma once

#include <future>
#include <memory>
#include <new>
#include <system_error>
#include <type_traits>
#include <utility>

namespace ckptio {

// f on a new thread, or no future (invalid) when no thread can be had (nor
// the memory to start one): the caller then does the work itself, on its own
// thread.
template <class F>
std::future<std::invoke_result_t<F>> try_async(F&& f) {
  try {
    return std::async(std::launch::async, std::forward<F>(f));
  } catch (const std::system_error&) {
    return {};
  } catch (const std::bad_alloc&) {
    return {};
  }
}

// f on a new thread or, when no thread can be had, on the thread that waits
// on the future (std::launch::deferred), so the work is done either way: for
// work that needs nothing else from its caller to finish (a batch of reads).
// f is kept outside the first attempt, which may consume what it is given.
template <class F>
std::future<std::invoke_result_t<F>> async_or_deferred(F&& f) {
  auto work = std::make_shared<std::decay_t<F>>(std::forward<F>(f));
  try {
    return std::async(std::launch::async, [work] { return (*work)(); });
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, [work] { return (*work)(); });
  }
}

}  // namespace ckptio
