// CheckpointManager: a facade over the stages of a save and a restore.
// It owns the storage, the options and the shared state (manager_impl.h);
// each call checks it runs in the process that made the manager and hands
// over to its stage:
//   save, prepare_staging        src/save/ (submit.cc, then the worker:
//                                pipeline.cc; the flow is described there)
//   all_steps, latest_step,      discovery.cc
//   list_step_dirs, read_index
//   apply_retention, remove_step retention.cc, src/save/commit.cc
//   gc                           gc.cc
//   restore, verify              src/restore/
#include "ckptio/manager.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>
#include <new>
#include <numeric>
#include <system_error>
#include <thread>
#include <utility>

#include <unistd.h>

#include "src/layout/layout.h"
#include "src/manager/manager_impl.h"
#include "src/util/allocate.h"
#include "src/save/commit.h"
#include "src/save/save_plan.h"
#include "src/util/log.h"

namespace ckptio {

using Clock = std::chrono::steady_clock;

namespace {

Status check_retention(int max_to_keep, int64_t keep_every) {
  if (max_to_keep < 0)
    return invalid_argument("max_to_keep must be >= 0 (0: every step is kept), got " + std::to_string(max_to_keep));
  if (keep_every < 0)
    return invalid_argument("keep_every must be >= 0 (0: none kept for it), got " + std::to_string(keep_every));
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::open(const std::string& uri,
                                                                   ManagerOptions options,
                                                                   const StorageOptions& storage) {
  // (The constructor cannot fail: it takes these as 1 and 0.)
  if (options.max_in_flight < 1)
    return invalid_argument("max_in_flight must be >= 1, got " + std::to_string(options.max_in_flight));
  CKPTIO_RETURN_IF_ERROR(check_retention(options.max_to_keep, options.keep_every));
  try {  // (the backend's own allocations and threads too)
    CKPTIO_ASSIGN_OR_RETURN(auto backend, open_storage(uri, storage));
    auto naming = StepNaming::make(options.step_format);
    if (!naming.ok()) return naming.status();
    return std::make_unique<CheckpointManager>(std::move(backend), std::move(options));
  } catch (const std::system_error& e) {  // its worker thread (a process at its thread or memory limit)
    return status_or_out_of_memory([&] {
      return Status(Code::kResourceExhausted, "open a checkpoint manager of " + uri + ": " + e.what());
    });
  } catch (...) {
    return status_or_out_of_memory([&] { return status_of_exception("open a checkpoint manager of " + uri); });
  }
}

CheckpointManager::CheckpointManager(std::shared_ptr<Storage> storage, ManagerOptions options)
    : storage_(std::move(storage)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  auto naming = StepNaming::make(options_.step_format);
  if (!naming.ok()) {
    logging::error("ckptio: {}; using run-{{step}}", naming.status().to_string());
    options_.step_format = "run-{step}";
    naming = StepNaming::make(options_.step_format);
  }
  impl_->naming = naming.value();
  impl_->owner = this;
  if (options_.max_in_flight < 1) options_.max_in_flight = 1;
  // Chunks are cut to a multiple of the backend's write granularity (an S3
  // part) and of 4096 (O_DIRECT, and the staging buffers' alignment), in
  // both staging modes, before anything is copied.
  impl_->unit = write_unit(std::max<uint64_t>(storage_->write_granularity(), 1));
  // Staging buffers are 4096-aligned, so that is the most a backend may ask
  // of a data pointer; anything else that is no power of two is treated as 4096.
  const uint64_t mem = std::max<uint64_t>(storage_->write_memory_alignment(), 1);
  impl_->memory_align = std::has_single_bit(mem) && mem <= 4096 ? mem : 4096;
  impl_->object_bytes = storage_->data_object_bytes();
  const uint64_t align = std::lcm<uint64_t>(impl_->unit, 4096);
  uint64_t chunk = options_.chunk_size ? options_.chunk_size : (8ull << 20);
  chunk = std::max<uint64_t>((chunk + align - 1) / align * align, align);
  impl_->chunk = chunk;
  impl_->pool = std::make_unique<BufferPool>(chunk, std::max<uint64_t>(2, options_.staging_budget / chunk));
  // Copy mode copies on the caller's thread and these helpers (one per
  // further core, up to four copiers): the copy is memory-bound, and more
  // than a few threads buy nothing.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool copies = options_.staging == StagingMode::kCopy;
  impl_->crew = std::make_unique<Crew>(copies ? std::min(cores, 4u) - 1 : 0);
  impl_->worker = std::thread([this] { impl_->worker_loop(); });
  // Retention is the committer's job: process 0 of a group.
  if (options_.processes.index == 0 && (options_.max_to_keep > 0 || options_.keep_every > 0)) {
    try {
      impl_->reaper = std::thread([this] { impl_->reap_loop(); });
    } catch (...) {  // (std::system_error) the worker stops before the exception leaves
      {
        std::lock_guard lock(impl_->mu);
        impl_->stopping = true;
      }
      impl_->cv.notify_all();
      impl_->worker.join();
      throw;
    }
  }
  made_by_pid_ = static_cast<int>(::getpid());
}

Status CheckpointManager::check_process() const {
  const int here = static_cast<int>(::getpid());
  if (here == made_by_pid_) return Status::OK();
  return Status(Code::kFailedPrecondition,
                "this checkpoint manager of " + storage_->describe() + " was made by process " +
                    std::to_string(made_by_pid_) + "; process " + std::to_string(here) +
                    " is a fork of it, where its threads do not exist: open a manager in this process");
}

CheckpointManager::~CheckpointManager() {
  if (!check_process().ok()) {
    // A forked child: the worker, the crew and the storage's threads live
    // only in the parent; joining or stopping them here would hang or abort.
    (void)impl_.release();
    (void)new std::shared_ptr<Storage>(std::move(storage_));
    return;
  }
  (void)wait_until_finished();
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
  if (impl_->reaper.joinable()) {  // after the worker: nothing is queued for it any more
    {
      std::lock_guard lock(impl_->mu);
      impl_->reaper_stopping = true;
    }
    impl_->cv.notify_all();
    impl_->reaper.join();
  }
}

Status CheckpointManager::wait_until_finished() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->in_flight == 0 && impl_->retaining == 0 && impl_->reaping == 0; });
  Status first = impl_->first_error;
  impl_->first_error = Status::OK();
  return first;
}

Status CheckpointManager::prepare_staging(uint64_t state_bytes) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  if (options_.staging != StagingMode::kCopy) return Status::OK();
  return returning_exceptions("prepare staging", [&] {
    return impl_->pool->reserve(state_bytes / impl_->chunk + (state_bytes % impl_->chunk != 0), /*lift=*/true);
  });
}

Result<SaveHandle> CheckpointManager::save(int64_t step, const std::vector<LeafView>& state,
                                           const SaveOptions& options) {
  const auto called = Clock::now();
  return save_taken(step, std::vector<LeafView>(state), options, called);
}

Result<SaveHandle> CheckpointManager::save(int64_t step, std::vector<LeafView>&& state,
                                           const SaveOptions& options) {
  return save_taken(step, std::move(state), options, Clock::now());
}

Result<SaveHandle> CheckpointManager::save_taken(int64_t step, std::vector<LeafView>&& state,
                                                 const SaveOptions& options, Clock::time_point t0) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  // What throws (std::bad_alloc) comes before the save is queued; it gave
  // its slot back (Impl::submit_attempt), and nothing of it is in flight.
  try {
    return impl_->submit(step, std::move(state), options, t0);
  } catch (...) {
    return status_or_out_of_memory([&] { return status_of_exception("save step " + std::to_string(step)); });
  }
}

Status CheckpointManager::refused_save(int64_t step, const Status& why) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("refused_save", [&] { return impl_->refused_save(step, why); });
}

// The calls below return what they throw (std::bad_alloc where the system
// refuses memory) as their Status; save() and restore() guard their own
// (tests/alloc sweeps them).
Result<std::vector<int64_t>> CheckpointManager::all_steps() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("list the committed steps",
                              [&] { return impl_->committed_steps(/*parse=*/true, /*newest_only=*/false); });
}

Result<std::optional<int64_t>> CheckpointManager::latest_step() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("find the latest step", [&]() -> Result<std::optional<int64_t>> {
    CKPTIO_ASSIGN_OR_RETURN(auto steps, impl_->committed_steps(true, true));
    if (steps.empty()) return std::optional<int64_t>();
    return std::optional<int64_t>(steps.back());
  });
}

Result<std::vector<StepInfo>> CheckpointManager::list_step_dirs() {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("list the step directories", [&] { return impl_->step_dirs(); });
}

Result<Index> CheckpointManager::read_index(int64_t step) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("read an index", [&]() -> Result<Index> {
    const std::string dir = impl_->naming.name(step);
    CKPTIO_ASSIGN_OR_RETURN(auto index, impl_->load_index(dir));
    if (!index) return impl_->missing_index(dir, step);
    return std::move(*index);
  });
}

Status CheckpointManager::remove_step(int64_t step) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("remove a step", [&] { return impl_->remove_step(step); });
}

Status CheckpointManager::apply_retention(int max_to_keep, int64_t keep_every) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  CKPTIO_RETURN_IF_ERROR(check_retention(max_to_keep, keep_every));
  return returning_exceptions("retention", [&] { return impl_->retain(max_to_keep, keep_every, nullptr); });
}

Status CheckpointManager::gc(const GcOptions& options) {
  CKPTIO_RETURN_IF_ERROR(check_process());
  return returning_exceptions("gc", [&] { return impl_->gc(options); });
}

}  // namespace ckptio
