"""PyTorch tensors in and out; bfloat16 and float8 with and without ml_dtypes."""

import sys
import types

import numpy as np
import pytest

import ckptio
from ckptio import _leaves

torch = pytest.importorskip("torch", reason="python3-torch is not installed (tools/setup-deps installs it)")


def test_torch_model_and_optimizer_round_trip(ckpt_dir):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(),
             "extra": {"bf16": torch.randn(3, 5).to(torch.bfloat16), "i": torch.arange(7, dtype=torch.int32),
                       "b": torch.tensor([True, False]), "t": torch.randn(4, 6).t()}}
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, state).wait()
        names = {(l.prefix, l.path) for l in mgr.leaves(1)}
        assert ("model", "0.weight") in names and ("optim", "state.0.exp_avg") in names
        out = mgr.restore(1, like=state)
        plain = mgr.restore(1)
    for k, v in state["model"].items():
        assert isinstance(out["model"][k], torch.Tensor) and torch.equal(out["model"][k], v)
        assert isinstance(plain["model"][k], np.ndarray)
    assert out["extra"]["bf16"].dtype == torch.bfloat16 and torch.equal(out["extra"]["bf16"], state["extra"]["bf16"])
    assert torch.equal(out["extra"]["t"], state["extra"]["t"]) and torch.equal(out["extra"]["b"], state["extra"]["b"])
    # The restored optimizer state loads back into a fresh optimizer.
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model2.load_state_dict(out["model"])
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    opt2.load_state_dict(out["optim"])
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    for k, s in opt.state_dict()["state"].items():
        for name, t in s.items():
            assert torch.equal(opt2.state_dict()["state"][k][name], t)


def test_torch_borrow_mode_and_restore_into_tensors(ckpt_dir):
    w = torch.randn(256, 128)
    b = torch.randn(64).to(torch.bfloat16)
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        with pytest.raises(ckptio.InvalidArgument, match="not contiguous"):
            mgr.save(1, {"m": {"w": w.t()}})
        mgr.save(1, {"m": {"w": w, "b": b}}).wait()
        into = {"m": {"w": torch.empty(256, 128), "b": torch.empty(64, dtype=torch.bfloat16)}}
        out = mgr.restore(1, into=into)
    assert out["m"]["w"] is into["m"]["w"] and torch.equal(into["m"]["w"], w)
    assert torch.equal(into["m"]["b"], b)


def test_restore_into_a_conj_or_neg_view_is_refused(ckpt_dir):
    """into= a conj / neg view raised a bare RuntimeError from numpy()."""
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"c": np.zeros(2, np.complex64), "f": np.zeros(2, np.float32)}}).wait()
        with pytest.raises(ckptio.InvalidArgument, match="conjugate or negative view"):
            mgr.restore(1, into={"m": {"c": torch.zeros(2, dtype=torch.complex64).conj()}}, select=dict(regex="^c$"))
        with pytest.raises(ckptio.InvalidArgument, match="conjugate or negative view"):
            mgr.restore(1, into={"m": {"f": torch._neg_view(torch.zeros(2))}}, select=dict(regex="^f$"))


def test_tensors_that_need_grad_are_saved_detached(ckpt_dir):
    p = torch.nn.Parameter(torch.randn(3))
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"p": p}}).wait()
        np.testing.assert_array_equal(mgr.restore(1)["m"]["p"], p.detach().numpy())


@pytest.fixture
def no_ml_dtypes(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes -> ImportError
    _leaves.reset_ml_dtypes()
    yield
    _leaves.reset_ml_dtypes()


def test_bfloat16_and_float8_without_ml_dtypes_keep_their_dtype_name(ckpt_dir, no_ml_dtypes):
    bits16 = np.array([0x3F80, 0xC000, 0x7FC0, 0x0001], np.uint16)  # 1, -2, NaN, tiny
    bits8 = np.arange(256, dtype=np.uint8)
    state = {"m": {"bf": ckptio.raw_array(bits16, "bfloat16"), "e4": ckptio.raw_array(bits8, "float8_e4m3fn"),
                   "e5": ckptio.raw_array(bits8, "float8_e5m2")}}
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, state).wait()
        assert {l.path: l.dtype for l in mgr.leaves(1)} == {"bf": "bfloat16", "e4": "float8_e4m3fn",
                                                           "e5": "float8_e5m2"}
        out = mgr.restore(1)
        bf = out["m"]["bf"]
        assert isinstance(bf, ckptio.RawArray) and bf.ckptio_dtype == "bfloat16" and bf.dtype == np.uint16
        assert bf.tobytes() == bits16.tobytes() and out["m"]["e4"].tobytes() == bits8.tobytes()
        # Saved again as it came back: still bfloat16; a slice keeps the name.
        mgr.save(2, {"m": {"bf": bf[1:], "e4": out["m"]["e4"], "e5": out["m"]["e5"]}}).wait()
        assert {l.path: l.dtype for l in mgr.leaves(2)}["bf"] == "bfloat16"
        # As a torch tensor through a template.
        t = mgr.restore(1, like={"m": {"bf": torch.zeros(4, dtype=torch.bfloat16), "e4": state["m"]["e4"],
                                       "e5": state["m"]["e5"]}})
        assert t["m"]["bf"].dtype == torch.bfloat16 and t["m"]["bf"][0].item() == 1.0
    assert type(bf + 1) is np.ndarray  # arithmetic on the carrier is plain uint16


def test_float_scalars_cast_to_bfloat16_or_float8_keep_their_values(ckpt_dir, no_ml_dtypes):
    """A Python float (or numpy scalar) stored as bfloat16 / float8 comes back
    as its value, not as the bits of it (16416.0 for 2.5 before)."""
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        state = {"opt": {"lr": 2.5, "tiny": -0.001953125, "beta": np.float32(0.75)}}
        mgr.save(1, state, float_dtype="bfloat16").wait()
        out = mgr.restore(1)["opt"]
        assert out["lr"] == 2.5 and type(out["lr"]) is float
        assert out["tiny"] == -0.001953125
        # Without ml_dtypes a numpy bfloat16 scalar does not exist: the 0-d
        # view that keeps its dtype name, as bfloat16 arrays come back.
        assert isinstance(out["beta"], ckptio.RawArray) and out["beta"].ckptio_dtype == "bfloat16"
        assert int(out["beta"]) == 0x3F40  # 0.75
        mgr.save(2, {"opt": {"lr": 2.5}}).wait()
        assert mgr.restore(2, float_dtype="bfloat16")["opt"]["lr"] == 2.5
        sharded = mgr.restore(2, float_dtype="bfloat16", sharding=dict(mesh={"d": 1}, rules=[(".*", [])]))
        assert sharded["opt"]["lr"] == 2.5
    # float8 (a float_dtype cast cannot make it; a 0-d leaf of it read as a
    # Python float can be), decoded from its bits: known values of each.
    for dtype, table in (("float8_e4m3fn", {0x38: 1.0, 0xC0: -2.0, 0x08: 0.015625, 0x7E: 448.0,
                                            0x81: -0.001953125, 0x00: 0.0, 0x0F: 0.029296875}),
                         ("float8_e5m2", {0x3C: 1.0, 0xC0: -2.0, 0x38: 0.5, 0x7B: 57344.0,
                                          0x81: -1.52587890625e-05, 0x7C: float("inf"), 0x00: 0.0})):
        for bits, value in table.items():
            assert _leaves.float_of(dtype, np.array(bits, np.uint8)) == value, (dtype, hex(bits))
    assert np.isnan(_leaves.float_of("float8_e4m3fn", np.array(0x7F, np.uint8)))
    assert _leaves.float_of("bfloat16", np.array(0xC040, np.uint16)) == -3.0


def test_float_dtype_takes_every_form_a_leaf_dtype_takes(ckpt_dir):
    x = np.linspace(0, 1, 8, dtype=np.float32)
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        for step, form in enumerate((np.float16, np.dtype("float16"), "<f2", "float16", torch.float16), 1):
            mgr.save(step, {"p": {"w": x}}, float_dtype=form).wait()
            assert {l.path: l.dtype for l in mgr.leaves(step)} == {"w": "float16"}, form
            assert mgr.restore(1, float_dtype=form)["p"]["w"].dtype == np.float16
        with pytest.raises(ckptio.InvalidArgument, match="float_dtype"):
            mgr.save(9, {"p": {"w": x}}, float_dtype="float17")


def test_a_template_dtype_wins_over_float_dtype(ckpt_dir):
    """like= names each leaf's dtype; float_dtype casts the float leaves it
    does not name. Before, a float64 leaf the template asked as float64 came
    back as float_dtype's float16, whole and sharded."""
    a, b = np.linspace(0, 1, 4, dtype=np.float32), np.linspace(0, 1, 2, dtype=np.float64)
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"a": a, "b": b, "c": b}}).wait()
        like = {"p": {"a": np.zeros(4, np.float64), "b": np.zeros(2, np.float64)}}
        got = mgr.restore(like=like, float_dtype="float16", allow_cast=True, select="^[ab]$")
        assert {k: v.dtype for k, v in got["p"].items()} == {"a": np.float64, "b": np.float64}
        assert got["p"]["b"].tobytes() == b.tobytes()
        # Without allow_cast too (the whole restore's own copy of the choice
        # let float_dtype win there).
        exact = {"p": {"a": np.zeros(4, np.float32), "b": np.zeros(2, np.float64)}}
        got = mgr.restore(like=exact, float_dtype="float16", select="^[ab]$")
        assert {k: v.dtype for k, v in got["p"].items()} == {"a": np.float32, "b": np.float64}
        got = mgr.restore(float_dtype="float16")  # no template: every float leaf
        assert {k: v.dtype for k, v in got["p"].items()} == {"a": np.float16, "b": np.float16, "c": np.float16}
        sharded = mgr.restore(like=like, float_dtype="float16", allow_cast=True, select="^[ab]$",
                              sharding=dict(mesh={"dp": 2}, rules=[(".*", ckptio.PartitionSpec())]))
        assert sharded["p"]["b"].dtype == "float64" and sharded["p"]["b"].to_numpy().tobytes() == b.tobytes()


def test_restored_arrays_are_aligned_for_their_dtype(ckpt_dir):
    """A float64 leaf saved after a 3-byte one came back at an odd address:
    numpy flagged it unaligned, and torch tensors over it were too."""
    state = {"p": {"a": np.arange(3, dtype=np.uint8), "b": np.arange(1 << 17, dtype=np.float64),
                   "c": np.arange(5, dtype=np.uint8), "d": np.arange(7, dtype=np.complex128)}}
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, state).wait()
        for out in (mgr.restore(1)["p"], mgr.restore(1, sharding=dict(mesh={"d": 2}, rules=[(".*", ["d"])],
                                                                        min_size=0))["p"]):
            for name, v in out.items():
                arrays = [v] if isinstance(v, np.ndarray) else [shard.data for shard in v]
                for a in arrays:
                    assert a.flags.aligned and a.ctypes.data % a.dtype.alignment == 0, name
        t = mgr.restore(1, like={"p": {k: torch.from_numpy(v) for k, v in state["p"].items()}})["p"]["b"]
        assert t.data_ptr() % 8 == 0


def test_integer_arguments_out_of_range_or_not_integers_are_invalid(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        x = {"p": {"w": np.zeros(2)}}
        for bad in (2 ** 63, 1.9, "3", True):
            with pytest.raises(ckptio.InvalidArgument, match="step"):
                mgr.save(bad, x)
        for call in (lambda: mgr.restore(2 ** 64), lambda: mgr.restore(1.5), lambda: mgr.metadata(2 ** 63),
                     lambda: mgr.prepare_staging(-1), lambda: mgr.apply_retention(2 ** 31)):
            with pytest.raises(ckptio.InvalidArgument):
                call()
        mgr.save(np.int64(4), x).wait()  # numpy integers are integers
        assert mgr.all_steps() == [4]
    for bad, what in ((dict(max_to_keep=-1), "max_to_keep"), (dict(keep_every=-3), "keep_every"),
                      (dict(max_in_flight=0), "max_in_flight")):
        with pytest.raises(ckptio.InvalidArgument, match=what):
            ckptio.CheckpointManager(ckpt_dir, **bad)
    with pytest.raises(ckptio.InvalidArgument, match="chunk_size"):
        ckptio.cp(ckpt_dir, ckpt_dir + "-copy", chunk_size=-1)
    with pytest.raises(ckptio.InvalidArgument, match="keep_last"):
        ckptio.gc(ckpt_dir, keep_last=2 ** 40)


def test_bfloat16_with_ml_dtypes_uses_its_types(ckpt_dir, monkeypatch):
    """A small fake ml_dtypes (Debian 12 has none): restored bfloat16 / float8
    leaves come back viewed as its types."""
    fake = types.ModuleType("ml_dtypes")
    fake.bfloat16 = np.dtype(np.float16)  # stand-ins of the right sizes
    fake.float8_e4m3fn = np.dtype(np.int8)
    fake.float8_e5m2 = np.dtype(np.int8)
    monkeypatch.setitem(sys.modules, "ml_dtypes", fake)
    _leaves.reset_ml_dtypes()
    try:
        bits = np.array([0x3F80, 0xC000], np.uint16)
        with ckptio.CheckpointManager(ckpt_dir) as mgr:
            mgr.save(1, {"m": {"bf": ckptio.raw_array(bits, "bfloat16"),
                               "f8": ckptio.raw_array(np.array([1, 2], np.uint8), "float8_e5m2")}}).wait()
            out = mgr.restore(1)
        assert out["m"]["bf"].dtype == fake.bfloat16 and not isinstance(out["m"]["bf"], ckptio.RawArray)
        assert out["m"]["bf"].view(np.uint16).tolist() == bits.tolist()
        assert out["m"]["f8"].dtype == fake.float8_e5m2
    finally:
        _leaves.reset_ml_dtypes()


def test_cuda_or_sparse_tensors_are_refused(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        with pytest.raises(ckptio.InvalidArgument, match="dense"):
            mgr.save(1, {"m": {"s": torch.eye(3).to_sparse()}})
