#include "src/restore/targets.h"

#include "ckptio/sharding.h"

namespace ckptio {
namespace {

std::vector<int64_t> box_key(const Box& b) {
  std::vector<int64_t> k(b.start);
  k.insert(k.end(), b.stop.begin(), b.stop.end());
  return k;
}

// Mesh positions of this process's devices.
Result<std::vector<size_t>> local_positions(const RestoreOptions::Sharding& s) {
  const std::vector<int64_t>& ids = s.mesh.device_ids();
  if (ids.empty()) return invalid_argument("restore into a sharding: the mesh has no devices");
  std::vector<size_t> out;
  if (s.devices.empty()) {
    for (size_t p = 0; p < ids.size(); ++p) out.push_back(p);
    return out;
  }
  std::map<int64_t, size_t> pos;
  for (size_t p = 0; p < ids.size(); ++p) pos[ids[p]] = p;
  std::vector<bool> local(ids.size(), false);
  for (int64_t d : s.devices) {
    auto it = pos.find(d);
    if (it == pos.end())
      return invalid_argument("restore into a sharding: device " + std::to_string(d) +
                              " is not in the mesh " + s.mesh.to_string());
    if (local[it->second])
      return invalid_argument("restore into a sharding: device " + std::to_string(d) + " is listed twice");
    local[it->second] = true;
  }
  for (size_t p = 0; p < ids.size(); ++p)
    if (local[p]) out.push_back(p);
  return out;
}

}  // namespace

DType restored_dtype(const RestoreOptions& options, const std::map<std::string, DType>& want,
                     const std::string& name, DType saved) {
  // A template's dtype wins over float_dtype, also where it is the saved
  // one (float_dtype then cast a float64 leaf the template asked as float64).
  auto it = want.find(name);
  if (it != want.end()) return it->second;
  if (options.float_dtype && dtype_is_float(saved)) return *options.float_dtype;
  return saved;
}

std::map<std::string, DType> template_dtypes(const RestoreOptions& options) {
  std::map<std::string, DType> want;
  for (const LeafSpec& e : options.expected) want[e.prefix + "/" + e.path] = e.dtype;
  return want;
}

Status check_restored_bytes(const std::string& name, const Shape& shape, DType to) {
  if (checked_num_bytes(shape, dtype_size(to))) return Status::OK();
  return invalid_argument("restore " + name + ": its " + std::string(dtype_name(to)) + " bytes do not fit in 64 bits");
}

Result<ShardingTargets> ShardingTargets::make(const RestoreOptions& options) {
  ShardingTargets t;
  t.options_ = &options;
  CKPTIO_ASSIGN_OR_RETURN(t.local_, local_positions(*options.sharding));
  for (const LeafSharding& l : options.sharding->leaves)
    if (!t.given_.emplace(l.prefix + "/" + l.path, &l).second)
      return invalid_argument("restore into a sharding: leaf " + l.prefix + "/" + l.path +
                              " has two entries in `leaves`");
  t.want_ = template_dtypes(options);
  return t;
}

Result<LeafTargets> ShardingTargets::leaf(const std::string& prefix, const LeafRecord& rec) const {
  const RestoreOptions::Sharding& s = *options_->sharding;
  LeafTargets out;
  out.name = prefix + "/" + rec.path;
  PartitionSpec spec;
  if (auto it = given_.find(out.name); it != given_.end()) {
    if (!s.leaf_shapes_from_step && it->second->shape != rec.shape)
      return invalid_argument(out.name + ": the sharding given for it is for shape " +
                              shape_to_string(it->second->shape) + ", the saved leaf has shape " +
                              shape_to_string(rec.shape));
    spec = it->second->spec;
  } else {
    auto m = match_partition_rules(s.rules, rec.path, rec.shape, s.rule_options);
    if (!m.ok()) return m.status().annotate(out.name);
    spec = std::move(m->spec);
  }
  const NamedSharding sharding{s.mesh, spec};
  auto boxes = devices_indices_map(sharding, rec.shape, s.uneven);
  if (!boxes.ok()) return boxes.status().annotate(out.name + " into " + spec.to_string());
  out.spec = spec.to_string();
  Tensor& t = out.tensor;
  t.prefix = prefix;
  t.path = rec.path;
  t.dtype = restored_dtype(*options_, want_, out.name, rec.dtype);
  CKPTIO_RETURN_IF_ERROR(check_restored_bytes(out.name, rec.shape, t.dtype));  // (else each box's size wraps)
  t.shape = rec.shape;
  std::map<std::vector<int64_t>, uint32_t> target_index;
  for (size_t p : local_) {
    const DeviceBox& db = (*boxes)[p];
    auto [it, fresh] = target_index.emplace(box_key(db.box), static_cast<uint32_t>(out.targets.size()));
    if (fresh) out.targets.push_back(db.box);
    out.target_of.push_back(it->second);
    t.device_shards.push_back(DeviceShard{db.device_id, db.box, Buffer()});
  }
  return out;
}

}  // namespace ckptio
