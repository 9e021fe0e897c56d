"""What a batch prediction writes, as Vertex AI lays it out: `prediction.results-0000N-of-0000M`
(one `{"instance" or "key": ..., "prediction": ...}` per line, `Writer`) and
`prediction.errors_stats-00000-of-00001` (`error_record`) in `prediction-<model>-<time>/`,
which appears only when complete (`Output`); `read_results` reads such a dir back."""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import logging
import os
import socket
import time
import uuid

import tensorflow as tf

from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.cloud import storage
from deploy.serving.explain import Explainer
from deploy.serving.instances import Predictor

INVALID_ARGUMENT = 3  # google.rpc.Code, as Vertex writes it in errors_stats


def error_record(where: str, instance, reason: str) -> dict:
    return {
        "instance": instance,
        "error": {"code": INVALID_ARGUMENT, "message": f"{where}: {reason}"},
    }


def timestamp() -> str:
    """Vertex's directory timestamp: 2026_11_22T00_23_28_776Z."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y_%m_%dT%H_%M_%S_") + f"{now.microsecond // 1000:03d}Z"


def error_json(where: str, instance, reason: str, *, text: str) -> str:
    """The errors file's line for a bad instance; one nested almost as deeply as the parser
    allows (which writing it back, a few calls deeper, does not) is given as its `text`."""
    try:
        return json.dumps(error_record(where, instance, reason))
    except RecursionError:
        return json.dumps(error_record(where, text, reason))


# -- the output dir --------------------------------------------------------------------------
_TEMP = ".tmp-"  # starts the name of a run's temporary dir


_LOCK = ".lock"  # in a local temporary dir: locked by its run for as long as it lives


_LEFTOVER_AFTER_S = 3600  # a temporary dir no lock vouches for, unchanged this long, is dead


_BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: one kernel's run, one per boot


class Output:
    """Results files written as batches come, under a temporary dir; `publish` puts them in
    place as one directory (local: a rename) or file by file with the errors file last (Cloud
    Storage).

    A run killed before it publishes (SIGKILL, a lost machine) leaves its temporary dir; the
    next run with the same output prefix removes it (`_remove_leftovers`). Locally each run
    holds a lock on a file in its dir, which the kernel releases when the run dies however it
    dies, so a dir whose lock is free is dead and one whose lock is held is left alone. Only
    the kernel that holds a lock is sure to see it, so the lock file names its machine (host,
    boot, pid): a dir made on another machine (an output prefix on NFS or a /gcs/ mount shared
    by several) is removed once nothing in it changed for an hour, as are those on Cloud
    Storage, where a file only appears when it is closed, at publish: a run killed before
    leaves nothing there, one killed while it copies leaves its files.
    """

    def __init__(self, output_prefix: str, model_name: str, num_shards: int):
        prefix = output_prefix.rstrip("/")
        name = f"prediction-{model_name}-{timestamp()}"
        self.final_dir = f"{prefix}/{name}"
        self.temp_dir = f"{prefix}/{_TEMP}{name}-{uuid.uuid4().hex[:8]}"
        _remove_leftovers(prefix)
        self._lock: int | None = None
        if not storage.is_gcs(prefix):  # Cloud Storage has no directories to make or lock
            os.makedirs(self.temp_dir)
            self._lock = _hold_lock(self.temp_dir)
        self.names = [f"prediction.results-{k:05d}-of-{num_shards:05d}" for k in range(num_shards)]
        self.error_name = "prediction.errors_stats-00000-of-00001"
        self._files = [tf.io.gfile.GFile(f"{self.temp_dir}/{n}", "wb") for n in self.names]
        self._errors = tf.io.gfile.GFile(f"{self.temp_dir}/{self.error_name}", "wb")
        for f in self._files + [self._errors]:
            f.write(b"")  # an untouched GFile on gs:// is never uploaded: files may be empty
        self.results = self.errors = 0

    def add_results(self, index: int, lines: bytes, count: int) -> None:
        if count:
            self._files[index % len(self._files)].write(lines)
            self.results += count

    def add_errors(self, lines: list[str]) -> None:
        if lines:
            self._errors.write("".join(line + "\n" for line in lines).encode())
            self.errors += len(lines)

    def publish(self) -> tuple[tuple[str, ...], str]:
        for f in self._files + [self._errors]:
            f.close()
        if storage.is_gcs(self.temp_dir):
            for name in self.names + [self.error_name]:
                tf.io.gfile.copy(f"{self.temp_dir}/{name}", f"{self.final_dir}/{name}")
        else:
            os.remove(f"{self.temp_dir}/{_LOCK}")  # still held: the dir is not taken for dead
            os.rename(self.temp_dir, self.final_dir)
        return (
            tuple(f"{self.final_dir}/{n}" for n in self.names),
            f"{self.final_dir}/{self.error_name}",
        )

    def discard(self) -> None:
        """Deletes the temporary dir (after a publish, or a failure)."""
        for f in self._files + [self._errors]:
            f.close()
        if tf.io.gfile.exists(self.temp_dir):
            tf.io.gfile.rmtree(self.temp_dir)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _hold_lock(directory: str) -> int:
    """Locks `directory` for this process: the descriptor of its `_LOCK` file, locked, which
    names this machine and process (`_lock_owner`). The file is locked and written before it
    takes its name, so no run ever finds it unlocked or unnamed while this one lives."""
    path = f"{directory}/{_LOCK}-{os.getpid()}"
    lock = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.write(lock, json.dumps(_lock_owner()).encode())
    os.rename(path, f"{directory}/{_LOCK}")
    return lock


def _lock_owner() -> dict:
    """Who holds a lock: the host, the boot of its kernel (two machines may share a host
    name) and the process."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:  # not Linux: the host name alone
        boot = ""
    return {"host": socket.gethostname(), "boot": boot, "pid": os.getpid()}


def _made_here(owner: bytes) -> bool:
    """Whether a lock file holding `owner` was made on this machine (by this kernel, which
    sees its lock)."""
    try:
        made = json.loads(owner)
    except ValueError:  # empty or unreadable: made by no run of this version
        return False
    here = _lock_owner()
    return isinstance(made, dict) and all(made.get(k) == here[k] for k in ("host", "boot"))


def _remove_leftovers(prefix: str) -> None:
    """Removes the temporary dirs under `prefix` that runs killed before they published left
    (see `Output`), naming each on the log."""
    for temp in tf.io.gfile.glob(f"{prefix}/{_TEMP}prediction-*"):
        if _is_dead(temp):
            try:
                tf.io.gfile.rmtree(temp)
            except tf.errors.NotFoundError:  # another run removed it first
                continue
            logging.warning("removed %s, left by a batch prediction that was killed", temp)


def _is_held(lock: int) -> bool:
    """Whether another open file holds the lock on the file open as `lock` (a run alive)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False  # and now held by `lock`, until it is closed


def _is_dead(temp: str) -> bool:
    """Whether no run writes to the temporary dir `temp` any more: its lock, made on this
    machine, is free; or, with no lock to ask (Cloud Storage, a dir made on another machine,
    or a local run killed in the instant between making its dir and locking it), nothing in
    it changed for `_LEFTOVER_AFTER_S`."""
    if not storage.is_gcs(temp):
        try:
            lock = os.open(f"{temp}/{_LOCK}", os.O_RDONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                if _made_here(os.read(lock, 4096)):
                    return not _is_held(lock)
            finally:
                os.close(lock)
    try:
        paths = [temp, *(f"{temp}/{name}" for name in tf.io.gfile.listdir(temp))]
        changed = max(tf.io.gfile.stat(path).mtime_nsec for path in paths)
    except tf.errors.NotFoundError:  # removed meanwhile (by its run, publishing, or another)
        return False
    return time.time_ns() - changed > _LEFTOVER_AFTER_S * 1e9


def read_results(output_dir: str) -> tuple[list[dict], list[dict]]:
    """(result records, error records) of a batch prediction output directory."""
    results = read_records(f"{output_dir}/prediction.results-*")
    errors = read_records(f"{output_dir}/prediction.errors_stats-*")
    return results, errors


def read_records(pattern: str) -> list[dict]:
    try:
        files = storage.expand([pattern])
    except FileNotFoundError:
        return []
    return [
        json.loads(line)
        for f in files
        for line in storage.read_bytes(f).decode().split("\n")
        if line.strip()
    ]


@dataclasses.dataclass(frozen=True)
class Writer:
    """The result lines of checked instances and their keys: predicted, and explained too
    where there is an explainer."""

    predictor: Predictor
    config: InstanceConfig
    explainer: Explainer | None = None

    def __call__(self, instances: list[dict], keys: list) -> bytes:
        if not instances:
            return b""
        if self.explainer is None:
            predictions = self.predictor.predict_checked(instances)
            explanations: list = [None] * len(instances)
        else:
            predictions, explanations = self.explainer.explain(instances)
        lines = []
        for instance, prediction, key, explanation in zip(
            instances, predictions, keys, explanations
        ):
            line = self.config.outputs(instance, prediction, key)
            if explanation is not None:
                line["explanation"] = explanation
            lines.append(json.dumps(line) + "\n")
        return "".join(lines).encode()
