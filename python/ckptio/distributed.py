"""Multi-process saves with torch.distributed: a SaveBarrier made of its store,
and the process group's place (index, count, run id) for `processes=`.

    import torch.distributed as dist, ckptio
    dist.init_process_group("gloo", init_method="tcp://10.0.0.1:29500", rank=r, world_size=n)
    mgr = ckptio.CheckpointManager("s3://bucket/run7", processes=ckptio.distributed.torch_processes(),
                                   barrier="torch")
    mgr.save(step, {"model": my_shards})      # every process, the same steps in the same order

docs/multiprocess.md describes the protocol; docs/python.md the Python side.
torch is imported only when a TorchBarrier is made.
"""

import collections
import itertools
import threading
import time
import uuid

from . import errors


def _dist():
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - torch is optional
        raise errors.FailedPrecondition(f"ckptio.TorchBarrier needs torch.distributed: {e}") from None
    if not dist.is_available():  # pragma: no cover
        raise errors.FailedPrecondition("ckptio.TorchBarrier: this torch is built without torch.distributed")
    return dist


class TorchBarrier:
    """A SaveBarrier (include/ckptio/manager.h) on a torch.distributed store.

    TorchBarrier() or TorchBarrier(group): the store of the default process
    group (dist.init_process_group first), counting the processes of
    `group` (default: the world). TorchBarrier(store, world_size): any
    torch.distributed.Store (TCPStore, FileStore, PrefixStore) shared by
    `world_size` processes.

    wait(name, timeout_seconds), which ckptio calls from a manager's worker
    thread with the GIL held for the call, returns once all processes
    called it with `name`: each adds 1 to the key `<prefix><name>`, then
    polls it until it reaches world_size (every 1 ms at first, then at most
    every max_poll_seconds, sleeping without the GIL in between; a blocking
    store.wait would hold the store's client, shared by every user in the
    process, for its whole length). After timeout_seconds it raises
    ckptio.Unavailable naming how many arrived, and a store that fails (its
    server, process 0's, gone) raises Unavailable too: the save then fails
    on this process. ckptio's names are unique per save attempt (they hold
    the run id and the attempt), so managers that share a store must have
    distinct run_ids. Each barrier
    leaves its counter in the store (a few bytes per save).
    """

    max_poll_seconds = 0.02  # the longest pause between two looks at the store

    def __init__(self, store=None, world_size=None, *, prefix="ckptio/barrier/"):
        dist = _dist()
        if store is None or not isinstance(store, dist.Store):
            group = store
            if not dist.is_initialized():
                raise errors.FailedPrecondition(
                    "ckptio.TorchBarrier(): torch.distributed is not initialized (call "
                    "dist.init_process_group first, or pass TorchBarrier(store, world_size))")
            store = dist.distributed_c10d._get_default_store()
            if world_size is None:
                world_size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        if world_size is None:
            raise errors.InvalidArgument("ckptio.TorchBarrier(store, world_size): world_size is required "
                                         "with a store")
        if int(world_size) < 1:
            raise errors.InvalidArgument(f"ckptio.TorchBarrier: world_size must be >= 1, not {world_size}")
        self.store = store
        self.world_size = int(world_size)
        self.prefix = prefix

    def wait(self, name, timeout_seconds):
        key = self.prefix + name
        deadline = time.monotonic() + float(timeout_seconds)
        try:
            arrived = self.store.add(key, 1)
            if arrived > self.world_size:
                raise errors.FailedPrecondition(
                    f"{arrived} processes arrived at barrier {name} for a group of {self.world_size} (two "
                    f"managers with the same run_id on one store, or a wrong world_size)")
            # Polled (add(key, 0) reads the count without blocking), not store.wait():
            # a store client serves one request at a time, so a blocking wait would
            # hold up every other user of the client (another manager's barrier,
            # whose arrival this one may be waiting for) until it ends.
            pause = 0.001
            while arrived < self.world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.Unavailable(f"{arrived} of {self.world_size} processes arrived within "
                                             f"{timeout_seconds:g} s")
                time.sleep(min(pause, left))
                pause = min(pause * 1.5, self.max_poll_seconds)
                arrived = self.store.add(key, 0)
        except RuntimeError as e:  # torch's store errors: a lost connection (process 0's store gone)
            raise errors.Unavailable(f"the store failed: {e}") from None

    def __call__(self, name, timeout_seconds):
        self.wait(name, timeout_seconds)

    def __repr__(self):
        return f"<ckptio.TorchBarrier {type(self.store).__name__} world_size={self.world_size}>"


_run_ids = collections.defaultdict(itertools.count)  # by process group
_run_ids_lock = threading.Lock()


def torch_processes(run_id=None, *, timeout_seconds=None, group=None):
    """processes=dict(index, count, run_id[, timeout_seconds]) from the default
    torch.distributed process group: this process's rank and the world size
    (of `group`). Without run_id, process 0 draws a fresh one and shares it
    through the group's store (every process must call this the same number
    of times, in the same order, as SPMD code does). A run id must be shared
    by the run's processes and new for every run: a restarted job gets a new
    one (docs/multiprocess.md, "Why a run id")."""
    dist = _dist()
    if not dist.is_initialized():
        raise errors.FailedPrecondition("ckptio.distributed.torch_processes(): call dist.init_process_group first")
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    count = dist.get_world_size(group) if group is not None else dist.get_world_size()
    if run_id is None:
        # Keyed by the group's processes: rank 0 of each group writes its own
        # key (one key for all groups gave members of one group different run
        # ids, and members of two groups the same one).
        tag = "world" if group is None else "-".join(str(r) for r in dist.get_process_group_ranks(group))
        with _run_ids_lock:
            n = next(_run_ids[tag])
        store = dist.distributed_c10d._get_default_store()
        key = f"ckptio/run_id/{tag}/{n}"
        if rank == 0:
            store.set(key, uuid.uuid4().hex)
        run_id = store.get(key).decode()
    out = dict(index=rank, count=count, run_id=str(run_id))
    if timeout_seconds is not None:
        out["timeout_seconds"] = float(timeout_seconds)
    return out
