"""Checkpoint save and resume on gs:// against a local dir, for the census model.

Run from the repo root (needs the test extra: the GCS emulator and mitmproxy)::

    .venv/bin/python bench/storage.py [--repeats=5] [--out=bench/results]

Builds iteration 0 of the default search on the census data exactly as the controller does
(`trainer.search.factory.Models`, `trainer.task` flags with no arguments), trains it for a few steps
so that every variable and optimizer slot exists, then times, in each of a local temporary dir
and `gs://` (TensorFlow's own GCS client through the test proxy to gcp-storage-emulator on
loopback, see `tests/gcs.py`):

  save      `CheckpointManager.save()` of the running iteration, as the periodic checkpoint
  restore   finding the latest checkpoint and `Checkpoint.restore()` into the same objects,
            as a resumed iteration does
  metadata  what a resume reads before that: run.json, schema.json, the iteration records

The emulator runs on this machine, so gs:// here is the cost of TensorFlow's GCS client (one
HTTPS request per object operation, each through a TLS-terminating proxy), not of the network
to a real bucket. Figures (median of --repeats, and every sample) go to `storage.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tests.gcs import running_gcs
from tests.support import minimal_record, parsed_flags
from trainer import task
from trainer.config import RunConfig
from trainer.input.job_input import JobInput
from trainer.job import job as job_lib
from trainer.search import record as record_lib
from trainer.search.factory import Models
from trainer.search.iteration import Iteration
from trainer.storage import job_dir as job_dir_lib


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train_steps", type=int, default=20)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    return p.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Census:
    config: RunConfig
    data: JobInput


def census_iteration() -> tuple[Census, Iteration]:
    """Iteration 0 of the default search on census, built as the controller builds it."""
    with parsed_flags([]):
        config = task.build_config()
    job = job_dir_lib.JobDir(tempfile.mkdtemp(prefix="bench-storage-job-"))
    data = job_lib.prepare_input(config, job)
    models = Models(config, data.schema)
    return Census(config, data), models.iteration(models.search.propose(0, []), None)


def write_metadata(job: job_dir_lib.JobDir, census: Census) -> None:
    """The files a resume reads, with the census run's real contents (a minimal record)."""
    job.create()
    job_dir_lib.write_atomically(job.schema, census.data.schema.to_json())
    job_dir_lib.write_json(job.run, {"fingerprint": census.config.fingerprint()})
    record = minimal_record(0)
    job_dir_lib.write_json(job.record_path(0), record.to_json())


def read_metadata(job: job_dir_lib.JobDir) -> None:
    job_dir_lib.read_json(job.run)
    job_dir_lib.read_text(job.schema)
    assert len(record_lib.finished(job)) == 1


def time_it(fn, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def measure(root: str, census: Census, iteration: Iteration, repeats: int) -> dict:
    job = job_dir_lib.JobDir(root)
    write_metadata(job, census)
    checkpoint = iteration.checkpoint()
    manager = tf.train.CheckpointManager(checkpoint, job.iteration_checkpoints(0), max_to_keep=1)
    save = time_it(lambda: manager.save(checkpoint_number=int(iteration.step.numpy())), repeats)

    def restore():
        latest = tf.train.CheckpointManager(
            checkpoint, job.iteration_checkpoints(0), max_to_keep=1
        ).latest_checkpoint
        checkpoint.restore(latest).assert_existing_objects_matched()

    restored = time_it(restore, repeats)
    metadata = time_it(lambda: read_metadata(job), repeats)
    size = sum(
        tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(manager.latest_checkpoint + "*")
    )
    return {
        "root": root,
        "checkpoint_bytes": size,
        "save_s": statistics.median(save),
        "restore_s": statistics.median(restored),
        "resume_metadata_s": statistics.median(metadata),
        "samples": {"save": save, "restore": restored, "metadata": metadata},
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    with running_gcs() as gcs:
        os.environ.update(gcs.env())  # before this process's first gs:// access
        bucket = gcs.new_bucket("bench")
        census, iteration = census_iteration()
        iterator = iter(
            census.data.training(
                readers=1, shard=None, batch_size=census.config.train.batch_size, seed=1
            )
        )
        iteration.train(iterator, args.train_steps)
        results = {
            "what": "checkpoint save / restore of census iteration 0 (default search)",
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "tensorflow": tf.__version__,
            },
            "gcs_route": "TensorFlow GCS client -> mitmproxy (TLS) -> gcp-storage-emulator, "
            "all on loopback",
            "emulator_startup_s": gcs.startup_seconds,
            "repeats": args.repeats,
            "local": measure(
                tempfile.mkdtemp(prefix="bench-storage-"), census, iteration, args.repeats
            ),
            "gcs": measure(f"gs://{bucket}/job", census, iteration, args.repeats),
        }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "storage.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))


def table(results: dict) -> str:
    local, gcs = results["local"], results["gcs"]
    rows = [
        ("checkpoint save", "save_s"),
        ("checkpoint restore", "restore_s"),
        ("resume metadata read", "resume_metadata_s"),
    ]
    lines = [
        f"census iteration 0 checkpoint: {local['checkpoint_bytes'] / 1e6:.2f} MB, "
        f"median of {results['repeats']}",
        f"{'':24}{'local':>10}{'gs://':>10}",
    ]
    for name, key in rows:
        lines.append(f"{name:24}{local[key] * 1e3:>8.1f}ms{gcs[key] * 1e3:>8.1f}ms")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
