"""Sharded state, shaped as JAX presents it: ckptio.Shards on save (what
jax.Array.addressable_shards yields), restore(sharding=...) into other
meshes, eformer rules, replicas written once, the C++ errors, a duck-typed
jax.Array, and a save by two processes.

JAX is not installed here: the shards a jax.Array of a mesh would hold are
computed below by a small model of JAX's rule (sharding.h's comment), written
independently of the library's devices_indices_map so that each checks the other.
"""

import glob
import itertools
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import ckptio
from ckptio import PartitionSpec as P
from conftest import kill_leftovers

SHAPE = (16, 24)


# ---- a model of JAX ---------------------------------------------------------------------

def jax_indices(axes, spec, shape):
    """[(device, index, replica_id)] in mesh order, as NamedSharding(Mesh(arange(N)
    .reshape(sizes), names), spec).devices_indices_map(shape) and
    jax's replica ids give them (devices 0..N-1)."""
    names, sizes = list(axes), list(axes.values())
    spec = list(spec) + [None] * (len(shape) - len(spec))
    out, seen = [], {}
    for pos, coords in enumerate(itertools.product(*[range(s) for s in sizes])):
        index = []
        for dim, entry in zip(shape, spec):
            group = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
            n, c = 1, 0
            for a in group:
                k = names.index(a)
                n, c = n * sizes[k], c * sizes[k] + coords[k]
            index.append(slice(None) if n == 1 else slice(c * dim // n, (c + 1) * dim // n))
        key = tuple((s.start, s.stop) for s in index)
        replica = seen.get(key, 0)
        seen[key] = replica + 1
        out.append((pos, tuple(index), replica))
    return out


class FakeDevice:
    def __init__(self, id):
        self.id = id

    def __repr__(self):
        return f"FakeDevice(id={self.id})"


class FakeShard:
    """jax.Shard: .device, .index, .replica_id, .data."""
    def __init__(self, device, index, replica_id, data):
        self.device, self.index, self.replica_id, self.data = device, index, replica_id, data


class FakeDeviceArray:
    """What jax.Shard.data is: a jax.Array on one device, which has shards
    (itself), a shape and a dtype like any jax.Array, and reads through
    __array__."""
    def __init__(self, data):
        self._data = data
        self.shape, self.dtype = data.shape, data.dtype
        self.addressable_shards = [FakeShard(FakeDevice(0), tuple(slice(None) for _ in data.shape), 0, self)]

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)


class FakeNamedSharding:
    def __init__(self, mesh, spec):
        self.mesh, self.spec = mesh, spec


class FakeMesh:
    """jax.sharding.Mesh: .axis_names and .devices (an array of devices)."""
    def __init__(self, axes):
        self.axis_names = tuple(axes)
        n = int(np.prod(list(axes.values())))
        self.devices = np.array([FakeDevice(i) for i in range(n)], dtype=object).reshape(tuple(axes.values()))


class FakeArray:
    """A jax.Array of `global_array` laid out on a mesh of devices 0..N-1; only
    the devices in `local` are addressable. Its data is never gathered."""
    def __init__(self, global_array, axes, spec, local=None):
        self.shape, self.dtype = global_array.shape, global_array.dtype
        self.sharding = FakeNamedSharding(FakeMesh(axes), P(*spec))
        self.addressable_shards = [
            FakeShard(FakeDevice(d), index, replica, FakeDeviceArray(global_array[index].copy()))
            for d, index, replica in jax_indices(axes, spec, global_array.shape)
            if local is None or d in local]

    def __array__(self, *args, **kwargs):
        raise AssertionError("a sharded array must not be gathered by np.asarray")


def shards_of(global_array, axes, spec, local=None, *, replica_fill=None):
    """ckptio.Shards from (index, array, replica_id) tuples, JAX's way. With
    replica_fill, replicas (replica_id > 0) hold that value instead of the data:
    they must never be written."""
    entries = []
    for d, index, replica in jax_indices(axes, spec, global_array.shape):
        if local is not None and d not in local:
            continue
        data = global_array[index].copy()
        if replica and replica_fill is not None:
            data[...] = replica_fill
        entries.append((index, data, replica))
    return ckptio.Shards(global_array.shape, global_array.dtype, entries)


def global_arrays():
    rng = np.random.default_rng(28)
    return {"w": rng.standard_normal(SHAPE).astype(np.float32),
            "e": rng.integers(-2**40, 2**40, size=(SHAPE[1],), dtype=np.int64),
            "b": rng.standard_normal((4, 6)).astype(np.float64)}


def assert_shards(got, want, n_devices, spec=None):
    """got: a restored Shards; each device's array is bit-exact the slice of `want`."""
    assert isinstance(got, ckptio.Shards)
    assert got.shape == want.shape and got.dtype == want.dtype.name
    assert len(got) == n_devices
    assert [s.device for s in got] == sorted(s.device for s in got)
    for s in got:
        assert isinstance(s.data, np.ndarray) and s.data.dtype == want.dtype
        assert s.data.tobytes() == np.ascontiguousarray(want[s.index]).tobytes()
    if spec is not None:
        assert got.spec == spec
    assert got.to_numpy().tobytes() == want.tobytes()


# ---- the model against the library ---------------------------------------------------------

@pytest.mark.parametrize("spec", [P(), P("dp"), P(None, "tp"), P("dp", "tp"), P(("dp", "tp")),
                                  P(("tp", "dp")), P("tp", "dp")])
def test_devices_indices_map_matches_jax(spec):
    axes = {"dp": 2, "tp": 4}
    want = {d: index for d, index, _ in jax_indices(axes, spec, SHAPE)}
    assert ckptio.devices_indices_map(axes, spec, SHAPE) == want
    shards = ckptio.Shards.from_mesh(SHAPE, axes, spec, {d: np.zeros(SHAPE, np.float32)[i] for d, i in want.items()})
    assert [(s.device, s.replica_id) for s in shards] == [(d, r) for d, _, r in jax_indices(axes, spec, SHAPE)]


def test_mesh_forms():
    m = ckptio.Mesh({"dp": 2, "tp": 4})
    assert m.axes == {"dp": 2, "tp": 4} and m.device_ids == list(range(8))
    assert ckptio.Mesh("dp=2,tp=4") == m == ckptio.Mesh([("dp", 2), ("tp", 4)])
    assert ckptio.Mesh.of(FakeMesh({"dp": 2, "tp": 4})) == m
    r = ckptio.Mesh({"dp": 2}, devices=[FakeDevice(5), FakeDevice(3)])
    assert r.device_ids == [5, 3]
    assert ckptio.devices_indices_map(r, P("dp"), (4,)) == {5: (slice(0, 2),), 3: (slice(2, 4),)}
    with pytest.raises(ckptio.InvalidArgument):
        ckptio.Mesh({"dp": 0})
    with pytest.raises(ckptio.InvalidArgument):
        ckptio.Mesh({"dp": 2}, devices=[1, 1])
    assert ckptio.match_partition_rules([("attn/.*/kernel", P("dp", "tp")), (".*", P())],
                                        "layers.0.attn.q.kernel", (64, 128)) == P()  # small: replicated
    assert ckptio.match_partition_rules([("attn/.*/kernel", P("dp", "tp")), (".*", P())],
                                        "layers.0.attn.q.kernel", (64, 128), min_size=0) == P("dp", "tp")


# ---- save from a 2x4 mesh, restore elsewhere -----------------------------------------------

RULES = [(r"^w$", P("dp", "tp")), (r"^e$", P("tp")), (".*", P())]
TARGETS = [  # (mesh, rules, expected spec of w)
    ({"a": 1, "b": 2}, [(".*", P("b"))], P("b")),
    ({"dp": 4, "tp": 1}, [("w", P("dp", "tp")), ("e", P(None)), (".*", P("dp"))], P("dp", "tp")),
    ({"dp": 2, "tp": 4}, [(".*", P())], P()),                      # replicated on 8 devices
    ({"x": 2, "y": 2}, [("w", P(None, ("y", "x"))), (".*", P())], P(None, ("y", "x"))),
]


@pytest.mark.parametrize("staging", ["copy", "borrow"])
def test_save_2x4_restore_into_other_meshes(ckpt_dir, staging):
    g = global_arrays()
    axes = {"dp": 2, "tp": 4}
    state = {"params": {"w": shards_of(g["w"], axes, P("dp", "tp")),
                        "e": shards_of(g["e"], axes, P("tp")),       # replicated over dp
                        "b": shards_of(g["b"], axes, P())},          # replicated 8 times
             "step": 7}
    with ckptio.CheckpointManager(ckpt_dir, staging=staging) as mgr:
        h = mgr.save(1, state)
        stats = h.wait()
        assert h.released()
        payload = sum(a.nbytes for a in g.values()) + 8  # each box once, plus the step
        if staging == "copy":
            assert stats.bytes == payload
        else:  # borrow mode may pad between shards for alignment
            assert payload <= stats.bytes < payload + 16 * 4096
        info = {leaf.path: leaf for leaf in mgr.leaves(1)}
        assert (info["w"].shards, info["e"].shards, info["b"].shards) == (8, 4, 1)

        whole = mgr.restore(1)  # no sharding: global numpy arrays
        for k in g:
            assert whole["params"][k].tobytes() == g[k].tobytes()
        assert whole["step"] == 7

        for mesh, rules, w_spec in TARGETS:
            out = mgr.restore(1, sharding=dict(mesh=mesh, rules=rules, min_size=0))
            n = int(np.prod(list(mesh.values())))
            assert_shards(out["params"]["w"], g["w"], n, w_spec)
            assert_shards(out["params"]["e"], g["e"], n)
            assert_shards(out["params"]["b"], g["b"], n)
            assert out["step"] == 7  # saved as a Python int: every device holds it; it comes back as itself

        # Only some devices are this process's: just theirs come back.
        out = mgr.restore(1, sharding=dict(mesh=ckptio.Mesh(axes), rules=RULES, min_size=0, devices=[6, 1]))
        w = out["params"]["w"]
        assert [s.device for s in w] == [1, 6] and w.spec == P("dp", "tp")
        assert w.device_arrays()[6].tobytes() == g["w"][8:16, 12:18].tobytes()
        assert [s.replica_id for s in out["params"]["e"]] == [0, 1]  # device 6 holds e[12:18] again

        # eformer's min_size (16384 elements by default): these small leaves stay whole on every device.
        out = mgr.restore(1, sharding=dict(mesh=axes, rules=RULES))
        assert all(s.index == (slice(None), slice(None)) for s in out["params"]["w"])
        assert out["params"]["w"].spec == P()


def test_restored_shards_save_again(ckpt_dir):
    """A sharded restore's Shards carry JAX's replica ids: saving them writes each box once."""
    g = global_arrays()
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"params": {k: shards_of(v, {"dp": 8}, P("dp") if v.ndim == 2 else P())
                                for k, v in g.items()}}).wait()
        out = mgr.restore(1, sharding=dict(mesh={"dp": 2, "tp": 2}, rules=[(".*", P("tp"))], min_size=0))
        assert [s.replica_id for s in out["params"]["w"]] == [0, 0, 1, 1]
        stats = mgr.save(2, out).wait()
        assert stats.bytes == sum(a.nbytes for a in g.values())
        again = mgr.restore(2)
        for k in g:
            assert again["params"][k].tobytes() == g[k].tobytes()


def test_replicas_are_not_written(ckpt_dir):
    """Replicas (replica_id > 0) hold garbage here: a restore that returns the data
    proves they were never written, and the byte count that nothing is written twice."""
    g = global_arrays()
    axes = {"dp": 2, "tp": 4}
    state = {"params": {"w": shards_of(g["w"], axes, P("dp"), replica_fill=-1.0),
                        "b": shards_of(g["b"], axes, P(), replica_fill=np.nan)}}
    assert sum(1 for s in state["params"]["w"] if s.replica_id) == 6
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        stats = mgr.save(1, state).wait()
        assert stats.bytes <= g["w"].nbytes + g["b"].nbytes + 2 * 4096  # borrow mode may pad for alignment
        assert [(leaf.path, leaf.shards) for leaf in mgr.leaves(1)] == [("w", 2), ("b", 1)]
        out = mgr.restore(1)
        assert out["params"]["w"].tobytes() == g["w"].tobytes()
        assert out["params"]["b"].tobytes() == g["b"].tobytes()
    assert stats.bytes >= g["w"].nbytes + g["b"].nbytes


def test_shards_must_cover_once_in_one_process(ckpt_dir):
    g = global_arrays()["w"]
    entries = [(index, g[index], replica) for _, index, replica in jax_indices({"dp": 2, "tp": 4}, P("dp", "tp"), SHAPE)]
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        with pytest.raises(ckptio.InvalidArgument, match="shards do not cover the whole shape"):
            mgr.save(1, {"p": {"w": ckptio.Shards(SHAPE, "float32", entries[:-1])}})
        with pytest.raises(ckptio.InvalidArgument, match="overlap"):
            mgr.save(1, {"p": {"w": ckptio.Shards(SHAPE, "float32", entries + [(entries[0][0], g[entries[0][0]], 0)])}})
        with pytest.raises(ckptio.InvalidArgument, match="the array has dtype float64, the leaf float32"):
            mgr.save(1, {"p": {"w": ckptio.Shards(SHAPE, np.float32, [(e[0], e[1].astype(np.float64), e[2])
                                                                       for e in entries])}})
        assert mgr.all_steps() == []


def test_bad_shards():
    a = np.zeros((4, 6), np.float32)
    with pytest.raises(ckptio.InvalidArgument, match=r"its array has shape \(4, 6\), its index .* has shape \(2, 6\)"):
        ckptio.Shards((8, 6), "float32", [((slice(0, 2),), a, 0)])
    with pytest.raises(ckptio.InvalidArgument, match="not strided"):
        ckptio.Shards((8, 6), "float32", [((slice(0, 8, 2),), a, 0)])
    with pytest.raises(ckptio.InvalidArgument, match="outside"):
        ckptio.Shards((8, 6), "float32", [((slice(6, 10),), a, 0)])
    with pytest.raises(ckptio.InvalidArgument, match="not a slice"):
        ckptio.Shards((8, 6), "float32", [((0,), a[0], 0)])
    with pytest.raises(ckptio.InvalidArgument, match="replica_id"):
        ckptio.Shards((4, 6), "float32", [((slice(None),), a, -1)])
    with pytest.raises(ckptio.InvalidArgument, match="is not one a checkpoint holds"):
        ckptio.Shards((4, 6), object, [])
    with pytest.raises(ckptio.InvalidArgument, match=r"neither \(index, array, replica_id\)"):
        ckptio.Shards((4, 6), "float32", [a])


# ---- errors: the C++ messages -------------------------------------------------------------

@pytest.mark.parametrize("sharding, message", [
    (dict(mesh={"dp": 2}, rules=[(".*", P("tp"))], min_size=0),
     r"^p/w into PartitionSpec\('tp'\): PartitionSpec\('tp'\) names axis 'tp' \(dimension 0\), which mesh "
     r"\{dp=2\} does not have$"),
    (dict(mesh={"dp": 2}, rules=[(".*", P("dp", "dp"))], min_size=0), "uses mesh axis 'dp' more than once"),
    (dict(mesh={"dp": 2}, rules=[("(", P())]), r'^rules\[0\]: regex "\(" is not valid for RE2'),
    (dict(mesh={"dp": 2}, rules=[("(?=w)", P())]), r"^rules\[0\]: .*lookahead .* is not supported by RE2"),
    (dict(mesh={"dp": 2}, rules=[(".*", P(3))]),
     r"^rules\[0\]\[1\]\[0\]: expected null, an axis name or an array of axis names, got number$"),
    (dict(mesh={"dp": 2}, rules=[(".*", [["dp", 1]])]), r"^rules\[0\]\[1\]\[0\]\[1\]: expected an axis name"),
    (dict(mesh={"dp": 2}, rules=[(".*", (object(),))]), r"^rules\[0\]\[1\]\[0\]: <object .*> is not None"),
    (dict(mesh={"dp": 2}, rules=[("^nothing$", P())]), r"^p/w: no partition rule matches leaf 'w' \(as 'w'\)"),
    (dict(mesh={"dp": 2}, rules=[(".*", P(None, None, "dp"))], strict=False),
     r"has 3 entries, more than the rank 2 of shape \[4, 8\]"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], devices=[9]), "device 9 is not in the mesh dp=2"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], devices=[1, 1]), "device 1 is listed twice"),
    (dict(mesh={"dp": 3}, rules=[(".*", P("dp"))], uneven="reject", min_size=0),
     r"dimension 0 of size 4 is split 3 ways, which does not divide it"),
    (dict(mesh={"dp": 2, "": 2}, rules=[(".*", P())]), "^mesh axis 1 has an empty name$"),
    (dict(mesh={"dp": 2}, rules=[(".*", "dp")]), r"^rules\[0\]\[1\]: expected a PartitionSpec as an array"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], uneven="sometimes"), 'uneven must be "pad" or "reject"'),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], leaves={"p/nope": P()}), "names p/nope, which step 1 does not have"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], leaves={"p/w": P("x")}), "names axis 'x'"),
    (dict(rules=[(".*", P())]), "mesh= is required"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], uneven=1), "sharding uneven"),
    (dict(mesh={"dp": 2}, rules=[(".*", P())], strict="no"), "sharding strict"),
    (dict(mesh={"dp": 2}, rule=[]), "unknown keys"),
])
def test_bad_sharding_raises_the_library_error(ckpt_dir, sharding, message):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"w": np.zeros((4, 8), np.float32)}}).wait()
        with pytest.raises(ckptio.Error, match=message) as e:
            mgr.restore(1, sharding=sharding)
        assert isinstance(e.value, (ckptio.InvalidArgument, ckptio.NotFound)), repr(e.value)


def test_error_messages_are_the_library_s(ckpt_dir):
    """The exact texts the C++ API gives (the CLI's --rules and --mesh say the same)."""
    with pytest.raises(ckptio.InvalidArgument) as e:
        ckptio.match_partition_rules([(".*", P(3))], "w", (4,))
    assert str(e.value).startswith("rules[0][1][0]: ")
    with pytest.raises(ckptio.InvalidArgument) as e:
        ckptio.match_partition_rules([("^x", P())], "a.b", (4,))
    assert str(e.value).startswith("no partition rule matches leaf 'a.b' (as 'a/b')")
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"w": np.zeros((4, 8), np.float32)}}).wait()
        with pytest.raises(ckptio.InvalidArgument) as e:
            mgr.restore(1, sharding=dict(mesh={"dp": 2}, rules=[(".*", P())], devices=[9]))
        assert str(e.value) == "restore into a sharding: device 9 is not in the mesh dp=2"
        with pytest.raises(ckptio.InvalidArgument, match="exclude each other"):
            mgr.restore(1, sharding=dict(mesh={"dp": 2}, rules=[(".*", P())]), into={"p": {"w": np.zeros((4, 8))}})


# ---- JAX's objects, duck-typed ------------------------------------------------------------

def test_duck_typed_jax_arrays(ckpt_dir):
    g = global_arrays()
    axes = {"dp": 2, "tp": 4}
    x = FakeArray(g["w"], axes, ("dp", "tp"))
    e = FakeArray(g["e"], axes, ("tp",))
    assert ckptio.Shards.from_jax(x).spec == P("dp", "tp")
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        # A jax.Array is a leaf as it is, as Shards.from_jax, or as its shards.
        mgr.save(1, {"params": {"w": x, "e": ckptio.Shards.from_jax(e),
                                "w2": ckptio.Shards(x.shape, x.dtype, x.addressable_shards)}}).wait()
        mesh = FakeMesh({"dp": 4, "tp": 2})
        local = [d for d in mesh.devices.flat if d.id % 2 == 0]
        out = mgr.restore(1, sharding=dict(mesh=mesh, rules=[("w", P("dp", "tp")), (".*", P("tp"))],
                                           devices=local, min_size=0))
        for k in ("w", "w2"):
            got = out["params"][k]
            assert [s.device for s in got] == [0, 2, 4, 6]
            for s in got:
                assert s.data.tobytes() == np.ascontiguousarray(g["w"][s.index]).tobytes()
        assert [s.index for s in out["params"]["e"]] == [(slice(0, 12),)] * 4
        # like= holding jax.Arrays: checked by their shape and dtype, returned as numpy arrays.
        whole = mgr.restore(1, like={"params": {"w": x, "e": e, "w2": x}})
        assert whole["params"]["w"].tobytes() == g["w"].tobytes()
        with pytest.raises(ckptio.FailedPrecondition, match="does not match the template"):
            mgr.restore(1, like={"params": {"w": e, "e": e, "w2": x}})


def test_bfloat16_shards_without_ml_dtypes(ckpt_dir):
    bits = np.arange(64, dtype=np.uint16).reshape(8, 8)
    entries = [((slice(0, 4),), ckptio.raw_array(bits[:4], "bfloat16"), 0), ((slice(4, 8),), bits[4:], 0)]
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"h": ckptio.Shards((8, 8), "bfloat16", entries)}}).wait()
        assert [leaf.dtype for leaf in mgr.leaves(1)] == ["bfloat16"]
        h = mgr.restore(1, sharding=dict(mesh={"dp": 2}, rules=[(".*", P(None, "dp"))], min_size=0))["p"]["h"]
    assert h.dtype == "bfloat16"
    for s in h:
        assert getattr(s.data, "ckptio_dtype", "bfloat16") == "bfloat16"
        assert s.data.view(np.uint16).tobytes() == np.ascontiguousarray(bits[s.index]).tobytes()
    assert h.to_numpy().view(np.uint16).tobytes() == bits.tobytes()


def test_shards_refuse_an_array_labelled_with_another_raw_dtype(ckpt_dir):
    """float8_e5m2 bytes in a float8_e4m3fn leaf were saved under the leaf's
    name (the values reinterpreted); raw carrier bytes (uint8) still are."""
    raw = ckptio.raw_array(np.array([0x3C, 0x40, 0, 0], np.uint8), "float8_e5m2")
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        with pytest.raises(ckptio.InvalidArgument, match="float8_e5m2"):
            mgr.save(1, {"p": {"f": ckptio.Shards((4,), "float8_e4m3fn", [((slice(None),), raw, 0)])}})
        plain = np.array([0x3C, 0x40, 0, 0], np.uint8)
        mgr.save(2, {"p": {"f": ckptio.Shards((4,), "float8_e4m3fn", [((slice(None),), plain, 0)])}}).wait()
        assert [leaf.dtype for leaf in mgr.leaves(2)] == ["float8_e4m3fn"]
    empty = ckptio.Shards((0,), "bfloat16", []).to_numpy()  # keeps its dtype name without ml_dtypes too
    assert empty.shape == (0,)
    assert getattr(empty, "ckptio_dtype", str(empty.dtype)) == "bfloat16"


def test_torch_tensor_shards(ckpt_dir):
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        mgr.save(1, {"p": {"t": ckptio.Shards((6, 4), torch.float32, [((slice(0, 3),), t[:3], 0),
                                                                       ((slice(3, 6),), t[3:], 0)])}}).wait()
        out = mgr.restore(1, sharding=dict(mesh={"dp": 2}, rules=[(".*", P(None, "dp"))], min_size=0))
    assert out["p"]["t"].to_numpy().tobytes() == t.numpy().tobytes()


# ---- two processes ------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[4])
    import ckptio
    import test_sharded as t
    P = ckptio.PartitionSpec
    uri, index, run_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    g = t.global_arrays()
    axes = {"dp": 2, "tp": 4}
    local = range(4 * index, 4 * index + 4)       # process i holds devices 4i .. 4i+3, as jax would
    state = {"params": {"w": t.FakeArray(g["w"], axes, ("dp", "tp"), local),   # half each
                        "e": t.shards_of(g["e"], axes, P("tp"), local),        # process 0 writes it all
                        "b": t.shards_of(g["b"], axes, P(), local)}}           # process 0 writes it
    with ckptio.CheckpointManager(uri, processes=dict(index=index, count=2, run_id=run_id,
                                                      timeout_seconds=60)) as mgr:
        stats = mgr.save(5, state).wait()
    print(stats.bytes)
""")


def test_two_processes_save_one_restores(ckpt_dir):
    g = global_arrays()
    run_id = f"py-{uuid.uuid4().hex[:10]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    here = os.path.dirname(os.path.abspath(__file__))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, ckpt_dir, str(i), run_id, here], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        kill_leftovers(procs)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    written = [int(out.split()[-1]) for out, _ in outs]
    assert written[1] == g["w"].nbytes // 2  # w's half; its replicas of e and b stay unwritten
    assert sum(written) == sum(a.nbytes for a in g.values())
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        assert mgr.all_steps() == [5]
        whole = mgr.restore()
        for k in g:
            assert whole["params"][k].tobytes() == g[k].tobytes()
        out = mgr.restore(sharding=dict(mesh={"dp": 4, "tp": 1}, rules=[("w", P("dp", "tp")), (".*", P())],
                                        min_size=0))
        assert_shards(out["params"]["w"], g["w"], 4, P("dp", "tp"))
        assert_shards(out["params"]["e"], g["e"], 4, P())


def test_leaves_override_rules_and_select(ckpt_dir):
    g = global_arrays()
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"params": {k: v for k, v in g.items()}, "opt": {"w": g["w"]}}).wait()
        out = mgr.restore(sharding=dict(mesh={"dp": 2, "tp": 3}, rules=[(".*", P("dp"))], min_size=0,
                                        leaves={"params/w": P(None, "tp"), ("opt", "w"): P("tp", "dp")}),
                          select=["params", "opt"])
        assert out["params"]["w"].spec == P(None, "tp") and out["opt"]["w"].spec == P("tp", "dp")
        assert out["params"]["e"].spec == P("dp")
        assert_shards(out["params"]["w"], g["w"], 6)
        assert_shards(out["opt"]["w"], g["w"], 6)
        out = mgr.restore(select="^e$", sharding=dict(mesh={"dp": 5}, rules=[(".*", P("dp"))], min_size=0))
        assert list(out) == ["params"] and list(out["params"]) == ["e"]
        e = out["params"]["e"]  # 24 over 5 devices: XLA's padded tiles (uneven="pad", the default)
        assert [s.index for s in e] == [(slice(0, 5),), (slice(5, 10),), (slice(10, 15),), (slice(15, 20),),
                                        (slice(20, 24),)]
        assert_shards(e, g["e"], 5)


def test_leaves_take_their_shapes_from_the_step_restore_latest_restores(ckpt_dir):
    """Restore-latest with leaves= moves past a damaged newest step whose leaf
    has another shape: the spec applies to the shape of the step restored
    (before, the shapes came from the newest step's index, and the restore
    of the older step was refused for a shape mismatch)."""
    old = np.arange(24, dtype=np.float32).reshape(4, 6)
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"w": old}}).wait()
        mgr.save(2, {"p": {"w": np.ones((8, 6), np.float32)}}).wait()
    (data,) = glob.glob(os.path.join(ckpt_dir, "run-2", "data-*.bin"))
    with open(data, "r+b") as f:  # one byte of step 2's leaf flipped: its checksum fails
        f.seek(8)
        byte = f.read(1)
        f.seek(8)
        f.write(bytes([byte[0] ^ 0xFF]))
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        tree, info = mgr.restore(sharding=dict(mesh={"dp": 2}, rules=[(".*", P())], min_size=0,
                                               leaves={"p/w": P("dp")}), info=True)
        assert info.step == 1 and [s for s, _ in info.skipped] == [2]
        assert_shards(tree["p"]["w"], old, 2, P("dp"))
