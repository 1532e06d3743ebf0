"""Multi-process saves from Python with torch.distributed as the barrier.

One job of 4 processes (gloo on 127.0.0.1, ckptio.TorchBarrier on its store)
saves the shards of one sharded state (ckptio.Shards on a 2x2 mesh, one
device per process) to local disk and to the S3 test server; process 0
commits. Then the job saves step 2 while process 3 is held inside its
barrier and SIGKILLed there by this test: step 2 must stay uncommitted and
step 1 the latest, on both stores. Then 2 fresh processes restore step 1
resharded (a 2-device mesh, one device each), bit-exact.
"""

import collections
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import ckptio
from ckptio import _ckptio
from conftest import kill_leftovers

TIMEOUT = 2.0  # processes.timeout_seconds of step 2: how long the live processes wait for the killed one

# Shared by the savers and the restorers: the global arrays, their specs on
# the saving mesh (dp=2, tp=2; device p is process p).
COMMON = r'''
import numpy as np
import ckptio
from ckptio import Mesh, PartitionSpec as P, Shards

SAVE_MESH = Mesh({"dp": 2, "tp": 2})
SPECS = {("model", "w"): P("dp", "tp"), ("model", "b"): P(("dp", "tp")), ("model", "emb"): P(),
         ("tx", "mu"): P("tp", "dp")}

def global_arrays(step):
    rng = np.random.default_rng(step)
    return {("model", "w"): rng.standard_normal((64, 40)).astype(np.float32),
            ("model", "b"): rng.integers(-1000, 1000, 96).astype(np.int32),
            ("model", "emb"): rng.standard_normal((30, 8)),
            ("tx", "mu"): rng.standard_normal((64, 40)).astype(np.float32)}

def my_state(step, device):
    state = {}
    for (prefix, path), g in global_arrays(step).items():
        index = SAVE_MESH.devices_indices_map(SPECS[(prefix, path)], g.shape)[device]
        state.setdefault(prefix, {})[path] = Shards.from_mesh(g.shape, SAVE_MESH, SPECS[(prefix, path)],
                                                              {device: g[index].copy()})
    return state
'''

SAVER = COMMON + r'''
import datetime, json, os, sys, time
import torch.distributed as dist

rank, world, port_file, local_uri, s3_uri, s3_opts, timeout = (
    int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], json.loads(sys.argv[6]),
    float(sys.argv[7]))
# Process 0 serves the TCPStore on a port the kernel picks and tells the
# others through a file: a port picked free beforehand may be taken by then
# (other tests start servers), and a client that reached another server
# could wait on it for good.
limit = datetime.timedelta(seconds=60)
if rank == 0:
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=limit, wait_for_workers=False)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(store.port))
    os.rename(port_file + ".tmp", port_file)
else:
    deadline = time.monotonic() + 60
    while not os.path.exists(port_file):
        assert time.monotonic() < deadline, "no TCPStore port from process 0 within 60 s"
        time.sleep(0.01)
    store = dist.TCPStore("127.0.0.1", int(open(port_file).read()), world, False, timeout=limit)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=limit)

class HoldingBarrier(ckptio.TorchBarrier):
    """Process 3's barrier: holds the save of step 2 before it arrives, until SIGKILLed."""
    def wait(self, name, timeout_seconds):
        if "/run-2/" in name and name.endswith("/written"):
            print("HOLDING", name, flush=True)
            time.sleep(600)
        return super().wait(name, timeout_seconds)

def managers(timeout):
    def manager(uri, **opts):
        processes = ckptio.distributed.torch_processes(timeout_seconds=timeout)  # a run id from process 0
        barrier = HoldingBarrier() if rank == 3 else "torch"
        return ckptio.CheckpointManager(uri, processes=processes, barrier=barrier, **opts)
    return [manager(local_uri)] + ([manager(s3_uri, **s3_opts)] if s3_uri else [])

# Step 1 may take its time (a loaded machine); step 2 is the one whose barrier times out.
for m in managers(60):
    m.save(1, my_state(1, rank), metadata={"saved_by": world}).wait()
    m.close()
print("COMMITTED 1", flush=True)

managers = managers(timeout)
handles = [m.save(2, my_state(2, rank)) for m in managers]
outcomes = []
for h in handles:
    try:
        h.wait()
        outcomes.append("committed")
    except ckptio.Error as e:
        outcomes.append(type(e).__name__)
print("STEP2", json.dumps(outcomes), flush=True)
for m in managers:
    m.close()
# Process 0 serves the store: it leaves last.
store = dist.distributed_c10d._get_default_store()
store.add("finished", 1)
deadline = time.monotonic() + 30
while rank == 0 and store.add("finished", 0) < world - 1 and time.monotonic() < deadline:
    time.sleep(0.05)
'''

RESTORER = COMMON + r'''
import json, sys
index, uri, opts = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
with ckptio.CheckpointManager(uri, **opts) as mgr:
    assert mgr.latest_step() == 1, mgr.all_steps()
    out, info = mgr.restore(sharding=dict(mesh=Mesh({"x": 2}), rules=[(".*", P("x"))], devices=[index],
                                          min_size=0), info=True)
checked = 0
for (prefix, path), g in global_arrays(1).items():
    leaf = out[prefix][path]
    (shard,) = leaf.shards
    assert shard.device == index and tuple(leaf.spec) == ("x",), (shard, leaf.spec)
    want = g[shard.index]
    assert shard.data.dtype == g.dtype and shard.data.tobytes() == want.tobytes(), (prefix, path)
    assert want.shape[0] == g.shape[0] // 2
    checked += want.nbytes
print("RESTORED", json.dumps({"bytes": checked, "metadata": info.metadata, "read": info.stats["bytes_read"]}))
'''


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["OMP_NUM_THREADS"] = "1"
    return env


class _Lines:
    """Process 3's stdout, read by a thread: a wait for a line has a deadline
    even when the process hangs without printing (readline alone would not)."""

    def __init__(self, proc):
        self.proc, self.queue = proc, queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, prefix, count, timeout):
        lines, deadline = [], time.monotonic() + timeout
        while len(lines) < count:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {count} lines {prefix!r} from process 3 after {timeout} s: {lines}")
            if line is None:
                raise AssertionError(f"process 3 ended before {prefix!r}: exit {self.proc.wait()}")
            if line.startswith(prefix):
                lines.append(line.strip())
        return lines


@pytest.fixture(scope="module")
def job(tmp_path_factory, request):
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch without torch.distributed")
    work = tmp_path_factory.mktemp("distributed")
    local_uri = str(work / "ckpt")
    try:  # without an S3 server (no moto), the local half still runs
        s3_server = request.getfixturevalue("s3_server")
    except pytest.skip.Exception as e:
        s3_server, s3_skipped = None, str(e)
    s3_uri, s3_opts = "", {}
    if s3_server is not None:
        s3_uri = f"s3://{s3_server['bucket']}/dist-{uuid.uuid4().hex[:12]}"
        s3_opts = dict(s3_endpoint=s3_server["endpoint"], s3_region=s3_server.get("region", "us-east-1"),
                       s3_access_key_id=s3_server["access_key"], s3_secret_access_key=s3_server["secret_key"],
                       s3_max_attempts=3)
    port_file, world, env = str(work / "store-port"), 4, _env()
    procs, logs = [], []
    try:
        for rank in range(world):
            log = open(work / f"rank{rank}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", SAVER, str(rank), str(world), port_file, local_uri, s3_uri,
                 json.dumps(s3_opts), str(TIMEOUT)],
                stdout=subprocess.PIPE if rank == 3 else log, stderr=log, text=True, env=env))
        lines = _Lines(procs[3])
        lines.wait_for("COMMITTED 1", 1, 90)
        held = lines.wait_for("HOLDING", 2 if s3_uri else 1, 60)  # each manager's save of step 2
        procs[3].send_signal(signal.SIGKILL)
        codes = [p.wait(timeout=60) for p in procs]
        failure = None
    except (AssertionError, subprocess.TimeoutExpired) as e:
        failure = e
    finally:
        kill_leftovers(procs)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if failure is not None:  # with what each process printed (process 3's stdout went to the test)
        raise AssertionError(f"{failure}\n" + "".join(f"-- process {r}:\n{o[-3000:]}" for r, o in enumerate(outputs)))
    for rank in range(3):
        assert codes[rank] == 0, f"process {rank} exited {codes[rank]}:\n{outputs[rank]}"
    assert codes[3] == -signal.SIGKILL
    return dict(local=(local_uri, {}), s3=(s3_uri, s3_opts) if s3_uri else None, outputs=outputs, held=held,
                s3_skipped=None if s3_uri else s3_skipped)


def _where(job, where):
    if job[where] is None:
        pytest.skip(job["s3_skipped"])
    return job[where]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_four_processes_commit_once(job, where):
    uri, opts = _where(job, where)
    with ckptio.CheckpointManager(uri, **opts) as mgr:
        assert mgr.all_steps() == [1] and mgr.latest_step() == 1
        assert mgr.metadata(1) == {"saved_by": 4}
        mgr.verify(1)
    d = ckptio.inspect(uri, **opts)
    assert len(d["files"]) == 4  # one data file per process, committed by process 0
    leaves = {(leaf["prefix"], leaf["path"]): leaf for leaf in d["leaves"]}
    assert leaves[("model", "w")]["shards"] == 4 and leaves[("model", "emb")]["shards"] == 1  # replicated: once


@pytest.mark.parametrize("where", ["local", "s3"])
def test_process_killed_mid_save_leaves_the_step_uncommitted(job, where):
    uri, opts = _where(job, where)
    for rank in range(3):
        line = [x for x in job["outputs"][rank].splitlines() if x.startswith("STEP2")]
        assert line, job["outputs"][rank]
        outcomes = json.loads(line[0].split(" ", 1)[1])
        assert "committed" not in outcomes, (rank, outcomes)
    with ckptio.CheckpointManager(uri, **opts) as mgr:
        assert mgr.all_steps() == [1] and mgr.latest_step() == 1
        dirs = mgr.step_dirs()
        assert any(d["step"] == 2 and not d["committed"] for d in dirs), dirs  # what the dead attempt left
        out = mgr.restore()  # the previous latest, intact
    g = np.random.default_rng(1).standard_normal((64, 40)).astype(np.float32)
    assert out["model"]["w"].tobytes() == g.tobytes()
    removed = ckptio.gc(uri, min_age_seconds=0, **opts)["removed"]  # the dead attempt's files
    assert [(r["step"], r["committed"]) for r in removed] == [(2, False)]
    with ckptio.CheckpointManager(uri, **opts) as mgr:
        assert [d["step"] for d in mgr.step_dirs()] == [1]


def test_two_processes_restore_resharded(job):
    env = _env()
    for where in ("local", "s3") if job["s3"] else ("local",):
        uri, opts = job[where]
        procs = [subprocess.Popen([sys.executable, "-c", RESTORER, str(i), uri, json.dumps(opts)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for i in range(2)]
        got = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=60)
                assert p.returncode == 0, err
                got.append(json.loads(out.split("RESTORED ", 1)[1]))
        finally:
            kill_leftovers(procs)
        total = sum(x["bytes"] for x in got)
        assert total == 64 * 40 * 4 * 2 + 96 * 4 + 30 * 8 * 8
        assert all(x["metadata"] == {"saved_by": 4} for x in got)


# ---- the barrier on its own -------------------------------------------------------------

def test_python_barrier_errors_map_to_status_codes():
    call = _ckptio._barrier_wait_on_thread
    assert call(lambda name, timeout: None, "b", 1.0) is None
    seen = []
    assert call(lambda name, timeout: seen.append((name, timeout)), "ckptio/run-1/a/written", 2.5) is None
    assert seen == [("ckptio/run-1/a/written", 2.5)]

    def timeout(name, t):
        raise TimeoutError("slow")

    def dataloss(name, t):
        raise ckptio.DataLoss("bad")

    def other(name, t):
        raise ValueError("oops")

    assert call(timeout, "b", 1.0) == ("Unavailable", "slow")
    assert call(dataloss, "b", 1.0) == ("DataLoss", "bad")
    assert call(other, "b", 1.0) == ("Cancelled", "the barrier callback raised ValueError: oops")

    class Unshowable(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    def unshowable(name, t):
        raise Unshowable()

    # (Before, reading this exception's text raised out of the barrier's
    # C++ caller: std::terminate.)
    assert call(unshowable, "b", 1.0) == ("Cancelled",
                                          "the barrier callback raised Unshowable (which could not be shown)")
    assert call(lambda name, t: False, "b", 1.5)[0] == "Unavailable"
    assert call(lambda name, t: np.False_, "b", 1.5)[0] == "Unavailable"  # (before: taken for arrival)
    assert call(lambda name, t: np.True_, "b", 1.5) is None
    assert call(lambda name, t: 0, "b", 1.5) is None  # threading.Barrier.wait's index: an arrival

    class WithWait:
        def wait(self, name, timeout_seconds):
            seen.append(name)

    assert call(WithWait(), "w", 1.0) is None and seen[-1] == "w"
    with pytest.raises(ckptio.InvalidArgument, match="barrier"):
        call(42, "b", 1.0)


def test_barrier_option_is_checked(tmp_path):
    with pytest.raises(ckptio.InvalidArgument, match="barrier"):
        ckptio.CheckpointManager(str(tmp_path), barrier="nccl")
    with pytest.raises(ckptio.InvalidArgument, match="barrier"):
        ckptio.CheckpointManager(str(tmp_path), barrier=42)
    with pytest.raises(ckptio.InvalidArgument, match="barrier given twice"):
        ckptio.CheckpointManager(str(tmp_path), barrier=lambda n, t: None,
                                 processes=dict(index=0, count=2, run_id="r", barrier=lambda n, t: None))


def _half(i, g):
    """Process i's half of the leaf m/w of global array g (8 elements)."""
    return {"m": {"w": ckptio.Shards((8,), np.float32, [((slice(4 * i, 4 * i + 4),), g[4 * i:4 * i + 4].copy(), 0)])}}


def test_a_save_refused_in_python_fails_the_other_processes_at_once(tmp_path):
    """A state the Python layer refuses on one process (here metadata that is
    not JSON) is a refused save(), counted and announced as the library's
    save() counts one it refuses: the others fail the attempt at once, and the
    step saved again commits. Before, they waited out the timeout, and every
    save of the step after failed (the refusing process's count lagged by one,
    so its next attempt joined the failed one)."""
    run = uuid.uuid4().hex
    g = np.arange(8, dtype=np.float32)
    ms = [ckptio.CheckpointManager(str(tmp_path), processes=dict(index=i, count=2, run_id=run,
                                                                 timeout_seconds=60, poll_seconds=0.01))
          for i in range(2)]
    try:
        for step, refuser in ((1, 1), (2, 0)):  # a worker, then the coordinator
            t0 = time.monotonic()
            other = 1 - refuser
            h = ms[other].save(step, _half(other, g))
            with pytest.raises(ckptio.InvalidArgument, match="JSON"):
                ms[refuser].save(step, _half(refuser, g), metadata={"x": object()})
            with pytest.raises(ckptio.FailedPrecondition, match="JSON"):
                h.wait(timeout=60)
            assert time.monotonic() - t0 < 20, "the other process waited for the timeout"
            hs = [ms[i].save(step, _half(i, g)) for i in range(2)]  # again: one attempt id on both
            for x in hs:
                x.wait(timeout=60)
        for step in (1, 2):
            np.testing.assert_array_equal(ms[0].restore(step)["m"]["w"], g)
    finally:
        for m in ms:
            m.close()


def test_wait_with_a_timeout_from_a_callback_times_out(tmp_path):
    """h.wait(timeout) from a callback (the callbacks' thread) honours the
    timeout. Before, it waited for the save however long it took."""
    run = uuid.uuid4().hex
    g = np.arange(8, dtype=np.float32)
    ms = [ckptio.CheckpointManager(str(tmp_path), max_in_flight=2,
                                   processes=dict(index=i, count=2, run_id=run, timeout_seconds=4,
                                                  poll_seconds=0.01))
          for i in range(2)]
    try:
        h1 = [ms[i].save(1, _half(i, g)) for i in range(2)]
        h2 = ms[0].save(2, _half(0, g))  # process 1 never saves step 2: it fails after 4 s
        seen = queue.Queue()

        def in_callback(_):
            t0 = time.monotonic()
            try:
                h2.wait(timeout=0.3)
                seen.put(("returned", time.monotonic() - t0))
            except BaseException as e:  # noqa: B902
                seen.put((type(e).__name__, time.monotonic() - t0))

        h1[0].add_done_callback(in_callback)
        what, took = seen.get(timeout=60)
        assert what == "TimeoutError" and took < 2, (what, took)
        with pytest.raises(ckptio.Unavailable):
            h2.wait(timeout=60)
        h1[1].wait(timeout=60)
    finally:
        for m in ms:
            m.close()


def test_torch_processes_of_subgroups_share_one_run_id_per_group(monkeypatch):
    """torch_processes(group=g) on four processes in two groups ([0, 1] and
    [2, 3]): each group's processes get one run id, the groups different ones.
    Before, every group's rank 0 wrote one key of the world's store, so members
    of a group read another group's id. (The four processes are simulated in
    turn over one HashStore: each with its own count of calls.)"""
    torch = pytest.importorskip("torch")
    import datetime
    from ckptio import distributed

    dist = torch.distributed
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    groups = {"A": [0, 1], "B": [2, 3]}
    me = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: groups[group].index(me["rank"]))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: len(groups[group]))
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: groups[group])
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    ids = {}
    for rank, group in ((0, "A"), (2, "B"), (1, "A"), (3, "B")):  # each group's rank 0 first
        me["rank"] = rank
        fresh = collections.defaultdict(itertools.count) if isinstance(distributed._run_ids, dict) else itertools.count()
        monkeypatch.setattr(distributed, "_run_ids", fresh)
        ids[rank] = distributed.torch_processes(group=group)["run_id"]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2], ids


def test_torch_barrier_on_a_tcp_store():
    torch = pytest.importorskip("torch")
    import datetime
    import threading

    dist = torch.distributed
    if not dist.is_initialized():
        with pytest.raises(ckptio.FailedPrecondition, match="init_process_group"):
            ckptio.TorchBarrier()
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10),
                           wait_for_workers=False)
    with pytest.raises(ckptio.InvalidArgument, match="world_size"):
        ckptio.TorchBarrier(server)
    results = {}

    def member(i, name, n):
        client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=10))
        t0 = time.monotonic()
        # As the library calls it: from a thread of its own, taking the GIL for the call.
        results[(name, i)] = (_ckptio._barrier_wait_on_thread(ckptio.TorchBarrier(client, n), name, 1.0),
                              time.monotonic() - t0)

    threads = [threading.Thread(target=member, args=(i, "all", 3)) for i in range(3)]
    threads += [threading.Thread(target=member, args=(i, "short", 3)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert results[("all", i)][0] is None and results[("all", i)][1] < 1.0
    for i in range(2):
        (code, message), waited = results[("short", i)]
        assert code == "Unavailable" and "2 of 3 processes arrived within 1 s" in message and waited >= 0.9

    # Two managers of one process share its store client: process 0 waits at
    # barrier "a" on one thread while its arrival at "b", which process 1 must
    # pass before it arrives at "a", goes through the same client.
    def client():
        return dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=10))

    shared, other, order = client(), client(), []

    def p0(name, delay):
        time.sleep(delay)
        order.append((name, _ckptio._barrier_wait_on_thread(ckptio.TorchBarrier(shared, 2), name, 5.0)))

    def p1():
        for name in ("b", "a"):
            order.append((name, _ckptio._barrier_wait_on_thread(ckptio.TorchBarrier(other, 2), name, 5.0)))

    t0 = time.monotonic()
    threads = [threading.Thread(target=p0, args=("a", 0)), threading.Thread(target=p0, args=("b", 0.2)),
               threading.Thread(target=p1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(order) == [("a", None), ("a", None), ("b", None), ("b", None)]
    assert time.monotonic() - t0 < 2


def test_a_manager_closed_from_its_barrier_closes_on_a_thread_of_its_own(tmp_path):
    """A save's barrier runs on the manager's worker thread. A manager closed
    there (collected there by the cyclic GC, or closed by the barrier itself)
    closed on that thread, waiting for the save that thread runs: a deadlock.
    It now closes on a thread of its own, once the save is done."""
    b = threading.Barrier(2)
    closed_from = []

    class Barrier:
        def __init__(self, closer=None):
            self.closer = closer

        def wait(self, name, timeout_seconds):
            if self.closer is not None and not closed_from:
                closed_from.append(threading.current_thread())
                self.closer()
            b.wait(timeout_seconds)

    managers = {}
    run = uuid.uuid4().hex
    m0 = ckptio.CheckpointManager(str(tmp_path), processes=dict(index=0, count=2, run_id=run),
                                  barrier=Barrier(lambda: managers[0].close()))
    m1 = ckptio.CheckpointManager(str(tmp_path), processes=dict(index=1, count=2, run_id=run), barrier=Barrier())
    managers[0] = m0
    g = np.arange(8, dtype=np.float32)
    h0 = m0.save(1, {"m": {"w": ckptio.Shards((8,), np.float32, [((slice(0, 4),), g[:4].copy(), 0)])}})
    h1 = m1.save(1, {"m": {"w": ckptio.Shards((8,), np.float32, [((slice(4, 8),), g[4:].copy(), 0)])}})
    h1.wait(timeout=60)
    h0.wait(timeout=60)
    assert closed_from and isinstance(closed_from[0], threading._DummyThread)
    deadline = time.monotonic() + 60
    while not m0._c.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m0._c.closed and m0.closed
    m1.close()
    with ckptio.CheckpointManager(str(tmp_path)) as mgr:
        np.testing.assert_array_equal(mgr.restore(1)["m"]["w"], g)
