// The sharding model: meshes, partition specs, the box each device holds,
// and eformer-style partition rules. Pure functions, no I/O; docs/sharding.md
// explains the rules with worked examples and lists where ckptio differs from
// JAX and eformer.
//
// Everything here is a value: copyable, immutable once built, and safe to
// share between threads. Nothing throws; every failure is a Status naming
// the thing that is wrong (the axis, the dimension, the rule, the leaf, the
// JSON location). The types use only strings, integers and vectors so that a
// Python binding can mirror them one to one.
//
// The box rule, as JAX's NamedSharding.devices_indices_map computes it
// (jax/_src/sharding.py common_devices_indices_map, jax/_src/named_sharding.py
// named_sharding_to_xla_hlo_sharding, jax/_src/op_shardings.py
// op_sharding_to_numpy_indices):
//   - the mesh's devices are laid out row-major over its axes, so the device
//     at flat position p has one coordinate per axis;
//   - a dimension sharded over axes (a0, a1, ..., ak) is cut into
//     n = size(a0) * ... * size(ak) chunks, and a device takes chunk
//     c = ((coord(a0) * size(a1) + coord(a1)) * size(a2) + ...) + coord(ak):
//     the tuple is read major to minor, so ("dp", "tp") and ("tp", "dp")
//     give the same chunks to different devices;
//   - mesh axes the spec does not name replicate: devices differing only in
//     those coordinates hold the same box;
//   - a spec shorter than the rank leaves the remaining dimensions unsharded.
// Chunk c of a dimension of size D is [c * t, (c + 1) * t) with t = D / n.
// JAX requires n to divide D for every jax.Array (device_put, jit inputs and
// outputs): Sharding.shard_shape raises IndivisibleError before any box is
// computed. Uneven::kReject (the default) reproduces that as an error.
// Uneven::kPad uses XLA's tiling for uneven shapes instead
// (HloSharding::TileOffsetForDevice / TileLimitForDevice): t = ceil(D / n)
// and chunk c is [min(c * t, D), min((c + 1) * t, D)), so the last chunks are
// smaller or empty. Example, D = 10 over n = 4: t = 3, chunks [0,3) [3,6)
// [6,9) [9,10); D = 5 over n = 4: t = 2, chunks [0,2) [2,4) [4,5) [5,5) (the
// last one empty). Restoring into a sharding JAX itself could not hold (a
// 3-way split of 4096) needs kPad.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptio/index.h"
#include "ckptio/status.h"
#include "ckptio/types.h"

namespace ckptio {

// ---- Mesh ------------------------------------------------------------------

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  bool operator==(const MeshAxis&) const = default;
};

// The most devices a mesh may have; bounds what hostile input (a --mesh
// string, a rules file) can make the model allocate.
inline constexpr int64_t kMaxMeshDevices = int64_t{1} << 20;

// jax.sharding.Mesh(np.array(device_ids).reshape(sizes), names): named axes
// and the device ids laid out row-major over them (the last axis varies
// fastest). A mesh with no axes holds exactly one device. A default-constructed
// Mesh has no devices and is rejected by every function that takes one.
class Mesh {
 public:
  Mesh() = default;

  // Checks: axis names non-empty and unique; sizes >= 1; at most
  // kMaxMeshDevices devices; device_ids.size() == product of the sizes; ids
  // >= 0 and unique. kInvalidArgument naming the offending axis or id.
  static Result<Mesh> create(std::vector<MeshAxis> axes, std::vector<int64_t> device_ids);
  // The same with device ids 0 .. N-1 in mesh order.
  static Result<Mesh> create(std::vector<MeshAxis> axes);
  // From the CLI's --mesh text: "dp=2,tp=4" (spaces around items allowed),
  // devices 0 .. N-1. A name is any non-empty text without '=', ',' or
  // whitespace; a size is a decimal integer >= 1.
  static Result<Mesh> parse(std::string_view text);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  const std::vector<int64_t>& device_ids() const { return device_ids_; }
  size_t num_devices() const { return device_ids_.size(); }
  // Position of the axis called `name` in axes(), or nullopt.
  std::optional<size_t> axis_index(std::string_view name) const;
  // The coordinate along each axis of the device at flat position
  // `position` (< num_devices()).
  std::vector<int64_t> coordinates(size_t position) const;
  // "dp=2,tp=4"; "" for a mesh without axes.
  std::string to_string() const;

  bool operator==(const Mesh&) const = default;

 private:
  std::vector<MeshAxis> axes_;
  std::vector<int64_t> device_ids_;
};

// ---- PartitionSpec -----------------------------------------------------------

// One entry of a PartitionSpec: the mesh axes one array dimension is split
// over, major to minor. Empty is JAX's None (not split). JAX treats "tp" and
// ("tp",) alike, and () like None; so does this type: one axis is one axis
// however it was written.
struct DimSharding {
  std::vector<std::string> axes;
  bool is_none() const { return axes.empty(); }
  bool operator==(const DimSharding&) const = default;
};

// jax.sharding.PartitionSpec: one entry per leading dimension of the array.
// A spec shorter than the array's rank leaves the remaining dimensions
// unsharded; an empty spec (PartitionSpec()) replicates the whole array.
struct PartitionSpec {
  std::vector<DimSharding> dims;

  size_t size() const { return dims.size(); }
  // Builders for code and tests: PartitionSpec::of({{}, {"tp"}, {"dp", "tp"}})
  // is PartitionSpec(None, "tp", ("dp", "tp")).
  static PartitionSpec of(std::vector<std::vector<std::string>> dims);
  // JAX's repr: "PartitionSpec(None, 'tp', ('dp', 'tp'))".
  std::string to_string() const;
  // The JSON JAX's entries map to: [null, "tp", ["dp", "tp"]]; what
  // json.dumps(PartitionSpec(...)) writes, since a PartitionSpec is a tuple.
  std::string to_json() const;
  bool operator==(const PartitionSpec&) const = default;
};

// Parses a spec written as JSON: an array whose entries are null, an axis
// name, or an array of axis names ([] reads as null, ["tp"] as "tp"). Axis
// names must be non-empty strings. kInvalidArgument whose message starts with
// the JSON location ("spec[2][0]: ..."). Never crashes on any input; text
// beyond 1 MiB or nested deeper than the grammar allows is refused.
Result<PartitionSpec> parse_partition_spec_json(std::string_view json);

// OK if every axis `spec` names is an axis of `mesh` and no axis appears twice
// in the spec (JAX's DuplicateSpecError); otherwise kInvalidArgument naming
// the axis and the spec.
Status validate_partition_spec(const PartitionSpec& spec, const Mesh& mesh);

// ---- NamedSharding and the boxes of devices ----------------------------------

// What to do when a sharded dimension does not divide evenly (see the top of
// this file for both rules, with examples).
enum class Uneven : uint8_t {
  kReject,  // JAX: an error naming the dimension (jax.Array shardings divide evenly)
  kPad,     // XLA's tiling: chunks of ceil(D / n); the last are smaller or empty
};

struct NamedSharding {
  Mesh mesh;
  PartitionSpec spec;
  bool operator==(const NamedSharding&) const = default;
};

// OK if `sharding` can lay out an array of `shape`: the mesh is valid and
// non-empty, the spec passes validate_partition_spec, the spec has at most
// shape.size() entries (JAX refuses longer specs), every dimension is >= 0,
// and under kReject every sharded dimension divides evenly. kInvalidArgument
// naming the problem otherwise.
Status validate_sharding(const NamedSharding& sharding, const Shape& shape,
                         Uneven uneven = Uneven::kReject);

struct DeviceBox {
  int64_t device_id = 0;
  Box box;
  // How many devices earlier in mesh order hold the same box
  // (jax.sharding_impls.device_replica_id_map): 0 for the first holder.
  int64_t replica_id = 0;
  bool operator==(const DeviceBox&) const = default;
};

// The box of the global array each device holds, one entry per device in mesh
// order (the order of the dict JAX returns). Boxes may be empty under kPad,
// or when a dimension is 0. Errors: those of validate_sharding.
Result<std::vector<DeviceBox>> devices_indices_map(const NamedSharding& sharding, const Shape& shape,
                                                   Uneven uneven = Uneven::kReject);

// One distinct box of a sharding and the devices holding it.
struct UniqueShard {
  Box box;
  int64_t writer_device_id = 0;     // the lowest id among `holders`: the one replica saved
  std::vector<int64_t> holders;     // every device holding the box, ascending
  bool operator==(const UniqueShard&) const = default;
};

// The distinct boxes of devices_indices_map, sorted by (start, stop), each
// with the devices that hold it. The non-empty boxes cover the array exactly
// once; empty boxes (kPad, zero-size dimensions) are listed too, and a writer
// may skip them. Errors: those of validate_sharding.
Result<std::vector<UniqueShard>> unique_shards(const NamedSharding& sharding, const Shape& shape,
                                               Uneven uneven = Uneven::kReject);

// ---- Saving a sharded leaf -------------------------------------------------------

// One local device's buffer of a leaf: the C-order bytes of the box
// devices_indices_map gives that device.
struct DeviceData {
  int64_t device_id = 0;
  const void* data = nullptr;
};

// The LeafView a process passes to save() for a leaf laid out as `sharding`:
// one shard per distinct box whose writer (the lowest device id holding it)
// is among `local`, its bytes taken from that device's buffer; empty boxes
// are skipped. So replicated data is written once across all processes, and
// a process whose devices write nothing gets a leaf without shards (valid in
// a multi-process save). Errors: those of validate_sharding, a device in
// `local` that is not in the mesh or appears twice, a null buffer.
Result<LeafView> sharded_leaf_view(std::string prefix, std::string path, DType dtype, Shape shape,
                                   const NamedSharding& sharding, const std::vector<DeviceData>& local,
                                   Uneven uneven = Uneven::kReject);

// ---- Partition rules (eformer's match_partition_rules) -----------------------

struct PartitionRule {
  std::string regex;  // Python re syntax, within the subset RE2 shares (docs/sharding.md)
  PartitionSpec spec;
  bool operator==(const PartitionRule&) const = default;
};

// eformer's MIN_SHARDING_SIZE: leaves with fewer elements are replicated.
inline constexpr int64_t kEformerMinShardingSize = 16384;

struct RuleOptions {
  // Leaves with fewer elements than this, once a rule matched them, are
  // replicated. eformer's match_partition_rules(min_size=None) uses
  // MIN_SHARDING_SIZE (16384); its signature default min_size=0 disables the
  // check. ckptio follows issue 4 and defaults to 16384.
  int64_t min_size = kEformerMinShardingSize;
  // eformer's strict=True: scalars are replicated without looking at the
  // rules, the size check applies, and a spec longer than the leaf's rank is
  // cut to its first rank entries. strict=false returns the matched spec
  // as written (and validate_sharding then refuses an over-long one).
  bool strict = true;
};

// An ordered list of rules with their regular expressions compiled (RE2).
// Immutable and thread-safe once built; copies share the compiled programs.
class PartitionRules {
 public:
  PartitionRules() = default;  // no rules: every non-scalar leaf fails to match

  // Compiles every rule. kInvalidArgument naming the rule ("rules[3]") if its
  // regex is invalid, uses a Python feature RE2 lacks (backreferences,
  // lookahead and lookbehind, atomic groups, possessive quantifiers,
  // conditionals, comments, the x/a/u/L flags, \Z), or is read differently by
  // the two engines ({,n}, [[:alpha:]]); docs/sharding.md has the list.
  static Result<PartitionRules> compile(std::vector<PartitionRule> rules);
  // From the CLI's --rules file: a JSON array of [regex, spec] pairs, each
  // spec as parse_partition_spec_json reads it, e.g.
  //   [["attn/(q|k|v)_proj/kernel", ["fsdp", "tp"]], [".*", []]]
  // which is what json.dumps writes for eformer's Python rules. Errors start
  // with the JSON location ("rules[1][0]: ..."); text beyond 16 MiB, or more
  // than 100,000 rules, is refused.
  static Result<PartitionRules> from_json(std::string_view json);

  const std::vector<PartitionRule>& rules() const;
  size_t size() const { return rules().size(); }
  // The index of the first rule whose regex matches anywhere in `text`
  // (Python's re.search), or nullopt.
  std::optional<size_t> first_match(std::string_view text) const;

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

// The string the rules are matched against for a leaf path: the path with
// every '.' replaced by '/'. eformer flattens a state to dotted keys,
// unflattens on '.', and match_partition_rules joins the tree path with '/',
// so "params.layers.0.attn.q_proj.kernel" is matched as
// "params/layers/0/attn/q_proj/kernel". A path that already uses '/' (an
// eformer TensorStore index) is unchanged. The prefix is not part of it.
std::string rule_match_path(std::string_view leaf_path);

struct RuleMatch {
  PartitionSpec spec;        // the spec to use (replicated, trimmed, or as the rule says)
  int64_t rule_index = -1;   // the rule that matched; -1 for a scalar under strict
  bool small = false;        // a rule matched, but the leaf has fewer than min_size elements
  bool trimmed = false;      // the rule's spec was longer than the rank and was cut
};

// eformer's get_partition_spec for one leaf: under strict a scalar is
// replicated; otherwise the first rule whose regex re.search-es
// rule_match_path(leaf_path) wins; no match is kInvalidArgument naming the
// leaf ("no partition rule matches leaf 'params.x' (as 'params/x')");
// under strict a leaf with fewer than min_size elements is then replicated
// and a spec longer than the rank is cut to its first shape.size() entries.
// A shape whose element count overflows is kInvalidArgument.
Result<RuleMatch> match_partition_rules(const PartitionRules& rules, std::string_view leaf_path,
                                        const Shape& shape, const RuleOptions& options = {});

// ---- Sharding trees (eformer's create_sharding_tree_from_index) --------------

struct LeafSharding {
  std::string prefix;
  std::string path;
  Shape shape;
  PartitionSpec spec;       // on ShardingTree::mesh
  int64_t rule_index = -1;  // the rule that chose `spec`; -1 for a default spec or a strict scalar
  bool operator==(const LeafSharding&) const = default;
};

// One sharding for every leaf, all on one mesh. Leaves keep the order they
// were given in (index order: prefix by prefix).
struct ShardingTree {
  Mesh mesh;
  std::vector<LeafSharding> leaves;
  // The leaf, or nullptr. Linear in the number of leaves.
  const LeafSharding* find(std::string_view prefix, std::string_view path) const;
  NamedSharding sharding_of(const LeafSharding& leaf) const { return {mesh, leaf.spec}; }
};

// Assigns every leaf its spec from `rules` (match_partition_rules), then
// checks it with validate_sharding. The first failure is returned, prefixed
// with the leaf ("model/params.x: ..."), so a rules file that misses a leaf,
// names an axis the mesh lacks or splits a dimension unevenly under kReject
// fails before any byte is read.
Result<ShardingTree> sharding_tree(const std::vector<LeafSpec>& leaves, const Mesh& mesh,
                                   const PartitionRules& rules, const RuleOptions& options = {},
                                   Uneven uneven = Uneven::kReject);
// The same spec for every leaf (eformer's default_sharding as a
// PartitionSpec; PartitionSpec() replicates everything). Applied as written,
// like eformer: a leaf whose rank is below the spec's length fails, naming it.
Result<ShardingTree> sharding_tree(const std::vector<LeafSpec>& leaves, const Mesh& mesh,
                                   const PartitionSpec& default_spec, Uneven uneven = Uneven::kReject);
// The leaves of a saved step (every prefix), as the two above.
Result<ShardingTree> sharding_tree_from_index(const Index& index, const Mesh& mesh,
                                              const PartitionRules& rules, const RuleOptions& options = {},
                                              Uneven uneven = Uneven::kReject);
Result<ShardingTree> sharding_tree_from_index(const Index& index, const Mesh& mesh,
                                              const PartitionSpec& default_spec,
                                              Uneven uneven = Uneven::kReject);

}  // namespace ckptio
