// The commit of a multi-process save.
//
// N processes save step S to one base. Every process derives the same
// attempt id A from (run_id, S, n) (group_attempt_id), so they share the
// staging location without talking: <S>.tmp-A/ on POSIX, <S>/ on object
// stores. Then:
//   1. process i writes its data file data-A-p<i>-0.bin and makes it durable
//      (fsync / CompleteMultipartUpload);
//   2. process i puts manifest-A-p<i>.json (durable on return: put() is
//      write-temporary, fsync, rename, fsync directory locally; a PUT on S3):
//      its leaves and shards, or the error that stopped it;
//   3. the coordinator (process 0) waits for all N manifests (polling the
//      storage, or at the trainer's barrier "written"), merges them and
//      proves every leaf is covered exactly once (merge_manifests);
//   4. it commits exactly as a single process does (src/save/commit.cc): the
//      index is written last, and on POSIX the stage directory, which holds
//      every process's data file, is fsynced before the rename, so all data
//      names are durable when the step becomes visible;
//   5. on failure it puts failed-A.json beside the manifests instead;
//   6. the others learn the outcome by reading the step's index (committed
//      with their own data file in it) or failed-A.json, by polling or once
//      after the barrier "decided". On POSIX a polling process needs more
//      than the index: the step is visible from its rename on but committed
//      only once the base directory's fsync after it succeeded, and should
//      that fail the coordinator moves the step back (commit.cc, take_back)
//      and fails it. The coordinator removes the manifests from a step only
//      after its commit returned, so a process that saw the index, then its
//      own manifest gone from the step, then the index still there, knows
//      the step committed (the step did not move away in between: a step
//      taken back never returns under its attempt). With a barrier the
//      coordinator arrives at "decided" only after its commit returned; on
//      object stores the index PUT is the commit, never taken back.
// A process that dies before step 2 makes the coordinator time out: the step
// is never committed, and the previous latest step is untouched, since
// nothing outside <S>.tmp-A/ (or outside the new data-A objects) was written.
// A dead coordinator makes the others time out. What a failed attempt leaves
// (data files, manifests, failed-A.json) is removed by gc(), like any dead
// attempt: its names are attempt-unique.
#include "src/save/group_commit.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <thread>

#include "src/util/callback.h"
#include "src/layout/layout.h"
#include "src/save/manifest.h"
#include "src/util/log.h"
#include "src/util/printable.h"
#include "src/storage/own_objects.h"

namespace ckptio {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kMaxPollSeconds = 3600;

uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string key_in(const GroupSave& g, const std::string& name) { return g.paths.stage_dir + "/" + name; }

std::string barrier_name(const GroupSave& g, const char* phase) {
  return "ckptio/" + g.paths.final_dir + "/" + g.paths.attempt + "/" + phase;
}

// The trainer's barrier (user code, maybe a binding): what it throws fails
// the wait like an error it returns.
Status barrier_wait(const GroupSave& g, const char* phase) {
  Status out;
  Status thrown = call_callback(
      "barrier", [&] { out = g.group.barrier->wait(barrier_name(g, phase), g.group.timeout_seconds); });
  return thrown.ok() ? out : thrown;
}

double elapsed(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sleeps before the next poll: starts at poll_seconds, grows to 1 s, and never
// past the timeout (a poll_seconds longer than the timeout would otherwise
// report the timeout that much late), so a last poll runs at the deadline.
struct Poller {
  double next;
  double timeout;
  Clock::time_point t0 = Clock::now();
  explicit Poller(const ProcessGroup& g) : next(std::max(g.poll_seconds, 0.001)), timeout(g.timeout_seconds) {}
  bool timed_out() const { return elapsed(t0) > timeout; }
  void sleep() {
    const double left = timeout - elapsed(t0);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::clamp(left + 0.001, 0.001, next)));
    next = std::min(next * 1.5, std::max(1.0, next));
  }
};

std::string list_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 16) s += ", ... (" + std::to_string(ids.size()) + " in all)";
  return s;
}

Result<Manifest> read_manifest(const GroupSave& g, int i) {
  const std::string key = key_in(g, manifest_name(g.paths.attempt, i));
  auto text = get_own_object(g.storage, key, IndexLimits{}.max_bytes);
  if (!text.ok()) return text.status().annotate("read manifest of process " + std::to_string(i));
  auto m = parse_manifest(*text);
  if (!m.ok()) return m.status().annotate(g.storage.describe() + "/" + key);
  if (m->attempt != g.paths.attempt || m->process_index != i || m->process_count != g.group.count)
    return data_loss(g.storage.describe() + "/" + key + ": manifest of attempt " + m->attempt + ", process " +
                     std::to_string(m->process_index) + " of " + std::to_string(m->process_count) +
                     ", where attempt " + g.paths.attempt + ", process " + std::to_string(i) + " of " +
                     std::to_string(g.group.count) + " was expected");
  return m;
}

}  // namespace

std::string group_attempt_id(const std::string& run_id, int64_t step, uint64_t n) {
  uint64_t h = mix(fnv1a64(run_id) ^ mix(static_cast<uint64_t>(step) + 0x9E3779B97F4A7C15ull) ^
                   mix(n * 0xD1B54A32D192ED03ull + 1));
  static const char* hex = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[i] = hex[h & 15];
  return s;
}

Status check_process_group(const ProcessGroup& g) {
  if (g.count < 1 || g.count > kMaxGroupProcesses)
    return invalid_argument("processes.count must be in [1, 2^20] (what a manifest may name), got " +
                            std::to_string(g.count));
  if (g.index < 0 || g.index >= g.count)
    return invalid_argument("processes.index " + std::to_string(g.index) + " is outside [0, " +
                            std::to_string(g.count) + ")");
  if (g.count == 1) return Status::OK();
  if (g.run_id.empty())
    return invalid_argument("processes.run_id is required for a multi-process save (an id all " +
                            std::to_string(g.count) + " processes share and no earlier run used)");
  if (g.run_id.size() > 256 ||
      g.run_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") !=
          std::string::npos)
    return invalid_argument("processes.run_id may hold letters, digits, '-', '_' and '.' (at most 256)");
  // (Infinity: a dead process would keep every other waiting for ever.)
  if (!(g.timeout_seconds > 0) || !std::isfinite(g.timeout_seconds))
    return invalid_argument("processes.timeout_seconds must be > 0 and finite");
  // Each poll sleeps this long: NaN or infinity made the sleep's conversion
  // to nanoseconds undefined (in practice a busy loop on the storage).
  if (!(g.poll_seconds >= 0 && g.poll_seconds <= kMaxPollSeconds))
    return invalid_argument("processes.poll_seconds must be in [0, " + std::to_string(int(kMaxPollSeconds)) +
                            "]");
  return Status::OK();
}

std::string group_data_file(const std::string& attempt, int process_index, size_t n) {
  return "data-" + attempt + "-p" + std::to_string(process_index) + "-" + std::to_string(n) + ".bin";
}

Status publish_manifest(const GroupSave& g, const Index& partial, const Status& own) {
  Manifest m;
  m.attempt = g.paths.attempt;
  m.process_index = g.group.index;
  m.process_count = g.group.count;
  if (own.ok()) m.index = partial;
  else m.error = own.to_string();
  m.index.step = g.step;
  const std::string text = serialize_manifest(m);
  const std::string key = key_in(g, manifest_name(g.paths.attempt, g.group.index));
  Status st = text.empty() ? out_of_memory("serialize the manifest")  // (serialize_index's failure)
                           : g.storage.put(key, std::span<const std::byte>(
                                                    reinterpret_cast<const std::byte*>(text.data()), text.size()));
  st = st.annotate("write manifest " + g.storage.describe() + "/" + key);
  if (g.group.barrier) {
    // Always arrive, even after a failure: the others wait here too.
    Status b = barrier_wait(g, "written");
    if (st.ok() && !b.ok()) st = b.annotate("barrier " + barrier_name(g, "written"));
  }
  return st;
}

Result<Index> gather_manifests(const GroupSave& g) {
  const int n = g.group.count;
  std::map<int, Manifest> got;
  if (g.group.barrier) {  // everyone passed "written": every manifest is there
    for (int i = 0; i < n; ++i) {
      CKPTIO_ASSIGN_OR_RETURN(Manifest m, read_manifest(g, i));
      got.emplace(i, std::move(m));
    }
  } else {
    const std::string prefix = key_in(g, manifest_prefix(g.paths.attempt));
    Poller poll(g.group);
    for (;;) {
      CKPTIO_ASSIGN_OR_RETURN(ListResult listed, g.storage.list(prefix, false));
      for (const ListEntry& e : listed.objects) {
        // The process from the name, then the exact name checked: comparing
        // each name with all N expected ones cost seconds a poll at N = 4096.
        if (e.key.size() <= prefix.size() || e.key.compare(0, prefix.size(), prefix) != 0) continue;
        int i = -1;
        std::from_chars(e.key.data() + prefix.size(), e.key.data() + e.key.size(), i);
        if (i < 0 || i >= n || got.count(i) || e.key != key_in(g, manifest_name(g.paths.attempt, i))) continue;
        CKPTIO_ASSIGN_OR_RETURN(Manifest m, read_manifest(g, i));
        if (m.error)  // fail now rather than after the timeout
          return Status(Code::kFailedPrecondition,
                        "process " + std::to_string(i) + " failed: " + printable(*m.error, kQuotedErrorMax));
        got.emplace(i, std::move(m));
      }
      if (static_cast<int>(got.size()) == n) break;
      if (poll.timed_out()) {
        std::vector<int> missing;
        for (int i = 0; i < n; ++i)
          if (!got.count(i)) missing.push_back(i);
        return Status(Code::kUnavailable,
                      "timed out after " + std::to_string(static_cast<int>(g.group.timeout_seconds)) +
                          " s waiting for the manifests of process(es) " + list_ids(missing) + " of " +
                          std::to_string(n) + " (dead, or still writing)");
      }
      poll.sleep();
    }
  }
  std::vector<Manifest> all;
  all.reserve(got.size());
  for (auto& [i, m] : got) all.push_back(std::move(m));
  return merge_manifests(std::move(all));
}

namespace {
std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
}  // namespace

void announce_outcome(const GroupSave& g, const Status& outcome) {
  if (!outcome.ok()) {
    const std::string text = outcome.to_string();
    Status st = g.storage.put(key_in(g, failure_name(g.paths.attempt)), bytes_of(text));
    if (!st.ok()) logging::warn("ckptio: could not record the failure of step {} for the other processes: {}",
                               g.step, st.to_string());
  }
  if (g.group.barrier) {
    Status b = barrier_wait(g, "decided");
    if (!b.ok()) logging::warn("ckptio: barrier {}: {}", barrier_name(g, "decided"), b.to_string());
  }
  if (outcome.ok()) {  // the manifests served their purpose (and tell the others, polling, that it is done)
    // A removal that fails is tried again: on a file system a process
    // polling for the outcome takes the commit as confirmed only once its
    // manifest is gone, and waited for its timeout before reporting the
    // step unconfirmed (one failed unlink, after a commit that succeeded).
    for (int i = 0; i < g.group.count; ++i) {
      const std::string key = g.paths.final_dir + "/" + manifest_name(g.paths.attempt, i);
      Status st;
      for (int attempt = 0; attempt < 4; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));
        st = g.storage.remove(key);
        if (st.ok() || st.code() == Code::kNotFound) break;
      }
      if (!st.ok() && st.code() != Code::kNotFound)
        logging::warn("ckptio: step {} is committed, but {} could not be removed ({}): process {} reports it "
                      "unconfirmed at its timeout if it polls for the outcome",
                      g.step, key, st.to_string(), i);
    }
  }
}

Result<bool> index_lists(Storage& storage, const std::string& final_dir, const std::string& file) {
  auto text = storage.get(index_key(final_dir), IndexLimits{}.max_bytes);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) return false;
    return text.status();
  }
  if (text->find(file) == std::string::npos) return false;
  auto parsed = parse_index(*text);
  if (parsed.ok())
    for (const DataFileRecord& f : parsed->files)
      if (f.name == file) return true;
  return false;
}

Status await_outcome(const GroupSave& g, bool* decided) {
  *decided = false;
  if (g.group.barrier) {
    Status b = barrier_wait(g, "decided");
    if (!b.ok()) return b.annotate("barrier " + barrier_name(g, "decided"));
  }
  const std::string ours = group_data_file(g.paths.attempt, g.group.index);
  const std::string failed = key_in(g, failure_name(g.paths.attempt));
  // Polling on POSIX, the index is not enough (step 6 above).
  const bool look_twice = g.paths.renames && !g.group.barrier;
  const std::string own_manifest = g.paths.final_dir + "/" + manifest_name(g.paths.attempt, g.group.index);
  bool listed_once = false;  // (for the timeout's message)
  Poller poll(g.group);
  for (;;) {
    // Committed: the step's index lists this process's (first) data file (a step
    // committed by an earlier run, which overwrite replaces, does not).
    auto listed = index_lists(g.storage, g.paths.final_dir, ours);
    if (listed.ok() && *listed && look_twice) {
      listed_once = true;
      auto manifest = g.storage.stat(own_manifest);
      if (manifest.ok()) *listed = false;  // not removed yet: the commit may still be taken back
      else if (manifest.status().code() == Code::kNotFound) listed = index_lists(g.storage, g.paths.final_dir, ours);
      else listed = manifest.status();
    }
    if (!listed.ok()) return listed.status().annotate("read the outcome of step " + std::to_string(g.step));
    if (*listed) {
      *decided = true;
      return Status::OK();
    }
    auto why = g.storage.get(failed, 1 << 20);
    if (why.ok()) {
      *decided = true;
      return Status(Code::kFailedPrecondition,
                    "the coordinator (process 0) failed the step: " + printable(*why, kQuotedErrorMax));
    }
    if (why.status().code() != Code::kNotFound)
      return why.status().annotate("read the outcome of step " + std::to_string(g.step));
    if (g.group.barrier)
      return internal_error("passed the barrier \"decided\" but process 0 left no outcome for step " +
                            std::to_string(g.step) + " at " + g.storage.describe());
    if (poll.timed_out())
      return Status(Code::kUnavailable, "timed out after " +
                                            std::to_string(static_cast<int>(g.group.timeout_seconds)) +
                                            " s waiting for the coordinator (process 0) to commit step " +
                                            std::to_string(g.step) +
                                            (listed_once ? " (its index appeared, but process 0 never confirmed "
                                                           "the commit durable: this process's data files are kept)"
                                                         : " (it may still commit it: this process's data files "
                                                           "are kept)"));
    poll.sleep();
  }
}

}  // namespace ckptio
