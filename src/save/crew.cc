#include "src/save/crew.h"

#include <pthread.h>

#include <system_error>

namespace ckptio {

Crew::Crew(unsigned helpers) {
  try {
    threads_.reserve(helpers);
    for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this] { loop(); });
  } catch (...) {  // a process at its thread or memory limit (std::system_error, std::bad_alloc): fewer helpers
  }
}

Crew::~Crew() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Crew::run(const std::function<void()>& fn) {
  std::lock_guard run_lock(run_mu_);
  {
    std::lock_guard lock(mu_);
    fn_ = &fn;
    busy_ = static_cast<unsigned>(threads_.size());
    ++generation_;
  }
  wake_.notify_all();
  fn();
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });
  fn_ = nullptr;
}

void Crew::loop() {
  pthread_setname_np(pthread_self(), "ckptio-copy");
  uint64_t seen = 0;
  for (;;) {
    const std::function<void()>* fn = nullptr;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      fn = fn_;
    }
    (*fn)();
    std::lock_guard lock(mu_);
    if (--busy_ == 0) done_.notify_all();
  }
}

}  // namespace ckptio
