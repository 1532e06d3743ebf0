"""CheckpointManager: asynchronous, atomic checkpoints of a pytree of numpy
arrays and torch tensors; restore of the latest committed step.

Threads and the GIL. Saves run on the C++ library's own threads, which never
take the GIL. Every call that can block (save's planning and copying, waits,
discovery, restore, close) releases it. Each manager has one Python thread,
"ckptio-callbacks", started with its first save: it waits for each save in
turn (without the GIL), then, with the GIL, runs on_commit, completes the
handle, drops the arrays a borrow-mode save held, and runs the handle's done
callbacks. A callback that raises is logged (logger "ckptio") and ignored.

Lifetime. close() (or leaving a `with` block) waits for every save in flight
and its callbacks, then frees the manager. A manager that is garbage
collected, or still open at interpreter exit, is closed the same way (a
weakref.finalize, which Python runs at exit before tearing threads down), so
exiting with saves in flight waits for them rather than hang or crash.
"""

import collections
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from . import _args, _ckptio, _leaves, _shards, _tree, errors

log = logging.getLogger("ckptio")


@dataclass(frozen=True)
class SaveStats:
    bytes: int = 0              # bytes written to data files
    stall_seconds: float = 0.0  # how long save() blocked its caller (in the C++ library)
    write_seconds: float = 0.0  # first byte staged to data durable
    commit_seconds: float = 0.0  # data durable to step visible
    total_seconds: float = 0.0  # save() call to commit


@dataclass(frozen=True)
class CommitEvent:
    """What on_commit receives, once per save, success or failure."""
    step: int
    error: Optional[errors.Error]  # None when the step committed
    stats: SaveStats

    @property
    def ok(self):
        return self.error is None


@dataclass(frozen=True)
class RestoreInfo:
    step: int
    metadata: dict
    stats: dict
    # Newer steps restore(step=None) passed over as damaged: [(step, message)].
    skipped: list


@dataclass(frozen=True)
class LeafInfo:
    prefix: str
    path: str
    dtype: str
    shape: tuple
    nbytes: int
    shards: int


def _call_safely(fn, arg, what, step):
    try:
        fn(arg)
    except BaseException:  # noqa: B036 - a callback must never end the callbacks' thread
        log.exception("ckptio: the %s for step %s raised; ignored", what, step)


class SaveHandle:
    """A save in flight, in the manner of concurrent.futures.Future."""

    def __init__(self, c_handle, notifier, borrowed, on_commit):
        self._c = c_handle
        self._pid = os.getpid()
        self._step = c_handle.step
        self._notifier = notifier
        self._borrowed = borrowed  # borrow mode: the arrays, alive until the save is done
        self._on_commit = on_commit
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks = []
        self._error = None

    @property
    def step(self):
        return self._step

    def done(self):
        """True once the save committed or failed and on_commit ran."""
        return self._event.is_set()

    def released(self):
        """Borrow mode: True once the library reads the caller's arrays no more
        (they may be changed or freed). Always True in copy mode."""
        return self._event.is_set() or self._c.released()

    def wait(self, timeout=None):
        """Waits until the save committed (returns its SaveStats) or failed
        (raises its ckptio.Error). TimeoutError after `timeout` seconds."""
        if self._notifier.is_current_thread() or os.getpid() != self._pid:
            # From a callback: the callbacks' thread cannot wait for itself. In
            # a fork()ed child no callbacks' thread exists: the library's handle
            # raises FailedPrecondition there at once.
            if timeout is None:
                self._c.wait()
            else:  # (the library's handle waits without a bound: looked at until the deadline)
                deadline, pause = time.monotonic() + float(timeout), 0.001
                while not self._c.done():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"ckptio: the save of step {self._step} is not done after {timeout} s")
                    time.sleep(min(pause, left))
                    pause = min(pause * 2, 0.05)
                self._c.wait()
            return self.stats
        if not self._event.wait(timeout):
            raise TimeoutError(f"ckptio: the save of step {self._step} is not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self.stats

    result = wait

    def exception(self, timeout=None):
        """The save's error (None if it committed), after waiting as wait() does."""
        try:
            self.wait(timeout)
        except errors.Error as e:
            return e
        return None

    def wait_released(self, timeout=None):
        """Borrow mode: waits until released() (the save may still be running)."""
        if timeout is None:
            self._c.wait_released()
            return True
        import time
        deadline = time.monotonic() + timeout
        while not self.released():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def add_done_callback(self, fn: Callable[["SaveHandle"], Any]):
        """fn(handle) once the save is done, on the callbacks' thread with the GIL
        held; at once, in this thread, if it is done already. What fn raises
        is logged and ignored."""
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        _call_safely(fn, self, "done callback", self._step)

    @property
    def stats(self):
        """SaveStats (final once done())."""
        return SaveStats(**self._c.stats())

    @property
    def progress(self):
        """{"total", "staged", "written", "durable"}: bytes so far (SaveProgress in C++)."""
        return self._c.progress()

    def __repr__(self):
        state = "done" if self.done() else "running"
        if self.done() and self._error is not None:
            state = f"failed: {type(self._error).__name__}"
        return f"<ckptio.SaveHandle step={self._step} {state}>"

    # The callbacks' thread:
    def _complete(self):
        error = None
        try:
            self._c.wait()
        except errors.Error as e:
            error = e
        except BaseException as e:  # noqa: B036
            error = errors.Internal(f"waiting for the save of step {self._step}: {e!r}")
        self._error = error
        self._borrowed = None
        if self._on_commit is not None:
            _call_safely(self._on_commit, CommitEvent(self._step, error, self.stats), "on_commit callback",
                         self._step)
        with self._lock:
            callbacks, self._callbacks = self._callbacks, None
            self._event.set()
        for fn in callbacks:
            _call_safely(fn, self, "done callback", self._step)


class _Notifier:
    """The manager's callbacks' thread: completes handles in save order."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queue = collections.deque()
        self._pending = 0
        self._thread = None
        self._stopped = False

    def is_current_thread(self):
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, handle):
        with self._cv:
            if not self._stopped:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="ckptio-callbacks", daemon=True)
                    try:
                        thread.start()
                        self._thread = thread
                    except RuntimeError as e:  # no thread to be had (limits; interpreter shutting down)
                        log.warning("ckptio: no callbacks' thread (%s): step %s completes in save()",
                                    e, handle.step)
                if self._thread is not None:
                    self._queue.append(handle)
                    self._pending += 1
                    self._cv.notify_all()
                    return
        # A save() that raced close() (whose close waited for the save to
        # finish, and this thread is gone), or no thread to be had: completed
        # here, waiting for the save, so that a borrow-mode save's arrays stay
        # alive until the library reads them no more.
        handle._complete()

    def drain(self):
        """Waits until every handle submitted so far is complete (not from the thread itself)."""
        if self.is_current_thread():
            return
        with self._cv:
            while self._pending and self._thread is not None and self._thread.is_alive():
                self._cv.wait(0.5)

    def stop(self):
        with self._cv:
            if self._stopped:
                return
            self._stopped = True
            self._queue.append(None)
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                handle = self._queue.popleft()
            if handle is None:
                return
            try:
                handle._complete()
            finally:
                with self._cv:
                    self._pending -= 1
                    self._cv.notify_all()


def _shutdown(c_manager, notifier, pid):
    """Closes a manager: waits for its saves, then for their callbacks."""
    if os.getpid() != pid:  # a forked child: the threads are the parent's
        return
    if isinstance(threading.current_thread(), threading._DummyThread):
        # One of the library's own threads, calling into Python (a save's
        # barrier on the manager's worker): the manager collected there by the
        # cyclic GC, or closed from the barrier. Closing waits for the save
        # that very thread runs, so a thread of its own closes it.
        threading.Thread(target=_shutdown, args=(c_manager, notifier, pid), name="ckptio-close",
                         daemon=True).start()
        return
    try:
        c_manager.close()  # releases the GIL; the C++ destructor waits for every save
    finally:
        notifier.stop()


def _opt(d, key, value):
    if value is not None:
        d[key] = value


def _dtype_name(dtype):
    """float_dtype= as a checkpoint names it: the forms a leaf's dtype may take
    (a name, a numpy dtype or scalar type, ml_dtypes', a torch dtype)."""
    return None if dtype is None else _leaves.dtype_name(dtype, "float_dtype")


class CheckpointManager:
    """Saves and restores steps of a training state at `uri`: a directory,
    file:///path, s3://bucket/prefix or mem://name.

        with ckptio.CheckpointManager("/data/ckpt", max_to_keep=3) as mgr:
            step = mgr.latest_step()
            state = mgr.restore(like=state) if step is not None else state
            ...
            mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})

    Options (the C++ ManagerOptions; docs/python.md):
      max_to_keep, keep_every   retention after each commit (None: keep all / none)
      staging                   "copy" (save() copies, then returns) or "borrow" (no copy:
                                keep the arrays unchanged until handle.released())
      staging_budget, chunk_size, max_in_flight, step_format ("run-{step}"), strict
      layout                    "ckptio", or "eformer": saves write zarr v2 as eformer /
                                TensorStore do (docs/format.md section 7); restores read both
      on_commit                 fn(CommitEvent), once per save, with the GIL, on the
                                manager's callbacks' thread
      processes                 dict(index=, count=, run_id=, timeout_seconds=) for a save by
                                several processes (docs/multiprocess.md)
      barrier                   with processes: "torch" (ckptio.TorchBarrier() of the default
                                torch.distributed group), a ckptio.TorchBarrier, or any object
                                with wait(name, timeout_seconds) (docs/python.md)
      direct_io, read_mode, request_size, queue_depth   local disk (ckptio/local.h)
      s3_endpoint, s3_region, s3_profile, s3_part_size, s3_max_connections,
      s3_addressing, s3_anonymous, s3_max_attempts, s3_timeout, s3_payload_signing,
      s3_checksums, s3_sse, s3_sse_kms_key_id, s3_storage_class, s3_access_key_id,
      s3_secret_access_key, s3_session_token
                                S3 (ckptio/s3.h); unset ones follow the AWS conventions
                                (AWS_* variables, ~/.aws), as the CLI does.
    """

    def __init__(self, uri, *, max_to_keep=None, keep_every=None, staging="copy", staging_budget=None,
                 chunk_size=None, max_in_flight=None, step_format="run-{step}", strict=False,
                 on_commit=None, processes=None, direct_io=None, read_mode=None, request_size=None,
                 queue_depth=None, s3_endpoint=None, s3_region=None, s3_profile=None, s3_part_size=None,
                 s3_max_connections=None, s3_addressing=None, s3_anonymous=None, s3_max_attempts=None,
                 s3_timeout=None, s3_payload_signing=None, s3_checksums=None, s3_sse=None, s3_sse_kms_key_id=None,
                 s3_storage_class=None, s3_access_key_id=None, s3_secret_access_key=None,
                 s3_session_token=None, barrier=None, layout="ckptio"):
        if staging not in ("copy", "borrow"):
            raise errors.InvalidArgument(f'staging must be "copy" or "borrow", not {staging!r}')
        if on_commit is not None and not callable(on_commit):
            raise errors.InvalidArgument("on_commit must be callable")
        if layout not in ("ckptio", "eformer"):
            raise errors.InvalidArgument(f'layout must be "ckptio" or "eformer", not {layout!r}')
        manager = {"step_format": step_format, "staging": staging, "strict": bool(strict), "layout": layout}
        _opt(manager, "max_to_keep", max_to_keep)
        _opt(manager, "keep_every", keep_every)
        _opt(manager, "staging_budget", staging_budget)
        _opt(manager, "chunk_size", chunk_size)
        _opt(manager, "max_in_flight", max_in_flight)
        if processes is not None:
            manager["processes"] = dict(processes)
            in_processes = manager["processes"].pop("barrier", None)  # ProcessGroup::barrier, as in C++
            if in_processes is not None and barrier is not None:
                raise errors.InvalidArgument("barrier given twice: as barrier= and in processes=")
            if barrier is None:
                barrier = in_processes
        if barrier is not None:  # a SaveBarrier: ckptio.TorchBarrier, or wait(name, timeout_seconds)
            if isinstance(barrier, str):
                if barrier != "torch":
                    raise errors.InvalidArgument(f'barrier must be "torch" or a barrier object, not {barrier!r}')
                from .distributed import TorchBarrier
                barrier = TorchBarrier()
            manager["barrier"] = barrier
        local = {}
        _opt(local, "direct_io", direct_io)
        _opt(local, "read_mode", read_mode)
        _opt(local, "request_size", request_size)
        _opt(local, "queue_depth", queue_depth)
        s3 = {}
        for key, value in (("endpoint", s3_endpoint), ("region", s3_region), ("profile", s3_profile),
                           ("part_size", s3_part_size), ("max_connections", s3_max_connections),
                           ("addressing", s3_addressing), ("anonymous", s3_anonymous),
                           ("max_attempts", s3_max_attempts), ("timeout_s", s3_timeout),
                           ("payload_signing", s3_payload_signing), ("checksums", s3_checksums),
                           ("sse", s3_sse),
                           ("sse_kms_key_id", s3_sse_kms_key_id), ("storage_class", s3_storage_class),
                           ("access_key_id", s3_access_key_id), ("secret_access_key", s3_secret_access_key),
                           ("session_token", s3_session_token)):
            _opt(s3, key, value)
        self.uri = os.fspath(uri)
        self.staging = staging
        self._on_commit = on_commit
        self._c = _ckptio.Manager(self.uri, manager, local, s3)
        self._notifier = _Notifier()
        self._finalizer = weakref.finalize(self, _shutdown, self._c, self._notifier, os.getpid())

    # ---- lifetime ----------------------------------------------------------------

    def close(self):
        """Waits for every save in flight and its callbacks, then frees the
        manager. Idempotent; later calls of other methods raise FailedPrecondition."""
        self._finalizer()

    @property
    def closed(self):
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<ckptio.CheckpointManager {self.uri!r} staging={self.staging}{' closed' if self.closed else ''}>"

    def _check_open(self):
        if not self._finalizer.alive:
            raise errors.FailedPrecondition(f"the checkpoint manager of {self.uri} is closed")

    # ---- save --------------------------------------------------------------------

    def save(self, step, state, metadata=None, *, overwrite=False, prefix=None, float_dtype=None):
        """Saves `state` (a pytree) as step `step`; returns a SaveHandle once the
        state is staged (copy mode) or planned (borrow mode). Errors in the
        input (bad leaves, a committed step without overwrite) raise here;
        later ones reach the handle, on_commit and the log.

        metadata: a JSON-serializable dict stored in the step's index.
        prefix: None (the state's top-level keys are prefixes) or one prefix
        for the whole state. float_dtype: store float leaves as this dtype."""
        self._check_open()
        step = _args.integer(step, "step")
        try:
            leaves, metadata_json = self._prepare_save(state, metadata, prefix)
            float_name = _dtype_name(float_dtype)
        except BaseException as e:
            # Refused before it reached the manager: counted as a refused
            # save() for a group, so that the others fail this attempt at
            # once and the next save of the step has one attempt id on every
            # process (docs/multiprocess.md).
            self._c.refused_save(step, f"{type(e).__name__}: {e}")
            raise
        c_handle = self._c.save(step, leaves, metadata_json, bool(overwrite), float_name)
        handle = SaveHandle(c_handle, self._notifier, leaves if self.staging == "borrow" else None, self._on_commit)
        self._notifier.submit(handle)
        return handle

    def _prepare_save(self, state, metadata, prefix):
        """save()'s leaves for the binding, and its metadata as JSON."""
        borrow = self.staging == "borrow"
        leaves = []

        def on_leaf(pfx, path, obj, kind):
            if kind == _leaves.SHARDS:  # ckptio.Shards, jax.Array: the shards with replica_id 0
                leaves.append(_shards.save_entry(obj, pfx, path, borrow))
                return
            dtype, array = _leaves.leaf_bytes(obj, kind, f"{pfx}/{path}", borrow)
            leaves.append((pfx, path, dtype, array))

        tree = _tree.flatten(state, prefix, on_leaf, _leaves.leaf_kind)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise errors.InvalidArgument(f"metadata must be a dict (a JSON object), not {type(metadata).__name__}")
        if _tree.TREE_KEY in metadata:
            raise errors.InvalidArgument(f"metadata key {_tree.TREE_KEY!r} is ckptio's own")
        try:
            metadata_json = json.dumps({**metadata, _tree.TREE_KEY: tree}, separators=(",", ":"),
                                       allow_nan=False)
        except (TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"metadata is not JSON-serializable: {e}") from None
        return leaves, metadata_json

    def wait_until_finished(self):
        """Waits for every save so far and its callbacks; raises the first error
        among them (each error is raised once)."""
        self._check_open()
        try:
            self._c.wait_until_finished()
        finally:
            self._notifier.drain()

    def prepare_staging(self, state_bytes):
        """Copy mode: allocates and touches the staging memory a save of
        `state_bytes` uses now, so that the first save() does not pay for it."""
        self._check_open()
        self._c.prepare_staging(_args.integer(state_bytes, "state_bytes", _args.UINT64))

    # ---- discovery -------------------------------------------------------------------

    def latest_step(self):
        """The newest committed step, or None."""
        self._check_open()
        return self._c.latest_step()

    def all_steps(self):
        """Committed steps, ascending."""
        self._check_open()
        return self._c.all_steps()

    def step_dirs(self):
        """Every step directory, committed or not: [{step, name, committed, bytes, committed_unix_ns}]."""
        self._check_open()
        return self._c.list_step_dirs()

    def _index(self, step):
        if step is None:
            step = self._c.latest_step()
            if step is None:
                raise errors.NotFound(f"no committed step at {self.uri}")
        return self._c.read_index(_args.integer(step, "step"))

    def metadata(self, step=None):
        """The metadata dict saved with `step` (default: the latest)."""
        self._check_open()
        md = json.loads(self._index(step)["metadata_json"])
        md.pop(_tree.TREE_KEY, None)
        return md

    def leaves(self, step=None):
        """[LeafInfo] of `step` (default: the latest), as the index lists them."""
        self._check_open()
        return [LeafInfo(*leaf) for leaf in self._index(step)["leaves"]]

    # ---- restore ---------------------------------------------------------------------

    def restore(self, step=None, *, like=None, select=None, into=None, allow_cast=False, float_dtype=None,
                verify=True, prefix=None, info=False, sharding=None, fill_missing_chunks=False):
        """Restores `step`, or with None the newest intact committed step
        (damaged newer ones are skipped with a warning unless strict=True).

        Returns the saved pytree, leaves as numpy arrays (Python scalars
        where Python scalars were saved). With `like` (a pytree of the same
        shape as the state: arrays, tensors, scalars), the result follows
        its structure, with tensors where it holds tensors, and every leaf
        must match its dtype and shape: mismatches raise one FailedPrecondition
        listing all of them (allow_cast=True casts float dtypes instead).
        `into`: a pytree of arrays/tensors to restore into, in place (it is
        also the template when `like` is None); its leaves are the ones
        returned. `select`: a regex on leaf paths (re.search), a list of
        prefixes, or dict(prefixes=[...], regex="..."). info=True returns
        (tree, RestoreInfo).

        sharding: restore into a sharding, dict(mesh=..., rules=[(regex, spec),
        ...], devices=[ids], leaves={"prefix/path": spec}, min_size=16384,
        strict=True, uneven="pad"): every array leaf comes back as a
        ckptio.Shards with one Shard(index, data, replica_id, device) per
        local device (`devices`; default every device of the mesh) and the
        chosen `.spec`. Only the bytes those devices hold are read.
        docs/python.md, "Sharded state (JAX)".

        fill_missing_chunks: eformer / zarr steps only: a chunk the store
        lacks reads as the array's fill_value (zeros when it is null), as
        TensorStore and zarr-python read it, instead of raising DataLoss."""
        self._check_open()
        sharding_opts = None
        if sharding is not None:
            if into is not None:
                raise errors.InvalidArgument("restore: into= and sharding= exclude each other (a sharded "
                                             "restore allocates one array per device)")
            sharding_opts = _shards.restore_options(sharding)
        prefixes, regex = _selection(select)
        template = like if like is not None else into
        expected, like_tree = [], None
        if template is not None:
            seen = set()

            def on_like(pfx, path, obj, kind):
                # Two template leaves that name one saved leaf ({"a.b": x} and
                # {"a": {"b": y}}): refused, as save() refuses them (before,
                # one of two into= arrays was silently left unwritten).
                if (pfx, path) in seen:
                    raise errors.InvalidArgument(f"restore: two leaves of the template name {pfx}/{path}")
                seen.add((pfx, path))
                dtype, shape = _leaves.leaf_spec(obj, kind, f"{pfx}/{path}")
                expected.append((pfx, path, dtype, list(shape)))

            like_tree = _tree.flatten(template, prefix, on_like, _leaves.leaf_kind)
        into_list, into_objs = [], {}
        if into is not None:
            into_specs = {}

            def on_into(pfx, path, obj, kind):
                view = _leaves.writable_view(obj, kind, f"{pfx}/{path}")
                into_list.append((pfx, path, view))
                into_objs[(pfx, path)] = obj
                into_specs[(pfx, path)] = _leaves.leaf_spec(obj, kind, f"{pfx}/{path}")

            _tree.flatten(into, prefix, on_into, _leaves.leaf_kind)
            if like is not None:  # (else on_like above refused them)
                names = [(pfx, path) for pfx, path, _ in into_list]
                if len(set(names)) != len(names):
                    raise errors.InvalidArgument("restore: two leaves of into= name one saved leaf")
            # Destinations that share memory (one array twice, overlapping
            # views) would overwrite each other: before, one leaf's bytes were
            # silently replaced by another's.
            _refuse_shared_memory(into_list)
            # The library fills `into` with the bytes of the dtype `like` asks
            # for: an into leaf of another dtype or shape would get them raw.
            if like is not None:
                differ = [f"{pfx}/{path}: like {dtype}{tuple(shape)}, into {into_specs[(pfx, path)][0]}"
                          f"{tuple(into_specs[(pfx, path)][1])}"
                          for pfx, path, dtype, shape in expected
                          if (pfx, path) in into_specs
                          and (into_specs[(pfx, path)][0], tuple(into_specs[(pfx, path)][1])) != (dtype, tuple(shape))]
                if differ:
                    raise errors.InvalidArgument("restore: like= and into= disagree: " + "; ".join(differ))
        r = self._c.restore(_args.optional_integer(step, "step"), prefixes, regex, expected, bool(allow_cast),
                            _dtype_name(float_dtype), into_list, bool(verify), sharding_opts,
                            bool(fill_missing_chunks))
        restored = {(leaf[0], leaf[1]): leaf[2:] for leaf in r["leaves"]}
        as_kind = _leaves.as_kind if sharding_opts is None else _shards.restored_leaf
        metadata = json.loads(r["metadata_json"]) if r["metadata_json"] else {}
        saved_tree = metadata.pop(_tree.TREE_KEY, None)

        def lookup(pfx, path, kind):
            obj = into_objs.get((pfx, path))
            if obj is not None:
                return obj
            got = restored.get((pfx, path))
            if got is None:
                return _tree.MISSING
            return as_kind(kind, *got)

        if like_tree is not None:
            out = _tree.unflatten(like_tree, lookup)
        elif saved_tree is not None and saved_tree.get("version") == _tree.TREE_VERSION:
            out = _tree.unflatten(saved_tree, lambda p, q, k: lookup(p, q, _leaves.ARRAY if k == _leaves.TENSOR else k))
        else:
            out = _tree.tree_from_paths((pfx, path, as_kind(_leaves.ARRAY, *got))
                                        for (pfx, path), got in restored.items())
        if info:
            return out, RestoreInfo(r["step"], metadata, r["stats"], r["skipped"])
        return out

    # ---- maintenance -------------------------------------------------------------------

    def verify(self, step=None):
        """Reads every byte of `step` (default: the latest) and checks every
        checksum; DataLoss names what is damaged."""
        self._check_open()
        self._c.verify(int(self._index(step)["step"]) if step is None else _args.integer(step, "step"))

    def remove_step(self, step):
        self._check_open()
        self._c.remove_step(_args.integer(step, "step"))

    def apply_retention(self, max_to_keep, keep_every=0):
        self._check_open()
        self._c.apply_retention(_args.integer(max_to_keep, "max_to_keep", _args.INT32),
                               _args.integer(keep_every, "keep_every"))

    def gc(self, min_age_seconds=3600.0):
        """Removes leftovers of failed saves older than min_age_seconds (see
        GcOptions in ckptio/manager.h: 0 is safe only when nothing else saves here)."""
        self._check_open()
        self._c.gc(float(min_age_seconds))


def _refuse_shared_memory(into_list):
    spans = []
    for pfx, path, view in into_list:
        a = np.asarray(view)
        if a.nbytes == 0:
            continue
        start = a.__array_interface__["data"][0]
        spans.append((start, start + a.nbytes, f"{pfx}/{path}"))
    spans.sort()
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise errors.InvalidArgument(f"restore: into= arrays for {n0} and {n1} share memory")


def _selection(select):
    if select is None:
        return [], ""
    if isinstance(select, str):
        return [], select
    def prefix_list(prefixes):
        # One prefix given as a str is that prefix (before, "model" was split
        # into the prefixes "m", "o", "d", "e", "l"); each must be a str.
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        prefixes = list(prefixes or [])
        bad = [p for p in prefixes if not isinstance(p, str)]
        if bad:
            raise errors.InvalidArgument(f"select: prefixes are str, not {bad[0]!r}")
        return prefixes

    if isinstance(select, dict):
        unknown = set(select) - {"prefixes", "regex"}
        if unknown:
            raise errors.InvalidArgument(f"select: unknown keys {sorted(unknown)} (prefixes, regex)")
        regex = select.get("regex") or ""
        if not isinstance(regex, str):
            raise errors.InvalidArgument(f"select: regex is a str, not {regex!r}")
        return prefix_list(select.get("prefixes")), regex
    if isinstance(select, (list, tuple)):
        return prefix_list(select), ""
    raise errors.InvalidArgument("select must be a regex str, a list of prefixes or dict(prefixes=, regex=)")
