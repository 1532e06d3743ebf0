"""A round trip through an S3 server on loopback (moto, started by tests/s3/s3-server)."""

import json

import numpy as np

import ckptio
from conftest import run_python


def test_s3_round_trip(s3_uri_and_options):
    uri, opts = s3_uri_and_options
    rng = np.random.default_rng(7)
    state = {"model": {"w": rng.standard_normal((512, 300)).astype(np.float32),  # > one part would be 16 MiB
                       "layers": [{"b": rng.integers(0, 1 << 30, 1000)}, {"b": np.arange(3, dtype=np.int8)}]},
             "tx": {"count": 3}}
    committed = []
    with ckptio.CheckpointManager(uri, max_to_keep=1, on_commit=lambda e: committed.append((e.step, e.ok)),
                                  **opts) as mgr:
        mgr.save(1, state, {"epoch": 1}).wait()
        mgr.save(2, state, {"epoch": 2}).wait()
        mgr.wait_until_finished()
        assert committed == [(1, True), (2, True)]
        assert mgr.all_steps() == [2] and mgr.metadata() == {"epoch": 2}
        out = mgr.restore()
        mgr.verify(2)
    assert out["model"]["w"].tobytes() == state["model"]["w"].tobytes()
    assert out["model"]["layers"][0]["b"].tobytes() == state["model"]["layers"][0]["b"].tobytes()
    assert out["tx"]["count"] == 3
    with ckptio.CheckpointManager(uri, staging="borrow", **opts) as mgr:
        assert mgr.latest_step() == 2
        with np.testing.assert_raises(ckptio.NotFound):
            mgr.restore(1)


def test_the_s3_backend_loads_on_the_first_s3_uri_only(s3_uri_and_options, tmp_path):
    """A local save and restore load none of the S3 backend's libraries (libcurl and the
    thirty-odd libraries it pulls in, ~40 ms of a cold start); the first s3:// URI loads
    the module ckptio_s3_backend.so from beside the extension."""
    uri, opts = s3_uri_and_options
    code = r"""
import json, sys
import numpy as np
import ckptio

def loaded():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line})

with ckptio.CheckpointManager(sys.argv[1]) as mgr:
    mgr.save(1, {"w": np.arange(10.0)}).wait()
    local = loaded()
    assert mgr.restore()["w"][3] == 3.0
uri, opts = sys.argv[2], json.loads(sys.argv[3])
with ckptio.CheckpointManager(uri, **opts) as mgr:
    mgr.save(1, {"w": np.arange(10.0)}).wait()
    assert mgr.restore()["w"][4] == 4.0
print(json.dumps({"local": local, "s3": loaded()}))
"""
    r = run_python(code, str(tmp_path / "ckpt"), uri, json.dumps(opts))
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    for name in ("ckptio_s3_backend.so", "libcurl.so.4", "libpugixml.so.1"):
        assert not any(n.startswith(name) for n in seen["local"]), (name, seen["local"])
        assert any(n.startswith(name) for n in seen["s3"]), (name, seen["s3"])


def test_s3_checksums_reach_the_backend(s3_uri_and_options):
    """s3_checksums is S3Options::checksums: "off" saves without the header, a value
    other than "on" / "off" is refused by the backend with its message."""
    uri, opts = s3_uri_and_options
    with np.testing.assert_raises(ckptio.InvalidArgument) as e:
        ckptio.CheckpointManager(uri, s3_checksums="maybe", **opts)
    assert "checksums must be 'on' or 'off'" in str(e.exception)
    for setting in ("off", "on"):
        with ckptio.CheckpointManager(uri, s3_checksums=setting, **opts) as mgr:
            mgr.save(1, {"w": np.arange(100.0)}, overwrite=True).wait()
            assert mgr.restore()["w"][7] == 7.0
