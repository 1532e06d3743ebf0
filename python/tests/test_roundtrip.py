"""Save then restore gives back the same bytes, dtypes, shapes and tree."""

import gc
import weakref

import numpy as np
import pytest

import ckptio

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (2, 3, 4, 5), (1000, 257)]


def random_array(rng, dtype, shape):
    """Arbitrary bit patterns (NaN payloads, signed zeros, subnormals) for floats."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = rng.integers(0, 256, size=n, dtype=np.uint8)
    if dt == np.bool_:
        raw &= 1
    return raw.view(dt).reshape(shape)


def assert_bit_exact(a, b):
    assert isinstance(b, np.ndarray)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("staging", ["copy", "borrow"])
def test_every_dtype_and_shape_bit_exact(ckpt_dir, staging):
    rng = np.random.default_rng(1)
    state = {"model": {f"{d}": {f"s{i}": random_array(rng, d, s) for i, s in enumerate(SHAPES)}
                       for d in NUMPY_DTYPES}}
    with ckptio.CheckpointManager(ckpt_dir, staging=staging) as mgr:
        mgr.save(3, state).wait()
        out = mgr.restore(3)
    for d in NUMPY_DTYPES:
        for i, _ in enumerate(SHAPES):
            assert_bit_exact(state["model"][d][f"s{i}"], out["model"][d][f"s{i}"])


def test_tree_structure_and_scalars_come_back_as_saved(ckpt_dir):
    state = {
        "params": {"layers": [{"w": np.arange(6.0).reshape(2, 3)}, {"w": np.ones((2, 3))}],
                   "pair": (np.int32(7), np.zeros(2, np.float16))},
        "opt": {"state": {0: {"step": 3, "exp_avg": np.full(4, 0.5)}},
                "groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "amsgrad": False, "foreach": None,
                            "name": "default", "c": 1 + 2j}]},
    }
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, state, {"data_pos": 1234}).wait()
        out = mgr.restore(1)
        assert mgr.metadata(1) == {"data_pos": 1234}
        names = {(leaf.prefix, leaf.path) for leaf in mgr.leaves(1)}
    # eformer's key paths: keys and indices joined with "."; dict keys keep their type on restore.
    assert ("params", "layers.1.w") in names and ("opt", "state.0.exp_avg") in names
    assert ("opt", "groups.0.betas.1") in names
    assert list(out["opt"]["state"].keys()) == [0]
    assert out["opt"]["state"][0]["step"] == 3 and type(out["opt"]["state"][0]["step"]) is int
    g = out["opt"]["groups"][0]
    assert g["lr"] == 1e-3 and type(g["lr"]) is float
    assert g["betas"] == (0.9, 0.999) and type(g["betas"]) is tuple
    assert g["amsgrad"] is False and g["foreach"] is None and g["name"] == "default" and g["c"] == 1 + 2j
    assert type(out["params"]["pair"]) is tuple
    assert out["params"]["pair"][0] == np.int32(7) and type(out["params"]["pair"][0]) is np.int32
    np.testing.assert_array_equal(out["params"]["layers"][0]["w"], state["params"]["layers"][0]["w"])


def test_single_prefix_and_top_level_leaf(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"a": {"b": np.ones(2)}, "c": 4}, prefix="state").wait()
        assert sorted((l.prefix, l.path) for l in mgr.leaves(1)) == [("state", "a.b"), ("state", "c")]
        assert mgr.restore(1)["c"] == 4
        mgr.save(2, {"model": {"w": np.ones(2)}, "step": 9}).wait()
        assert ("step", "value") in {(l.prefix, l.path) for l in mgr.leaves(2)}
        assert mgr.restore(2)["step"] == 9


def test_buffer_protocol_and_array_like_leaves(ckpt_dir):
    import array

    class ArrayLike:
        def __array__(self, dtype=None):
            return np.arange(4, dtype=np.int16)

    state = {"m": {"bytes": bytearray(b"abc"), "arr": array.array("i", [1, 2, 3]), "like": ArrayLike()}}
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, state).wait()
        out = mgr.restore(1)
    assert out["m"]["bytes"].tobytes() == b"abc"
    np.testing.assert_array_equal(out["m"]["arr"], np.array([1, 2, 3], dtype=np.int32))
    np.testing.assert_array_equal(out["m"]["like"], np.arange(4, dtype=np.int16))


def test_non_contiguous_and_byte_swapped_arrays_in_copy_mode(ckpt_dir):
    a = np.arange(20.0).reshape(4, 5)
    big = np.arange(5, dtype=">i4")
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"t": a.T, "s": a[:, ::2], "big": big}}).wait()
        out = mgr.restore(1)
    np.testing.assert_array_equal(out["m"]["t"], a.T)
    np.testing.assert_array_equal(out["m"]["s"], a[:, ::2])
    assert out["m"]["big"].dtype == np.dtype("int32") and list(out["m"]["big"]) == [0, 1, 2, 3, 4]


def test_restore_latest_select_and_like(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        assert mgr.latest_step() is None and mgr.all_steps() == []
        for step in (10, 20, 30):
            mgr.save(step, {"model": {"w": np.full(3, step, np.float32), "b": np.zeros(2)},
                            "tx": {"count": np.int64(step)}})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [10, 20, 30] and mgr.latest_step() == 30
        out, info = mgr.restore(info=True)
        assert info.step == 30 and out["tx"]["count"] == 30
        only_model = mgr.restore(20, select=["model"])
        assert set(only_model) == {"model"} and only_model["model"]["w"][0] == 20
        only_w = mgr.restore(20, select=r"^w$")
        assert only_w == {"model": {"w": only_w["model"]["w"]}}
        like = {"model": {"w": np.zeros(3, np.float32), "b": np.zeros(2)}, "tx": {"count": np.int64(0)}}
        got = mgr.restore(10, like=like)
        assert got["model"]["w"].dtype == np.float32 and got["tx"]["count"] == 10


def test_template_mismatches_listed_in_one_error(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.int32),
                           "c": np.zeros(1)}}).wait()
        like = {"m": {"a": np.zeros((3, 3), np.float32), "b": np.zeros(4, np.int64), "d": np.zeros(1)}}
        with pytest.raises(ckptio.Error) as e:
            mgr.restore(1, like=like)
    msg = str(e.value)
    for part in ("m/a", "[2, 3]", "m/b", "int64", "m/c", "m/d"):
        assert part in msg, msg


def test_allow_cast_to_the_template_dtype(ckpt_dir):
    w = np.linspace(-1, 1, 11, dtype=np.float32)
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": w}}).wait()
        got = mgr.restore(1, like={"m": {"w": np.zeros(11, np.float64)}}, allow_cast=True)
    assert got["m"]["w"].dtype == np.float64
    np.testing.assert_array_equal(got["m"]["w"], w.astype(np.float64))


def test_restore_into_fills_the_callers_arrays(ckpt_dir):
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": w, "n": np.arange(5)}}).wait()
        into = {"m": {"w": np.empty_like(w), "n": np.empty(5, np.int64)}}
        out = mgr.restore(1, into=into)
        assert out["m"]["w"] is into["m"]["w"] and out["m"]["n"] is into["m"]["n"]
        np.testing.assert_array_equal(into["m"]["w"], w)
        np.testing.assert_array_equal(into["m"]["n"], np.arange(5))
        ro = np.empty_like(w)
        ro.flags.writeable = False
        with pytest.raises(ckptio.InvalidArgument, match="read-only"):
            mgr.restore(1, into={"m": {"w": ro, "n": np.empty(5, np.int64)}})


def _anon_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    pytest.skip("SKIPPED: no RssAnon in /proc/self/status")


def test_arrays_are_freed_when_dropped_and_their_memory_goes_back(ckpt_dir):
    # A training loop that saves and restores again and again must not grow.
    # The tree walkers were recursive closures, a reference cycle that kept
    # the caller's arrays after a save and every restored array after the
    # caller dropped it, until the garbage collector happened to run (each
    # restore of 56 MiB added 56 MiB). Restored arrays view the restore's own
    # buffers; from 1 MiB up those are mappings of their own, so the memory
    # goes back to the system with the last array.
    state = {"big": np.full(24 << 20, 7, np.uint8),
             "small": [np.full(4 << 20, i, np.uint8) for i in range(8)]}
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        gc.disable()
        try:
            mgr.save(1, state).wait()
            saved = weakref.ref(state["big"])
            del state
            assert saved() is None, "the caller's array outlived the save"
            out = mgr.restore(1)
            restored = weakref.ref(out["big"])
            del out
            assert restored() is None, "a restored array outlived the tree it was returned in"
            before = _anon_rss_bytes()
            out = mgr.restore(1)
            assert int(out["small"][7][-1]) == 7
            assert _anon_rss_bytes() - before >= 48 << 20  # the 56 MiB restored, resident
            del out
            assert _anon_rss_bytes() - before < 8 << 20, "dropped arrays still resident"
        finally:
            gc.enable()


def test_tree_from_paths_for_steps_without_a_tree_definition():
    from ckptio._tree import tree_from_paths
    got = tree_from_paths([("model", "a.b", 1), ("model", "a.c", 2), ("model", "d", 3), ("tx", "x", 4)])
    assert got == {"model": {"a": {"b": 1, "c": 2}, "d": 3}, "tx": {"x": 4}}
