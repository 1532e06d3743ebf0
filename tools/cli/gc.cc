// `ckptio gc URI [--keep-last N] [--keep-every K] [--min-age S]`: applies
// retention, then removes temporaries and leftovers of failed saves older
// than S seconds; prints what went away.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <set>

#include "tools/cli/cli.h"

namespace ckptio::cli {
namespace {

struct GcArgs {
  std::string uri;
  double min_age = 3600;
  int keep_last = 0;
  int64_t keep_every = 0;
  bool json = false;
};

std::vector<StepInfo> list_dirs(CheckpointManager& m, const std::string& uri) {
  auto dirs = m.list_step_dirs();
  if (!dirs.ok()) fail_status(dirs.status(), "list " + uri);
  return std::move(dirs).value();
}

int run_gc(const GlobalOptions& g, const GcArgs& o) {
  auto m = open_manager(g, o.uri, Access::kRead);
  const std::vector<StepInfo> before = list_dirs(*m, o.uri);
  Status st;
  if (o.keep_last > 0) st = m->apply_retention(o.keep_last, o.keep_every).annotate("retention");
  // gc runs whatever retention said (one step it could not delete is no
  // reason to keep every leftover); the first error is reported.
  Status collected = m->gc(GcOptions{o.min_age}).annotate("gc");
  if (st.ok()) st = collected;
  const std::vector<StepInfo> after = list_dirs(*m, o.uri);

  std::set<std::string> left;
  for (const StepInfo& s : after) left.insert(s.name);
  std::vector<const StepInfo*> removed;
  uint64_t freed = 0;
  for (const StepInfo& s : before)
    if (!left.count(s.name)) removed.push_back(&s), freed += s.bytes;
  std::vector<int64_t> kept;
  for (const StepInfo& s : after)
    if (s.committed) kept.push_back(s.step);

  if (o.json) {
    nlohmann::json r = nlohmann::json::array();
    for (const StepInfo* s : removed)
      r.push_back({{"step", s->step}, {"name", s->name}, {"committed", s->committed},
                   {"bytes", s->bytes}, {"path", join_uri(o.uri, s->name)}});
    nlohmann::json out = {{"removed", r}, {"freed_bytes", freed}, {"kept_steps", kept},
                          {"ok", st.ok()}};
    if (!st.ok()) out["error"] = st.to_string();
    std::printf("%s\n", json_text(out).c_str());
  } else {
    for (const StepInfo* s : removed)
      std::printf("removed %s (%s, %s)\n", s->name.c_str(),
                  s->committed ? ("committed step " + std::to_string(s->step)).c_str()
                               : "uncommitted",
                  format_bytes(s->bytes).c_str());
    std::string ks;
    for (int64_t k : kept) ks += (ks.empty() ? "" : ", ") + std::to_string(k);
    std::printf("removed %zu director%s (%s); %zu committed step%s left%s%s\n", removed.size(),
                removed.size() == 1 ? "y" : "ies", format_bytes(freed).c_str(), kept.size(),
                kept.size() == 1 ? "" : "s", kept.empty() ? "" : ": ", ks.c_str());
  }
  if (!st.ok()) fail_status(st);
  return kExitOk;
}

}  // namespace

void add_gc(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<GcArgs>();
  auto* sub = app.add_subcommand(
      "gc", "Apply retention, then remove temporaries and leftovers of failed saves that have not changed "
      "for --min-age seconds (a save in progress elsewhere looks like a leftover until it commits)");
  sub->add_option("URI", o->uri, "Checkpoint location")->required();
  sub->add_option("--min-age", o->min_age,
                  "Leave leftovers changed less than this many seconds ago (default 3600; 0 removes every "
                  "leftover: only when no process saves to URI)")
      ->check(CLI::NonNegativeNumber);
  auto* keep_last = sub->add_option("--keep-last", o->keep_last,
                                    "Keep the newest N committed steps, delete older ones (0: delete none)")
                        ->check(non_negative());
  // Alone it would be ignored: without --keep-last no retention runs.
  sub->add_option("--keep-every", o->keep_every,
                  "With --keep-last: also keep steps divisible by K")
      ->check(non_negative())
      ->needs(keep_last);
  sub->add_flag("--json", o->json, "Print {removed: [...], freed_bytes, kept_steps}");
  sub->callback([o, &g, run] {
    // --keep-last 0 deletes no step, so K would keep nothing more: a
    // command that looks like it prunes and does not is refused.
    if (o->keep_every > 0 && o->keep_last == 0)
      throw CLI::ValidationError("--keep-every", "needs --keep-last N with N > 0 (--keep-last 0 deletes no step)");
    *run = [o, &g] { return run_gc(g, *o); };
  });
}

}  // namespace ckptio::cli
