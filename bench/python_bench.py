#!/usr/bin/python3
"""The Python benchmarks of issue 28 (item 5), in one run: ckptio's Python
package against the C++ library on the same leaves, and against what a
Python user picks instead (torch.save / torch.load of a state_dict, numpy.save
/ numpy.load per leaf, zarr-python v2), same bytes, same disk; contenders
alternated, medians of several repetitions, cold page cache before every
read, every restore into fresh memory in a fresh process.

  PYTHONPATH=<build>/python /usr/bin/python3 bench/python_bench.py \\
      --ckptio <build>/bin/ckptio [--bytes 2GiB] [--repeat 5] [--dir /var/tmp] [--json FILE|-]

bench/run-all runs it as its `python` section (docs/benchmarks.md, "Python").

The state: ckptio's synthetic transformer state (layout transformer-v1). The
leaf list (prefix, path, dtype, shape) is read back with `ckptio inspect
--json` from a step that `ckptio synth save` wrote, and the bytes are made by
the same generator (bench/synthpy.py), so the leaves are exactly those of
`ckptio bench` and `ckptio synth`. bf16 leaves are handed to ckptio as
`ckptio.raw_array(bits, "bfloat16")` (the same leaf as C++ saves, which
`ckptio synth check` can verify) and to torch as bfloat16 tensors; numpy and
zarr hold them as uint16 (same bytes).

Per repetition (the order of the contenders rotates by one each repetition):
  saves:   ckptio borrow (stall = time save() blocks; save = save() to commit),
           ckptio copy (stall; ÷ one memcpy of the state into warm arrays,
           measured right after), `ckptio bench` borrow and copy (the C++
           stall of the same leaves), torch.save + fsync, numpy.save per leaf
           + fsync, zarr-python v2 (bench/contenders.py, as bench/run-all);
  restores (each after a process that first-touches as many bytes as the
           state and exits, `sync; echo 3 > /proc/sys/vm/drop_caches` and
           --settle seconds, 8 by default, so that each starts on memory freed
           and left idle alike, as in bench/restart_bench.py (fio's reads
           excepted; --uneven-start: without the first touch), each in a fresh
           process, timed around the load call only, verified against a
           CRC32 of every leaf afterwards): ckptio's Python restore() and the
           CLI's `ckptio synth check` of the same step (which the Python borrow
           save wrote), torch.load, numpy.load, zarr;
  GIL:     the iteration rate of a pure-Python counting thread over a whole
           save (save() to commit) and a whole restore, against its rate while
           the process idles; the same loop in a separate process (no shared
           GIL) as a control for CPU contention on this 2-core machine.
Diagnostics (not the targets' figures): per save, where the stall went (the
Python tree walk, the extension call, the C++ save() inside it); per Python
restore, the extension call against the Python-side conversion.
"""
import argparse
import datetime
import gc
import json
import mmap
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from sizes import parse_size  # noqa: E402

import numpy as np  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
T0 = time.monotonic()
CHUNK = 8 * MiB  # ManagerOptions::chunk_size's default: copy mode's pool is rounded up to it


def log(msg):
    print("[py %6.0fs] %s" % (time.monotonic() - T0, msg), file=sys.stderr, flush=True)


def size_name(n):
    for u, m in (("GiB", GiB), ("MiB", MiB)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, u)
    return "%.1f MiB" % (n / MiB)


def med(v):
    return statistics.median(v) if v else None


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def leaf_crc(a):
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- children: one fresh process per restore ------------------------------------

def child_restore(a):
    """Loads one contender's files in this (fresh) process; prints JSON. Only
    the load call is timed; imports and opening come first, as for the CLI
    (which reads the step's index before its timed restore)."""
    with open(a.expect) as f:
        exp = json.load(f)
    names, crcs = exp["names"], exp["crc"]
    out = {"who": a.child}
    if a.child == "ckptio":
        import ckptio
        mgr = ckptio.CheckpointManager(a.path)
        mgr.leaves(exp["step"])  # the index, read before the timed restore as `synth check` does
        real = mgr._c
        inner = {}

        class Timed:  # how long the extension call takes, against restore() as a whole
            def __getattr__(self, k):
                return getattr(real, k)

            def restore(self, *args):
                t = time.perf_counter()
                r = real.restore(*args)
                inner["ext_s"] = time.perf_counter() - t
                inner["stats"] = r.get("stats")
                return r
        mgr._c = Timed()
        gc.collect()
        t0 = time.perf_counter()
        tree = mgr.restore(exp["step"])
        out["seconds"] = time.perf_counter() - t0
        out["ext_seconds"] = inner.get("ext_s")
        st = inner.get("stats")
        if isinstance(st, dict):
            out["lib_stats"] = {k: v for k, v in st.items() if isinstance(v, (int, float))}
        got = [tree[n.split("/", 1)[0]][n.split("/", 1)[1]] for n in names]
        mgr.close()
    elif a.child == "torch":
        import torch
        gc.collect()
        t0 = time.perf_counter()
        sd = torch.load(a.path)
        out["seconds"] = time.perf_counter() - t0
        got = []
        for n in names:
            t = sd[n.split("/", 1)[0]][n.split("/", 1)[1]]
            got.append(t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy())
    elif a.child == "numpy":
        gc.collect()
        t0 = time.perf_counter()
        got = [np.load(os.path.join(a.path, n + ".npy")) for n in names]
        out["seconds"] = time.perf_counter() - t0
    elif a.child == "zarr":
        import zarr
        gc.collect()
        t0 = time.perf_counter()
        got = [zarr.open_array(store=zarr.DirectoryStore(os.path.join(a.path, n)), mode="r")[...] for n in names]
        out["seconds"] = time.perf_counter() - t0
    else:
        sys.exit("unknown child " + a.child)
    bad = [n for n, g, c in zip(names, got, crcs) if leaf_crc(g) != c]
    out["verified"] = not bad
    if bad:
        out["error"] = "%d leaves differ, first %s" % (len(bad), bad[0])
    with open("/proc/self/status") as f:
        out["peak_rss_bytes"] = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    print(json.dumps(out))


def child_counter(a):
    """The counting loop in a process of its own (the control: no GIL shared
    with the saving process). Publishes its count through a shared file."""
    with open(a.path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8)
    box = memoryview(mm).cast("q")
    n = 0
    while True:
        n += 1
        box[0] = n


# ---- the parent -------------------------------------------------------------------

HZ = os.sysconf("SC_CLK_TCK")


def task_sample(pid, tid):
    """(CPU seconds, voluntary and involuntary context switches) of one thread.
    The counting loop never sleeps of its own accord: its voluntary switches
    are waits for the GIL; involuntary ones are preemptions (CPU contention)."""
    try:
        with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
            st = f.read()
        fields = st[st.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / HZ
        vol = invol = 0
        with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    vol = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    invol = int(line.split()[1])
        return cpu, vol, invol
    except (OSError, ValueError, IndexError):
        return None


def machine_busy():
    """Busy CPU seconds of the whole machine so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / HZ


class Counter(threading.Thread):
    """A pure-Python thread counting as fast as it can: its rate over a window
    is what a training loop's own Python code would get."""

    def __init__(self):
        super().__init__(daemon=True, name="gil-counter")
        self.box = [0]
        self.go = True
        self.tid = None

    def run(self):
        self.tid = threading.get_native_id()
        box = self.box
        n = 0
        while self.go:
            n += 1
            box[0] = n

    def read(self):
        return self.box[0], time.perf_counter(), task_sample(os.getpid(), self.tid), machine_busy()


class ProcCounter:
    """The same loop in a separate process (child_counter)."""

    def __init__(self, workdir):
        self.path = os.path.join(workdir, "counter.shm")
        with open(self.path, "wb") as f:
            f.write(b"\0" * 8)
        with open(self.path, "r+b") as f:
            self.mm = mmap.mmap(f.fileno(), 8)
        self.box = memoryview(self.mm).cast("q")
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", "counter",
                                   "--path", self.path])
        t = time.monotonic()
        while self.box[0] == 0 and time.monotonic() - t < 30:
            time.sleep(0.01)

    def read(self):
        return self.box[0], time.perf_counter(), task_sample(self.p.pid, self.p.pid), machine_busy()

    def stop(self):
        self.p.kill()
        self.p.wait()
        self.box.release()
        self.mm.close()


def rate(c0, c1):
    return (c1[0] - c0[0]) / (c1[1] - c0[1]) if c1[1] > c0[1] else None


def window(c0, c1):
    """The counter's rate over [c0, c1], and where its time went: its share of
    a CPU, its GIL waits (voluntary switches) and preemptions per second, and
    the CPUs the whole machine kept busy."""
    dt = c1[1] - c0[1]
    out = {"rate": rate(c0, c1), "machine_cores": (c1[3] - c0[3]) / dt}
    if c0[2] and c1[2]:
        out.update(on_cpu=(c1[2][0] - c0[2][0]) / dt, gil_waits_per_s=(c1[2][1] - c0[2][1]) / dt,
                   preempted_per_s=(c1[2][2] - c0[2][2]) / dt)
    return out


class Bench:
    def __init__(self, a):
        self.a = a
        self.exe = a.ckptio
        self.dir = a.workdir
        self.runs = {}
        self.errors = []
        self.notes = []
        self.cold = True

    def add(self, k, v):
        if v is not None:
            self.runs.setdefault(k, []).append(v)

    def err(self, what, e):
        msg = "%s: %s" % (what, str(e).strip()[-600:])
        log("ERROR " + msg)
        self.errors.append(msg)

    def drop(self, settle=True):
        import contenders as C
        ok = C.drop_caches(self.a.settle if settle else 0)
        self.cold &= ok
        return ok

    # -- setup
    def setup(self):
        import synthpy
        a = self.a
        d = os.path.join(self.dir, "layout-export")
        subprocess.run([self.exe, "synth", "save", d, "--step", "0", "--bytes", str(a.bytes), "--leaves",
                        str(a.leaves), "--seed", "0"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        j = json.loads(subprocess.run([self.exe, "inspect", d, "--json"], check=True, capture_output=True,
                                      text=True).stdout)
        shutil.rmtree(d, ignore_errors=True)
        self.metadata = j["metadata"]  # {"synth": {...}}: the Python-saved step is then `synth check`able
        leaves = [{"prefix": l["prefix"], "path": l["path"], "dtype": l["dtype"], "shape": list(l["shape"]),
                   "bytes": int(l["bytes"])} for l in j["leaves"]]
        t = time.perf_counter()
        self.st = synthpy.State(leaves)
        log("state: %s in %d leaves (%s), generated in %.1f s" % (
            size_name(a.bytes), len(leaves), ", ".join(sorted({l["dtype"] for l in leaves})),
            time.perf_counter() - t))
        self.total = self.st.total_bytes
        self.names = self.st.names()
        self.expect = os.path.join(self.dir, "expect.json")
        self.fio_file = os.path.join(self.dir, "fio-read.dat")
        with open(self.expect, "w") as f:
            json.dump({"names": self.names, "crc": [leaf_crc(x) for x in self.st.arrays], "step": 2}, f)
        import ckptio
        self.ckptio = ckptio
        self.tree = {}
        for l, x in zip(self.st.leaves, self.st.arrays):
            leaf = ckptio.raw_array(x, "bfloat16") if l["dtype"] == "bfloat16" else x
            self.tree.setdefault(l["prefix"], {})[l["path"]] = leaf
        try:
            import torch
            self.torch = torch
            self.sd = {}
            for l, x in zip(self.st.leaves, self.st.arrays):
                t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if l["dtype"] == "bfloat16" \
                    else torch.from_numpy(x)
                self.sd.setdefault(l["prefix"], {})[l["path"]] = t
            self.torch_version = torch.__version__
        except ImportError as e:
            self.torch = None
            self.torch_version = "missing"
            self.notes.append("torch is not importable (%s): the torch.save / torch.load rows are skipped "
                              "(Debian: python3-torch)" % e)
            log("SKIPPED torch: " + str(e))
        try:
            import numcodecs  # noqa: F401
            import zarr
            self.zarr_version = zarr.__version__
            if not zarr.__version__.startswith("2."):
                raise ImportError("zarr %s is not zarr-python v2" % zarr.__version__)
            self.has_zarr = True
        except ImportError as e:
            self.has_zarr = False
            self.zarr_version = "missing"
            self.notes.append("zarr-python v2 is not importable (%s): the zarr rows are SKIPPED "
                              "(Debian: python3-zarr python3-numcodecs, installed by tools/setup-deps --bench)" % e)
            log("SKIPPED zarr: " + str(e))
        # One memcpy of the state: per leaf into preallocated arrays, touched first (warm).
        self.dst = [np.empty_like(x) for x in self.st.arrays]
        for x in self.dst:
            x.reshape(-1).view(np.uint8)[:] = 0xA5
        self.dcp = dcp_status()

    # -- saves
    def ck_save(self, mode, profile=True):
        ck = self.ckptio
        root = os.path.join(self.dir, "ck-" + mode)
        shutil.rmtree(root, ignore_errors=True)
        kw = dict(staging=mode)
        if mode == "copy":  # as `ckptio bench`: a pool that holds the whole state, so save() never waits for the disk
            kw["staging_budget"] = (self.total + CHUNK - 1) // CHUNK * CHUNK
        mgr = ck.CheckpointManager(root, **kw)
        try:
            h = mgr.save(1, self.tree, metadata=self.metadata)  # warm-up (untimed), as `ckptio bench --warmup 1`
            h.wait()
            gc.collect()
            t0 = time.perf_counter()
            h = mgr.save(2, self.tree, metadata=self.metadata)
            t1 = time.perf_counter()
            h.wait()
            t2 = time.perf_counter()
            p = "py_" + mode
            self.add(p + "_stall_ms", (t1 - t0) * 1e3)
            self.add(p + "_save_gbps", self.total / (t2 - t0) / 1e9)
            self.add(p + "_lib_stall_ms", h.stats.stall_seconds * 1e3)
            mgr.remove_step(1)
            if mode == "copy":
                ms = self.memcpy_ms()
                self.add("memcpy_ms", ms)
                self.add("py_copy_stall_vs_memcpy", (t1 - t0) * 1e3 / ms)
            if profile:
                self.profile_save(mgr, mode)
                mgr.remove_step(3)
        finally:
            mgr.close()
        if mode == "copy":
            shutil.rmtree(root, ignore_errors=True)

    def profile_save(self, mgr, mode):
        """One more save (step 3, not counted above), its stall cut in three:
        the Python side (tree walk, leaf checks, metadata JSON), the
        extension's call (pybind11 conversion of the leaf list + C++ save()),
        and the C++ save() itself (SaveStats.stall_seconds)."""
        real = mgr._c
        box = {}

        class Timed:
            def __getattr__(self, k):
                return getattr(real, k)

            def save(self, *args):
                t = time.perf_counter()
                r = real.save(*args)
                box["ext"] = time.perf_counter() - t
                return r
        mgr._c = Timed()
        try:
            gc.collect()
            t0 = time.perf_counter()
            h = mgr.save(3, self.tree, metadata=self.metadata)
            t1 = time.perf_counter()
            h.wait()
        finally:
            mgr._c = real
        total, ext, lib = (t1 - t0) * 1e3, box["ext"] * 1e3, h.stats.stall_seconds * 1e3
        p = "prof_%s_" % mode
        self.add(p + "stall_ms", total)
        self.add(p + "python_ms", total - ext)
        self.add(p + "binding_ms", ext - lib)
        self.add(p + "lib_ms", lib)

    def memcpy_ms(self):
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            for s, d in zip(self.st.arrays, self.dst):
                np.copyto(d, s)
            best.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(best)

    def cpp_bench(self, mode):
        import contenders as C
        uri = os.path.join(self.dir, "cpp-" + mode)
        try:
            b = C.ckptio_bench(self.exe, uri, self.a.bytes, mode, self.a.leaves, fresh=False)
        finally:
            shutil.rmtree(uri, ignore_errors=True)
        self.cold &= bool(b.get("cold_cache", True))
        self.add("cpp_%s_stall_ms" % mode, b["stall_ms"])
        self.add("cpp_%s_save_gbps" % mode, b["save_gbps"])
        if mode == "copy":
            self.add("cpp_memcpy_ms", b["memcpy_ms"])
            self.add("cpp_copy_stall_vs_memcpy", b["stall_vs_memcpy"])

    def torch_save(self):
        torch = self.torch
        root = os.path.join(self.dir, "torch")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        gc.collect()
        t0 = time.perf_counter()
        with open(os.path.join(root, "state.pt"), "wb") as f:
            torch.save(self.sd, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(root)
        dt = time.perf_counter() - t0
        self.add("torch_save_gbps", self.total / dt / 1e9)
        self.add("torch_file_bytes", os.path.getsize(os.path.join(root, "state.pt")))

    def fio_write(self):
        """The disk's best sequential write of the state's size (contenders.FIO_BEST)."""
        import contenders as C
        path = os.path.join(self.dir, "fio-write.dat")
        try:
            f = C.fio_best(path, self.total, "write")
        finally:
            if os.path.exists(path):
                os.unlink(path)
        for k, v in f.items():
            self.add("fio_write_%s_gbps" % k, v)

    def numpy_save(self):
        import contenders as C
        gc.collect()
        s = C.numpy_save(self.st, os.path.join(self.dir, "numpy"))
        self.add("numpy_save_gbps", s["gbps"])

    def zarr_save(self):
        import contenders as C
        gc.collect()
        s = C.zarr_save(self.st, os.path.join(self.dir, "zarr"))
        self.add("zarr_save_gbps", s["gbps"])
        self.add("zarr_bytes_on_disk", s["bytes_on_disk"])

    # -- restores: fresh process, cold cache
    def child(self, who, path):
        self.even_start()
        self.drop()
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", who, "--path", path,
                            "--expect", self.expect], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0 or not p.stdout.strip():
            raise RuntimeError("child %s exited %d: %s" % (who, p.returncode, p.stderr.strip()[-800:]))
        j = json.loads(p.stdout.strip().splitlines()[-1])
        if not j.get("verified"):
            raise RuntimeError("child %s: restored bytes differ: %s" % (who, j.get("error")))
        return j

    def even_start(self):
        """Every restore into fresh memory starts after the same first touch
        of as many bytes as the state (contenders.touch_and_free)."""
        if not self.a.uneven_start:
            import contenders as C
            C.touch_and_free(self.total)

    def restore(self, who):
        if who == "py_restore":
            j = self.child("ckptio", os.path.join(self.dir, "ck-borrow"))
            self.add("py_restore_gbps", self.total / j["seconds"] / 1e9)
            if j.get("ext_seconds"):
                self.add("prof_restore_python_ms", (j["seconds"] - j["ext_seconds"]) * 1e3)
                self.add("prof_restore_ext_ms", j["ext_seconds"] * 1e3)
            self.add("py_restore_peak_rss_mib", j["peak_rss_bytes"] / MiB)
        elif who == "cli_restore":
            import contenders as C
            self.even_start()
            self.drop()
            c = C.ckptio_synth_check(self.exe, os.path.join(self.dir, "ck-borrow"), step=2)
            self.add("cli_restore_gbps", c["bytes"] / c["restore_seconds"] / 1e9)
        elif who == "torch_load":
            j = self.child("torch", os.path.join(self.dir, "torch", "state.pt"))
            self.add("torch_load_gbps", self.total / j["seconds"] / 1e9)
        elif who == "numpy_load":
            j = self.child("numpy", os.path.join(self.dir, "numpy"))
            self.add("numpy_load_gbps", self.total / j["seconds"] / 1e9)
        elif who == "fio_read":  # the disk's best read of a file of the state's size, cold cache
            import contenders as C
            if not os.path.exists(self.fio_file):
                C.fio_job(self.fio_file, -(-self.total // (64 * MiB)) * 64 * MiB, "write", 1, 8, 8 * MiB, True)
            for k, v in C.fio_best(self.fio_file, self.total, "read", drop=lambda: self.drop(settle=False)).items():
                self.add("fio_read_%s_gbps" % k, v)
        elif who == "zarr_load":
            j = self.child("zarr", os.path.join(self.dir, "zarr"))
            self.add("zarr_load_gbps", self.total / j["seconds"] / 1e9)

    # -- the GIL
    def gil(self, counter, tag):
        """Rate of `counter` idle, over a whole borrow-mode save (save() to
        commit) and over a whole restore (cold cache, fresh memory)."""
        ck = self.ckptio
        root = os.path.join(self.dir, "gil")
        shutil.rmtree(root, ignore_errors=True)
        mgr = ck.CheckpointManager(root, staging="borrow")
        try:
            h = mgr.save(1, self.tree, metadata=self.metadata)  # warm-up, outside any window
            h.wait()
            w = {}
            time.sleep(0.2)
            c0 = counter.read()
            time.sleep(self.a.idle_window)
            w["idle1"] = window(c0, counter.read())
            gc.collect()
            c0 = counter.read()
            h = mgr.save(2, self.tree, metadata=self.metadata)
            h.wait()
            w["save"] = window(c0, counter.read())
            self.drop()
            time.sleep(0.2)
            gc.collect()
            c0 = counter.read()
            tree = mgr.restore(2)
            w["restore"] = window(c0, counter.read())
            del tree
            gc.collect()
            time.sleep(0.2)
            c0 = counter.read()
            time.sleep(self.a.idle_window)
            w["idle2"] = window(c0, counter.read())
        finally:
            mgr.close()
            shutil.rmtree(root, ignore_errors=True)
        base = statistics.mean([w["idle1"]["rate"], w["idle2"]["rate"]])
        self.add(tag + "_idle_rate", base)
        for k in ("on_cpu", "machine_cores"):
            if k in w["idle1"] and k in w["idle2"]:
                self.add("%s_idle_%s" % (tag, k), statistics.mean([w["idle1"][k], w["idle2"][k]]))
        for phase in ("save", "restore"):
            self.add("%s_%s_rate" % (tag, phase), w[phase]["rate"])
            self.add("%s_%s_ratio" % (tag, phase), w[phase]["rate"] / base)
            for k in ("on_cpu", "gil_waits_per_s", "preempted_per_s", "machine_cores"):
                if k in w[phase]:
                    self.add("%s_%s_%s" % (tag, phase, k), w[phase][k])

    def gil_both(self):
        c = Counter()
        c.start()
        try:
            self.gil(c, "gil_thread")
        finally:
            c.go = False
            c.join()
        if not self.a.no_gil_control:
            pc = ProcCounter(self.dir)
            try:
                self.gil(pc, "gil_process")
            finally:
                pc.stop()

    # -- one run
    def run(self):
        a = self.a
        saves = ["py_borrow", "py_copy", "cpp_borrow", "cpp_copy"]
        restores = ["py_restore", "cli_restore"]
        if self.torch is not None:
            saves.append("torch_save")
            restores.append("torch_load")
        saves += ["numpy_save", "fio_write"]
        restores += ["numpy_load", "fio_read"]
        if self.has_zarr:
            saves.append("zarr_save")
            restores.append("zarr_load")
        for r in range(a.repeat):
            sv = saves[r % len(saves):] + saves[: r % len(saves)]
            rs = restores[r % len(restores):] + restores[: r % len(restores)]
            log("rep %d/%d saves: %s" % (r + 1, a.repeat, " ".join(sv)))
            for who in sv:
                try:
                    if who == "py_borrow":
                        self.ck_save("borrow")
                    elif who == "py_copy":
                        self.ck_save("copy")
                    elif who == "cpp_borrow":
                        self.cpp_bench("borrow")
                    elif who == "cpp_copy":
                        self.cpp_bench("copy")
                    else:
                        getattr(self, who)()
                except Exception as e:  # noqa: BLE001 - record, go on with the others
                    self.err(who, e)
            log("rep %d/%d restores (fresh process, cold cache): %s" % (r + 1, a.repeat, " ".join(rs)))
            for who in rs:
                try:
                    self.restore(who)
                except Exception as e:  # noqa: BLE001
                    self.err(who, e)
            log("rep %d/%d GIL: counting thread idle / during a save / during a restore" % (r + 1, a.repeat))
            try:
                self.gil_both()
            except Exception as e:  # noqa: BLE001
                self.err("gil", e)
            for d in ("ck-borrow", "torch", "numpy", "zarr"):
                shutil.rmtree(os.path.join(self.dir, d), ignore_errors=True)
        if os.path.exists(self.fio_file):
            os.unlink(self.fio_file)


def dcp_status():
    """PyTorch DCP: importable here? (Debian's torch 1.13 has it only as the
    prototype torch.distributed._shard.checkpoint.)"""
    out = {}
    for mod in ("torch.distributed.checkpoint", "torch.distributed._shard.checkpoint"):
        p = subprocess.run([sys.executable, "-c", "import " + mod], capture_output=True, text=True)
        last = (p.stderr.strip().splitlines() or ["ok"])[-1]
        out[mod] = "importable" if p.returncode == 0 else last
    return out


# ---- targets, table, markdown ------------------------------------------------------

def targets(res):
    r = res["runs"]
    n = res["leaves"]
    out = []

    def add(name, value, goal, op, figure, note="", unit="×"):
        met = None if value is None or goal is None else (value <= goal if op == "<=" else value >= goal)
        shown = "—" if goal is None else "%.0f%%" % (goal * 100) if unit == "%" else \
            "1.2 × C++ stall + 5 µs × %d leaves = %.3f ms" % (n, goal) if unit == "ms" else "%g×" % goal
        out.append({"name": name, "value": value, "goal": goal, "op": op, "goal_text": "—" if goal is None else "%s %s" % (
            "≤" if op == "<=" else "≥", shown), "figure": figure, "met": met, "note": note})

    py, cpp = med(r.get("py_borrow_stall_ms")), med(r.get("cpp_borrow_stall_ms"))
    lim = 1.2 * cpp + 0.005 * n if cpp is not None else None
    add("Python borrow-mode save() stall", py, lim, "<=",
        "%s ms (C++ %s ms)" % (_f(py, 3), _f(cpp, 3)), unit="ms")
    cr = med(r.get("py_copy_stall_vs_memcpy"))
    add("Python copy-mode save() stall ÷ one memcpy of the state", cr, 1.3, "<=",
        "%s× (stall %s ms, memcpy %s ms)" % (_f(cr), _f(med(r.get("py_copy_stall_ms")), 1), _f(med(r.get("memcpy_ms")), 1)),
        "median of per-repetition ratios")

    def ratio(a, b):
        x, y = med(r.get(a)), med(r.get(b))
        return (x / y) if x is not None and y else None
    v = ratio("py_restore_gbps", "cli_restore_gbps")
    add("Python restore ÷ C++ CLI restore", v, 0.95, ">=", "%s×" % _f(v),
        "same step; fresh process; cold cache; fresh memory")
    def bound(k, times, fio):
        # What the goal asks of the disk, against its best in this run.
        x, f = med(r.get(k)), med(r.get(fio))
        if x is None or f is None:
            return ""
        return "; %g× it is %.2f GB/s, fio's best %s in this run %.2f GB/s%s" % (
            times, times * x, "write" if "write" in fio else "read", f,
            " (above fio's best)" if times * x > f else "")
    v = ratio("py_borrow_save_gbps", "torch_save_gbps")
    add("Python save ÷ torch.save + fsync", v, 3, ">=", "%s×" % _f(v),
        "ckptio borrow, save() to commit" + bound("torch_save_gbps", 3, "fio_write_best_gbps"))
    v = ratio("py_restore_gbps", "torch_load_gbps")
    add("Python restore ÷ torch.load", v, 2, ">=", "%s×" % _f(v),
        "fresh process, cold cache, fresh memory" + bound("torch_load_gbps", 2, "fio_read_best_gbps"))
    v = ratio("py_restore_gbps", "numpy_load_gbps")
    add("Python restore ÷ numpy.load", v, 1.2, ">=", "%s×" % _f(v), "fresh process, cold cache, fresh memory")
    v = ratio("py_borrow_save_gbps", "fio_write_best_gbps")
    add("Python save ÷ fio's best write", v, None, ">=", "%s×" % _f(v), "the disk's limit, same size, same run")
    v = ratio("py_restore_gbps", "fio_read_best_gbps")
    add("Python restore ÷ fio's best read", v, None, ">=", "%s×" % _f(v), "the disk's limit, same size, same run")
    for what in ("save", "restore"):
        v = med(r.get("gil_thread_%s_ratio" % what))
        c = med(r.get("gil_process_%s_ratio" % what))
        add("a Python thread's rate during a %s ÷ its idle rate" % what, v, 0.8, ">=",
            "%s%%" % _f(v * 100 if v is not None else None, 0),
            "control, the same loop in another process: %s%%" % _f(c * 100 if c is not None else None, 0), unit="%")
    return out


def _f(v, d=2):
    return ("%%.%df" % d) % v if isinstance(v, (int, float)) else "—"


def cell(v, d=2):
    if not v:
        return "—"
    f = "%%.%df" % d
    if len(v) == 1:
        return f % v[0]
    return (f + " (" + f + "–" + f + ")") % (statistics.median(v), min(v), max(v))


def verdict(t):
    if t["met"] is None:
        return "(reported)" if t["goal"] is None and t["value"] is not None else "not measured"
    return "met" if t["met"] else "**NOT MET**"


ROWS_SAVE = (("py_borrow", "**ckptio (Python), borrow**"), ("py_copy", "ckptio (Python), copy"),
             ("cpp_borrow", "ckptio (C++ `ckptio bench`), borrow"), ("cpp_copy", "ckptio (C++ `ckptio bench`), copy"),
             ("torch", "torch.save(state_dict) + fsync"), ("numpy", "numpy.save per leaf + fsync"),
             ("zarr", "zarr-python v2, one zstd-1 chunk per leaf, + fsync"))
ROWS_LOAD = (("py_restore", "**ckptio (Python) `restore()`**"), ("cli_restore", "ckptio (C++ CLI) `synth check`"),
             ("torch_load", "torch.load"), ("numpy_load", "numpy.load per leaf"), ("zarr_load", "zarr-python v2"))


FIO_HOW = "the best of 1 job at depth 32 with 1 MiB O_DIRECT requests, 8 jobs at depth 8 with 8 MiB, buffered 1 MiB"


def markdown(res, level="##"):
    r = res["runs"]
    L = ["%s Python (issue 28): `import ckptio` against C++ and against torch, numpy, zarr" % level, ""]
    if res.get("quick"):
        L += ["> **SMOKE RUN (`--quick`)**: a small state, one repetition, to prove the pipeline end to end; "
              "not the figures of the targets.", ""]
    L += ["Command: `%s`%s  " % (res["command"], " (run by `%s`)" % res["run_by"] if res.get("run_by") else ""),
          "Date: %s to %s (%.1f min); load average %s at the start, %s at the end  " % (
              res["started_utc"], res["ended_utc"][-9:], res["minutes"], res["load_start"], res["load_end"]),
          "State: %s synthetic transformer state (`ckptio synth` layout, read back with `ckptio inspect --json`), "
          "%d leaves, %s repetition(s), contenders rotated; scratch `%s` on %s  " % (
              size_name(res["bytes"]), res["leaves"], res["repeat"], res["dir"], res["filesystem"]),
          "Python %s, numpy %s, torch %s, zarr %s; extension `%s`  " % (
              res["python"], res["numpy"], res["torch"], res["zarr"], res["extension"]),
          "Page cache dropped before every read: **%s**%s" % (
              "yes" if res["cold_cache"] else "NO",
              ", then %g s idle before each restore but fio's (docs/restart.md)" % res["settle"]
              if res.get("settle") else "") + (
              "; before each restore but fio's, a process first-touched as many bytes as the state and exited"
              if res.get("uneven_start") is False else ""), ""]
    L += ["| target | goal | this run | verdict |", "|---|---|---|---|"]
    for t in res["targets"]:
        L.append("| %s | %s | %s | %s%s |" % (t["name"], t["goal_text"], t["figure"], verdict(t),
                                             "; " + t["note"] if t["note"] else ""))
    missed = [t for t in res["targets"] if t["met"] is False]
    L += ["", ("Missed in this run: %s." % "; ".join(t["name"] for t in missed)) if missed else
          "Every measured target was met in this run.", ""]
    L += ["| save | stall (ms) | save() to commit, GB/s |", "|---|---|---|"]
    for k, label in ROWS_SAVE:
        st, gb = r.get(k + "_stall_ms"), r.get(k + "_save_gbps")
        if st or gb:
            L.append("| %s | %s | %s |" % (label, cell(st, 3 if "borrow" in k else 1), cell(gb)))
    if r.get("memcpy_ms"):
        L.append("| (one memcpy of the state into warm arrays, numpy, per leaf) | %s | |" % cell(r["memcpy_ms"], 1))
    if r.get("fio_write_best_gbps"):
        L.append("| (fio: the disk's best write of the same size: %s) | — | %s |" % (FIO_HOW, cell(r["fio_write_best_gbps"])))
    L += ["", "A synchronous save (torch, numpy, zarr) blocks the loop for the whole save.", ""]
    L += ["| restore into fresh memory, fresh process, cold cache | GB/s | ckptio (Python) ÷ this |", "|---|---|---|"]
    pr = med(r.get("py_restore_gbps"))
    for k, label in ROWS_LOAD:
        v = r.get(k + "_gbps")
        if v:
            L.append("| %s | %s | %s |" % (label, cell(v), _f(pr / med(v)) if pr else "—"))
    if r.get("fio_read_best_gbps"):
        v = r["fio_read_best_gbps"]
        L.append("| (fio: the disk's best read of the same size: %s) | %s | %s |" % (
            FIO_HOW, cell(v), _f(pr / med(v)) if pr else "—"))
    L.append("")
    L += ["| GIL: a pure-Python counting loop | idle (M it/s) | rate during a save ÷ idle | during a restore ÷ idle |",
          "|---|---|---|---|"]
    for tag, label in (("gil_thread", "a thread of the saving process"),
                       ("gil_process", "control: the same loop in another process")):
        if r.get(tag + "_idle_rate"):
            L.append("| %s | %s | %s%% | %s%% |" % (
                label, cell([x / 1e6 for x in r[tag + "_idle_rate"]]),
                cell([x * 100 for x in r.get(tag + "_save_ratio", [])], 0),
                cell([x * 100 for x in r.get(tag + "_restore_ratio", [])], 0)))
    if r.get("gil_thread_save_on_cpu"):
        L += ["", "Where the counting loop's time went (medians; its CPU share from /proc/PID/task/TID/stat, "
              "10 ms ticks; its voluntary context switches, which for a loop that never sleeps are waits for "
              "the GIL, and its involuntary ones, preemptions; the CPUs the whole machine kept busy, of %s):" %
              res.get("nproc", "?"), "",
              "| loop | window | its CPU share | GIL waits / s | preempted / s | machine cores busy |",
              "|---|---|---|---|---|---|"]
        for tag, label in (("gil_thread", "thread"), ("gil_process", "control process")):
            for phase in ("idle", "save", "restore"):
                k = "%s_%s_" % (tag, phase)
                if r.get(k + "on_cpu"):
                    L.append("| %s | %s | %s%% | %s | %s | %s |" % (
                        label, phase, _f(med(r[k + "on_cpu"]) * 100, 0),
                        _f(med(r.get(k + "gil_waits_per_s")), 0) if phase != "idle" else "",
                        _f(med(r.get(k + "preempted_per_s")), 0) if phase != "idle" else "",
                        _f(med(r.get(k + "machine_cores")))))
    L.append("")
    busy = med(r.get("gil_thread_idle_machine_cores"))
    if busy is not None:
        L += ["Background load: while the process idled (the idle windows), the machine kept %.2f of its %s cores "
              "busy, the counting loop one of them: %.2f cores of other work%s." % (
                  busy, res.get("nproc", "?"), max(0.0, busy - 1), ", which every figure of this run shares its "
                  "CPUs with" if busy > 1.3 else ""), ""]
    if r.get("prof_borrow_stall_ms"):
        L += ["Where the stall goes (one more save per mode and repetition, outside the figures above): the "
              "Python side (tree walk, leaf checks, metadata JSON), the extension call minus the C++ save() "
              "(pybind11 conversion of the leaf list, handle), the C++ save() itself (`SaveStats.stall_seconds`):", "",
              "| mode | stall ms | Python side | binding | C++ save() | per leaf, Python + binding |", "|---|---|---|---|---|---|"]
        for m in ("borrow", "copy"):
            p = "prof_%s_" % m
            if r.get(p + "stall_ms"):
                pb = med(r[p + "python_ms"]) + med(r[p + "binding_ms"])
                L.append("| %s | %s | %s | %s | %s | %s µs |" % (
                    m, cell(r[p + "stall_ms"], 3), cell(r[p + "python_ms"], 3), cell(r[p + "binding_ms"], 3),
                    cell(r[p + "lib_ms"], 3), _f(pb * 1e3 / res["leaves"], 1)))
        L.append("")
    if r.get("prof_restore_ext_ms"):
        L += ["Python restore: the extension call %s ms, the Python side after it (building the tree, dtype "
              "views) %s ms (medians)." % (_f(med(r["prof_restore_ext_ms"]), 1), _f(med(r["prof_restore_python_ms"]), 1)), ""]
    dcp = res.get("dcp") or {}
    L += ["PyTorch DCP is not measured: Debian 12's torch %s has no `torch.distributed.checkpoint` (%s), and its "
          "prototype `torch.distributed._shard.checkpoint` does not import on Python %s (%s). DCP's published "
          "figures were looked for and none was found with a source that could be checked, so none is quoted "
          "(not measured, not published here)." % (res["torch"], dcp.get("torch.distributed.checkpoint", "?"), res["python"],
                                      dcp.get("torch.distributed._shard.checkpoint", "?")), ""]
    L += ["How: `bench/python_bench.py` (its docstring). Saves run in one process holding the state (one "
          "untimed warm-up save per manager, as `ckptio bench`; copy mode with a pool of the state's size, "
          "as `ckptio bench`); every restore runs in a fresh process after `sync; echo 3 > "
          "/proc/sys/vm/drop_caches`, timed around the load call only (the CLI's `synth check` likewise times "
          "its restore() only), and is checked against a CRC32 of every leaf afterwards (the CLI compares "
          "with the generator). The C++ stall is `ckptio bench --staging borrow|copy --json` `stall_ms` of "
          "the same leaves; the Python borrow save's step is the one both restores read. GIL: a thread "
          "counting in a `while` loop, its rate over the whole save (save() to commit) and the whole "
          "restore against its rate while the process sleeps; the same loop in a separate process is the "
          "control for CPU contention (2 cores shared with ckptio's I/O threads and the kernel)."]
    for n in res.get("notes", []):
        L += ["", "Note: " + n]
    for e in res.get("errors", []):
        L += ["", "**Error**: " + e.replace("\n", " ")]
    L.append("")
    return "\n".join(L)


def text_table(res):
    L = ["Python benchmarks (issue 28): %s, %d leaves, %s rep(s), load %s -> %s, cold cache %s" % (
        size_name(res["bytes"]), res["leaves"], res["repeat"], res["load_start"], res["load_end"],
        "yes" if res["cold_cache"] else "NO")]
    for t in res["targets"]:
        L.append("  %-58s %-50s %-28s %s" % (t["name"], t["goal_text"], t["figure"], verdict(t).replace("**", "")))
    L.append("  figures, median (min-max):")
    for k in sorted(res["runs"]):
        v = res["runs"][k]
        L.append("    %-32s %s" % (k, cell(v, 4 if max(abs(x) for x in v) < 10 else 1)))
    for n in res.get("notes", []):
        L.append("  note: " + n)
    for e in res.get("errors", []):
        L.append("  ERROR: " + e)
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckptio", default=os.path.join(ROOT, "build", "bin", "ckptio"), help="the CLI")
    ap.add_argument("--bytes", default="2GiB", help="state size (default 2GiB)")
    ap.add_argument("--leaves", type=int, default=295, help="leaves (default 295, the synth default)")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--dir", default="/var/tmp", help="where to make the scratch directory (a disk, not tmpfs)")
    ap.add_argument("--json", default="", help="write the results here ('-': print them instead of the table)")
    ap.add_argument("--markdown", default="", help="also write the Markdown section here")
    import contenders as C
    C.add_settle_arg(ap)
    ap.add_argument("--idle-window", type=float, default=1.0, help="seconds of each idle-rate window")
    ap.add_argument("--no-gil-control", action="store_true", help="skip the separate-process control")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--expect", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "counter":
        return child_counter(a)
    if a.child:
        return child_restore(a)
    a.bytes = parse_size(a.bytes)
    a.ckptio = os.path.abspath(a.ckptio)
    if not os.access(a.ckptio, os.X_OK):
        sys.exit("python_bench: no ckptio CLI at %s (--ckptio)" % a.ckptio)
    try:
        import ckptio
    except ImportError as e:
        sys.exit("python_bench: cannot import ckptio (%s): set PYTHONPATH=<build>/python" % e)
    fs = subprocess.run(["findmnt", "-n", "-T", a.dir, "-o", "SOURCE,FSTYPE"], capture_output=True, text=True).stdout.strip()
    if "tmpfs" in fs.split()[-1:]:
        sys.exit("python_bench: %s is on tmpfs; pass --dir on a disk" % a.dir)
    a.workdir = os.path.join(os.path.abspath(a.dir), "ckptio-python-bench.%d" % os.getpid())
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    started = datetime.datetime.now(datetime.timezone.utc)
    rel = [os.path.relpath(x, ROOT) if x.startswith(ROOT + os.sep) else x for x in sys.argv[1:]]
    res = {"command": " ".join(shlex.quote(x) for x in ["bench/python_bench.py"] + rel),
           "started_utc": started.strftime("%Y-%m-%d %H:%M UTC"), "load_start": loadavg(),
           "bytes": a.bytes, "leaves": a.leaves, "repeat": a.repeat, "dir": a.workdir, "filesystem": fs,
           "ckptio": a.ckptio, "extension": os.path.relpath(ckptio._ckptio.__file__, ROOT)
           if ckptio._ckptio.__file__.startswith(ROOT) else ckptio._ckptio.__file__,
           "python": platform.python_version(), "numpy": np.__version__, "nproc": os.cpu_count(),
           "settle": a.settle, "uneven_start": a.uneven_start}
    b = Bench(a)
    if os.geteuid() != 0:
        b.notes.append("not root: the page cache could not be dropped, so reads may come from memory")
    try:
        b.setup()
        res.update(torch=b.torch_version, zarr=b.zarr_version, dcp=b.dcp)
        log("%s, %d leaves, %d repetition(s), scratch %s (%s); load %s" % (
            size_name(a.bytes), len(b.names), a.repeat, a.workdir, fs, res["load_start"]))
        b.run()
    finally:
        shutil.rmtree(a.workdir, ignore_errors=True)
    ended = datetime.datetime.now(datetime.timezone.utc)
    res.update(ended_utc=ended.strftime("%Y-%m-%d %H:%M UTC"), minutes=round((ended - started).seconds / 60, 1),
               load_end=loadavg(), cold_cache=b.cold, runs=b.runs, errors=b.errors, notes=b.notes,
               state_bytes=b.total)
    res["targets"] = targets(res)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(res))
    if a.json == "-":
        print(json.dumps(res, indent=1))
    else:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        print(text_table(res))
    return 1 if b.errors else 0


if __name__ == "__main__":
    sys.exit(main())
