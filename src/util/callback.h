// Calling the caller's code (on_commit, on_retention, a copy's on_progress
// and on_step, a SaveBarrier): whatever it throws -- a binding's error from
// a Python callback, say -- becomes a Status here and goes no further. An
// exception would otherwise leave a worker thread (ending the process, the
// save's handle never completing) or unwind a copy's stack while its reads
// and writes in flight still point into it.
#pragma once

#include <exception>
#include <string>

#include "ckptio/status.h"

namespace ckptio {

// OK, or kCancelled: "the <name> callback threw: <what>".
template <typename F>
Status call_callback(const char* name, F&& call) {
  try {
    call();
    return Status::OK();
  } catch (const std::exception& e) {
    return Status(Code::kCancelled, std::string("the ") + name + " callback threw: " + e.what());
  } catch (...) {
    return Status(Code::kCancelled, std::string("the ") + name + " callback threw (not a std::exception)");
  }
}

}  // namespace ckptio
