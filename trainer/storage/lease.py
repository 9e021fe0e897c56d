"""One writer per job dir: the process that writes it (the chief, or the one machine) holds a
lease, `JOB_DIR/lease.json`, for the whole run. The cluster's other replicas write nothing
there but through the chief, so they share its lease and take none.

The lease names its holder (its Vertex AI job and trial, host, boot, process, start) and is
rewritten every `BEAT_SECS` (the heartbeat). A second trainer on the same job dir:
- refuses in one line naming the holder, while the holder is alive: two writers of one job dir
  would each train the whole job and then overwrite each other's checkpoints;
- takes the lease over, saying why, where the holder cannot be writing any more: the same
  Vertex AI job (and trial) restarted after a preemption or a failure; a process of this
  machine that is gone (killed, crashed) or of an earlier boot; a holder whose heartbeat is over
  `STALE_SECS` old (its machine is gone); a lease file that cannot be read.
It never waits: a trainer that waited for another run of the same job would then find that
job finished, or resume it, either of which the user can do by running the command again.

Taking and replacing the lease are atomic where the job dir is: on local disk a complete file
is linked into place (a link fails when the name exists), and a take-over happens under an
`flock` of the job dir itself (of `lease.json.lock` where a file system cannot lock a folder,
NFS: that file is then left in place); on Cloud Storage (`gs://`, and `/gcs/` mounts through
the same objects) by generation preconditions: created only where no object is, replaced or
deleted only where the generation is the one read. A holder whose heartbeat finds the lease
taken over, or that could not renew it for `STALE_SECS - 2 * BEAT_SECS` (another trainer may
take it over soon), stops at once (exit 1, one line): the new holder resumes from what was
finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid

from absl import logging

from trainer.errors import InputError, first_line
from trainer.storage.paths import as_gcs, is_fuse, is_gcs, join, split_gcs

NAME = "lease.json"
BEAT_SECS = 20.0
STALE_SECS = 120.0  # six missed heartbeats: a holder this quiet is gone
# An unreadable lease younger than this may be one another trainer is writing (where a file
# system has no hard links, a lease is created empty, then written).
_BEING_WRITTEN_SECS = 10.0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease."""

    owner: str  # this run's own id
    job: str  # the Vertex AI job (and trial) id; "" outside Vertex AI
    host: str
    boot: str  # the kernel's boot id: a process id means nothing across reboots
    pid: int
    since: str  # when the lease was taken (UTC, ISO 8601)
    # The process id's namespace (a container's own) and the process's start (clock ticks
    # after boot): a pid seen alive is the holder only where both match ("": unknown).
    pid_space: str = ""
    started: str = ""

    @classmethod
    def here(cls, job: str) -> Holder:
        since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        pid = os.getpid()
        return cls(
            uuid.uuid4().hex,
            job,
            socket.gethostname(),
            _boot_id(),
            pid,
            since,
            _pid_space(),
            _started(pid),
        )

    @classmethod
    def of(cls, document: dict) -> Holder:
        return cls(
            **{
                f.name: document[f.name]
                if f.default is dataclasses.MISSING
                else document.get(f.name, f.default)
                for f in dataclasses.fields(cls)
            }
        )

    def text(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=2).encode()

    def described(self) -> str:
        job = f", Vertex AI job {self.job}" if self.job else ""
        return f"process {self.pid} on {self.host}{job}, since {self.since}"


def take(job_dir: str, *, job: str = "") -> Lease:
    """The lease of `job_dir` for this process, taken or taken over (see the module's
    docstring); InputError naming the holder when another live trainer holds it, or the
    storage error when the lease cannot be read or written."""
    try:
        return _take(job_dir, job)
    except (InputError, KeyboardInterrupt):
        raise
    except Exception as e:  # OSError, or Cloud Storage's (credentials, permissions, network)
        detail = str(e).splitlines()[0][:300] if str(e) else "no detail"
        raise InputError(
            f"--job_dir {job_dir}: cannot take its lease, {join(job_dir, NAME)} "
            f"({type(e).__name__}: {detail}). Check the path and the credentials "
            "(GOOGLE_APPLICATION_CREDENTIALS or the job's service account)."
        ) from None


def _take(job_dir: str, job: str) -> Lease:
    me = Holder.here(job)
    store = (
        _GcsStore(as_gcs(join(job_dir, NAME)))
        if is_gcs(job_dir) or is_fuse(job_dir)
        else (_LocalStore(join(job_dir, NAME)))
    )
    for _ in range(5):  # each failed try lost a race to a trainer that has since written
        if store.create(me.text()):
            return Lease(store, me)
        found = store.read()
        if found is None:
            continue  # released between the two calls
        document, age, version = found
        holder = _holder(document)
        why = _why_taken_over(holder, age, me)
        if why is None:
            described = holder.described() if holder else "its lease is being written"
            raise InputError(
                f"--job_dir {job_dir} is being written by another trainer ({described}"
                f", last heartbeat {age:.0f} s ago): two trainers on one job dir would each "
                "train the whole job and overwrite each other's checkpoints. Wait for it to "
                "end, or stop it, then run this command again to resume; or give another "
                f"--job_dir. (A lease with no heartbeat for {STALE_SECS:.0f} s is taken over.)"
            )
        if store.replace(me.text(), version):
            logging.warning("Took over the lease of --job_dir %s: %s.", job_dir, why)
            return Lease(store, me)
    raise InputError(
        f"--job_dir {job_dir}: could not take its lease ({store.path}): other trainers keep "
        "taking it. Run one trainer per job dir."
    )


class Lease:
    """A lease held: its heartbeat runs in a daemon thread until `release`."""

    def __init__(self, store: _LocalStore | _GcsStore, me: Holder):
        self._store, self._me = store, me
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="job-dir-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease, if it is still this run's (a lease that
        cannot be deleted is said, not raised: the next trainer takes it over)."""
        self._stopped.set()
        self._thread.join()
        try:
            self._store.delete_if(self._me.owner)
        except Exception as e:  # OSError, or Cloud Storage's: the run's work is done
            logging.warning(
                "The job dir's lease %s could not be deleted (%s); the next trainer on this "
                "job dir takes it over.",
                self._store.path,
                first_line(e),
            )

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _beat(self) -> None:
        renewed = time.monotonic()
        while not self._stopped.wait(BEAT_SECS):
            try:
                kept = self._store.renew(self._me.text(), self._me.owner)
            except Exception as e:  # a storage hiccup: the next beat tries again
                quiet = time.monotonic() - renewed
                if quiet < STALE_SECS - 2 * BEAT_SECS:
                    logging.warning("The job dir lease's heartbeat failed (%s); retrying.", e)
                    continue
                self._stop(
                    f"could not renew the lease of this job dir ({self._store.path}) for "
                    f"{quiet:.0f} s (last: {e}); another trainer may take it over after "
                    f"{STALE_SECS:.0f} s"
                )
            if kept:
                renewed = time.monotonic()
            else:
                self._stop(
                    f"another trainer took over the lease of this job dir ({self._store.path}) "
                    f"after {STALE_SECS:.0f} s without a heartbeat from this one"
                )

    def _stop(self, why: str) -> None:
        if self._stopped.is_set():
            return  # released meanwhile: the run has ended
        print(
            f"error: {why}: stopping, so that one writer remains (a run of the same command "
            "resumes from what was finished).",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def _holder(document: bytes | None) -> Holder | None:
    try:
        return Holder.of(json.loads(document or b""))
    except (ValueError, KeyError, TypeError):
        return None


def _why_taken_over(holder: Holder | None, age: float, me: Holder) -> str | None:
    """Why the lease `holder` holds (its heartbeat `age` seconds old) is taken over; None
    while that holder may still be writing."""
    if holder is None and age < _BEING_WRITTEN_SECS:
        return None  # another trainer's, created a moment ago and being written
    if holder is None:
        return "its lease file could not be read (a damaged or partial write)"
    if me.job and holder.job == me.job:
        return f"the same Vertex AI job ({me.job}), restarted"
    if holder.host == me.host and holder.boot != me.boot:
        return f"its holder ({holder.described()}) ran before this machine restarted"
    if holder.host == me.host and _ended(holder, me):
        return f"its holder ({holder.described()}) has ended"
    if age > STALE_SECS:
        return f"its holder ({holder.described()}) gave no heartbeat for {age:.0f} s"
    return None


def _ended(holder: Holder, me: Holder) -> bool:
    """Whether `holder`, of this machine and boot, has ended (False: unknown, or alive)."""
    if holder.pid_space and me.pid_space and holder.pid_space != me.pid_space:
        return False  # another container's process id: its heartbeat decides
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        pass
    started = _started(holder.pid)
    # The id alive, but of a later process (a restarted container's pid 1, say): reused.
    return bool(holder.started and started and started != holder.started)


def _pid_space() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _started(pid: int) -> str:
    """The process's start, in clock ticks after boot ("" where /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # After the command name (which may hold spaces and parentheses), field 22.
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class _LocalStore:
    """The lease as a file on local disk (or a shared file system with `flock`)."""

    def __init__(self, path: str):
        self.path = path
        self._folder = os.path.dirname(path) or "."

    def create(self, text: bytes) -> bool:
        """False: the lease exists, or the folder vanished meanwhile (another trainer, ending
        before it wrote anything, removed it); the caller reads, then tries again."""
        os.makedirs(self._folder, exist_ok=True)
        try:
            temp = self._complete(text)
        except FileNotFoundError:
            return False
        try:
            os.link(temp, self.path)  # fails if the name exists: the file appears whole
            return True
        except (FileExistsError, FileNotFoundError):
            return False
        except OSError:  # a file system without hard links: created exclusively, then written
            return self._create_exclusively(text)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)

    def _create_exclusively(self, text: bytes) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except (FileExistsError, FileNotFoundError):
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        return True

    def read(self) -> tuple[bytes, float, object] | None:
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                return f.read(), time.time() - stat.st_mtime, (stat.st_ino, stat.st_mtime_ns)
        except FileNotFoundError:
            return None

    def replace(self, text: bytes, version: object) -> bool:
        """Replaces the lease read as `version`; False if it changed since."""
        with self._locked():
            found = self.read()
            if found is None or found[2] != version:
                return False
            os.replace(self._complete(text), self.path)
            return True

    def renew(self, text: bytes, owner: str) -> bool:
        with self._locked():
            found = self.read()
            if found is None or _owner(found[0]) != owner:
                return False
            os.replace(self._complete(text), self.path)
            return True

    def delete_if(self, owner: str) -> None:
        with self._locked():
            found = self.read()
            if found is None or _owner(found[0]) != owner:
                return
            os.remove(self.path)
        with contextlib.suppress(OSError):  # a run that wrote nothing leaves no folder behind
            os.rmdir(self._folder)  # fails unless empty

    def _complete(self, text: bytes) -> str:
        temp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(temp, "wb") as f:
            f.write(text)
        return temp

    @contextlib.contextmanager
    def _locked(self):
        """An exclusive `flock` of the lease's folder; of a lock file beside the lease where
        folders cannot be locked (NFS), left in place: deleting it would let two trainers lock
        two files of one name."""
        folder = os.open(self._folder, os.O_RDONLY)
        try:
            try:
                fcntl.flock(folder, fcntl.LOCK_EX)
            except OSError:
                with open(self.path + ".lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    yield
                return
            yield
        finally:
            os.close(folder)


class _GcsStore:
    """The lease as a Cloud Storage object, changed only under generation preconditions."""

    def __init__(self, uri: str):
        self.path = uri
        bucket, name = split_gcs(uri)
        self._blob = _client().bucket(bucket).blob(name)

    def create(self, text: bytes) -> bool:
        from google.api_core import exceptions

        try:
            self._blob.upload_from_string(text, if_generation_match=0)
            return True
        except exceptions.PreconditionFailed:
            return self._written(text)

    def _written(self, text: bytes) -> bool:
        """Whether the lease is `text`'s owner's after a write refused by its precondition:
        the client retries an upload whose answer was lost, and the retry finds its own
        first attempt."""
        found = self.read()
        return found is not None and _owner(found[0]) == _owner(text)

    def read(self) -> tuple[bytes, float, object] | None:
        from google.api_core import exceptions

        try:
            self._blob.reload()
            generation, updated = self._blob.generation, self._blob.updated
            text = self._blob.download_as_bytes(if_generation_match=generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return None
        return text, time.time() - updated.timestamp(), generation

    def replace(self, text: bytes, version: object) -> bool:
        from google.api_core import exceptions

        try:
            self._blob.upload_from_string(text, if_generation_match=version)
            return True
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return self._written(text)

    def renew(self, text: bytes, owner: str) -> bool:
        found = self.read()
        return found is not None and _owner(found[0]) == owner and self.replace(text, found[2])

    def delete_if(self, owner: str) -> None:
        from google.api_core import exceptions

        found = self.read()
        if found is not None and _owner(found[0]) == owner:
            with contextlib.suppress(exceptions.PreconditionFailed, exceptions.NotFound):
                self._blob.delete(if_generation_match=found[2])


def _owner(text: bytes) -> str | None:
    holder = _holder(text)
    return holder.owner if holder else None


def _client():
    from google.cloud import storage  # type: ignore[attr-defined]  # a namespace package

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    return storage.Client()
