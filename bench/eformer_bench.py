#!/usr/bin/python3
"""Reading eformer / TensorStore zarr v2 steps: ckptio against zarr-python.

  PYTHONPATH=<build>/python /usr/bin/python3 bench/eformer_bench.py \\
      [--bytes 1G] [--reps 3] [--dir /var/tmp/ckptio-eformer-bench] [--json out.json]

(also `bench/run-all --only eformer`, which writes its section of
docs/benchmarks.md from --json through markdown() below). --dir is removed
and made anew.

A state shaped as a transformer's (bfloat16 parameters, float32 optimizer
moments; values normal(0, 0.02) as trained weights are, not random bytes) is
written as eformer writes it from an 8-device data-parallel mesh: one zarr
array per leaf, chunks of one eighth of the rows (the device shards), zstd
level 1, tensorstore_index.json and metadata.json. zarr-python writes it
(the writer a user has today). Writes, rotated each of --reps: zarr-python
again, `ckptio cp <ckptio step> --format eformer`, and a save straight into
the layout (CheckpointManager(layout="eformer")). Then, alternated, each in a fresh
process after another first-touches as many bytes as the state and exits,
the page cache is dropped (root) and --settle seconds pass (default 8, as
bench/restart_bench.py and bench/python_bench.py: every contender then starts
on memory freed and left idle alike, docs/restart.md; --uneven-start: without
the first touch), medians of --reps:
  - ckptio restore: `ckptio.CheckpointManager(base).restore()` (discovery,
    index, .zarray files, chunks read and decoded on every core);
  - zarr-python: every array opened and read whole (`z[...]`).
Timed from the process's start to the state in memory; each then checks
a checksum of every leaf against the values written (untimed). Then a
resharded restore (one of 4 devices of a 2 x 2 mesh, kernels split on both
axes) reports the compressed bytes read against those of the chunks its boxes
touch. Also: the compression ratio, and CPU seconds per GiB of the ckptio
restore (user + system of its process).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from contenders import add_settle_arg, drop_caches, touch_and_free  # noqa: E402
from sizes import parse_size  # noqa: E402

GiB = 1 << 30


def plan_state(total):
    """(prefix, dotted path, shape, dtype) of leaves summing to ~total bytes:
    per layer a bf16 kernel [1024, 2048] and its f32 moment, plus a bias."""
    leaves = []
    per_layer = 1024 * 2048 * (2 + 4) + 2048 * 2
    for i in range(max(1, total // per_layer)):
        leaves.append(("model", f"layers.{i}.kernel", (1024, 2048), "bfloat16"))
        leaves.append(("model", f"layers.{i}.bias", (2048,), "bfloat16"))
        leaves.append(("tx", f"mu.layers.{i}.kernel", (1024, 2048), "float32"))
    return leaves


WRITER = r"""
import datetime, json, os, sys, time, zlib
import numpy as np, numcodecs, zarr
from zarr.storage import DirectoryStore
base, plan = sys.argv[1], json.load(open(sys.argv[2]))
step_dir = os.path.join(base, "run-1")
rng = np.random.default_rng(30)
index = {"format": "tensorstore", "version": "0.0.95", "prefixes": {}}
sums = {}
state = []
for prefix, path, shape, dtype in plan:  # made before the clock starts: only the writes are timed
    a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
    stored = (a.view("<u4") >> 16).astype("<u2") if dtype == "bfloat16" else a
    state.append((prefix, path, shape, dtype, stored))
    sums[prefix + "/" + path] = zlib.crc32(np.ascontiguousarray(stored).tobytes())
t0 = time.perf_counter()
for prefix, path, shape, dtype, stored in state:
    d = os.path.join(step_dir, prefix, *path.split("."))
    chunks = (max(1, shape[0] // 8),) + tuple(shape[1:])
    z = zarr.open_array(store=DirectoryStore(d), mode="w", shape=shape, chunks=chunks, dtype=stored.dtype,
                        compressor=numcodecs.Zstd(level=1), fill_value=None)
    z[...] = stored
    if dtype == "bfloat16":
        m = json.load(open(os.path.join(d, ".zarray")))
        m["dtype"] = "bfloat16"
        open(os.path.join(d, ".zarray"), "w").write(json.dumps(m, sort_keys=True, separators=(",", ":")))
    index["prefixes"].setdefault(prefix, []).append(
        {"path": prefix + "/" + path.replace(".", "/"), "shape": list(shape), "dtype": dtype})
open(os.path.join(step_dir, "tensorstore_index.json"), "w").write(json.dumps(index, indent=2))
json.dump({"step": 1, "timestamp": datetime.datetime.now().isoformat(), "is_temporary": False},
          open(os.path.join(step_dir, "metadata.json"), "w"))
for root, dirs, files in os.walk(step_dir):
    for f in files:
        fd = os.open(os.path.join(root, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
seconds = time.perf_counter() - t0
json.dump(sums, open(os.path.join(base, "sums.json"), "w"))
print(json.dumps({"seconds": seconds}))
"""

SAVER = r"""
import json, os, sys, time
import numpy as np, ckptio
base, plan = sys.argv[1], json.load(open(sys.argv[2]))
rng = np.random.default_rng(30)
state = {}
for prefix, path, shape, dtype in plan:  # the writer's values; bf16 kept as its uint16 bits
    a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
    stored = (a.view("<u4") >> 16).astype("<u2") if dtype == "bfloat16" else a
    node = state.setdefault(prefix, {})
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = stored
shards = os.environ.get("SHARDS") == "1"
with ckptio.CheckpointManager(base, layout="eformer", staging="borrow") as mgr:
    t0 = time.perf_counter()
    mgr.save(1, state).wait()
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds}))
"""

CKPTIO_READ = r"""
import json, os, resource, sys, time, zlib
t0 = time.perf_counter()
import numpy as np, ckptio
base = sys.argv[1]
tree, info = ckptio.CheckpointManager(base).restore(info=True)
seconds = time.perf_counter() - t0
done_at = time.time()
ru = resource.getrusage(resource.RUSAGE_SELF)  # the restore's CPU (with the interpreter's start)
sums = json.load(open(os.path.join(base, "sums.json")))
flat = {}
def walk(pfx, node):
    if isinstance(node, dict):
        for k, v in node.items():
            walk(pfx + [k], v)
    else:
        flat[pfx[0] + "/" + ".".join(pfx[1:])] = node
walk([], tree)
for name, crc in sums.items():
    a = flat[name]
    if zlib.crc32(np.ascontiguousarray(a).view(np.uint8).tobytes()) != crc:
        sys.exit("ckptio: " + name + " differs from what was written")
print(json.dumps({"seconds": seconds, "done_at": done_at, "cpu": ru.ru_utime + ru.ru_stime, "stats": info.stats}))
"""

ZARR_READ = r"""
import json, os, sys, time, zlib
t0 = time.perf_counter()
import numpy as np, zarr
base = sys.argv[1]
step_dir = os.path.join(base, "run-1")
index = json.load(open(os.path.join(step_dir, "tensorstore_index.json")))

class Store(zarr.DirectoryStore):
    # zarr-python has no bfloat16: its arrays read as the uint16 they are stored as.
    def __getitem__(self, key):
        v = super().__getitem__(key)
        return v.replace(b'"bfloat16"', b'"<u2"') if key.endswith(".zarray") else v

out = {}
for prefix, arrays in index["prefixes"].items():
    for a in arrays:
        z = zarr.open_array(store=Store(os.path.join(step_dir, a["path"])), mode="r")
        out[prefix + "/" + a["path"][len(prefix) + 1:].replace("/", ".")] = z[...]
seconds = time.perf_counter() - t0
done_at = time.time()
sums = json.load(open(os.path.join(base, "sums.json")))
for name, crc in sums.items():
    if zlib.crc32(np.ascontiguousarray(out[name]).tobytes()) != crc:
        sys.exit("zarr: " + name + " differs from what was written")
print(json.dumps({"seconds": seconds, "done_at": done_at}))
"""

RESHARD = r"""
import json, sys, ckptio
base = sys.argv[1]
tree, info = ckptio.CheckpointManager(base).restore(info=True, sharding=dict(
    mesh={"x": 2, "y": 2}, rules=[("kernel", ("x", "y")), (".*", ())], devices=[1], min_size=0))
print(json.dumps({"stats": info.stats}))
"""


def run_py(code, *args, env=None):
    p = subprocess.run(["/usr/bin/python3", "-c", code] + list(args), capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("eformer_bench: a run failed:\n" + (p.stderr or p.stdout)[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def touched_chunk_bytes(base, plan):
    """Compressed bytes of the chunks device 1 of the 2 x 2 mesh touches:
    kernels split (x, y) -> rows [0, R/2), all chunks of 1/8 rows in that
    half; everything else replicated -> every chunk."""
    step_dir = os.path.join(base, "run-1")
    total = 0
    for prefix, path, shape, dtype in plan:
        d = os.path.join(step_dir, prefix, *path.split("."))
        rows_per_chunk = max(1, shape[0] // 8)
        for f in os.listdir(d):
            if f.startswith("."):
                continue
            row_chunk = int(f.split(".")[0])
            if "kernel" in path and row_chunk * rows_per_chunk >= shape[0] // 2:
                continue
            total += os.path.getsize(os.path.join(d, f))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", default="1G")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/ckptio-eformer-bench")
    ap.add_argument("--json")
    add_settle_arg(ap)
    ap.add_argument("--ckptio", default=os.path.join(os.path.dirname(HERE), "build", "bin", "ckptio"))
    a = ap.parse_args()
    started, t_start, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.time(), loadavg()
    try:
        import ckptio  # noqa: F401
    except ImportError as e:
        sys.exit("eformer_bench: cannot import ckptio (%s): set PYTHONPATH=<build>/python" % e)
    plan = plan_state(parse_size(a.bytes))
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    with open(os.path.join(a.dir, "plan.json"), "w") as f:
        json.dump(plan, f)
    raw = sum(int(np.prod(s)) * (2 if d == "bfloat16" else 4) for _, _, s, d in plan)
    w = run_py(WRITER, a.dir, os.path.join(a.dir, "plan.json"))
    stored = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(a.dir, "run-1"))
                 for f in fs)
    print(f"state: {len(plan)} leaves, {raw / GiB:.2f} GiB; stored {stored / GiB:.2f} GiB "
          f"(compression ratio {raw / stored:.3f}); zarr-python wrote it in {w['seconds']:.2f} s, not counted "
          f"({raw / w['seconds'] / 1e9:.2f} GB/s)")
    # Writing the layout, the three writers rotated each repetition, every
    # file fsynced by each:
    #  - zarr-python writing the arrays from memory (made before its clock);
    #  - ckptio's cp of the same state from a ckptio step into eformer's
    #    layout (the source read first, so its reads cost little);
    #  - a save straight into the layout (CheckpointManager(layout="eformer"),
    #    borrow staging, save() to committed) of the same arrays from memory.
    #    Its leaves are whole (one chunk each: a one-device save), where
    #    zarr-python and cp write 8 chunks per leaf.
    ck = os.path.join(a.dir, "ck")
    subprocess.run([a.ckptio, "cp", a.dir, ck, "--format", "ckptio"], check=True, capture_output=True)
    subprocess.run([a.ckptio, "verify", ck], check=True, capture_output=True)
    zwrites, writes, saves = [], [], []
    for rep in range(a.reps):
        order = ["zarr", "cp", "save"]
        for who in order[rep % 3:] + order[:rep % 3]:
            if who == "zarr":
                zb = os.path.join(a.dir, "zw")
                shutil.rmtree(zb, ignore_errors=True)
                zwrites.append(run_py(WRITER, zb, os.path.join(a.dir, "plan.json"))["seconds"])
                shutil.rmtree(zb, ignore_errors=True)
            elif who == "cp":
                out = os.path.join(a.dir, "out")
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run(["cat"] + [os.path.join(r, f) for r, _, fs in os.walk(ck) for f in fs],
                               check=True, stdout=subprocess.DEVNULL)  # the source warm
                t0 = time.perf_counter()
                subprocess.run([a.ckptio, "cp", ck, out, "--format", "eformer"], check=True, capture_output=True)
                writes.append(time.perf_counter() - t0)
            else:
                out = os.path.join(a.dir, "saved")
                shutil.rmtree(out, ignore_errors=True)
                saves.append(run_py(SAVER, out, os.path.join(a.dir, "plan.json"))["seconds"])
    zmed, wmed, smed = statistics.median(zwrites), statistics.median(writes), statistics.median(saves)
    print(f"write the eformer layout, medians of {a.reps}: zarr-python {zmed:.2f} s ("
          + ", ".join(f"{x:.2f}" for x in zwrites) + f"); ckptio cp --format eformer {wmed:.2f} s ("
          + ", ".join(f"{x:.2f}" for x in writes) + f"): {zmed / wmed:.2f}x; ckptio save in the layout {smed:.2f} s ("
          + ", ".join(f"{x:.2f}" for x in saves) + f"): {zmed / smed:.2f}x (targets >= 3x)")
    cold = True
    rows = {"ckptio": [], "zarr": []}
    cpu = []
    for rep in range(a.reps):
        for who in (("ckptio", "zarr") if rep % 2 == 0 else ("zarr", "ckptio")):
            if not a.uneven_start:
                touch_and_free(raw)  # every restore starts after the same freed memory
            cold = drop_caches(a.settle) and cold
            t0 = time.time()
            r = run_py(CKPTIO_READ if who == "ckptio" else ZARR_READ, a.dir)
            # From the process's start to its state in memory, as a restart lives it (the check of
            # every leaf against what was written comes after, untimed).
            wall = r["done_at"] - t0
            rows[who].append(wall)
            if who == "ckptio":
                cpu.append(r["cpu"])
            print(f"  rep {rep + 1} {who:6s}: {wall:.2f} s in a fresh process ({raw / wall / 1e9:.2f} GB/s)")
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"restore, fresh process{', cold page cache' if cold else ' (page cache NOT dropped: not root)'}, "
          f"medians of {a.reps}: ckptio {raw / med['ckptio'] / 1e9:.2f} GB/s, zarr-python "
          f"{raw / med['zarr'] / 1e9:.2f} GB/s: {med['zarr'] / med['ckptio']:.2f}x (target >= 3x)")
    print(f"ckptio restore CPU: {statistics.median(cpu) / (raw / GiB):.2f} s per GiB restored (user + system)")
    drop_caches()
    rs = run_py(RESHARD, a.dir)["stats"]
    touched = touched_chunk_bytes(a.dir, plan)
    print(f"resharded restore (device 1 of x=2,y=2): read {rs['bytes_read']} B, the chunks its boxes touch "
          f"hold {touched} B: {rs['bytes_read'] / touched:.3f}x (target <= 1.02x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(["bench/eformer_bench.py"] + sys.argv[1:]), "date": started,
                       "seconds": time.time() - t_start, "load_start": load_start, "load_end": loadavg(),
                       "leaves": len(plan), "reps": a.reps, "cold_cache": cold, "settle": a.settle, "uneven_start": a.uneven_start,
                       "raw_bytes": raw, "stored_bytes": stored, "zarr_write_seconds": zwrites,
                       "restore_seconds": rows, "ckptio_write_seconds": writes, "ckptio_save_seconds": saves,
                       "cpu_seconds": cpu, "reshard_bytes_read": rs["bytes_read"],
                       "reshard_touched_bytes": touched, "errors": []}, f, indent=2)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def markdown(res, level="##"):
    """docs/benchmarks.md's section from the JSON of --json."""
    raw, med = res["raw_bytes"], statistics.median
    gib = raw / GiB
    rest = {k: med(v) for k, v in res["restore_seconds"].items()}
    zws = res["zarr_write_seconds"]
    zws = zws if isinstance(zws, list) else [zws]  # (one run before 2026-11-27)
    cp, save, zw = med(res["ckptio_write_seconds"]), med(res["ckptio_save_seconds"]), med(zws)

    def runs(v):
        return ", ".join("%.2f" % x for x in v)

    def verdict(ratio, goal):
        return "met" if ratio >= goal else "**NOT MET**"

    reshard = res["reshard_bytes_read"] / res["reshard_touched_bytes"]
    L = ["%s eformer / TensorStore zarr steps (issue 29)" % level, "",
         "Command: `PYTHONPATH=<build>/python /usr/bin/python3 %s`%s  " % (
             res["command"], " (run by `%s`)" % res["run_by"] if res.get("run_by") else ""),
         "Date: %s (%.1f min); load average %s at the start, %s at the end  " % (
             res["date"], res["seconds"] / 60, res["load_start"], res["load_end"]),
         "A state of %d leaves, %.2f GiB (bfloat16 kernels [1024, 2048] and biases, float32 moments; values "
         "normal(0, 0.02) as trained weights are), written by zarr-python as eformer writes an 8-device "
         "data-parallel save: 8 row-band chunks per leaf, zstd level 1; %.2f GiB stored (compression ratio "
         "%.3f)." % (res["leaves"], gib, res["stored_bytes"] / GiB, raw / res["stored_bytes"]), "",
         "Restores: each in a fresh process after the page cache is dropped (done: **%s**)%s, ckptio and "
         "zarr-python alternated, timed from the process's start to the state in memory (each then checks "
         "every leaf against the values written, untimed). Writes: the three writers rotated, every file "
         "fsynced by each." % (
             "yes" if res["cold_cache"] else "NO",
             (" and %g s idle (docs/restart.md)" % res["settle"] if res.get("settle") else "")
             + ("; before each, a process first-touched as many bytes as the state and exited"
                if res.get("uneven_start") is False else "")), "",
         "| | median (s) | GB/s | runs (s) |", "|---|---|---|---|",
         "| restore: ckptio (`CheckpointManager(base).restore()`) | %.2f | %.2f | %s |" % (
             rest["ckptio"], raw / rest["ckptio"] / 1e9, runs(res["restore_seconds"]["ckptio"])),
         "| restore: zarr-python (each array `z[...]`) | %.2f | %.2f | %s |" % (
             rest["zarr"], raw / rest["zarr"] / 1e9, runs(res["restore_seconds"]["zarr"])),
         "| write: `ckptio cp <ckptio step> DST --format eformer` (source in the page cache) | %.2f | %.2f | %s |" % (
             cp, raw / cp / 1e9, runs(res["ckptio_write_seconds"])),
         "| write: ckptio save, `CheckpointManager(base, layout=\"eformer\", staging=\"borrow\")`, "
         "save() to committed, whole leaves | %.2f | %.2f | %s |" % (save, raw / save / 1e9, runs(res["ckptio_save_seconds"])),
         "| write: zarr-python (`z[...] = a` per leaf, from memory) | %.2f | %.2f | %s |" % (zw, raw / zw / 1e9, runs(zws)),
         "", "| target | goal | this run | verdict |", "|---|---|---|---|",
         "| restore ÷ zarr-python | ≥ 3 | %.2f | %s |" % (rest["zarr"] / rest["ckptio"], verdict(rest["zarr"] / rest["ckptio"], 3)),
         "| cp --format eformer ÷ zarr-python's write | ≥ 3 | %.2f | %s |" % (zw / cp, verdict(zw / cp, 3)),
         "| save in the eformer layout ÷ zarr-python's write | ≥ 3 | %.2f | %s |" % (zw / save, verdict(zw / save, 3)),
         "| resharded restore (device 1 of a 2 × 2 mesh): bytes read ÷ bytes of the chunks its boxes touch | "
         "≤ 1.02 | %.3f | %s |" % (reshard, "met" if reshard <= 1.02 else "**NOT MET**"),
         "", "ckptio's restore used %.2f CPU seconds per GiB (user + system, the interpreter's start included). "
         "Where the time goes, the physical bounds of two cores for zstd, and what was tried: "
         "[history.md](benchmarks/history.md#eformer--tensorstore-zarr-steps-issue-29)." % (
             med(res["cpu_seconds"]) / gib), ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
