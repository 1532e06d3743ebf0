// `ckptio verify URI [--step N | --all]`: reads every byte of a step and
// checks every checksum (CheckpointManager::verify).
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "tools/cli/cli.h"

namespace ckptio::cli {
namespace {

struct VerifyOptions {
  std::string uri;
  std::optional<int64_t> step;
  bool all = false;
  bool json = false;
};

int run_verify(const GlobalOptions& g, const VerifyOptions& o) {
  auto m = open_manager(g, o.uri, Access::kRead);
  std::vector<int64_t> steps;
  if (o.step) {
    // A step that is there but damaged is reported as the others are (in
    // the JSON too); only one that is not there fails here (exit 3).
    auto index = m->read_index(*o.step);
    if (!index.ok() && index.status().code() == Code::kNotFound)
      fail_status(index.status(), "step " + std::to_string(*o.step), kExitNotFound);
    steps.push_back(*o.step);
  } else {
    // Every committed step, including those whose index is damaged (which
    // all_steps() and restore-latest skip with a warning): verify reports
    // damage, it never skips it. Without --all, the newest of them.
    steps = committed_or_damaged_steps(*m, o.uri);
    if (!o.all) steps.erase(steps.begin(), steps.end() - 1);
  }

  nlohmann::json results = nlohmann::json::array();
  std::string first_error;
  for (int64_t step : steps) {
    uint64_t bytes = 0;
    auto index = m->read_index(step);
    if (index.ok()) bytes = index->total_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = index.ok() ? Status::OK() : index.status();
    {
      // The bytes checked so far, from verify's progress hook (called on
      // this thread; the line's thread reads them).
      std::atomic<uint64_t> checked{0};
      Progress progress("verifying step " + std::to_string(step), bytes);
      progress.watch([&checked] { return checked.load(std::memory_order_relaxed); });
      if (st.ok())
        st = m->verify(step, [&checked](uint64_t done, uint64_t) { checked.store(done, std::memory_order_relaxed); });
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nlohmann::json r = {{"step", step}, {"ok", st.ok()}, {"bytes", bytes},
                        {"seconds", round_to(secs, 4)}};
    if (!st.ok()) r["error"] = st.to_string();
    results.push_back(r);
    if (!st.ok() && first_error.empty()) first_error = st.to_string();
    if (o.json) continue;
    if (st.ok())
      std::printf("step %lld: ok, %s in %s (%s)\n", static_cast<long long>(step),
                  format_bytes(bytes).c_str(), format_seconds(secs).c_str(),
                  format_gbps(bytes, secs).c_str());
    else
      std::printf("step %lld: FAILED: %s\n", static_cast<long long>(step), terminal_text(st.to_string()).c_str());
    std::fflush(stdout);
  }
  if (o.json) std::printf("%s\n", json_text(o.all ? results : results[0]).c_str());
  if (!first_error.empty()) fail(kExitFailed, first_error);
  return kExitOk;
}

}  // namespace

void add_verify(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<VerifyOptions>();
  auto* sub = app.add_subcommand(
      "verify", "Read every byte of a step and check every checksum (exit 1 on damage)");
  sub->add_option("URI", o->uri, "Checkpoint location")->required();
  auto* step = sub->add_option("--step", o->step,
                                "Step to verify (default: the newest committed step, also when its "
                                "index is damaged)")
                  ->check(non_negative());
  sub->add_flag("--all", o->all, "Verify every committed step")->excludes(step);
  sub->add_flag("--json", o->json, "Print {step, ok, bytes, seconds, error} (an array with --all)");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_verify(g, *o); }; });
}

}  // namespace ckptio::cli
