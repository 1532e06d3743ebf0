// `ckptio ls URI [--json]`: every step directory, committed or not.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "tools/cli/cli.h"

namespace ckptio::cli {
namespace {

struct LsOptions {
  std::string uri;
  bool json = false;
};

// committed | temporary (a save in progress or a dead attempt) | deleting |
// incomplete (final name, no index) | damaged (index does not parse)
std::string state_of(CheckpointManager& m, const StepInfo& s, std::string* why) {
  if (s.committed) return "committed";
  if (s.name.find(".tmp-") != std::string::npos) return "temporary";
  if (s.name.find(".del-") != std::string::npos) return "deleting";
  auto index = m.read_index(s.step);
  if (index.ok() || index.status().code() == Code::kNotFound) return "incomplete";
  *why = index.status().to_string();
  return "damaged";
}

int run_ls(const GlobalOptions& g, const LsOptions& o) {
  auto m = open_manager(g, o.uri, Access::kRead);
  auto dirs = m->list_step_dirs();
  if (!dirs.ok()) fail_status(dirs.status(), "list " + o.uri);

  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const StepInfo& s : *dirs) {
      std::string why;
      nlohmann::json e = {{"step", s.step},
                          {"name", s.name},
                          {"committed", s.committed},
                          {"state", state_of(*m, s, &why)},
                          {"bytes", s.bytes},
                          {"path", join_uri(o.uri, s.name)}};
      if (s.committed) {
        e["committed_at"] = iso_time_or_null(s.committed_unix_ns);
        e["committed_unix_ns"] = s.committed_unix_ns;
        e["layout"] = s.layout;
      }
      if (!why.empty()) e["error"] = why;
      out.push_back(std::move(e));
    }
    std::printf("%s\n", json_text(out).c_str());
    return kExitOk;
  }

  if (dirs->empty()) {
    std::printf("no step directories at %s\n", o.uri.c_str());
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"STEP", "STATE", "BYTES", "COMMITTED", "NAME"}};
  uint64_t total = 0;
  size_t committed = 0;
  for (const StepInfo& s : *dirs) {
    std::string why;
    rows.push_back({std::to_string(s.step), state_of(*m, s, &why), format_bytes(s.bytes),
                    s.committed ? format_time_local(s.committed_unix_ns) : "-", s.name});
    total += s.bytes;
    committed += s.committed;
  }
  std::fputs(format_table(rows, {true, false, true, false, false}).c_str(), stdout);
  std::printf("%zu director%s, %zu committed, %s\n", dirs->size(), dirs->size() == 1 ? "y" : "ies",
              committed, format_bytes(total).c_str());
  return kExitOk;
}

}  // namespace

void add_ls(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<LsOptions>();
  auto* sub = app.add_subcommand("ls", "List every step directory, committed or not, with sizes (names per --step-format)");
  sub->add_option("URI", o->uri, "Checkpoint location")->required();
  sub->add_flag("--json", o->json,
                "Print a JSON array of {step, name, committed, state, bytes, path, committed_at}");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_ls(g, *o); }; });
}

}  // namespace ckptio::cli
