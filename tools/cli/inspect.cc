// `ckptio inspect URI [--step N] [--json]`: the leaves of a committed step.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "tools/cli/cli.h"

namespace ckptio::cli {
namespace {

struct InspectOptions {
  std::string uri;
  std::optional<int64_t> step;
  bool json = false;
};

nlohmann::json metadata_value(const std::string& text) {
  auto v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? nlohmann::json(text) : v;
}

int run_inspect(const GlobalOptions& g, const InspectOptions& o) {
  auto m = open_manager(g, o.uri, Access::kRead);
  const Index index = resolve_index(*m, o.uri, o.step);
  size_t num_leaves = 0;
  for (const PrefixRecord& p : index.prefixes) num_leaves += p.leaves.size();

  if (o.json) {
    nlohmann::json leaves = nlohmann::json::array();
    for (const PrefixRecord& p : index.prefixes)
      for (const LeafRecord& l : p.leaves)
        leaves.push_back({{"prefix", p.name},
                          {"path", l.path},
                          {"dtype", std::string(dtype_name(l.dtype))},
                          {"shape", l.shape},
                          {"bytes", l.num_bytes()},
                          {"shards", l.shards.size()}});
    nlohmann::json files = nlohmann::json::array();
    for (const DataFileRecord& f : index.files) files.push_back({{"name", f.name}, {"bytes", f.size}});
    nlohmann::json out = {{"step", index.step},
                          {"layout", index.layout},
                          {"path", join_uri(o.uri, step_dir_name(g, index.step))},
                          {"bytes", index.total_bytes()},
                          {"created_at", iso_time_or_null(index.created_unix_ns)},
                          {"committed_at", iso_time_or_null(index.committed_unix_ns)},
                          {"metadata", metadata_value(index.metadata_json)},
                          {"files", std::move(files)},
                          {"leaves", std::move(leaves)}};
    std::printf("%s\n", json_text(out).c_str());
    return kExitOk;
  }

  std::printf("step %lld at %s%s\n", static_cast<long long>(index.step),
              join_uri(o.uri, step_dir_name(g, index.step)).c_str(),
              index.layout == "ckptio" ? "" : (" (" + index.layout + " layout: zarr v2 chunks, no checksums)").c_str());
  std::printf("committed %s (%s after save() was called)\n",
              format_time_local(index.committed_unix_ns).c_str(),
              format_seconds((index.committed_unix_ns - index.created_unix_ns) / 1e9).c_str());
  std::printf("%s in %zu leaves, %zu prefixes, %zu data file%s\n",
              format_bytes(index.total_bytes()).c_str(), num_leaves, index.prefixes.size(),
              index.files.size(), index.files.size() == 1 ? "" : "s");
  std::printf("metadata %s\n\n", json_text(metadata_value(index.metadata_json), -1).c_str());
  std::vector<std::vector<std::string>> rows = {{"PREFIX", "PATH", "DTYPE", "SHAPE", "BYTES", "SHARDS"}};
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves)
      rows.push_back({p.name, l.path, std::string(dtype_name(l.dtype)), shape_to_string(l.shape),
                      format_bytes(l.num_bytes()), std::to_string(l.shards.size())});
  std::fputs(format_table(rows, {false, false, false, false, true, true}).c_str(), stdout);
  return kExitOk;
}

}  // namespace

void add_inspect(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand("inspect", "Show the leaves of a committed step");
  sub->add_option("URI", o->uri, "Checkpoint location")->required();
  sub->add_option("--step", o->step, "Step to show (default: the latest committed)")->check(non_negative());
  sub->add_flag("--json", o->json,
                "Print {step, bytes, metadata, files, leaves: [{prefix, path, dtype, shape, "
                "bytes, shards}]}");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_inspect(g, *o); }; });
}

}  // namespace ckptio::cli
