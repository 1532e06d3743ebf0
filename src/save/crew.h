// The few long-lived threads that copy a save's state beside its caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckptio {

// A few long-lived threads that join the calling thread on one task: run(fn)
// calls fn on the caller and on every helper at once and returns when all
// calls have returned. Copy mode's save() copies the state with it, so the
// stall shrinks with the cores a machine has. One run() at a time (others
// wait); fn must not call run().
class Crew {
 public:
  explicit Crew(unsigned helpers);
  ~Crew();
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;
  unsigned size() const { return static_cast<unsigned>(threads_.size()) + 1; }
  void run(const std::function<void()>& fn);

 private:
  void loop();

  std::mutex run_mu_;  // one run() at a time
  std::mutex mu_;      // guards the fields below
  std::condition_variable wake_, done_;
  const std::function<void()>* fn_ = nullptr;
  uint64_t generation_ = 0;
  unsigned busy_ = 0;  // helpers still in this generation's fn
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptio
