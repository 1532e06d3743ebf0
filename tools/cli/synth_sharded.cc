// `ckptio synth save|check --mesh/--rules/--processes` (see synth_sharded.h).
//
// Processes: the parent forks N children before any thread exists; child p
// owns mesh devices [D*p/N, D*(p+1)/N) (ids in mesh order), opens its own
// manager with ManagerOptions::processes = {p, N, run_id} (run_id drawn by
// the parent, so a rerun never meets a dead run's files), does its share,
// and writes one JSON line of figures to a pipe. The parent sums bytes, takes
// the slowest process's time, and fails if any child failed. On S3 the
// processes share the default requests in flight (per_process below).
//
// Both directions use Uneven::kPad, so any mesh can lay out any synth leaf
// (the layout's dimensions rarely divide by 3); a jax.Array sharding divides
// evenly and is the special case.
//
// Test hook: CKPTIO_SYNTH_KILL_PROCESS=P makes process P of a save SIGKILL
// itself at its first data write (mid-save, before its manifest), so a test
// can prove the step never commits.
#include "tools/cli/synth_sharded.h"

#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>
#include <cstring>
#include <map>
#include <set>

#include "backends/fault/fault_storage.h"
#include "tools/cli/synth.h"

namespace ckptio::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Sharding {
  Mesh mesh;
  PartitionRules rules;
  std::string rules_text;  // as given, for the metadata
  int processes = 1;
  double barrier_timeout = 600;
};

Sharding resolve(const ShardingArgs& a) {
  Sharding s;
  if (a.processes < 1 || a.processes > 1024) fail(kExitUsage, "--processes must be in [1, 1024]");
  s.processes = a.processes;
  std::string mesh = a.mesh.empty() ? "dp=" + std::to_string(a.processes) : a.mesh;
  auto m = Mesh::parse(mesh);
  if (!m.ok()) fail(kExitUsage, "--mesh: " + m.status().message());
  s.mesh = *m;
  if (!a.rules.empty()) {
    std::ifstream in(a.rules, std::ios::binary);
    if (!in) fail(kExitNotFound, "--rules: cannot read " + a.rules);
    // At most one byte more than from_json takes (16 MiB): reading the whole
    // file first let --rules /dev/zero (or a large file named by mistake)
    // grow a string until memory ran out.
    s.rules_text.resize((size_t{16} << 20) + 1);
    in.read(s.rules_text.data(), static_cast<std::streamsize>(s.rules_text.size()));
    s.rules_text.resize(static_cast<size_t>(in.gcount()));
    if (in.bad()) fail(kExitUsage, "--rules: cannot read " + a.rules);
    auto r = PartitionRules::from_json(s.rules_text);
    if (!r.ok()) fail(kExitUsage, "--rules " + a.rules + ": " + r.status().message());
    s.rules = *r;
  } else {
    // Dimension 0 over every mesh axis, major to minor.
    Json all = Json::array();
    for (const MeshAxis& ax : s.mesh.axes()) all.push_back(ax.name);
    s.rules_text = Json::array({Json::array({".*", Json::array({all})})}).dump();
    s.rules = PartitionRules::from_json(s.rules_text).value();
  }
  return s;
}

// The devices process p of n owns.
std::vector<int64_t> devices_of(const Mesh& mesh, int p, int n) {
  const size_t d = mesh.num_devices();
  std::vector<int64_t> out;
  for (size_t i = d * p / n; i < d * (p + 1) / n; ++i) out.push_back(mesh.device_ids()[i]);
  return out;
}

// Calls f(leaf_byte_offset, box_byte_offset, bytes) for each contiguous run
// of `box` in the C-order leaf of `shape`.
template <typename F>
void for_each_run(const Shape& shape, const Box& box, size_t item, F&& f) {
  const size_t r = shape.size();
  for (size_t d = 0; d < r; ++d)
    if (box.stop[d] <= box.start[d]) return;
  if (r == 0) return f(uint64_t{0}, uint64_t{0}, uint64_t{item});
  size_t inner = r - 1;  // runs span dims >= inner (trailing whole dims merge)
  uint64_t run = static_cast<uint64_t>(box.stop[inner] - box.start[inner]) * item;
  while (inner > 0 && box.start[inner] == 0 && box.stop[inner] == shape[inner]) {
    --inner;
    run *= static_cast<uint64_t>(box.stop[inner] - box.start[inner]);
  }
  std::vector<int64_t> idx(box.start);
  uint64_t at = 0;
  for (;;) {
    uint64_t off = 0;
    for (size_t d = 0; d < r; ++d) off = off * static_cast<uint64_t>(shape[d]) + (d > inner ? 0 : idx[d]);
    f(off * item, at, run);
    at += run;
    size_t d = inner;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < box.stop[d]) break;
      idx[d] = box.start[d];
    }
  }
}

NamedSharding leaf_sharding(const Sharding& s, const synth::SynthLeaf& leaf) {
  auto match = match_partition_rules(s.rules, leaf.path, leaf.shape);
  if (!match.ok()) fail(kExitUsage, "--rules: " + match.status().message());
  return NamedSharding{s.mesh, match->spec};
}

Json wait_children(std::vector<std::pair<pid_t, int>>& kids, std::vector<Json>* results) {
  std::vector<std::string> failures;
  for (size_t p = 0; p < kids.size(); ++p) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(kids[p].second, buf, sizeof buf)) > 0) out.append(buf, n);
    ::close(kids[p].second);
    int status = 0;
    ::waitpid(kids[p].first, &status, 0);
    auto j = Json::parse(out, nullptr, false);
    if (WIFSIGNALED(status))
      failures.push_back("process " + std::to_string(p) + " was killed by signal " + std::to_string(WTERMSIG(status)));
    else if (WEXITSTATUS(status) != 0 || j.is_discarded())
      failures.push_back("process " + std::to_string(p) + " exited with " + std::to_string(WEXITSTATUS(status)));
    results->push_back(j.is_discarded() ? Json::object() : j);
  }
  Json f = Json::array();
  for (auto& s : failures) f.push_back(s);
  return f;
}

// Forks n children running fn(p) (which returns its JSON figures); returns
// every child's figures and the failures.
template <typename Fn>
std::pair<std::vector<Json>, Json> fork_processes(int n, Fn&& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<std::pair<pid_t, int>> kids;
  for (int p = 0; p < n; ++p) {
    int fds[2];
    if (::pipe(fds) != 0) fail(kExitFailed, "pipe: " + std::string(std::strerror(errno)));
    const pid_t pid = ::fork();
    if (pid < 0) fail(kExitFailed, "fork: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::close(fds[0]);
      for (auto& k : kids) ::close(k.second);
      const std::string out = json_text(fn(p), -1) + "\n";
      (void)!::write(fds[1], out.data(), out.size());
      std::fflush(stdout);
      ::_exit(0);
    }
    ::close(fds[1]);
    kids.emplace_back(pid, fds[0]);
  }
  std::vector<Json> results;
  Json failures = wait_children(kids, &results);
  return {results, failures};
}

std::string new_run_id() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof buf, "synth-%d-%08x%08x", static_cast<int>(::getpid()), rd(), rd());
  return buf;
}

// ---- save --------------------------------------------------------------------

Json save_process(const GlobalOptions& g, const Sharding& s, const ShardedSaveArgs& a,
                  const synth::Layout& layout, int p, const std::string& run_id) {
  const std::vector<int64_t> local = devices_of(s.mesh, p, s.processes);
  const std::set<int64_t> mine(local.begin(), local.end());
  // Generate the boxes this process writes (one replica of each: the lowest
  // device id holding it), straight from the generator.
  std::vector<Buffer> buffers;
  std::vector<LeafView> views;
  struct Job { size_t leaf; Box box; std::byte* dst; };
  std::vector<Job> jobs;
  uint64_t bytes = 0;
  for (size_t i = 0; i < layout.leaves.size(); ++i) {
    const synth::SynthLeaf& leaf = layout.leaves[i];
    const NamedSharding sh = leaf_sharding(s, leaf);
    auto shards = unique_shards(sh, leaf.shape, Uneven::kPad);
    if (!shards.ok()) fail_status(shards.status(), leaf.name(), kExitUsage);
    std::vector<DeviceData> data;
    for (const UniqueShard& u : *shards) {
      if (!mine.count(u.writer_device_id)) continue;
      const uint64_t n = checked_num_bytes(u.box.extent(), dtype_size(leaf.dtype)).value_or(0);
      if (n == 0) continue;
      buffers.push_back(Buffer::allocate(n, 4096));
      jobs.push_back({i, u.box, buffers.back().data()});
      data.push_back(DeviceData{u.writer_device_id, buffers.back().data()});
      bytes += n;
    }
    auto view = sharded_leaf_view(leaf.prefix, leaf.path, leaf.dtype, leaf.shape, sh, data, Uneven::kPad);
    if (!view.ok()) fail_status(view.status(), leaf.name());
    views.push_back(std::move(view).value());
  }
  const auto t_gen = Clock::now();
  synth::parallel_for(jobs.size(), 0, [&](size_t k) {
    const synth::SynthLeaf& leaf = layout.leaves[jobs[k].leaf];
    const uint64_t key = synth::leaf_key(a.seed, leaf.prefix, leaf.path);
    for_each_run(leaf.shape, jobs[k].box, dtype_size(leaf.dtype), [&](uint64_t at, uint64_t dst, uint64_t n) {
      synth::fill(key, at, jobs[k].dst + dst, n);
    });
  });
  const double gen_seconds = since(t_gen);

  ManagerOptions mo = manager_options(g);
  mo.staging = a.borrow ? StagingMode::kBorrow : StagingMode::kCopy;
  mo.processes.index = p;
  mo.processes.count = s.processes;
  mo.processes.run_id = run_id;
  mo.processes.timeout_seconds = s.barrier_timeout;
  std::unique_ptr<CheckpointManager> m;
  const char* kill = std::getenv("CKPTIO_SYNTH_KILL_PROCESS");
  if (kill && *kill && std::atoi(kill) == p && s.processes > 1) {
    auto base = open_storage(a.uri, storage_options(g));
    if (!base.ok()) fail_status(base.status(), "open " + a.uri);
    auto faults = make_fault_storage(*base);
    auto writes = std::make_shared<std::atomic<int>>(0);
    faults->set_hook([writes](FaultOp op, const std::string&) {
      if (op == FaultOp::kWrite && ++*writes == 1) ::raise(SIGKILL);
    });
    m = std::make_unique<CheckpointManager>(faults, mo);
  } else {
    m = open_manager(g, a.uri, Access::kWrite, mo);
  }
  SaveOptions so;
  Json meta = Json::parse(synth_metadata_json(a.seed, a.target_bytes, a.leaves, layout.total_bytes));
  meta["synth"]["mesh"] = s.mesh.to_string();
  meta["synth"]["rules"] = Json::parse(s.rules_text, nullptr, false);
  meta["synth"]["processes"] = s.processes;
  so.metadata_json = meta.dump();
  so.overwrite = a.overwrite;
  so.row_band_ways = a.row_band_ways;
  const auto t0 = Clock::now();
  auto h = m->save(a.step, views, so);
  const double stall = since(t0);
  if (!h.ok()) fail_status(h.status(), "process " + std::to_string(p) + ": save step " + std::to_string(a.step));
  Status st = h->wait();
  if (!st.ok()) fail_status(st, "process " + std::to_string(p));
  SaveStats stats = h->stats();
  if (stats.stall_seconds <= 0) stats.stall_seconds = stall;
  return Json{{"bytes", stats.bytes},
              {"generate_seconds", gen_seconds},
              {"stall_seconds", stats.stall_seconds},
              {"total_seconds", stats.total_seconds},
              {"write_seconds", stats.write_seconds},
              {"commit_seconds", stats.commit_seconds}};
}

// ---- check -------------------------------------------------------------------

// Restores this process's device buffers and compares each with the
// generator. Returns the figures, or {"error": ...}.
Json check_process(const GlobalOptions& g, const Sharding& s, const ShardedCheckArgs& a, int64_t step,
                   int p) {
  auto m = open_manager(g, a.uri, Access::kRead);
  auto index = m->read_index(step);
  if (!index.ok()) fail_status(index.status(), "step " + std::to_string(step));
  const SynthMeta meta = parse_synth_meta(index->metadata_json, step);
  const synth::Layout layout = synth::make_layout(meta.bytes, meta.leaves);
  if (std::string e = compare_leaf_set(layout, *index); !e.empty())
    return Json{{"error", "step " + std::to_string(step) + ": " + e}};
  RestoreOptions ro;
  RestoreOptions::Sharding target;
  target.mesh = s.mesh;
  target.rules = s.rules;
  target.devices = devices_of(s.mesh, p, s.processes);
  // More processes than devices: this one owns none, so it restores nothing
  // (an empty Sharding::devices would mean every device of the mesh).
  if (target.devices.empty())
    return Json{{"bytes_needed", 0}, {"bytes_read", 0}, {"requests", 0}, {"pieces_unverified", 0},
                {"bytes_unverified", 0}, {"bytes_checked", 0}, {"restore_seconds", 0.0},
                {"ready_monotonic_s", std::chrono::duration<double>(Clock::now().time_since_epoch()).count()},
                {"leaves", 0}};
  target.uneven = Uneven::kPad;
  ro.sharding = target;
  if (!a.coalesce_gap.empty()) ro.coalesce_gap = size_arg(a.coalesce_gap, "--coalesce-gap");
  if (a.verify_whole_shards) ro.verify_widen_max_bytes = UINT64_MAX;
  ro.prefault = a.prefault;
  const auto t0 = Clock::now();
  auto r = m->restore(step, ro);
  const double seconds = since(t0);
  const double ready = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  if (!r.ok()) return Json{{"error", "process " + std::to_string(p) + ": " + r.status().to_string()}};
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < layout.leaves.size(); ++i) at[layout.leaves[i].name()] = i;
  uint64_t checked = 0;
  for (const Tensor& t : r->leaves) {
    auto it = at.find(t.prefix + "/" + t.path);
    if (it == at.end()) return Json{{"error", "unexpected leaf " + t.prefix + "/" + t.path}};
    const synth::SynthLeaf& leaf = layout.leaves[it->second];
    auto v = meta.versions.find(leaf.name());
    const uint64_t key = synth::leaf_key(meta.seed, leaf.prefix, leaf.path, v == meta.versions.end() ? 0 : v->second);
    std::set<const std::byte*> seen;  // replicas share a buffer: check it once
    for (const DeviceShard& d : t.device_shards) {
      const uint64_t n = checked_num_bytes(d.box.extent(), dtype_size(leaf.dtype)).value_or(0);
      if (d.data.size() != n)
        return Json{{"error", leaf.name() + " device " + std::to_string(d.device_id) + ": " +
                                  std::to_string(d.data.size()) + " bytes, its box holds " + std::to_string(n)}};
      if (n == 0 || !seen.insert(d.data.data()).second) continue;
      std::string bad;
      for_each_run(leaf.shape, d.box, dtype_size(leaf.dtype), [&](uint64_t off, uint64_t dst, uint64_t len) {
        if (!bad.empty()) return;
        if (auto x = synth::find_mismatch(key, off, d.data.data() + dst, len))
          bad = "step " + std::to_string(step) + ": " + leaf.name() + " on device " + std::to_string(d.device_id) +
                " differs from the generator at byte " + std::to_string(*x) + " of the leaf";
      });
      if (!bad.empty()) return Json{{"error", bad}};
      checked += n;
    }
  }
  return Json{{"bytes_needed", r->stats.bytes_needed},
              {"bytes_read", r->stats.bytes_read},
              {"requests", r->stats.requests},
              {"pieces_unverified", r->stats.pieces_unverified},
              {"bytes_unverified", r->stats.bytes_unverified},
              {"bytes_checked", checked},
              {"restore_seconds", seconds},
              {"ready_monotonic_s", ready},
              {"leaves", r->leaves.size()}};
}

// The options each of n processes runs with: on S3, the processes share the
// default 32 requests in flight (at least 4 each) unless
// --s3-max-connections says otherwise, so that N processes on one machine
// put the load of one on the server (a loopback server with one thread
// slows down under 3 x 32 connections), as N hosts would each have their own.
GlobalOptions per_process(const GlobalOptions& g, int n) {
  GlobalOptions out = g;
  if (n > 1 && out.s3_max_connections == 0) out.s3_max_connections = static_cast<uint32_t>(std::max(4, 32 / n));
  return out;
}

template <typename Fn>
std::pair<std::vector<Json>, Json> run_processes(int n, Fn&& fn) {
  if (n == 1) return {{fn(0)}, Json::array()};
  return fork_processes(n, fn);
}

double max_of(const std::vector<Json>& rs, const char* key) {
  double m = 0;
  for (const Json& r : rs) m = std::max(m, r.value(key, 0.0));
  return m;
}
uint64_t sum_of(const std::vector<Json>& rs, const char* key) {
  uint64_t s = 0;
  for (const Json& r : rs) s += r.value(key, uint64_t{0});
  return s;
}

}  // namespace

int run_sharded_save(const GlobalOptions& g, const ShardingArgs& args, const ShardedSaveArgs& a) {
  Sharding s = resolve(args);
  s.barrier_timeout = args.barrier_timeout;
  // Each forked process would have a store of its own: the coordinator could
  // only wait for the others' manifests until --barrier-timeout.
  if (s.processes > 1 && is_mem_uri(a.uri))
    fail(kExitUsage, "--processes " + std::to_string(s.processes) + " needs a location the processes share (a "
                     "directory or s3://); a mem:// store is empty in every new process");
  if (a.leaves < 1 || a.leaves > synth::kMaxLeaves)
    fail(kExitUsage, "--leaves must be in [1, " + std::to_string(synth::kMaxLeaves) + "]");
  const synth::Layout layout = synth::make_layout(a.target_bytes, a.leaves);
  for (const synth::SynthLeaf& leaf : layout.leaves) {  // fail on bad rules before forking
    auto st = validate_sharding(leaf_sharding(s, leaf), leaf.shape, Uneven::kPad);
    if (!st.ok()) fail(kExitUsage, leaf.name() + ": " + st.message());
  }
  require_memory(layout.total_bytes, "the synthetic state");
  {
    auto m = open_manager(g, a.uri, Access::kWrite);
    if (!a.overwrite && m->read_index(a.step).ok())
      fail(kExitFailed, "step " + std::to_string(a.step) + " is already committed at " +
                            join_uri(a.uri, step_dir_name(g, a.step)) + " (pass --overwrite to replace it)");
  }
  const std::string run_id = new_run_id();
  const GlobalOptions gp = per_process(g, s.processes);
  const auto t0 = Clock::now();
  auto [results, failures] = run_processes(s.processes, [&](int p) {
    return save_process(gp, s, a, layout, p, run_id);
  });
  const double wall = since(t0);
  if (!failures.empty()) {
    std::string msg = "sharded save of step " + std::to_string(a.step) + " failed:";
    for (const auto& f : failures) msg += " " + f.get<std::string>() + ";";
    msg.pop_back();
    fail(kExitFailed, msg);
  }
  const uint64_t bytes = sum_of(results, "bytes");
  const double save_seconds = max_of(results, "total_seconds");
  const std::string path = join_uri(a.uri, step_dir_name(g, a.step));
  if (a.json) {
    Json out = {{"step", a.step},
                {"path", path},
                {"bytes", bytes},
                {"state_bytes", layout.total_bytes},
                {"leaves", layout.leaves.size()},
                {"seed", a.seed},
                {"mesh", s.mesh.to_string()},
                {"processes", s.processes},
                {"staging", a.borrow ? "borrow" : "copy"},
                {"stall_ms", round_to(max_of(results, "stall_seconds") * 1e3, 3)},
                {"save_seconds", round_to(save_seconds, 4)},
                {"save_gbps", round_to(gbps(bytes, save_seconds), 4)},
                {"commit_seconds", round_to(max_of(results, "commit_seconds"), 4)},
                {"generate_seconds", round_to(max_of(results, "generate_seconds"), 4)},
                {"wall_seconds", round_to(wall, 4)}};
    std::printf("%s\n", json_text(out).c_str());
  } else {
    std::printf("saved step %lld to %s: %s (of a %s state in %zu leaves) by %d process(es) over mesh %s\n",
                static_cast<long long>(a.step), path.c_str(), format_bytes(bytes).c_str(),
                format_bytes(layout.total_bytes).c_str(), layout.leaves.size(), s.processes,
                s.mesh.to_string().c_str());
    std::printf("  committed %s after save() (%s); slowest stall %s\n", format_seconds(save_seconds).c_str(),
                format_gbps(bytes, save_seconds).c_str(),
                format_seconds(max_of(results, "stall_seconds")).c_str());
  }
  return kExitOk;
}

int run_sharded_check(const GlobalOptions& g, const ShardingArgs& args, const ShardedCheckArgs& a) {
  Sharding s = resolve(args);
  int64_t step = 0;
  {
    auto m = open_manager(g, a.uri, Access::kRead);
    const Index index = resolve_index(*m, a.uri, a.step);
    step = index.step;
    const SynthMeta meta = parse_synth_meta(index.metadata_json, step);
    const synth::Layout layout = synth::make_layout(meta.bytes, meta.leaves);
    for (const synth::SynthLeaf& leaf : layout.leaves) {
      auto st = validate_sharding(leaf_sharding(s, leaf), leaf.shape, Uneven::kPad);
      if (!st.ok()) fail(kExitUsage, leaf.name() + ": " + st.message());
    }
  }
  const GlobalOptions gp = per_process(g, s.processes);
  auto [results, failures] = run_processes(s.processes, [&](int p) { return check_process(gp, s, a, step, p); });
  std::string error;
  for (const auto& f : failures) error += (error.empty() ? "" : "; ") + f.get<std::string>();
  for (const Json& r : results)
    if (r.contains("error")) error += (error.empty() ? "" : "; ") + r["error"].get<std::string>();
  const uint64_t needed = sum_of(results, "bytes_needed");
  const uint64_t read = sum_of(results, "bytes_read");
  const double seconds = max_of(results, "restore_seconds");
  if (a.json) {
    Json out = {{"step", step},
                {"mesh", s.mesh.to_string()},
                {"processes", s.processes},
                {"bytes_needed", needed},
                {"bytes_read", read},
                {"read_ratio", needed ? round_to(static_cast<double>(read) / needed, 4) : 0.0},
                {"requests", sum_of(results, "requests")},
                {"pieces_unverified", sum_of(results, "pieces_unverified")},
                {"bytes_unverified", sum_of(results, "bytes_unverified")},
                {"bytes_checked", sum_of(results, "bytes_checked")},
                {"restore_seconds", round_to(seconds, 4)},
                {"restore_gbps", round_to(gbps(needed, seconds), 4)},
                // CLOCK_MONOTONIC when the last process had its devices' state in
                // memory (before comparing it with the generator): bench/restart_bench.py.
                {"ready_monotonic_s", round_to(max_of(results, "ready_monotonic_s"), 4)},
                {"verified", error.empty()}};
    if (!error.empty()) out["error"] = error;
    std::printf("%s\n", json_text(out).c_str());
  } else if (error.empty()) {
    std::printf("step %lld restored into mesh %s by %d process(es): every device buffer matches the generator\n",
                static_cast<long long>(step), s.mesh.to_string().c_str(), s.processes);
    std::printf("  read %s for %s needed (%.3fx) in %llu requests; slowest process %s (%s)\n",
                format_bytes(read).c_str(), format_bytes(needed).c_str(),
                needed ? static_cast<double>(read) / needed : 0.0,
                static_cast<unsigned long long>(sum_of(results, "requests")), format_seconds(seconds).c_str(),
                format_gbps(needed, seconds).c_str());
    if (const uint64_t unverified = sum_of(results, "pieces_unverified"))
      std::printf("  %llu saved shards read in part (%s): their checksums cover whole shards and were not "
                  "checked (--verify-whole-shards reads them whole)\n",
                  static_cast<unsigned long long>(unverified),
                  format_bytes(sum_of(results, "bytes_unverified")).c_str());
  }
  if (!error.empty()) fail(kExitFailed, error);
  return kExitOk;
}

}  // namespace ckptio::cli
