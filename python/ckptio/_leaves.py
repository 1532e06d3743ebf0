"""Leaves: what a pytree's leaves become on save (a dtype name and a numpy
array over their bytes) and what restored bytes become for the caller.

numpy has no bfloat16 or float8 dtype of its own. With ml_dtypes importable,
restored leaves of those dtypes come back in ml_dtypes' types; without it,
as a `RawArray`: the bytes in uint16 (bfloat16) or uint8 (float8_*) whose
`ckptio_dtype` attribute keeps the leaf's dtype name, so that saving it again
stores the same dtype. torch.bfloat16 tensors need neither.
"""

import importlib
import sys

import numpy as np

from . import errors

# dtypes numpy holds natively, by the names the index uses (docs/format.md).
NUMPY_DTYPES = frozenset((
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))
# dtypes numpy lacks, and the unsigned type of the same size that carries their bytes.
RAW_CARRIERS = {"bfloat16": np.dtype(np.uint16), "float8_e4m3fn": np.dtype(np.uint8),
                "float8_e5m2": np.dtype(np.uint8)}

# Kinds of leaves, as the tree definition records them (see _tree.py).
ARRAY, NUMPY_SCALAR, TENSOR = "a", "g", "t"
SHARDS = "h"  # a ckptio.Shards, or a jax.Array taken as its addressable shards (_shards.py)
PY_BOOL, PY_INT, PY_FLOAT, PY_COMPLEX = "b", "i", "f", "c"
_PY_SCALARS = ((bool, PY_BOOL, np.bool_), (int, PY_INT, np.int64), (float, PY_FLOAT, np.float64),
               (complex, PY_COMPLEX, np.complex128))


class RawArray(np.ndarray):
    """The bytes of a dtype numpy lacks (bfloat16, float8_e4m3fn, float8_e5m2),
    held in uint16 / uint8, with that dtype's name in `ckptio_dtype`.

    Slices and views keep the name; results of arithmetic do not (they are
    plain arrays: arithmetic on the carrier's integers means nothing for the
    real dtype). Saving a RawArray stores its `ckptio_dtype`.
    """

    def __array_finalize__(self, obj):
        self.ckptio_dtype = getattr(obj, "ckptio_dtype", None)

    def __array_wrap__(self, out, context=None, *args):
        return np.asarray(out)

    def __reduce__(self):
        return (raw_array, (np.asarray(self), self.ckptio_dtype))

    def __repr__(self):
        return f"RawArray({np.asarray(self)!r}, ckptio_dtype={self.ckptio_dtype!r})"


def raw_array(array, dtype):
    """A RawArray over `array`'s bytes (uint16 for bfloat16, uint8 for float8_*):
    how to hand ckptio a bfloat16 or float8 leaf without ml_dtypes or torch."""
    carrier = RAW_CARRIERS.get(dtype)
    if carrier is None:
        raise errors.InvalidArgument(f"raw_array: dtype must be one of {sorted(RAW_CARRIERS)}, not {dtype!r}")
    a = np.asarray(array)
    if a.dtype.itemsize != carrier.itemsize:
        raise errors.InvalidArgument(
            f"raw_array: {dtype} needs items of {carrier.itemsize} bytes, the array has {a.dtype.itemsize}")
    out = a.view(carrier).view(RawArray)
    out.ckptio_dtype = dtype
    return out


# ---- ml_dtypes ------------------------------------------------------------------

_ml_dtypes = None
_ml_dtypes_tried = False


def ml_dtypes():
    """The ml_dtypes module, or None when it cannot be imported (looked up once;
    reset_ml_dtypes() looks again)."""
    global _ml_dtypes, _ml_dtypes_tried
    if not _ml_dtypes_tried:
        _ml_dtypes_tried = True
        try:
            _ml_dtypes = importlib.import_module("ml_dtypes")
        except ImportError:
            _ml_dtypes = None
    return _ml_dtypes


def reset_ml_dtypes():
    global _ml_dtypes, _ml_dtypes_tried
    _ml_dtypes, _ml_dtypes_tried = None, False


def numpy_dtype(name):
    """The numpy dtype restored leaves of dtype `name` have: numpy's own, ml_dtypes'
    for bfloat16 / float8 when it is importable, else None (a RawArray)."""
    if name in NUMPY_DTYPES:
        return np.dtype(name)
    mld = ml_dtypes()
    if mld is not None and hasattr(mld, name):
        return np.dtype(getattr(mld, name))
    return None


# ---- save: leaf -> (dtype name, numpy array) ----------------------------------------

def _torch():
    return sys.modules.get("torch")  # never imported here: a tensor implies torch is loaded


def is_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _bad(name, what):
    return errors.InvalidArgument(f"leaf '{name}': {what}")


def tensor_bytes(t, name, borrow):
    """(dtype name, numpy array sharing the tensor's memory) of a CPU tensor."""
    torch = _torch()
    if t.device.type != "cpu":
        raise _bad(name, f"a tensor on {t.device}; move it to the CPU first (tensor.cpu())")
    if t.layout != torch.strided:
        raise _bad(name, f"a {t.layout} tensor; only dense (strided) tensors can be saved")
    t = t.detach()
    if (getattr(t, "is_conj", None) and t.is_conj()) or (getattr(t, "is_neg", None) and t.is_neg()):
        # A lazy conjugate or negation (t.conj(), torch._neg_view): its memory
        # holds the values before it, which numpy would read as they are.
        if borrow:
            raise _bad(name, "the tensor is a lazy conjugate or negation (tensor.conj()); borrow mode reads "
                             "the caller's memory as it is (pass tensor.resolve_conj().resolve_neg(), or use "
                             "staging=\"copy\")")
        t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        if borrow:
            raise _bad(name, "the tensor is not contiguous; borrow mode reads the caller's memory as it "
                             "is (pass tensor.contiguous(), or use staging=\"copy\")")
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return "bfloat16", t.view(torch.int16).numpy().view(np.uint16)
    for f8 in ("float8_e4m3fn", "float8_e5m2"):
        if getattr(torch, f8, None) is not None and t.dtype == getattr(torch, f8):
            return f8, t.view(torch.uint8).numpy()
    try:
        a = t.numpy()
    except (TypeError, RuntimeError) as e:
        raise _bad(name, f"a tensor of dtype {t.dtype} cannot be saved ({e})") from None
    return array_bytes(a, name, borrow)


# The native-byte-order numpy dtypes ckptio holds, by dtype: their names
# without numpy computing `dtype.name` per leaf on save's path (bench/python_bench.py:
# two lookups per leaf were ~0.8 ms of a 295-leaf borrow-mode save's 2 ms stall).
_NATIVE_NAMES = {np.dtype(n): n for n in NUMPY_DTYPES}


def array_bytes(a, name, borrow):
    """(dtype name, C-contiguous numpy array of the bytes) of a numpy array."""
    dt = a.dtype
    native = _NATIVE_NAMES.get(dt)  # dt.name costs ~1.8 us (computed in Python by numpy 1.24)
    if isinstance(a, RawArray) and a.ckptio_dtype in RAW_CARRIERS and dt == RAW_CARRIERS[a.ckptio_dtype]:
        dtype = a.ckptio_dtype
        a = a.view(np.ndarray)
    elif native is not None:
        dtype = native
    elif dt.name in NUMPY_DTYPES:
        dtype = dt.name
        if not dt.isnative:
            if borrow:
                raise _bad(name, f"dtype {dt.str} is not in this machine's byte order (borrow mode "
                                 "cannot convert it; use staging=\"copy\")")
            a = a.astype(dt.newbyteorder("="))
    elif dt.name in RAW_CARRIERS and dt.itemsize == RAW_CARRIERS[dt.name].itemsize:
        dtype = dt.name  # ml_dtypes' bfloat16 / float8 types
        a = a.view(RAW_CARRIERS[dt.name])
    elif dt.hasobject:
        raise _bad(name, "an array of Python objects (dtype object) cannot be saved")
    else:
        raise _bad(name, f"dtype {dt} cannot be saved (ckptio holds {', '.join(sorted(NUMPY_DTYPES | set(RAW_CARRIERS)))})")
    if not a.flags.c_contiguous:
        if borrow:
            raise _bad(name, "the array is not C-contiguous; borrow mode reads the caller's memory as "
                             "it is (pass np.ascontiguousarray(a), or use staging=\"copy\")")
        a = np.ascontiguousarray(a)
    return dtype, a


def leaf_kind(obj):
    """The kind of a leaf (ARRAY, TENSOR, ...), or None if `obj` is not one."""
    if isinstance(obj, np.ndarray):
        return ARRAY
    if isinstance(obj, np.generic):
        return NUMPY_SCALAR
    for py_type, kind, _ in _PY_SCALARS:
        if isinstance(obj, py_type):
            return kind
    if is_tensor(obj):
        return TENSOR
    if getattr(type(obj), "_ckptio_shards", False) or (
            hasattr(obj, "addressable_shards") and hasattr(obj, "shape") and hasattr(obj, "dtype")):
        return SHARDS  # before __array__: a jax.Array has both
    if hasattr(obj, "__array__") or hasattr(obj, "__array_interface__"):
        return ARRAY
    try:
        memoryview(obj).release()
        return ARRAY
    except TypeError:
        return None


def leaf_bytes(obj, kind, name, borrow):
    """(dtype name, numpy array) of a leaf of kind `kind`."""
    if kind == TENSOR:
        return tensor_bytes(obj, name, borrow)
    if kind == ARRAY:
        if not isinstance(obj, np.ndarray):
            obj = np.asarray(obj)
        return array_bytes(obj, name, borrow)
    if kind == NUMPY_SCALAR:
        return array_bytes(np.asarray(obj), name, False)  # a fresh 0-d array; nothing to borrow
    for _, k, np_type in _PY_SCALARS:
        if k == kind:
            try:
                return np.dtype(np_type).name, np.array(obj, dtype=np_type)
            except OverflowError:
                raise _bad(name, f"{obj} does not fit in {np.dtype(np_type).name}") from None
    raise _bad(name, f"unsupported kind {kind}")


def dtype_name(dtype, where):
    """The name a checkpoint gives `dtype`: a name ("float32"), a numpy dtype
    or scalar type (ml_dtypes' and jax's included), or a torch dtype."""
    if isinstance(dtype, str):
        name = dtype
        if name not in NUMPY_DTYPES and name not in RAW_CARRIERS:
            try:
                name = np.dtype(dtype).name  # numpy's spellings: "<f2", "f4", "double"
            except TypeError:
                pass
    elif str(dtype).startswith("torch."):
        name = str(dtype)[len("torch."):]
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in NUMPY_DTYPES and name not in RAW_CARRIERS:
        raise errors.InvalidArgument(f"{where}: dtype {dtype!r} is not one a checkpoint holds "
                                     f"({', '.join(sorted(NUMPY_DTYPES | set(RAW_CARRIERS)))})")
    return name


def array_dtype_name(obj, where):
    """The dtype name of an array-like leaf (an array, a tensor, a scalar)."""
    kind = leaf_kind(obj)
    if kind is None or kind == SHARDS:
        raise errors.InvalidArgument(f"{where}: a {type(obj).__name__} is not an array")
    return leaf_spec(obj, kind, where)[0]


def leaf_spec(obj, kind, name):
    """(dtype name, shape) a template leaf expects, without touching its data."""
    if kind == SHARDS:
        from . import _shards
        return _shards.leaf_spec(obj)
    if kind == TENSOR:
        torch = _torch()
        if obj.dtype == torch.bfloat16:
            return "bfloat16", tuple(obj.shape)
        for f8 in ("float8_e4m3fn", "float8_e5m2"):
            if getattr(torch, f8, None) is not None and obj.dtype == getattr(torch, f8):
                return f8, tuple(obj.shape)
        dtype = str(obj.dtype).replace("torch.", "")
        if dtype not in NUMPY_DTYPES:
            raise _bad(name, f"template dtype {obj.dtype} is not one a checkpoint holds")
        return dtype, tuple(obj.shape)
    if kind in (ARRAY, NUMPY_SCALAR):
        a = obj if isinstance(obj, (np.ndarray, np.generic)) else np.asarray(obj)
        if isinstance(a, RawArray) and a.ckptio_dtype in RAW_CARRIERS:
            return a.ckptio_dtype, a.shape
        if a.dtype.name in NUMPY_DTYPES or a.dtype.name in RAW_CARRIERS:
            return a.dtype.name, a.shape
        raise _bad(name, f"template dtype {a.dtype} is not one a checkpoint holds")
    for _, k, np_type in _PY_SCALARS:
        if k == kind:
            return np.dtype(np_type).name, ()
    raise _bad(name, f"unsupported kind {kind}")


# ---- restore: (dtype name, carrier array) -> what the caller gets -----------------------

def as_numpy(dtype, a):
    """The restored array of dtype `dtype` (its bytes in `a`, a numpy array of the carrier)."""
    if dtype in NUMPY_DTYPES:
        return a
    real = numpy_dtype(dtype)
    if real is not None:
        return a.view(real)
    out = a.view(RawArray)
    out.ckptio_dtype = dtype
    return out


def as_tensor(dtype, a):
    """A torch tensor sharing the restored bytes."""
    torch = _torch()
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if dtype in RAW_CARRIERS:
        f8 = getattr(torch, dtype, None)
        if f8 is None:
            raise errors.Unimplemented(f"this torch has no {dtype}")
        return torch.from_numpy(a).view(f8)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


def float_of(dtype, a):
    """The value of a 0-d leaf of float dtype `dtype` (its bytes in `a`) as a
    Python float, which holds bfloat16 and float8 values exactly: decoded from
    the bits where numpy has no such dtype."""
    if dtype not in RAW_CARRIERS:
        return float(a)
    real = numpy_dtype(dtype)
    if real is not None:
        return float(a.view(real))
    bits = int(a)
    if dtype == "bfloat16":  # the top half of a float32
        return float(np.array(bits << 16, dtype=np.uint32).view(np.float32))
    if dtype == "float8_e5m2":  # the top half of a float16
        return float(np.array(bits << 8, dtype=np.uint16).view(np.float16))
    # float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
    # infinities, and S.1111.111 is NaN.
    sign = -1.0 if bits & 0x80 else 1.0
    e, m = (bits >> 3) & 0xF, bits & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return sign * m / 8.0 * 2.0 ** -6
    return sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def as_kind(kind, dtype, a):
    """The restored leaf as the kind it was saved as (or the template holds)."""
    if kind in (ARRAY, SHARDS):  # a sharded leaf restored whole: its global array
        return as_numpy(dtype, a)
    if kind == TENSOR:
        return as_tensor(dtype, a)
    if kind == NUMPY_SCALAR:
        out = as_numpy(dtype, a)
        # (A 0-d RawArray, without ml_dtypes: indexing it would give its
        # carrier's scalar, the raw bits, as numpy.uint16.)
        return out[()] if a.ndim == 0 and not isinstance(out, RawArray) else out
    if a.ndim == 0:
        if kind == PY_BOOL:
            return bool(a)
        if kind == PY_INT:
            return int(a)
        if kind == PY_FLOAT:
            return float_of(dtype, a)
        if kind == PY_COMPLEX:
            return complex(a)
    return as_numpy(dtype, a)


def writable_view(obj, kind, name):
    """A numpy array over the memory of an `into=` leaf (an array or tensor)."""
    if kind == TENSOR:
        torch = _torch()
        if obj.device.type != "cpu":
            raise errors.InvalidArgument(f"into '{name}': a tensor on {obj.device}; restore into CPU memory")
        if not obj.is_contiguous():
            raise errors.InvalidArgument(f"into '{name}': the tensor is not contiguous")
        t = obj.detach()
        # A conj or neg view is a lazy view: writes to its memory would not be
        # what it shows (and numpy() raised a bare RuntimeError).
        if (hasattr(t, "is_conj") and t.is_conj()) or (hasattr(t, "is_neg") and t.is_neg()):
            raise errors.InvalidArgument(f"into '{name}': a conjugate or negative view; restore into a "
                                         f"plain tensor (resolve_conj(), resolve_neg())")
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()
    if kind == ARRAY and isinstance(obj, np.ndarray):
        if not obj.dtype.isnative:  # its dtype name is the native one's: the bytes would land unswapped
            raise errors.InvalidArgument(f"into '{name}': the array's byte order ({obj.dtype.str}) is not this "
                                         f"machine's; restore into a native-order array")
        if isinstance(obj, RawArray) or obj.dtype.name in RAW_CARRIERS:
            return obj.view(np.uint16 if obj.dtype.itemsize == 2 else np.uint8)
        return obj
    raise errors.InvalidArgument(f"into '{name}': restore into a numpy array or a torch tensor, "
                                 f"not {type(obj).__name__}")
