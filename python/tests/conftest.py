"""Fixtures of the ckptio Python tests (python/tests/).

Run them against a build:  PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests
(ctest runs them as the test python_pytest). The S3 tests use the server in
$CKPTIO_S3_SERVER_ENV (a tests/s3 server.env) if set, else start moto with
tests/s3/s3-server for the session; without moto installed they skip with the
reason, except under CI=true, where s3-server fails instead.
"""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
S3_SERVER = REPO / "tests" / "s3" / "s3-server"


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


def run_python(code, *args, timeout=60, **kwargs):
    """Runs `code` in a fresh python3 with this ckptio on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)
