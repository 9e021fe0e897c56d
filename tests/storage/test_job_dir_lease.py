"""One writer per job dir (trainer/storage/lease.py): a second trainer refuses while the first
is alive, and takes over from one that cannot be writing any more; on local disk and on Cloud
Storage (the emulator), and with two real trainers started together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support import HEADER, REPO, load_report, synthetic_rows, task_env, write_csv
from trainer.errors import InputError
from trainer.storage import lease


def _write_lease(path, **changes) -> None:
    holder = lease.Holder.here("")
    document = {**json.loads(holder.text()), **changes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def test_a_live_holder_is_named_and_the_second_trainer_refused(tmp_path):
    job = tmp_path / "job"
    with lease.take(str(job)):
        held = json.loads((job / lease.NAME).read_text())
        assert held["pid"] == os.getpid()
        with pytest.raises(InputError, match=r"is being written by another trainer \(process "):
            lease.take(str(job))
        assert json.loads((job / lease.NAME).read_text()) == held  # untouched
    # Released: no lease, and no folder where nothing else was written.
    assert not job.exists()
    with lease.take(str(job)):
        (job / "run.json").write_text("{}")
    assert sorted(p.name for p in job.iterdir()) == ["run.json"]


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"pid": 2**22 + 12345}, "has ended"),  # above any pid_max: no such process
        ({"started": "1"}, "has ended"),  # this test's pid, reused by a later process
        ({"pid": 2**22 + 12345, "pid_space": "", "started": ""}, "has ended"),  # an older lease
        ({"boot": "an-earlier-boot"}, "before this machine restarted"),
        ({"host": "elsewhere", "job": "123"}, "the same Vertex AI job (123), restarted"),
        ({"host": "elsewhere", "age": 3 * lease.STALE_SECS}, "gave no heartbeat for"),
        ({"damaged": True, "age": 60}, "could not be read"),
    ],
)
def test_a_holder_that_cannot_be_writing_is_taken_over(tmp_path, caplog, changes, why):
    path = tmp_path / "job" / lease.NAME
    age = changes.pop("age", 0)
    if changes.pop("damaged", False):
        path.parent.mkdir()
        path.write_text('{"owner": "ab')  # a write cut short
    else:
        _write_lease(path, **changes)
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    with lease.take(str(tmp_path / "job"), job="123" if "job" in changes else ""):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert why in caplog.text and "Took over the lease" in caplog.text


def test_an_unreadable_lease_a_moment_old_is_one_being_written(tmp_path):
    path = tmp_path / "job" / lease.NAME
    path.parent.mkdir()
    path.write_bytes(b"")
    with pytest.raises(InputError, match=r"another trainer \(its lease is being written"):
        lease.take(str(tmp_path / "job"))


def test_without_hard_links_the_lease_is_created_exclusively(tmp_path, monkeypatch):
    def no_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    job = tmp_path / "job"
    with lease.take(str(job)):
        assert json.loads((job / lease.NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(InputError, match="is being written by another trainer"):
            lease.take(str(job))
    assert not job.exists()


@pytest.mark.parametrize(
    "changes",
    [{"host": "elsewhere", "pid": 7}, {"pid": 7, "pid_space": "pid:[1]"}],
    ids=["another-host", "another-container"],  # whose process ids this machine cannot check
)
def test_a_live_holder_elsewhere_with_a_recent_heartbeat_is_not_taken_over(tmp_path, changes):
    path = tmp_path / "job" / lease.NAME
    _write_lease(path, **changes)
    with pytest.raises(InputError, match=r"process 7 on .*last heartbeat \d+ s ago"):
        lease.take(str(tmp_path / "job"))


def test_a_lease_that_cannot_be_deleted_at_the_end_is_a_warning(tmp_path, caplog, monkeypatch):
    held = lease.take(str(tmp_path / "job"))

    def fails(owner):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(held._store, "delete_if", fails)
    held.release()
    assert "could not be deleted ([Errno 13] Permission denied)" in caplog.text


def test_a_holder_that_cannot_renew_its_lease_stops_before_another_may_take_it(tmp_path):
    """A heartbeat failing for STALE_SECS - 2 x BEAT_SECS ends the process in one line."""
    program = f"""
import time
from trainer.storage import lease
lease.BEAT_SECS, lease.STALE_SECS = 0.05, 0.5
held = lease.take({str(tmp_path / "job")!r})
def fails(text, owner):
    raise OSError(5, "Input/output error")
held._store.renew = fails
time.sleep(30)
"""
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1, result.stderr[-2000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert "could not renew the lease of this job dir" in line and "Input/output error" in line


def test_the_heartbeat_renews_the_lease_and_a_lost_one_is_not_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "BEAT_SECS", 0.05)
    path = tmp_path / "job" / lease.NAME
    held = lease.take(str(tmp_path / "job"))
    os.utime(path, (time.time() - 100, time.time() - 100))
    deadline = time.time() + 10
    while time.time() - path.stat().st_mtime > 50 and time.time() < deadline:
        time.sleep(0.05)
    assert time.time() - path.stat().st_mtime < 50  # renewed
    held._stopped.set()  # the heartbeat stops, as a frozen holder's would
    held._thread.join()
    _write_lease(path, host="elsewhere")  # another trainer took it over
    held.release()
    assert json.loads(path.read_text())["host"] == "elsewhere"  # not this run's to delete


def test_a_lease_on_cloud_storage_is_taken_under_generation_preconditions(gcs, bucket):
    job = f"gs://{bucket}/runs/job"
    blob = gcs.client().bucket(bucket).blob("runs/job/lease.json")
    with lease.take(job):
        assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()
        with pytest.raises(InputError, match="is being written by another trainer"):
            lease.take(job)
    assert not blob.exists()
    # A lease of a process of this machine that has ended is replaced, generation-checked.
    blob.upload_from_string(json.dumps({**json.loads(lease.Holder.here("").text()), "pid": 2**23}))
    with lease.take(job):
        assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()


def test_a_lease_upload_retried_after_its_answer_was_lost_is_taken(gcs, bucket, monkeypatch):
    """The client retries an upload whose first attempt succeeded unseen: the retry's
    precondition fails on this run's own lease, which is then held, not refused."""
    from google.api_core import exceptions

    Blob = type(gcs.client().bucket(bucket).blob("any"))
    upload = Blob.upload_from_string

    def answer_lost(blob, *args, **kwargs):
        upload(blob, *args, **kwargs)
        raise exceptions.PreconditionFailed("conditionNotMet (the retry)")

    monkeypatch.setattr(Blob, "upload_from_string", answer_lost)
    job = f"gs://{bucket}/runs/lost"
    held = lease.take(job)
    monkeypatch.setattr(Blob, "upload_from_string", upload)
    blob = gcs.client().bucket(bucket).blob("runs/lost/lease.json")
    assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()
    held.release()
    assert not blob.exists()


def test_a_lease_that_cannot_be_written_is_one_line(gcs):
    with pytest.raises(InputError, match=r"cannot take its lease, gs://no-such-bucket-7/job/"):
        lease.take("gs://no-such-bucket-7/job")


def _pair(data, job) -> list[subprocess.CompletedProcess]:
    args = [
        sys.executable, "-m", "trainer.task", f"--train_data={data}", "--label_column=target",
        f"--job_dir={job}", "--max_iterations=1", "--max_iteration_steps=20", "--batch_size=32",
        "--bags=1",
    ]  # fmt: skip
    runs = [
        subprocess.Popen(args, cwd=REPO, env=task_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errors = [r.communicate(timeout=300)[1] for r in runs]  # read while they run: no full pipe
    return [subprocess.CompletedProcess(r.args, r.returncode, "", e) for r, e in zip(runs, errors)]


@pytest.mark.parametrize("pairs", [1, pytest.param(20, marks=pytest.mark.slow)])
def test_two_trainers_started_together_one_trains_the_other_refuses(tmp_path, pairs):
    """Before: both trained the whole job; run again, one died with a NotFoundError traceback
    while the other exported."""
    data = write_csv(tmp_path / "train.csv", HEADER, synthetic_rows("binary", 300, 1))
    for n in range(pairs):
        job = tmp_path / f"job-{n}"
        runs = _pair(data, job)
        codes = sorted(r.returncode for r in runs)
        assert codes == [0, 2], [r.stderr[-2000:] for r in runs]
        (refused,) = [r for r in runs if r.returncode == 2]
        (line,) = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
        assert "is being written by another trainer" in line
        assert "Traceback" not in refused.stderr
        assert load_report(job)["status"] == "complete"
        assert (job / "model" / "saved_model.pb").exists()
        assert not (job / lease.NAME).exists()
