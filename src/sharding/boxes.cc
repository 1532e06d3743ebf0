// The box each device holds under a NamedSharding: JAX's devices_indices_map,
// with XLA's ceil-division tiles as the opt-in rule for uneven dimensions. The
// rule and its sources are at the top of include/ckptio/sharding.h.
#include <algorithm>
#include <map>

#include "ckptio/sharding.h"

namespace ckptio {
namespace {

// How one array dimension is cut: into `parts` chunks of `tile` elements
// (the last clipped to the dimension), chosen by the listed mesh axes.
struct DimCut {
  std::vector<size_t> axes;  // indices into Mesh::axes(), major to minor
  int64_t parts = 1;
  int64_t tile = 0;
};

std::string dims_context(const Shape& shape, const PartitionSpec& spec) {
  return " (shape " + shape_to_string(shape) + ", " + spec.to_string() + ")";
}

// Validates and works out the cut of every dimension.
Result<std::vector<DimCut>> plan_cuts(const NamedSharding& s, const Shape& shape, Uneven uneven) {
  const Mesh& mesh = s.mesh;
  if (mesh.num_devices() == 0) return invalid_argument("the mesh has no devices");
  CKPTIO_RETURN_IF_ERROR(validate_partition_spec(s.spec, mesh));
  if (s.spec.size() > shape.size())
    return invalid_argument(s.spec.to_string() + " has " + std::to_string(s.spec.size()) +
                            " entries, more than the rank " + std::to_string(shape.size()) + " of shape " +
                            shape_to_string(shape));
  std::vector<DimCut> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t dim = shape[d];
    if (dim < 0)
      return invalid_argument("dimension " + std::to_string(d) + " is negative" + dims_context(shape, s.spec));
    DimCut& cut = cuts[d];
    if (d < s.spec.size()) {
      for (const std::string& name : s.spec.dims[d].axes) {
        size_t a = *mesh.axis_index(name);  // validated above
        cut.axes.push_back(a);
        cut.parts *= mesh.axes()[a].size;  // <= kMaxMeshDevices: the mesh is bounded
      }
    }
    if (dim % cut.parts != 0 && uneven == Uneven::kReject)
      return invalid_argument("dimension " + std::to_string(d) + " of size " + std::to_string(dim) +
                              " is split " + std::to_string(cut.parts) + " ways, which does not divide it" +
                              dims_context(shape, s.spec) +
                              "; JAX refuses this sharding (IndivisibleError); Uneven::kPad uses XLA's "
                              "ceil-division tiles instead");
    // ceil(dim / parts) without overflow: dim <= INT64_MAX.
    cut.tile = dim / cut.parts + (dim % cut.parts != 0 ? 1 : 0);
  }
  return cuts;
}

Box box_of(const std::vector<DimCut>& cuts, const Shape& shape, const Mesh& mesh,
           const std::vector<int64_t>& coords) {
  Box b;
  b.start.resize(shape.size());
  b.stop.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    const DimCut& cut = cuts[d];
    int64_t chunk = 0;  // mixed radix over the spec's axes, the first most significant
    for (size_t a : cut.axes) chunk = chunk * mesh.axes()[a].size + coords[a];
    // chunk < parts, so chunk * tile <= (parts - 1) * ceil(dim / parts) < dim + parts:
    // no overflow in unsigned arithmetic, and clipping brings it back in range.
    const uint64_t dim = static_cast<uint64_t>(shape[d]);
    const uint64_t lo = static_cast<uint64_t>(chunk) * static_cast<uint64_t>(cut.tile);
    const uint64_t hi = lo + static_cast<uint64_t>(cut.tile);
    b.start[d] = static_cast<int64_t>(std::min(lo, dim));
    b.stop[d] = static_cast<int64_t>(std::min(hi, dim));
  }
  return b;
}

// A box as one flat key for maps: start then stop.
std::vector<int64_t> key_of(const Box& b) {
  std::vector<int64_t> k(b.start);
  k.insert(k.end(), b.stop.begin(), b.stop.end());
  return k;
}

}  // namespace

Status validate_sharding(const NamedSharding& sharding, const Shape& shape, Uneven uneven) {
  return plan_cuts(sharding, shape, uneven).status();
}

Result<std::vector<DeviceBox>> devices_indices_map(const NamedSharding& sharding, const Shape& shape,
                                                   Uneven uneven) {
  CKPTIO_ASSIGN_OR_RETURN(std::vector<DimCut> cuts, plan_cuts(sharding, shape, uneven));
  const Mesh& mesh = sharding.mesh;
  std::vector<DeviceBox> out;
  out.reserve(mesh.num_devices());
  std::map<std::vector<int64_t>, int64_t> seen;  // box -> holders so far, for replica ids
  for (size_t p = 0; p < mesh.num_devices(); ++p) {
    DeviceBox db;
    db.device_id = mesh.device_ids()[p];
    db.box = box_of(cuts, shape, mesh, mesh.coordinates(p));
    db.replica_id = seen[key_of(db.box)]++;
    out.push_back(std::move(db));
  }
  return out;
}

Result<std::vector<UniqueShard>> unique_shards(const NamedSharding& sharding, const Shape& shape,
                                               Uneven uneven) {
  CKPTIO_ASSIGN_OR_RETURN(std::vector<DeviceBox> boxes, devices_indices_map(sharding, shape, uneven));
  // Keyed by (start, stop), so the result comes out in that order.
  std::map<std::vector<int64_t>, UniqueShard> by_box;
  for (DeviceBox& db : boxes) {
    UniqueShard& u = by_box[key_of(db.box)];
    if (u.holders.empty()) u.box = std::move(db.box);
    u.holders.push_back(db.device_id);
  }
  std::vector<UniqueShard> out;
  out.reserve(by_box.size());
  for (auto& [key, u] : by_box) {
    std::sort(u.holders.begin(), u.holders.end());
    u.writer_device_id = u.holders.front();
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace ckptio
