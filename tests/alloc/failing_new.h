// Allocation failure on demand, for the sweeps in alloc_failure_sweep.cc:
// this binary replaces the global operator new (failing_new.cc) with one that
// throws std::bad_alloc at the n-th allocation a chosen thread makes after
// arming, once. Everything else allocates with malloc, as usual.
//
// A thread at a real memory limit fails every allocation after some point;
// a sweep that fails one allocation at a time, for every n in turn, reaches
// each allocation's error path, which a limit reaches only at random (the
// RLIMIT_AS tests of out_of_memory_test.cc).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <thread>

namespace ckptio::testutil {

// From now on, the n-th (1-based) allocation by operator new on `thread`
// throws std::bad_alloc, once; other threads are never failed.
void fail_nth_allocation(std::thread::id thread, int64_t n);
// The same for the thread whose kernel task id is `tid` (a library thread the
// test holds no std::thread::id of: see task_named).
void fail_nth_allocation_of_task(pid_t tid, int64_t n);
// The same for every thread named `name` (pthread_setname_np), counted
// together: for threads that live only during the call swept (started and
// named inside it), or several of one kind. Each allocation while armed then
// asks its thread's name (a system call).
void fail_nth_allocation_of_threads_named(const std::string& name, int64_t n);
// The task id of this process's one thread named `name` (pthread_setname_np,
// /proc/self/task/*/comm); nullopt when none or several have that name.
std::optional<pid_t> task_named(const std::string& name);
// Stops a failure not yet thrown. True when the armed failure was thrown.
bool disarm_allocation_failure();

}  // namespace ckptio::testutil
