"""ckptio: asynchronous, atomic checkpoints of training state (numpy arrays,
torch tensors) to local disk or S3, and restore of the latest committed step.

    import ckptio
    with ckptio.CheckpointManager("/data/ckpt", max_to_keep=3) as mgr:
        h = mgr.save(100, {"model": model.state_dict(), "optim": opt.state_dict()})
        ...
        state = mgr.restore()                 # the newest intact step, as numpy arrays

docs/python.md is the guide; the C++ headers (include/ckptio/) are the reference.
"""

from . import _ckptio
from .errors import (AlreadyExists, Cancelled, DataLoss, Error, FailedPrecondition, Internal,
                     InvalidArgument, IOError, NoSpace, NotFound, PermissionDenied, ResourceExhausted,
                     Unavailable, Unimplemented)
from ._leaves import RawArray, raw_array
from ._shards import (Mesh, PartitionSpec, Shard, Shards, devices_indices_map,
                      match_partition_rules)
from .manager import (CheckpointManager, CommitEvent, LeafInfo, RestoreInfo, SaveHandle, SaveStats)
from .tools import cp, gc, inspect, verify
from .distributed import TorchBarrier

__all__ = [
    "CheckpointManager", "SaveHandle", "SaveStats", "CommitEvent", "RestoreInfo", "LeafInfo",
    "RawArray", "raw_array", "dtypes",
    "cp", "verify", "inspect", "gc", "TorchBarrier",
    "Shards", "Shard", "Mesh", "PartitionSpec", "devices_indices_map", "match_partition_rules",
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition", "PermissionDenied",
    "NoSpace", "IOError", "Unavailable", "DataLoss", "Unimplemented", "Cancelled", "Internal",
    "ResourceExhausted",
]


def dtypes():
    """The dtype names a checkpoint can hold."""
    return list(_ckptio.dtype_names())
