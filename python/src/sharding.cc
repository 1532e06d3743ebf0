// The sharding model for Python (ckptio._ckptio.mesh_*, spec_parse,
// rules_check, devices_indices_map, match_partition_rules) and the
// conversions the manager's save and restore use for sharded leaves (see
// sharding.h). Pure computation: nothing here blocks, so the GIL is kept.
#include "python/src/sharding.h"

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckptio::python {

namespace {

using Axes = std::vector<std::pair<std::string, int64_t>>;

template <typename T>
T cast_or_throw(py::handle v, const std::string& what) {
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    throw StatusError(invalid_argument(what + ": cannot take " + std::string(py::str(py::repr(v)))));
  }
}

Mesh make_mesh(const Axes& axes, const std::optional<std::vector<int64_t>>& ids) {
  std::vector<MeshAxis> a;
  for (const auto& [name, size] : axes) a.push_back(MeshAxis{name, size});
  return value_or_throw(ids ? Mesh::create(std::move(a), *ids) : Mesh::create(std::move(a)));
}

// (axes, ids) as the Python layer passes a mesh.
Mesh mesh_from_python(py::handle mesh) {
  auto t = cast_or_throw<py::tuple>(mesh, "mesh");
  if (t.size() != 2) throw StatusError(invalid_argument("mesh: expected (axes, device ids)"));
  auto axes = cast_or_throw<Axes>(t[0], "mesh axes");
  std::optional<std::vector<int64_t>> ids;
  if (!t[1].is_none()) ids = cast_or_throw<std::vector<int64_t>>(t[1], "mesh devices");
  return make_mesh(axes, ids);
}

py::tuple mesh_to_python(const Mesh& m) {
  py::list axes;
  for (const MeshAxis& a : m.axes()) axes.append(py::make_tuple(a.name, a.size));
  return py::make_tuple(axes, m.device_ids());
}

PartitionSpec spec_from_json(const std::string& json) {
  return value_or_throw(parse_partition_spec_json(json));
}

Uneven uneven_from_name(const std::string& name) {
  if (name == "pad") return Uneven::kPad;
  if (name == "reject") return Uneven::kReject;
  throw StatusError(invalid_argument("uneven must be \"pad\" or \"reject\", not \"" + name + "\""));
}

PartitionRules rules_from_json(const std::string& json) { return value_or_throw(PartitionRules::from_json(json)); }

// The spec restore gives a leaf (restore_sharded.cc's leaf_spec): its entry
// in s.leaves, else the rules.
PartitionSpec spec_of(const Tensor& t, const RestoreOptions::Sharding& s) {
  for (const LeafSharding& l : s.leaves)
    if (l.prefix == t.prefix && l.path == t.path) return l.spec;
  auto m = match_partition_rules(s.rules, t.path, t.shape, s.rule_options);
  if (!m.ok()) throw StatusError(m.status().annotate(t.prefix + "/" + t.path));
  return std::move(m->spec);
}

}  // namespace

LeafView sharded_leaf_from_python(const py::tuple& leaf) {
  LeafView v;
  v.prefix = leaf[0].cast<std::string>();
  v.path = leaf[1].cast<std::string>();
  const std::string name = v.prefix + "/" + v.path;
  v.dtype = dtype_from_name(leaf[2].cast<std::string>(), name);
  v.shape = cast_or_throw<Shape>(leaf[3], "leaf '" + name + "': shape");
  const auto shards = cast_or_throw<py::list>(leaf[4], "leaf '" + name + "': shards");
  v.shards.reserve(shards.size());
  size_t i = 0;
  for (py::handle item : shards) {
    auto s = py::reinterpret_borrow<py::tuple>(item);
    const std::string where = "leaf '" + name + "' shard " + std::to_string(i++);
    Box box{cast_or_throw<std::vector<int64_t>>(s[0], where + ": start"),
            cast_or_throw<std::vector<int64_t>>(s[1], where + ": stop")};
    if (!py::isinstance<py::array>(s[2])) throw StatusError(invalid_argument(where + ": not a numpy array"));
    auto a = py::reinterpret_borrow<py::array>(s[2]);
    if (!(a.flags() & py::array::c_style))
      throw StatusError(invalid_argument(where + ": the array is not C-contiguous"));
    if (static_cast<size_t>(a.itemsize()) != dtype_size(v.dtype))
      throw StatusError(invalid_argument(where + ": items of " + std::to_string(a.itemsize()) + " bytes for dtype " +
                                         std::string(dtype_name(v.dtype))));
    // A box save() refuses (outside the shape, wrong rank) has no size here;
    // save's own check names it.
    auto bytes = checked_num_bytes(box, dtype_size(v.dtype));
    if (bytes && *bytes != static_cast<uint64_t>(a.nbytes()))
      throw StatusError(invalid_argument(where + ": the array holds " + std::to_string(a.nbytes()) +
                                         " bytes, its box " + shape_to_string(box.extent()) + " needs " +
                                         std::to_string(*bytes)));
    v.shards.push_back(ShardView{std::move(box), a.data()});
  }
  return v;
}

RestoreOptions::Sharding restore_sharding_from_python(const py::dict& d) {
  RestoreOptions::Sharding s;
  s.mesh = mesh_from_python(d["mesh"]);
  if (d.contains("rules") && !d["rules"].is_none()) s.rules = rules_from_json(d["rules"].cast<std::string>());
  if (d.contains("leaves")) {
    s.leaf_shapes_from_step = true;  // (prefix, path, spec JSON): no shape
    for (py::handle item : d["leaves"].cast<py::list>()) {
      auto t = py::reinterpret_borrow<py::tuple>(item);
      LeafSharding l;
      l.prefix = t[0].cast<std::string>();
      l.path = t[1].cast<std::string>();
      auto spec = parse_partition_spec_json(t[2].cast<std::string>());
      if (!spec.ok()) throw StatusError(spec.status().annotate("sharding leaves: " + l.prefix + "/" + l.path));
      l.spec = std::move(*spec);
      s.leaves.push_back(std::move(l));
    }
  }
  if (d.contains("devices") && !d["devices"].is_none())
    s.devices = cast_or_throw<std::vector<int64_t>>(d["devices"], "sharding devices");
  if (d.contains("min_size") && !d["min_size"].is_none())
    s.rule_options.min_size = cast_or_throw<int64_t>(d["min_size"], "sharding min_size");
  if (d.contains("strict") && !d["strict"].is_none())
    s.rule_options.strict = cast_or_throw<bool>(d["strict"], "sharding strict");
  if (d.contains("uneven") && !d["uneven"].is_none())
    s.uneven = uneven_from_name(cast_or_throw<std::string>(d["uneven"], "sharding uneven"));
  return s;
}

py::tuple device_shards_to_python(const Tensor& t, const RestoreOptions::Sharding& s) {
  const PartitionSpec spec = spec_of(t, s);
  std::map<int64_t, int64_t> replica;
  for (const DeviceBox& b : value_or_throw(devices_indices_map(NamedSharding{s.mesh, spec}, t.shape, s.uneven)))
    replica[b.device_id] = b.replica_id;
  py::list shards;
  for (const DeviceShard& ds : t.device_shards)
    shards.append(py::make_tuple(ds.device_id, ds.box.start, ds.box.stop, replica[ds.device_id],
                                 array_over(ds.data, t.dtype, ds.box.extent())));
  return py::make_tuple(spec.to_json(), shards);
}

void bind_sharding(py::module_& m) {
  m.def("mesh_check", [](const Axes& axes, std::optional<std::vector<int64_t>> ids) {
    return mesh_to_python(make_mesh(axes, ids));
  }, py::arg("axes"), py::arg("device_ids") = py::none(),
     "Mesh::create: (axes [(name, size)], device ids in mesh order, or None for 0..N-1) -> (axes, ids).");
  m.def("mesh_parse", [](const std::string& text) { return mesh_to_python(value_or_throw(Mesh::parse(text))); },
        "Mesh::parse(\"dp=2,tp=4\") -> (axes, ids).");
  m.def("spec_parse", [](const std::string& json) {
    PartitionSpec spec = spec_from_json(json);
    return py::make_tuple(spec.to_json(), spec.to_string());
  }, "parse_partition_spec_json -> (JSON as the library writes it, JAX's repr).");
  m.def("rules_check", [](const std::string& json) { return rules_from_json(json).size(); },
        "PartitionRules::from_json: the number of rules, or InvalidArgument with the JSON location.");
  m.def("devices_indices_map", [](py::tuple mesh, const std::string& spec_json, const Shape& shape,
                                  const std::string& uneven) {
    const NamedSharding sharding{mesh_from_python(mesh), spec_from_json(spec_json)};
    py::list out;
    for (const DeviceBox& b : value_or_throw(devices_indices_map(sharding, shape, uneven_from_name(uneven))))
      out.append(py::make_tuple(b.device_id, b.box.start, b.box.stop, b.replica_id));
    return out;
  }, py::arg("mesh"), py::arg("spec_json"), py::arg("shape"), py::arg("uneven") = "reject",
     "[(device_id, start, stop, replica_id)] in mesh order, as NamedSharding.devices_indices_map.");
  m.def("match_partition_rules", [](const std::string& rules_json, const std::string& path, const Shape& shape,
                                    int64_t min_size, bool strict) {
    const PartitionRules rules = rules_from_json(rules_json);
    RuleMatch r = value_or_throw(match_partition_rules(rules, path, shape, RuleOptions{min_size, strict}));
    return py::make_tuple(r.spec.to_json(), r.rule_index, r.small, r.trimmed);
  }, py::arg("rules_json"), py::arg("path"), py::arg("shape"), py::arg("min_size") = kEformerMinShardingSize,
     py::arg("strict") = true, "eformer's get_partition_spec for one leaf -> (spec JSON, rule index, small, trimmed).");
  m.def("rule_match_path", [](const std::string& path) { return rule_match_path(path); });
}

}  // namespace ckptio::python
