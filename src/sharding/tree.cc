// Sharding trees: a spec for every leaf of a state or a saved step, chosen by
// rules or one default spec (eformer's create_sharding_tree_from_index), and
// checked against the mesh and the leaf's shape up front so that a bad rules
// file fails naming the leaf before any I/O.
#include "ckptio/sharding.h"

namespace ckptio {
namespace {

std::string leaf_context(const LeafSpec& l) { return "prefix '" + l.prefix + "' leaf '" + l.path + "'"; }

Status check_mesh(const Mesh& mesh) {
  if (mesh.num_devices() == 0) return invalid_argument("the mesh has no devices");
  return Status::OK();
}

std::vector<LeafSpec> leaves_of(const Index& index) {
  std::vector<LeafSpec> out;
  for (const PrefixRecord& p : index.prefixes)
    for (const LeafRecord& l : p.leaves) out.push_back({p.name, l.path, l.dtype, l.shape});
  return out;
}

// Checks `spec` for `leaf` and appends it to the tree.
Status add_leaf(ShardingTree* tree, const LeafSpec& leaf, PartitionSpec spec, int64_t rule_index, Uneven uneven) {
  NamedSharding ns{tree->mesh, std::move(spec)};
  if (Status s = validate_sharding(ns, leaf.shape, uneven); !s.ok()) return s.annotate(leaf_context(leaf));
  tree->leaves.push_back({leaf.prefix, leaf.path, leaf.shape, std::move(ns.spec), rule_index});
  return Status::OK();
}

}  // namespace

const LeafSharding* ShardingTree::find(std::string_view prefix, std::string_view path) const {
  for (const LeafSharding& l : leaves)
    if (l.prefix == prefix && l.path == path) return &l;
  return nullptr;
}

Result<ShardingTree> sharding_tree(const std::vector<LeafSpec>& leaves, const Mesh& mesh,
                                   const PartitionRules& rules, const RuleOptions& options, Uneven uneven) {
  CKPTIO_RETURN_IF_ERROR(check_mesh(mesh));
  ShardingTree tree{mesh, {}};
  tree.leaves.reserve(leaves.size());
  for (const LeafSpec& leaf : leaves) {
    Result<RuleMatch> m = match_partition_rules(rules, leaf.path, leaf.shape, options);
    if (!m.ok()) return m.status().annotate("prefix '" + leaf.prefix + "'");
    CKPTIO_RETURN_IF_ERROR(add_leaf(&tree, leaf, std::move(m->spec), m->rule_index, uneven));
  }
  return tree;
}

Result<ShardingTree> sharding_tree(const std::vector<LeafSpec>& leaves, const Mesh& mesh,
                                   const PartitionSpec& default_spec, Uneven uneven) {
  CKPTIO_RETURN_IF_ERROR(check_mesh(mesh));
  ShardingTree tree{mesh, {}};
  tree.leaves.reserve(leaves.size());
  for (const LeafSpec& leaf : leaves) CKPTIO_RETURN_IF_ERROR(add_leaf(&tree, leaf, default_spec, -1, uneven));
  return tree;
}

Result<ShardingTree> sharding_tree_from_index(const Index& index, const Mesh& mesh, const PartitionRules& rules,
                                              const RuleOptions& options, Uneven uneven) {
  return sharding_tree(leaves_of(index), mesh, rules, options, uneven);
}

Result<ShardingTree> sharding_tree_from_index(const Index& index, const Mesh& mesh,
                                              const PartitionSpec& default_spec, Uneven uneven) {
  return sharding_tree(leaves_of(index), mesh, default_spec, uneven);
}

}  // namespace ckptio
