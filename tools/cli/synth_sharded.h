// `ckptio synth save|check` with --mesh, --rules and --processes: the same
// synthetic state laid out over a device mesh by eformer-style partition
// rules, saved by N forked processes (each a host owning a contiguous block
// of the mesh's devices, as JAX assigns them) and restored into any other
// mesh, rules and process count, every device buffer checked against the
// generator.
#pragma once

#include <cstdint>
#include <string>

#include "tools/cli/cli.h"

namespace ckptio::cli {

struct ShardingArgs {
  std::string mesh;    // "dp=2,tp=4"; "" with processes > 1: "dp=<processes>"
  std::string rules;   // a JSON file of [regex, spec] pairs; "": shard dim 0 over every axis
  int processes = 1;
  double barrier_timeout = 600;
  bool any() const { return !mesh.empty() || !rules.empty() || processes != 1; }
};

struct ShardedSaveArgs {
  std::string uri;
  int64_t step = 0;
  uint64_t target_bytes = 0;
  uint64_t leaves = 0;
  uint64_t seed = 0;
  bool borrow = false;
  bool overwrite = false;
  bool json = false;
  uint32_t row_band_ways = SaveOptions{}.row_band_ways;
};

struct ShardedCheckArgs {
  std::string uri;
  std::optional<int64_t> step;
  std::string coalesce_gap;  // SIZE; "": the backend's default
  bool json = false;
  bool verify_whole_shards = false;  // RestoreOptions::verify_widen_max_bytes = UINT64_MAX
  bool prefault = true;              // RestoreOptions::prefault
};

int run_sharded_save(const GlobalOptions& g, const ShardingArgs& s, const ShardedSaveArgs& a);
int run_sharded_check(const GlobalOptions& g, const ShardingArgs& s, const ShardedCheckArgs& a);

}  // namespace ckptio::cli
