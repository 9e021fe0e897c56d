"""Where the trainer reads and writes: local dirs, `gs://` and Cloud Storage FUSE (`/gcs/`).

- `preflight(...)`: before any data is read or anything written, every output dir is shown to
  be writable (a small probe object is written and deleted) and every input bucket reachable;
  a bad path raises `InputError` naming the path and what to check.
- `retry(...)`: transient storage errors (unavailable, deadline, rate limits) are retried a
  bounded number of times with backoff; used for the metadata a resume depends on.
- `publish_dir(...)`: makes a finished dir visible at its final path so that a crash never
  leaves something that looks complete but is not. A local rename is atomic; on `gs://` and
  `/gcs/` a directory "rename" copies object by object, so there the files are copied with
  the one that marks completeness (`saved_model.pb`) last.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TypeVar

import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.storage.paths import FUSE_ROOT, bucket_of, has_atomic_rename, is_fuse, is_gcs

T = TypeVar("T")

_CHECK = (
    "check the bucket name, that it exists, and the credentials "
    "(GOOGLE_APPLICATION_CREDENTIALS or the job's service account)"
)
TRANSIENT_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.ResourceExhaustedError,
    tf.errors.AbortedError,
)


# -- retries --------------------------------------------------------------------------------
def is_disk_full(error: Exception) -> bool:
    """A local disk with no space left: not transient (Cloud Storage's 429s, also a
    ResourceExhaustedError, are)."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    return isinstance(error, tf.errors.ResourceExhaustedError) and (
        "No space left on device" in (error.message or "")
    )


def retry(fn: Callable[[], T], *, what: str, attempts: int = 4, first_delay: float = 0.5) -> T:
    """Calls `fn`, retrying transient storage errors `attempts - 1` times with doubling
    delays (0.5, 1, 2 s by default); other errors, and the last transient one, propagate.

    Example::

        text = retry(lambda: read_text(path), what=f"reading {path}")
    """
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TRANSIENT_ERRORS as e:
            if attempt == attempts or is_disk_full(e):
                raise
            logging.warning(
                "%s failed (%s: %s); retry %d of %d in %.1f s.",
                what,
                type(e).__name__,
                e.message,
                attempt,
                attempts - 1,
                delay,
            )
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


# -- preflight ------------------------------------------------------------------------------
def check_writable(path: str, *, flag: str) -> None:
    """Writes and deletes a probe object in `path`. Local and `/gcs/` folders are created for
    the probe and removed again if they did not exist: a failed check leaves nothing behind.

    Raises:
        InputError: naming `flag`, `path`, the storage error, and what to check.
    """
    probe = f"{path.rstrip('/')}/.write-probe-{uuid.uuid4().hex[:8]}"
    try:
        retry(
            lambda: _write_probe(path, probe), what=f"writing {probe}", attempts=2, first_delay=0.2
        )
    except tf.errors.OpError as e:
        raise InputError(_storage_message(flag, path, "cannot write to", e)) from None


def _write_probe(path: str, probe: str) -> None:
    if is_gcs(path):
        # Buckets first: TensorFlow's makedirs never returns when the bucket is missing, and
        # Cloud Storage needs no folders before an object is written.
        tf.io.gfile.stat(f"gs://{bucket_of(path)}")
        _write_and_remove(probe)
        return
    # Replicas sharing a job dir probe it at once: a folder one of them made may be removed by
    # it (its check done) while another writes its probe there. Make it again and retry.
    for attempt in range(_PROBE_RACES):
        created = _missing_folders(path)
        try:
            tf.io.gfile.makedirs(path)
            _write_and_remove(probe)
            return
        except (tf.errors.NotFoundError, tf.errors.FailedPreconditionError):
            # (TensorFlow's makedirs says "is not a directory" for a folder removed under it.)
            if attempt == _PROBE_RACES - 1:
                raise
        finally:
            for folder in created:  # deepest first; local or FUSE folders only
                with contextlib.suppress(OSError):
                    os.rmdir(folder)


_PROBE_RACES = 5


def _write_and_remove(probe: str) -> None:
    with tf.io.gfile.GFile(probe, "w") as f:
        f.write("probe\n")
    tf.io.gfile.remove(probe)


def _missing_folders(path: str) -> list[str]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    path = path.rstrip("/")
    while path and not tf.io.gfile.exists(path):
        missing.append(path)
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent == path:
            break
        path = parent
    return missing


def check_readable(pattern_list: str, *, flag: str) -> None:
    """For each `gs://` or `/gcs/` entry of a comma-separated list of files or globs: its
    bucket can be reached. (Missing files are reported by the data reader, with the pattern.)

    Raises:
        InputError: naming `flag`, the bucket, the storage error, and what to check.
    """
    for pattern in [p.strip() for p in pattern_list.split(",") if p.strip()]:
        bucket = bucket_of(pattern)
        if bucket is None:
            continue
        try:
            found = retry(
                functools.partial(_bucket_exists, pattern),
                what=f"reading {pattern}",
                attempts=2,
                first_delay=0.2,
            )
        except tf.errors.OpError as e:
            raise InputError(_storage_message(flag, pattern, "cannot read", e)) from None
        if not found:
            raise InputError(
                f"{flag}: bucket '{bucket}' of {pattern} does not exist or is "
                f"not visible: {_CHECK}."
            )


def _bucket_exists(path: str) -> bool:
    """Whether the bucket of a `gs://` or `/gcs/` path exists; storage errors propagate
    (`isdir` would turn an unreachable server into False)."""
    if is_fuse(path):
        return tf.io.gfile.isdir(f"{FUSE_ROOT}{bucket_of(path)}")
    try:
        tf.io.gfile.stat(f"gs://{bucket_of(path)}")
    except tf.errors.NotFoundError:
        return False
    return True


def preflight(
    *, outputs: Iterable[tuple[str, str]], inputs: Iterable[tuple[str, str | None]]
) -> None:
    """Checks every output dir is writable and every input bucket readable, before any work.

    Args:
        outputs: (flag, dir) pairs; the same dir is probed once.
        inputs: (flag, comma-separated files or globs) pairs; None where not given.
    """
    outputs = list(outputs)
    seen = set()
    for flag, path in outputs:
        if path not in seen:
            seen.add(path)
            check_writable(path, flag=flag)
    for flag, patterns in inputs:
        if patterns:
            check_readable(patterns, flag=flag)
    warning = lost_with_container(outputs)
    if warning:
        logging.warning("%s", warning)


# -- outputs that die with their container --------------------------------------------------
# Files that exist in Docker's and Podman's containers (and in no host's root).
CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")
# The file systems of a container's own root: layers over its image, gone with the container
# (Docker's and Podman's overlay2, rootless Podman's fuse-overlayfs, old Docker's aufs).
_CONTAINER_ROOTS = ("overlay", "fuse.fuse-overlayfs", "aufs")


def lost_with_container(
    outputs: Iterable[tuple[str, str]],
    *,
    markers: Iterable[str] = CONTAINER_MARKERS,
    mountinfo: str = "/proc/self/mountinfo",
) -> str | None:
    """A warning when this process runs in a container and local outputs are on the
    container's own root file system (layers over its image), which goes with the container:
    `gcloud ai custom-jobs local-run` runs `docker run --rm` in `/usr/app`, so a job given no
    `--job_dir` (and no `AIP_MODEL_DIR`) writes `runs/adanet` there and loses it when it
    exits. A folder on a mount of its own (a volume, `-v HOST:PATH`) or in Cloud Storage
    outlives it, and so does a root that is a disk of its own (a VM that carries a container
    marker). None otherwise.
    """
    if not any(os.path.exists(m) for m in markers):
        return None
    try:
        with open(mountinfo) as f:
            mounts = dict(_mount(line) for line in f)
    except OSError:
        return None
    if mounts.get("/") not in _CONTAINER_ROOTS:
        return None
    lost: dict[str, list[str]] = {}
    for flag, path in outputs:
        if is_gcs(path) or is_fuse(path):
            continue
        absolute = os.path.realpath(path)
        point = max((m for m in mounts if _under(absolute, m)), key=len, default="/")
        if point == "/":
            lost.setdefault(absolute, []).append(flag)
    if not lost:
        return None
    where = "; ".join(f"{', '.join(flags)}: {path}" for path, flags in lost.items())
    return (
        f"This process runs in a container, and its outputs go to the container's own "
        f"file system ({where}): they are lost when the container is removed (as `gcloud ai "
        "custom-jobs local-run` removes its container when the job ends). Fix: pass "
        "--job_dir=gs://BUCKET/PATH, or a folder mounted from the host (docker run -v)."
    )


def _mount(line: str) -> tuple[str, str]:
    """(mount point, file system type) of a /proc/self/mountinfo line: field 5 (spaces escaped
    as \\040), and the first field after the " - " separator."""
    fields, _, after = line.partition(" - ")
    point = fields.split()[4].replace("\\040", " ") if len(fields.split()) > 4 else "/"
    return point, (after.split() or [""])[0]


def _under(path: str, mount_point: str) -> bool:
    return mount_point == "/" or path == mount_point or path.startswith(mount_point + "/")


def _storage_message(flag: str, path: str, action: str, error: tf.errors.OpError) -> str:
    detail = error.message.strip().splitlines()[0] if error.message else type(error).__name__
    if isinstance(error, tf.errors.NotFoundError):
        cause = "the bucket or folder does not exist"
    elif isinstance(error, tf.errors.PermissionDeniedError):
        cause = "permission denied"
    elif isinstance(error, TRANSIENT_ERRORS) or "HTTP request" in detail:
        cause = "storage cannot be reached"
    else:
        cause = type(error).__name__
    where = f" (bucket '{bucket_of(path)}')" if bucket_of(path) else ""
    hint = _CHECK if bucket_of(path) else "check that the folder can be created and written"
    return f"{flag}: {action} {path}{where}: {cause} ({detail}). Fix: {hint}."


# -- publishing a directory -----------------------------------------------------------------
def publish_dir(
    temp: str, final: str, *, complete_marker: str, atomic_rename: bool | None = None
) -> None:
    """Moves the finished dir `temp` to `final`; `final/complete_marker` appears last.

    Locally one atomic rename. On `gs://` and `/gcs/`, where a directory rename is a copy of
    each object, every file is copied with `complete_marker` copied last, then `temp` is
    deleted: a crash leaves `final` without its marker (which readers treat as absent) and a
    `temp` that `remove_leftovers` deletes. Locally `final` must not exist (or be empty).

    Args:
        atomic_rename: None decides from the path (`has_atomic_rename`); False forces the copy.
    """
    if has_atomic_rename(final) if atomic_rename is None else atomic_rename:
        if os.path.isdir(final) and not os.listdir(final):
            os.rmdir(final)  # an empty dir (made by hand, or by a probe) is no model
        tf.io.gfile.rename(temp, final)
        return
    files = sorted(_relative_files(temp))
    if complete_marker not in files:
        raise ValueError(f"{temp} has no {complete_marker}: nothing to publish.")
    for name in [f for f in files if f != complete_marker] + [complete_marker]:
        target = f"{final}/{name}"
        tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
        retry(
            functools.partial(tf.io.gfile.copy, f"{temp}/{name}", target, overwrite=True),
            what=f"copying to {target}",
        )
    tf.io.gfile.rmtree(temp)


def _relative_files(root: str) -> Iterable[str]:
    for folder, _, files in tf.io.gfile.walk(root):
        relative = folder[len(root) :].strip("/")
        for name in files:
            yield f"{relative}/{name}" if relative else name
