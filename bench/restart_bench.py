#!/usr/bin/python3
"""The restart, measured as a trainer lives it (issue 30): a new process with a
cold page cache, from process start to a restored state in memory it has never
touched, against the disk's best read and what a user would run instead.

  PYTHONPATH=<build>/python /usr/bin/python3 bench/restart_bench.py --ckptio <build>/bin/ckptio \\
      [--sizes 2GiB,half] [--repeat 3] [--dir /var/tmp] [--json FILE|-]
  bench/restart_bench.py --ckptio ... --prefault-pairs 10 --ckpt DIR   (prefault on against off only)
  bench/restart_bench.py --ckptio ... --python-pairs 10 --ckpt DIR     (the CLI against the Python package only)
  bench/restart_bench.py --touch-pairs 6      (first touch of freshly freed memory against idle free memory)
  bench/restart_bench.py --contention-rounds 5 --ckpt DIR   (the disk's read alone and while memory is first-touched)
  bench/restart_bench.py --ckptio ... --warm-rounds 6 --ckpt DIR  (restores into fresh and touched memory, fio)

After the sizes, --sharded SIZE (default 2GiB): a step saved by 8 processes
(dim 0 of every leaf over dp=8) restarted by 1, 2 and 3 fresh processes
(`ckptio synth check --mesh dp=N --processes N`), against fio's best read of
a file of the same size (issue 30, item 4).

Per size (`half` is half of this machine's memory), once: `ckptio synth save`
writes step 1 (the 295-leaf transformer-like state); a child process makes the
same leaves (bench/synthpy.py), writes them as one .npy per leaf and as one
torch.save of the state_dict (each fsynced), writes the leaves' CRC32s, and
exits, so that the parent holds no state while the contenders run.

Per repetition, each contender but fio after a process that first-touches as
many bytes as the state and exits, `sync; echo 3 > /proc/sys/vm/drop_caches`
and --settle seconds (default 8), so that all of them start on memory freed
and left idle alike (free page reporting: docs/restart.md; fio's reads touch
no fresh memory), in a fresh process, the order rotated by one each
repetition, and on odd repetitions ckptio and python swap places, and ckptio
and ckptio_noprefault (rotation alone kept python right after the CLI, and the
restart without prefaulting right after numpy.load):
  fio        the best of three reads of the step's data file: one job at depth
             32 with 1 MiB blocks (O_DIRECT, io_uring), 8 jobs at depth 8 with
             8 MiB blocks over eighths of the file, one buffered job (psync, 1 MiB);
  ckptio     `ckptio synth check DIR --json`: discovers the latest committed
             step, reads its index, plans, reads, verifies every checksum
             (then compares every byte with the generator, after the clock);
  ckptio_noprefault  the same with --no-prefault (the fresh memory faulted by
             the reads themselves, as before issue 30): what prefaulting is worth;
  python     the same through the Python package: CheckpointManager(DIR).restore();
  numpy      numpy.load of every .npy;
  torch      torch.load of the state_dict;
  touch      no disk: a process that first-touches as many bytes of fresh
             anonymous memory (MADV_POPULATE_WRITE, one thread, 4 KiB pages),
             timed inside the child: what this VM's fresh memory allows in this
             repetition, since every restart writes into memory it never touched;
  fresh_read the least a restart must do: `ckptio_fresh_read` (bench/fresh_read.cc,
             built beside `ckptio`) reads the step's data file whole with
             O_DIRECT through io_uring (depth 32, 8 MiB, ckptio's shape) into
             fresh memory that a thread faults in from its end, as ckptio's
             restore does, with no index, plan, leaves or checksums: fio's
             reads reuse a few buffers and touch no fresh memory, so this is the
             reference that tells what the VM allows from what ckptio adds.
The time of a contender is from just before the parent starts its process to
the moment the child reports the state restored (CLOCK_MONOTONIC, shared by
both), so interpreter start, imports, discovery and the index are in it and
process exit is not; GB/s = the state's bytes / that time. Peak RSS: the
child's ru_maxrss. The Python children check every leaf's CRC32 against the
generator's after the clock stops (the CLI compares every byte).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import sizes  # noqa: E402
GiB = 1 << 30
MiB = 1 << 20
MADV_POPULATE_WRITE = 23  # Linux 5.14; Python's mmap module passes it through


def log(msg):
    print("[restart %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def parse_size(s):
    """A size (bench/sizes.py), or "half": half this machine's memory, in whole GiB."""
    if s == "half":
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 // GiB * GiB
    return sizes.parse_size(s)


def size_name(n):
    return "%g GiB" % (n / GiB) if n >= GiB else "%g MiB" % (n / MiB)


def med(v):
    return statistics.median(v) if v else None


def sizes_in_order(res):
    """The sizes of a result, smallest first (results.json sorts its keys)."""
    return sorted(res["sizes"].items(), key=lambda kv: kv[1]["bytes"])


def largest_data_file(step_dir):
    return max((os.path.join(step_dir, f) for f in os.listdir(step_dir) if f.endswith(".bin")), key=os.path.getsize)


def package_env(ckptio):
    """The environment of a child that imports the Python package built
    beside the CLI `ckptio` (<build>/python), ahead of any PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (
        os.path.join(os.path.dirname(os.path.dirname(ckptio)), "python"), os.environ.get("PYTHONPATH")) if p))


def fresh_reader(ckptio):
    """bench/fresh_read.cc's binary beside `ckptio`, or None (said once)."""
    p = os.path.join(os.path.dirname(os.path.abspath(ckptio)), "ckptio_fresh_read")
    if os.access(p, os.X_OK):
        return p
    if not getattr(fresh_reader, "said", False):
        fresh_reader.said = True
        log("NOTE: %s is missing (a build with CKPTIO_BUILD_BENCH=ON makes it): no minimal reader row" % p)
    return None


def first_touch(size, env=None):
    """GB/s of a fresh process's first touch of `size` bytes (the `touch`
    child), and of the touch plus one read of each page from user space."""
    _, _, j = spawn([sys.executable, os.path.abspath(__file__), "--child", "touch", "--bytes", str(size)], env)
    return size / j["touch_seconds"] / 1e9, size / (j["touch_seconds"] + j["user_read_seconds"]) / 1e9


# ---- children -----------------------------------------------------------------------

def leaf(tree, name):
    """prefix/path in a restored pytree: the CLI's step has no Python tree, so
    the package nests its leaves by the path's "."-separated keys."""
    prefix, path = name.split("/", 1)
    node = tree[prefix]
    if isinstance(node, dict) and path in node:
        return node[path]
    for key in path.split("."):
        node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
    return node


def child(a):
    """One contender's restore in this fresh process; prints JSON with the
    moment the state was in memory, then checks it."""
    if a.child == "touch":  # first touch of fresh memory, 4 KiB pages, one thread (no THP: not madvised)
        import mmap
        t0 = time.monotonic()
        m = mmap.mmap(-1, a.bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(MADV_POPULATE_WRITE)
        ready = time.monotonic()
        # Then one byte of each page read from user space, as whatever uses
        # the memory next does (a checksum, the trainer): on a VM that shadows
        # the guest's page tables (a PVM guest) that first user access costs a
        # fault per 4 KiB page of its own (docs/restart.md, "A VM whose first
        # user access of a page costs a fault").
        import numpy as np
        pages = np.frombuffer(m, dtype=np.uint8)[::4096]
        t1 = time.monotonic()
        int(pages.sum())
        used = time.monotonic()
        del pages
        print(json.dumps({"ready_monotonic_s": ready, "touch_seconds": ready - t0, "user_read_seconds": used - t1,
                          "verified": True}))
        return 0
    if a.child == "python_stats":  # --python-pairs: the restore's own time too (checksums verified inside)
        import ckptio
        imported = time.monotonic()
        _, info = ckptio.CheckpointManager(a.path).restore(info=True)
        ready = time.monotonic()
        print(json.dumps({"ready_monotonic_s": ready, "imported_monotonic_s": imported, "verified": True,
                          "restore_seconds": info.stats["seconds"]}))
        return 0
    if a.child == "warm":  # --warm-rounds: into fresh memory, then (cache dropped) into the same arrays
        import ckptio
        m = ckptio.CheckpointManager(a.path)
        t0 = time.monotonic()
        tree = m.restore()
        t1 = time.monotonic()
        drop_caches()
        t2 = time.monotonic()
        m.restore(into=tree)
        t3 = time.monotonic()
        print(json.dumps({"ready_monotonic_s": t3, "fresh_seconds": t1 - t0, "warm_seconds": t3 - t2,
                          "verified": True}))
        return 0
    import numpy as np
    with open(a.expect) as f:
        exp = json.load(f)
    names, crcs = exp["names"], exp["crc"]
    imported = None
    if a.child == "python":
        import ckptio
        imported = time.monotonic()
        tree = ckptio.CheckpointManager(a.path).restore()
        ready = time.monotonic()
        got = [leaf(tree, n) for n in names]
    elif a.child == "numpy":
        got = [np.load(os.path.join(a.path, n + ".npy")) for n in names]
        ready = time.monotonic()
    elif a.child == "torch":
        import torch
        sd = torch.load(a.path)
        ready = time.monotonic()
        got = []
        for n in names:
            t = sd[n.split("/", 1)[0]][n.split("/", 1)[1]]
            got.append(t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy())
    else:
        sys.exit("unknown child " + a.child)
    bad = [n for n, g, c in zip(names, got, crcs)
           if zlib.crc32(np.ascontiguousarray(g).reshape(-1).view(np.uint8)) != c]
    print(json.dumps({"ready_monotonic_s": ready, "imported_monotonic_s": imported, "verified": not bad,
                      "error": "%d leaves differ, first %s" % (len(bad), bad[0]) if bad else None}))


def export(a):
    """Child: the synth state's leaves as .npy files and one torch.save, fsynced,
    and their CRC32s; the state dies with this process."""
    import numpy as np
    import synthpy
    with open(a.expect) as f:
        leaves = json.load(f)["leaves"]
    st = synthpy.State(leaves)
    names = st.names()
    crcs = [zlib.crc32(x.reshape(-1).view(np.uint8)) for x in st.arrays]
    for n, x in zip(names, st.arrays):
        p = os.path.join(a.path, "numpy", n + ".npy")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            np.save(f, x)
            f.flush()
            os.fsync(f.fileno())
    try:
        import torch
        sd = {}
        for l, x in zip(st.leaves, st.arrays):
            t = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if l["dtype"] == "bfloat16" \
                else torch.from_numpy(x)
            sd.setdefault(l["prefix"], {})[l["path"]] = t
        with open(os.path.join(a.path, "state.pt"), "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
    except ImportError as e:
        log("torch is not importable (%s): no torch contender" % e)
    with open(a.expect, "w") as f:
        json.dump({"leaves": leaves, "names": names, "crc": crcs}, f)


# ---- the parent ---------------------------------------------------------------------

def drop_caches(settle=0.0):
    import contenders as C
    return C.drop_caches(settle)


def spawn(args, env=None):
    """(seconds from just before the spawn to the child's ready moment, peak RSS
    bytes, the child's JSON)."""
    import tempfile
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(args, stdout=out, stderr=err, text=True, env=env)
        _, status, ru = os.wait4(p.pid, 0)  # the child's own rusage: its peak RSS
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, why = out.read(), err.read()
    if p.returncode != 0 or "{" not in text:
        raise RuntimeError("%s exited %d: %s" % (os.path.basename(args[0]), p.returncode, why.strip()[-800:]))
    j = json.loads(text[text.index("{"):])
    if not j.get("verified"):
        raise RuntimeError("%s: the restored state differs: %s" % (args[:3], j.get("error")))
    return j["ready_monotonic_s"] - t0, ru.ru_maxrss * 1024, j


class Run:
    def __init__(self, a):
        self.a = a
        self.errors = []
        self.cold = True

    def drop(self, settle=True):
        self.cold &= drop_caches(self.a.settle if settle else 0)

    def even_start(self, size):
        """Before each contender that restores into fresh memory: a process
        first-touches as many bytes as the state and exits, so that every one
        starts after the same thing (`size` bytes just freed, then the drop and
        --settle). Without it, whoever followed numpy.load or torch.load (which
        free the state's arrays and as much page cache) first-touched memory
        the host still backed, and won by up to 3x: "prefault on ÷ off" was
        0.62 and 0.68 where the restart without prefaulting came right after
        numpy.load and 1.09 where the prefaulted one did (2 GiB, 2026-11-28,
        docs/restart.md). --uneven-start leaves it out."""
        if not self.a.uneven_start:
            import contenders as C
            C.touch_and_free(size)

    def fio_one(self, path, size, jobs, depth, bs, direct):
        import contenders as C
        self.drop(settle=False)
        return C.fio_job(path, size, "read", jobs, depth, bs, direct)

    def setup(self, size):
        a = self.a
        d = os.path.join(a.dir, "restart-%d" % size)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        log("%s: ckptio synth save (step 1)" % size_name(size))
        subprocess.run([a.ckptio, "synth", "save", os.path.join(d, "ckpt"), "--step", "1", "--bytes",
                        str(size), "--staging", "borrow"], check=True, stdout=subprocess.DEVNULL)
        j = json.loads(subprocess.run([a.ckptio, "inspect", os.path.join(d, "ckpt"), "--json"], check=True,
                                      capture_output=True, text=True).stdout)
        leaves = [{"prefix": l["prefix"], "path": l["path"], "dtype": l["dtype"], "shape": list(l["shape"]),
                   "bytes": int(l["bytes"])} for l in j["leaves"]]
        expect = os.path.join(d, "expect.json")
        with open(expect, "w") as f:
            json.dump({"leaves": leaves}, f)
        log("%s: the same leaves as .npy files and a torch.save (a child process)" % size_name(size))
        subprocess.run([sys.executable, os.path.abspath(__file__), "--export", "--path", d, "--expect", expect],
                       check=True)
        data = largest_data_file(os.path.join(d, "ckpt", "run-1"))
        return d, expect, data, sum(l["bytes"] for l in leaves)

    def contender(self, who, d, expect, data, size, runs):
        a = self.a
        me = [sys.executable, os.path.abspath(__file__), "--expect", expect]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        if who == "fio":
            for key, jobs, depth, bs, direct in (("fio_1x32_1m", 1, 32, MiB, True),
                                                 ("fio_8x8_8m", 8, 8, 8 * MiB, True),
                                                 ("fio_buffered", 1, 1, MiB, False)):
                runs.setdefault(key, []).append(self.fio_one(data, size, jobs, depth, bs, direct))
            runs.setdefault("fio_best", []).append(max(runs[k][-1] for k in
                                                       ("fio_1x32_1m", "fio_8x8_8m", "fio_buffered")))
            return
        self.even_start(size)
        self.drop()
        if who == "touch":  # what this VM's fresh memory allows right now: no disk at all
            touch, used = first_touch(size, env)
            runs.setdefault("touch_gbps", []).append(touch)
            runs.setdefault("touch_used_gbps", []).append(used)
            return
        if who == "fresh_read":  # the data file read into fresh memory, nothing else (bench/fresh_read.cc)
            s, _, j = spawn([fresh_reader(a.ckptio), data])
            runs.setdefault("fresh_read_gbps", []).append(j["bytes"] / s / 1e9)
            return
        if who in ("ckptio", "ckptio_noprefault"):
            s, rss, j = spawn([a.ckptio, "synth", "check", os.path.join(d, "ckpt"), "--json",
                               "--batch", str(4 * size)] + (["--no-prefault"] if who != "ckptio" else []))
            runs.setdefault(who + "_restore_only_gbps", []).append(j["restore_gbps"])
        elif who == "python":
            s, rss, j = spawn(me + ["--child", "python", "--path", os.path.join(d, "ckpt")], env)
            # From `import ckptio` done (the interpreter, numpy and the extension loaded, from a
            # cold cache) to the state restored: the package's own path.
            after = j["ready_monotonic_s"] - j["imported_monotonic_s"]
            runs.setdefault("python_after_import_s", []).append(after)
            runs.setdefault("python_after_import_gbps", []).append(size / after / 1e9)
        elif who == "numpy":
            s, rss, _ = spawn(me + ["--child", "numpy", "--path", os.path.join(d, "numpy")], env)
        elif who == "torch":
            s, rss, _ = spawn(me + ["--child", "torch", "--path", os.path.join(d, "state.pt")], env)
        runs.setdefault(who + "_s", []).append(s)
        runs.setdefault(who + "_gbps", []).append(size / s / 1e9)
        runs.setdefault(who + "_peak_rss_over_state", []).append(rss / size)

    def size(self, size):
        d, expect, data, total = self.setup(size)
        order = ["fio", "ckptio", "python", "numpy", "ckptio_noprefault", "touch"] + \
            (["fresh_read"] if fresh_reader(self.a.ckptio) else []) + (["torch"] if os.path.exists(os.path.join(d, "state.pt"))
                                                         else [])
        runs = {}
        for r in range(self.a.repeat):
            rot = order[r % len(order):] + order[:r % len(order)]
            if r % 2 == 1:  # neither of the two compared always follows the other
                i, j = rot.index("ckptio"), rot.index("python")
                rot[i], rot[j] = rot[j], rot[i]
                # Nor does the restart without prefaulting always come right after
                # numpy.load, whose freed page cache and arrays are still backed by
                # the host when the next restore first-touches its memory (free
                # page reporting, docs/restart.md): "prefault on ÷ off" measured
                # that position, not the thread, until 2026-11-28.
                i, j = rot.index("ckptio"), rot.index("ckptio_noprefault")
                rot[i], rot[j] = rot[j], rot[i]
            log("%s rep %d/%d: %s" % (size_name(size), r + 1, self.a.repeat, " ".join(rot)))
            for who in rot:
                try:
                    self.contender(who, d, expect, data, total, runs)
                except Exception as e:  # noqa: BLE001 - record, go on with the others
                    msg = "%s %s: %s" % (size_name(size), who, str(e).strip()[-600:])
                    log("ERROR " + msg)
                    self.errors.append(msg)
        leaves = len(json.load(open(expect))["leaves"])
        shutil.rmtree(d, ignore_errors=True)
        return {"bytes": total, "leaves": leaves, "repeat": self.a.repeat,
                "runs": runs}


    def sharded(self, size):
        """Issue 30, item 4: a step saved by 8 processes (dim 0 of every leaf
        over dp=8) restarted by 1, 2 and 3 fresh processes (`synth check --mesh
        dp=N --processes N`: the CLI forks them; each reads only its devices'
        boxes), from the CLI's start to the last process's state in memory,
        against fio's best read of a file of the same size on the same disk."""
        a = self.a
        d = os.path.join(a.dir, "sharded-%d" % size)
        os.makedirs(d)
        rules = os.path.join(d, "rules.json")
        with open(rules, "w") as f:
            json.dump([[".*", ["dp"]]], f)
        ck = os.path.join(d, "ckpt")
        log("%s: ckptio synth save by 8 processes (dp=8)" % size_name(size))
        subprocess.run([a.ckptio, "synth", "save", ck, "--step", "1", "--bytes", str(size), "--mesh", "dp=8",
                        "--rules", rules, "--processes", "8"], check=True, stdout=subprocess.DEVNULL)
        fio_file = os.path.join(d, "fio.dat")
        subprocess.run(["fio", "--name=lay", "--filename=" + fio_file, "--rw=write", "--bs=8M", "--size=%d" % size,
                        "--direct=1", "--ioengine=io_uring", "--iodepth=8", "--output-format=json"],
                       check=True, stdout=subprocess.DEVNULL)
        order = ["fio", "p1", "p2", "p3"]
        runs = {}
        for r in range(a.repeat):
            rot = order[r % len(order):] + order[:r % len(order)]
            log("%s sharded rep %d/%d: %s" % (size_name(size), r + 1, a.repeat, " ".join(rot)))
            for who in rot:
                try:
                    if who == "fio":
                        runs.setdefault("fio_best", []).append(max(
                            self.fio_one(fio_file, size, 1, 32, MiB, True), self.fio_one(fio_file, size, 8, 8, 8 * MiB, True),
                            self.fio_one(fio_file, size, 1, 1, MiB, False)))
                        continue
                    n = int(who[1:])
                    self.even_start(size)
                    self.drop()
                    sec, rss, j = spawn([a.ckptio, "synth", "check", ck, "--mesh", "dp=%d" % n, "--processes", str(n),
                                         "--json"])
                    runs.setdefault(who + "_gbps", []).append(j["bytes_needed"] / sec / 1e9)
                    runs.setdefault(who + "_read_ratio", []).append(j["read_ratio"])
                except Exception as e:  # noqa: BLE001
                    msg = "%s sharded %s: %s" % (size_name(size), who, str(e).strip()[-600:])
                    log("ERROR " + msg)
                    self.errors.append(msg)
        shutil.rmtree(d, ignore_errors=True)
        out = {"bytes": size, "repeat": a.repeat, "runs": runs, "ratios": {}}
        for n in (1, 2, 3):
            x, f = runs.get("p%d_gbps" % n, []), runs.get("fio_best", [])
            if x and f:
                out["ratios"]["p%d" % n] = {"median": med(x) / med(f),
                                            "per_rep": [p / q for p, q in zip(x, f)] if len(x) == len(f) else []}
        return out


TARGETS = (  # (name, figure key, goal, op): the targets, per size
    ("restart ÷ fio's best read", "ckptio_vs_fio_best", 0.9, ">="),
    ("restart ÷ numpy.load", "ckptio_vs_numpy", 1.2, ">="),
    ("restart ÷ torch.load", "ckptio_vs_torch", None, None),
    ("prefault on ÷ off", "prefault_on_vs_off", None, None),
    ("restart ÷ first touch of fresh memory", "ckptio_vs_touch", None, None),
    ("restart ÷ first touch and first user read of fresh memory", "ckptio_vs_touch_used", None, None),
    ("restart ÷ the minimal reader into fresh memory", "ckptio_vs_fresh_read", None, None),
    ("the minimal reader ÷ fio's best read", "fresh_read_vs_fio_best", None, None),
    ("Python package ÷ CLI, from process start", "python_vs_cli", None, None),
    ("Python package ÷ CLI, from `import ckptio` done", "python_after_import_vs_cli", 0.95, ">="),
    ("CLI peak RSS ÷ state", "ckptio_peak_rss_over_state", 1.05, "<="),
    ("Python peak RSS ÷ state", "python_peak_rss_over_state", 1.05, "<="),
)


def ratios(res):
    """The issue's targets per size: ratios of the medians, and the range of
    the same ratio within each repetition (contenders of one repetition ran
    back to back)."""
    out = {}
    for name, s in res["sizes"].items():
        r = s["runs"]
        m = {k: med(v) for k, v in r.items()}

        def ratio(a, b):
            per_rep = [x / y for x, y in zip(r.get(a, []), r.get(b, []))] \
                if len(r.get(a, [])) == len(r.get(b, [])) else []
            return {"median": m[a] / m[b] if m.get(a) and m.get(b) else None,
                    "per_rep": per_rep}
        row = {"ckptio_vs_fio_best": ratio("ckptio_gbps", "fio_best"),
               "ckptio_vs_numpy": ratio("ckptio_gbps", "numpy_gbps"),
               "ckptio_vs_torch": ratio("ckptio_gbps", "torch_gbps"),
               "python_vs_cli": ratio("python_gbps", "ckptio_gbps"),
               "python_after_import_vs_cli": ratio("python_after_import_gbps", "ckptio_gbps"),
               "prefault_on_vs_off": ratio("ckptio_gbps", "ckptio_noprefault_gbps"),
               "ckptio_vs_touch": ratio("ckptio_gbps", "touch_gbps"),
               "ckptio_vs_touch_used": ratio("ckptio_gbps", "touch_used_gbps"),
               "ckptio_vs_fresh_read": ratio("ckptio_gbps", "fresh_read_gbps"),
               "fresh_read_vs_fio_best": ratio("fresh_read_gbps", "fio_best")}
        for k in ("ckptio_peak_rss_over_state", "python_peak_rss_over_state"):
            row[k] = {"median": m.get(k), "per_rep": r.get(k, [])}
        out[name] = row
    return out


def verdict(v, goal, op):
    if v is None or goal is None:
        return ""
    return "met" if (v >= goal if op == ">=" else v <= goal) else "**NOT MET**"


def table(res):
    lines = []
    for name, s in sizes_in_order(res):
        r = s["runs"]
        lines.append("%s, medians of %d (min-max), cold cache, fresh process:" % (name, s["repeat"]))
        for k in ("fio_1x32_1m", "fio_8x8_8m", "fio_buffered", "fio_best", "ckptio_gbps",
                  "ckptio_restore_only_gbps", "ckptio_noprefault_gbps", "python_gbps", "python_after_import_gbps",
                  "numpy_gbps", "torch_gbps", "touch_gbps", "touch_used_gbps", "fresh_read_gbps"):
            if r.get(k):
                lines.append("  %-28s %6.2f GB/s  (%.2f-%.2f)" % (k, med(r[k]), min(r[k]), max(r[k])))
        for label, key, goal, op in TARGETS:
            f = res["ratios"][name].get(key)
            if f and f["median"] is not None:
                lines.append("  %-28s %6.3f  (per rep %s) %s" % (
                    label, f["median"], ", ".join("%.2f" % x for x in f["per_rep"]), verdict(f["median"], goal, op)))
    for name, sh in res.get("sharded", {}).items():
        r = sh["runs"]
        lines.append("%s saved by 8 processes (dp=8), restarted by N fresh processes, medians of %d:" % (
            name, sh["repeat"]))
        if r.get("fio_best"):
            lines.append("  %-28s %6.2f GB/s  (%.2f-%.2f)" % ("fio_best", med(r["fio_best"]), min(r["fio_best"]),
                                                             max(r["fio_best"])))
        for n in (1, 2, 3):
            k = "p%d_gbps" % n
            if r.get(k):
                f = sh["ratios"].get("p%d" % n, {})
                lines.append("  %-28s %6.2f GB/s  (%.2f-%.2f)  ÷ fio %.2f (per rep %s) %s" % (
                    "%d process(es)" % n, med(r[k]), min(r[k]), max(r[k]), f.get("median", 0),
                    ", ".join("%.2f" % x for x in f.get("per_rep", [])), verdict(f.get("median"), 0.8, ">=")))
    return "\n".join(lines)


ROWS = (("fio_best", "fio, best of the three reads below"),
        ("fio_1x32_1m", "fio: 1 job, depth 32, 1 MiB, O_DIRECT io_uring"),
        ("fio_8x8_8m", "fio: 8 jobs, depth 8, 8 MiB, O_DIRECT io_uring"),
        ("fio_buffered", "fio: 1 job, buffered psync, 1 MiB"),
        ("ckptio_gbps", "**ckptio restart** (`ckptio synth check DIR`: discover, index, plan, read, verify)"),
        ("ckptio_restore_only_gbps", "(its restore() call alone, as `synth check` times it)"),
        ("ckptio_noprefault_gbps", "ckptio restart without prefaulting (`synth check --no-prefault`)"),
        ("python_gbps", "ckptio's Python package: `CheckpointManager(DIR).restore()`"),
        ("python_after_import_gbps", "(the same, from `import ckptio` done: interpreter and numpy loaded)"),
        ("numpy_gbps", "numpy.load of one .npy per leaf"),
        ("torch_gbps", "torch.load of the state_dict"),
        ("touch_gbps", "(no disk) first touch of as much fresh memory, one thread, 4 KiB pages"),
        ("touch_used_gbps", "(no disk) the same first touch, then one byte of each page read from user space"),
        ("fresh_read_gbps", "(the minimal reader) `ckptio_fresh_read`: the data file into fresh memory, O_DIRECT "
                            "io_uring, depth 32, 8 MiB, a thread faulting from the end; no index, no checksums"))


def markdown(res, level="##"):
    L = ["%s Restart from process start (issue 30)" % level, "",
         "Command: `%s`%s  " % (res["command"], " (run by `%s`)" % res["run_by"] if res.get("run_by") else ""),
         "Date: %s (%.1f min); load average %s at the start, %s at the end; scratch on %s  " % (
             res["date"], res["seconds"] / 60, res["load_start"], res["load_end"], res["filesystem"]),
         "Each contender in a fresh process after %s`sync; echo 3 > /proc/sys/vm/drop_caches` (done: **%s**)%s, "
         "timed from just before the parent starts it to the moment it reports the state in memory; "
         "contenders rotated each repetition. ckptio verifies every checksum inside that time; the others "
         "are checked (CRC32 per leaf) after it." % ("" if res.get("uneven_start", True) else
                                                     "a process that first-touches as many bytes as the state and "
                                                     "exits (fio's excepted), ",
                                                     "yes" if res["cold_cache"] else "NO",
                                                     " and %g s idle" % res["settle"] if res.get("settle") else ""), ""]
    for name, s in sizes_in_order(res):
        r, rat = s["runs"], res["ratios"][name]
        L += ["%s# %s (%d leaves), %d repetition(s)" % (level, name, s.get("leaves", 295), s["repeat"]), "",
              "| read into fresh memory | GB/s, median (min-max) | seconds |", "|---|---|---|"]
        for k, label in ROWS:
            v = r.get(k)
            if v:
                secs = r.get(k[:-5] + "_s") if k.endswith("_gbps") else None
                L.append("| %s | %.2f (%.2f-%.2f) | %s |" % (label, med(v), min(v), max(v),
                                                            "%.2f" % med(secs) if secs else ""))
        L += ["", "| target | goal | median | per repetition | verdict |", "|---|---|---|---|---|"]
        for label, key, goal, op in TARGETS:
            f = rat.get(key)  # (a row added later is missing from older results)
            if not f or f["median"] is None:
                continue
            L.append("| %s | %s | %.3f | %s | %s |" % (
                label, "%s %.2f" % ("≥" if op == ">=" else "≤", goal) if goal else "(reported)", f["median"],
                ", ".join("%.2f" % x for x in f["per_rep"]), verdict(f["median"], goal, op)))
        L.append("")
    for name, sh in res.get("sharded", {}).items():
        r = sh["runs"]
        L += ["%s# %s saved by 8 processes (dim 0 over dp=8), restarted by N fresh processes, %d repetition(s)" % (
            level, name, sh["repeat"]), "",
              "`ckptio synth check DIR --mesh dp=N --processes N --json` (the CLI forks N processes; each reads "
              "only its devices' boxes and verifies them), from the CLI's start to the last process's state in "
              "memory; fio's best read of a file of the same size on the same disk, in the same repetitions.", "",
              "| restart by | GB/s, median (min-max), aggregate | bytes read ÷ needed | ÷ fio's best | per repetition | "
              "goal ≥ 0.8 |", "|---|---|---|---|---|---|"]
        if r.get("fio_best"):
            L.append("| (fio's best read) | %.2f (%.2f-%.2f) | | | | |" % (med(r["fio_best"]), min(r["fio_best"]),
                                                                       max(r["fio_best"])))
        for n in (1, 2, 3):
            k = "p%d_gbps" % n
            if r.get(k):
                f = sh["ratios"].get("p%d" % n, {})
                L.append("| %d process%s | %.2f (%.2f-%.2f) | %.3f | %.2f | %s | %s |" % (
                    n, "" if n == 1 else "es", med(r[k]), min(r[k]), max(r[k]), max(r["p%d_read_ratio" % n]),
                    f.get("median", 0), ", ".join("%.2f" % x for x in f.get("per_rep", [])),
                    verdict(f.get("median"), 0.8, ">=")))
        L.append("")
    for e in res.get("errors", []):
        L += ["**Error**: `%s`" % e, ""]
    return "\n".join(L)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def data_bytes(ckpt):
    """Bytes of the data files of the newest step directory under `ckpt`."""
    step = max(os.listdir(ckpt))
    return sum(os.path.getsize(os.path.join(ckpt, step, f)) for f in os.listdir(os.path.join(ckpt, step))
               if f.endswith(".bin"))


def prefault_pairs(a):
    """--prefault-pairs N --ckpt DIR: `synth check DIR` with and without
    --no-prefault, N pairs, alternating which goes first, cold cache, fresh
    process each: what prefaulting is worth on the device under DIR.

    Each restore starts as it does in the rotation of a full run: a process
    first touches as many bytes as the state and exits (numpy.load and
    torch.load leave that much memory free before the next contender), then
    the page cache is dropped and --settle s pass (free page reporting hands
    idle memory back to the host). --pairs-fresh skips both: restores back to
    back, the way this mode ran before 2026-11-28. --pairs-processes N: each
    restore by N processes into a sharding (`--mesh dp=N --processes N`, as
    the sharded restarts of a full run; a step saved by several processes)."""
    import statistics
    import contenders as C
    size = data_bytes(a.ckpt)
    mesh = ["--mesh", "dp=%d" % a.pairs_processes, "--processes", str(a.pairs_processes)] \
        if a.pairs_processes else []
    res = {"on": [], "off": []}
    for r in range(a.prefault_pairs):
        for v in (("on", "off") if r % 2 == 0 else ("off", "on")):
            if a.pairs_fresh:
                drop_caches()
            else:
                C.touch_and_free(size)
                drop_caches(a.settle)
            s, _, _ = spawn([a.ckptio, "synth", "check", a.ckpt, "--json"] + mesh +
                            (["--no-prefault"] if v == "off" else []))
            res[v].append(size / s / 1e9)
    on, off = statistics.median(res["on"]), statistics.median(res["off"])
    pairs = [x / y for x, y in zip(res["on"], res["off"])]
    print("%s%s, %d pairs (%s): prefault on %.2f GB/s (%.2f-%.2f), off %.2f GB/s (%.2f-%.2f), on / off %.2f; "
          "pairs >= 1: %d; per pair %s" % (size_name(size), " by %d processes into a sharding" % a.pairs_processes
                                           if a.pairs_processes else "", len(pairs),
                                           "back to back" if a.pairs_fresh else
                                           "each after a first touch of as much and %g s idle" % a.settle,
                                           on, min(res["on"]), max(res["on"]), off,
                                           min(res["off"]), max(res["off"]), on / off,
                                           sum(x >= 1 for x in pairs), ", ".join("%.2f" % x for x in pairs)))
    return 0


def python_pairs(a):
    """--python-pairs N --ckpt DIR: the CLI's `synth check DIR` and the Python
    package's `CheckpointManager(DIR).restore()`, N pairs, alternating which
    goes first, cold cache and --settle s idle, fresh process each: from
    process start, from `import ckptio` done, and the C++ restore's own
    seconds in each (where a gap between them lies); and the page faults and
    transparent huge pages each took (/proc/vmstat deltas)."""
    import statistics
    size = data_bytes(a.ckpt)
    env = package_env(a.ckptio)
    res = {k: [] for k in ("cli", "cli_restore", "python", "python_after_import", "python_restore")}
    faults = {"cli": [], "python": []}

    def vmstat():
        with open("/proc/vmstat") as f:
            v = dict(l.split() for l in f)
        return int(v.get("pgfault", 0)), int(v.get("thp_fault_alloc", 0))
    for r in range(a.python_pairs):
        for who in (("cli", "python") if r % 2 == 0 else ("python", "cli")):
            drop_caches(a.settle)
            v0 = vmstat()
            if who == "cli":
                s, _, j = spawn([a.ckptio, "synth", "check", a.ckpt, "--json", "--batch", str(4 * size)])
                res["cli_restore"].append(j["restore_seconds"])
            else:
                s, _, j = spawn([sys.executable, os.path.abspath(__file__), "--child", "python_stats",
                                 "--path", a.ckpt], env)
                res["python_after_import"].append(j["ready_monotonic_s"] - j["imported_monotonic_s"])
                res["python_restore"].append(j["restore_seconds"])
            res[who].append(s)
            faults[who].append(tuple(b - a for a, b in zip(v0, vmstat())))
    m = {k: statistics.median(v) for k, v in res.items()}
    print("%s, %d pairs, seconds (median, min-max): from process start CLI %s, Python %s; Python from `import "
          "ckptio` done %s; the C++ restore's own time: in the CLI %s, in Python %s; CLI / Python: %.2f from start, "
          "%.2f after import, %.2f restore alone" % (
              size_name(size), a.python_pairs,
              *["%.2f (%.2f-%.2f)" % (m[k], min(res[k]), max(res[k]))
                for k in ("cli", "python", "python_after_import", "cli_restore", "python_restore")],
              m["cli"] / m["python"], m["cli"] / m["python_after_import"], m["cli_restore"] / m["python_restore"]))
    print("restore alone, per pair (CLI, Python): %s; page faults (machine-wide, median): CLI %d, Python %d; "
          "transparent huge pages faulted: CLI %d, Python %d" % (
              ", ".join("(%.2f, %.2f)" % p for p in zip(res["cli_restore"], res["python_restore"])),
              statistics.median(f[0] for f in faults["cli"]), statistics.median(f[0] for f in faults["python"]),
              sum(f[1] for f in faults["cli"]), sum(f[1] for f in faults["python"])))
    return 0


def touch_pairs(a):
    """--touch-pairs N [--touch-size 4GiB]: how fast this VM lets a process
    first-touch memory that another process has just freed, against the same
    after the freed memory sat idle for --touch-wait seconds: N pairs, the
    order alternated; each side first runs a process that touches and frees as
    much. Where the kernel reports free pages to the host (virtio-balloon free
    page reporting, `page_reporting.page_reporting_order` on the kernel command
    line), idle free memory is handed back and each first touch of it faults on
    the host too."""
    size = parse_size(a.touch_size)
    res = {"right after": [], "after the wait": []}
    for r in range(a.touch_pairs):
        for who in (("right after", "after the wait") if r % 2 == 0 else ("after the wait", "right after")):
            first_touch(size)[0]  # touches `size` and exits: that memory is free again
            if who != "right after":
                time.sleep(a.touch_wait)
            res[who].append(first_touch(size)[0])
    page_reporting = [w for w in open("/proc/cmdline").read().split() if "page_reporting" in w]
    print("first touch of %s of fresh memory (one thread, 4 KiB pages), %d pairs, GB/s median (min-max): "
          "right after another process freed as much %.2f (%.2f-%.2f); after %g s idle %.2f (%.2f-%.2f); "
          "kernel command line: %s" % (
              size_name(size), a.touch_pairs, med(res["right after"]), min(res["right after"]),
              max(res["right after"]), a.touch_wait, med(res["after the wait"]), min(res["after the wait"]),
              max(res["after the wait"]), " ".join(page_reporting) or "no page_reporting setting"))
    return 0


def warm_rounds(a):
    """--warm-rounds N --ckpt DIR: where a restart's time goes against the
    disk's. Per round, in an order rotated by one: fio's three reads of the
    step's data file (FIO_BEST, page cache dropped before each), and one fresh
    Python process that restores the step into fresh memory (after a first
    touch of as much memory elsewhere, the drop and --settle, as in a full
    run), then drops the page cache and restores it again into the arrays it
    just filled (`restore(into=)`: memory already touched). Both restores are
    timed around the call alone and verify every checksum. Prints per-shape
    medians, the per-round best (what the full run's "fio's best" is) against
    the best shape's median, and fresh against touched memory."""
    import contenders as C
    size = data_bytes(a.ckpt)
    data = largest_data_file(os.path.join(a.ckpt, max(os.listdir(a.ckpt))))
    env = package_env(a.ckptio)
    keys = [k for k, *_ in C.FIO_BEST]
    res = {k: [] for k in keys + ["best", "fresh", "warm"]}

    def fio():
        for key, jobs, depth, bs, direct in C.FIO_BEST:
            drop_caches()
            res[key].append(C.fio_job(data, size, "read", jobs, depth, bs, direct))
        res["best"].append(max(res[k][-1] for k in keys))

    def restore():
        C.touch_and_free(size)
        drop_caches(a.settle)
        _, _, j = spawn([sys.executable, os.path.abspath(__file__), "--child", "warm", "--path", a.ckpt], env)
        res["fresh"].append(size / j["fresh_seconds"] / 1e9)
        res["warm"].append(size / j["warm_seconds"] / 1e9)
    for r in range(a.warm_rounds):
        for f in ((fio, restore) if r % 2 == 0 else (restore, fio)):
            f()
        log("round %d: %s" % (r + 1, ", ".join("%s %.2f" % (k, v[-1]) for k, v in res.items())))
    m = {k: med(v) for k, v in res.items()}
    shape = max(keys, key=lambda k: m[k])
    r = lambda k: "%.2f (%.2f-%.2f)" % (m[k], min(res[k]), max(res[k]))  # noqa: E731
    print("%s, %d rounds, GB/s median (min-max): fio %s; fio's best per round %s; restore into fresh memory %s, "
          "into touched memory %s" % (size_name(size), a.warm_rounds, "; ".join("%s %s" % (k, r(k)) for k in keys),
                                      r("best"), r("fresh"), r("warm")))
    print("fio's best per round / its best shape's median (%s): %.2f; fresh / touched: %.2f; touched / fio's best "
          "shape: %.2f; fresh / fio's best shape: %.2f; fresh / fio's best per round: %.2f" % (
              shape, m["best"] / m[shape], m["fresh"] / m["warm"], m["warm"] / m[shape], m["fresh"] / m[shape],
              m["fresh"] / m["best"]))
    return 0


def contention_rounds(a):
    """--contention-rounds N --ckpt DIR: does reading the disk slow down while
    fresh memory is first-touched? Per round, each after dropping the page
    cache: fio reading the step's data file (1 job, depth 32, 1 MiB, O_DIRECT,
    as much as the touch), the first touch of as many fresh bytes (the `touch`
    child), then both at once (fio on a thread of this process, the touch in
    its child). A restart does both: it reads into memory it has never touched."""
    import threading
    import contenders as C
    step = os.path.join(a.ckpt, sorted(d for d in os.listdir(a.ckpt) if d.startswith("run-"))[-1])
    data = largest_data_file(step)
    size = os.path.getsize(data) // MiB * MiB
    res = {k: [] for k in ("fio", "touch", "fio_with_touch", "touch_with_fio")}
    for _ in range(a.contention_rounds):
        drop_caches()
        res["fio"].append(C.fio_job(data, size, "read", 1, 32, MiB, True))
        drop_caches()
        res["touch"].append(first_touch(size)[0])
        drop_caches()
        got = {}
        t = threading.Thread(target=lambda: got.update(f=C.fio_job(data, size, "read", 1, 32, MiB, True)))
        t.start()
        res["touch_with_fio"].append(first_touch(size)[0])
        t.join()
        res["fio_with_touch"].append(got["f"])
    r = lambda k: "%.2f (%.2f-%.2f)" % (med(res[k]), min(res[k]), max(res[k]))  # noqa: E731
    print("%s, %d rounds, GB/s median (min-max): fio read alone %s, while fresh memory is touched %s (%.2f of "
          "alone); first touch alone %s, while fio reads %s (%.2f of alone)" % (
              size_name(size), a.contention_rounds, r("fio"), r("fio_with_touch"),
              med(res["fio_with_touch"]) / med(res["fio"]), r("touch"), r("touch_with_fio"),
              med(res["touch_with_fio"]) / med(res["touch"])))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckptio", default=os.path.join(ROOT, "build", "bin", "ckptio"))
    ap.add_argument("--sizes", default="2GiB,half")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json", default=None, help="write the results as JSON to FILE (- for stdout)")
    ap.add_argument("--sharded", default="2GiB",
                    help="size of the step saved by 8 processes and restarted by 1, 2, 3 ('' or 0 to skip)")
    ap.add_argument("--prefault-pairs", type=int, default=0, metavar="N",
                    help="only compare `synth check` with and without --no-prefault, N pairs, on --ckpt")
    ap.add_argument("--pairs-fresh", action="store_true",
                    help="--prefault-pairs back to back, without the first touch and --settle before each")
    ap.add_argument("--pairs-processes", type=int, default=0, metavar="N",
                    help="--prefault-pairs restoring by N processes into a sharding (--mesh dp=N --processes N)")
    ap.add_argument("--python-pairs", type=int, default=0, metavar="N",
                    help="only compare the CLI's restart with the Python package's, N pairs, on --ckpt")
    ap.add_argument("--touch-pairs", type=int, default=0, metavar="N",
                    help="only time the first touch of freshly freed memory against memory idle --touch-wait s")
    ap.add_argument("--touch-size", default="4GiB")
    import contenders as C
    C.add_settle_arg(ap)
    ap.add_argument("--contention-rounds", type=int, default=0, metavar="N",
                    help="only time fio's read of --ckpt's data alone and while fresh memory is first-touched")
    ap.add_argument("--touch-wait", type=float, default=8.0)
    ap.add_argument("--warm-rounds", type=int, default=0, metavar="N",
                    help="only time fio's reads, a restore into fresh memory and one into touched memory, on --ckpt")
    ap.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default=None,
                    help="a checkpoint directory (`ckptio synth save`) for --prefault-pairs, --python-pairs, "
                         "--warm-rounds, --contention-rounds")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--export", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--expect", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.export:
        return export(a)
    if a.prefault_pairs:
        a.ckptio = os.path.abspath(a.ckptio)
        return prefault_pairs(a)
    if a.touch_pairs:
        return touch_pairs(a)
    if a.contention_rounds:
        return contention_rounds(a)
    if a.warm_rounds:
        a.ckptio = os.path.abspath(a.ckptio)
        return warm_rounds(a)
    if a.python_pairs:
        a.ckptio = os.path.abspath(a.ckptio)
        return python_pairs(a)
    if not shutil.which("fio"):
        sys.exit("bench/restart: fio is missing (tools/setup-deps --bench)")
    a.ckptio = os.path.abspath(a.ckptio)
    a.dir = os.path.join(a.dir, "ckptio-restart-%d" % os.getpid())
    os.makedirs(a.dir)
    run = Run(a)
    fs = subprocess.run(["findmnt", "-n", "-T", os.path.dirname(a.dir), "-o", "SOURCE,FSTYPE"],
                        capture_output=True, text=True).stdout.strip()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ckptio": a.ckptio, "sizes": {},
           "errors": run.errors, "load_start": loadavg(), "filesystem": fs or "?",
           "command": " ".join(["bench/restart_bench.py"] + sys.argv[1:]), "settle": a.settle,
           "uneven_start": a.uneven_start}
    t = time.monotonic()
    try:
        for s in filter(None, a.sizes.split(",")):
            size = parse_size(s)
            res["sizes"][size_name(size)] = run.size(size)
        size = parse_size(a.sharded) if a.sharded else 0
        if size > 0:  # '' or 0: no sharded restarts
            res["sharded"] = {size_name(size): run.sharded(size)}
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    res["cold_cache"] = run.cold
    res["ratios"] = ratios(res)
    res["seconds"] = time.monotonic() - t
    res["load_end"] = loadavg()
    print(table(res))
    if a.json:
        text = json.dumps(res, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
