#!/usr/bin/env python3
"""Back-to-back saves with retention on, from Python: each save() then wait()
to committed, the next save called at once (a trainer checkpointing often,
max_to_keep=1: every commit deletes the step before it). Two builds of the
Python package alternated in one run, so that a change is measured against
the code before it on the same machine in the same minutes.

  bench/back_to_back.py OLD_PYTHONPATH NEW_PYTHONPATH [--bytes 1GiB] [--saves 6] [--reps 3] [--dir DIR]

Prints, per run, the median seconds of a save (save() to committed, the first
save left out: nothing to delete yet), then the medians of the runs and
new / old. Build the old package from a worktree with -DCKPTIO_BUILD_PYTHON=ON.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys

from sizes import parse_size

CHILD = r"""
import json, shutil, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, ckptio
base, nbytes, saves = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
shutil.rmtree(base, ignore_errors=True)
leaf = 8 << 20
state = {"model": {f"l{i}": np.full(leaf // 4, i, np.float32) for i in range(max(1, nbytes // leaf))}}
per = []
with ckptio.CheckpointManager(base, max_to_keep=1, staging="copy") as m:
    for step in range(1, saves + 1):
        t0 = time.perf_counter()
        m.save(step, state).wait()
        per.append(time.perf_counter() - t0)
    m.wait_until_finished()
    assert m.all_steps() == [saves], m.all_steps()
shutil.rmtree(base, ignore_errors=True)
print(json.dumps({"per": per[1:], "median": statistics.median(per[1:])}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--saves", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/ckptio-back-to-back")
    a = ap.parse_args()
    res = {"old": [], "new": []}
    for rep in range(a.reps):
        for who in (("old", "new") if rep % 2 == 0 else ("new", "old")):
            p = subprocess.run(["/usr/bin/python3", "-c", CHILD, getattr(a, who), a.dir, str(parse_size(a.bytes)),
                                str(a.saves)], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit("back_to_back: a run failed:\n" + p.stderr[-2000:])
            r = json.loads(p.stdout.strip().splitlines()[-1])
            res[who].append(r["median"])
            print(f"rep {rep + 1} {who}: median {r['median']:.3f} s per save ("
                  + ", ".join(f"{x:.2f}" for x in r["per"]) + ")", flush=True)
    old, new = statistics.median(res["old"]), statistics.median(res["new"])
    print(f"save() to committed, back to back, max_to_keep=1, {a.bytes}: old {old:.3f} s, new {new:.3f} s: "
          f"new / old {new / old:.2f}")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
