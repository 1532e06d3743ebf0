"""Staging modes, handles, errors, retention, lifetime."""

import gc
import os
import sys
import weakref

import numpy as np
import pytest

import ckptio
from conftest import run_python


def test_copy_mode_lets_the_caller_change_its_arrays_at_once(ckpt_dir):
    w = np.arange(1 << 20, dtype=np.float32)
    with ckptio.CheckpointManager(ckpt_dir, staging="copy") as mgr:
        h = mgr.save(1, {"m": {"w": w}})
        w[:] = -1  # save() returned: the state is staged
        h.wait()
        assert h.released() and h.done()
        out = mgr.restore(1)
    np.testing.assert_array_equal(out["m"]["w"], np.arange(1 << 20, dtype=np.float32))


def test_borrow_mode_keeps_the_arrays_alive_until_released(ckpt_dir):
    class Tracked(np.ndarray):
        pass

    w = np.arange(1 << 20, dtype=np.float64).view(Tracked)
    alive = weakref.ref(w)
    expected = np.arange(1 << 20, dtype=np.float64)
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        h = mgr.save(1, {"m": {"w": w}})
        del w
        gc.collect()
        if not h.done():
            assert alive() is not None, "a borrowed array was freed while the save may still read it"
        h.wait()
        assert h.released()
        gc.collect()
        assert alive() is None, "the handle kept the borrowed array after the save was done"
        np.testing.assert_array_equal(mgr.restore(1)["m"]["w"], expected)


def test_borrow_mode_refuses_what_it_cannot_read_in_place(ckpt_dir):
    a = np.arange(12.0).reshape(3, 4)
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow") as mgr:
        with pytest.raises(ckptio.InvalidArgument, match="not C-contiguous"):
            mgr.save(1, {"m": {"t": a.T}})
        mgr.save(1, {"m": {"t": np.ascontiguousarray(a.T)}}).wait()


@pytest.mark.parametrize("state, match", [
    ({"m": {"o": np.array([object()], dtype=object)}}, "dtype object"),
    ({"m": {"a.b": np.ones(1), "a": {"b": np.ones(1)}}}, "twice"),
    ({"m": {"": np.ones(1)}}, "empty key"),
    ({"m": {(1, 2): np.ones(1)}}, "keys must be str or int"),
    ({"m": {"s": {1, 2}}}, "is not a leaf ckptio can save"),
    ({"m": {"x": np.ones(1, dtype="U3")}}, "cannot be saved"),
    ({"m": {"x": 1 << 70}}, "does not fit"),
    ([np.ones(1)], "must be a dict"),
    ({"m": {"0": np.ones(1), 0: np.ones(1)}}, "twice"),
])
def test_bad_input_is_a_clear_error(ckpt_dir, state, match):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        with pytest.raises(ckptio.InvalidArgument, match=match):
            mgr.save(1, state)
        assert mgr.latest_step() is None


def test_errors_map_to_classes_with_the_cpp_message(ckpt_dir, tmp_path):
    for code, cls in ckptio.errors.BY_CODE.items():
        with pytest.raises(cls, match="the message") as e:
            ckptio._ckptio._raise_status(code, "the message")
        assert isinstance(e.value, ckptio.Error) and e.value.code == code
    assert issubclass(ckptio.InvalidArgument, ValueError) and issubclass(ckptio.NotFound, LookupError)
    assert issubclass(ckptio.ResourceExhausted, MemoryError) and "ResourceExhausted" in ckptio.errors.BY_CODE
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        with pytest.raises(ckptio.NotFound):
            mgr.restore()
        with pytest.raises(ckptio.NotFound):
            mgr.restore(5)
        mgr.save(5, {"m": {"w": np.ones(1000)}}).wait()
        with pytest.raises(ckptio.AlreadyExists, match="already committed"):
            mgr.save(5, {"m": {"w": np.ones(1000)}})
        mgr.save(5, {"m": {"w": np.zeros(1000)}}, overwrite=True).wait()
        assert mgr.restore(5)["m"]["w"][0] == 0
        with pytest.raises(ckptio.InvalidArgument):
            mgr.save(6, {"m": {"w": np.ones(1)}}, metadata={"x": object()})
        # Damage a data file: restore(5) names it as DataLoss; verify too.
        step_dir = os.path.join(ckpt_dir, "run-5")
        data = [f for f in os.listdir(step_dir) if f.startswith("data")][0]
        with open(os.path.join(step_dir, data), "r+b") as f:
            f.seek(100)
            f.write(b"\xff\xfe\xfd")
        with pytest.raises(ckptio.DataLoss, match="m/w"):
            mgr.restore(5)
        with pytest.raises(ckptio.DataLoss):
            mgr.verify(5)
    with pytest.raises(ckptio.InvalidArgument):
        ckptio.CheckpointManager(str(tmp_path / "x"), staging="lazy")
    with pytest.raises(ckptio.InvalidArgument, match="unknown"):
        ckptio._ckptio.Manager(str(tmp_path / "y"), {"no_such_option": 1}, {}, {})


def test_a_closed_manager_raises(ckpt_dir):
    mgr = ckptio.CheckpointManager(ckpt_dir)
    mgr.close()
    mgr.close()  # idempotent
    assert mgr.closed
    with pytest.raises(ckptio.FailedPrecondition, match="closed"):
        mgr.save(1, {"m": {"w": np.ones(1)}})
    with pytest.raises(ckptio.FailedPrecondition):
        mgr.latest_step()


def test_retention(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir, max_to_keep=2, keep_every=4) as mgr:
        for step in range(1, 8):
            mgr.save(step, {"m": {"w": np.full(10, step)}})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [4, 6, 7]


def test_close_joins_saves_in_flight(ckpt_dir):
    mgr = ckptio.CheckpointManager(ckpt_dir, staging="borrow", max_in_flight=4)
    for step in range(4):
        mgr.save(step, {"m": {"w": np.full(1 << 20, step, np.float32)}})
    mgr.close()
    with ckptio.CheckpointManager(ckpt_dir) as again:
        assert again.all_steps() == [0, 1, 2, 3]


def test_wait_timeout_then_the_saves_error(ckpt_dir):
    """A save by 2 processes whose second never comes: the coordinator waits
    for its manifest, then fails the save (Unavailable)."""
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": np.ones(4)}}).wait()
    with ckptio.CheckpointManager(ckpt_dir, processes=dict(index=0, count=2, run_id="t1",
                                                           timeout_seconds=1.0)) as grp:
        h = grp.save(2, {"m": {"w": np.ones(4)}})
        with pytest.raises(TimeoutError):
            h.wait(timeout=0.05)
        assert not h.done()
        with pytest.raises(ckptio.Unavailable, match="manifest"):
            h.wait()
        assert isinstance(h.exception(), ckptio.Unavailable)
        with pytest.raises(ckptio.Unavailable):
            grp.wait_until_finished()
        assert grp.latest_step() == 1


def test_interpreter_exit_with_saves_in_flight(tmp_path):
    """No close(), no wait: exiting waits for the saves, then exits 0."""
    d = str(tmp_path / "c")
    code = """
import sys, numpy as np, ckptio
seen = []
mgr = ckptio.CheckpointManager(sys.argv[1], staging="borrow", max_in_flight=3,
                               on_commit=lambda e: seen.append(e.step))
for step in range(3):
    h = mgr.save(step, {"m": {"w": np.full(4 << 20, step, np.float32)}})
    h.add_done_callback(lambda h: print("done", h.step, flush=True))
del mgr  # collected with saves in flight: closed as close() would
mgr = ckptio.CheckpointManager(sys.argv[1] + "2", staging="borrow")
h = mgr.save(7, {"m": {"w": np.full(4 << 20, 7, np.float32)}})
h.add_done_callback(lambda h: print("done", h.step, flush=True))
print("exiting", flush=True)
"""
    r = run_python(code, d)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert "exiting" in lines and all(f"{i}" in lines for i in ("0", "1", "2")), r.stdout
    with ckptio.CheckpointManager(d) as mgr:
        assert mgr.all_steps() == [0, 1, 2]
    with ckptio.CheckpointManager(d + "2") as mgr:
        assert mgr.all_steps() == [7]
    assert "7" in lines


def test_latest_step_after_a_sigkilled_save_is_the_previous_step(tmp_path):
    """A process killed mid-save (SIGKILL) leaves that step uncommitted and the
    previous latest intact. The save is held before its commit by a second
    process that never comes, so the kill lands mid-save every time."""
    import signal
    import subprocess
    d = str(tmp_path / "c")
    code = """
import sys, time, numpy as np, ckptio
with ckptio.CheckpointManager(sys.argv[1]) as m:
    m.save(1, {"m": {"w": np.full(1 << 20, 1.0)}}).wait()
g = ckptio.CheckpointManager(sys.argv[1], staging="borrow",
                             processes=dict(index=0, count=2, run_id="k1", timeout_seconds=600))
w = np.full(8 << 20, 2.0)
h = g.save(2, {"m": {"w": w}})
deadline = time.monotonic() + 60
while h.progress["durable"] < h.progress["total"] or h.progress["total"] == 0:
    if h.done() or time.monotonic() > deadline:  # a line the test shows, not a wait without end
        print("no durable data:", "done" if h.done() else "60 s", h.progress, flush=True)
        sys.exit(3)
    time.sleep(0.005)
print("data durable, waiting for the commit", flush=True)
time.sleep(600)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-c", code, d], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("data durable"), line
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    with ckptio.CheckpointManager(d) as mgr:
        assert mgr.latest_step() == 1 and mgr.all_steps() == [1]
        dirs = {x["name"]: x["committed"] for x in mgr.step_dirs()}
        assert any(n.startswith("run-2.tmp-") and not c for n, c in dirs.items()), dirs
        assert mgr.restore()["m"]["w"][0] == 1.0


def test_a_manager_in_a_forked_child_raises(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": np.ones(8)}}).wait()
        pid = os.fork()
        if pid == 0:  # the child: every call fails at once, nothing hangs
            code = 3
            try:
                mgr.latest_step()
            except ckptio.FailedPrecondition:
                code = 0
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert mgr.latest_step() == 1


def test_a_handle_waited_on_in_a_forked_child_raises(ckpt_dir):
    """A save still in flight at fork(): in the child, its handle's wait()
    raises FailedPrecondition at once (no callbacks' thread there to finish it)."""
    import threading
    gate, entered = threading.Event(), threading.Event()

    def on_commit(event):
        entered.set()
        gate.wait(30)  # holds the parent's callbacks' thread: the handle stays not done

    with ckptio.CheckpointManager(ckpt_dir, on_commit=on_commit) as mgr:
        h = mgr.save(1, {"m": {"w": np.ones(8)}})
        assert entered.wait(30)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                h.wait(timeout=10)
            except ckptio.FailedPrecondition:
                code = 0
            except TimeoutError:
                code = 5
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        gate.set()
        assert os.WEXITSTATUS(status) == 0, "the child's wait() did not raise FailedPrecondition"
        h.wait()


def test_into_arrays_of_another_byte_order_or_dtype_are_refused(ckpt_dir):
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": np.arange(4, dtype=np.float32)}}).wait()
        with pytest.raises(ckptio.InvalidArgument, match="byte order"):
            mgr.restore(1, into={"m": {"w": np.zeros(4, ">f4")}})
        with pytest.raises(ckptio.InvalidArgument, match="like= and into= disagree"):
            mgr.restore(1, like={"m": {"w": np.zeros(4, np.float32)}}, into={"m": {"w": np.zeros(4, np.int32)}})
        got = np.zeros(4, np.float32)
        mgr.restore(1, like={"m": {"w": np.zeros(4, np.float32)}}, into={"m": {"w": got}})
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32))


def test_into_arrays_that_share_memory_or_a_name_are_refused(ckpt_dir):
    """Before, into= with one array twice, overlapping views, or two leaves
    naming one saved leaf returned with one leaf's bytes silently replaced by
    another's (or one array never written)."""
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"p": {"a": np.arange(4.0), "b": np.arange(10.0, 14.0)}}).wait()
        mgr.save(2, {"m": {"a.b": np.arange(4.0)}}).wait()
        x = np.zeros(4)
        with pytest.raises(ckptio.InvalidArgument, match="share memory"):
            mgr.restore(1, into={"p": {"a": x, "b": x}})
        buf = np.zeros(6)
        with pytest.raises(ckptio.InvalidArgument, match="share memory"):
            mgr.restore(1, into={"p": {"a": buf[:4], "b": buf[2:]}})
        np.testing.assert_array_equal(buf, np.zeros(6))
        y = np.zeros(4)
        with pytest.raises(ckptio.InvalidArgument, match="name m/a.b"):
            mgr.restore(2, into={"m": {"a.b": x, "a": {"b": y}}})
        with pytest.raises(ckptio.InvalidArgument, match="name m/a.b"):
            mgr.restore(2, like={"m": {"a.b": x, "a": {"b": y}}})
        np.testing.assert_array_equal(x, np.zeros(4))
        np.testing.assert_array_equal(y, np.zeros(4))
        a, b = np.zeros(4), np.zeros(4)  # separate arrays: both filled
        mgr.restore(1, into={"p": {"a": a, "b": b}})
        np.testing.assert_array_equal(a, np.arange(4.0))
        np.testing.assert_array_equal(b, np.arange(10.0, 14.0))


def test_select_takes_one_prefix_as_a_str_and_refuses_what_is_not_a_str(ckpt_dir):
    """select=dict(prefixes="model") was split into the prefixes m, o, d, e, l."""
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"model": {"w": np.arange(3)}, "m": {"x": np.arange(2)}, "o": 5}).wait()
        got = mgr.restore(1, select=dict(prefixes="model"))
        assert list(got) == ["model"]
        for bad in ([1], dict(prefixes=[1]), dict(regex=5)):
            with pytest.raises(ckptio.InvalidArgument):
                mgr.restore(1, select=bad)


def test_a_save_that_races_close_is_completed(ckpt_dir):
    """close() from another thread while save() is inside the library: close
    waits for that call, and the handle still completes (it was once queued
    behind the callbacks' thread's end and never finished)."""
    import threading
    mgr = ckptio.CheckpointManager(ckpt_dir)
    real = mgr._c
    entered, go, out = threading.Event(), threading.Event(), []

    class Slow:
        def __getattr__(self, name):
            return getattr(real, name)

        def save(self, *args):
            h = real.save(*args)
            entered.set()
            go.wait(30)  # close() runs meanwhile
            return h

    mgr._c = Slow()
    t = threading.Thread(target=lambda: out.append(mgr.save(1, {"m": {"w": np.ones(4)}})))
    t.start()
    assert entered.wait(30)
    closer = threading.Thread(target=mgr.close)
    closer.start()
    closer.join(30)  # closed (its callbacks' thread gone) before save() returns
    go.set()
    t.join(30)
    assert not closer.is_alive() and out, "close() or save() did not return"
    out[0].wait(timeout=30)
    assert out[0].done()


def test_close_waits_for_a_call_in_flight_in_another_thread(ckpt_dir):
    """close() while another thread restores: close returns only after the
    restore did (the library's manager is freed by close, without the GIL,
    never by the restore's end), and the restore completes."""
    import threading
    import time
    w = np.arange(32 << 20, dtype=np.float64)  # 256 MiB: a restore of a few tenths of a second
    with ckptio.CheckpointManager(ckpt_dir) as mgr:
        mgr.save(1, {"m": {"w": w}}).wait()
    mgr = ckptio.CheckpointManager(ckpt_dir)
    done = {}

    def restore():
        out = mgr.restore(1)
        done["restore"] = time.monotonic()
        done["ok"] = bool(np.array_equal(out["m"]["w"], w))

    t = threading.Thread(target=restore)
    t.start()
    time.sleep(0.05)  # inside the library's restore by now
    mgr.close()
    done["close"] = time.monotonic()
    t.join(60)
    assert done.get("ok"), done
    # (50 ms for the restore's Python side after the library returned)
    assert done["close"] >= done["restore"] - 0.05, "close() returned while a restore was still running"


def test_a_save_without_a_callbacks_thread_completes_in_save(ckpt_dir, monkeypatch):
    """No thread to be had for the callbacks (thread limits, an interpreter
    shutting down): save() completes the save itself instead of raising after
    the library began reading a borrowed state it would then drop."""
    import threading
    real_start = threading.Thread.start

    def start(self):
        if self.name == "ckptio-callbacks":
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    w = np.arange(1 << 16, dtype=np.float32)
    seen = []
    with ckptio.CheckpointManager(ckpt_dir, staging="borrow", on_commit=seen.append) as mgr:
        h = mgr.save(1, {"m": {"w": w}})
        assert h.done() and h.released()
        h.wait()
        assert len(seen) == 1 and seen[0].ok
        np.testing.assert_array_equal(mgr.restore(1)["m"]["w"], w)
