"""The evaluator scores with the settings the chief trained with: it resolves the flags left to
the data for the cluster the chief recorded in run.json, not for its own lone machine."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from tests.support import parsed_flags
from trainer import task
from trainer.errors import InputError
from trainer.input.schema import HeadType
from trainer.job import evaluator
from trainer.search import adapt
from trainer.storage import job_dir as job_dir_lib

ROWS = 100_000


def _config(tmp_path):
    args = ["--train_data=x.csv", "--label_column=y", f"--job_dir={tmp_path / 'job'}"]
    with parsed_flags(args) as f:
        return task.build_config(f)


def _data():
    return types.SimpleNamespace(
        train_rows=ROWS,
        schema=types.SimpleNamespace(label=types.SimpleNamespace(head=HeadType.BINARY)),
    )


def _chief_run(tmp_path, config, shape: adapt.Shape, **changes) -> job_dir_lib.JobDir:
    """A job dir whose chief resolved `config` for `shape` (and recorded `changes` on top)."""
    resolved, _ = adapt.resolve(config, ROWS, HeadType.BINARY, shape=shape)
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    (tmp_path / "job").mkdir()
    record = {
        "fingerprint": config.fingerprint(),
        "resolved": {**resolved.fingerprint(), **changes},
        "resolved_for": dataclasses.asdict(shape),
    }
    (tmp_path / "job" / "run.json").write_text(json.dumps(record))
    return job


def test_the_evaluator_of_a_cluster_resolves_as_its_chief_did(tmp_path):
    config = _config(tmp_path)
    cluster = adapt.Shape(one_machine=False, replicas=3)
    job = _chief_run(tmp_path, config, cluster)
    alone, _ = adapt.resolve(config, ROWS, HeadType.BINARY)  # what it resolved before
    chief, _ = adapt.resolve(config, ROWS, HeadType.BINARY, shape=cluster)
    assert alone.train.batch_size != chief.train.batch_size, "the shapes must differ here"
    scored = evaluator.resolved_as_chief(config, job, _data())
    assert scored.train.batch_size == chief.train.batch_size
    assert scored.train.batch_size % 3 == 0
    assert scored.fingerprint() == chief.fingerprint()


def test_settings_that_cannot_be_the_chief_s_are_refused(tmp_path):
    config = _config(tmp_path)
    job = _chief_run(tmp_path, config, adapt.Shape(), batch_size=12345)
    with pytest.raises(InputError, match="batch_size: the chief's 12345, here"):
        evaluator.resolved_as_chief(config, job, _data())


def test_a_job_dir_without_the_record_is_resolved_for_one_machine(tmp_path):
    config = _config(tmp_path)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "run.json").write_text(json.dumps({"fingerprint": config.fingerprint()}))
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    alone, _ = adapt.resolve(config, ROWS, HeadType.BINARY)
    assert evaluator.resolved_as_chief(config, job, _data()).fingerprint() == alone.fingerprint()
