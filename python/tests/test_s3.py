"""A round trip through an S3 server on loopback (moto, started by tests/s3/s3-server)."""

import numpy as np

import ckptio


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
