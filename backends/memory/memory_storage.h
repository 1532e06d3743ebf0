// In-memory backend (tests, and the base for power-loss simulation) and a
// fault-injecting wrapper that works over any backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ckptio/storage.h"

namespace ckptio {

// An in-process object store. caps: atomic_rename and atomic_exchange true
// (it models a POSIX directory tree well enough for the commit protocol) when
// `posix_like`, else an object store with no rename.
std::shared_ptr<Storage> make_memory_storage(bool posix_like = true);

// Operations the fault injector can target.
enum class FaultOp : uint8_t {
  kCreate, kWrite, kFinish, kPut, kGet, kStat, kRead, kList, kRemove, kRename, kSync,
};

struct FaultRule {
  FaultOp op = FaultOp::kWrite;
  std::string key_substr;        // "" matches every key
  Code code = Code::kIOError;    // the error to return
  std::string message = "injected fault";
  uint64_t skip = 0;             // let this many matching calls pass first
  int64_t times = -1;            // fail this many matching calls (-1: forever)
  double probability = 1.0;      // of failing a matching call (seeded)
};

// Wraps `base`. Every call first consults the rules; a firing rule returns its
// error without touching `base`. It also tracks durability the way RocksDB's
// FaultInjectionTestFS does: an object is durable once finish() or put()
// returned OK *and* the directory holding it was sync()ed afterwards (or at
// put); a rename is durable once the parent of both prefixes was sync()ed.
// drop_unsynced() then simulates a power cut: it removes from `base` every
// object that is not durable and undoes renames that are not durable.
class FaultStorage : public Storage {
 public:
  virtual void add_rule(const FaultRule& rule) = 0;
  virtual void clear_rules() = 0;
  virtual void set_seed(uint64_t seed) = 0;
  // Number of faults fired so far.
  virtual uint64_t faults_fired() const = 0;
  // Simulates a power cut (see above). Call with no operation in flight.
  virtual Status drop_unsynced() = 0;
  // Called before every operation with its kind and key; tests use it to
  // stop or crash a process at an exact point.
  virtual void set_hook(std::function<void(FaultOp, const std::string&)> hook) = 0;
};

std::shared_ptr<FaultStorage> make_fault_storage(std::shared_ptr<Storage> base);

}  // namespace ckptio
