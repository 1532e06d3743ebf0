// Sharded leaves across the boundary (sharding.cc): a leaf saved as the
// shards of a global array (ckptio.Shards: JAX's addressable_shards), and
// restore into a sharding (RestoreOptions::Sharding), whose leaves come back
// as one array per local device.
//
// The Python package (ckptio/_shards.py) normalises what the caller gives
// (meshes as dicts, ckptio.Mesh or a jax Mesh; specs and rules as Python
// tuples and lists) into plain lists and JSON text; this layer parses them
// with the library's own readers (Mesh::create, parse_partition_spec_json,
// PartitionRules::from_json), so the errors carry the C++ messages.
#pragma once

#include "ckptio/manager.h"
#include "ckptio/sharding.h"
#include "python/src/binding.h"

namespace ckptio::python {

// (prefix, path, dtype name, global shape, [(start, stop, numpy array), ...])
// -> a LeafView with one ShardView per array (no copy: the arrays stay the
// caller's, held by the Python layer as long as the save reads them).
LeafView sharded_leaf_from_python(const py::tuple& leaf);

// The dict ckptio/_shards.py builds from restore(sharding=...):
//   mesh: (axes [(name, size)], device ids), rules: JSON text or None,
//   leaves: [(prefix, path, spec JSON)] (shapes: the step's), devices: [ids],
//   min_size: int, strict: bool, uneven: "pad" | "reject".
RestoreOptions::Sharding restore_sharding_from_python(const py::dict& d);

// A leaf restored into `s`: (spec JSON, [(device_id, start, stop,
// replica_id, numpy array)]) in mesh order. replica_id is JAX's: how many
// devices earlier in mesh order hold the same box.
py::tuple device_shards_to_python(const Tensor& t, const RestoreOptions::Sharding& s);

}  // namespace ckptio::python
