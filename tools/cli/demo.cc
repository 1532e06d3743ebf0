// `ckptio demo [URI]`: a simulated training loop that saves asynchronously,
// then a simulated restart that finds the latest step, restores it and
// checks it bit for bit.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "tools/cli/cli.h"
#include "tools/cli/synth.h"

namespace ckptio::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct DemoCmd {
  std::string uri;
  int steps = 12;
  int save_every = 3;
  int keep = 2;
  std::string bytes = "256MiB";
  uint64_t leaves = synth::kDefaultLeaves;
  uint64_t seed = 0;
  int train_ms = 60;
  int update_leaves = 4;
  std::string staging = "copy";
  bool keep_dir = false;
  bool no_prepare = false;  // skip prepare_staging (to see the first save without it)
};

// "Training": reads a leaf over and over until `until` (a stand-in for the
// forward and backward passes; it touches memory like they would).
uint64_t compute_until(const synth::State& s, size_t leaf, Clock::time_point until) {
  uint64_t acc = 0;
  const std::byte* p = s.data[leaf];
  const size_t n = std::min<uint64_t>(s.layout.leaves[leaf].bytes, 4u << 20) / 8;
  do {
    for (size_t i = 0; i < n; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      acc = acc * 0x100000001b3ull + w;
    }
    if (n == 0) acc += 1;
  } while (Clock::now() < until);
  return acc;
}

std::string make_temp_dir(const char* stem) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + stem + ".XXXXXX";
  if (!::mkdtemp(tmpl.data())) fail_status(Status::from_errno(errno, tmpl), "create a temporary directory");
  return tmpl;
}

// One function of ~170 lines on purpose: it reads top to bottom as the story
// the demo tells (the training job, the restart, the summary; sections
// marked below), and its parts share the output lock and the job's figures.
int run_demo(const GlobalOptions& g, const DemoCmd& o) {
  const uint64_t target = size_arg(o.bytes, "--bytes");
  if (o.steps < 1 || o.save_every < 1 || o.keep < 0 || o.leaves < 1 || o.update_leaves < 0)
    fail(kExitUsage, "--steps, --save-every and --leaves must be >= 1, --keep >= 0");
  const synth::Layout layout = synth::make_layout(target, o.leaves);
  require_memory(layout.total_bytes, "the synthetic state");
  std::string uri = o.uri;
  bool temp = false;
  if (uri.empty()) {
    uri = make_temp_dir("ckptio-demo");
    temp = true;
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup{temp && !o.keep_dir ? uri : ""};

  std::mutex out_mu;  // stdout is shared with the commit callbacks
  auto say = [&](const char* fmt, auto... args) {
    std::lock_guard lock(out_mu);
    std::printf(fmt, args...);
    std::fflush(stdout);
  };

  // ---- The training job -------------------------------------------------------
  struct Committed {
    int64_t step;
    SaveStats stats;
  };
  std::vector<Committed> committed;
  std::string save_error;
  ManagerOptions mo = manager_options(g);
  mo.max_to_keep = o.keep;
  mo.staging = o.staging == "borrow" ? StagingMode::kBorrow : StagingMode::kCopy;
  mo.on_commit = [&](const CommitEvent& e) {
    std::lock_guard lock(out_mu);
    if (e.status.ok()) {
      committed.push_back({e.step, e.stats});
      std::printf("  step %lld committed in %.2f s (%s)\n", static_cast<long long>(e.step),
                  e.stats.total_seconds, format_gbps(e.stats.bytes, e.stats.total_seconds).c_str());
    } else {
      if (save_error.empty()) save_error = e.status.to_string();
      std::printf("  step %lld FAILED: %s\n", static_cast<long long>(e.step), e.status.to_string().c_str());
    }
    std::fflush(stdout);
  };
  auto m = open_manager(g, uri, Access::kWrite, mo);
  auto latest = m->latest_step();
  if (!latest.ok()) fail_status(latest.status(), "find the latest step at " + uri);
  const int64_t first = latest->has_value() ? **latest + 1 : 1;

  say("demo: %s of synthetic state in %zu leaves at %s; %d steps, a save every %d, keep %d, "
      "%s staging\n",
      format_bytes(layout.total_bytes).c_str(), layout.leaves.size(), uri.c_str(), o.steps,
      o.save_every, o.keep, o.staging.c_str());
  if (latest->has_value())
    say("  %s already holds step %lld: continuing from step %lld\n", uri.c_str(),
        static_cast<long long>(**latest), static_cast<long long>(first));
  synth::State state = synth::generate(layout, o.seed);
  if (mo.staging == StagingMode::kCopy && !o.no_prepare) {
    // A trainer's setup: fault the copy buffers in now, not in the first save.
    const auto p0 = Clock::now();
    Status prepared = m->prepare_staging(layout.total_bytes);
    if (!prepared.ok()) fail_status(prepared, "prepare the staging buffers");
    say("setup: prepare_staging faulted in %s of copy buffers in %.0f ms, before the loop\n",
        format_bytes(layout.total_bytes).c_str(), since(p0) * 1e3);
  }

  double blocked = 0;
  std::vector<double> save_blocks;  // per save: save() plus waiting for the last borrow
  uint64_t sink = 0;
  std::optional<SaveHandle> last;
  std::vector<int64_t> saved;
  const auto loop_start = Clock::now();
  for (int t = 1; t <= o.steps; ++t) {
    const int64_t step = first + t - 1;
    const auto t0 = Clock::now();
    // Borrow mode: the engine may still read our buffers; wait before
    // changing them (that wait is time the loop is blocked by the save).
    double waited = 0;
    if (last && !last->released()) {
      const auto w0 = Clock::now();
      last->wait_released();
      waited = since(w0);
    }
    for (int i = 0; i < o.update_leaves && !layout.leaves.empty(); ++i)
      state.update_leaf((static_cast<size_t>(t) * o.update_leaves + i) % layout.leaves.size(), step);
    const size_t hot = static_cast<size_t>(t) % std::max<size_t>(1, layout.leaves.size());
    if (!layout.leaves.empty())
      sink += compute_until(state, hot, t0 + std::chrono::milliseconds(o.train_ms) +
                                            std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(waited)));
    const double train = since(t0) - waited;
    if (t % o.save_every != 0) {
      if (waited >= 1e-3)
        say("step %lld: trained %.0f ms, blocked %.0f ms until the last save released its "
            "borrowed buffers\n", static_cast<long long>(step), train * 1e3, waited * 1e3);
      else
        say("step %lld: trained %.0f ms\n", static_cast<long long>(step), train * 1e3);
      blocked += waited;
      continue;
    }
    std::vector<std::pair<std::string, uint64_t>> versions;
    for (size_t i = 0; i < layout.leaves.size(); ++i)
      if (state.versions[i]) versions.emplace_back(layout.leaves[i].name(), state.versions[i]);
    SaveOptions so;
    so.metadata_json = synth_metadata_json(o.seed, target, o.leaves, layout.total_bytes, versions);
    so.overwrite = true;
    const auto s0 = Clock::now();
    auto h = m->save(step, state.views(), so);
    const double stall = since(s0);
    if (!h.ok()) fail_status(h.status(), "save step " + std::to_string(step));
    blocked += waited + stall;
    save_blocks.push_back(waited + stall);
    last = *h;
    saved.push_back(step);
    say("step %lld: trained %.0f ms, save() blocked %.0f ms%s\n", static_cast<long long>(step),
        train * 1e3, (stall + waited) * 1e3, waited >= 1e-3 ? " (incl. waiting for the last borrow)" : "");
  }
  const double loop_seconds = since(loop_start);
  Status st = m->wait_until_finished();
  const double drain_seconds = since(loop_start) - loop_seconds;
  m.reset();
  if (!st.ok()) fail_status(st, "saving");
  if (!save_error.empty()) fail(kExitFailed, save_error);

  // ---- The restart ------------------------------------------------------------
  say("restart: a new CheckpointManager on %s\n", uri.c_str());
  auto m2 = open_manager(g, uri, Access::kRead);
  auto steps = m2->all_steps();
  if (!steps.ok()) fail_status(steps.status(), "list steps");
  auto found = m2->latest_step();
  if (!found.ok()) fail_status(found.status(), "find the latest step");
  if (!found->has_value()) fail(kExitNotFound, "no committed step at " + uri + " after the run");
  std::string kept;
  for (int64_t s : *steps) kept += (kept.empty() ? "" : ", ") + std::to_string(s);
  say("  committed steps: %s; latest %lld\n", kept.c_str(), static_cast<long long>(**found));
  if (!saved.empty() && **found != saved.back())
    fail(kExitFailed, "latest step is " + std::to_string(**found) + ", the run saved " +
                          std::to_string(saved.back()) + " last");
  const CheckOutcome c = check_synth_step(*m2, **found);
  if (!c.verified) fail(kExitFailed, "restored step is not what was saved: " + c.error);
  say("  restored step %lld: %s in %s (%s), bit-exact against what was saved\n",
      static_cast<long long>(c.step), format_bytes(c.bytes).c_str(),
      format_seconds(c.restore_seconds).c_str(), format_gbps(c.bytes, c.restore_seconds).c_str());

  // ---- Summary ----------------------------------------------------------------
  uint64_t bytes = 0;
  double save_seconds = 0;
  for (const Committed& e : committed) bytes += e.stats.bytes, save_seconds += e.stats.total_seconds;
  say("summary:\n");
  say("  steps run            %d in %.2f s (+%.2f s waiting for the last save)\n", o.steps,
      loop_seconds, drain_seconds);
  say("  steps saved          %zu, %s in total\n", committed.size(), format_bytes(bytes).c_str());
  say("  save throughput      %s (bytes / time from save() to commit)\n",
      format_gbps(bytes, save_seconds).c_str());
  say("  loop blocked by save %.0f ms in total, %.0f ms per save, %.1f%% of the loop\n",
      blocked * 1e3, saved.empty() ? 0.0 : blocked * 1e3 / saved.size(),
      loop_seconds > 0 ? 100 * blocked / loop_seconds : 0.0);
  if (save_blocks.size() > 1) {
    std::vector<double> rest(save_blocks.begin() + 1, save_blocks.end());
    std::sort(rest.begin(), rest.end());
    say("                       first save %.0f ms, later saves %.0f ms (median)\n",
        save_blocks.front() * 1e3, rest[rest.size() / 2] * 1e3);
  }
  say("  restore throughput   %s\n", format_gbps(c.bytes, c.restore_seconds).c_str());
  if (temp && o.keep_dir) say("  checkpoints kept in  %s\n", uri.c_str());
  if (sink == 42) say(" ");  // keep the "training" from being optimised away
  return kExitOk;
}

}  // namespace

void add_demo(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<DemoCmd>();
  auto* sub = app.add_subcommand(
      "demo", "Simulated training loop with asynchronous saves, then a simulated restart");
  sub->add_option("URI", o->uri, "Checkpoint location (default: a new temporary directory, removed at the end)");
  sub->add_option("--steps", o->steps, "Training steps (default 12)");
  sub->add_option("--save-every", o->save_every, "Save every N steps (default 3)");
  sub->add_option("--keep", o->keep, "max_to_keep for retention (default 2; 0 keeps all)");
  sub->add_option("--bytes", o->bytes, "SIZE of the training state (default 256MiB)");
  sub->add_option("--leaves", o->leaves, "Number of leaves (default 295)");
  sub->add_option("--seed", o->seed, "Generator seed (default 0)");
  sub->add_option("--train-ms", o->train_ms, "CPU time per training step (default 60)");
  sub->add_option("--staging", o->staging, "copy (default) or borrow")
      ->check(CLI::IsMember({"copy", "borrow"}));
  sub->add_flag("--keep-dir", o->keep_dir, "Keep the temporary directory");
  sub->add_flag("--no-prepare-staging", o->no_prepare,
                "Copy staging: skip prepare_staging at setup (the first save then faults its buffers in)");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_demo(g, *o); }; });
}

}  // namespace ckptio::cli
