"""A job dir moved to another path (a bucket's runs moved, a folder renamed) still owns the
model it exported: issue 43 found model.json recording the old absolute path, and the job
refused its own model, telling the user to delete it."""

from __future__ import annotations

import json
import shutil

import pytest

from trainer.errors import InputError
from trainer.storage import job_dir as job_dir_lib

SOURCE = {"iterations": 1, "chosen": "grow_linear"}


def _job_with_model(root) -> job_dir_lib.JobDir:
    job = job_dir_lib.JobDir(str(root))
    job.create()
    (root / "model").mkdir()
    (root / "model" / job_dir_lib.MODEL_MARKER).write_bytes(b"a SavedModel")
    (root / "run.json").write_text("{}")
    return job


def test_a_moved_job_dir_owns_its_model(tmp_path):
    job = _job_with_model(tmp_path / "a" / "job")
    job.stamp_model(SOURCE)
    assert json.loads((tmp_path / "a" / "job" / "model.json").read_text())["model_dir"] == "model"
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = job_dir_lib.JobDir(str(tmp_path / "b" / "job"))
    moved.check_model_dir()
    assert moved.exported_from() == SOURCE


def test_a_stamp_of_an_absolute_path_from_before_moves_too(tmp_path):
    job = _job_with_model(tmp_path / "a" / "job")
    stamp = {"model_dir": str(tmp_path / "a" / "job" / "model"), "source": SOURCE}
    (tmp_path / "a" / "job" / "model.json").write_text(json.dumps(stamp))
    assert job.exported_from() == SOURCE
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = job_dir_lib.JobDir(str(tmp_path / "b" / "job"))
    moved.check_model_dir()
    assert moved.exported_from() == SOURCE


def test_a_model_dir_of_its_own_is_still_told_from_another_jobs(tmp_path):
    job = _job_with_model(tmp_path / "job")
    elsewhere = {"model_dir": str(tmp_path / "other" / "place"), "source": SOURCE}
    (tmp_path / "job" / "model.json").write_text(json.dumps(elsewhere))
    with pytest.raises(InputError, match="holds a model this job did not export"):
        job.check_model_dir()
    assert job.exported_from() is None
