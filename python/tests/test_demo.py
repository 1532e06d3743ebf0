"""python3 -m ckptio.demo: training killed mid-save, resumed, bit-exact to an uninterrupted run."""

import sys

import pytest

import ckptio
from conftest import child_env, run_killable


def _demo(*args, timeout=120):
    return run_killable([sys.executable, "-m", "ckptio.demo", *args], timeout, env=child_env())


def test_demo_survives_sigkill_mid_save(tmp_path):
    pytest.importorskip("torch")
    where = str(tmp_path / "demo")
    r = _demo("--dir", where, "--steps", "40", "--save-every", "5", "--kill-at", "22", "--keep")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # Step 25's save, unless it committed before the stop (then the next one: see demo.py).
    killed = int(out.split("mid-save of step ")[1].split()[0])
    assert killed in (25, 30), out
    assert f"resumed from step {killed - 5}" in out, out
    assert f"PASS: after a SIGKILL mid-save of step {killed} and a resume from step {killed - 5}" in out, out
    # The loss of the first step after the resume is the one the killed run printed.
    losses = [line.split("loss ")[1].split(",")[0] for line in out.splitlines() if f"step {killed}: loss" in line]
    assert len(losses) == 2 and losses[0] == losses[1], out
    # --keep: whatever the killed process left is still there, uncommitted; the checkpoints are
    # ordinary ones. What it left depends on where the stop landed: save() returns once staged,
    # and under load the process can stop before its writer has created the step's directory, or
    # while retention is deleting an old step (a run-N.del-* directory).
    left = out.split("left by the killed save: ")[1].splitlines()[0]
    left = [] if left == "nothing" else left.split(", ")
    assert all(name.startswith(f"run-{killed}.tmp-") or ".del-" in name for name in left), out
    with ckptio.CheckpointManager(where) as mgr:
        assert mgr.latest_step() == 40 and mgr.all_steps() == [30, 35, 40]  # max_to_keep=3
        assert sorted(d["name"] for d in mgr.step_dirs() if not d["committed"]) == sorted(left), out
    leaves = {(x["prefix"], x["path"]) for x in ckptio.inspect(where)["leaves"]}
    assert {("model", "0.weight"), ("optim", "state.0.exp_avg"), ("rng", "torch"), ("step", "value")} <= leaves


def test_demo_refuses_bad_arguments(tmp_path):
    r = _demo("--steps", "20", "--save-every", "10", "--kill-at", "15")
    assert r.returncode == 2 and "no save between --kill-at and the last step" in r.stderr
    (tmp_path / "x").write_text("not empty")
    r = _demo("--dir", str(tmp_path))
    assert r.returncode == 2 and "not empty" in r.stderr
