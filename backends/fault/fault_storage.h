// FaultStorage: a fault-injecting, power-loss-modelling wrapper over any
// backend, in the spirit of RocksDB's FaultInjectionTestFS. Product code, not
// a test helper: the conformance suite, the crash and power-loss tests and
// the fault smoke runs all go through it, and every backend must behave under
// it. It is kept private (not installed under include/ckptio/): its knobs
// follow what ckptio's own tests need and may change with them; a user's
// crash tests of their own integration can use the CLI's fault runs instead.
// The full durability model is at the top of fault_storage.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ckptio/storage.h"

namespace ckptio {

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
  // kPut only: the put takes effect, then the error is returned (an answer
  // lost on its way back: the caller cannot tell whether it did).
  bool after = false;
};

// Wraps `base`. Every call first consults the rules; a firing rule returns its
// error without touching `base` (a kWrite fault reaches the write's callback,
// and finish() then fails too). Rules are consulted in the order added; the
// first that fires wins. It also tracks durability the way RocksDB's
// FaultInjectionTestFS does: an object is durable once finish() or put()
// returned OK *and* the directory holding it was sync()ed afterwards (put
// syncs its own directory); a rename is durable on return, or, with
// FaultStorageOptions::rename_durable_on_return = false, once the parents of
// both prefixes were sync()ed. Over a base without atomic_rename (an object
// store) a finished object is durable at once. drop_unsynced() then simulates
// a power cut: it removes from `base` every object that is not durable and
// undoes renames that are not durable. The full model is at the top of
// fault_storage.cc.
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
  // stop or crash a process at an exact point. read() calls it once per
  // request; rename() passes `from`; remove_prefix() is kRemove with the
  // prefix; list() and sync() pass their prefix. It runs on the calling
  // thread (for kWrite, the writer's thread), outside the wrapper's locks.
  virtual void set_hook(std::function<void(FaultOp, const std::string&)> hook) = 0;
  // Simulates the machine stopping: the first `ops` operations pass, every
  // later one fails with kIOError ("simulated power cut") without reaching
  // `base`. Pair with drop_unsynced() for a power-loss test.
  virtual void crash_after(uint64_t ops) = 0;
  virtual bool crashed() const = 0;
};

struct FaultStorageOptions {
  // rename() is durable when it returns (the local backend fsyncs the parent
  // directory inside rename). When false, a rename is durable only once the
  // parent directories of `from` and `to` were sync()ed after it: the model of
  // a file system that needs the caller's fsync.
  bool rename_durable_on_return = true;
};

std::shared_ptr<FaultStorage> make_fault_storage(std::shared_ptr<Storage> base,
                                                 const FaultStorageOptions& options = {});

}  // namespace ckptio
