// `ckptio cp SRC DST [--step N | --all] [--overwrite]`: copies committed steps
// between any two locations (local, s3://, mem://), verifying every shard and
// committing each at the destination as atomically as a save (copy_step in
// include/ckptio/copy.h).
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "tools/cli/cli.h"

namespace ckptio::cli {
namespace {

struct CpOptions {
  std::string src, dst;
  std::optional<int64_t> step;
  bool all = false;
  bool overwrite = false;
  std::string memory;  // SIZE; "" = the library default
  std::string format;  // "" = the source's layout
  int zstd_level = 1;
  bool json = false;
};

nlohmann::json step_json(const CopyStats& s) {
  return {{"step", s.step},
          {"skipped", s.skipped},
          {"bytes", s.bytes},
          {"files", s.files},
          {"shards", s.shards},
          {"bytes_in_place", s.bytes_in_place},
          {"seconds", round_to(s.seconds, 4)},
          {"gbps", round_to(gbps(s.bytes, s.seconds), 4)}};
}

void print_step(const CopyStats& s, const std::string& dst) {
  if (s.skipped) {
    std::printf("step %lld: skipped, already committed at %s with the same contents\n",
                static_cast<long long>(s.step), dst.c_str());
  } else {
    std::printf("step %lld: copied %s (%llu file%s, %llu shard%s verified) in %s (%s)\n",
                static_cast<long long>(s.step), format_bytes(s.bytes).c_str(),
                static_cast<unsigned long long>(s.files), s.files == 1 ? "" : "s",
                static_cast<unsigned long long>(s.shards), s.shards == 1 ? "" : "s",
                format_seconds(s.seconds).c_str(), format_gbps(s.bytes, s.seconds).c_str());
  }
  std::fflush(stdout);
}

std::string with_cli_hint(const Status& st) {
  std::string msg = st.message();
  const std::string api = "pass overwrite";
  if (size_t at = msg.find(api); at != std::string::npos) msg.replace(at, api.size(), "pass --overwrite");
  return msg;
}

int run_cp(const GlobalOptions& g, const CpOptions& o) {
  CopyOptions co;
  co.src_step_format = co.dst_step_format = g.step_format;
  co.overwrite = o.overwrite;
  co.format = o.format;
  co.zstd_level = o.zstd_level;
  if (!g.chunk_size.empty()) co.chunk_size = positive_size_arg(g.chunk_size, "--chunk-size");
  if (!o.memory.empty()) co.max_memory = positive_size_arg(o.memory, "--memory");
  auto src = open_storage_at(g, o.src, Access::kRead);
  auto dst = open_storage_at(g, o.dst, Access::kWrite);

  // The progress line of the step being copied; cleared before each
  // per-step line goes to stdout.
  std::atomic<uint64_t> done{0};
  std::optional<Progress> progress;
  int64_t progress_step = -1;
  co.on_progress = [&](int64_t step, uint64_t bytes, uint64_t total) {
    done = bytes;
    if (progress && progress_step == step) return;
    progress.reset();
    progress_step = step;
    progress.emplace("copying step " + std::to_string(step), total, [&done] { return done.load(); });
  };
  std::vector<CopyStats> finished;
  co.on_step = [&](const CopyStats& s) {
    progress.reset();
    progress_step = -1;
    finished.push_back(s);
    if (!o.json) print_step(s, o.dst);
  };

  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  if (o.all) st = copy_all_steps(*src, *dst, co).status();
  else st = copy_step(*src, *dst, o.step, co).status();
  progress.reset();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  uint64_t bytes = 0;
  size_t copied = 0, skipped = 0;
  for (const CopyStats& s : finished) {
    bytes += s.bytes;
    (s.skipped ? skipped : copied) += 1;
  }
  if (o.json) {
    nlohmann::json steps = nlohmann::json::array();
    for (const CopyStats& s : finished) steps.push_back(step_json(s));
    nlohmann::json out = {{"src", o.src},           {"dst", o.dst},
                          {"ok", st.ok()},          {"steps", std::move(steps)},
                          {"copied", copied},       {"skipped", skipped},
                          {"bytes", bytes},         {"seconds", round_to(secs, 4)},
                          {"gbps", round_to(gbps(bytes, secs), 4)}};
    if (!st.ok()) out["error"] = st.to_string();
    std::printf("%s\n", json_text(out).c_str());
  } else if (o.all && st.ok()) {
    std::printf("copied %zu step%s (%s) and skipped %zu from %s to %s in %s (%s)\n", copied,
                copied == 1 ? "" : "s", format_bytes(bytes).c_str(), skipped, o.src.c_str(),
                o.dst.c_str(), format_seconds(secs).c_str(), format_gbps(bytes, secs).c_str());
  }
  // NotFound can only mean the source step or a location: copy_step reports
  // a data file missing under a committed index as data loss.
  if (!st.ok()) fail(exit_code_for(st), with_cli_hint(st));
  return kExitOk;
}

}  // namespace

void add_cp(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto o = std::make_shared<CpOptions>();
  auto* sub = app.add_subcommand(
      "cp", "Copy committed steps between locations (local, s3://, mem://), verifying every "
            "checksum; each step commits at DST as atomically as a save");
  sub->add_option("SRC", o->src, "Location to copy from")->required();
  sub->add_option("DST", o->dst, "Location to copy to (a local directory is created if missing)")
      ->required();
  auto* step = sub->add_option("--step", o->step, "Step to copy (default: the latest committed)")
                   ->check(non_negative());
  sub->add_flag("--all", o->all,
                "Copy every committed step, oldest first; steps already at DST with the same "
                "contents are skipped; a step at DST with other contents stops the copy before "
                "anything is written, unless --overwrite")
      ->excludes(step);
  sub->add_flag("--overwrite", o->overwrite,
                "Replace steps committed at DST (atomically; on object stores the replaced data "
                "objects are left for gc, but a step in eformer's layout there is removed before "
                "the new one is written: docs/format.md section 7)");
  sub->add_option("--memory", o->memory,
                  "SIZE bound on the copy's buffers (default 256MiB; must hold two chunks, "
                  "--chunk-size rounded up to DST's write unit, e.g. the S3 part size)");
  sub->add_option("--format", o->format,
                  "Layout at DST: ckptio, or eformer (zarr v2 as eformer / TensorStore write it); "
                  "default: the source's. Another layout decodes and re-encodes every leaf, bit-exact")
      ->check(CLI::IsMember({"ckptio", "eformer"}));
  sub->add_option("--zstd-level", o->zstd_level, "zstd level of the chunks --format eformer writes (default 1)");
  sub->add_flag("--json", o->json,
                "Print {src, dst, ok, steps: [{step, skipped, bytes, files, shards, seconds, "
                "gbps}], copied, skipped, bytes, seconds, gbps, error}");
  sub->footer(
      "Every shard's crc32c is checked as its bytes pass; damage at SRC fails the copy naming "
      "the leaf, and nothing is committed at DST. A failed copy leaves DST's committed steps as "
      "they were. A copied step keeps its index (times, metadata); only the data file names "
      "change. --step-format applies to both ends; --chunk-size sets the request size.");
  sub->callback([o, &g, run] { *run = [o, &g] { return run_cp(g, *o); }; });
}

}  // namespace ckptio::cli
