"""The Python examples of README.md and docs/python.md, run as written.

Each test takes a ```python block by the words it opens with, rewrites its paths
to a temporary directory, runs it with only the names the prose around it
assumes (a model, `step`, `mgr`), and checks what it left. A renamed function
or option, or an example that no longer works, fails here instead of in a
user's hands. Not run: the blocks that need JAX (not packaged for Debian 12),
a multi-host torch.distributed group (test_distributed.py covers it with
real processes), or a remote S3 bucket.
"""

import re
from pathlib import Path

import numpy as np
import pytest

import ckptio

REPO = Path(__file__).resolve().parents[2]


def python_blocks(doc):
    text = (REPO / doc).read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def block(doc, opening):
    """The one ```python block of `doc` whose code contains `opening`."""
    found = [b for b in python_blocks(doc) if opening in b]
    assert len(found) == 1, f"{doc}: {len(found)} python blocks contain {opening!r}"
    return found[0]


def run(code, **names):
    scope = dict(names)
    exec(compile(code, "<doc example>", "exec"), scope)
    return scope


def test_readme_quick_start(tmp_path):
    code = block("README.md", "ckptio.CheckpointManager(")
    code = code.replace('"/tmp/ckpt-py"', repr(str(tmp_path / "ckpt-py")))
    out = run(code)
    np.testing.assert_array_equal(out["state"]["model"]["w"], np.ones((1024, 1024), np.float32))
    assert out["state"]["step"] == 1
    assert ckptio.CheckpointManager(str(tmp_path / "ckpt-py")).all_steps() == [1]


def test_training_loop_example(tmp_path):
    code = block("docs/python.md", "mgr.wait_until_finished()")
    base = str(tmp_path / "ckpt")
    code = code.replace('"/data/ckpt"', repr(base))
    run(code)
    mgr = ckptio.CheckpointManager(base)
    assert mgr.all_steps() == [100, 200, 300]  # max_to_keep=3
    assert mgr.metadata(300) == {"data_pos": 1234}
    # Run again, as after a restart: it restores step 300 and goes on from there.
    again = run(code)
    assert again["start"] == 300
    np.testing.assert_array_equal(again["state"]["model"]["w"], np.zeros((1024, 1024), np.float32))
    assert ckptio.CheckpointManager(base).all_steps() == [100, 200, 300]


def test_torch_example(tmp_path):
    torch = pytest.importorskip("torch")  # python3-torch: tools/setup-deps installs it
    code = block("docs/python.md", "model.state_dict()")
    base = str(tmp_path / "ckpt")
    code = code.replace('"/data/ckpt"', repr(base))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run(code, model=model, opt=opt, step=7)
    assert ckptio.CheckpointManager(base).latest_step() == 7
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_sharded_state_example(tmp_path):
    code = block("docs/python.md", "ckptio.Shards.from_mesh(")
    base = str(tmp_path / "ckpt")
    with ckptio.CheckpointManager(base) as mgr:
        out = run(code, mgr=mgr, step=5)
    restored = ckptio.CheckpointManager(base).restore(5)
    np.testing.assert_array_equal(restored["model"]["w"], out["g"])
    np.testing.assert_array_equal(restored["model"]["b"], np.zeros(24, np.float32))


def test_tools_example(tmp_path):
    code = block("docs/python.md", "ckptio.verify(")
    base = str(tmp_path / "ckpt")
    with ckptio.CheckpointManager(base) as mgr:
        mgr.save(1200, {"layers": {"0": {"w": np.ones((64, 33), np.float32)}}}).wait()
    # Every line that names no S3 bucket, the local copy kept as the target.
    local = [line.replace('"/data/ckpt"', repr(base)).replace('"/scratch/ckpt"', repr(str(tmp_path / "copy")))
             for line in code.splitlines() if "s3://" not in line]
    out = run("\n".join(local), ckptio=ckptio)
    assert out["info"]["leaves"][0]["dtype"] == "float32"
    assert tuple(out["info"]["leaves"][0]["shape"]) == (64, 33)
    assert ckptio.CheckpointManager(base).all_steps() == [1200]  # gc keeps the last 3
