// CheckpointManager: asynchronous, atomic, durable checkpoints of a training
// state, and restore of the latest committed step.
//
//   auto m = CheckpointManager::open("/data/ckpt").value();
//   auto h = m->save(step, state, {.metadata_json = R"({"data_pos": 123})"});
//   ... training continues while bytes go to disk ...
//   m->wait_until_finished();
//   auto r = m->restore(std::nullopt);           // the latest committed step
//
// Thread safety: every method may be called from any thread. Saves are
// executed in call order by one background worker; at most
// ManagerOptions::max_in_flight saves are queued or running (save() waits for
// a slot). Saves called from several threads at once are queued, and in
// copy mode copied, one after the other. Commit callbacks run on the worker
// thread, one at a time; they must not call wait_until_finished(), wait on a
// save's handle, or the destructor of this manager; save() from them is
// refused (FailedPrecondition), as it would wait for the worker.
//
// Errors: save() returns an error at once for bad input (invalid leaves, a
// committed step without overwrite); once it returned a handle, every outcome
// reaches the handle, the on_commit callback (exactly once) and the log.
// A failed save leaves no committed step and the previous latest intact.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/sharding.h"
#include "ckptio/status.h"
#include "ckptio/storage.h"
#include "ckptio/types.h"

namespace ckptio {

enum class StagingMode {
  // save() copies the state into a bounded pool of staging buffers and
  // returns; it blocks only while the pool is full. The caller may change its
  // buffers as soon as save() returns.
  kCopy,
  // Zero copy on the caller's thread: save() returns after planning; the
  // engine reads the caller's buffers in the background. The caller promises
  // they stay alive and unchanged until SaveHandle::released(). Large shards
  // are written straight from them (direct I/O reads the caller's memory in
  // place, so it must be ordinary host memory); the rest goes through the
  // staging pool.
  kBorrow,
};

struct SaveStats {
  // Bytes written to data files: the payload after casts, plus any padding a
  // borrow-mode save lays between shards for alignment (SaveProgress::total).
  uint64_t bytes = 0;
  double stall_seconds = 0;   // time save() blocked the caller
  double write_seconds = 0;   // first byte staged to data durable
  // Data durable to step visible: what of the index's write and read-back
  // did not fit in the data's drain (a single-process save does both then),
  // and the publish (POSIX: directory fsync, rename; S3: the index PUT).
  double commit_seconds = 0;
  double total_seconds = 0;   // save() call to commit
};

// Where a save is, counted by the engine as it goes (SaveHandle::progress):
// bytes of this process's data files (the payload plus any alignment padding
// a borrow-mode save lays between shards), so that the three counters and
// `total` share one unit. Each counter only grows, and
// durable <= written <= staged <= total. A save that failed stops counting.
struct SaveProgress {
  uint64_t total = 0;    // this process's data-file bytes; 0 until the save is planned
  // Handed to the backend: copied into staging buffers (copy mode) or queued
  // from the caller's memory (borrow mode).
  uint64_t staged = 0;
  // Writes the backend acknowledged: durable on object stores (each part or
  // object is stored when its PUT answers), in the page cache on local disk
  // until `durable`.
  uint64_t written = 0;
  // In data files made durable (fsync'd / uploads completed). The step is
  // visible only once committed: SaveHandle::done() and wait().
  uint64_t durable = 0;
};

struct CommitEvent {
  int64_t step = 0;
  Status status;  // OK when the step committed
  SaveStats stats;
};

// Retention after a commit (ManagerOptions::max_to_keep / keep_every).
struct RetentionEvent {
  int64_t after_step = 0;        // the step whose commit ran it
  std::vector<int64_t> deleted;  // the steps it deleted, ascending
  // OK, or why a step it meant to delete is still there (the first such
  // failure; it tried every step). A failure costs space, never a step.
  Status status;
};

// Multi-process save (docs/multiprocess.md). N processes save the same step
// to the same base: each writes its own data file and a manifest of the
// shards it wrote; process 0, the coordinator, waits until every manifest is
// present, proves that the shards of every leaf cover it exactly once, writes
// the step's index and commits. Every process's save handle and on_commit
// learn the outcome. A process that dies mid-save leaves the step uncommitted
// (the coordinator times out and fails it); the previous latest stays intact.
//
// A barrier a trainer supplies (a JAX distributed client's wait_at_barrier).
// wait(name) returns once all processes of the group called wait(name), or
// an error (kUnavailable on timeout). ckptio calls it from the manager's
// worker thread, with names unique per save attempt, in the same order on
// every process.
class SaveBarrier {
 public:
  virtual ~SaveBarrier() = default;
  virtual Status wait(const std::string& name, double timeout_seconds) = 0;
};

struct ProcessGroup {
  int index = 0;  // this process, in [0, count); process 0 commits
  int count = 1;  // 1: a single-process save, nothing below is used
  // An id every process of this run shares and no earlier run of the job
  // used: a launcher's job id plus its restart count, or a value process 0
  // broadcast. Save attempts are named from it and from this process's count
  // of save() calls of the step (across its managers), so that a restarted
  // job never mixes its files with a dead run's. Required
  // when count > 1 (safe-name characters: letters, digits, '-', '_', '.').
  std::string run_id;
  // Null: the default, which polls the storage (the coordinator lists the
  // manifests; the others read the step's index or the coordinator's
  // failure record).
  std::shared_ptr<SaveBarrier> barrier;
  // How long the coordinator waits for the last manifest, and the others
  // for the outcome, before the save fails.
  double timeout_seconds = 600;
  double poll_seconds = 0.05;  // the default barrier's listing interval, in [0, 3600]
};

struct ManagerOptions {
  // Step directory name; "{step}" is replaced by the decimal step number.
  // "run-{step}" is eformer's naming, "{step}" Orbax's.
  std::string step_format = "run-{step}";
  // The layout saves write: "ckptio" (docs/format.md), or "eformer": zarr v2
  // as eformer / TensorStore write it (format.md section 7), for steps that
  // eformer, TensorStore and zarr-python must read. An eformer save stores
  // each leaf's shards as its chunks (zstd level 1) and commits with
  // metadata.json last; it has no checksums, row bands or multi-process
  // saves (kUnimplemented). Restores read both layouts whatever this says.
  std::string layout = "ckptio";
  StagingMode staging = StagingMode::kCopy;
  // Upper bound on staging memory (copy mode's pool, borrow mode's bounce
  // buffers). Peak extra memory of a save stays within it, with two
  // exceptions: the pool holds at least two chunks (a chunk_size above half
  // the budget takes 2 x chunk_size), and a save with SaveOptions::
  // float_dtype holds the cast copy of every float leaf, outside the pool,
  // until it ends. The pool is kept
  // for later saves; copy mode grows it at a save's start to what the state
  // needs (at most this), so save() never waits for the disk when the budget
  // holds the state.
  uint64_t staging_budget = 1ull << 30;
  // Bytes per write request and per staging buffer; 0 = 8 MiB. Rounded up to
  // a multiple of 4096 and of the backend's write granularity (S3: the part
  // size). The pool holds staging_budget / chunk_size buffers (at least 2):
  // larger chunks mean fewer, longer requests, smaller ones more buffers in
  // flight within the same budget. Why 8 MiB: docs/library.md.
  uint64_t chunk_size = 0;
  int max_in_flight = 1;   // saves queued or running at once
  int max_to_keep = 0;     // committed steps kept by retention; 0 = all
  int64_t keep_every = 0;  // steps divisible by this are never deleted; 0 = none
  // (open() refuses max_in_flight < 1 and a negative max_to_keep or
  // keep_every: kInvalidArgument.)
  // Damage is an error instead of a fallback: discovery (all_steps,
  // latest_step) fails on an index that does not parse, or on a step
  // directory that lost its index on a POSIX-like store, instead of skipping
  // the step with a warning; restore(nullopt) fails on the newest damaged
  // step (index or data) instead of falling back past it.
  bool strict = false;
  // Runs once per save that returned a handle, success or failure, on the
  // manager's worker thread, before that save's handle completes (so after
  // SaveHandle::wait() returns, the callback has run). It must not wait on
  // that handle. What it throws is logged and goes no further (the save's
  // outcome stands); so for on_retention.
  std::function<void(const CommitEvent&)> on_commit;
  // Runs after each retention that follows a commit, on the worker thread,
  // before wait_until_finished() returns; a failure is also logged. The save
  // that ran it committed whatever retention's outcome. The steps it names
  // as deleted have left the committed set (POSIX: renamed to .del-; object
  // stores: index removed); a thread of the manager removes their bytes
  // while the next save writes (that save waits only for the removals of
  // older commits), and wait_until_finished() waits for those removals too.
  // A removal that fails is logged and leaves the bytes to gc().
  std::function<void(const RetentionEvent&)> on_retention;
  // This process's place in a multi-process save (see ProcessGroup).
  ProcessGroup processes;
};

struct SaveOptions {
  std::string metadata_json = "{}";  // a JSON object stored in the index
  bool overwrite = false;            // replace a committed step atomically (its commit waits
                                     // for restores of the step in this manager to end)
  // eformer's float_dtype: float leaves are stored as this dtype.
  std::optional<DType> float_dtype;
  // Layout for restores into other shardings (docs/read-planning.md, "Row
  // bands"). With N >= 2 (the default is 8), each shard of a leaf that is
  // not saved whole is stored as bands of rows, cut along dimension 0
  // wherever a sharding of that dimension over n devices would cut it, for
  // every n from 2 to N (at most 64; XLA's ceil-division tiles, JAX's chunks
  // when n divides the size; bands of at least 96 KiB), and a data file
  // holds its bands ordered by where they start in their leaves. A restore
  // that splits dimension 0 n ways (n <= N) then reads one range per data
  // file instead of one per leaf, and whole pieces, so every byte it
  // delivers is checked. Leaves saved whole (every leaf of a one-device
  // save) are never cut. Costs index entries (up to ~11 per shard of 1/8 of
  // a leaf at 8; bytes, files and format unchanged). 0 or 1: one piece per
  // shard.
  uint32_t row_band_ways = 8;
};

// A save in progress. Copyable; all copies see the same save.
class SaveHandle {
 public:
  int64_t step() const;
  bool done() const;
  Status wait() const;           // until committed or failed
  bool released() const;         // borrow mode: caller buffers no longer read
  void wait_released() const;
  SaveStats stats() const;       // final once done(); empty in a fork()ed child
  // The save's progress so far (see SaveProgress): from any thread at any
  // time, without a lock or a request to the storage; a progress bar polls it.
  SaveProgress progress() const;

  struct State;
  explicit SaveHandle(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<State> s_;
};

struct Selection {
  std::vector<std::string> prefixes;  // empty: every prefix
  // Leaves whose path matches anywhere (Python's re.search, as partition
  // rules; RE2, linear time); "": all. Python constructs RE2 lacks or reads
  // otherwise (lookarounds, backreferences, \Z...) are refused.
  std::string path_regex;
};

struct GcOptions {
  // Leave alone leftovers with a change newer than this (seconds): a step
  // directory or step prefix by the newest change of anything in it
  // (Storage::newest_change: file and directory mtimes, object LastModified,
  // when unfinished uploads began), an unreferenced object by its own time,
  // an unfinished upload by when it began. Set it above the longest save
  // (and above the clock skew between this host and the object store) to run
  // gc while other processes save. 0: remove every leftover not in flight in
  // this manager (only safe when nothing else saves to the base). The CLI's
  // default is 3600.
  double min_age_seconds = 0;
};

struct RestoreStats {
  // Payload bytes of the selected leaves; for a sharded restore, the distinct
  // bytes this process's devices hold (a box replicated on two local
  // devices counts once).
  uint64_t bytes_needed = 0;
  uint64_t bytes_read = 0;    // bytes requested from storage
  // Read requests; on object stores, contiguous ranges asked of the backend
  // (a sharded restore bridges small gaps between leaves, docs/read-planning.md).
  uint64_t requests = 0;
  // Wall time of the whole restore, and three phases of it: fetching and
  // parsing the step's index; selecting, checking and allocating the leaves
  // and planning the reads; reading, with the checksums and scatters that
  // overlap the reads. The rest (casts) is seconds minus the three. A
  // restore into a sharding reports index_seconds and seconds only.
  double seconds = 0;
  double index_seconds = 0;
  double plan_seconds = 0;
  double read_seconds = 0;
  // Restore into a sharding only: saved shards read in part, whose bytes
  // were delivered without a checksum check (RestoreOptions::verify), and
  // how many of their bytes were read. 0 when everything delivered was
  // checked.
  uint64_t pieces_unverified = 0;
  uint64_t bytes_unverified = 0;
  // Memory restore allocated (whole leaves of at least 1 MiB saved in one
  // shard, not `into`; with a sharding, the device buffers filled by copies
  // rather than by reads landing in them) that a thread of its own faulted
  // in while the reads landed, so that the kernel did not fault it page by
  // page inside each read's submission (a restore into fresh memory, as
  // after a restart). Counted in slices of up to 8 MiB as they are faulted;
  // the thread stops once the reads have landed. A step in eformer's zarr
  // layout has no such thread: each decoding thread faults in the memory a
  // chunk goes to just before it decodes there (counted per chunk). 0 where
  // the kernel cannot (before Linux 5.14: MADV_POPULATE_WRITE) or no thread
  // was had.
  uint64_t bytes_prefaulted = 0;
};

// Progress of a restore or a verify: `done` of `total` bytes, called on the
// calling thread each time a batch of reads (up to 256 MiB for a restore,
// 32 MiB for a verify) has been checked and delivered, and at the end with
// done == total; a restore-latest that moves past a damaged step starts
// again from 0 for the next one. Keep it cheap: the next batch's delivery
// waits for it. For a restore, the bytes are the selected leaves' payload (a
// restore into a sharding: the bytes it reads); for verify, every shard's
// bytes.
using ProgressHook = std::function<void(uint64_t done, uint64_t total)>;

struct RestoreOptions {
  Selection select;
  // When non-empty: the leaves the caller expects. Missing leaves, unexpected
  // leaves and shape or dtype mismatches are reported together in one error.
  std::vector<LeafSpec> expected;
  bool allow_cast = false;            // cast dtype mismatches to `expected`
  std::optional<DType> float_dtype;   // cast float leaves on restore
  // Check the crc32c of every saved shard read, and fail with kDataLoss
  // naming the leaf, shard and data file on a mismatch. A shard's checksum
  // covers the whole shard, so a restore into a sharding that needs only part
  // of a saved shard can check it only by reading all of it: it does so for
  // shards of at most `verify_widen_max_bytes`, and delivers the part of a
  // larger shard unchecked, counted in RestoreStats::pieces_unverified and
  // bytes_unverified. UINT64_MAX checks every byte delivered, at the cost of
  // reading whole shards (bytes_read grows up to the saved shards' size).
  bool verify = true;
  uint64_t verify_widen_max_bytes = 64 << 10;
  // Fault the memory restore allocates (whole leaves; with a sharding, the
  // device buffers filled by copies, and all of them where a probe finds
  // that the first load of a fresh page traps to the host) in on a thread of
  // its own while the reads land, and read one byte of each page there (on
  // a VM whose host traps each page's first user access, the checksums do
  // not pay it all; docs/restart.md); for an eformer (zarr) step, each chunk's destination on its
  // decoding thread just before decoding (RestoreStats::bytes_prefaulted).
  // Off only to measure what it is worth (`ckptio synth check --no-prefault`).
  bool prefault = true;
  ProgressHook on_progress;  // optional
  // Restore into existing arrays: a leaf named here lands in the caller's
  // memory (exactly the leaf's bytes; no cast may apply to it) instead of a
  // fresh allocation. Memory that was touched before restores faster than
  // fresh pages, and a destination whose address agrees with the shard's
  // file offset modulo Storage::read_alignment() takes no bounce copy. A
  // destination naming no selected leaf is refused (kInvalidArgument), as
  // its memory would be left as it was.
  struct Destination {
    std::string prefix, path;
    void* data = nullptr;
    uint64_t size = 0;
  };
  std::vector<Destination> into;
  // Restore into a sharding: when set, every selected leaf comes back as one
  // buffer per local device holding exactly that device's box
  // (Tensor::device_shards; Tensor::data stays empty), whatever sharding and
  // process count saved it. Only the bytes the local boxes need are read,
  // each once (docs/read-planning.md). `into` does not apply.
  struct Sharding {
    Mesh mesh;
    // A leaf gets the spec of its entry in `leaves` if it has one, else the
    // first rule of `rules` that matches (eformer's semantics, RuleOptions).
    // An entry naming a leaf the step does not have is refused
    // (kInvalidArgument); one for a leaf outside `select` is not used.
    std::vector<LeafSharding> leaves;
    // Entries of `leaves` take the shape of the leaf in the step restored
    // instead of being checked against it: for callers that name specs only
    // (the Python package), as restore-latest may restore an older step than
    // the one they looked at (a damaged newer one skipped).
    bool leaf_shapes_from_step = false;
    PartitionRules rules;
    RuleOptions rule_options;
    // This process's devices (ids of `mesh`); empty: every device.
    std::vector<int64_t> devices;
    // Restore may target shardings JAX would refuse (a 3-way split of 4096):
    // XLA's padded tiling by default (see sharding.h).
    Uneven uneven = Uneven::kPad;
  };
  std::optional<Sharding> sharding;
  // Two needed byte ranges of a data file at most this far apart are read as
  // one request; nullopt: 4 KiB on local disk, 1 MiB on object stores.
  std::optional<uint64_t> coalesce_gap;
  // Steps in the eformer / zarr layout only: a chunk the store lacks is an
  // error (kDataLoss naming it) unless this is set; then its elements take
  // the array's fill_value (zeros when it is null), as TensorStore and
  // zarr-python read them.
  bool fill_missing_chunks = false;
};

// A newer committed step that restore(nullopt) passed over because it is
// damaged.
struct SkippedStep {
  int64_t step = 0;
  // Always kDataLoss. Names what is damaged: the index ("<base>/run-5/
  // ckptio_index.json: ..."), or the leaf, shard, byte range and data file
  // and what is wrong with it (checksum mismatch, data file missing, file
  // shorter than the range).
  Status error;
};

struct RestoredState {
  int64_t step = 0;
  std::string metadata_json;
  std::vector<Tensor> leaves;
  RestoreStats stats;
  // restore(nullopt) only: the newer steps skipped as damaged, newest first.
  // Empty when the newest committed step restored. Each skip is also logged
  // as a warning.
  std::vector<SkippedStep> skipped;
};

// Where to place the leaves of a saved step in one arena of caller memory
// so that restore(step, {.into = ...}) reads straight into them: a leaf
// whose shard follows the previous leaf's shard in the same file with no
// gap follows it in the arena with no gap (small leaves are then read
// several at a time, one request, no copy); any other leaf starts at the
// next address that agrees with its shard's file offset modulo
// `read_alignment` (Storage::read_alignment(): direct I/O lands in it), or,
// held in several shards, at the next multiple of 64. A one-shard leaf's
// address thus agrees with its file offset whichever rule placed it (and so
// is as aligned for its dtype as the saved bytes are).
struct ArenaLayout {
  uint64_t bytes = 0;      // the arena's size
  uint64_t alignment = 1;  // its start must be a multiple of this
  // Per leaf, in index order (every prefix's leaves in turn): its offset in
  // the arena; it occupies num_bytes() bytes from there.
  std::vector<uint64_t> offsets;
};
ArenaLayout restore_arena_layout(const Index& index, uint64_t read_alignment);

// A step directory seen by discovery, committed or not (for `ckptio ls`).
struct StepInfo {
  int64_t step = 0;
  std::string name;      // "run-5" or "run-5.tmp-ab12"
  bool committed = false;
  uint64_t bytes = 0;    // sum of object sizes under it
  int64_t committed_unix_ns = 0;
  std::string layout;    // committed steps: Index::layout ("ckptio", "eformer")
};

class CheckpointManager {
 public:
  static Result<std::unique_ptr<CheckpointManager>> open(const std::string& uri,
                                                         ManagerOptions options = {},
                                                         const StorageOptions& storage = {});
  // Throws std::system_error when the system refuses its worker thread (a
  // process at its thread or memory limit); open() returns that as
  // kResourceExhausted.
  CheckpointManager(std::shared_ptr<Storage> storage, ManagerOptions options);
  ~CheckpointManager();  // waits for every save
  // A manager belongs to the process that made it: its threads (and its
  // storage's) do not survive fork(). In a forked child every call below
  // fails at once with kFailedPrecondition (open a manager in the child
  // instead), and destroying it there leaks it rather than wait for threads
  // the child does not have. A SaveHandle copied into a child likewise:
  // wait() fails at once (the outcome is the parent's), done() and
  // released() are true (no one reads the child's copy of the buffers).
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  Result<SaveHandle> save(int64_t step, const std::vector<LeafView>& state,
                          const SaveOptions& options = {});
  // The same, taking the views instead of copying them: the overload above
  // copies every leaf's names, shape and shard list on the caller's thread,
  // a stall that grows with the number of leaves. For views built for this
  // save.
  Result<SaveHandle> save(int64_t step, std::vector<LeafView>&& state, const SaveOptions& options = {});
  // A save() of `step` that its caller refused before the call (a binding
  // that could not convert the state it was given): counted and announced
  // as a save() that save() refuses itself is (docs/multiprocess.md), so
  // that the other processes of a group fail this attempt at once and the
  // next save of the step has one attempt id everywhere. `why` goes to the
  // others' errors. Nothing to do for a single process (OK). The error is
  // that of recording the refusal for the others.
  Status refused_save(int64_t step, const Status& why);
  // Waits for every save so far; returns the first error among the saves
  // since a previous call returned one (an error is returned once: of
  // several threads waiting at once, one gets it; each save's handle keeps
  // its own outcome).
  Status wait_until_finished();
  // Copy mode: allocates the staging buffers a save of `state_bytes` uses
  // (at most staging_budget) and faults their pages in now, on the calling
  // thread, so that the first save() does not stall on touching fresh
  // memory: a first touch of fresh pages can cost far more than the copy
  // itself (measured in docs/library.md). Later saves reuse the buffers.
  // Call it while the trainer sets up, from a thread of its own if the
  // setup should not wait. Borrow mode has no staging buffers: OK at once.
  // kResourceExhausted when the system refuses the memory (RLIMIT_AS,
  // strict overcommit): the buffers made are kept, and saves go on with
  // them; a save fails with kResourceExhausted only when it gets none.
  Status prepare_staging(uint64_t state_bytes);

  // Committed steps only, ascending. A step whose index fails to parse, or
  // (POSIX-like stores, where a final directory always holds its index) a
  // step directory holding data but no index, is skipped with a warning (an
  // error in strict mode). Data files are not read: see restore/verify.
  Result<std::vector<int64_t>> all_steps();
  Result<std::optional<int64_t>> latest_step();
  // Every step directory, committed or not, with sizes (slower: lists all).
  Result<std::vector<StepInfo>> list_step_dirs();

  // kNotFound when the step is not committed; kDataLoss when its index does
  // not parse, or when its directory holds data but no index on a POSIX-like
  // store (the index was deleted or lost).
  Result<Index> read_index(int64_t step);
  // Restores `step`, or with nullopt the newest intact committed step.
  //
  // Errors name what is damaged: kDataLoss with the leaf, shard, byte range
  // and data file and what is wrong (checksum mismatch, data file missing,
  // file shorter than the range), or the index and why it does not parse.
  //
  // nullopt (restore-latest): tries committed steps newest first. A step
  // whose index or data is damaged (kDataLoss) is skipped with a warning and
  // listed in RestoredState::skipped, and the next older step is tried; with
  // ManagerOptions::strict the first damaged step's error is returned
  // instead. Every other error is returned at once, never a reason to fall
  // back: transient or I/O errors (kUnavailable, kIOError, kPermissionDenied)
  // and errors in `options` (bad regex, template mismatch, destinations).
  // If every committed step is damaged: kDataLoss listing them; if none is
  // committed: kNotFound. A fallback costs the reads of the damaged steps.
  // With `options.into`, a failed attempt may already have written part of
  // a damaged step into the destinations; the restored step then overwrites
  // every destination of a leaf it holds.
  Result<RestoredState> restore(std::optional<int64_t> step, const RestoreOptions& options = {});
  // Reads every byte of a step and checks every checksum. kDataLoss names
  // every damaged data file (missing, or of the wrong size) and every
  // damaged shard (leaf, shard, byte range, file) found, up to 20.
  Status verify(int64_t step, const ProgressHook& on_progress = {});

  // Applies retention now (max_to_keep / keep_every as given).
  Status apply_retention(int max_to_keep, int64_t keep_every);
  // Removes temporaries and leftovers of failed saves not in flight here:
  // POSIX temporary and deleting step directories, object-store data that no
  // committed index references (and steps without an index), unfinished
  // multipart uploads into step directories. Only names ckptio writes are
  // removed from a step directory (data-, manifest-, failed- and an attempt
  // id): another program's files under the base stay. A save of this
  // manager that was in flight at any moment of the gc is spared, also when
  // it commits while gc runs. What changed less than options.min_age_seconds ago is
  // left alone, since a save running in another process (or manager) looks
  // exactly like a leftover until it commits. With min_age_seconds = 0 every
  // attempt not in flight in this manager counts as dead: removing a live
  // save's files fails it or, on an object store, can let it commit a step
  // whose data is gone (restore then skips it as damaged). See GcOptions.
  Status gc(const GcOptions& options = {});
  // Deletes committed step `step` (out of the committed set first, then its
  // files). Waits for the restores and verifies of the step in this manager,
  // and holds new ones off until it is done; kFailedPrecondition while a
  // save of the step is in flight in this manager (a save of it started
  // meanwhile is refused likewise).
  Status remove_step(int64_t step);

  Storage& storage() { return *storage_; }
  const ManagerOptions& options() const { return options_; }

  struct Impl;

 private:
  // save() of views already taken; `called` is when save() was called (the
  // stall counts from there).
  Result<SaveHandle> save_taken(int64_t step, std::vector<LeafView>&& state, const SaveOptions& options,
                                std::chrono::steady_clock::time_point called);

  // restore() and verify() but for what they throw (std::bad_alloc: those
  // return it as kResourceExhausted; nothing of theirs is in flight then).
  Result<RestoredState> restore_or_throw(std::optional<int64_t> step, const RestoreOptions& options);
  Status verify_or_throw(int64_t step, const ProgressHook& on_progress);

  // OK in the process that made this manager; kFailedPrecondition in a child.
  Status check_process() const;

  std::shared_ptr<Storage> storage_;
  ManagerOptions options_;
  std::unique_ptr<Impl> impl_;
  int made_by_pid_ = 0;
};

}  // namespace ckptio
