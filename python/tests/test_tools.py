"""ckptio.cp, ckptio.verify, ckptio.inspect, ckptio.gc: the CLI's commands as functions."""

import glob
import os
import threading

import numpy as np
import pytest

import ckptio


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"model": {"w": rng.standard_normal((64, 33)).astype(np.float32),
                      "layers": [{"b": rng.integers(0, 1000, 50)}]},
            "tx": {"count": seed}}


@pytest.fixture
def two_steps(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, _state(1), metadata={"epoch": 1}).wait()
        mgr.save(2, _state(2), metadata={"epoch": 2}).wait()
    return ckpt_dir


def _restore(uri, step=None, **opts):
    with ckptio.CheckpointManager(uri, **opts) as mgr:
        return mgr.restore(step)


def _same(a, b):
    assert a["model"]["w"].tobytes() == b["model"]["w"].tobytes()
    assert a["model"]["layers"][0]["b"].tobytes() == b["model"]["layers"][0]["b"].tobytes()
    assert a["tx"]["count"] == b["tx"]["count"]


def test_inspect(two_steps):
    d = ckptio.inspect(two_steps)
    assert d["step"] == 2 and d["path"] == os.path.join(two_steps, "run-2")
    assert d["metadata"] == {"epoch": 2}  # without ckptio's own tree key
    leaves = {(leaf["prefix"], leaf["path"]): leaf for leaf in d["leaves"]}
    w = leaves[("model", "w")]
    assert (w["dtype"], w["shape"], w["bytes"], w["shards"]) == ("float32", (64, 33), 64 * 33 * 4, 1)
    assert leaves[("model", "layers.0.b")]["dtype"] == "int64"
    assert d["bytes"] == sum(f["bytes"] for f in d["files"]) > 0
    assert d["committed_at"].endswith("Z") and d["committed_unix_ns"] >= d["created_unix_ns"] > 0
    assert ckptio.inspect("file://" + two_steps, step=1)["metadata"] == {"epoch": 1}
    with pytest.raises(ckptio.NotFound):
        ckptio.inspect(two_steps, step=7)


def test_reading_a_missing_directory_does_not_create_it(tmp_path):
    missing = str(tmp_path / "nope")
    for call in (lambda: ckptio.inspect(missing), lambda: ckptio.verify(missing),
                 lambda: ckptio.gc(missing), lambda: ckptio.cp(missing, str(tmp_path / "dst"))):
        with pytest.raises(ckptio.NotFound, match="no such directory"):
            call()
    assert not os.path.exists(missing) and not os.path.exists(tmp_path / "dst")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ckptio.NotFound, match="no committed step"):
        ckptio.inspect(str(empty))


def test_verify_and_damage(two_steps):
    calls = []
    r = ckptio.verify(two_steps, on_progress=lambda s, done, total: calls.append((s, done, total,
                                                                                 threading.get_ident())))
    assert r["step"] == 2 and r["ok"] and r["error"] is None and r["bytes"] > 0
    assert calls and calls[-1][:3] == (2, r["bytes"], r["bytes"])
    assert {c[3] for c in calls} == {threading.get_ident()}  # the calling thread
    assert [x["step"] for x in ckptio.verify(two_steps, all=True)] == [1, 2]

    (data,) = glob.glob(os.path.join(two_steps, "run-1", "data-*.bin"))
    with open(data, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert ckptio.verify(two_steps)["ok"]  # the newest step is intact
    with pytest.raises(ckptio.DataLoss, match="checksum") as e:
        ckptio.verify(two_steps, all=True)
    assert [x["ok"] for x in e.value.results] == [False, True]  # every step checked
    r = ckptio.verify(two_steps, step=1, raise_on_error=False)
    assert not r["ok"] and isinstance(r["error"], ckptio.DataLoss)
    with pytest.raises(ckptio.InvalidArgument):
        ckptio.verify(two_steps, step=1, all=True)


def test_cp_local(two_steps, tmp_path):
    dst = str(tmp_path / "copy")
    (one,) = ckptio.cp(two_steps, dst)  # the latest
    assert one["step"] == 2 and not one["skipped"] and one["files"] == 1 and one["shards"] == 3
    _same(_restore(dst), _state(2))
    assert ckptio.inspect(dst)["metadata"] == {"epoch": 2}
    with pytest.raises(ckptio.AlreadyExists) as e:
        ckptio.cp(two_steps, dst, step=2)
    assert e.value.steps == []
    assert ckptio.cp(two_steps, dst, step=2, skip_identical=True)[0]["skipped"]
    steps = ckptio.cp(two_steps, dst, all=True)
    assert [(s["step"], s["skipped"]) for s in steps] == [(1, False), (2, True)]
    assert ckptio.cp(two_steps, dst, step=2, overwrite=True)[0]["bytes"] > 0
    _same(_restore(dst, 1), _state(1))
    with pytest.raises(ckptio.InvalidArgument):
        ckptio.cp(two_steps, dst, step=1, all=True)
    with pytest.raises(ckptio.InvalidArgument, match="unknown option"):
        ckptio.cp(two_steps, dst, s3_bogus=1)


def test_cp_progress_that_raises_stops_the_copy(two_steps, tmp_path):
    dst = str(tmp_path / "copy")
    seen = []

    def progress(step, done, total):
        seen.append((step, done, total))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ckptio.cp(two_steps, dst, on_progress=progress)
    assert seen == [(2, 0, seen[0][2])]
    with ckptio.CheckpointManager(dst) as mgr:
        assert mgr.all_steps() == []


def test_gc(two_steps):
    leftover = os.path.join(two_steps, "run-3.tmp-0123456789abcdef")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "data-0123456789abcdef-0.bin"), "wb") as f:
        f.write(b"x" * 100)
    r = ckptio.gc(two_steps)  # min_age_seconds=3600: the fresh leftover stays
    assert r["removed"] == [] and r["kept_steps"] == [1, 2] and os.path.isdir(leftover)
    r = ckptio.gc(two_steps, keep_last=1, min_age_seconds=0)
    assert sorted((x["name"], x["committed"]) for x in r["removed"]) == [
        ("run-1", True), ("run-3.tmp-0123456789abcdef", False)]
    assert r["kept_steps"] == [2] and r["freed_bytes"] >= 100 and not os.path.exists(leftover)
    _same(_restore(two_steps), _state(2))
    with pytest.raises(ckptio.InvalidArgument, match="keep_every needs keep_last"):
        ckptio.gc(two_steps, keep_every=2)  # (was ignored: no retention ran)


def test_cp_to_s3_and_back(two_steps, tmp_path, s3_uri_and_options):
    uri, opts = s3_uri_and_options
    steps = ckptio.cp(two_steps, uri, all=True, **opts)
    assert [s["step"] for s in steps] == [1, 2]
    assert ckptio.verify(uri, all=True, **opts)[1]["ok"]
    d = ckptio.inspect(uri, **opts)
    assert d["step"] == 2 and d["path"] == uri + "/run-2" and d["metadata"] == {"epoch": 2}
    back = str(tmp_path / "back")
    ckptio.cp(uri, back, step=1, src_options=opts)
    _same(_restore(back), _state(1))
    assert ckptio.gc(uri, keep_last=1, min_age_seconds=0, **opts)["kept_steps"] == [2]
    _same(_restore(uri, **opts), _state(2))


def test_tools_release_the_gil(ckpt_dir, tmp_path):
    """A pure-Python thread keeps running while verify, cp and inspect block."""
    import time

    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {f"w{i}": np.full(2 << 20, i, np.float32) for i in range(8)}}).wait()  # 64 MiB
    counter, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before, t0 = counter[0], time.perf_counter()
        ckptio.verify(ckpt_dir)
        ckptio.cp(ckpt_dir, str(tmp_path / "copy"))
        ckptio.inspect(ckpt_dir)
        ckptio.gc(ckpt_dir)
        elapsed, spun = time.perf_counter() - t0, counter[0] - before
    finally:
        stop.set()
        t.join()
    assert spun / elapsed > 10_000, (spun, elapsed)
