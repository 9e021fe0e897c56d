"""Cloud Storage: every path on `gs://` (TensorFlow's own GCS client against a local emulator,
see `tests/gcs.py`), `/gcs/` FUSE-style paths, Vertex AI's AIP_* dirs, and clear errors for
bad paths before training starts. What landed in a bucket is checked with
google-cloud-storage, straight from the emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests.support import FAST_FLAGS, REPO, minimal_record, run_in_process, run_task, task_env
from trainer.distribute.environment import Environment
from trainer.errors import InputError
from trainer.search import record as record_lib
from trainer.storage import files as storage
from trainer.storage import job_dir as job_dir_lib
from trainer.storage import paths


# -- fast: the metadata a resume reads, on gs:// ---------------------------------------------
def test_job_state_round_trips_on_gcs_and_crash_leftovers_are_removed(gcs, bucket):
    job = job_dir_lib.JobDir(f"gs://{bucket}/job")
    job.create()
    assert not job.exists() and record_lib.finished(job) == []
    job_dir_lib.write_json(job.run, {"fingerprint": {"seed": 1}})
    job_dir_lib.write_json(job.record_path(0), minimal_record(0).to_json())
    rewritten = minimal_record(0, steps=20)
    job_dir_lib.write_json(job.record_path(0), rewritten.to_json())
    job_dir_lib.write_json(job.record_path(2), minimal_record(2).to_json())  # after a gap
    # What a crash between write and rename leaves behind:
    with tf.io.gfile.GFile(job.record_path(1) + ".tmp-deadbeef", "w") as f:
        f.write('{"iteration": 1, "trunc')

    assert job.exists()
    assert record_lib.finished(job) == [rewritten]
    job.remove_leftovers()
    names = gcs.object_names(bucket)
    assert "job/checkpoints/iteration-0.json" in names and "job/run.json" in names
    assert not [n for n in names if ".tmp-" in n]
    blob = gcs.client().bucket(bucket).blob("job/checkpoints/iteration-0.json")
    assert json.loads(blob.download_as_text()) == rewritten.to_json()


def test_publish_on_gcs_copies_the_marker_last_and_a_partial_model_is_not_a_model(gcs, bucket):
    job = job_dir_lib.JobDir(f"gs://{bucket}/job")
    job.create()
    temp = job.model_temp()
    for name, text in [
        ("saved_model.pb", "graph"),
        ("fingerprint.pb", "f"),
        ("variables/variables.index", "i"),
        ("variables/variables.data-00000-of-00001", "d"),
    ]:
        with tf.io.gfile.GFile(f"{temp}/{name}", "w") as f:
            f.write(text)
    # A crash in mid-publish: everything but the marker was copied.
    tf.io.gfile.makedirs(f"{job.model}/variables")
    tf.io.gfile.copy(f"{temp}/variables/variables.index", f"{job.model}/variables/variables.index")
    assert not job.has_model()
    job.remove_leftovers()  # the next run's start: temp dir and partial model are gone
    assert not [n for n in gcs.object_names(bucket) if ".tmp-" in n or "variables." in n]

    temp = job.model_temp()
    for name in ("saved_model.pb", "variables/variables.index"):
        with tf.io.gfile.GFile(f"{temp}/{name}", "w") as f:
            f.write(name)
    storage.publish_dir(temp, job.model, complete_marker="saved_model.pb")
    assert job.has_model()
    blobs = {b.name: b for b in gcs.client().list_blobs(bucket, prefix="job/model")}
    assert {"job/model/saved_model.pb", "job/model/variables/variables.index"} <= set(blobs)
    assert not [n for n in gcs.object_names(bucket) if ".tmp-" in n]
    marker = blobs.pop("job/model/saved_model.pb")
    assert all(marker.time_created >= b.time_created for b in blobs.values())


def test_publish_without_atomic_rename_copies_into_a_local_folder(tmp_path):
    """What /gcs/ FUSE paths get: the copy, marker last, temp removed."""
    temp, final = tmp_path / "model.tmp-1", tmp_path / "model"
    (temp / "variables").mkdir(parents=True)
    (temp / "saved_model.pb").write_text("graph")
    (temp / "variables" / "variables.index").write_text("index")
    storage.publish_dir(
        str(temp), str(final), complete_marker="saved_model.pb", atomic_rename=False
    )
    assert (final / "saved_model.pb").read_text() == "graph"
    assert (final / "variables" / "variables.index").read_text() == "index"
    assert not temp.exists()
    with pytest.raises(ValueError, match="no saved_model.pb"):
        (tmp_path / "empty.tmp-2").mkdir()
        storage.publish_dir(
            str(tmp_path / "empty.tmp-2"),
            str(tmp_path / "m2"),
            complete_marker="saved_model.pb",
            atomic_rename=False,
        )


@pytest.mark.parametrize(
    "path, bucket, fuse, atomic",
    [
        ("gs://my-bucket/runs/a", "my-bucket", False, False),
        ("gs://my-bucket", "my-bucket", False, False),
        ("/gcs/my-bucket/runs/a", "my-bucket", True, False),
        ("/tmp/gcs/runs", None, False, True),
        ("runs/adanet", None, False, True),
    ],
)
def test_paths_are_classified(path, bucket, fuse, atomic):
    assert paths.bucket_of(path) == bucket
    assert paths.is_fuse(path) is fuse
    assert paths.has_atomic_rename(path) is atomic


# -- retries ---------------------------------------------------------------------------------
def _failing(errors: list[Exception], value="ok"):
    calls = []

    def fn():
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return value

    return fn, calls


def test_transient_errors_are_retried_then_succeed():
    fn, calls = _failing(
        [
            tf.errors.UnavailableError(None, None, "503"),
            tf.errors.DeadlineExceededError(None, None, "slow"),
        ]
    )
    assert storage.retry(fn, what="reading x", first_delay=0.01) == "ok"
    assert len(calls) == 3


def test_retries_are_bounded_and_other_errors_are_not_retried():
    fn, calls = _failing([tf.errors.ResourceExhaustedError(None, None, "429")] * 5)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        storage.retry(fn, what="reading x", attempts=3, first_delay=0.01)
    assert len(calls) == 3
    fn, calls = _failing([tf.errors.NotFoundError(None, None, "gone")])
    with pytest.raises(tf.errors.NotFoundError):
        storage.retry(fn, what="reading x", first_delay=0.01)
    assert len(calls) == 1


# -- where outputs go: flags, AIP_*, defaults ------------------------------------------------
AIP = {
    "AIP_MODEL_DIR": "gs://b/base/model/",
    "AIP_CHECKPOINT_DIR": "gs://b/base/checkpoints/",
    "AIP_TENSORBOARD_LOG_DIR": "gs://b/base/logs/",
}


@pytest.mark.parametrize(
    "flags, environ, expected",
    [
        (
            {},
            {},
            ("runs/adanet", "runs/adanet/model", "runs/adanet/checkpoints", "runs/adanet/logs"),
        ),
        (
            {},
            AIP,
            (
                "gs://b/base/checkpoints/",
                "gs://b/base/model/",
                "gs://b/base/checkpoints/",
                "gs://b/base/logs/",
            ),
        ),
        (
            {"job_dir": "gs://c/j"},
            AIP,
            ("gs://c/j", "gs://c/j/model", "gs://c/j/checkpoints", "gs://c/j/logs"),
        ),
        (
            {"model_dir": "/gcs/m/x"},
            AIP,
            (
                "gs://b/base/checkpoints/",
                "/gcs/m/x",
                "gs://b/base/checkpoints/",
                "gs://b/base/logs/",
            ),
        ),
        (
            {"job_dir": "j", "log_dir": "gs://t/logs"},
            {},
            ("j", "j/model", "j/checkpoints", "gs://t/logs"),
        ),
    ],
)
def test_output_dirs_come_from_flags_then_vertex_then_defaults(flags, environ, expected):
    env = Environment.from_environ(environ)
    outputs = paths.OutputDirs.resolve(
        **flags,
        aip_model_dir=env.model_dir,
        aip_checkpoint_dir=env.checkpoint_dir,
        aip_log_dir=env.log_dir,
    )
    assert (outputs.job_dir, outputs.model_dir, outputs.checkpoint_dir, outputs.log_dir) == expected


# -- bad paths: a clear error before training starts -----------------------------------------
def _data_flags(data) -> list[str]:
    return [
        f"--train_data={data.train}",
        f"--eval_data={data.eval}",
        "--label_column=target",
        *FAST_FLAGS,
    ]


def test_a_bucket_that_does_not_exist_stops_before_any_work(gcs, binary_data):
    code, stderr = run_in_process(
        _data_flags(binary_data) + ["--job_dir=gs://no-such-bucket-4a7/job"]
    )
    assert code == 2
    assert "gs://no-such-bucket-4a7/job" in stderr and "no-such-bucket-4a7" in stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS" in stderr and "does not exist" in stderr


def test_data_in_a_bucket_that_does_not_exist_is_named(gcs, binary_data, tmp_path):
    code, stderr = run_in_process(
        [
            "--train_data=gs://no-such-data-4a7/train-*.csv",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            *FAST_FLAGS,
        ]
    )
    assert code == 2
    assert "--train_data" in stderr and "no-such-data-4a7" in stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS" in stderr
    assert not (tmp_path / "job" / "run.json").exists()


def test_a_gcs_fuse_bucket_that_is_not_mounted_is_named(binary_data, tmp_path):
    with pytest.raises(InputError, match="bucket 'not-mounted-4a7'.*credentials"):
        storage.check_readable("/gcs/not-mounted-4a7/train.csv", flag="--train_data")


def test_a_local_path_that_cannot_be_written_is_named(binary_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, stderr = run_in_process(
        _data_flags(binary_data) + [f"--job_dir={tmp_path}/job", f"--model_dir={blocker}/model"]
    )
    assert code == 2
    assert "--model_dir" in stderr and f"{blocker}/model" in stderr
    assert not (tmp_path / "job" / "run.json").exists()


@pytest.mark.slow
def test_storage_that_cannot_be_reached_exits_2_with_what_to_check(gcs, binary_data, bucket):
    env = gcs.env(task_env())
    env["https_proxy"] = env["HTTPS_PROXY"] = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    result = run_task(
        _data_flags(binary_data) + [f"--job_dir=gs://{bucket}/job"], env=env, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"gs://{bucket}/job" in result.stderr and "cannot be reached" in result.stderr
    assert "GOOGLE_APPLICATION_CREDENTIALS" in result.stderr
    assert time.monotonic() - started < 90
    assert gcs.object_names(bucket) == []


def _closed_port() -> int:
    from tests.gcs import free_port

    return free_port()  # nothing listens there once the probe socket is closed


# -- end to end (slow): training, reload, SIGKILL and resume, all on gs:// ---------------------
@pytest.mark.slow
def test_training_with_every_output_on_gcs_from_vertex_dirs_then_predict(gcs, bucket, binary_data):
    """No --job_dir: the AIP_* dirs Vertex AI sets, all on gs://; the data on gs:// too."""
    for local, name in [(binary_data.train, "train.csv"), (binary_data.eval, "eval.csv")]:
        tf.io.gfile.copy(str(local), f"gs://{bucket}/data/{name}")
    base = f"gs://{bucket}/vertex/run-1"
    env = gcs.env(task_env())
    env.update(
        AIP_MODEL_DIR=f"{base}/model/",
        AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
        AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/",
    )
    result = run_task(
        [
            f"--train_data=gs://{bucket}/data/train.csv",
            f"--eval_data=gs://{bucket}/data/eval.csv",
            "--label_column=target",
            *FAST_FLAGS,
        ],
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    names = gcs.object_names(bucket, prefix="vertex/run-1/")
    prefix = "vertex/run-1/"
    for expected in [
        "model/saved_model.pb",
        "model/variables/variables.index",
        "checkpoints/report.json",
        "checkpoints/run.json",
        "checkpoints/schema.json",
        "checkpoints/iteration-0.json",
        "checkpoints/iteration-1.json",
    ]:
        assert prefix + expected in names, (expected, names)
    assert [n for n in names if n.startswith(prefix + "logs/") and "tfevents" in n]
    assert [n for n in names if n.startswith(prefix + "checkpoints/frozen-1/")]
    assert not [n for n in names if ".tmp-" in n or ".write-probe-" in n]
    blob = gcs.client().bucket(bucket).blob(prefix + "checkpoints/report.json")
    report = json.loads(blob.download_as_text())
    assert report["status"] == "complete" and report["model_dir"] == f"{base}/model"

    serve = tf.saved_model.load(f"{base}/model").signatures["serving_default"]
    out = serve(
        x1=tf.constant([2.0, -2.0]), x2=tf.constant([-1.0, 1.0]), color=tf.constant(["red", "blue"])
    )
    assert out["classes"].numpy().tolist() == [b"yes", b"no"]


@pytest.mark.slow
def test_sigkill_mid_iteration_resumes_from_gcs(gcs, bucket, binary_data, tmp_path):
    """A chief restarted elsewhere with the same gs:// job dir continues where it stopped."""
    job = f"gs://{bucket}/job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=2",
        "--max_iteration_steps=800",
        "--batch_size=32",
        "--steps_per_loop=200",
        "--checkpoint_every_secs=0",
    ]
    env = gcs.env(task_env())
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *args],
        cwd=REPO,
        env=env,
        stdout=open(tmp_path / "first.log", "w"),  # noqa: SIM115 (the process owns it)
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        # The `checkpoint` state file is published after a save's data and index: once it
        # exists, iteration 1 has a checkpoint to resume from.
        while not (
            tf.io.gfile.exists(f"{job}/checkpoints/iteration-0.json")
            and tf.io.gfile.exists(f"{job}/checkpoints/iteration-1/checkpoint")
        ):
            assert process.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "kill point not reached in time"
            time.sleep(0.2)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    record0 = (
        gcs.client().bucket(bucket).blob("job/checkpoints/iteration-0.json").download_as_text()
    )

    result = run_task(args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Iteration 0: training" not in result.stderr
    assert "Iteration 1: resumed from gs://" in result.stderr, result.stderr[-3000:]
    resumed = result.stderr.split("Iteration 1: resumed from")[1]
    assert 0 < int(resumed.split("at step ")[1].split(".")[0]) < 800
    bucket_obj = gcs.client().bucket(bucket)
    assert bucket_obj.blob("job/checkpoints/iteration-0.json").download_as_text() == record0
    report = json.loads(bucket_obj.blob("job/report.json").download_as_text())
    assert [r["iteration"] for r in report["iterations"]] == [0, 1]
    assert all(r["steps"] == 800 for r in report["iterations"])
    assert report["status"] == "complete"
    assert not [n for n in gcs.object_names(bucket) if ".tmp-" in n]
