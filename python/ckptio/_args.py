"""Integer arguments checked before they reach the extension: an int, a numpy
integer or anything with __index__, inside the range the C++ call takes.
Otherwise pybind11 raised TypeError ("incompatible function arguments") for
one out of range, and int() truncated a float step (1.9 saved step 1)."""

import operator

from . import errors

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT64 = (0, (1 << 64) - 1)


def integer(value, what, bounds=INT64):
    """`value` as an int within `bounds` (inclusive), or ckptio.InvalidArgument."""
    if isinstance(value, bool):
        raise errors.InvalidArgument(f"{what} must be an integer, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise errors.InvalidArgument(f"{what} must be an integer, got {value!r}") from None
    lo, hi = bounds
    if not lo <= n <= hi:
        raise errors.InvalidArgument(f"{what} must be in [{lo}, {hi}], got {n}")
    return n


def optional_integer(value, what, bounds=INT64):
    return None if value is None else integer(value, what, bounds)
