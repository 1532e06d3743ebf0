"""The CLI's maintenance commands as functions: ckptio.cp, ckptio.verify,
ckptio.inspect and ckptio.gc do what `ckptio cp|verify|inspect|gc` do
(docs/cli.md) and return what their --json prints, as Python objects.

Storage options are CheckpointManager's keyword arguments (direct_io,
read_mode, request_size, queue_depth, s3_endpoint, s3_region, ...; unset S3
ones follow the AWS conventions). The GIL is released for the whole of each
call; an on_progress callback runs on the calling thread, with the GIL.
Errors raise the ckptio.Error of their status code with the C++ message.
"""

import json

from . import _args, _ckptio, _tree, errors

_LOCAL_KEYS = ("direct_io", "read_mode", "request_size", "queue_depth")
# keyword -> key of S3Options (ckptio/s3.h), as CheckpointManager spells them
_S3_KEYS = {"s3_endpoint": "endpoint", "s3_region": "region", "s3_profile": "profile",
            "s3_part_size": "part_size", "s3_max_connections": "max_connections",
            "s3_addressing": "addressing", "s3_anonymous": "anonymous", "s3_max_attempts": "max_attempts",
            "s3_timeout": "timeout_s", "s3_payload_signing": "payload_signing", "s3_checksums": "checksums",
            "s3_sse": "sse",
            "s3_sse_kms_key_id": "sse_kms_key_id", "s3_storage_class": "storage_class",
            "s3_access_key_id": "access_key_id", "s3_secret_access_key": "secret_access_key",
            "s3_session_token": "session_token"}


def _storage(options, what):
    """CheckpointManager's storage keywords -> (local dict, s3 dict)."""
    local, s3 = {}, {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _LOCAL_KEYS:
            local[key] = value
        elif key in _S3_KEYS:
            s3[_S3_KEYS[key]] = value
        else:
            raise errors.InvalidArgument(f"{what}: unknown option {key!r} (storage options are "
                                         f"{', '.join(_LOCAL_KEYS + tuple(_S3_KEYS))})")
    return local, s3


def _error(pair, **attrs):
    code, message = pair
    e = errors.BY_CODE.get(code, errors.Internal)(message)
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


def cp(src_uri, dst_uri, step=None, *, all=False, overwrite=False, skip_identical=False,  # noqa: A002
       step_format="run-{step}", dst_step_format=None, format=None, zstd_level=1,  # noqa: A002
       chunk_size=None, max_memory=None, on_progress=None, src_options=None, dst_options=None, **options):
    """Copies committed step `step` (None: the latest) of src_uri to dst_uri,
    or every committed step with all=True (oldest first; steps already at
    the destination with the same contents are skipped), checking every
    shard's checksum as it streams and committing each step at the
    destination as atomically as a save (include/ckptio/copy.h).

    Returns [{step, skipped, bytes, files, shards, bytes_in_place,
    data_seconds, commit_seconds, seconds}], one per step copied or skipped
    (bytes_in_place: read in place from the page cache, not copied). On failure
    raises the ckptio.Error, whose `.steps` lists the steps done before it.

    format: the destination's layout: None (the source's), "ckptio" or
    "eformer" (zarr v2 as eformer / TensorStore write it; zstd_level for its
    chunks, default 1); a copy into another layout decodes and encodes every
    leaf, bit-exact (docs/format.md section 7), as `ckptio cp --format`.
    step_format / dst_step_format: step directory names at the source and
    (if different) the destination.
    overwrite: replace steps committed at the destination. skip_identical:
    leave a step the destination already holds unchanged (implied by all).
    chunk_size / max_memory: request size and bound on the copy's buffers
    (bytes; defaults 8 MiB / 256 MiB). on_progress(step, done_bytes,
    total_bytes): on this thread; what it raises stops the copy (nothing of
    that step is committed) and is raised here. Storage keywords apply to
    both ends; src_options / dst_options (dicts of the same keywords) add
    to them for one end."""
    if all and step is not None:
        raise errors.InvalidArgument("cp: pass either step or all=True, not both")
    if on_progress is not None and not callable(on_progress):
        raise errors.InvalidArgument("cp: on_progress must be callable")
    src_local, src_s3 = _storage({**options, **(src_options or {})}, "cp")
    dst_local, dst_s3 = _storage({**options, **(dst_options or {})}, "cp")
    r = _ckptio.cp(str(src_uri), str(dst_uri), _args.optional_integer(step, "cp: step"), bool(all),
                   bool(overwrite), bool(skip_identical), step_format, dst_step_format or step_format,
                   format or "", _args.integer(zstd_level, "cp: zstd_level", _args.INT32),
                   _args.integer(chunk_size or 0, "cp: chunk_size", _args.UINT64),
                   _args.integer(max_memory or 0, "cp: max_memory", _args.UINT64), src_local, src_s3, dst_local, dst_s3,
                   on_progress)
    if r["error"] is not None:
        raise _error(r["error"], steps=r["steps"])
    return r["steps"]


def verify(uri, step=None, *, all=False, raise_on_error=True, step_format="run-{step}",  # noqa: A002
           on_progress=None, **options):
    """Reads every byte of a committed step and checks every checksum:
    `step`, or (None) the newest committed step, also when its index is
    damaged; all=True: every committed step.

    Returns {step, ok, bytes, seconds, error} (a list of them with all=True),
    `error` None or the ckptio.Error found. With raise_on_error (the
    default), the first error is raised instead once every step is checked,
    its `.results` holding them all. on_progress(step, done_bytes,
    total_bytes) runs on this thread; if it raises, verification still
    runs to its end (without calling it again) and then its exception is
    raised."""
    if all and step is not None:
        raise errors.InvalidArgument("verify: pass either step or all=True, not both")
    if on_progress is not None and not callable(on_progress):
        raise errors.InvalidArgument("verify: on_progress must be callable")
    local, s3 = _storage(options, "verify")
    r = _ckptio.verify(str(uri), _args.optional_integer(step, "verify: step"), bool(all), step_format, local, s3,
                       on_progress)
    if r["error"] is not None:
        raise _error(r["error"])
    results = []
    for one in r["results"]:
        one = dict(one)
        if one["error"] is not None:
            one["error"] = _error(one["error"], step=one["step"])
        results.append(one)
    if raise_on_error:
        for one in results:
            if one["error"] is not None:
                one["error"].results = results if all else results[0]
                raise one["error"]
    return results if all else results[0]


def inspect(uri, step=None, *, step_format="run-{step}", strict=False, **options):
    """The index of committed step `step` (None: the latest): {step, path,
    bytes, created_at, committed_at (ISO 8601, UTC), created_unix_ns,
    committed_unix_ns, metadata (the dict saved with the step), files:
    [{name, bytes}], leaves: [{prefix, path, dtype, shape, bytes, shards}]}.
    Reads only the index."""
    local, s3 = _storage(options, "inspect")
    d = _ckptio.inspect(str(uri), _args.optional_integer(step, "inspect: step"), step_format, bool(strict), local, s3)
    text = d.pop("metadata_json")
    try:
        metadata = json.loads(text) if text else {}
    except ValueError:
        metadata = text
    if isinstance(metadata, dict):
        metadata.pop(_tree.TREE_KEY, None)
    d["metadata"] = metadata
    return d


def gc(uri, *, keep_last=0, keep_every=0, min_age_seconds=3600.0, step_format="run-{step}", **options):
    """Applies retention (keep_last > 0: keep the newest keep_last committed
    steps, and those divisible by keep_every; keep_every alone is refused),
    then removes temporaries and
    leftovers of failed saves that have not changed for min_age_seconds (a
    save in progress elsewhere looks like a leftover until it commits: 0 is
    safe only when nothing saves to `uri`).

    Returns {removed: [{step, name, committed, bytes, path}], freed_bytes,
    kept_steps}. On failure raises the ckptio.Error, whose `.result` holds
    what was removed before it."""
    local, s3 = _storage(options, "gc")
    r = _ckptio.gc(str(uri), _args.integer(keep_last, "gc: keep_last", _args.INT32),
                   _args.integer(keep_every, "gc: keep_every"), float(min_age_seconds), step_format, local, s3)
    error = r.pop("error")
    if error is not None:
        raise _error(error, result=r)
    return r
