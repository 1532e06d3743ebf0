"""The contenders of bench/run-all, one function per (contender, direction).

Every function returns a dict of figures (GB/s are 1e9 bytes per second of
the state's payload bytes) and raises ContenderError on failure. None of them
drops the page cache: the caller does it (drop_caches) before every timed
read, so that the order of steps is visible in one place (run-all).
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20


class ContenderError(RuntimeError):
    pass


SETTLE_DEFAULT = 8.0


def add_settle_arg(ap):
    """The --settle and --uneven-start options of the benchmarks that restore
    into fresh memory."""
    ap.add_argument("--settle", type=float, default=SETTLE_DEFAULT,
                    help="seconds idle after dropping the page cache, before each restore but fio's "
                         "(default %g; docs/restart.md, 'Why fresh memory is slow on this VM')" % SETTLE_DEFAULT)
    ap.add_argument("--uneven-start", action="store_true",
                    help="do not first-touch as many bytes as the state before each restore into fresh memory "
                         "(touch_and_free)")


def touch_and_free(nbytes):
    """A fresh process first-touches `nbytes` of memory and exits. Run before
    each restore into fresh memory, so that all of them start after the same
    thing: a contender that followed numpy.load or torch.load (which free the
    state's arrays and as much page cache) otherwise first-touched memory the
    host still backed, and won by up to 3x (docs/restart.md, "What follows
    numpy.load wins")."""
    subprocess.run([sys.executable, "-c", "import mmap, sys; m = mmap.mmap(-1, int(sys.argv[1]), "
                    "flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS); m.madvise(23)", str(int(nbytes))],
                   check=True)  # 23: MADV_POPULATE_WRITE (Linux 5.14)


def drop_caches(settle=0.0):
    """sync, then drop the page cache. True when it was dropped (needs root).

    settle: seconds to wait after it, so that the memory the previous contender
    freed goes idle. Where the kernel reports free pages to the host
    (docs/restart.md), a contender started at once would first-touch that
    memory still backed, ~2x faster than one started after an O_DIRECT reader,
    and the rotation order, not the contender, would set its speed. (fio's
    reads need no wait: they go into one reused buffer.)"""
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        dropped = True
    except OSError:
        dropped = False
    if settle:
        time.sleep(settle)
    return dropped


def _run(args, env=None, timeout=None):
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise ContenderError("%s exited %d: %s" % (" ".join(args[:4]), p.returncode,
                                                   (p.stderr or p.stdout).strip()[-800:]))
    return p.stdout


def _json_out(text):
    i = text.find("{")
    if i < 0:
        raise ContenderError("no JSON in output: %r" % text[-400:])
    return json.loads(text[i:])


def _group_pids(pgid):
    """The processes of process group pgid (a server started in a session of its own)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            f = _proc_stat(d)
            if f and int(f[2]) == pgid:
                out.append(d)
    return out


def _proc_stat(pid):
    try:
        with open("/proc/%s/stat" % pid) as f:
            st = f.read()
    except OSError:
        return None
    return st[st.rindex(")") + 2:].split()


def _cpu_ticks(pids):
    """(the pids' utime + stime, all threads; the machine's busy ticks: all but idle and iowait)."""
    server = 0
    for pid in pids or ():
        f = _proc_stat(pid)
        if f:
            server += int(f[11]) + int(f[12])
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return server, sum(v) - v[3] - v[4]


class CpuMeter:
    """The CPU a phase used, in cores (CPU seconds per second of wall time):
    by a server (every process of its process group, all threads: utime +
    stime from /proc/PID/stat) and by the whole machine (/proc/stat). The
    profile that says whether a server or the machine was the limit.
    Resolution: one clock tick (10 ms)."""

    def __init__(self, pgid=None):
        self.pids = _group_pids(pgid) if pgid is not None else None
        self.result = {}

    def __enter__(self):
        self._t0 = time.monotonic()
        self._c0 = _cpu_ticks(self.pids)
        return self

    def __exit__(self, *exc):
        dt = time.monotonic() - self._t0
        c1 = _cpu_ticks(self.pids)
        hz = os.sysconf("SC_CLK_TCK")
        if dt > 0:
            self.result = {"machine_cores": (c1[1] - self._c0[1]) / hz / dt}
            if self.pids:
                self.result["server_cores"] = (c1[0] - self._c0[0]) / hz / dt
        return False


class CpuSampler:
    """CpuMeter for a window known only afterwards (a phase inside another
    process): samples the ticks every `period` seconds on time.monotonic(),
    which is CLOCK_MONOTONIC, the clock of ckptio's steady_clock; cores(t0, t1)
    then reads them for any window, interpolating between samples."""

    def __init__(self, pgid=None, period=0.02):
        import threading
        self.pids = _group_pids(pgid) if pgid is not None else None
        self.period = period
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            self.samples.append((time.monotonic(),) + _cpu_ticks(self.pids))
            if self._stop.wait(self.period):
                self.samples.append((time.monotonic(),) + _cpu_ticks(self.pids))
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def _at(self, t, i):
        s = self.samples
        for k in range(1, len(s)):
            if s[k][0] >= t:
                a, b = s[k - 1], s[k]
                return a[i] + (b[i] - a[i]) * (t - a[0]) / (b[0] - a[0]) if b[0] > a[0] else b[i]
        return s[-1][i]

    def cores(self, t0, t1):
        """{"server_cores", "machine_cores"} for [t0, t1], or {} if not sampled."""
        if len(self.samples) < 2 or t1 <= t0 or t0 < self.samples[0][0] or t1 > self.samples[-1][0]:
            return {}
        hz = os.sysconf("SC_CLK_TCK")
        out = {"machine_cores": (self._at(t1, 2) - self._at(t0, 2)) / hz / (t1 - t0)}
        if self.pids:
            out["server_cores"] = (self._at(t1, 1) - self._at(t0, 1)) / hz / (t1 - t0)
        return out


def fsync_tree(root):
    """fsync every file and directory under root (files first), then root's parent."""
    for d, dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    parent = os.path.dirname(os.path.abspath(root))
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- fio ---------------------------------------------------------------------

FIO_MODES = {
    # key: (rw, direct)
    "fio_write_direct": ("write", True),
    "fio_write_buffered": ("write", False),
    "fio_read_direct": ("read", True),
    "fio_read_buffered": ("read", False),
}


def fio(path, size, rw, direct):
    """One fio job, bs=1M. direct: O_DIRECT io_uring iodepth 32; else buffered
    psync, writes ending with an fsync (end_fsync=1, inside the job's runtime)."""
    args = ["fio", "--name=bench", "--filename=" + path, "--size=%d" % size, "--bs=1M",
            "--rw=" + rw, "--output-format=json"]
    if direct:
        args += ["--direct=1", "--ioengine=io_uring", "--iodepth=32"]
    else:
        args += ["--direct=0", "--ioengine=psync"]
        if rw == "write":
            args += ["--end_fsync=1"]
    job = _json_out(_run(args))["jobs"][0]
    part = job["write" if rw == "write" else "read"]
    # bw_bytes counts the I/O phase only; the fsync of a buffered write is in
    # the job's runtime, so bytes / job runtime is the honest figure.
    runtime_s = job.get("job_runtime", 0) / 1000.0
    return size / runtime_s / 1e9 if runtime_s > 0 else part["bw_bytes"] / 1e9


def fio_job(path, size, rw, jobs, depth, bs, direct):
    """One sequential pass over `path`'s first `size` bytes by `jobs` fio jobs,
    each over its own part, `bs`-byte requests: O_DIRECT io_uring at `depth`,
    or buffered psync (writes end with an fsync inside the job's runtime).
    Reads need the file; writes create it. GB/s of the whole pass."""
    size = size // (jobs * bs) * (jobs * bs)
    args = ["fio", "--name=pass", "--filename=" + path, "--rw=" + rw, "--bs=%d" % bs,
            "--size=%d" % (size // jobs), "--numjobs=%d" % jobs, "--offset_increment=%d" % (size // jobs),
            "--group_reporting", "--output-format=json"] + (["--readonly"] if rw == "read" else [])
    args += ["--direct=1", "--ioengine=io_uring", "--iodepth=%d" % depth] if direct else \
            ["--direct=0", "--ioengine=psync"] + (["--end_fsync=1"] if rw == "write" else [])
    job = _json_out(_run(args))["jobs"][0]
    if rw == "read":
        return job["read"]["bw_bytes"] / 1e9
    runtime_s = job.get("job_runtime", 0) / 1000.0  # includes the end_fsync
    return size / runtime_s / 1e9 if runtime_s > 0 else job["write"]["bw_bytes"] / 1e9


# What "the disk's best" means in bench/restart_bench.py and bench/python_bench.py
# (issue 30): the best of one job at depth 32 with 1 MiB requests, 8 jobs at
# depth 8 with 8 MiB requests, and buffered 1 MiB requests.
FIO_BEST = (("1x32_1m", 1, 32, 1 << 20, True), ("8x8_8m", 8, 8, 8 << 20, True), ("buffered", 1, 1, 1 << 20, False))


def fio_best(path, size, rw, drop=None):
    """{"1x32_1m": GB/s, "8x8_8m": ..., "buffered": ..., "best": the highest}
    for reads of `path` (drop() before each) or writes to it."""
    out = {}
    for key, jobs, depth, bs, direct in FIO_BEST:
        if drop is not None:
            drop()
        out[key] = fio_job(path, size, rw, jobs, depth, bs, direct)
    out["best"] = max(out[k] for k, *_ in FIO_BEST)
    return out


def fio_all(workdir, size, drop):
    """The four fio modes on one file; returns {key: GB/s, 'cold': bool}."""
    path = os.path.join(workdir, "fio.dat")
    out = {"cold": True}
    try:
        for key in ("fio_write_direct", "fio_write_buffered", "fio_read_direct", "fio_read_buffered"):
            rw, direct = FIO_MODES[key]
            if rw == "read" and drop:
                out["cold"] &= drop_caches()
            out[key] = fio(path, size, rw, direct)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return out


# ---- ckptio ------------------------------------------------------------------

def ckptio_bench(exe, uri, size, staging, leaves=None, env=None, global_args=(), warmup=1,
                 fresh=True, timeout=3600, server_pgid=None):
    """One `ckptio bench` (one timed save after `warmup` warm-up saves, a restore
    into warm buffers and, with fresh, one into fresh memory). Its JSON; with
    server_pgid, the warm restore's CPU profile as restore_*_cores (CpuSampler
    over the window the run reports)."""
    args = [exe] + list(global_args) + ["bench", "--uri", uri, "--bytes", str(size),
                                        "--staging", staging, "--repeat", "1",
                                        "--warmup", str(warmup), "--json"]
    if leaves:
        args += ["--leaves", str(leaves)]
    if not fresh:
        args += ["--no-fresh-restore"]
    sampler = CpuSampler(server_pgid) if server_pgid is not None else None
    if sampler:
        with sampler:
            p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    else:
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    if not p.stdout.strip().startswith("{"):
        raise ContenderError("ckptio bench exited %d: %s" % (p.returncode, p.stderr.strip()[-800:]))
    b = json.loads(p.stdout)
    if not b.get("verified"):
        raise ContenderError("ckptio bench did not verify its restore: %s" % b.get("error"))
    run = (b.get("runs") or [{}])[0]
    if sampler and run.get("restore_started_monotonic_s"):
        t0 = run["restore_started_monotonic_s"]
        b.update({"restore_" + k: v for k, v in sampler.cores(t0, t0 + run["restore_seconds"]).items()})
    return b


def ckptio_synth_save(exe, uri, size, staging="borrow", leaves=None, extra=(), step=1):
    args = [exe, "synth", "save", uri, "--step", str(step), "--bytes", str(size),
            "--staging", staging, "--json", "--overwrite"] + list(extra)
    if leaves:
        args += ["--leaves", str(leaves)]
    return _json_out(_run(args))


def ckptio_synth_check(exe, uri, extra=(), step=1):
    j = _json_out(_run([exe, "synth", "check", uri, "--step", str(step), "--json"] + list(extra)))
    if not j.get("verified"):
        raise ContenderError("ckptio synth check did not verify: %s" % j.get("error"))
    return j


def cli_help(exe, *sub):
    p = subprocess.run([exe] + list(sub) + ["--help"], capture_output=True, text=True)
    return p.stdout + p.stderr


# ---- zarr v2 (the layout eformer / JAX users write) ---------------------------

def zarr_save(state, root):
    """One zarr v2 array per leaf under root/<prefix>/<path>, one chunk per array
    (a single-process save has one shard per leaf), Zstd level 1, written by
    zarr-python; an index JSON; then fsync of every file and directory."""
    import numcodecs
    import zarr
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    os.makedirs(root)
    index = {"prefixes": {}}
    comp = numcodecs.Zstd(level=1)
    for l, a in zip(state.leaves, state.arrays):
        store = zarr.DirectoryStore(os.path.join(root, l["prefix"], l["path"]))
        z = zarr.open_array(store=store, mode="w", shape=a.shape, chunks=a.shape if a.ndim else True,
                            dtype=a.dtype, compressor=comp, fill_value=None)
        z[...] = a
        index["prefixes"].setdefault(l["prefix"], []).append(
            {"path": l["path"], "dtype": l["dtype"], "shape": l["shape"]})
    with open(os.path.join(root, "tensorstore_index.json"), "w") as f:
        json.dump(index, f)
    fsync_tree(root)
    dt = time.perf_counter() - t0
    on_disk = sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(root) for n in fs)
    return {"seconds": dt, "gbps": state.total_bytes / dt / 1e9, "bytes_on_disk": on_disk}


def zarr_load(state, root, verify=True):
    import zarr
    t0 = time.perf_counter()
    out = []
    for l in state.leaves:
        z = zarr.open_array(store=zarr.DirectoryStore(os.path.join(root, l["prefix"], l["path"])), mode="r")
        out.append(z[...])
    dt = time.perf_counter() - t0
    if verify:
        _verify(state, out, "zarr")
    return {"seconds": dt, "gbps": state.total_bytes / dt / 1e9}


# ---- numpy.save / numpy.load per leaf (the naive baseline) ---------------------

def numpy_save(state, root):
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    for l, a in zip(state.leaves, state.arrays):
        d = os.path.join(root, l["prefix"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, l["path"] + ".npy"), "wb") as f:
            np.save(f, a)
            f.flush()
            os.fsync(f.fileno())
    for d in {os.path.join(root, l["prefix"]) for l in state.leaves} | {root}:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "gbps": state.total_bytes / dt / 1e9}


def numpy_load(state, root, verify=True):
    t0 = time.perf_counter()
    out = [np.load(os.path.join(root, l["prefix"], l["path"] + ".npy")) for l in state.leaves]
    dt = time.perf_counter() - t0
    if verify:
        _verify(state, out, "numpy")
    return {"seconds": dt, "gbps": state.total_bytes / dt / 1e9}


def _verify(state, loaded, who):
    for l, a, b in zip(state.leaves, state.arrays, loaded):
        if a.shape != b.shape or not np.array_equal(a.reshape(-1).view(np.uint8),
                                                    np.ascontiguousarray(b).reshape(-1).view(np.uint8)):
            raise ContenderError("%s: leaf %s/%s differs after the round trip" % (who, l["prefix"], l["path"]))


# ---- S3: boto3 and parallel curl ----------------------------------------------

def read_env(path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "s3"))
    import s3lib
    return s3lib.read_env(path)


class _MemReader(io.RawIOBase):
    def __init__(self, buf):
        self._m = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, off, whence=0):
        self._pos = off if whence == 0 else self._pos + off if whence == 1 else len(self._m) + off
        return self._pos

    def readinto(self, b):
        n = min(len(b), len(self._m) - self._pos)
        b[:n] = self._m[self._pos:self._pos + n]
        self._pos += n
        return n


class _MemWriter(io.RawIOBase):
    """Writes into a preallocated (warm) buffer at seek positions."""

    def __init__(self, buf):
        self._m = memoryview(buf).cast("B")
        self._pos = 0

    def writable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, off, whence=0):
        self._pos = off if whence == 0 else self._pos + off if whence == 1 else len(self._m) + off
        return self._pos

    def write(self, b):
        n = len(b)
        self._m[self._pos:self._pos + n] = b
        self._pos += n
        return n


def boto3_roundtrip(env, arena, dest, server_pgid=None):
    """upload_fileobj then download_fileobj of the whole state as one object
    (boto3's best case: every part in parallel), max_concurrency 10, 16 MiB
    parts; the download goes into a warm buffer and is compared afterwards.
    The download's CPU profile (CpuMeter) comes back as restore_*_cores."""
    import boto3
    import botocore.config
    from boto3.s3.transfer import TransferConfig
    s3 = boto3.client("s3", endpoint_url=env["endpoint"], region_name=env["region"],
                      aws_access_key_id=env["access_key"], aws_secret_access_key=env["secret_key"],
                      config=botocore.config.Config(s3={"addressing_style": "path"},
                                                    max_pool_connections=10,
                                                    retries={"max_attempts": 3}))
    cfg = TransferConfig(multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB,
                         max_concurrency=10, use_threads=True)
    key = "bench-boto3-%s/state.bin" % uuid.uuid4().hex[:8]
    n = arena.nbytes
    t0 = time.perf_counter()
    s3.upload_fileobj(_MemReader(arena), env["bucket"], key, Config=cfg)
    up = time.perf_counter() - t0
    with CpuMeter(server_pgid) as meter:
        t0 = time.perf_counter()
        s3.download_fileobj(env["bucket"], key, _MemWriter(dest), Config=cfg)
        down = time.perf_counter() - t0
    try:
        s3.delete_object(Bucket=env["bucket"], Key=key)
    except Exception:  # noqa: BLE001 - cleanup only
        pass
    if not np.array_equal(arena, dest[:n]):
        raise ContenderError("boto3: downloaded object differs from the upload")
    out = {"save_gbps": n / up / 1e9, "restore_gbps": n / down / 1e9}
    out.update({"restore_" + k: v for k, v in meter.result.items()})
    return out


def curl_parallel(env, total_bytes, n=8, server_pgid=None):
    """n parallel curl PUTs of total_bytes/n each from tmpfs, then n GETs to
    /dev/null: the server's ceiling for this many connections. The GETs' CPU
    profile (CpuMeter) comes back as restore_*_cores."""
    import urllib.parse
    sys.path.insert(0, os.path.join(ROOT, "tests", "s3"))
    import s3lib
    u = urllib.parse.urlsplit(env["endpoint"])
    part = total_bytes // n
    tmp = tempfile.mkdtemp(prefix="ckptio-curl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    src = os.path.join(tmp, "src.bin")
    with open(src, "wb") as f:
        left = part
        while left:
            k = min(left, 64 * MiB)
            f.write(os.urandom(k))
            left -= k
    prefix = "bench-curl-%s/" % uuid.uuid4().hex[:8]

    def cmd(method, key, extra):
        path = "/%s/%s%s" % (env["bucket"], prefix, key)
        h = s3lib.sign_v4(method, u.netloc, path, None, {}, s3lib.UNSIGNED_PAYLOAD,
                          env["access_key"], env["secret_key"], env["region"])
        # A stalled server fails the run in a minute instead of hanging it
        # (s3rver once stopped answering 8 GETs mid-body).
        c = ["curl", "-sS", "-f", "-o", "/dev/null", "--speed-limit", "100000", "--speed-time", "60", "-X", method]
        for k, v in h.items():
            c += ["-H", "%s: %s" % (k, v)]
        return c + extra + [env["endpoint"] + s3lib.uri_encode(path, True)]

    res = {}
    try:
        for method in ("PUT", "GET"):
            cmds = [cmd(method, "o%d" % i, ["-T", src, "-H", "Expect:"] if method == "PUT" else [])
                    for i in range(n)]
            with CpuMeter(server_pgid) as meter:
                t0 = time.perf_counter()
                procs = [subprocess.Popen(c, stderr=subprocess.PIPE) for c in cmds]
                errs = [p.communicate()[1] for p in procs]
                dt = time.perf_counter() - t0
            if any(p.returncode for p in procs):
                raise ContenderError("curl %s failed: %s" % (method, b" ".join(errs)[-400:].decode(errors="replace")))
            res["save_gbps" if method == "PUT" else "restore_gbps"] = n * part / dt / 1e9
            if method == "GET":
                res.update({"restore_" + k: v for k, v in meter.result.items()})
    finally:
        for i in range(n):
            try:
                s3lib.request(env, "DELETE", "/%s/%so%d" % (env["bucket"], prefix, i))
            except Exception:  # noqa: BLE001 - cleanup only
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    return res
