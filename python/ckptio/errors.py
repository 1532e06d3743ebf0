"""The exceptions ckptio raises: one class per status code of the C++ library.

Every error of the library reaches Python as a subclass of `ckptio.Error`
carrying the C++ message (which names the step, leaf, shard or file at fault).
`Error.code` is the status code's name ("NotFound", "DataLoss", ...).
Classes that have a natural Python counterpart also derive from it, so
`except ValueError` catches `InvalidArgument`, `except LookupError`
catches `NotFound` and `except MemoryError` catches `ResourceExhausted`.
"""

from . import _ckptio


class Error(Exception):
    """Base class of every error ckptio raises."""

    code = "Unknown"

    @property
    def retryable(self):
        """Whether repeating the operation unchanged may succeed (Unavailable)."""
        return self.code == "Unavailable"


class InvalidArgument(Error, ValueError):
    """The caller asked for something malformed (bad leaf, option, template mismatch)."""
    code = "InvalidArgument"


class NotFound(Error, LookupError):
    """A step, key or leaf that does not exist."""
    code = "NotFound"


class AlreadyExists(Error):
    """A committed step saved again without overwrite=True."""
    code = "AlreadyExists"


class FailedPrecondition(Error):
    """The state does not allow it: a closed manager, a manager used in a forked child."""
    code = "FailedPrecondition"


class PermissionDenied(Error):
    """EACCES / EPERM / EROFS, or HTTP 403."""
    code = "PermissionDenied"


class NoSpace(Error):
    """ENOSPC / EDQUOT."""
    code = "NoSpace"


class IOError(Error):  # noqa: A001 - the status code's name; ckptio.IOError, not the builtin
    """EIO and other I/O failures."""
    code = "IOError"


class Unavailable(Error):
    """Transient (network, server): retryable by definition."""
    code = "Unavailable"


class DataLoss(Error):
    """Stored bytes are damaged: checksum mismatch, truncated file, an index that does not parse."""
    code = "DataLoss"


class Unimplemented(Error, NotImplementedError):
    """The backend or build lacks the feature."""
    code = "Unimplemented"


class Cancelled(Error):
    """Aborted by the caller or by shutdown, or a callback raised."""
    code = "Cancelled"


class Internal(Error):
    """A bug in ckptio."""
    code = "Internal"


class ResourceExhausted(Error, MemoryError):
    """Out of memory: an allocation (a staging buffer, a restored leaf) failed; nothing was left behind."""
    code = "ResourceExhausted"


BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, PermissionDenied, NoSpace,
    IOError, Unavailable, DataLoss, Unimplemented, Cancelled, Internal, ResourceExhausted)}

_ckptio._set_error_classes(BY_CODE)
