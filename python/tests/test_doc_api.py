"""docs/python.md is the Python package's reference: every public name of
`ckptio`, every public method of its classes, and every keyword a public
function or method takes is named there (as a whole word). A keyword added
to the code without a word in the docs fails here."""

import inspect
import re
from pathlib import Path

import ckptio

DOC = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()

# Made by ckptio itself, never by a user: not part of the reference.
INTERNAL = {"SaveHandle": {"c_handle", "notifier"}, "SaveHandle.__init__": {"c_handle", "notifier"}}


def named(word):
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(word) + r"(?![A-Za-z0-9_])", DOC) is not None


def public_callables():
    for name in ckptio.__all__:
        obj = getattr(ckptio, name)
        yield name, name, obj
        if inspect.isclass(obj) and obj.__module__.startswith("ckptio"):
            for m, f in vars(obj).items():
                if (not m.startswith("_") or m == "__init__") and callable(f):
                    yield f"{name}.{m}", m, f


def test_every_public_name_and_keyword_is_in_docs_python_md():
    missing, checked = [], 0
    for qual, short, f in public_callables():
        if short != "__init__" and not named(short):
            missing.append(f"{qual} (the name)")
        try:
            params = inspect.signature(f).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature
            continue
        for p in params:
            if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name in INTERNAL.get(qual, ()):
                continue
            checked += 1
            if not named(p.name):
                missing.append(f"{qual}({p.name}=)")
    assert checked > 100, "the package's signatures were not read"
    assert not missing, "not in docs/python.md: " + ", ".join(missing)
