// PartitionSpec: building, printing as JAX does, and checking against a mesh.
#include <set>

#include "ckptio/sharding.h"

namespace ckptio {

PartitionSpec PartitionSpec::of(std::vector<std::vector<std::string>> dims) {
  PartitionSpec p;
  p.dims.reserve(dims.size());
  for (auto& axes : dims) p.dims.push_back(DimSharding{std::move(axes)});
  return p;
}

// JAX's repr: a single axis bare, several as a tuple. Names are printed as
// written (no escaping): this is for messages, to_json() is for machines.
std::string PartitionSpec::to_string() const {
  std::string s = "PartitionSpec(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    const auto& axes = dims[i].axes;
    if (axes.empty()) {
      s += "None";
    } else if (axes.size() == 1) {
      s += "'" + axes[0] + "'";
    } else {
      s += "(";
      for (size_t j = 0; j < axes.size(); ++j) s += (j ? ", '" : "'") + axes[j] + "'";
      s += ")";
    }
  }
  return s + ")";
}

Status validate_partition_spec(const PartitionSpec& spec, const Mesh& mesh) {
  std::set<std::string_view> used;
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    for (const std::string& axis : spec.dims[d].axes) {
      if (!mesh.axis_index(axis))
        return invalid_argument(spec.to_string() + " names axis '" + axis + "' (dimension " + std::to_string(d) +
                                "), which mesh {" + mesh.to_string() + "} does not have");
      // JAX's DuplicateSpecError: one mesh axis can split one dimension once.
      if (!used.insert(axis).second)
        return invalid_argument(spec.to_string() + " uses mesh axis '" + axis +
                                "' more than once; a mesh axis may shard at most one dimension");
    }
  }
  return Status::OK();
}

}  // namespace ckptio
