"""bench/run-all's report: targets, docs/benchmarks.md, plots, results.json,
README's headline table. Pure functions of the results dict, so a report can
be re-made from a results.json:

  python3 bench/report.py docs/benchmarks/results.json [OUT_DIR]
"""
import importlib
import json
import os
import re
import statistics
import sys

MiB, GiB = 1 << 20, 1 << 30
README_START = "<!-- bench:headline:start (written by bench/run-all; edit the script, not this table) -->"
README_END = "<!-- bench:headline:end -->"


def med(v):
    return statistics.median(v) if v else None


def fmt(v, digits=2):
    if not v:
        return "—"
    f = "%%.%df" % digits
    if len(v) == 1:
        return f % v[0]
    return (f + " (" + f + "–" + f + ")") % (statistics.median(v), min(v), max(v))


def size_name(n):
    n = int(n)
    for u, m in (("GiB", GiB), ("MiB", MiB)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, u)
    return "%.0f MiB" % (n / MiB)


def runs_of(sec):
    return (sec or {}).get("runs", {})


def best_fio(runs, rw):
    vals = [med(runs.get("fio_%s_%s" % (rw, m))) for m in ("direct", "buffered")]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


# ---- targets -------------------------------------------------------------------

def cores(r, who):
    """Median (server, machine) cores of who's restores, or Nones (CpuMeter)."""
    return med(r.get(who + "_restore_server_cores")), med(r.get(who + "_restore_machine_cores"))


def above_ceiling(res, r, what):
    """A note when 1.5x boto3 is above what the server gave 8 parallel curl
    requests in this run: then no client could meet that target here."""
    b, c = med(r.get("boto3_" + what)), med(r.get("curl_" + what))
    if b is None or c is None or 1.5 * b <= c:
        return ""
    note = "; 1.5× boto3 (%.3f GB/s) is above this server's ceiling in this run (8 curl %s: %.3f GB/s" % (
        1.5 * b, "GETs" if what == "restore" else "PUTs", c)
    sc, mc = cores(r, "curl")
    if what == "restore" and sc is not None and mc is not None:
        note += ", while the server used %.2f cores and the machine %.2f of %s" % (
            sc, mc, res.get("machine", {}).get("nproc", "?"))
    return note + ")"


def targets(res):
    out = []

    def add(area, name, num, den, goal, op=">=", unit="×", note=""):
        if num is None or den is None or den == 0:
            out.append({"area": area, "name": name, "goal": "%s %s%s" % (op, goal, unit), "value": None,
                        "met": None, "note": note or "not measured in this run"})
            return
        v = num / den if unit == "×" else num
        met = v >= goal if op == ">=" else v < goal if op == "<" else v <= goal
        out.append({"area": area, "name": name, "goal": "%s %g%s" % (op, goal, unit), "value": v,
                    "met": bool(met), "note": note})

    if "local" in res:
        r = runs_of(res["local"])
        fw, fr = best_fio(r, "write"), best_fio(r, "read")
        add("local", "ckptio save ÷ best fio write", med(r.get("ckptio_save")), fw, 0.85)
        add("local", "ckptio restore ÷ best fio read", med(r.get("ckptio_restore")), fr, 0.85,
            note="restore into warm buffers, as fio reads into its own")
        add("local", "ckptio save ÷ zarr-python save", med(r.get("ckptio_save")), med(r.get("zarr_save")), 3)
        add("local", "ckptio restore ÷ zarr-python load", med(r.get("ckptio_restore_fresh")),
            med(r.get("zarr_load")), 2, note="both into fresh memory")
        add("local", "ckptio save ÷ numpy.save + fsync", med(r.get("ckptio_save")), med(r.get("numpy_save")), 2)
        add("local", "ckptio restore ÷ numpy.load", med(r.get("ckptio_restore_fresh")),
            med(r.get("numpy_load")), 1, note="both into fresh memory")
    for kind, sec in sorted((res.get("s3") or {}).items()):
        r = runs_of(sec)
        add("S3 " + kind, "ckptio save ÷ boto3 upload_fileobj", med(r.get("ckptio_save")), med(r.get("boto3_save")), 1.5,
            note=above_ceiling(res, r, "save").lstrip("; "))
        add("S3 " + kind, "ckptio restore ÷ boto3 download_fileobj", med(r.get("ckptio_restore")),
            med(r.get("boto3_restore")), 1.5, note="both into warm buffers" + above_ceiling(res, r, "restore"))
        add("S3 " + kind, "ckptio save ÷ 8 parallel curl PUTs", med(r.get("ckptio_save")), med(r.get("curl_save")), 0.7)
        add("S3 " + kind, "ckptio restore ÷ 8 parallel curl GETs", med(r.get("ckptio_restore")),
            med(r.get("curl_restore")), 0.7)
    pts = stall_points(res)
    if pts:
        worst = max((p for p in pts if p.get("borrow_ms") is not None), key=lambda p: p["borrow_ms"], default=None)
        if worst:
            add("stall", "borrow-mode save() stall, worst size (%s)" % size_name(worst["bytes"]),
                worst["borrow_ms"], 1, 5, op="<", unit=" ms",
                note="median per size; sizes %s" % ", ".join(size_name(p["bytes"]) for p in pts
                                                             if p.get("borrow_ms") is not None))
        cw = max((p for p in pts if p.get("copy_ratio") is not None), key=lambda p: p["copy_ratio"], default=None)
        if cw:
            add("stall", "copy-mode stall ÷ one memcpy, worst size (%s)" % size_name(cw["bytes"]),
                cw["copy_ratio"], 1, 1.3, op="<=", unit="×",
                note="median of per-run ratios; sizes %s" % ", ".join(size_name(p["bytes"]) for p in pts
                                                                       if p.get("copy_ratio") is not None))
    lv = res.get("leaves") or {}
    if "100" in lv and "100000" in lv:
        a, b = runs_of(lv["100000"]), runs_of(lv["100"])
        add("leaves", "save at 100,000 leaves ÷ at 100 leaves", med(a.get("ckptio_save")), med(b.get("ckptio_save")), 0.7)
        add("leaves", "restore at 100,000 leaves ÷ at 100 leaves", med(a.get("ckptio_restore")),
            med(b.get("ckptio_restore")), 0.7, note="into warm buffers")
    return out


def stall_points(res):
    pts = []
    secs = dict(res.get("sizes") or {})
    if not secs and "local" in res:
        secs = {str(res["local"]["bytes"]): res["local"]}
    for k in sorted(secs, key=lambda s: int(s)):
        r = runs_of(secs[k])
        pts.append({"bytes": int(k), "borrow_ms": med(r.get("ckptio_stall_ms")),
                    "copy_ms": med(r.get("ckptio_copy_stall_ms")), "memcpy_ms": med(r.get("memcpy_ms")),
                    "copy_ratio": med(r.get("copy_stall_vs_memcpy")),
                    "sync_s": med(r.get("ckptio_save_s")), "zarr_s": med(r.get("zarr_save_s")),
                    "numpy_s": med(r.get("numpy_save_s")), "runs": r, "note": secs[k].get("note", "")})
    return pts


# ---- markdown ------------------------------------------------------------------

def _verdict(t):
    if t["met"] is None:
        return "not measured"
    return "met" if t["met"] else "**NOT MET**"


def _val(t):
    if t["value"] is None:
        return "—"
    return ("%.2f ms" % t["value"]) if t["goal"].endswith("ms") else "%.2f×" % t["value"]


def header(res):
    m = res["machine"]
    lines = []
    if res["kind"] == "quick":
        lines += ["> **SMOKE RUN (`--quick`)**: small sizes, one repetition, to prove the pipeline end to end.",
                  "> These are not the headline figures; run `bench/run-all` on a quiet machine for those.", ""]
    elif res["kind"] == "compare":
        lines += ["> `--compare` run on %s: local contenders only." % res.get("compare_path", res["dir"]), ""]
    lines += [
        "Command: `%s`  " % res["command"],
        "Date: %s to %s (%.1f min); load average %s at the start, %s at the end  " % (
            res["started_utc"], res["ended_utc"][-9:], res["minutes"], res["load_start"], res["load_end"]),
        "Machine: %s cores (%s), %s GiB RAM, kernel %s; scratch `%s` on %s  " % (
            m.get("nproc"), m.get("cpu", "?"), m.get("mem_total_gib", "?"), m.get("kernel"), res["dir"],
            m.get("filesystem")),
        "Code: ckptio `%s` at git %s; %s; numpy %s, zarr %s, numcodecs %s, boto3 %s, python %s  " % (
            os.path.relpath(res["ckptio"], os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            m.get("git"), m.get("fio"), m.get("numpy"), m.get("zarr"), m.get("numcodecs"), m.get("boto3"),
            m.get("python")),
        "Page cache dropped before every local read: **%s**" % ("yes" if res.get("cold_cache") else "NO"),
        ""]
    return lines


def compare_text(res):
    """What `--compare` prints: the local tables and targets, no method notes."""
    return markdown(res, [], method=False)


def markdown(res, plots, method=True):
    L = ["# Benchmarks", "", "Written by `bench/run-all` (do not edit by hand: re-run it). Raw figures: "
         "[benchmarks/results.json](benchmarks/results.json). GB/s are 10^9 bytes of state per second; "
         "each cell is the median (min–max) over the repetitions; ratios are of medians measured in this "
         "run (the machine is shared and noisy: never compare with a figure from another run).", ""]
    L += header(res)

    tg = res.get("targets") or []
    if tg:
        L += ["## Targets (issue 6)", "", "| area | target | goal | this run | verdict |", "|---|---|---|---|---|"]
        for t in tg:
            L.append("| %s | %s | %s | %s | %s%s |" % (t["area"], t["name"], t["goal"], _val(t), _verdict(t),
                                                       "; " + t["note"] if t["note"] else ""))
        missed = [t for t in tg if t["met"] is False]
        L += ["", ("Missed in this run: %s." % "; ".join("%s: %s (%s, goal %s)" % (t["area"], t["name"], _val(t), t["goal"])
                                                          for t in missed)) if missed else
              "Every measured target was met in this run.", ""]

    if "local" in res:
        sec = res["local"]
        r = runs_of(sec)
        fw, fr = best_fio(r, "write"), best_fio(r, "read")
        L += ["## Local disk: %s synthetic transformer state, %d leaves, %d repetition(s)" % (
            size_name(sec["bytes"]), sec["leaves"], sec["repeat"]), ""]
        if "local.png" in plots:
            L += ["![local](benchmarks/local.png)", ""]
        L += ["| save / write | GB/s | ÷ best fio write |", "|---|---|---|"]
        for k, label in (("fio_write_direct", "fio write, bs=1M O_DIRECT io_uring iodepth 32"),
                         ("fio_write_buffered", "fio write, bs=1M buffered psync + fsync"),
                         ("ckptio_save", "**ckptio save, borrow**"),
                         ("ckptio_copy_save", "ckptio save, copy"),
                         ("zarr_save", "zarr-python v2, one zstd-1 chunk per leaf, + fsync"),
                         ("numpy_save", "numpy.save per leaf + fsync")):
            if r.get(k):
                L.append("| %s | %s | %s |" % (label, fmt(r[k]), "%.2f" % (med(r[k]) / fw) if fw else "—"))
        L += ["", "| restore / read | GB/s | ÷ best fio read |", "|---|---|---|"]
        for k, label in (("fio_read_direct", "fio read, bs=1M O_DIRECT io_uring iodepth 32"),
                         ("fio_read_buffered", "fio read, bs=1M buffered psync"),
                         ("ckptio_restore", "**ckptio restore, into warm buffers**"),
                         ("ckptio_restore_fresh", "ckptio restore, into fresh memory"),
                         ("zarr_load", "zarr-python v2 load (fresh memory)"),
                         ("numpy_load", "numpy.load per leaf (fresh memory)"),
                         ("first_touch", "(first touch of fresh memory, memset)")):
            if r.get(k):
                L.append("| %s | %s | %s |" % (label, fmt(r[k]), "%.2f" % (med(r[k]) / fr) if fr and k != "first_touch" else ""))
        if r.get("zarr_bytes_on_disk"):
            L += ["", "zarr's chunks took %.4f × the state's bytes on disk (zstd level 1 on this data)." % (
                med(r["zarr_bytes_on_disk"]) / sec["bytes"])]
        L.append("")

    if res.get("s3"):
        L += ["## S3 (servers on loopback, started by the script)", ""]
        if "s3.png" in plots:
            L += ["![s3](benchmarks/s3.png)", ""]
        L += ["| server | contender | save GB/s | restore GB/s |", "|---|---|---|---|"]
        for kind, sec in sorted(res["s3"].items()):
            r = runs_of(sec)
            for p, label in (("ckptio", "**ckptio** (borrow; restore into warm buffers)"),
                             ("boto3", "boto3 upload_fileobj / download_fileobj, one object, 10 threads, 16 MiB parts"),
                             ("curl", "8 parallel curl PUT / GET (ceiling)")):
                L.append("| %s %s, %d rep(s) | %s | %s | %s |" % (kind, size_name(sec["bytes"]), sec["repeat"], label,
                                                               fmt(r.get(p + "_save"), 3), fmt(r.get(p + "_restore"), 3)))
        prof = []
        for kind, sec in sorted(res["s3"].items()):
            r = runs_of(sec)
            for p, label in (("ckptio", "ckptio restore (warm buffers)"), ("boto3", "boto3 download_fileobj"),
                             ("curl", "8 parallel curl GETs")):
                sc, mc = cores(r, p)
                if sc is not None and mc is not None:
                    prof.append("| %s | %s | %s | %.2f | %.2f |" % (kind, label, fmt(r.get(p + "_restore"), 3), sc, mc))
        if prof:
            L += ["", "Where the restores' time went (CPU seconds per second of each download, median: the server's "
                  "processes, all threads, from /proc/PID/stat, and the whole machine's %s cores, from /proc/stat; "
                  "`CpuMeter` and, for ckptio's restore inside `ckptio bench`, `CpuSampler` over the window the bench reports, in bench/contenders.py):" % res.get("machine", {}).get("nproc", "?"), "",
                  "| server | restore | GB/s | server cores | machine cores |", "|---|---|---|---|---|"] + prof
        L.append("")

    pts = stall_points(res)
    if pts:
        L += ["## Training stall: time save() blocks the training loop", ""]
        if "stall.png" in plots:
            L += ["![stall](benchmarks/stall.png)", ""]
        L += ["| state | ckptio borrow | ckptio copy | one memcpy | copy ÷ memcpy | synchronous save (ckptio save to commit) | zarr-python save | numpy.save + fsync |",
              "|---|---|---|---|---|---|---|---|"]
        for p in pts:
            r = p["runs"]
            L.append("| %s | %s ms | %s | %s | %s | %s s | %s | %s |" % (
                size_name(p["bytes"]), fmt(r.get("ckptio_stall_ms"), 2),
                fmt(r.get("ckptio_copy_stall_ms"), 0) + " ms" if r.get("ckptio_copy_stall_ms") else "—",
                fmt(r.get("memcpy_ms"), 0) + " ms" if r.get("memcpy_ms") else "—",
                fmt(r.get("copy_stall_vs_memcpy"), 2), fmt(r.get("ckptio_save_s"), 2),
                fmt(r.get("zarr_save_s"), 2) + " s" if r.get("zarr_save_s") else "—",
                fmt(r.get("numpy_save_s"), 2) + " s" if r.get("numpy_save_s") else "—"))
        L += ["", "A synchronous save blocks the loop for the whole save; zarr-python and numpy.save are synchronous.", ""]

    if res.get("sizes"):
        L += ["## State size", ""]
        if "sizes.png" in plots:
            L += ["![sizes](benchmarks/sizes.png)", ""]
        L += ["| state | reps | best fio write | ckptio save | zarr save | numpy save | best fio read | ckptio restore (warm) | ckptio restore (fresh) | zarr load | numpy load | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k in sorted(res["sizes"], key=int):
            sec = res["sizes"][k]
            r = runs_of(sec)
            fw, fr = best_fio(r, "write"), best_fio(r, "read")
            L.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                size_name(int(k)), sec.get("repeat", 0), "%.2f" % fw if fw else "—", fmt(r.get("ckptio_save")),
                fmt(r.get("zarr_save")), fmt(r.get("numpy_save")), "%.2f" % fr if fr else "—",
                fmt(r.get("ckptio_restore")), fmt(r.get("ckptio_restore_fresh")), fmt(r.get("zarr_load")),
                fmt(r.get("numpy_load")), ("same runs as the local table" if sec.get("reused") else sec.get("note", ""))))
        L += ["", "GB/s; best fio = the better median of its two modes at that size.", ""]

    if res.get("leaves"):
        lv = res["leaves"]
        base = runs_of(lv.get("100"))
        L += ["## Leaf count at fixed bytes (ckptio, borrow)", ""]
        if "leaves.png" in plots:
            L += ["![leaves](benchmarks/leaves.png)", ""]
        L += ["| leaves | state | mean leaf | save GB/s | restore GB/s (warm) | restore GB/s (fresh) | save ÷ 100 leaves | restore ÷ 100 leaves |",
              "|---|---|---|---|---|---|---|---|"]
        for k in sorted(lv, key=int):
            r = runs_of(lv[k])
            rs = med(r.get("ckptio_save"))
            rr = med(r.get("ckptio_restore"))
            bs, br = med(base.get("ckptio_save")), med(base.get("ckptio_restore"))
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                "{:,}".format(int(k)), size_name(lv[k]["bytes"]), _bytes(lv[k]["bytes"] / int(k)),
                fmt(r.get("ckptio_save")), fmt(r.get("ckptio_restore")), fmt(r.get("ckptio_restore_fresh")),
                "%.2f" % (rs / bs) if rs and bs else "—", "%.2f" % (rr / br) if rr and br else "—"))
        L += ["", "Where many small leaves still lose time (the index, save()'s own work, the grouped reads of "
              "small shards), profiled, and old against new binary: [history, Many small leaves](benchmarks/history.md#many-small-leaves).", ""]

    if "processes" in res:
        pr = res["processes"]
        L += ["## Processes and resharded restore", ""]
        if pr.get("skipped"):
            L += ["Skipped: %s." % pr["skipped"], ""]
        else:
            if "processes.png" in plots:
                L += ["![processes](benchmarks/processes.png)", ""]
            L += ["%s state (d = %s), N processes on mesh `tp=N` (one device each), rules A: %s." % (
                size_name(pr["bytes"]), pr.get("d"), "; ".join("`%s` → %s" % (r[0], json.dumps(r[1]))
                                                            for r in pr.get("rules", {}).get("A", []))), "",
                  "| processes | save GB/s | save() stall | restore GB/s | bytes read ÷ bytes needed |",
                  "|---|---|---|---|---|"]
            for k in sorted(pr.get("curve", {}), key=int):
                s, c = pr["curve"][k]["save"], pr["curve"][k]["check"]
                L.append("| %s | %s | %s ms | %s | %s |" % (k, _g(s.get("save_gbps")), _g(s.get("stall_ms")),
                                                           _g(c.get("restore_gbps")), _ratio(c)))
            if pr.get("reshard"):
                L += ["", "Resharded restore (rules B split the other dimension of each leaf that A splits):", "",
                      "| saved | restored onto | bytes needed | bytes read | read ÷ needed | requests | restore GB/s |",
                      "|---|---|---|---|---|---|---|"]
                for e in pr["reshard"]:
                    c = e["check"]
                    L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                        e["saved"], e["restored"], _bytes(c.get("bytes_needed")), _bytes(c.get("bytes_read")),
                        _ratio(c), c.get("requests", "—"), _g(c.get("restore_gbps"))))
            elif pr.get("reshard_skipped"):
                L += ["", pr["reshard_skipped"] + "."]
            for e in pr.get("reshard_errors", []):
                L += ["", "**Resharded restore onto %s failed** (saved %s): `%s`" % (
                    e["restored"], "tp=%s, rules A" % max(pr.get("curve", {"?": 0}), key=lambda k: int(k) if k.isdigit() else 0),
                    e["error"].split("exited 1: ")[-1][:400])]
            L.append("")

    # Sections whose table is their own script's (bench/python_bench.py, bench/restart_bench.py,
    # bench/eformer_bench.py).
    for key, module, title in (("python", "python_bench", "Python (issue 28)"),
                               ("restart", "restart_bench", "Restart from process start (issue 30)"),
                               ("eformer", "eformer_bench", "eformer / TensorStore zarr steps (issue 29)")):
        sec = res.get(key)
        if not sec:
            L += ["## " + title, "", "Not in the run this page comes from: `bench/run-all --only %s` adds it%s." % (
                key, {"restart": " (the measurements so far: [restart.md](restart.md))",
                      "eformer": " (earlier runs: [history.md](benchmarks/history.md))"}.get(key, "")), ""]
            continue
        if sec.get("skipped"):
            L += ["## " + title, "", "**Skipped**: %s." % sec["skipped"], ""]
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            L += [importlib.import_module(module).markdown(sec)]

    if method:
        L.append(METHOD)
    if res.get("notes") or res.get("errors"):
        L += ["## Notes and errors of this run", ""]
        L += ["- " + n for n in res.get("notes", [])]
        L += ["- **error**: " + e.replace("\n", " ") for e in res.get("errors", [])]
        L.append("")
    return "\n".join(L)


def _g(v):
    return "%.2f" % v if isinstance(v, (int, float)) else "—"


def _bytes(v):
    if not isinstance(v, (int, float)):
        return "—"
    for u, m in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if v >= m:
            return "%.1f %s" % (v / m, u)
    return "%d B" % v


def _ratio(c):
    a, b = c.get("bytes_read"), c.get("bytes_needed")
    return "%.2f" % (a / b) if isinstance(a, (int, float)) and b else "—"


METHOD = """## How this is measured

- **Same bytes.** Every contender stores ckptio's synthetic transformer state (`ckptio synth`, layout
  `transformer-v1`: bf16 parameters, f32 optimizer moments, one int32 count). The Python contenders
  read the leaf list from `ckptio inspect --json` of a step `ckptio synth save` wrote, and re-create
  the bytes with the same generator (`bench/synthpy.py`, splitmix64; checked equal to ckptio's data
  file). bf16 leaves are held as `<u2` in numpy and zarr (no bfloat16 dtype without ml_dtypes): the
  same bytes, so zstd sees the same entropy.
- **Alternation.** Each repetition runs every contender once, and the order rotates by one each
  repetition, so no contender always runs first or last.
- **Cold cache.** `sync; echo 3 > /proc/sys/vm/drop_caches` before every local read (fio's reads,
  ckptio's two restores, zarr and numpy loads). S3 reads are not preceded by a drop: the servers are
  the storage there (moto holds objects in memory; s3rver in files).
- **fio** (the disk's ceiling): bs=1M, one file of the state's size; O_DIRECT io_uring iodepth 32, and
  buffered psync whose write job ends with an fsync (`end_fsync=1`, counted: bytes ÷ job runtime).
  "Best fio" is the better of the two modes' medians, per direction.
- **ckptio** (`ckptio bench --json`, one process per repetition): one untimed warm-up save, then
  save = `save()` to commit (data fsynced, index written, directory renamed), stall = time `save()`
  blocked the caller, restore into warm buffers (`RestoreOptions::into`, one arena laid out by
  `restore_arena_layout`: leaves saved side by side lie side by side, others at their file offset
  modulo 4096, as a caller who wants reads without a copy lays them out; the like-for-like figure
  beside fio, which reads into its own buffers) and into fresh memory (the default API path, which
  also pays this VM's first-touch cost of every page; the like-for-like figure beside zarr and numpy,
  which allocate their arrays). Checksums verified, every byte compared with the generator. Copy
  mode's stall is judged against one single-threaded memcpy of the state measured in the same process.
  Where `ckptio bench` would not fit in memory (3 × the state), `ckptio synth save` (no warm-up) and
  `ckptio synth check` (restore into fresh memory, in batches) are used instead.
- **zarr-python v2** (what eformer / JAX users write with TensorStore today): per leaf a
  `DirectoryStore` array under `<prefix>/<path>`, one chunk per array (a single process holds one
  shard per leaf), `numcodecs.Zstd(level=1)`, written with `z[...] = a`, an index JSON beside; then
  every file and directory fsynced (zarr-python does not fsync). Load: `zarr.open_array(...)[...]`
  per leaf. Compared with the original afterwards (untimed).
- **numpy.save per leaf** with `flush` + `fsync` per file and an fsync per directory; `numpy.load`
  per leaf. Compared afterwards (untimed).
- **S3** (`tests/s3/s3-server` starts moto_server and s3rver on loopback): ckptio (`ckptio bench
  s3://...`, borrow; data objects of one 16 MiB part each, one PutObject and one GET apiece;
  restore into warm buffers); boto3 `upload_fileobj` / `download_fileobj` of the
  whole state as one object (boto3's best case: all parts in parallel; `TransferConfig(multipart_chunksize
  =16 MiB, max_concurrency=10)`), downloading into a preallocated buffer; 8 parallel `curl` PUTs
  then GETs of 1/8 of the bytes each, from tmpfs to /dev/null: what the server takes at best.
  The restores' CPU profile: CPU seconds per second of the server's processes (its process group,
  all threads) and of the whole machine, around boto3's download and curl's GETs, and over the
  window of ckptio's warm restore (`ckptio bench --json` reports `restore_started_monotonic_s`,
  sampled every 20 ms on the same clock). A server near one core busy (s3rver's single node.js
  thread) or a machine near all its cores is the limit. Where 1.5× boto3 is above what the server
  served the parallel curl requests, the target row says so: no client could meet it there.
- **Training stall**: the time a training loop calling `save()` is blocked per save. Borrow mode
  hands the caller's buffers to the writer (the loop must not mutate them until the save commits:
  JAX arrays are immutable); copy mode copies them into the staging pool first; a synchronous save
  blocks for the whole save (`save()` + `wait()`), as zarr-python and numpy.save do.
- **Leaf count**: the same total bytes split into 10 … 100,000 leaves (`--leaves`).
- **Processes / resharding** (`ckptio synth save --processes N --mesh tp=N --rules R`, then
  `ckptio synth check` with a mesh): save and restore throughput per process count, and for a step
  saved on one mesh restored onto another, the bytes read against the bytes the target shards need.

Re-make this page from the raw figures: `python3 bench/report.py docs/benchmarks/results.json docs`.
"""


# ---- plots -------------------------------------------------------------------

def _size_ticks(ax, sizes):
    ax.minorticks_off()
    ax.set_xticks([b / GiB for b in sizes], [size_name(b).replace(" ", "\u00a0") for b in sizes])

def plots(res, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    tag = " (SMOKE RUN)" if res["kind"] == "quick" else ""

    def err(v):
        m = statistics.median(v)
        return [[m - min(v)], [max(v) - m]]

    if "local" in res:
        r = runs_of(res["local"])
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, rows, title in (
                (axes[0], [("fio_write_direct", "fio O_DIRECT"), ("fio_write_buffered", "fio buffered+fsync"),
                           ("ckptio_save", "ckptio (borrow)"), ("ckptio_copy_save", "ckptio (copy)"),
                           ("zarr_save", "zarr-python"), ("numpy_save", "numpy.save")], "save / write"),
                (axes[1], [("fio_read_direct", "fio O_DIRECT"), ("fio_read_buffered", "fio buffered"),
                           ("ckptio_restore", "ckptio (warm bufs)"), ("ckptio_restore_fresh", "ckptio (fresh mem)"),
                           ("zarr_load", "zarr-python"), ("numpy_load", "numpy.load")], "restore / read")):
            rows = [(k, l) for k, l in rows if r.get(k)]
            for i, (k, l) in enumerate(rows):
                color = "tab:orange" if k.startswith("ckptio") else "tab:gray" if k.startswith("fio") else "tab:blue"
                ax.barh(i, med(r[k]), xerr=err(r[k]), color=color, capsize=3)
            ax.set_yticks(range(len(rows)), [l for _, l in rows])
            ax.invert_yaxis()
            ax.set_xlabel("GB/s (median, min–max)")
            ax.set_title(title)
        fig.suptitle("Local disk, %s state%s" % (size_name(res["local"]["bytes"]), tag))
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "local.png"), dpi=90)
        plt.close(fig)
        made.append("local.png")

    if res.get("s3"):
        kinds = sorted(res["s3"])
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        for ax, d in zip(axes, ("save", "restore")):
            w = 0.25
            for j, (p, l, c) in enumerate((("ckptio", "ckptio", "tab:orange"), ("boto3", "boto3", "tab:blue"),
                                           ("curl", "8× curl (ceiling)", "tab:gray"))):
                xs, ys, es = [], [], [[], []]
                for i, k in enumerate(kinds):
                    v = runs_of(res["s3"][k]).get("%s_%s" % (p, d))
                    if v:
                        xs.append(i + (j - 1) * w)
                        ys.append(med(v))
                        e = err(v)
                        es[0].append(e[0][0])
                        es[1].append(e[1][0])
                ax.bar(xs, ys, w, yerr=es, label=l, color=c, capsize=3)
            ax.set_xticks(range(len(kinds)), kinds)
            ax.set_ylabel("GB/s")
            ax.set_title(d)
            ax.legend(fontsize=8)
        fig.suptitle("S3 on loopback%s" % tag)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "s3.png"), dpi=90)
        plt.close(fig)
        made.append("s3.png")

    pts = stall_points(res)
    if pts:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for key, label, scale, style in (("borrow_ms", "ckptio borrow", 1, "o-"), ("copy_ms", "ckptio copy", 1, "s-"),
                                         ("memcpy_ms", "one memcpy", 1, "k:"),
                                         ("sync_s", "synchronous save (ckptio, to commit)", 1000, "^--"),
                                         ("zarr_s", "zarr-python save", 1000, "v--"),
                                         ("numpy_s", "numpy.save + fsync", 1000, "d--")):
            xy = [(p["bytes"] / GiB, p[key] * scale) for p in pts if p.get(key) is not None]
            if xy:
                ax.plot(*zip(*xy), style, label=label)
        ax.axhline(5, color="red", lw=0.8, ls="--", label="5 ms (borrow target)")
        ax.set_xscale("log", base=2)
        _size_ticks(ax, [p["bytes"] for p in pts])
        ax.set_yscale("log")
        ax.set_xlabel("state size")
        ax.set_ylabel("training loop blocked per save, ms")
        ax.set_title("Training stall%s" % tag)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "stall.png"), dpi=90)
        plt.close(fig)
        made.append("stall.png")

    if res.get("sizes"):
        ks = sorted(res["sizes"], key=int)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, series, title in (
                (axes[0], [("fio_best_write", "best fio write", "k:"), ("ckptio_save", "ckptio save", "o-"),
                           ("zarr_save", "zarr-python", "v--"), ("numpy_save", "numpy.save", "d--")], "save"),
                (axes[1], [("fio_best_read", "best fio read", "k:"), ("ckptio_restore", "ckptio (warm)", "o-"),
                           ("ckptio_restore_fresh", "ckptio (fresh)", "s-"), ("zarr_load", "zarr-python", "v--"),
                           ("numpy_load", "numpy.load", "d--")], "restore")):
            for key, label, style in series:
                xy = []
                for k in ks:
                    r = runs_of(res["sizes"][k])
                    v = best_fio(r, key[9:]) if key.startswith("fio_best") else med(r.get(key))
                    if v is not None:
                        xy.append((int(k) / GiB, v))
                if xy:
                    ax.plot(*zip(*xy), style, label=label)
            ax.set_xscale("log", base=2)
            _size_ticks(ax, [int(k) for k in ks])
            ax.set_xlabel("state size")
            ax.set_ylabel("GB/s")
            ax.set_ylim(bottom=0)
            ax.set_title(title)
            ax.legend(fontsize=8)
        fig.suptitle("Throughput against state size%s" % tag)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "sizes.png"), dpi=90)
        plt.close(fig)
        made.append("sizes.png")

    if res.get("leaves"):
        ks = sorted(res["leaves"], key=int)
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label, style in (("ckptio_save", "save", "o-"), ("ckptio_restore", "restore (warm)", "s-"),
                                  ("ckptio_restore_fresh", "restore (fresh)", "^--")):
            xy = [(int(k), med(runs_of(res["leaves"][k]).get(key))) for k in ks
                  if runs_of(res["leaves"][k]).get(key)]
            if xy:
                ax.plot(*zip(*xy), style, label=label)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("leaves (same total bytes: %s)" % size_name(res["leaves"][ks[0]]["bytes"]))
        ax.set_ylabel("GB/s")
        ax.set_title("ckptio against leaf count%s" % tag)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "leaves.png"), dpi=90)
        plt.close(fig)
        made.append("leaves.png")

    pr = res.get("processes") or {}
    if pr.get("curve"):
        ks = sorted(pr["curve"], key=int)
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, part, label in (("save_gbps", "save", "save"), ("restore_gbps", "check", "restore")):
            xy = [(int(k), pr["curve"][k][part].get(key)) for k in ks
                  if isinstance(pr["curve"][k][part].get(key), (int, float))]
            if xy:
                ax.plot(*zip(*xy), "o-", label=label)
        ax.set_xlabel("processes")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title("Multi-process save and restore%s" % tag)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, "processes.png"), dpi=90)
        plt.close(fig)
        made.append("processes.png")
    return made


# ---- outputs -------------------------------------------------------------------

def write(res, outdir, with_plots=True):
    pdir = os.path.join(outdir, "benchmarks")
    os.makedirs(pdir, exist_ok=True)
    earlier = sorted(f for f in os.listdir(pdir) if f.endswith(".png"))
    try:
        if not with_plots:
            raise ImportError("matplotlib is missing: tools/setup-deps --bench installs it")
        import matplotlib  # noqa: F401  (before any plot is removed)
        for f in earlier:  # plots of an earlier run must not outlive it
            os.unlink(os.path.join(pdir, f))
        earlier = []
        made = plots(res, pdir)
    except ImportError as e:
        # Nothing can be drawn: the earlier run's plots stay, linked as they were (a partial
        # run, --only, leaves most sections as they were anyway).
        print("report: no new plots (%s); the %d earlier ones kept" % (e, len(earlier)), file=sys.stderr)
        made = earlier
    with open(os.path.join(pdir, "results.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    with open(os.path.join(outdir, "benchmarks.md"), "w") as f:
        f.write(markdown(res, made) + "\n")


def headline(res):
    r = runs_of(res.get("local"))
    fw, fr = best_fio(r, "write"), best_fio(r, "read")
    L = ["%s state, %s, median of %d; `bench/run-all` on this project's 2-core VM (%s)." % (
        size_name(res["local"]["bytes"]), "local ext4 disk", res["local"]["repeat"], res["started_utc"][:10]), "",
        "| contender | save GB/s | restore GB/s |", "|---|---|---|",
        "| fio, best of O_DIRECT io_uring and buffered (ceiling) | %s | %s |" % (_g(fw), _g(fr)),
        "| **ckptio** (borrow; restore into warm / fresh memory) | **%s** | **%s** / %s |" % (
            _g(med(r.get("ckptio_save"))), _g(med(r.get("ckptio_restore"))), _g(med(r.get("ckptio_restore_fresh")))),
        "| zarr v2 via zarr-python, zstd 1 (eformer's layout) | %s | %s |" % (_g(med(r.get("zarr_save"))), _g(med(r.get("zarr_load")))),
        "| numpy.save + fsync / numpy.load per leaf | %s | %s |" % (_g(med(r.get("numpy_save"))), _g(med(r.get("numpy_load"))))]
    for kind, sec in sorted((res.get("s3") or {}).items()):
        s = runs_of(sec)
        g3 = lambda v: "%.3f" % v if v is not None else "—"  # noqa: E731
        L.append("| S3 %s %s: ckptio / boto3 / 8× curl | %s / %s / %s | %s / %s / %s |" % (
            kind, size_name(sec["bytes"]), g3(med(s.get("ckptio_save"))), g3(med(s.get("boto3_save"))),
            g3(med(s.get("curl_save"))), g3(med(s.get("ckptio_restore"))), g3(med(s.get("boto3_restore"))),
            g3(med(s.get("curl_restore")))))
    tg = res.get("targets") or []
    met = sum(1 for t in tg if t["met"])
    missed = [t for t in tg if t["met"] is False]
    L += ["", "Targets met: %d of %d measured%s. Stall per save, borrow mode: %s ms at worst." % (
        met, sum(1 for t in tg if t["met"] is not None),
        ("; missed: " + "; ".join("%s %s (%s)" % (t["area"], t["name"], _val(t)) for t in missed)) if missed else "",
        next((_g(t["value"]) for t in tg if t["name"].startswith("borrow-mode")), "—")),
          "", "Every table, plot and target, and how each figure is measured: [docs/benchmarks.md](docs/benchmarks.md)."]
    return "\n".join(L)


def update_readme(res, path):
    with open(path) as f:
        text = f.read()
    if README_START not in text or README_END not in text:
        return False
    new = re.sub(re.escape(README_START) + r".*?" + re.escape(README_END),
                 lambda _: README_START + "\n" + headline(res) + "\n" + README_END, text, flags=re.S)
    with open(path, "w") as f:
        f.write(new)
    return True


def text_summary(res):
    L = []
    if "local" in res:
        r = runs_of(res["local"])
        L.append("local %s: %s" % (size_name(res["local"]["bytes"]), ", ".join(
            "%s %s" % (k, fmt(v)) for k, v in sorted(r.items())
            if k.endswith(("save", "load", "restore", "restore_fresh")) or k.startswith("fio_"))))
    for kind, sec in sorted((res.get("s3") or {}).items()):
        L.append("S3 %s: %s" % (kind, ", ".join("%s %s" % (k, fmt(v, 3)) for k, v in sorted(runs_of(sec).items())
                                               if k.endswith(("save", "restore")))))
    for t in res.get("targets") or []:
        L.append("%-8s %-48s %-10s %-9s %s" % (t["area"], t["name"], _val(t), t["goal"],
                                            "met" if t["met"] else "NOT MET" if t["met"] is False else "not measured"))
    for t in (res.get("python") or {}).get("targets", []):
        L.append("%-8s %-48s %-10s %s  %s" % ("python", t["name"][:48], t["figure"].split(" ")[0], t["goal_text"],
                                            "met" if t["met"] else "NOT MET" if t["met"] is False else "not measured"))
    if (res.get("python") or {}).get("skipped"):
        L.append("python: skipped: " + res["python"]["skipped"])
    for n in res.get("notes") or []:
        L.append("note: " + n)
    for e in res.get("errors") or []:
        L.append("ERROR: " + e)
    return "\n".join(L)


if __name__ == "__main__":
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # Debian's python3-matplotlib is in /usr/bin/python3, not in a pyenv python
        if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.access("/usr/bin/python3", os.X_OK):
            os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        r = json.load(f)
    r["targets"] = targets(r)
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
    write(r, out)
    print(text_summary(r))
