"""python3 -m ckptio.demo: a PyTorch training loop that survives SIGKILL.

A parent process runs a small MLP's training (Adam, CPU, synthetic data,
dropout) in a child process that saves asynchronously every --save-every
steps: the model and optimizer state_dict, the step counter and the torch
and numpy RNG states. At the first save at or after --kill-at, the child
stops itself right after save() returned (SIGSTOP: the save is staged, its
bytes not yet durable, nothing committed), and the parent SIGKILLs it there,
checking that the step it was saving is not committed. A new child resumes
from latest_step(), restores everything and trains to --steps. The parent
then compares the final checkpoint's parameters (and Adam's moments) with
an uninterrupted run of the same steps in its own process: bit-exact is
PASS (exit 0), anything else FAIL (exit 1).

    python3 -m ckptio.demo                          # a temporary directory, removed after
    python3 -m ckptio.demo --dir /tmp/demo --steps 200 --save-every 20 --kill-at 110
    python3 -m ckptio.demo --uri s3://bucket/demo   # S3 settings from AWS_* / ~/.aws

docs/python.md, "The demo".
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import ckptio

DATA_SIZE, IN, HIDDEN, OUT, BATCH = 2048, 32, 128, 10, 64


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover
        sys.exit("ckptio.demo needs PyTorch (Debian: apt-get install python3-torch)")
    torch.set_num_threads(1)  # the same arithmetic in every run, whatever the machine's load
    return torch


# ---- the training -----------------------------------------------------------------------

def build(seed):
    """The model, its optimizer and the data set, all from `seed`."""
    torch = _torch()
    nn = torch.nn
    gen = torch.Generator().manual_seed(10_000 + seed)  # the data: the same in every process
    x = torch.randn(DATA_SIZE, IN, generator=gen)
    teacher = torch.randn(IN, OUT, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Dropout(0.1), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Dropout(0.1), nn.Linear(HIDDEN, OUT))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt, (x, y)


def train_step(model, opt, data):
    """One step; draws from numpy's RNG (the batch) and torch's (input noise, dropout)."""
    torch = _torch()
    x, y = data
    idx = torch.from_numpy(np.random.randint(0, DATA_SIZE, BATCH))
    inputs = x[idx] + 0.01 * torch.randn(BATCH, IN)
    loss = torch.nn.functional.cross_entropy(model(inputs), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss)


def checkpoint(model, opt, step):
    torch = _torch()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}}


def _as_torch(tree):
    """A restored tree with tensors where numpy arrays are (optimizer state)."""
    torch = _torch()
    if isinstance(tree, dict):
        return {k: _as_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_as_torch(v) for v in tree)
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.array(tree))
    return tree


def resume(mgr, model, opt):
    """Restores the latest step into model, optimizer and RNGs; returns the step (0: none)."""
    torch = _torch()
    if mgr.latest_step() is None:
        return 0
    # The model's leaves are checked against the live model (dtype, shape) and come back
    # as tensors; the optimizer's state tree is whatever the step holds.
    state = mgr.restore(like={"model": model.state_dict()}, select=["model"])
    model.load_state_dict(state["model"])
    rest = mgr.restore(select=["optim", "step", "rng"])
    opt.load_state_dict(_as_torch(rest["optim"]))
    torch.set_rng_state(torch.from_numpy(np.array(rest["rng"]["torch"])))
    np.random.set_state(tuple(rest["rng"]["numpy"]))
    return int(rest["step"])


def child(args):
    """The training process."""
    model, opt, data = build(args.seed)
    say = _printer(f"train {os.getpid()}")

    def on_commit(event):
        if event.ok:
            say(f"committed step {event.step}: {event.stats.bytes / 1024:.0f} KiB, save() stalled training "
                f"{event.stats.stall_seconds * 1e3:.1f} ms, durable {event.stats.total_seconds * 1e3:.0f} ms "
                "after it")
        else:
            say(f"the save of step {event.step} failed: {event.error}")

    with ckptio.CheckpointManager(args.uri, max_to_keep=3, on_commit=on_commit) as mgr:
        start = resume(mgr, model, opt)
        say(f"resumed from step {start}: model, Adam state, step counter, torch and numpy RNG" if start
            else "fresh start at step 0")
        for step in range(start + 1, args.steps + 1):
            loss = train_step(model, opt, data)
            if step % args.save_every == 0 or step == args.steps:
                say(f"step {step}: loss {loss:.4f}, saving asynchronously")
                kill = args.kill_at is not None and step >= args.kill_at
                if kill:
                    print(f"SAVING {step}", flush=True)  # the parent now waits for this process to stop
                mgr.save(step, checkpoint(model, opt, step))  # copy mode: returns once staged
                if kill:
                    # Hand the moment to the parent: stopped here, the save is in flight.
                    os.kill(os.getpid(), signal.SIGSTOP)
        mgr.wait_until_finished()
    say(f"finished step {args.steps}")


# ---- the parent -------------------------------------------------------------------------

def _printer(who):
    def say(text):
        print(f"[{who}] {text}", flush=True)
    return say


def run_child(args, kill_at, say):
    """Runs one training process; with kill_at, SIGKILLs it in the first save at or
    after kill_at. Returns (killed step or None, exit status)."""
    cmd = [sys.executable, "-m", "ckptio.demo", "--child", "--uri", args.uri, "--steps", str(args.steps),
           "--save-every", str(args.save_every), "--seed", str(args.seed)]
    if kill_at is not None:
        cmd += ["--kill-at", str(kill_at)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        return _follow_child(proc, args.uri, say)
    finally:  # the parent failed or was interrupted: no training process left behind, stopped or not
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _follow_child(proc, uri, say):
    killed = None
    for line in proc.stdout:
        if not line.startswith("SAVING "):
            sys.stdout.write(line)
            sys.stdout.flush()
            continue
        step = int(line.split()[1])
        _, status = os.waitpid(proc.pid, os.WUNTRACED)  # stopped right after save() returned
        if not os.WIFSTOPPED(status):
            raise RuntimeError(f"the training process ended instead of stopping (status {status})")
        with ckptio.CheckpointManager(uri) as mgr:
            committed = step in mgr.all_steps()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = step
        if committed:  # the save outran the stop: not a kill mid-save
            say(f"SIGKILLed train {proc.pid} after the save of step {step} had committed")
            killed = -step
        else:
            say(f"SIGKILLed train {proc.pid} mid-save of step {step} (save() had returned, the step "
                "was not committed)")
        break
    proc.stdout.close()
    return killed, proc.wait()


def parent(args):
    say = _printer("demo")
    torch = _torch()
    model, opt, data = build(args.seed)
    params = sum(p.numel() for p in model.parameters())
    say(f"MLP {IN}-{HIDDEN}-{HIDDEN}-{OUT} with dropout ({params:,} parameters), Adam, CPU, synthetic data; "
        f"{args.steps} steps, an asynchronous save every {args.save_every}, SIGKILL in the save at or after "
        f"step {args.kill_at}; checkpoints at {args.uri}")

    t0 = time.monotonic()
    for _ in range(args.steps):
        train_step(model, opt, data)
    say(f"reference: {args.steps} uninterrupted steps in {time.monotonic() - t0:.2f} s")

    # A kill that lands after the commit does not count: try the next save.
    kill_at, mid_save = args.kill_at, None
    for _ in range(3):
        killed, _ = run_child(args, kill_at, say)
        if killed is None:
            say("the training process was not killed (it finished first)")
            return 1
        if killed > 0:
            mid_save = killed
            break
        kill_at = -killed + 1
        if kill_at > args.steps - 1:
            break
    if mid_save is None:
        say("FAIL: no kill landed mid-save")
        return 1
    with ckptio.CheckpointManager(args.uri) as mgr:
        latest = mgr.latest_step()
        left = [d["name"] for d in mgr.step_dirs() if not d["committed"]]
    say(f"after the kill: latest committed step {latest}; left by the killed save: {', '.join(left) or 'nothing'}")

    _, status = run_child(args, None, say)
    if status != 0:
        say(f"FAIL: the resumed training process exited with {status}")
        return 1

    with ckptio.CheckpointManager(args.uri) as mgr:
        final = mgr.latest_step()
        saved = mgr.restore(final, like={"model": model.state_dict()}, select=["model"])["model"]
        optim = _as_torch(mgr.restore(final, select=["optim"])["optim"])
    if args.cleanup:
        removed = ckptio.gc(args.uri, min_age_seconds=0)["removed"]
        say(f"ckptio.gc removed {len(removed)} leftover(s) of the killed save")
    mine = model.state_dict()
    diffs = [k for k in mine if not torch.equal(mine[k], saved[k])]
    ref_state = opt.state_dict()["state"]
    moments = [(i, k) for i in ref_state for k in ("exp_avg", "exp_avg_sq", "step")
               if not torch.equal(ref_state[i][k], optim["state"][i][k])]
    if final != args.steps or diffs or moments:
        say(f"FAIL: final step {final}; parameters that differ from the uninterrupted run: {diffs}; "
            f"Adam state that differs: {moments}")
        return 1
    say(f"PASS: after a SIGKILL mid-save of step {mid_save} and a resume from step {latest}, the "
        f"{len(mine)} parameter tensors ({params:,} values) and Adam's moments at step {final} are "
        "bit-exact to the uninterrupted run")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m ckptio.demo", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dir", help="checkpoint directory (default: a temporary one, removed after)")
    where.add_argument("--uri", help="checkpoint location: a directory, file://, s3://bucket/prefix")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--save-every", type=int, default=10, help="save every N steps (default 10)")
    p.add_argument("--kill-at", type=int, default=None,
                   help="SIGKILL the trainer in the first save at or after this step (default: about "
                        "two thirds of --steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and the leftovers")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 2 or args.save_every < 1:
        p.error("--steps must be >= 2 and --save-every >= 1")
    if args.child:
        child(args)
        return 0
    if args.kill_at is None:
        args.kill_at = max(1, args.steps * 2 // 3)
    if not 1 <= args.kill_at < args.steps:
        p.error("--kill-at must be in [1, --steps)")
    if args.kill_at + (-args.kill_at % args.save_every) >= args.steps:
        p.error("no save between --kill-at and the last step: lower --kill-at or --save-every")
    temp = None
    if args.uri is None:
        if args.dir is None:
            temp = args.dir = tempfile.mkdtemp(prefix="ckptio-demo-")
        args.uri = os.path.abspath(args.dir)
    args.cleanup = not args.keep
    if "://" not in args.uri and os.path.isdir(args.uri) and temp is None and os.listdir(args.uri):
        p.error(f"{args.uri} is not empty: the demo needs a location of its own")
    try:
        with ckptio.CheckpointManager(args.uri) as mgr:
            if mgr.all_steps():
                p.error(f"{args.uri} holds checkpoints already: the demo needs a location of its own")
        return parent(args)
    finally:
        if temp is not None and not args.keep:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
