// A deterministic synthetic training state: a transformer-like leaf set of a
// requested size and leaf count, whose every byte can be recomputed on its own.
//
// Contract of generator "splitmix64-v1" (stored in the index metadata of
// `ckptio synth save`; bump the name if any of this changes):
//   key(seed, prefix, path, version) =
//       mix(fnv1a64(prefix + "/" + path) ^ mix(seed + G) ^ mix(version * G2))
//   word(key, w) = mix(key + (w + 1) * G)           (splitmix64's w+1-th output)
//   byte b of a leaf = byte (b % 8) of word(key, b / 8), little endian
// where mix is splitmix64's finalizer, G = 0x9E3779B97F4A7C15 and
// G2 = 0xD1B54A32D192ED03. So the content depends only on (seed, prefix,
// path, version, byte offset): any byte can be checked without the others.
//
// Layout "transformer-v1" (make_layout): under prefix "model" the parameters
//   params.embed.embedding [V, d] bfloat16
//   params.layers.{i}.attn.{q,k,v,o}_proj.kernel [d, d] bfloat16
//   params.layers.{i}.mlp.up.kernel [d, 4d], mlp.down.kernel [4d, d] bfloat16
//   params.layers.{i}.{attn,mlp}_norm.scale [d] float32
//   params.final_norm.scale [d] float32
// and under prefix "tx" the optimizer state: opt_state.count [] int32 and
// opt_state.{mu,nu}.<param path without "params."> float32 mirroring the
// parameters. The leaf count is exactly the one asked for; d (and then V) are
// chosen so that the total is the largest not above the requested bytes (a
// few bytes over only when even d = 0 is: the scalar count is 4 bytes).
//
// Pure functions, no I/O: the CLI, tests and benchmarks share them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/types.h"

namespace ckptio::synth {

inline constexpr const char* kGenerator = "splitmix64-v1";
inline constexpr const char* kLayoutName = "transformer-v1";
inline constexpr uint64_t kDefaultLeaves = 295;  // 12 layers
inline constexpr uint64_t kMaxLeaves = 10'000'000;

struct SynthLeaf {
  std::string prefix;
  std::string path;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t bytes = 0;
  std::string name() const { return prefix + "/" + path; }
};

struct Layout {
  int64_t d = 0;       // model width
  int64_t vocab = 0;   // embedding rows
  int64_t layers = 0;  // transformer blocks (some may be partial)
  uint64_t total_bytes = 0;
  std::vector<SynthLeaf> leaves;  // in save order: "model" first, then "tx"
};

// `num_leaves` >= 1 (0 is treated as 1).
Layout make_layout(uint64_t target_bytes, uint64_t num_leaves);

uint64_t splitmix64_mix(uint64_t z);
uint64_t fnv1a64(std::string_view s, uint64_t h = 0xcbf29ce484222325ull);
uint64_t leaf_key(uint64_t seed, std::string_view prefix, std::string_view path,
                  uint64_t version = 0);

// Writes bytes [byte_offset, byte_offset + n) of the leaf keyed `key`.
void fill(uint64_t key, uint64_t byte_offset, std::byte* dst, size_t n);

// The first byte in [byte_offset, byte_offset + n) where `data` differs from
// the generator, as an offset from the leaf's start; nullopt when equal.
std::optional<uint64_t> find_mismatch(uint64_t key, uint64_t byte_offset, const std::byte* data,
                                      size_t n);

// A whole synthetic state in one owned host allocation (one arena, so that
// transparent huge pages cover it: first-touch page faults of 4 KiB pages cost
// ~20 us each on some VMs, more than generating the bytes).
struct State {
  Layout layout;
  uint64_t seed = 0;
  std::vector<uint64_t> versions;  // per leaf; 0 for a plain synth state
  Buffer arena;
  std::vector<std::byte*> data;    // leaf i's bytes, inside `arena`
  std::vector<LeafView> views() const;
  // Regenerates leaf i at `version` (the demo's "training step").
  void update_leaf(size_t i, uint64_t version);
};

// Allocates and fills every leaf, on `threads` threads (0: hardware).
State generate(Layout layout, uint64_t seed, unsigned threads = 0);

// Runs fn(task) for task in [0, n) on up to `threads` threads (0: hardware).
void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& fn);

// A byte mismatch found by compare(): leaf index into the layout, byte offset.
struct Mismatch {
  size_t leaf = 0;
  uint64_t byte = 0;
};

// Compares `data[i]` (leaf i's bytes, layout order, `sizes[i]` bytes each)
// with the generator; returns the first mismatch in layout order.
std::optional<Mismatch> compare(const Layout& layout, uint64_t seed,
                                const std::vector<uint64_t>& versions,
                                const std::vector<const std::byte*>& data, unsigned threads = 0);

}  // namespace ckptio::synth
