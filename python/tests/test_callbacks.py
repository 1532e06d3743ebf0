"""Callbacks run with the GIL on the manager's callbacks' thread; one that
raises is logged and changes nothing; blocking calls let other threads run."""

import ctypes
import logging
import threading
import time

import numpy as np

import ckptio


def gil_held():
    return ctypes.pythonapi.PyGILState_Check() == 1


def test_on_commit_and_done_callbacks_run_with_the_gil_in_order(ckpt_dir):
    events = []
    main = threading.current_thread()

    def on_commit(e):
        events.append(("commit", e.step, e.ok, e.stats.bytes, gil_held(), threading.current_thread() is not main))

    with ckptio.CheckpointManager(ckpt_dir, on_commit=on_commit, max_in_flight=2) as mgr:
        handles = []
        for step in (1, 2, 3):
            h = mgr.save(step, {"m": {"w": np.full(1000, step, np.float32)}})
            h.add_done_callback(lambda h: events.append(("done", h.step, h.done(), gil_held())))
            handles.append(h)
        mgr.wait_until_finished()  # returns after the callbacks ran
        assert [e[:2] for e in events] == [("commit", 1), ("done", 1), ("commit", 2), ("done", 2),
                                           ("commit", 3), ("done", 3)]
        assert all(e[-1] for e in events if e[0] == "commit") and all(e[4] for e in events if e[0] == "commit")
        assert all(e[2] and e[3] for e in events if e[0] == "done")
        assert [e[3] for e in events if e[0] == "commit"] == [4000] * 3
        late = []
        handles[0].add_done_callback(lambda h: late.append((h.step, threading.current_thread() is main)))
        assert late == [(1, True)]  # done already: runs at once, in the caller's thread


def test_a_callback_that_raises_is_logged_and_nothing_else(ckpt_dir, caplog):
    calls = []

    def on_commit(e):
        calls.append(e.step)
        raise RuntimeError(f"boom {e.step}")

    with caplog.at_level(logging.ERROR, logger="ckptio"):
        with ckptio.CheckpointManager(ckpt_dir, on_commit=on_commit) as mgr:
            h = mgr.save(1, {"m": {"w": np.ones(10)}})
            h.add_done_callback(lambda h: 1 / 0)
            h.wait()  # the save's outcome stands
            mgr.save(2, {"m": {"w": np.ones(10)}}).wait()
            mgr.wait_until_finished()
            assert mgr.all_steps() == [1, 2]
    assert calls == [1, 2]
    text = caplog.text
    assert "boom 1" in text and "boom 2" in text and "ZeroDivisionError" in text


def test_a_callback_can_use_the_manager(ckpt_dir):
    seen = []
    holder = {}

    def on_commit(e):
        mgr = holder["mgr"]
        seen.append((e.step, mgr.latest_step(), mgr.restore(e.step)["m"]["w"][0]))
        if e.step == 1:
            h = mgr.save(2, {"m": {"w": np.full(4, 2.0)}})  # a save from a callback
            h.wait()  # waiting from the callbacks' thread waits for the save itself

    with ckptio.CheckpointManager(ckpt_dir, on_commit=on_commit) as mgr:
        holder["mgr"] = mgr
        mgr.save(1, {"m": {"w": np.full(4, 1.0)}}).wait()
        mgr.wait_until_finished()
    assert seen[0] == (1, 1, 1.0) and seen[1][0] == 2


def test_blocking_calls_release_the_gil(ckpt_dir):
    """A pure-Python thread keeps running while save's copy, wait and restore block."""
    state = {"m": {f"w{i}": np.full(4 << 20, i, np.float32) for i in range(8)}}  # 128 MiB
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        with ckptio.CheckpointManager(ckpt_dir) as mgr:
            before = counter[0]
            t0 = time.perf_counter()
            mgr.save(1, state).wait()
            mgr.restore(1)
            elapsed = time.perf_counter() - t0
            spun = counter[0] - before
    finally:
        stop.set()
        t.join()
    # Held GIL: the thread would get only the switch-interval slices of the Python parts.
    assert spun > 0 and elapsed > 0
    assert spun / elapsed > 10_000, (spun, elapsed)
