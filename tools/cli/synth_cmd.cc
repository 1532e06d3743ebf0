// `ckptio synth save|check`: write a deterministic synthetic training state
// (tools/cli/synth.h), and restore one and compare every byte with the
// generator.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>

#include "tools/cli/cli.h"
#include "tools/cli/synth.h"
#include "tools/cli/synth_sharded.h"

namespace ckptio::cli {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

// ---- What the "synth" metadata says -----------------------------------------

SynthMeta parse_synth_meta(const std::string& metadata_json, int64_t step) {
  const std::string where = "step " + std::to_string(step);
  auto j = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("synth") || !j["synth"].is_object())
    fail(kExitFailed, where + " has no \"synth\" metadata (it was not written by ckptio synth save)");
  const auto& s = j["synth"];
  auto field = [&](const char* key) -> uint64_t {
    if (!s.contains(key) || !s[key].is_number_unsigned())
      fail(kExitFailed, where + ": synth metadata lacks an unsigned \"" + std::string(key) + "\"");
    return s[key].get<uint64_t>();
  };
  if (s.value("generator", std::string()) != synth::kGenerator)
    fail(kExitFailed, where + ": unknown synth generator '" + s.value("generator", std::string()) +
                          "' (this ckptio knows " + synth::kGenerator + ")");
  SynthMeta m;
  m.seed = field("seed");
  m.bytes = field("bytes");
  m.leaves = field("leaves");
  if (s.contains("versions") && s["versions"].is_object())
    for (const auto& [k, v] : s["versions"].items())
      if (v.is_number_unsigned()) m.versions[k] = v.get<uint64_t>();
  return m;
}

std::string compare_leaf_set(const synth::Layout& layout, const Index& index) {
  std::map<std::string, const LeafRecord*> saved;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) saved[p.name + "/" + l.path] = &l;
  for (const synth::SynthLeaf& e : layout.leaves) {
    auto it = saved.find(e.name());
    if (it == saved.end()) return "leaf " + e.name() + " is missing";
    if (it->second->dtype != e.dtype)
      return "leaf " + e.name() + " has dtype " + std::string(dtype_name(it->second->dtype)) +
             ", the generator makes " + std::string(dtype_name(e.dtype));
    if (it->second->shape != e.shape)
      return "leaf " + e.name() + " has shape " + shape_to_string(it->second->shape) +
             ", the generator makes " + shape_to_string(e.shape);
    saved.erase(it);
  }
  if (!saved.empty())
    return "unexpected leaf " + saved.begin()->first + " (" + std::to_string(saved.size()) +
           " leaves beyond the generator's " + std::to_string(layout.leaves.size()) + ")";
  return "";
}

namespace {

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view(".^$|()[]{}*+?\\").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string hex_bytes(const std::byte* p, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = 0; i < n; ++i) {
    s += hex[static_cast<unsigned>(p[i]) >> 4];
    s += hex[static_cast<unsigned>(p[i]) & 15];
  }
  return s;
}

// A group of consecutive layout leaves restored together.
struct Batch {
  size_t begin = 0, end = 0;
  bool everything = false;
};

std::vector<Batch> plan_batches(const synth::Layout& layout, uint64_t batch_bytes) {
  const uint64_t avail = mem_available_bytes();
  // Restore holds the whole batch; keep well inside what is free.
  const uint64_t limit = batch_bytes ? batch_bytes : avail ? avail / 2 : UINT64_MAX;
  if (layout.total_bytes <= limit) return {Batch{0, layout.leaves.size(), true}};
  std::vector<Batch> out;
  const uint64_t budget = std::max<uint64_t>(limit, 1);
  for (size_t i = 0; i < layout.leaves.size();) {
    Batch b{i, i + 1, false};
    uint64_t bytes = layout.leaves[i].bytes;
    while (b.end < layout.leaves.size() && b.end - b.begin < 64 &&
           layout.leaves[b.end].prefix == layout.leaves[i].prefix &&
           bytes + layout.leaves[b.end].bytes <= budget)
      bytes += layout.leaves[b.end++].bytes;
    out.push_back(b);
    i = b.end;
  }
  return out;
}

RestoreOptions batch_options(const synth::Layout& layout, const Batch& b, bool verify) {
  RestoreOptions o;
  o.verify = verify;
  if (b.everything) return o;
  o.select.prefixes = {layout.leaves[b.begin].prefix};
  std::string re = "^(?:";
  for (size_t i = b.begin; i < b.end; ++i)
    re += (i == b.begin ? "" : "|") + regex_escape(layout.leaves[i].path);
  o.select.path_regex = re + ")$";
  return o;
}

// Compares a restored batch with the generator; "" when exact.
std::string compare_batch(const synth::Layout& layout, const SynthMeta& meta, const Batch& b,
                          const RestoredState& r, int64_t step) {
  std::map<std::string, const Tensor*> got;
  for (const Tensor& t : r.leaves) got[t.prefix + "/" + t.path] = &t;
  synth::Layout sub;
  std::vector<uint64_t> versions;
  std::vector<const std::byte*> data;
  for (size_t i = b.begin; i < b.end; ++i) {
    const synth::SynthLeaf& e = layout.leaves[i];
    auto it = got.find(e.name());
    if (it == got.end()) return "leaf " + e.name() + " was not restored";
    if (it->second->data.size() != e.bytes)
      return "leaf " + e.name() + " restored " + std::to_string(it->second->data.size()) +
             " bytes, expected " + std::to_string(e.bytes);
    sub.leaves.push_back(e);
    auto v = meta.versions.find(e.name());
    versions.push_back(v == meta.versions.end() ? 0 : v->second);
    data.push_back(it->second->data.data());
  }
  auto bad = synth::compare(sub, meta.seed, versions, data);
  if (!bad) return "";
  const synth::SynthLeaf& e = sub.leaves[bad->leaf];
  const size_t item = dtype_size(e.dtype);
  const uint64_t elem = bad->byte / item;
  std::byte expect[16];
  const uint64_t at = elem * item;
  synth::fill(synth::leaf_key(meta.seed, e.prefix, e.path, versions[bad->leaf]), at, expect, item);
  return "step " + std::to_string(step) + ": leaf " + e.name() + " differs from the generator at element " +
         std::to_string(elem) + " (byte " + std::to_string(bad->byte) + " of " +
         std::to_string(e.bytes) + "): expected " + hex_bytes(expect, item) + ", found " +
         hex_bytes(data[bad->leaf] + at, item);
}

}  // namespace

std::string synth_metadata_json(uint64_t seed, uint64_t target_bytes, uint64_t leaves,
                                uint64_t total_bytes,
                                const std::vector<std::pair<std::string, uint64_t>>& versions) {
  nlohmann::json s = {{"seed", seed},
                      {"bytes", target_bytes},
                      {"leaves", leaves},
                      {"generator", synth::kGenerator},
                      {"layout", synth::kLayoutName},
                      {"total_bytes", total_bytes}};
  if (!versions.empty()) {
    nlohmann::json v = nlohmann::json::object();
    for (const auto& [name, version] : versions)
      if (version != 0) v[name] = version;
    s["versions"] = std::move(v);
  }
  return nlohmann::json{{"synth", std::move(s)}}.dump();
}

CheckOutcome check_synth_step(CheckpointManager& m, int64_t step, bool show_progress,
                              uint64_t batch_bytes, bool prefault) {
  CheckOutcome out;
  out.step = step;
  auto index = m.read_index(step);
  if (!index.ok()) {
    out.error = index.status().to_string();
    out.damaged = index.status().data_loss();
    return out;
  }
  const SynthMeta meta = parse_synth_meta(index->metadata_json, step);
  const synth::Layout layout = synth::make_layout(meta.bytes, meta.leaves);
  out.bytes = layout.total_bytes;
  out.leaves = layout.leaves.size();
  if (std::string e = compare_leaf_set(layout, *index); !e.empty()) {
    out.error = "step " + std::to_string(step) + ": " + e;
    return out;
  }
  std::optional<Progress> progress;
  // Bytes restored so far, from the restore's progress hook (called on this
  // thread; the line's thread reads them).
  std::atomic<uint64_t> restored{0};
  uint64_t before = 0;  // of the batches done
  double compare_seconds = 0;  // with the generator, between the batches' restores
  if (show_progress) {
    progress.emplace("restoring step " + std::to_string(step), layout.total_bytes);
    progress->watch([&restored] { return restored.load(std::memory_order_relaxed); });
  }
  for (const Batch& b : plan_batches(layout, batch_bytes)) {
    const auto t0 = Clock::now();
    RestoreOptions ro = batch_options(layout, b, /*verify=*/true);
    ro.prefault = prefault;
    if (progress)
      ro.on_progress = [&restored, before](uint64_t done, uint64_t) {
        restored.store(before + done, std::memory_order_relaxed);
      };
    auto r = m.restore(step, ro);
    if (r.ok()) before += r->stats.bytes_needed;
    out.restore_seconds += since(t0);
    out.ready_monotonic_s =
        std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - compare_seconds;
    if (!r.ok()) {
      out.error = r.status().to_string();
      out.damaged = r.status().data_loss();
      if (r.status().data_loss()) {
        // A checksum failed: read again without checksums to name the element.
        auto raw = m.restore(step, batch_options(layout, b, /*verify=*/false));
        if (raw.ok())
          if (std::string e = compare_batch(layout, meta, b, *raw, step); !e.empty())
            out.error += "; " + e;
      }
      return out;
    }
    if (progress) progress->set_label("comparing step " + std::to_string(step));
    const auto c0 = Clock::now();
    if (std::string e = compare_batch(layout, meta, b, *r, step); !e.empty()) {
      out.error = e;
      return out;
    }
    compare_seconds += since(c0);
    if (progress) progress->set_label("restoring step " + std::to_string(step));
  }
  out.verified = true;
  return out;
}

namespace {

// ---- synth save -------------------------------------------------------------

struct SaveCmd {
  std::string uri;
  int64_t step = 0;
  std::string bytes;
  uint64_t leaves = synth::kDefaultLeaves;
  uint64_t seed = 0;
  std::string staging = "copy";
  bool overwrite = false;
  bool json = false;
  uint32_t row_band_ways = SaveOptions{}.row_band_ways;
  ShardingArgs sharding;
};

int run_save(const GlobalOptions& g, const SaveCmd& o) {
  const uint64_t target = size_arg(o.bytes, "--bytes");
  if (o.sharding.any())
    return run_sharded_save(g, o.sharding,
                            ShardedSaveArgs{o.uri, o.step, target, o.leaves, o.seed, o.staging == "borrow",
                                            o.overwrite, o.json, o.row_band_ways});
  if (o.leaves < 1 || o.leaves > synth::kMaxLeaves)
    fail(kExitUsage, "--leaves must be in [1, " + std::to_string(synth::kMaxLeaves) + "]");
  ManagerOptions mo = manager_options(g);
  mo.staging = o.staging == "borrow" ? StagingMode::kBorrow : StagingMode::kCopy;
  const synth::Layout layout = synth::make_layout(target, o.leaves);
  require_memory(layout.total_bytes, "the synthetic state");
  auto m = open_manager(g, o.uri, Access::kWrite, mo);
  const std::string dir = step_dir_name(g, o.step);
  if (!o.overwrite && m->read_index(o.step).ok())
    fail(kExitFailed, "step " + std::to_string(o.step) + " is already committed at " +
                          join_uri(o.uri, dir) + " (pass --overwrite to replace it)");

  const uint64_t total = layout.total_bytes;
  auto t0 = Clock::now();
  synth::State state;
  {
    Progress p("generating", total);
    state = synth::generate(layout, o.seed);
  }
  const double gen_seconds = since(t0);

  SaveOptions so;
  so.metadata_json = synth_metadata_json(o.seed, target, o.leaves, total);
  so.overwrite = o.overwrite;
  so.row_band_ways = o.row_band_ways;
  SaveStats stats;
  {
    Progress p("saving step " + std::to_string(o.step), total);
    t0 = Clock::now();
    auto h = m->save(o.step, state.views(), so);
    const double stall = since(t0);
    if (!h.ok()) fail_status(h.status(), "save step " + std::to_string(o.step));
    p.watch([h = *h] { return h.progress().written; }, [h = *h] { return h.progress().total; });
    Status st = h->wait();
    if (!st.ok()) fail_status(st);
    stats = h->stats();
    if (stats.stall_seconds <= 0) stats.stall_seconds = stall;
  }

  if (o.json) {
    nlohmann::json out = {{"step", o.step},
                          {"path", join_uri(o.uri, dir)},
                          {"bytes", stats.bytes},
                          {"leaves", layout.leaves.size()},
                          {"seed", o.seed},
                          {"staging", o.staging},
                          {"stall_ms", round_to(stats.stall_seconds * 1e3, 3)},
                          {"save_seconds", round_to(stats.total_seconds, 4)},
                          {"save_gbps", round_to(gbps(stats.bytes, stats.total_seconds), 4)},
                          {"write_seconds", round_to(stats.write_seconds, 4)},
                          {"commit_seconds", round_to(stats.commit_seconds, 4)},
                          {"generate_seconds", round_to(gen_seconds, 4)}};
    std::printf("%s\n", json_text(out).c_str());
  } else {
    std::printf("saved step %lld to %s: %s in %zu leaves (d=%lld, vocab=%lld, %lld layers)\n",
                static_cast<long long>(o.step), join_uri(o.uri, dir).c_str(),
                format_bytes(stats.bytes).c_str(), layout.leaves.size(),
                static_cast<long long>(layout.d), static_cast<long long>(layout.vocab),
                static_cast<long long>(layout.layers));
    std::printf("  save() blocked %s; committed %s after the call (%s); generated in %s (%s)\n",
                format_seconds(stats.stall_seconds).c_str(),
                format_seconds(stats.total_seconds).c_str(),
                format_gbps(stats.bytes, stats.total_seconds).c_str(),
                format_seconds(gen_seconds).c_str(), format_gbps(total, gen_seconds).c_str());
  }
  return kExitOk;
}

// ---- synth check ------------------------------------------------------------

struct CheckCmd {
  std::string uri;
  std::optional<int64_t> step;
  std::string batch;
  bool json = false;
  ShardingArgs sharding;
  std::string coalesce_gap;
  bool verify_whole_shards = false;
  bool no_prefault = false;
};

int run_check(const GlobalOptions& g, const CheckCmd& o) {
  const bool sharded = o.sharding.any() || !o.coalesce_gap.empty() || o.verify_whole_shards;
  // A restore into a sharding is one restore per process: --batch would be
  // ignored, and the memory it was meant to bound used anyway.
  if (sharded && !o.batch.empty())
    fail(kExitUsage, "--batch cannot be combined with --mesh, --rules, --processes, --coalesce-gap or "
                     "--verify-whole-shards");
  if (sharded)
    return run_sharded_check(
        g, o.sharding,
        ShardedCheckArgs{o.uri, o.step, o.coalesce_gap, o.json, o.verify_whole_shards, !o.no_prefault});
  const uint64_t batch = o.batch.empty() ? 0 : positive_size_arg(o.batch, "--batch");
  auto m = open_manager(g, o.uri, Access::kRead);
  // --step N checks that step. Without it, as a restarting trainer's
  // restore-latest does: the newest committed step, skipping damaged ones
  // (index or data; each printed) unless --strict.
  std::vector<int64_t> candidates;
  if (o.step) {
    candidates.push_back(resolve_index(*m, o.uri, o.step).step);
  } else {
    candidates = committed_or_damaged_steps(*m, o.uri);
    std::reverse(candidates.begin(), candidates.end());
  }
  CheckOutcome c;
  nlohmann::json skipped = nlohmann::json::array();
  std::string skipped_text;
  for (int64_t step : candidates) {
    c = check_synth_step(*m, step, /*show_progress=*/true, batch, !o.no_prefault);
    if (c.verified || !c.damaged || o.step || g.strict) break;
    skipped.push_back({{"step", step}, {"error", c.error}});
    skipped_text += (skipped_text.empty() ? "" : ", ") + std::to_string(step);
    if (!o.json)
      std::printf("step %lld: skipped, damaged: %s\n", static_cast<long long>(step),
                  terminal_text(c.error).c_str());
    std::fflush(stdout);
  }
  if (!c.verified && !skipped.empty() && skipped.size() == candidates.size()) {
    std::string all;
    for (const auto& e : skipped) all += "; step " + std::to_string(e["step"].get<int64_t>()) + ": " +
                                         e["error"].get<std::string>();
    c.error = "every committed step at " + o.uri + " is damaged" + all;
  } else if (!c.verified && !skipped.empty()) {
    c.error = "after skipping damaged step(s) " + skipped_text + ": " + c.error;
  }
  if (o.json) {
    nlohmann::json out = {{"step", c.step},
                          {"bytes", c.bytes},
                          {"leaves", c.leaves},
                          {"restore_seconds", round_to(c.restore_seconds, 4)},
                          {"restore_gbps", round_to(gbps(c.bytes, c.restore_seconds), 4)},
                          {"ready_monotonic_s", round_to(c.ready_monotonic_s, 4)},
                          {"verified", c.verified},
                          {"skipped", skipped}};
    if (!c.verified) out["error"] = c.error;
    std::printf("%s\n", json_text(out).c_str());
  } else if (c.verified) {
    std::printf("step %lld: %s in %zu leaves match the generator bit for bit; restore took %s (%s)\n",
                static_cast<long long>(c.step), format_bytes(c.bytes).c_str(), c.leaves,
                format_seconds(c.restore_seconds).c_str(),
                format_gbps(c.bytes, c.restore_seconds).c_str());
    if (!skipped.empty())
      std::printf("restored step %lld after skipping damaged step(s) %s\n", static_cast<long long>(c.step),
                  skipped_text.c_str());
  }
  if (!c.verified) fail(kExitFailed, c.error);
  return kExitOk;
}

void add_sharding_options(CLI::App* cmd, ShardingArgs& a) {
  cmd->add_option("--mesh", a.mesh,
                  "Device mesh as axis sizes by name, e.g. dp=2,tp=4 (default with --processes N: dp=N)");
  cmd->add_option("--rules", a.rules,
                  "JSON file of [regex, spec] partition rules as eformer writes them, e.g. "
                  "[[\"attn/.*kernel\", [null, \"tp\"]], [\".*\", [[\"dp\", \"tp\"]]]] "
                  "(default: dimension 0 over every mesh axis)");
  cmd->add_option("--processes", a.processes,
                  "Fork N processes, each a host owning its share of the mesh's devices (default 1)")
      ->check(CLI::Range(1, 1024));
}

}  // namespace

void add_synth(CLI::App& app, const GlobalOptions& g, Command* run) {
  auto* synth = app.add_subcommand("synth", "Write or check a deterministic synthetic training state");
  synth->require_subcommand(1);

  auto s = std::make_shared<SaveCmd>();
  auto* save = synth->add_subcommand(
      "save", "Save a transformer-like synthetic state (params under \"model\", optimizer under \"tx\")");
  save->add_option("URI", s->uri, "Checkpoint location")->required();
  save->add_option("--step", s->step, "Step number")->required()->check(non_negative());
  save->add_option("--bytes", s->bytes, "Total SIZE of the state (e.g. 2GiB)")->required();
  save->add_option("--leaves", s->leaves, "Number of leaves (default 295: 12 layers)");
  save->add_option("--seed", s->seed, "Generator seed (default 0)");
  save->add_option("--staging", s->staging, "copy (default) or borrow")
      ->check(CLI::IsMember({"copy", "borrow"}));
  save->add_flag("--overwrite", s->overwrite, "Replace a committed step");
  save->add_flag("--json", s->json, "Print the save's figures as JSON");
  add_sharding_options(save, s->sharding);
  save->add_option("--row-band-ways", s->row_band_ways,
                   "Store each sharded leaf's shards as bands of rows cut where a split of dimension 0 "
                   "over 2..N devices would cut, so that such a restore reads one range per data file "
                   "(docs/read-planning.md; default 8; 0: one piece per shard)")
      ->check(CLI::Range(0, 64));
  save->add_option("--barrier-timeout", s->sharding.barrier_timeout,
                   "Seconds the processes wait for each other before the save fails (default 600)")
      ->check(CLI::PositiveNumber);
  save->callback([s, &g, run] { *run = [s, &g] { return run_save(g, *s); }; });

  auto c = std::make_shared<CheckCmd>();
  auto* check = synth->add_subcommand(
      "check", "Restore a synth step and compare every byte with the generator (exit 1 on a difference)");
  check->add_option("URI", c->uri, "Checkpoint location")->required();
  check->add_option("--step", c->step,
                    "Step to check (default: the latest committed; damaged newer steps are skipped "
                    "and printed, as restore-latest does, unless --strict)")
      ->check(non_negative());
  check->add_option("--batch", c->batch,
                    "Restore at most SIZE at a time (default: all at once if it fits in half "
                    "of the available memory)");
  check->add_flag("--no-prefault", c->no_prefault,
                  "Leave the restored leaves' fresh memory to be faulted in by the reads themselves, "
                  "with a sharding too (RestoreOptions::prefault = false; to measure what prefaulting "
                  "is worth)");
  check->add_flag("--json", c->json,
                  "Print {step, bytes, leaves, restore_gbps, verified, skipped: [{step, error}]}; with a sharding {step, mesh, processes, "
                  "bytes_needed, bytes_read, read_ratio, requests, pieces_unverified, bytes_unverified, "
                  "restore_gbps, verified}");
  add_sharding_options(check, c->sharding);
  check->add_option("--coalesce-gap", c->coalesce_gap,
                    "Read two needed ranges at most SIZE apart as one request (default: 4KiB local, 1MiB S3)");
  check->add_flag("--verify-whole-shards", c->verify_whole_shards,
                  "With a sharding: read every saved shard that is needed in part whole, so that its "
                  "checksum is checked (by default only shards of at most 64 KiB are; the parts of larger "
                  "ones are counted in pieces_unverified / bytes_unverified)");
  check->callback([c, &g, run] { *run = [c, &g] { return run_check(g, *c); }; });
}

}  // namespace ckptio::cli
