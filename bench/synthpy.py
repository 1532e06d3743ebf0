"""ckptio's synthetic training state in numpy: the same leaves, the same bytes.

The layout (names, dtypes, shapes) is not re-derived here: it is read from
`ckptio inspect --json` of a step that `ckptio synth save` wrote, so it can
never drift from tools/cli/synth.cc. The bytes follow the generator contract
"splitmix64-v1" of tools/cli/synth.h:

    key(seed, prefix, path) = mix(fnv1a64(prefix + "/" + path) ^ mix(seed + G) ^ mix(0 * G2))
    byte b of a leaf        = byte (b % 8) of mix(key + (b // 8 + 1) * G), little endian

so a zarr or numpy contender saves exactly what ckptio saves (the same entropy:
what zstd can squeeze out of it is what it could squeeze out of ckptio's data).

bfloat16 has no numpy dtype without ml_dtypes (not in Debian 12); such leaves
are held as little-endian uint16, which is the same bytes.
"""
import json
import os
import subprocess

import numpy as np

G = 0x9E3779B97F4A7C15
G2 = 0xD1B54A32D192ED03
M64 = (1 << 64) - 1

NP_DTYPES = {
    "bfloat16": "<u2", "float16": "<f2", "float32": "<f4", "float64": "<f8",
    "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "bool": "?",
}


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _fnv1a64(s, h=0xcbf29ce484222325):
    for c in s.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return h


def leaf_key(seed, prefix, path, version=0):
    h = _fnv1a64(path, _fnv1a64("/", _fnv1a64(prefix)))
    return _mix(h ^ _mix((seed + G) & M64) ^ _mix((version * G2) & M64))


def _np_mix(z):
    # In place on uint64 arrays (wrapping arithmetic), one temporary.
    t = z >> np.uint64(30)
    z ^= t
    z *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(z, np.uint64(27), out=t)
    z ^= t
    z *= np.uint64(0x94D049BB133111EB)
    np.right_shift(z, np.uint64(31), out=t)
    z ^= t
    return z


def fill(key, out_bytes):
    """Fills a writable uint8 array with the leaf keyed `key` from byte 0."""
    n = out_bytes.size
    words = (n + 7) // 8
    step = 1 << 22  # 32 MiB of words at a time: bounded temporaries
    with np.errstate(over="ignore"):
        for w0 in range(0, words, step):
            w1 = min(words, w0 + step)
            z = np.arange(w0 + 1, w1 + 1, dtype=np.uint64)
            z *= np.uint64(G)
            z += np.uint64(key)
            _np_mix(z)
            b = z.view(np.uint8)
            lo, hi = w0 * 8, min(n, w1 * 8)
            out_bytes[lo:hi] = b[: hi - lo]


class State:
    """Leaves as numpy arrays that are views into one contiguous arena (so the
    whole state is also one bytes-like object, for the S3 contenders)."""

    def __init__(self, leaves, seed=0):
        self.leaves = leaves  # list of dicts: prefix, path, dtype, shape, bytes
        offsets, size = [], 0
        for l in leaves:
            size = (size + 63) // 64 * 64
            offsets.append(size)
            size += l["bytes"]
        self.arena = np.empty(size, dtype=np.uint8)
        self.total_bytes = sum(l["bytes"] for l in leaves)
        self.arrays = []
        for l, off in zip(leaves, offsets):
            view = self.arena[off: off + l["bytes"]]
            fill(leaf_key(seed, l["prefix"], l["path"]), view)
            dt = np.dtype(NP_DTYPES[l["dtype"]])
            self.arrays.append(view.view(dt).reshape(tuple(l["shape"])))

    def names(self):
        return [l["prefix"] + "/" + l["path"] for l in self.leaves]


def layout_from_ckptio(ckptio, workdir, nbytes, leaves, seed=0):
    """Saves a synth step with ckptio, reads its leaf list, removes it."""
    d = os.path.join(workdir, "layout-export")
    subprocess.run(["rm", "-rf", d], check=True)
    subprocess.run([ckptio, "synth", "save", d, "--step", "0", "--bytes", str(nbytes),
                    "--leaves", str(leaves), "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run([ckptio, "inspect", d, "--json"], check=True, capture_output=True, text=True).stdout
    subprocess.run(["rm", "-rf", d], check=True)
    j = json.loads(out)
    return [{"prefix": l["prefix"], "path": l["path"], "dtype": l["dtype"],
             "shape": list(l["shape"]), "bytes": int(l["bytes"])} for l in j["leaves"]]

