"""Test helpers: small synthetic data sets written as real files, and a runner for
`python -m trainer.task` as a real process."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_csv(path: Path, header: list[str], rows) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def synthetic_rows(kind: str, n: int, seed: int):
    """Rows (x1, x2, color, label) with a learnable signal for each head."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    color = rng.choice(["red", "green", "blue"], size=n)
    shift = np.select([color == "red", color == "green"], [1.0, -1.0], 0.0)
    score = 1.5 * x1 - x2 + shift
    if kind == "binary":
        label = np.where(score + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    elif kind == "multiclass":
        label = np.digitize(score, [-1.0, 1.0]).astype(str)  # classes 0, 1, 2
        label = np.array(["low", "mid", "high"])[label.astype(int)]
    else:
        label = np.round(3.0 * score + 10.0 + 0.1 * rng.normal(size=n), 4)
    return [[f"{a:.4f}", f"{b:.4f}", c, y] for a, b, c, y in zip(x1, x2, color, label)]


HEADER = ["x1", "x2", "color", "target"]


@dataclasses.dataclass
class DataFiles:
    train: Path
    eval: Path


def make_data(tmp_path: Path, kind: str, n_train: int = 2000, n_eval: int = 500) -> DataFiles:
    return DataFiles(
        write_csv(tmp_path / f"{kind}_train.csv", HEADER, synthetic_rows(kind, n_train, 1)),
        write_csv(tmp_path / f"{kind}_eval.csv", HEADER, synthetic_rows(kind, n_eval, 2)),
    )


# absl's prefix of a log line: level letter, date, time, thread, file:line]
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]", re.MULTILINE)

FAST_FLAGS = [
    "--max_iterations=2",
    "--max_iteration_steps=200",
    "--batch_size=32",
    "--learning_rate=0.01",
    "--steps_per_loop=50",
    "--bags=1",  # one search (tests/job/test_bagging.py runs bags)
]


def task_env(**extra: str) -> dict:
    """The environment of a trainer process: this one's, without Vertex AI's variables (a
    test sets those it needs in `extra`)."""
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    for name in ("CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_TRIAL_ID", "TF_CONFIG", "CLUSTER_SPEC"):
        env.pop(name, None)
    env.update(extra)
    return env


def env_without_tensorflow(tmp_path: Path, **extra: str) -> dict:
    """`task_env`, but importing TensorFlow fails: what answers there answers before
    TensorFlow loads (about 5 s)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('TensorFlow loaded')")
    return task_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", **extra)


def run_task(
    args: list[str], *, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs `python -m trainer.task ARGS` in a real process."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.task", *args],
        cwd=REPO,
        env=env or task_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def predict_csv(model_dir, csv_path) -> tuple[dict, list[str]]:
    """The exported model's outputs on the raw columns of a CSV file of HEADER, and its
    targets."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    features = {
        "x1": tf.constant([float(r["x1"]) for r in rows]),
        "x2": tf.constant([float(r["x2"]) for r in rows]),
        "color": tf.constant([r["color"] for r in rows]),
    }
    return serve(**features), [r["target"] for r in rows]


def load_report(job_dir: Path) -> dict:
    return json.loads((job_dir / "report.json").read_text())


@contextlib.contextmanager
def parsed_flags(args: list[str]):
    """trainer.task's flags parsed from `args` for the duration of the block."""
    from absl import flags

    flags.FLAGS.unparse_flags()
    flags.FLAGS(["trainer.task", *args])
    try:
        yield flags.FLAGS
    finally:
        flags.FLAGS.unparse_flags()


def run_in_process(args: list[str]) -> tuple[int, str]:
    """Runs trainer.task's main in this process (fast: TensorFlow is already imported);
    returns (exit code, stderr)."""
    from trainer import task

    stderr = io.StringIO()
    with parsed_flags(args), contextlib.redirect_stderr(stderr):
        code = task.main(["trainer.task"])
    return code, stderr.getvalue()


def minimal_record(iteration: int, **changes):
    """A valid IterationRecord with one candidate and no subnetworks (for job-dir tests)."""
    from trainer.search.record import Architecture, CandidateRecord, IterationRecord, Seconds

    record = IterationRecord(
        iteration=iteration,
        steps=10,
        steps_per_sec=None,
        batch_size=8,
        selection="moving_average",
        chosen="c",
        eval_examples=5,
        candidates=(CandidateRecord("c", "mean", (), 0.5, False, {"loss": 0.5}),),
        subnetworks=(),
        placement=(),
        architecture=Architecture("mean", (), {}),
        seconds=Seconds(1.0, 1.0, 0.1, 0.1),
    )
    return dataclasses.replace(record, **changes)


# -- processes ------------------------------------------------------------------------------

DUMMY_TASK = "tests.cluster_task"  # a stand-in for the trainer that starts in milliseconds


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def is_alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """A TensorBoard run's scalars, read from its event files: {tag: [(step, value), ...]}."""
    import tensorflow as tf

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                found.setdefault(value.tag, []).append((event.step, number))
    return {tag: sorted(points) for tag, points in found.items()}
