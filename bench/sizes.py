"""Byte sizes as the bench scripts take them on the command line (standard
library only: bench/compare-local imports it without numpy)."""

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse_size(s):
    """"4096", "512K", "256M", "2G", "2GiB", "1.5gb": binary units, any case."""
    low = str(s).strip().lower()
    for tail in ("ib", "b"):
        if low.endswith(tail) and low[: -len(tail)][-1:] in ("k", "m", "g"):
            low = low[: -len(tail)]
            break
    units = {"k": KiB, "m": MiB, "g": GiB}
    try:
        return int(float(low[:-1]) * units[low[-1]]) if low[-1:] in units else int(low)
    except ValueError:
        raise ValueError("not a size: %r (say 4096, 512K, 256MiB or 2GiB)" % (s,)) from None
