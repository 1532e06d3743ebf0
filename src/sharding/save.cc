// sharded_leaf_view: the shards one process writes for a leaf laid out as a
// NamedSharding: one replica of each distinct box, the lowest device id's.
#include <map>
#include <set>

#include "ckptio/sharding.h"
#include "src/util/box_runs.h"

namespace ckptio {

Result<LeafView> sharded_leaf_view(std::string prefix, std::string path, DType dtype, Shape shape,
                                   const NamedSharding& sharding, const std::vector<DeviceData>& local,
                                   Uneven uneven) {
  const std::string name = prefix + "/" + path;
  auto shards = unique_shards(sharding, shape, uneven);
  if (!shards.ok()) return shards.status().annotate("leaf '" + name + "'");
  const std::vector<int64_t>& ids = sharding.mesh.device_ids();
  const std::set<int64_t> in_mesh(ids.begin(), ids.end());
  std::map<int64_t, const void*> data_of;
  for (const DeviceData& d : local) {
    if (!in_mesh.count(d.device_id))
      return invalid_argument("leaf '" + name + "': device " + std::to_string(d.device_id) +
                              " is not in the mesh " + sharding.mesh.to_string());
    if (d.data == nullptr)
      return invalid_argument("leaf '" + name + "': device " + std::to_string(d.device_id) + " has a null buffer");
    if (!data_of.emplace(d.device_id, d.data).second)
      return invalid_argument("leaf '" + name + "': device " + std::to_string(d.device_id) +
                              " is listed twice");
  }
  LeafView view;
  view.prefix = std::move(prefix);
  view.path = std::move(path);
  view.dtype = dtype;
  view.shape = std::move(shape);
  for (const UniqueShard& u : *shards) {
    if (box_is_empty(u.box)) continue;
    auto it = data_of.find(u.writer_device_id);
    if (it != data_of.end()) view.shards.push_back(ShardView{u.box, it->second});
  }
  return view;
}

}  // namespace ckptio
