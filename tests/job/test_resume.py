"""Killing the trainer (SIGKILL) at any moment and running the same command again continues
where it stopped: finished iterations are never redone, nothing is corrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO, load_report, run_task, task_env
from trainer.storage import job_dir as job_dir_lib


def _args(data, job: Path) -> list[str]:
    return [
        f"--train_data={data.train}",
        f"--eval_data={data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=3",
        "--max_iteration_steps=3000",
        "--batch_size=32",
        "--steps_per_loop=50",
        "--checkpoint_every_secs=0",
        "--patience=0",  # all three iterations, whatever each keeps
    ]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *args],
        cwd=REPO,
        env=task_env(),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def _wait_for(predicate, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, "the trainer ended before the kill point"
        assert time.monotonic() < deadline, "kill point not reached in time"
        time.sleep(0.05)


def _kill(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.parametrize("layout", ["default", "model dir elsewhere", "job dir is checkpoints"])
def test_a_restart_removes_every_temporary_a_crash_left_and_nothing_else(tmp_path, layout):
    root = tmp_path / "job"
    dirs = {
        "default": {},
        "model dir elsewhere": {"model": str(tmp_path / "out" / "model")},
        "job dir is checkpoints": {"checkpoints": str(root)},
    }[layout]
    job = job_dir_lib.JobDir(str(root), **dirs)
    job.create()
    kept = [Path(job.run), Path(job.record_path(0)), tmp_path / "out" / "notes.tmp-mine"]
    crashed = [
        Path(job.report + ".tmp-1a2b3c4d"),  # SIGTERM while report.json was written
        Path(job.report_png + ".tmp-1a2b3c4d"),
        Path(job.record_path(1) + ".tmp-1a2b3c4d"),
        Path(job.model_temp()) / "saved_model.pb",  # an export not yet published
    ]
    for path in kept + crashed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")

    job.remove_leftovers()  # what the restarted chief does first (`JobDir.create`)

    assert all(path.exists() for path in kept)
    assert not [p for p in tmp_path.rglob("*.tmp-*") if p not in kept], list(tmp_path.rglob("*"))


@pytest.mark.slow
def test_sigkill_mid_iteration_resumes_without_redoing_finished_work(binary_data, tmp_path):
    job = tmp_path / "job"
    checkpoints = job / "checkpoints"
    process = _start(_args(binary_data, job), tmp_path / "first.log")
    try:
        # Kill once iteration 0 is finished and iteration 1 has published a periodic
        # checkpoint (its state file names it; an index alone may be one being written).
        _wait_for(
            lambda: (
                (checkpoints / "iteration-0.json").exists()
                and (checkpoints / "iteration-1" / "checkpoint").exists()
            ),
            process,
        )
    finally:
        _kill(process)
    record0 = (checkpoints / "iteration-0.json").read_text()
    frozen0 = sorted(p.name for p in (checkpoints / "frozen-0").iterdir())

    result = run_task(_args(binary_data, job))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Iteration 0: training" not in result.stderr  # finished work is not redone
    assert "Iteration 1: resumed from" in result.stderr
    resumed_at = int(
        result.stderr.split("Iteration 1: resumed from")[1].split("at step ")[1].split(".")[0]
    )
    assert 0 < resumed_at < 3000
    assert (checkpoints / "iteration-0.json").read_text() == record0
    assert sorted(p.name for p in (checkpoints / "frozen-0").iterdir()) == frozen0
    report = load_report(job)
    assert [r["iteration"] for r in report["iterations"]] == [0, 1, 2]
    assert all(r["steps"] == 3000 for r in report["iterations"])
    assert report["final"]["metrics"]["accuracy"] > 0.9
    assert not list(job.rglob("*.tmp-*"))


@pytest.mark.slow
@pytest.mark.parametrize("delay", [3.0, 6.0, 9.0, 12.0])
def test_sigkill_at_arbitrary_moments(binary_data, tmp_path, delay):
    """Kills at fixed delays after start (data loading, training, selection, export ...);
    the first before TensorFlow has loaded (5-7 s on 2 cores), before any file is written."""
    job = tmp_path / "job"
    args = _args(binary_data, job)
    args[5] = "--max_iteration_steps=800"
    process = _start(args, tmp_path / "first.log")
    time.sleep(delay)
    finished_before = process.poll() is not None
    _kill(process) if not finished_before else None
    result = run_task(args)
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["status"] == "complete"
    assert [r["iteration"] for r in report["iterations"]] == [0, 1, 2]
    assert (job / "model" / "saved_model.pb").exists()
    assert not list(job.rglob("*.tmp-*"))
