"""The census data as the benchmarks use it: encoded as the trainer encodes it, as arrays, and
batches of them through the default strategy as the local train loop is fed."""

from __future__ import annotations

import tempfile

import numpy as np
import tensorflow as tf

from trainer.config import RunConfig
from trainer.input.job_input import JobInput
from trainer.job import job as job_lib
from trainer.storage import job_dir as job_dir_lib


def census_input(config: RunConfig, job_dir: str | None = None) -> JobInput:
    """The job's input (the census data by default): scanned unless `job_dir` holds a
    schema."""
    job = job_dir_lib.JobDir(job_dir or tempfile.mkdtemp(prefix="bench-census-"))
    return job_lib.prepare_input(config, job)


def arrays(dataset: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """(dense features, labels) of one pass of an encoded dataset (no embedded columns)."""
    parts = [(features["dense"].numpy(), labels.numpy()) for features, labels in dataset]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
    """Endless shuffled batches of the arrays, through the default strategy (the same seed
    gives the same batches)."""
    rows = len(x)
    dataset = (
        tf.data.Dataset.range(rows)
        .shuffle(rows, seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(lambda i: ({"dense": tf.gather(x, i)}, tf.gather(y, i)))
        .prefetch(tf.data.AUTOTUNE)
    )
    return iter(tf.distribute.get_strategy().experimental_distribute_dataset(dataset))
