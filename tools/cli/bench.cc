// `ckptio bench`: save a synthetic state, drop the page cache, restore it and
// check every byte; report throughput, the save() stall and peak memory.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tools/cli/cli.h"
#include "tools/cli/synth.h"

namespace ckptio::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct BenchCmd {
  std::string uri;
  std::string bytes = "1GiB";
  uint64_t leaves = synth::kDefaultLeaves;
  uint64_t seed = 0;
  std::string staging = "copy";
  int repeat = 1;
  bool json = false;
  bool no_drop = false;
};

struct Run {
  int64_t step = 0;
  uint64_t bytes = 0;
  double stall_ms = 0;
  double save_seconds = 0;
  double save_gbps = 0;
  double restore_seconds = 0;
  double restore_gbps = 0;
  uint64_t peak_rss = 0;
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
                      {"restore_seconds", round_to(r.restore_seconds, 4)},
                      {"restore_gbps", round_to(r.restore_gbps, 4)},
                      {"peak_rss_bytes", r.peak_rss},
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

int run_bench(const GlobalOptions& g, const BenchCmd& o) {
  const uint64_t target = size_arg(o.bytes, "--bytes");
  if (o.repeat < 1) fail(kExitUsage, "--repeat must be >= 1");
  if (o.leaves < 1 || o.leaves > synth::kMaxLeaves)
    fail(kExitUsage, "--leaves must be in [1, " + std::to_string(synth::kMaxLeaves) + "]");
  const synth::Layout layout = synth::make_layout(target, o.leaves);
  require_memory(layout.total_bytes, "the synthetic state");
  std::string uri = o.uri;
  std::string temp;
  if (uri.empty()) uri = temp = make_temp_dir();

  ManagerOptions mo = manager_options(g);
  mo.staging = o.staging == "borrow" ? StagingMode::kBorrow : StagingMode::kCopy;
  auto m = open_manager(g, uri, Access::kWrite, mo);

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
  int64_t base = 1;
  for (const StepInfo& s : *dirs) base = std::max(base, s.step + 1);

  auto t0 = Clock::now();
  synth::State state;
  {
    Progress p("generating", layout.total_bytes);
    state = synth::generate(layout, o.seed);
  }
  const double gen_seconds = since(t0);
  if (!o.json)
    std::printf("bench: %s in %zu leaves at %s, %s staging, %d run%s (generated in %s)\n",
                format_bytes(layout.total_bytes).c_str(), layout.leaves.size(), uri.c_str(),
                o.staging.c_str(), o.repeat, o.repeat == 1 ? "" : "s",
                format_seconds(gen_seconds).c_str());

  SaveOptions so;
  so.metadata_json = synth_metadata_json(o.seed, target, o.leaves, layout.total_bytes);
  std::vector<Run> runs;
  std::string cache_note;
  for (int r = 0; r < o.repeat; ++r) {
    Run run;
    run.step = base + r;
    const std::string dir = step_dir_name(g, run.step);
    reset_peak_rss();
    {
      Storage& storage = m->storage();
      Progress p("saving step " + std::to_string(run.step), layout.total_bytes,
                 [&storage, dir] { return bytes_in_flight(storage, dir); });
      t0 = Clock::now();
      auto h = m->save(run.step, state.views(), so);
      run.stall_ms = since(t0) * 1e3;
      if (!h.ok()) fail_status(h.status(), "save step " + std::to_string(run.step));
      cleanup.steps.push_back(run.step);
      Status st = h->wait();
      if (!st.ok()) fail_status(st);
      const SaveStats stats = h->stats();
      run.bytes = stats.bytes;
      run.save_seconds = stats.total_seconds > 0 ? stats.total_seconds : since(t0);
      run.save_gbps = gbps(run.bytes, run.save_seconds);
    }
    cache_note = drop_page_cache(uri, o.no_drop);
    run.cold_cache = cache_note.empty();
    const CheckOutcome c = check_synth_step(*m, run.step);
    run.restore_seconds = c.restore_seconds;
    run.restore_gbps = gbps(c.bytes, c.restore_seconds);
    run.verified = c.verified;
    run.error = c.error;
    run.peak_rss = peak_rss_bytes();
    Status rm = m->remove_step(run.step);
    if (rm.ok()) cleanup.steps.pop_back();
    runs.push_back(run);
    if (!o.json) {
      std::printf("  run %d: save %s (%s, save() blocked %.1f ms), restore %s (%s%s), %s, peak RSS %s\n",
                  r + 1, format_seconds(run.save_seconds).c_str(),
                  format_gbps(run.bytes, run.save_seconds).c_str(), run.stall_ms,
                  format_seconds(run.restore_seconds).c_str(),
                  format_gbps(c.bytes, run.restore_seconds).c_str(),
                  run.cold_cache ? ", cold cache" : ", warm cache",
                  run.verified ? "verified" : "NOT VERIFIED", format_bytes(run.peak_rss).c_str());
      std::fflush(stdout);
    }
  }

  auto med = [&](double Run::*f) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(r.*f);
    return median(v);
  };
  std::vector<double> rss;
  for (const Run& r : runs) rss.push_back(static_cast<double>(r.peak_rss));
  bool verified = true, cold = true;
  std::string error;
  for (const Run& r : runs) {
    verified = verified && r.verified;
    cold = cold && r.cold_cache;
    if (error.empty()) error = r.error;
  }
  const uint64_t bytes = runs.front().bytes;
  if (o.json) {
    nlohmann::json runs_json = nlohmann::json::array();
    for (const Run& r : runs) runs_json.push_back(run_json(r));
    nlohmann::json out = {{"uri", uri},
                          {"bytes", bytes},
                          {"leaves", layout.leaves.size()},
                          {"staging", o.staging},
                          {"repeat", o.repeat},
                          {"save_gbps", round_to(med(&Run::save_gbps), 4)},
                          {"restore_gbps", round_to(med(&Run::restore_gbps), 4)},
                          {"stall_ms", round_to(med(&Run::stall_ms), 3)},
                          {"peak_rss_bytes", static_cast<uint64_t>(median(rss))},
                          {"verified", verified},
                          {"cold_cache", cold},
                          {"generate_seconds", round_to(gen_seconds, 4)},
                          {"runs", std::move(runs_json)}};
    if (!cold) out["cold_cache_note"] = cache_note;
    if (!error.empty()) out["error"] = error;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("%s: save %.2f GB/s, restore %.2f GB/s, save() stall %.1f ms, peak RSS %s, %s\n",
                o.repeat > 1 ? "median" : "result", med(&Run::save_gbps), med(&Run::restore_gbps),
                med(&Run::stall_ms), format_bytes(static_cast<uint64_t>(median(rss))).c_str(),
                verified ? "verified" : "NOT VERIFIED");
    if (!cold) std::printf("note: page cache not dropped before restore (%s)\n", cache_note.c_str());
  }
  if (!verified) fail(kExitFailed, error);
  return kExitOk;
}

}  // namespace

void add_bench(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<BenchCmd>();
  auto* sub = app.add_subcommand(
      "bench", "Save, drop the page cache, restore and verify a synthetic state; report throughput");
  sub->add_option("--uri", o->uri,
                  "Checkpoint location (default: a new directory under $TMPDIR or /var/tmp, removed after)");
  sub->add_option("--bytes", o->bytes, "SIZE of the state (default 1GiB)");
  sub->add_option("--leaves", o->leaves, "Number of leaves (default 295)");
  sub->add_option("--seed", o->seed, "Generator seed (default 0)");
  sub->add_option("--staging", o->staging, "copy (default) or borrow")
      ->check(CLI::IsMember({"copy", "borrow"}));
  sub->add_option("--repeat", o->repeat, "Runs; medians are reported (default 1)");
  sub->add_flag("--no-drop-cache", o->no_drop, "Do not drop the page cache before restoring");
  sub->add_flag("--json", o->json,
                "Print {save_gbps, restore_gbps, stall_ms, peak_rss_bytes, verified, bytes, "
                "cold_cache, runs: [...]}");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_bench(g, *o); }; });
}

}  // namespace ckptio::cli
