"""Checkpoint save and resume on gs:// against a local dir, for the census model.

Run from the repo root (needs the test extra: the GCS emulator and mitmproxy)::

    .venv/bin/python bench/storage.py [--repeats=5] [--out=bench/results]

Builds iteration 0 of the default search on the census data exactly as `Trainer` does
(`trainer.task` flags with no arguments), trains it for a few steps so that every variable and
optimizer slot exists, then times, in each of a local temporary dir and `gs://` (TensorFlow's
own GCS client through the test proxy to gcp-storage-emulator on loopback, see `tests/gcs.py`):

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

import tensorflow as tf  # noqa: E402

from tests.gcs import running_gcs  # noqa: E402
from tests.support import parsed_flags  # noqa: E402
from trainer import ensemble as ens  # noqa: E402
from trainer import job_dir as job_dir_lib  # noqa: E402
from trainer import task, training  # noqa: E402
from trainer.iteration import Iteration  # noqa: E402
from trainer.model import IterationContext  # noqa: E402
from trainer.model.subnetwork import propose  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train_steps", type=int, default=20)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    return p.parse_args(argv)


def census_iteration() -> tuple[training.Trainer, Iteration]:
    """Iteration 0 of the default search on census, built as `Trainer.run_iteration` does."""
    with parsed_flags([]):
        config = task.build_config()
    job = job_dir_lib.JobDir(tempfile.mkdtemp(prefix="bench-storage-job-"))
    inputs = training.load_inputs(config, job)
    trainer = training.Trainer(config, inputs, job)
    search = config.search
    builders = propose(search.generator, IterationContext(0, ()))
    specs = ens.candidate_specs(search.strategies, [b.name for b in builders],
                                has_previous=False)
    iteration = Iteration(number=0, head=trainer.head, input_dim=trainer.input_dim,
                          seed=config.seed, builders=builders, specs=specs,
                          ensemblers=search.ensemblers, previous=None, options=config.train,
                          strategy=trainer.strategy)
    return trainer, iteration


def write_metadata(job: job_dir_lib.JobDir, trainer: training.Trainer) -> None:
    """The files a resume reads, with the census run's real contents."""
    job.create()
    job_dir_lib.write_atomically(job.schema, trainer.inputs.schema.to_json())
    job_dir_lib.write_json(job.run, {"fingerprint": trainer.config.fingerprint()})
    job_dir_lib.write_json(job.record_path(0), {"iteration": 0, "architecture": {}})


def read_metadata(job: job_dir_lib.JobDir) -> None:
    job_dir_lib.read_json(job.run)
    job_dir_lib.read_text(job.schema)
    assert len(job.records()) == 1


def time_it(fn, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def measure(root: str, trainer: training.Trainer, iteration: Iteration,
            repeats: int) -> dict:
    job = job_dir_lib.JobDir(root)
    write_metadata(job, trainer)
    checkpoint = iteration.checkpoint()
    manager = tf.train.CheckpointManager(checkpoint, job.iteration_checkpoints(0),
                                         max_to_keep=1)
    save = time_it(lambda: manager.save(checkpoint_number=int(iteration.step.numpy())),
                   repeats)

    def restore():
        latest = tf.train.CheckpointManager(checkpoint, job.iteration_checkpoints(0),
                                            max_to_keep=1).latest_checkpoint
        checkpoint.restore(latest).assert_existing_objects_matched()

    restored = time_it(restore, repeats)
    metadata = time_it(lambda: read_metadata(job), repeats)
    size = sum(tf.io.gfile.stat(p).length
               for p in tf.io.gfile.glob(manager.latest_checkpoint + "*"))
    return {"root": root, "checkpoint_bytes": size,
            "save_s": statistics.median(save), "restore_s": statistics.median(restored),
            "resume_metadata_s": statistics.median(metadata),
            "samples": {"save": save, "restore": restored, "metadata": metadata}}


def main(argv=None) -> None:
    args = parse_args(argv)
    with running_gcs() as gcs:
        os.environ.update(gcs.env())  # before this process's first gs:// access
        bucket = gcs.new_bucket("bench")
        trainer, iteration = census_iteration()
        iterator = iter(training.train_dataset(
            trainer.x_train, trainer.inputs.train.labels,
            batch_size=trainer.config.train.batch_size, seed=1))
        iteration.train(iterator, args.train_steps)
        results = {
            "what": "checkpoint save / restore of census iteration 0 (default search)",
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "tensorflow": tf.__version__},
            "gcs_route": "TensorFlow GCS client -> mitmproxy (TLS) -> gcp-storage-emulator, "
                         "all on loopback",
            "emulator_startup_s": gcs.startup_seconds,
            "repeats": args.repeats,
            "local": measure(tempfile.mkdtemp(prefix="bench-storage-"), trainer, iteration,
                             args.repeats),
            "gcs": measure(f"gs://{bucket}/job", trainer, iteration, args.repeats),
        }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "storage.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))


def table(results: dict) -> str:
    local, gcs = results["local"], results["gcs"]
    rows = [("checkpoint save", "save_s"), ("checkpoint restore", "restore_s"),
            ("resume metadata read", "resume_metadata_s")]
    lines = [f"census iteration 0 checkpoint: {local['checkpoint_bytes'] / 1e6:.2f} MB, "
             f"median of {results['repeats']}",
             f"{'':24}{'local':>10}{'gs://':>10}"]
    for name, key in rows:
        lines.append(f"{name:24}{local[key] * 1e3:>8.1f}ms{gcs[key] * 1e3:>8.1f}ms")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
