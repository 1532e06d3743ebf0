"""Fixtures of the ckptio Python tests (python/tests/).

Run them against a build:  PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests
(ctest runs them as the test python_pytest). The S3 tests use the server in
$CKPTIO_S3_SERVER_ENV (a tests/s3 server.env) if set, else start moto with
tests/s3/s3-server for the session; without moto installed they skip with the
reason, except under CI=true, where s3-server fails instead.
"""

import faulthandler
import os
import signal
import subprocess
import sys
import threading
import traceback
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
S3_SERVER = REPO / "tests" / "s3" / "s3-server"


# A test that hangs must fail with its threads' stacks, in minutes rather
# than at ctest's timeout with nothing printed (the killed process's buffered
# output dies with it). Armed around each test's whole protocol, so that the
# module and session fixtures it sets up (a process group, the S3 server) are
# covered too. A timer thread prints the stacks short (test and ckptio frames,
# for a log's tail) and exits; faulthandler, which needs no GIL, dumps every
# frame and exits a minute later if that thread could not run. pytest's own
# faulthandler_timeout option must stay unset: faulthandler has one timer.
TEST_WATCHDOG_SECONDS = float(os.environ.get("CKPTIO_PY_TEST_WATCHDOG", "300"))
_watchdog_out = None  # the stderr pytest found, not the file it captures a test's output in


def pytest_configure(config):
    global _watchdog_out
    capture = getattr(config.pluginmanager.getplugin("capturemanager"), "_global_capturing", None)
    fd = getattr(getattr(capture, "err", None), "targetfd_save", None)  # set under --capture=fd only
    _watchdog_out = os.fdopen(os.dup(fd), "w") if isinstance(fd, int) else sys.__stderr__


def _report_hang_and_exit(nodeid):
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [f"[watchdog] {nodeid} still running after {TEST_WATCHDOG_SECONDS:.0f} s (CKPTIO_PY_TEST_WATCHDOG);"
             " its threads' stacks, innermost last:"]
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        frames = [f for f in traceback.extract_stack(frame) if not any(
            part in f.filename for part in ("/_pytest/", "/pluggy/", "<frozen", "/threading.py"))]
        lines.append(f"-- thread {names.get(ident, ident)}")
        lines += [f"   {f.filename}:{f.lineno} in {f.name}: {f.line}" for f in frames[-10:]]
    print("\n".join(lines), file=_watchdog_out, flush=True)
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timer = threading.Timer(TEST_WATCHDOG_SECONDS, _report_hang_and_exit, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(TEST_WATCHDOG_SECONDS + 60, exit=True, file=_watchdog_out)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.cancel()


@pytest.fixture
def ckpt_dir(tmp_path):
    return str(tmp_path / "ckpt")


def read_env(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip()
    return env


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    given = os.environ.get("CKPTIO_S3_SERVER_ENV")
    if given:
        if not os.path.exists(given):
            pytest.fail(f"CKPTIO_S3_SERVER_ENV={given} does not exist")
        yield read_env(given)
        return
    root = os.environ.get("CKPTIO_PY_STATE_DIR")
    state = Path(root) / "s3-moto" if root else tmp_path_factory.mktemp("s3-moto")
    state.mkdir(parents=True, exist_ok=True)
    start = subprocess.run([str(S3_SERVER), "start", "moto", str(state)], capture_output=True, text=True)
    if start.returncode == 77:
        pytest.skip(f"SKIPPED: no moto server: {(state / 'unavailable').read_text().strip()}")
    if start.returncode != 0:
        pytest.fail(f"s3-server start moto failed:\n{start.stdout}{start.stderr}")
    try:
        yield read_env(state / "server.env")
    finally:
        subprocess.run([str(S3_SERVER), "stop", str(state)], capture_output=True)


@pytest.fixture
def s3_uri_and_options(s3_server):
    uri = f"s3://{s3_server['bucket']}/py-{uuid.uuid4().hex[:12]}"
    opts = dict(s3_endpoint=s3_server["endpoint"], s3_region=s3_server.get("region", "us-east-1"),
                s3_access_key_id=s3_server["access_key"], s3_secret_access_key=s3_server["secret_key"],
                s3_max_attempts=3)
    return uri, opts


def run_killable(cmd, timeout, env=None, **kwargs):
    """subprocess.run(cmd, capture_output=True, text=True) that cannot hang.

    subprocess.run's timeout kills the child only, then waits for its pipes
    to close: a grandchild that inherited them (the demo's training process,
    stopped mid-save) would keep that wait going for good. Here the command
    runs in a session of its own; past `timeout` every process of it gets
    SIGABRT (Python's faulthandler, on through PYTHONFAULTHANDLER, prints its
    stacks), then SIGKILL, and the test fails with what they printed."""
    env = dict(os.environ if env is None else env)
    env["PYTHONFAULTHANDLER"] = "1"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out = None
        _killpg(proc.pid, signal.SIGKILL)  # what SIGABRT left: stopped processes, hung ones
        if out is None:
            out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, cmd))[:300]} ran over {timeout} s; killed. Its output:\n"
                             f"{out[-3000:]}\n-- stderr:\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def kill_leftovers(procs):
    """SIGKILLs and reaps the processes of `procs` still running (a test's finally)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def child_env():
    """The environment of a child python3 that imports this ckptio."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def run_python(code, *args, timeout=60, **kwargs):
    """Runs `code` in a fresh python3 with this ckptio on its path (run_killable)."""
    return run_killable([sys.executable, "-c", code, *args], timeout, env=child_env(), **kwargs)
