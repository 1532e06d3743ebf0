// `ckptio bench`: save a synthetic state, then restore it and check every
// byte; report throughput, the save() stall, the memory a save holds, and the
// baselines those figures are judged against, all measured in this process:
//
//   1. Generate the state (one warm arena, as a trainer's host copy is).
//   2. Warm-up saves (--warmup, default 1), reported apart: the first save
//      of a process touches the staging pool for the first time, and on a VM
//      first touches of guest memory are slow (see docs/benchmarks.md).
//      Steady-state saves reuse the pool; that is what the timed runs show.
//   3. Timed saves (--repeat): throughput (save() to commit), stall (time
//      save() blocked), peak RSS while the save runs (nothing else large is
//      alive then: the state and the manager's pool only), checked against
//      state + staging budget + 64 MiB. Copy mode's staging budget defaults to
//      the state size here (rounded up to a chunk) so that save() never waits
//      for the disk; --staging-budget overrides it.
//   4. Per saved step, with one destination arena allocated and touched
//      once (huge pages, as numpy advises for large arrays):
//      - memcpy baseline: one single-threaded memcpy of the state into that
//        warm arena, median of three (copy mode's stall is judged against
//        it; the pool it stands for is warm too after the warm-up save);
//      - restore into the warm arena (RestoreOptions::into), cold page cache;
//        fio's read figures come from warm buffers too, so this is the
//        like-for-like I/O figure;
//      - restore into fresh memory (the default API path), cold page cache:
//        it also pays this machine's first-touch cost of every page.
//   Both restores verify checksums and are compared with the generator.
//
// `ckptio bench --compare PATH` is something else: it runs the local
// contenders of bench/run-all (fio, this ckptio, zarr-python, numpy.save) in a
// directory under PATH, so that a user can qualify their own disk. It execs
// the script from the source tree (found beside this file at build time, beside
// the binary, or at $CKPTIO_RUN_ALL), which needs python3 with numpy (zarr and
// numcodecs for that contender), fio, and root to drop the page cache.
#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "tools/cli/cli.h"
#include "tools/cli/synth.h"

namespace ckptio::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr uint64_t kRssSlack = 64ull << 20;

struct BenchCmd {
  std::string uri;
  std::string bytes = "1GiB";
  uint64_t leaves = synth::kDefaultLeaves;
  uint64_t seed = 0;
  std::string staging = "copy";
  int repeat = 1;
  int warmup = 1;
  bool json = false;
  bool no_drop = false;
  bool no_fresh = false;
  std::string compare;  // --compare PATH: run bench/run-all's local contenders there
  bool bytes_given = false, repeat_given = false, leaves_given = false;
};

struct Run {
  int64_t step = 0;
  uint64_t bytes = 0;
  double stall_ms = 0;
  double save_seconds = 0;
  double save_gbps = 0;
  uint64_t peak_rss = 0;       // during the save
  double memcpy_seconds = 0;   // one memcpy of the state into warm memory
  double restore_seconds = 0;  // into warm destinations
  // When that restore began, on CLOCK_MONOTONIC (steady_clock), so that a
  // caller sampling CPU use on the same clock can profile it (bench/run-all).
  double restore_started_monotonic = 0;
  double restore_gbps = 0;
  // The warm restore's phases (RestoreStats): index fetch and parse, plan, reads.
  double restore_index_seconds = 0, restore_plan_seconds = 0, restore_read_seconds = 0;
  double restore_fresh_seconds = 0;  // into fresh allocations
  double restore_fresh_gbps = 0;
  bool verified = false;
  bool cold_cache = false;
  std::string error;
};

// Drops the page cache so that restore reads from the device. "" on success,
// else why not.
std::string drop_page_cache(const std::string& uri, bool skip) {
  if (skip) return "--no-drop-cache given";
  if (!local_path(uri)) return "not a local URI";
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open /proc/sys/vm/drop_caches: ") + std::strerror(errno) +
                     (::geteuid() != 0 ? " (run as root for cold-cache reads)" : "");
  const bool ok = ::write(fd, "3", 1) == 1;
  const int err = errno;
  ::close(fd);
  if (!ok) return std::string("writing /proc/sys/vm/drop_caches failed: ") + std::strerror(err);
  return "";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json run_json(const Run& r) {
  nlohmann::json j = {{"step", r.step},
                      {"bytes", r.bytes},
                      {"stall_ms", round_to(r.stall_ms, 3)},
                      {"save_seconds", round_to(r.save_seconds, 4)},
                      {"save_gbps", round_to(r.save_gbps, 4)},
                      {"peak_rss_bytes", r.peak_rss},
                      {"memcpy_ms", round_to(r.memcpy_seconds * 1e3, 3)},
                      {"restore_seconds", round_to(r.restore_seconds, 4)},
                      {"restore_started_monotonic_s", round_to(r.restore_started_monotonic, 4)},
                      {"restore_gbps", round_to(r.restore_gbps, 4)},
                      {"restore_phases_seconds", {{"index", round_to(r.restore_index_seconds, 4)},
                                                  {"plan", round_to(r.restore_plan_seconds, 4)},
                                                  {"read", round_to(r.restore_read_seconds, 4)}}},
                      {"restore_fresh_seconds", round_to(r.restore_fresh_seconds, 4)},
                      {"restore_fresh_gbps", round_to(r.restore_fresh_gbps, 4)},
                      {"verified", r.verified},
                      {"cold_cache", r.cold_cache}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

std::string make_temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/ckptio-bench.XXXXXX";
  if (!::mkdtemp(tmpl.data())) fail_status(Status::from_errno(errno, tmpl), "create a temporary directory");
  return tmpl;
}

// Destination arrays for restore-into: one arena laid out by
// restore_arena_layout (what a caller who wants zero-copy reads does: each
// leaf's address agrees with its shard's file offset modulo the backend's
// read alignment, and leaves saved next to each other lie next to each
// other, so that small ones are read several at a time without a copy).
struct Destinations {
  Buffer arena;
  std::vector<std::byte*> data;   // per layout leaf
  std::vector<uint64_t> offsets;  // per layout leaf, in the arena
  double first_touch_seconds = 0;
};

// Where every layout leaf goes in the arena for `index`; {} if the index
// lacks one of them (then make_destinations packs them as the layout lists them).
std::pair<std::vector<uint64_t>, uint64_t> arena_offsets(const Index& index, const synth::Layout& layout,
                                                         uint64_t align) {
  const ArenaLayout arena = restore_arena_layout(index, align);
  std::map<std::string, uint64_t> at;
  size_t i = 0;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) at[p.name + "/" + l.path] = arena.offsets[i++];
  std::vector<uint64_t> out;
  for (const synth::SynthLeaf& l : layout.leaves) {
    auto it = at.find(l.name());
    if (it == at.end()) return {};
    out.push_back(it->second);
  }
  return {out, arena.bytes};
}

Destinations make_destinations(const synth::Layout& layout, std::vector<uint64_t> offsets, uint64_t size,
                               uint64_t align) {
  Destinations d;
  if (offsets.empty()) {
    size = 0;
    for (size_t i = 0; i < layout.leaves.size(); ++i) {
      size = (size + 63) / 64 * 64;
      offsets.push_back(size);
      size += layout.leaves[i].bytes;
    }
  }
  d.offsets = offsets;
  constexpr uint64_t kHuge = 2ull << 20;
  d.arena = Buffer::allocate(std::max<uint64_t>(size, 1), std::max<uint64_t>(align, kHuge));
#ifdef MADV_HUGEPAGE
  if (size >= kHuge) ::madvise(d.arena.data(), (size + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
#endif
  for (uint64_t off : offsets) d.data.push_back(d.arena.data() + off);
  const auto t0 = Clock::now();
  std::memset(d.arena.data(), 0xA5, size);
  d.first_touch_seconds = since(t0);
  return d;
}

// Restores `step` into `dst` (every leaf) and compares it with the generator.
void restore_into(CheckpointManager& m, int64_t step, const synth::Layout& layout, uint64_t seed,
                  Destinations& dst, Run& run) {
  for (size_t i = 0; i < layout.leaves.size(); ++i)  // poison: a missed byte cannot pass
    std::memset(dst.data[i], 0xA5, layout.leaves[i].bytes);
  RestoreOptions o;
  for (size_t i = 0; i < layout.leaves.size(); ++i)
    o.into.push_back({layout.leaves[i].prefix, layout.leaves[i].path, dst.data[i], layout.leaves[i].bytes});
  const auto t0 = Clock::now();
  auto r = m.restore(step, o);
  run.restore_seconds = since(t0);
  run.restore_started_monotonic = std::chrono::duration<double>(t0.time_since_epoch()).count();
  if (!r.ok()) {
    run.error = r.status().to_string();
    return;
  }
  run.restore_index_seconds = r->stats.index_seconds;
  run.restore_plan_seconds = r->stats.plan_seconds;
  run.restore_read_seconds = r->stats.read_seconds;
  std::vector<const std::byte*> data(dst.data.begin(), dst.data.end());
  auto bad = synth::compare(layout, seed, std::vector<uint64_t>(layout.leaves.size(), 0), data);
  if (bad) {
    run.error = "restore into caller buffers: leaf " + layout.leaves[bad->leaf].name() +
                " differs from the generator at byte " + std::to_string(bad->byte);
    return;
  }
  run.verified = true;
}

// Where bench/run-all is: $CKPTIO_RUN_ALL, else the source tree this file was
// compiled from, else ../../bench/run-all beside the binary (build*/bin/ckptio).
std::string find_run_all() {
  if (const char* env = std::getenv("CKPTIO_RUN_ALL"); env && *env) return env;
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  const fs::path src(__FILE__);  // .../tools/cli/bench.cc
  if (src.is_absolute()) candidates.push_back(src.parent_path().parent_path().parent_path() / "bench" / "run-all");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path().parent_path() / "bench" / "run-all");
  for (const fs::path& c : candidates)
    if (::access(c.c_str(), X_OK) == 0) return c.string();
  return "";
}

int run_compare(const BenchCmd& o) {
  const std::optional<std::string> dir = local_path(o.compare);
  if (!dir) fail(kExitUsage, "--compare takes a local directory, not " + o.compare);
  std::error_code ec;
  if (!std::filesystem::is_directory(*dir, ec)) fail(kExitNotFound, "--compare " + *dir + ": no such directory");
  const std::string script = find_run_all();
  if (script.empty())
    fail(kExitFailed,
         "--compare needs bench/run-all from ckptio's source tree (not found beside the binary or the "
         "sources it was built from); set CKPTIO_RUN_ALL=/path/to/ckptio/bench/run-all");
  std::error_code ec2;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec2).string();
  std::vector<std::string> args = {script, "--compare", *dir};
  if (!ec2) args.insert(args.end(), {"--ckptio", exe});
  if (o.bytes_given) args.insert(args.end(), {"--bytes", o.bytes});
  if (o.repeat_given) args.insert(args.end(), {"--repeat", std::to_string(o.repeat)});
  if (o.leaves_given) args.insert(args.end(), {"--leaves", std::to_string(o.leaves)});
  if (o.json) args.insert(args.end(), {"--json", "-"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execv(script.c_str(), argv.data());
  fail(kExitFailed, "cannot run " + script + ": " + std::strerror(errno));
}

// The timed restores of run_bench's saved steps, into warm buffers and into
// fresh memory, each from a cold page cache where it can be dropped; each
// step is removed after. Returns the first-touch rate of fresh memory.
// The destination arena is allocated (and its pages touched) once, after
// every timed save, so it never counts in a save's RSS.
double time_restores(CheckpointManager& m, const BenchCmd& o, const std::string& uri, const synth::Layout& layout,
                     const synth::State& state, uint64_t rss_limit, const std::function<void(int64_t)>& forget_step,
                     std::vector<Run>* runs, std::string* cache_note) {
  const uint64_t align = std::max<uint64_t>(m.storage().read_alignment(), 1);
  std::optional<Destinations> dst;
  for (Run& run : *runs) {
    auto index = m.read_index(run.step);
    if (!index.ok()) fail_status(index.status(), "read step " + std::to_string(run.step));
    auto [offsets, size] = arena_offsets(*index, layout, align);
    if (!dst || offsets.empty() || dst->offsets != offsets) {
      dst.reset();
      Progress p("allocating restore destinations", 0);
      dst = make_destinations(layout, std::move(offsets), size, align);
    }
    // The memcpy baseline: the state into warm memory, one thread, the
    // median of three (this machine is shared; one copy can be slowed by a
    // neighbour several-fold).
    std::vector<double> copies;
    for (int k = 0; k < 3; ++k) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < layout.leaves.size(); ++i)
        std::memcpy(dst->data[i], state.data[i], layout.leaves[i].bytes);
      copies.push_back(since(t0));
    }
    run.memcpy_seconds = median(copies);

    *cache_note = drop_page_cache(uri, o.no_drop);
    run.cold_cache = cache_note->empty();
    {
      Progress p("restoring step " + std::to_string(run.step) + " into warm buffers", 0);
      restore_into(m, run.step, layout, o.seed, *dst, run);
    }
    run.restore_gbps = gbps(run.bytes, run.restore_seconds);
    if (run.verified && !o.no_fresh) {
      *cache_note = drop_page_cache(uri, o.no_drop);
      run.cold_cache = run.cold_cache && cache_note->empty();
      const CheckOutcome c = check_synth_step(m, run.step);
      run.restore_fresh_seconds = c.restore_seconds;
      run.restore_fresh_gbps = gbps(c.bytes, c.restore_seconds);
      run.verified = c.verified;
      run.error = c.error;
      ::malloc_trim(0);  // hand the restored leaves' memory back before the next save
    }
    forget_step(run.step);
    if (!o.json) {
      std::printf("  run step %lld: save %s (%s, save() blocked %.1f ms, memcpy %.1f ms), peak RSS %s "
                  "(limit %s); restore into warm buffers %s (%s), into fresh memory %s (%s)%s, %s\n",
                  static_cast<long long>(run.step), format_seconds(run.save_seconds).c_str(),
                  format_gbps(run.bytes, run.save_seconds).c_str(), run.stall_ms, run.memcpy_seconds * 1e3,
                  format_bytes(run.peak_rss).c_str(), format_bytes(rss_limit).c_str(),
                  format_seconds(run.restore_seconds).c_str(),
                  format_gbps(run.bytes, run.restore_seconds).c_str(),
                  format_seconds(run.restore_fresh_seconds).c_str(),
                  format_gbps(run.bytes, run.restore_fresh_seconds).c_str(),
                  run.cold_cache ? ", cold cache" : ", warm cache",
                  run.verified ? "verified" : "NOT VERIFIED");
      std::fflush(stdout);
    }
  }
  return dst ? gbps(dst->arena.size(), dst->first_touch_seconds) : 0;
}

// What run_bench measured, as JSON (--json) or a summary line.
struct BenchSetup {
  const std::string& uri;
  const synth::Layout& layout;
  uint64_t staging_budget = 0;
  uint64_t rss_limit = 0;
  double gen_seconds = 0;
  double first_touch_gbps = 0;
  const std::string& cache_note;  // why the page cache was not dropped, if it was not
};

int report_bench(const BenchCmd& o, const BenchSetup& setup, const std::vector<Run>& runs,
                 const std::vector<Run>& warmups) {
  auto med = [&](double Run::*f) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(r.*f);
    return median(v);
  };
  std::vector<double> rss, stall_ratio;
  bool verified = true, cold = true, rss_ok = true;
  std::string error;
  for (const Run& r : runs) {
    rss.push_back(static_cast<double>(r.peak_rss));
    stall_ratio.push_back(r.memcpy_seconds > 0 ? r.stall_ms / 1e3 / r.memcpy_seconds : 0);
    verified = verified && r.verified;
    cold = cold && r.cold_cache;
    rss_ok = rss_ok && r.peak_rss <= setup.rss_limit;
    if (error.empty()) error = r.error;
  }
  const uint64_t bytes = runs.front().bytes;
  const double memcpy_ms = med(&Run::memcpy_seconds) * 1e3;
  if (o.json) {
    nlohmann::json runs_json = nlohmann::json::array(), warm_json = nlohmann::json::array();
    for (const Run& r : runs) runs_json.push_back(run_json(r));
    for (const Run& w : warmups)
      warm_json.push_back({{"step", w.step},
                           {"stall_ms", round_to(w.stall_ms, 3)},
                           {"save_gbps", round_to(w.save_gbps, 4)},
                           {"peak_rss_bytes", w.peak_rss}});
    nlohmann::json out = {{"uri", setup.uri},
                          {"bytes", bytes},
                          {"leaves", setup.layout.leaves.size()},
                          {"staging", o.staging},
                          {"staging_budget_bytes", setup.staging_budget},
                          {"repeat", o.repeat},
                          {"save_gbps", round_to(med(&Run::save_gbps), 4)},
                          {"restore_gbps", round_to(med(&Run::restore_gbps), 4)},
                          {"restore_phases_seconds", {{"index", round_to(med(&Run::restore_index_seconds), 4)},
                                                      {"plan", round_to(med(&Run::restore_plan_seconds), 4)},
                                                      {"read", round_to(med(&Run::restore_read_seconds), 4)}}},
                          {"restore_fresh_gbps", round_to(med(&Run::restore_fresh_gbps), 4)},
                          {"stall_ms", round_to(med(&Run::stall_ms), 3)},
                          {"memcpy_ms", round_to(memcpy_ms, 3)},
                          {"stall_vs_memcpy", round_to(median(stall_ratio), 3)},
                          {"first_touch_gbps", round_to(setup.first_touch_gbps, 4)},
                          {"peak_rss_bytes", static_cast<uint64_t>(median(rss))},
                          {"rss_limit_bytes", setup.rss_limit},
                          {"rss_ok", rss_ok},
                          {"verified", verified},
                          {"cold_cache", cold},
                          {"generate_seconds", round_to(setup.gen_seconds, 4)},
                          {"warmup", std::move(warm_json)},
                          {"runs", std::move(runs_json)}};
    if (!cold) out["cold_cache_note"] = setup.cache_note;
    if (!error.empty()) out["error"] = error;
    std::printf("%s\n", json_text(out).c_str());
  } else {
    std::printf("%s: save %.2f GB/s, save() stall %.1f ms (%.2f x one memcpy of %.1f ms), peak RSS %s "
                "(limit %s: %s); restore %.2f GB/s into warm buffers, %.2f GB/s into fresh memory "
                "(first touch of fresh memory here: %.2f GB/s); %s\n",
                o.repeat > 1 ? "median" : "result", med(&Run::save_gbps), med(&Run::stall_ms),
                median(stall_ratio), memcpy_ms, format_bytes(static_cast<uint64_t>(median(rss))).c_str(),
                format_bytes(setup.rss_limit).c_str(), rss_ok ? "ok" : "EXCEEDED", med(&Run::restore_gbps),
                med(&Run::restore_fresh_gbps), setup.first_touch_gbps, verified ? "verified" : "NOT VERIFIED");
    if (!cold) std::printf("note: page cache not dropped before restore (%s)\n", setup.cache_note.c_str());
  }
  if (!verified) fail(kExitFailed, error);
  return kExitOk;
}

int run_bench(const GlobalOptions& g, const BenchCmd& o) {
  if (!o.compare.empty()) return run_compare(o);
  const uint64_t target = size_arg(o.bytes, "--bytes");
  if (o.repeat < 1) fail(kExitUsage, "--repeat must be >= 1");
  if (o.warmup < 0) fail(kExitUsage, "--warmup must be >= 0");
  if (o.leaves < 1 || o.leaves > synth::kMaxLeaves)
    fail(kExitUsage, "--leaves must be in [1, " + std::to_string(synth::kMaxLeaves) + "]");
  const synth::Layout layout = synth::make_layout(target, o.leaves);
  const bool copy = o.staging != "borrow";
  // The state, copy mode's pool, a restore destination and a fresh restore.
  require_memory(layout.total_bytes * (copy ? 4 : 3), "the synthetic state, staging and two restores");
  std::string uri = o.uri;
  std::string temp;
  if (uri.empty()) uri = temp = make_temp_dir();

  ManagerOptions mo = manager_options(g);
  mo.staging = copy ? StagingMode::kCopy : StagingMode::kBorrow;
  if (copy && g.staging_budget.empty()) {
    // A pool that holds the whole state: save() then costs one copy and never
    // waits for the disk (the stall target assumes it).
    const uint64_t chunk = mo.chunk_size ? mo.chunk_size : (8ull << 20);
    mo.staging_budget = std::max(mo.staging_budget, (layout.total_bytes + chunk - 1) / chunk * chunk);
  }
  auto m = open_manager(g, uri, Access::kWrite, mo);
  const uint64_t rss_limit = layout.total_bytes + mo.staging_budget + kRssSlack;

  // Saved steps and a temporary directory go away however we leave.
  struct Cleanup {
    CheckpointManager* m;
    std::vector<int64_t> steps;
    std::string dir;
    ~Cleanup() {
      (void)m->wait_until_finished();
      for (int64_t s : steps) (void)m->remove_step(s);
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{m.get(), {}, temp};

  auto dirs = m->list_step_dirs();
  if (!dirs.ok()) fail_status(dirs.status(), "list " + uri);
  int64_t next_step = 1;
  for (const StepInfo& s : *dirs) next_step = std::max(next_step, s.step + 1);

  auto t0 = Clock::now();
  synth::State state;
  {
    Progress p("generating", layout.total_bytes);
    state = synth::generate(layout, o.seed);
  }
  const double gen_seconds = since(t0);
  if (!o.json)
    std::printf("bench: %s in %zu leaves at %s, %s staging (budget %s), %d warm-up save%s, %d run%s "
                "(generated in %s)\n",
                format_bytes(layout.total_bytes).c_str(), layout.leaves.size(), uri.c_str(),
                o.staging.c_str(), format_bytes(mo.staging_budget).c_str(), o.warmup,
                o.warmup == 1 ? "" : "s", o.repeat, o.repeat == 1 ? "" : "s",
                format_seconds(gen_seconds).c_str());

  SaveOptions so;
  so.metadata_json = synth_metadata_json(o.seed, target, o.leaves, layout.total_bytes);
  auto save_one = [&](Run& run) {
    run.step = next_step++;
    reset_peak_rss();
    Progress p("saving step " + std::to_string(run.step), layout.total_bytes);
    std::vector<LeafView> views = state.views();  // the caller's to build, not the stall's
    t0 = Clock::now();
    auto h = m->save(run.step, std::move(views), so);  // taken, not copied
    run.stall_ms = since(t0) * 1e3;
    if (!h.ok()) fail_status(h.status(), "save step " + std::to_string(run.step));
    p.watch([h = *h] { return h.progress().written; }, [h = *h] { return h.progress().total; });
    cleanup.steps.push_back(run.step);
    Status st = h->wait();
    run.peak_rss = peak_rss_bytes();
    if (!st.ok()) fail_status(st);
    const SaveStats stats = h->stats();
    run.bytes = stats.bytes;
    run.save_seconds = stats.total_seconds > 0 ? stats.total_seconds : since(t0);
    run.save_gbps = gbps(run.bytes, run.save_seconds);
  };
  auto forget_step = [&](int64_t step) {
    Status rm = m->remove_step(step);
    if (rm.ok()) cleanup.steps.erase(std::find(cleanup.steps.begin(), cleanup.steps.end(), step));
  };

  std::vector<Run> warmups(o.warmup);
  for (Run& w : warmups) {
    save_one(w);
    forget_step(w.step);
    if (!o.json)
      std::printf("  warm-up save: %s (%s, save() blocked %.1f ms), peak RSS %s\n",
                  format_seconds(w.save_seconds).c_str(), format_gbps(w.bytes, w.save_seconds).c_str(),
                  w.stall_ms, format_bytes(w.peak_rss).c_str());
  }
  std::vector<Run> runs(o.repeat);
  for (Run& run : runs) save_one(run);

  std::string cache_note;
  const double first_touch_gbps =
      time_restores(*m, o, uri, layout, state, rss_limit, forget_step, &runs, &cache_note);
  const BenchSetup setup{uri, layout, mo.staging_budget, rss_limit, gen_seconds, first_touch_gbps, cache_note};
  return report_bench(o, setup, runs, warmups);
}

}  // namespace

void add_bench(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<BenchCmd>();
  auto* sub = app.add_subcommand(
      "bench",
      "Save a synthetic state (after warm-up saves), restore it into warm buffers and into fresh "
      "memory with a cold page cache, verify; report throughput, stall, peak RSS and baselines");
  sub->add_option("--uri", o->uri,
                  "Checkpoint location (default: a new directory under $TMPDIR or /var/tmp, removed after)");
  auto* bytes_opt = sub->add_option("--bytes", o->bytes, "SIZE of the state (default 1GiB)");
  auto* leaves_opt = sub->add_option("--leaves", o->leaves, "Number of leaves (default 295)");
  sub->add_option("--seed", o->seed, "Generator seed (default 0)");
  sub->add_option("--staging", o->staging,
                  "copy (default; the staging budget defaults to the state size) or borrow")
      ->check(CLI::IsMember({"copy", "borrow"}));
  auto* repeat_opt = sub->add_option("--repeat", o->repeat, "Timed runs; medians are reported (default 1)");
  sub->add_option("--warmup", o->warmup, "Untimed saves first, reported apart (default 1)");
  sub->add_flag("--no-drop-cache", o->no_drop, "Do not drop the page cache before restoring");
  sub->add_flag("--no-fresh-restore", o->no_fresh, "Skip the restore into fresh memory");
  sub->add_flag("--json", o->json,
                "Print {save_gbps, restore_gbps (warm buffers), restore_phases_seconds {index, plan, read} "
                "(medians of the warm restore's phases), restore_fresh_gbps, stall_ms, memcpy_ms, "
                "stall_vs_memcpy, peak_rss_bytes (during save), rss_limit_bytes, rss_ok, verified, bytes, "
                "cold_cache, warmup: [...], runs: [...]}");
  sub->add_option("--compare", o->compare,
                  "Instead: run the local contenders of bench/run-all (fio's best, this ckptio, zarr-python, "
                  "numpy.save) in a new directory under PATH and print the comparison (--bytes, default 2GiB "
                  "there; --repeat, default 3; --leaves; --json). Needs ckptio's source tree (bench/run-all, or "
                  "$CKPTIO_RUN_ALL), python3 with numpy, zarr and numcodecs, fio, and root for cold-cache reads")
      ->type_name("PATH");
  sub->callback([o, &g, run, bytes_opt, repeat_opt, leaves_opt] {
    o->bytes_given = bytes_opt->count() > 0;
    o->repeat_given = repeat_opt->count() > 0;
    o->leaves_given = leaves_opt->count() > 0;
    *run = [o, &g] { return run_bench(g, *o); };
  });
}

}  // namespace ckptio::cli
