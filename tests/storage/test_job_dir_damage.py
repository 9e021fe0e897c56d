"""A damaged job dir: each file emptied or cut in half, at two stages of a 3-iteration job (in the
middle of iteration 1, stopped by SIGTERM with two periodic checkpoints; and complete). The
trainer run again either resumes (from the newest intact state, saying what it set aside) and
completes the job with a model of all its iterations, or stops with one line naming the file;
never a traceback, never a model of the wrong iterations.

Before: JSONDecodeError, "file is too short to be an sstable", "not an sstable (bad magic
number)" and ValueError tracebacks, and an older intact checkpoint never used."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import HEADER, REPO, load_report, run_task, synthetic_rows, task_env, write_csv

ITERATIONS = 3


def _args(data: Path, job: Path) -> list[str]:
    # Iterations of a few seconds, checkpointed every 0.3 s: the middle stage has two.
    return [
        f"--train_data={data}", "--label_column=target", f"--job_dir={job}",
        f"--max_iterations={ITERATIONS}", "--max_iteration_steps=1500", "--batch_size=32",
        "--steps_per_loop=10", "--bags=1", "--force_grow", "--checkpoint_every_secs=0.3",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("damage")


@pytest.fixture(scope="module")
def data(root) -> Path:
    return write_csv(root / "train.csv", HEADER, synthetic_rows("binary", 400, 1))


@pytest.fixture(scope="module")
def complete_stage(root, data) -> Path:
    """A finished job."""
    complete = root / "complete"
    result = run_task(_args(data, complete))
    assert result.returncode == 0, result.stderr[-3000:]
    return complete


@pytest.fixture(scope="module")
def mid_stage(root, data) -> Path:
    """Iteration 1 stopped by SIGTERM with two periodic checkpoints."""
    mid = root / "mid"
    args = [sys.executable, "-m", "trainer.task", *_args(data, mid)]
    log = root / "mid.log"
    with open(log, "w") as out:
        process = subprocess.Popen(args, cwd=REPO, env=task_env(), stdout=out, stderr=out)
    folder = mid / "checkpoints" / "iteration-1"
    deadline = time.monotonic() + 300
    while len(list(folder.glob("ckpt-*.index"))) < 2:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 143, log.read_text()[-3000:]
    return mid


def _newest_periodic(job: Path) -> str:
    folder = job / "checkpoints" / "iteration-1"
    newest = max(folder.glob("ckpt-*.index"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
    return str(newest.relative_to(job))


# (stage, file in the job dir, what a run on the damaged dir does: "resumes" or "names it")
CASES = [
    ("mid", "checkpoints/iteration-0.json", "resumes"),
    ("mid", "checkpoints/frozen-0/ensemble.index", "resumes"),
    ("mid", "NEWEST PERIODIC", "resumes"),
    ("mid", "checkpoints/iteration-1/checkpoint", "resumes"),
    ("mid", "run.json", "names it"),
    ("mid", "schema.json", "names it"),
    ("complete", "checkpoints/iteration-2.json", "resumes"),
    ("complete", "checkpoints/frozen-2/ensemble.index", "resumes"),
    ("complete", "model.json", "resumes"),
    ("complete", "report.json", "resumes"),
]
# The default run's case (the others run in CI): a periodic checkpoint cut in half, resumed.
QUICK = {("mid", "NEWEST PERIODIC", "half")}


PARAMS = [
    pytest.param(
        stage,
        name,
        cut,
        outcome,
        marks=() if (stage, name, cut) in QUICK else (pytest.mark.slow,),
        id=f"{stage}-{name}-{cut}",
    )
    for stage, name, outcome in CASES
    for cut in ("zero", "half")
]


@pytest.mark.parametrize("stage, name, cut, outcome", PARAMS)
def test_a_damaged_file_is_named_in_one_line_or_the_job_resumes(
    request, data, tmp_path, stage, name, cut, outcome
):
    original = request.getfixturevalue(f"{stage}_stage")  # made only for the stages that run
    job = tmp_path / "job"
    shutil.copytree(original, job)
    if name == "NEWEST PERIODIC":
        name = _newest_periodic(job)
    damaged = job / name
    content = damaged.read_bytes()
    damaged.write_bytes(b"" if cut == "zero" else content[: len(content) // 2])

    result = run_task(_args(data, job))
    output = result.stderr
    assert "Traceback" not in output, output[-3000:]
    if outcome == "names it":
        assert result.returncode == 2, output[-3000:]
        (line,) = [x for x in output.splitlines() if x.startswith("error:")]
        assert f"{damaged} is damaged" in line
        return
    assert result.returncode == 0, output[-3000:]
    said = str(damaged).removesuffix(".index")  # a checkpoint is named by its prefix
    # What was damaged is said; half a state file may still parse (it names fewer
    # checkpoints, which the resume does not need: it lists them).
    still_read = name.endswith("/checkpoint") and cut == "half" and _parses(damaged)
    assert said in output or still_read, output[-3000:]
    if stage == "mid" and "-0" in name:  # iteration 0 set aside: iteration 1, which trained
        # on its ensemble, starts afresh
        assert f"Deleted {job / 'checkpoints' / 'iteration-1'}" in output, output[-3000:]
        assert "Iteration 1: resumed from" not in output, output[-3000:]
    report = load_report(job)
    assert report["status"] == "complete"
    assert [r["iteration"] for r in report["iterations"]] == list(range(ITERATIONS))
    stamp = json.loads((job / "model.json").read_text())
    assert stamp["source"]["iterations"] == ITERATIONS
    assert len(report["architecture"]["members"]) == ITERATIONS  # --force_grow: one each


def _parses(state_file: Path) -> bool:
    import tensorflow as tf

    try:
        tf.train.get_checkpoint_state(str(state_file.parent))
        return True
    except Exception:
        return False


def test_the_evaluator_waits_out_a_damaged_checkpoint_state_file(tmp_path):
    from trainer.job import evaluator

    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-4')  # cut short
    assert evaluator._latest_checkpoint(str(tmp_path)) is None
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    (tmp_path / "ckpt-4.index").write_bytes(b"")  # what latest_checkpoint looks for
    assert evaluator._latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-4")
