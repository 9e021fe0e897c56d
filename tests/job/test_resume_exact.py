"""A resume is exact or refused (issue 28, findings 1 and 2): the exported model is always the
final ensemble's, a changed input or column choice is refused naming what changed, and a model
dir that cannot hold the model alone is refused before any work. Tiny jobs, trained in this
process (`run_in_process`)."""

from __future__ import annotations

import gzip
import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.support import (
    HEADER,
    load_report,
    predict_csv,
    run_in_process,
    synthetic_rows,
    write_csv,
)

TINY = ["--max_iteration_steps=30", "--batch_size=32", "--steps_per_loop=10", "--bags=1"]


def _args(train, job, *extra) -> list[str]:
    return [f"--train_data={train}", "--label_column=target", f"--job_dir={job}", *TINY, *extra]


def _train(args: list[str]) -> str:
    code, stderr = run_in_process(args)
    assert code == 0, stderr[-3000:]
    return stderr


def _refused(args: list[str]) -> str:
    code, stderr = run_in_process(args)
    assert code == 2, stderr[-3000:]
    return stderr


@pytest.fixture
def data(tmp_path):
    return write_csv(tmp_path / "train.csv", HEADER, synthetic_rows("binary", 400, 1))


# -- finding 1: the export is the final ensemble's ------------------------------------------------
@pytest.mark.slow
def test_a_grown_resume_exports_the_grown_ensemble_and_reports_its_metrics(tmp_path):
    train = write_csv(tmp_path / "train.csv", HEADER, synthetic_rows("binary", 400, 1))
    test = write_csv(tmp_path / "test.csv", HEADER, synthetic_rows("binary", 300, 2))
    job = tmp_path / "job"
    args = _args(train, job, f"--eval_data={test}", "--force_grow")
    _train([*args, "--max_iterations=1"])
    assert json.loads((job / "model.json").read_text())["source"]["iterations"] == 1
    _train([*args, "--max_iterations=2"])
    stamp = json.loads((job / "model.json").read_text())
    report = load_report(job)
    assert stamp["model_dir"] == "model"
    assert stamp["source"] == {
        "iterations": 2,
        "chosen": report["iterations"][1]["chosen"],
        "calibration": "temperature",  # the export's settings: other ones export again
        "decision_objective": "",
    }
    fitted = {k: v for k, v in report["calibration"].items() if k != "eval"}
    assert stamp["calibration"] == fitted  # what the export was fitted with
    # The model in model/ is iteration 1's: two members, and the report's metrics are its own.
    members = report["architecture"]["members"]
    assert len(members) == 2
    model = tf.saved_model.load(str(job / "model"))
    assert len(model.members) == 2
    outputs, targets = predict_csv(job / "model", test)
    classes = [c.decode() for c in outputs["classes"].numpy()]
    accuracy = float(np.mean(np.array(classes) == np.array(targets)))
    assert accuracy == pytest.approx(report["final"]["metrics"]["accuracy"], abs=1e-6)
    assert report["status"] == "complete"


@pytest.mark.slow
def test_a_model_without_its_stamp_is_exported_again(tmp_path, data):
    """What a crash between the model's publish and its stamp leaves (or a job dir of a
    version without stamps): the next run exports it again, whatever it holds."""
    job = tmp_path / "job"
    _train([*_args(data, job), "--max_iterations=1"])
    (job / "model.json").unlink()
    before = (job / "model" / "saved_model.pb").stat().st_ino
    _train([*_args(data, job), "--max_iterations=1"])
    # A new file: the new export is saved before the old one is removed.
    assert (job / "model" / "saved_model.pb").stat().st_ino != before
    assert json.loads((job / "model.json").read_text())["source"]["iterations"] == 1


# -- finding 2: changed inputs and choices are refused ------------------------------------------
@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--label_column=color", "label_column: was 'target', now 'color'"),
        ("--ignore_columns=x2", "ignore_columns: was [], now ['x2']"),
        ("--categorical_columns=x1", "categorical_columns: was [], now ['x1']"),
        ("--head=multiclass", "head: was 'auto', now 'multiclass'"),
        ("--num_bins=8", "num_bins: was 32, now 8"),
        ("--embedding_dim=4", "embedding_dim: was 16, now 4"),
        (
            "--learn_mixture_weights --mixture_learning_rate=0.1",
            "mixture_learning_rate: was None, now 0.1",
        ),
    ],
)
def test_a_resume_with_other_column_choices_is_refused_naming_them(tmp_path, data, flag, expected):
    from tests.support import parsed_flags
    from trainer import config as config_lib
    from trainer import task
    from trainer.errors import InputError
    from trainer.storage import job_dir as job_dir_lib

    job = tmp_path / "job"

    def config(*extra):
        with parsed_flags(_args(data, job, *extra)) as flags:
            return task.build_config(flags)

    started = job_dir_lib.JobDir(str(job))
    started.create()
    job_dir_lib.write_json(started.run, {"fingerprint": config().fingerprint()})
    config_lib.check_resumable(config(), started)
    with pytest.raises(InputError) as refused:
        config_lib.check_resumable(config(*flag.split()), started)
    assert expected in str(refused.value) and "new --job_dir" in str(refused.value)


@pytest.mark.slow
def test_a_resume_with_another_label_is_refused_end_to_end(tmp_path, data):
    job = tmp_path / "job"
    _train([*_args(data, job), "--max_iterations=1"])
    stderr = _refused([*_args(data, job), "--max_iterations=2", "--label_column=color"])
    assert "label_column: was 'target', now 'color'" in stderr
    assert len(load_report(job)["iterations"]) == 1


def _swap_columns(path) -> None:
    """Rewrites the file in place with x1 and x2 swapped in every row: other contents, the
    same size (a size check alone would miss it)."""
    lines = path.read_bytes().split(b"\n")
    swapped = [lines[0]] + [
        b",".join([f[1], f[0], *f[2:]]) if len(f := line.split(b",")) > 1 else line
        for line in lines[1:]
    ]
    path.write_bytes(b"\n".join(swapped))


@pytest.mark.slow
def test_a_training_file_rewritten_in_place_is_refused(tmp_path, data):
    job = tmp_path / "job"
    _train([*_args(data, job), "--max_iterations=1"])
    size = data.stat().st_size
    _swap_columns(data)
    assert data.stat().st_size == size
    stderr = _refused([*_args(data, job), "--max_iterations=2"])
    assert f"--train_data: {data} changed since the job in this --job_dir started" in stderr
    assert "new --job_dir" in stderr


@pytest.mark.slow
def test_same_size_other_bytes_is_refused_and_same_bytes_newer_time_resumes(tmp_path):
    rows = synthetic_rows("binary", 400, 1)
    data = tmp_path / "train.csv.gz"
    data.write_bytes(
        gzip.compress(("\n".join(",".join(r) for r in [HEADER, *rows]) + "\n").encode())
    )
    job = tmp_path / "job"
    _train([*_args(data, job), "--max_iterations=1"])
    original = data.read_bytes()
    # A copy of the same bytes (a package installed again): a new time, the same contents.
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    _train([*_args(data, job), "--max_iterations=1"])
    # The same size, other bytes (one byte of the gzip header's time field changed).
    changed = bytearray(original)
    changed[4] ^= 0xFF
    data.write_bytes(bytes(changed))
    stderr = _refused([*_args(data, job), "--max_iterations=1"])
    assert "its bytes are not those the job scanned" in stderr


@pytest.mark.slow
def test_an_eval_file_that_grew_is_refused(tmp_path, data):
    test = write_csv(tmp_path / "test.csv", HEADER, synthetic_rows("binary", 100, 2))
    job = tmp_path / "job"
    _train([*_args(data, job, f"--eval_data={test}"), "--max_iterations=1"])
    with open(test, "a") as f:
        f.write("0.1,0.2,red,yes\n")
    stderr = _refused([*_args(data, job, f"--eval_data={test}"), "--max_iterations=1"])
    assert (
        f"--eval_data: {test} changed since" in stderr and "bytes when the job scanned it" in stderr
    )


# -- the model dir: refused before any work --------------------------------------------------------
@pytest.mark.slow
def test_a_model_dir_that_cannot_hold_the_model_alone_is_refused_before_any_work(tmp_path, data):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    foreign = tmp_path / "foreign"
    _train([*_args(data, tmp_path / "other-job"), "--max_iterations=1", f"--model_dir={foreign}"])
    job = tmp_path / "job"
    for model_dir, expected in (
        (busy, "holds files that are not a SavedModel's (notes.txt)"),
        (job, f"is --job_dir {job} or holds it"),
        (tmp_path, f"is --job_dir {job} or holds it"),
        (foreign, "holds a model this job did not export"),
    ):
        stderr = _refused([*_args(data, job), "--max_iterations=1", f"--model_dir={model_dir}"])
        assert expected in stderr, stderr[-2000:]
        assert not job.exists()
    assert (busy / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "busy",
        "foreign",
        "other-job",
        "train.csv",
    ]  # no temporary model left anywhere


@pytest.mark.slow
def test_a_resumed_job_given_another_runs_model_dir_is_refused_and_leaves_it(tmp_path, data):
    """Before: the resume passed the check (its job dir exists), found no export of its own
    there, and replaced the other run's model with its own."""
    foreign = tmp_path / "foreign"
    _train([*_args(data, tmp_path / "other-job"), "--max_iterations=1", f"--model_dir={foreign}"])
    job = tmp_path / "job"
    _train([*_args(data, job), "--max_iterations=1"])
    before = (foreign / "saved_model.pb").read_bytes()
    stderr = _refused([*_args(data, job), "--max_iterations=1", f"--model_dir={foreign}"])
    assert f"holds a model this job did not export (its own is in {job / 'model'}" in stderr
    assert (foreign / "saved_model.pb").read_bytes() == before
