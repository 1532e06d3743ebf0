"""Sharded state, shaped as JAX presents it.

Saving: a leaf given as a `Shards` (the global shape, the dtype, and this
process's shards as `(index, array, replica_id)`, which is what
`jax.Array.addressable_shards` yields as `shard.index`, `shard.data`,
`shard.replica_id`) is saved as the shards whose replica_id is 0: across
all processes those cover the global array exactly once, as `LeafView`
wants (ckptio/types.h), so replicated data is written once. Anything with
`addressable_shards`, `shape` and `dtype` (a jax.Array, duck-typed: JAX is
not needed) is taken the same way. `Shards.from_mesh` builds one from a mesh,
a PartitionSpec and per-device buffers.

Restoring: `restore(sharding=dict(mesh=..., rules=[(regex, spec), ...],
devices=[...]))` returns each leaf as a `Shards` holding one entry per local
device, `Shard(index, data, replica_id, device)`, in mesh order, and the
spec the rules chose in `.spec`: what `jax.make_array_from_single_device_arrays`
needs (docs/python.md has the recipe).

Meshes, specs and rules are checked by the C++ library (ckptio/sharding.h)
and its errors keep its messages.
"""

import json
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _ckptio, _leaves, errors


class Shard(NamedTuple):
    """One shard of a global array: `index` is a tuple of slices of the global
    array (jax's Shard.index), `data` its array, `replica_id` as in JAX (0 for
    the copy that is saved), `device` the device id (set on restore)."""
    index: tuple
    data: Any
    replica_id: int = 0
    device: Optional[int] = None


class PartitionSpec(tuple):
    """jax.sharding.PartitionSpec without JAX: one entry per leading dimension,
    None (not split), a mesh axis name, or a tuple of axis names (major to
    minor). PartitionSpec() replicates. Any tuple or list of such entries, and
    JAX's own PartitionSpec, work wherever a spec is taken."""

    def __new__(cls, *entries):
        return super().__new__(cls, entries)

    def __reduce__(self):
        return (PartitionSpec, tuple(self))

    def __repr__(self):
        return "PartitionSpec(" + ", ".join(repr(e) for e in self) + ")"


# ---- normalising what the caller gives ---------------------------------------------

def _jsonable(value, where):
    """A spec or rule list as JSON-able lists (tuples and JAX's PartitionSpec,
    which is a tuple or, in newer JAX, an iterable, become lists); the C++
    reader then judges the structure and names what is wrong."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (tuple, list)) or (hasattr(value, "__iter__") and not isinstance(value, (dict, bytes))):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise errors.InvalidArgument(f"{where}: {value!r} is not None, a mesh axis name or a tuple of them")


def spec_json(spec, where="spec"):
    """A spec (PartitionSpec, tuple, list) as the JSON the library reads."""
    if isinstance(spec, str):
        # json.dumps would make it a string, which the reader refuses; say why.
        raise errors.InvalidArgument(f"{where}: a spec is a tuple of entries (PartitionSpec({spec!r}) is "
                                     f"({spec!r},)), not the string {spec!r}")
    return json.dumps(_jsonable(spec, where))


def spec_from_json(text):
    """The library's spec JSON as a PartitionSpec (entries None, str, tuple of str)."""
    return PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in json.loads(text)))


def rules_json(rules):
    """[(regex, spec), ...] (or a JSON text of them, as the CLI's --rules file)
    as the JSON PartitionRules::from_json reads."""
    if isinstance(rules, str):
        return rules
    if isinstance(rules, dict):
        raise errors.InvalidArgument("rules: a list of (regex, spec) pairs (first match wins), not a dict")
    return json.dumps(_jsonable(list(rules), "rules"))


def _device_id(d, where):
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return int(d)
    i = getattr(d, "id", None)  # a jax Device
    if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        return int(i)
    raise errors.InvalidArgument(f"{where}: {d!r} is not a device id (an int, or a device with .id)")


class Mesh:
    """jax.sharding.Mesh without JAX: named axes with sizes, and device ids
    laid out row-major over them (the last axis varies fastest).

        ckptio.Mesh({"dp": 2, "tp": 4})                  # devices 0..7
        ckptio.Mesh([("dp", 2), ("tp", 4)], devices=[7, 6, 5, 4, 3, 2, 1, 0])
        ckptio.Mesh("dp=2,tp=4")                          # the CLI's --mesh

    `devices` may be a nested list or array of ids or of jax Devices. The
    library checks it (Mesh::create): unique non-empty names, sizes >= 1,
    one unique id >= 0 per position."""

    def __init__(self, axes, devices=None):
        if isinstance(axes, Mesh):
            axes, ids = axes.axes, (axes.device_ids if devices is None else devices)
        else:
            ids = devices
        if isinstance(axes, str):
            parsed, parsed_ids = _ckptio.mesh_parse(axes)
            axes, ids = parsed, parsed_ids if ids is None else ids
        elif isinstance(axes, dict):
            axes = list(axes.items())
        else:
            try:
                axes = [(name, size) for name, size in axes]
            except (TypeError, ValueError):
                raise errors.InvalidArgument(
                    f"mesh axes: {axes!r} is not a dict of axis sizes or a list of (name, size)") from None
        if ids is not None:
            ids = [_device_id(d, "mesh devices") for d in np.asarray(ids, dtype=object).ravel()]
        self._axes, self._ids = _ckptio.mesh_check(axes, ids)
        self._axes = [tuple(a) for a in self._axes]

    @classmethod
    def of(cls, mesh):
        """A Mesh from what `sharding=dict(mesh=...)` takes: a Mesh, a dict
        {"dp": 2, "tp": 4}, a list of (name, size), "dp=2,tp=4", or a jax Mesh
        (duck-typed: `axis_names` and `devices`, an array of devices with .id)."""
        if isinstance(mesh, Mesh):
            return mesh
        if hasattr(mesh, "axis_names") and hasattr(mesh, "devices"):
            devices = np.asarray(mesh.devices, dtype=object)
            return cls(list(zip(mesh.axis_names, devices.shape)), devices)
        return cls(mesh)

    @property
    def axes(self):
        """{name: size}, in mesh order (jax's Mesh.shape)."""
        return dict(self._axes)

    shape = axes

    @property
    def axis_names(self):
        return tuple(name for name, _ in self._axes)

    @property
    def device_ids(self):
        """Device ids in mesh order (row-major)."""
        return list(self._ids)

    @property
    def size(self):
        return len(self._ids)

    def _c(self):
        return (self._axes, self._ids)

    def devices_indices_map(self, spec, shape, uneven="reject"):
        """{device id: index (tuple of slices)} as jax's
        NamedSharding(mesh, spec).devices_indices_map(shape)."""
        return {dev: index for dev, index, _ in _device_boxes(self, spec, shape, uneven)}

    def __eq__(self, other):
        return isinstance(other, Mesh) and self._axes == other._axes and self._ids == other._ids

    def __hash__(self):
        return hash((tuple(self._axes), tuple(self._ids)))

    def __repr__(self):
        ordered = self._ids == list(range(len(self._ids)))
        return f"Mesh({self.axes!r}" + ("" if ordered else f", devices={self._ids!r}") + ")"


def _index(start, stop, shape):
    """The index JAX gives a box: slice(None) for a whole dimension."""
    return tuple(slice(None) if a == 0 and b == n else slice(a, b) for a, b, n in zip(start, stop, shape))


def _device_boxes(mesh, spec, shape, uneven):
    """[(device id, index, replica_id)] in mesh order."""
    shape = _shape(shape, "shape")
    got = _ckptio.devices_indices_map(Mesh.of(mesh)._c(), spec_json(spec), list(shape), uneven)
    return [(dev, _index(start, stop, shape), replica) for dev, start, stop, replica in got]


def devices_indices_map(mesh, spec, shape, uneven="reject"):
    """{device id: index} of an array of `shape` laid out as `spec` on `mesh`,
    as jax's NamedSharding(mesh, spec).devices_indices_map(shape) (devices in
    mesh order). uneven="pad" allows dimensions the split does not divide
    (XLA's tiling; docs/sharding.md)."""
    return Mesh.of(mesh).devices_indices_map(spec, shape, uneven)


def match_partition_rules(rules, path, shape, *, min_size=16384, strict=True):
    """The PartitionSpec eformer's rules give a leaf: the first rule whose regex
    re.search-es the path (dots read as "/"), with eformer's strict handling
    of scalars, small leaves (fewer than min_size elements: replicated) and
    over-long specs. InvalidArgument when no rule matches."""
    text, _, _, _ = _ckptio.match_partition_rules(rules_json(rules), str(path), list(_shape(shape, "shape")),
                                                  int(min_size), bool(strict))
    return spec_from_json(text)


def _shape(shape, where):
    try:
        out = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"{where}: {shape!r} is not a shape (a tuple of ints)") from None
    if any(d < 0 for d in out):
        raise errors.InvalidArgument(f"{where}: {out} has a negative dimension")
    return out


def _box(index, shape, where):
    """(start, stop) of a shard's index (a tuple of slices, at most one per
    dimension; missing trailing ones are whole)."""
    if isinstance(index, slice):
        index = (index,)
    if not isinstance(index, (tuple, list)):
        raise errors.InvalidArgument(f"{where}: index {index!r} is not a tuple of slices")
    if len(index) > len(shape):
        raise errors.InvalidArgument(f"{where}: index {tuple(index)} has {len(index)} entries for an array of "
                                     f"rank {len(shape)}")
    start, stop = [], []
    for d, n in enumerate(shape):
        s = index[d] if d < len(index) else slice(None)
        if not isinstance(s, slice):
            raise errors.InvalidArgument(f"{where}: index entry {d} is {s!r}, not a slice (a shard keeps "
                                         "every dimension of the global array)")
        if s.step not in (None, 1):
            raise errors.InvalidArgument(f"{where}: index entry {d} is {s!r}: a shard is a box, not strided")
        a = 0 if s.start is None else s.start
        b = n if s.stop is None else s.stop
        if not (isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) and 0 <= a <= b <= n):
            raise errors.InvalidArgument(f"{where}: index entry {d} is {s!r}, outside [0, {n}] of the global "
                                         f"shape {shape}")
        start.append(int(a))
        stop.append(int(b))
    return start, stop


def _data_shape(data):
    shape = getattr(data, "shape", None)
    return tuple(np.shape(data)) if shape is None else tuple(int(d) for d in shape)


class Shards:
    """A leaf held as shards of a global array, as `jax.Array.addressable_shards`
    presents it.

        ckptio.Shards(global_shape, dtype, [(index, array, replica_id), ...])
        ckptio.Shards.from_jax(x)           # x.shape, x.dtype, x.addressable_shards
        ckptio.Shards.from_mesh(shape, mesh, spec, {device_id: array})

    `index` is a tuple of slices of the global array; entries may also be
    objects with .index, .data and .replica_id (and .device), such as jax's
    Shard. Saving writes the shards with replica_id 0 (each box once across
    processes: in a single process they must cover the array). Restore into a
    sharding returns Shards too, one `Shard(index, data, replica_id, device)`
    per local device, and `.spec`, the PartitionSpec chosen for the leaf.

    dtype: a numpy dtype, a torch dtype or a name ("float32", "bfloat16")."""

    _ckptio_shards = True  # what _leaves.leaf_kind looks for

    def __init__(self, global_shape, dtype, shards, *, spec=None):
        self.shape = _shape(global_shape, "Shards: global_shape")
        self.dtype = _leaves.dtype_name(dtype, "Shards")
        self.spec = spec
        self.shards = [self._entry(s, i) for i, s in enumerate(shards)]

    def _entry(self, s, i):
        where = f"Shards: shard {i}"
        if isinstance(s, tuple):  # (index, data[, replica_id[, device]]); Shard too
            if not 2 <= len(s) <= 4:
                raise errors.InvalidArgument(f"{where}: expected (index, array, replica_id), got {len(s)} items")
            index, data = s[0], s[1]
            replica = s[2] if len(s) > 2 else 0
            device = s[3] if len(s) > 3 else None
        else:
            try:
                index, data = s.index, s.data
            except AttributeError:
                raise errors.InvalidArgument(f"{where}: a {type(s).__name__} is neither (index, array, "
                                             "replica_id) nor an object with .index and .data") from None
            replica = getattr(s, "replica_id", 0)
            device = getattr(s, "device", None)
        if isinstance(replica, bool) or not isinstance(replica, (int, np.integer)) or replica < 0:
            raise errors.InvalidArgument(f"{where}: replica_id {replica!r} is not an int >= 0")
        if device is not None:
            device = _device_id(device, f"{where}: device")
        start, stop = _box(index, self.shape, where)
        extent = tuple(b - a for a, b in zip(start, stop))
        got = _data_shape(data)
        if got != extent:
            raise errors.InvalidArgument(f"{where}: its array has shape {got}, its index "
                                         f"{_index(start, stop, self.shape)} has shape {extent}")
        return Shard(_index(start, stop, self.shape), data, int(replica), device)

    @classmethod
    def _restored(cls, dtype, shape, spec, shards):
        out = cls.__new__(cls)
        out.shape, out.dtype, out.spec, out.shards = shape, dtype, spec, shards
        return out

    @classmethod
    def from_jax(cls, x):
        """The addressable shards of a jax.Array (or anything with .shape,
        .dtype and .addressable_shards)."""
        if isinstance(x, Shards):
            return x
        spec = getattr(getattr(x, "sharding", None), "spec", None)
        return cls(x.shape, x.dtype, x.addressable_shards,
                   spec=None if spec is None else PartitionSpec(*spec))

    @classmethod
    def from_mesh(cls, global_shape, mesh, spec, buffers, dtype=None, *, uneven="reject"):
        """The shards of an array of `global_shape` laid out as `spec` on `mesh`,
        from this process's buffers: {device id: array of that device's box}
        (any subset of the mesh's devices). Each buffer gets its device's index
        and replica_id as JAX's NamedSharding would give them."""
        mesh = Mesh.of(mesh)
        boxes = {dev: (index, replica) for dev, index, replica in _device_boxes(mesh, spec, global_shape, uneven)}
        entries = []
        for dev, data in dict(buffers).items():
            dev = _device_id(dev, "Shards.from_mesh: buffers")
            if dev not in boxes:
                raise errors.InvalidArgument(f"Shards.from_mesh: device {dev} is not in the mesh {mesh!r}")
            index, replica = boxes[dev]
            entries.append(Shard(index, data, replica, dev))
        if dtype is None:
            if not entries:
                raise errors.InvalidArgument("Shards.from_mesh: no buffers, so pass dtype=")
            dtype = _leaves.array_dtype_name(entries[0].data, "Shards.from_mesh")
        return cls(global_shape, dtype, entries, spec=PartitionSpec(*_jsonable_spec_entries(spec)))

    # ---- a sequence of Shard --------------------------------------------------

    def __len__(self):
        return len(self.shards)

    def __iter__(self):
        return iter(self.shards)

    def __getitem__(self, i):
        return self.shards[i]

    @property
    def addressable_shards(self):
        return self.shards

    @property
    def ndim(self):
        return len(self.shape)

    def device_arrays(self):
        """{device id: array}: restored shards by device (devices holding the
        same box share one array's memory)."""
        out = {}
        for s in self.shards:
            if s.device is None:
                raise errors.InvalidArgument("Shards.device_arrays: a shard without a device id")
            out[s.device] = s.data
        return out

    def to_numpy(self):
        """The global array assembled from the shards (any replica); raises
        InvalidArgument if they leave part of it uncovered."""
        if not self.shards:
            if int(np.prod(self.shape)) == 0:  # (a RawArray for bfloat16 / float8 without ml_dtypes, as below)
                carrier = _leaves.numpy_dtype(self.dtype) or _leaves.RAW_CARRIERS[self.dtype]
                return _leaves.as_numpy(self.dtype, np.empty(self.shape, carrier))
            raise errors.InvalidArgument("Shards.to_numpy: no shards")
        first = np.asarray(self.shards[0].data)
        out = np.empty(self.shape, first.dtype)
        seen = np.zeros(self.shape, bool)
        for s in self.shards:
            out[s.index] = np.asarray(s.data)
            seen[s.index] = True
        if not seen.all():
            raise errors.InvalidArgument(f"Shards.to_numpy: the shards hold {int(seen.sum())} of the "
                                         f"{seen.size} elements of the global shape {self.shape}")
        return out if self.dtype in _leaves.NUMPY_DTYPES else _leaves.as_numpy(self.dtype, out)

    def __repr__(self):
        spec = "" if self.spec is None else f", spec={self.spec!r}"
        return f"ckptio.Shards(shape={self.shape}, dtype={self.dtype!r}, {len(self.shards)} shards{spec})"


def _jsonable_spec_entries(spec):
    return [tuple(e) if isinstance(e, list) else e for e in _jsonable(spec, "spec")]


# ---- save and restore (used by CheckpointManager) ------------------------------------

def as_shards(obj):
    """A Shards leaf from a Shards or a duck-typed jax.Array."""
    return obj if isinstance(obj, Shards) else Shards.from_jax(obj)


def save_entry(obj, prefix, path, borrow):
    """The manager's sharded leaf tuple: (prefix, path, dtype, shape,
    [(start, stop, array)]) for the shards with replica_id 0."""
    shards = as_shards(obj)
    name = f"{prefix}/{path}"
    carrier = _leaves.RAW_CARRIERS.get(shards.dtype)
    entries = []
    for i, s in enumerate(shards.shards):
        if s.replica_id != 0:
            continue
        where = f"{name} shard {i}"
        kind = _leaves.leaf_kind(s.data)
        if kind == _leaves.SHARDS and not getattr(type(s.data), "_ckptio_shards", False) \
                and hasattr(s.data, "__array__"):
            kind = _leaves.ARRAY  # jax's Shard.data: an array on one device, which has shards of its own
        if kind is None or kind == _leaves.SHARDS:
            raise errors.InvalidArgument(f"leaf '{where}': a {type(s.data).__name__} is not an array")
        dtype, a = _leaves.leaf_bytes(s.data, kind, where, borrow)
        # Raw bytes in the carrier (uint16 for bfloat16, uint8 for float8)
        # take the leaf's dtype; an array that names another dtype does not
        # (before, float8_e5m2 bytes were saved labelled float8_e4m3fn).
        if dtype != shards.dtype and not (carrier is not None and a.dtype == carrier
                                          and dtype == np.dtype(carrier).name):
            raise errors.InvalidArgument(f"leaf '{where}': the array has dtype {dtype}, the leaf {shards.dtype}")
        start, stop = _box(s.index, shards.shape, f"leaf '{where}'")
        entries.append((start, stop, a))
    return (prefix, path, shards.dtype, list(shards.shape), entries)


def leaf_spec(obj):
    """(dtype name, shape) of a Shards or jax.Array template leaf."""
    if isinstance(obj, Shards):
        return obj.dtype, obj.shape
    return _leaves.dtype_name(obj.dtype, "template"), tuple(int(d) for d in obj.shape)


_SHARDING_KEYS = ("mesh", "rules", "leaves", "devices", "min_size", "strict", "uneven")


def restore_options(sharding):
    """The C++ layer's sharding dict from restore(sharding=...). Entries of
    `leaves` carry no shape: each takes its leaf's shape in the step the
    library restores (with step=None, the newest intact one), and one naming
    a leaf the step lacks is refused there."""
    if not isinstance(sharding, dict):
        raise errors.InvalidArgument("sharding must be a dict(mesh=..., rules=[(regex, spec), ...], "
                                     f"devices=[...]), not a {type(sharding).__name__}")
    unknown = set(sharding) - set(_SHARDING_KEYS)
    if unknown:
        raise errors.InvalidArgument(f"sharding: unknown keys {sorted(unknown)} ({', '.join(_SHARDING_KEYS)})")
    if sharding.get("mesh") is None:
        raise errors.InvalidArgument("sharding: mesh= is required (a dict {\"dp\": 2, \"tp\": 4}, a "
                                     "ckptio.Mesh or a jax Mesh)")
    out = {"mesh": Mesh.of(sharding["mesh"])._c()}
    rules = sharding.get("rules")
    if rules is not None:
        out["rules"] = rules_json(rules)
    leaves = sharding.get("leaves")
    if leaves:
        out["leaves"] = []
        for key, spec in dict(leaves).items():
            if isinstance(key, tuple) and len(key) == 2:
                pfx, path = key
            elif isinstance(key, str) and "/" in key:
                pfx, path = key.split("/", 1)
            else:
                raise errors.InvalidArgument(f"sharding leaves: key {key!r} is not \"prefix/path\" or "
                                             "(prefix, path)")
            out["leaves"].append((pfx, path, spec_json(spec, f"sharding leaves[{key!r}]")))
    devices = sharding.get("devices")
    if devices is not None:
        out["devices"] = [_device_id(d, "sharding devices") for d in devices]
    for key in ("min_size", "strict", "uneven"):
        if sharding.get(key) is not None:
            out[key] = sharding[key]
    return out


def restored_leaf(kind, dtype, shape, payload):
    """What restore into a sharding gives for one leaf: a Shards (one Shard
    per local device, in mesh order), or for a leaf saved as a Python or
    numpy scalar, that scalar (every device holds the same one)."""
    spec, entries = payload
    shape = tuple(shape)
    if kind not in (_leaves.ARRAY, _leaves.TENSOR, _leaves.SHARDS) and shape == () and entries:
        return _leaves.as_kind(kind, dtype, entries[0][4])
    shards = [Shard(_index(start, stop, shape), _leaves.as_numpy(dtype, a), replica, dev)
              for dev, start, stop, replica, a in entries]
    return Shards._restored(dtype, shape, spec_from_json(spec), shards)
