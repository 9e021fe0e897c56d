"""The input end to end, through `python -m trainer.task` as a real process: bad rows both
ways, a hold-out that stays the same across a resume, a 100,000-value categorical column that
trains and serves, eval passes that count each row once, and (slow) a million rows."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import tensorflow as tf

from tests.support import FAST_FLAGS, HEADER, load_report, run_task, synthetic_rows, write_csv
from trainer.input.files import CENSUS_TRAIN


@pytest.mark.slow
def test_a_bad_row_stops_the_run_before_training_naming_file_and_line(tmp_path):
    rows = synthetic_rows("binary", 300, 1)
    rows[120][1] = "n/a?"  # x2 is numeric
    path = write_csv(tmp_path / "train.csv", HEADER, rows)
    result = run_task(
        [
            f"--train_data={path}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        f"numeric column 'x2' holds 'n/a?' at {path} line 122. Fix the value, or pass "
        "--categorical_columns=x2"
    ) in result.stderr
    assert "--bad_rows=skip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.slow
def test_skipped_bad_rows_are_counted_per_file_in_the_report(tmp_path):
    rows = synthetic_rows("binary", 600, 1)
    rows[5] = rows[5][:3]  # a field missing
    rows[300][0] = "abc"
    rows[410][3] = ""  # no label
    a = write_csv(tmp_path / "a.csv", HEADER, rows[:300])
    b = write_csv(tmp_path / "b.csv", HEADER, rows[300:])
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={a},{b}",
            "--label_column=target",
            f"--job_dir={job}",
            "--bad_rows=skip",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "skipped 3 bad rows" in result.stderr and f"{a} line 7" in result.stderr
    report = load_report(job)
    assert report["input"]["bad_rows"] == {
        "policy": "skip",
        "by_file": {"train": {str(a): 1, str(b): 2}},
        "lost_tails": {},
    }
    schema = json.loads((job / "schema.json").read_text())
    assert schema["input"]["train"]["rows"] == 597


@pytest.mark.slow
def test_every_eval_pass_counts_each_row_once_and_the_holdout_survives_a_resume(
    binary_data, tmp_path
):
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iteration_steps=100",
        "--batch_size=32",
        "--holdout_fraction=0.2",
    ]
    assert run_task(args + ["--max_iterations=1"]).returncode == 0
    result = run_task(args + ["--max_iterations=2"])  # a resume: the hold-out is drawn again
    assert result.returncode == 0, result.stderr[-2000:]
    report = load_report(job)
    held = json.loads((job / "schema.json").read_text())["input"]["train"]["holdout_rows"]
    assert 300 < held < 500  # 20% of 2,000
    assert [r["eval_examples"] for r in report["iterations"]] == [held, held]
    assert report["final"]["examples"] == report["input"]["eval_rows"] == held
    assert report["input"]["training_rows"] == 2000 - held
    first = json.loads((job / "checkpoints" / "iteration-0.json").read_text())
    assert first["candidates"] == report["iterations"][0]["candidates"]


def _ids_data(tmp_path, levels: int, rows: int):
    """A label that depends on a user id of `levels` values (and one number)."""
    rng = np.random.default_rng(0)
    users = rng.permutation(
        np.concatenate([np.arange(levels), rng.integers(0, levels, rows - levels)])
    )
    x = rng.normal(size=rows)
    label = ((users % 2 == 0) ^ (x > 1.5)).astype(int)
    lines = ["user,x,label"] + [f"u{u},{v:.3f},{y}" for u, v, y in zip(users, x, label)]
    path = tmp_path / "train.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path, users, x


@pytest.mark.slow
def test_a_100k_value_categorical_column_trains_and_serves(tmp_path):
    path, users, x = _ids_data(tmp_path, 100_000, 300_000)
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={path}",
            "--label_column=label",
            f"--job_dir={job}",
            "--generator=dnn",
            "--max_iterations=1",
            "--max_iteration_steps=2000",
            "--batch_size=256",
        ],
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    schema = json.loads((job / "schema.json").read_text())
    (user,) = [c for c in schema["columns"] if c["name"] == "user"]
    assert user["encoding"] == "embedding" and user["embedding_dim"] == 16
    assert len(user["vocabulary"]) == 100_000 and user["count_error"] == 0
    serve = tf.saved_model.load(str(job / "model")).signatures["serving_default"]
    out = serve(user=tf.constant(["u2", "u3", "never-seen"]), x=tf.constant([0.0, 0.0, 0.0]))
    assert out["probabilities"].shape == (3, 2)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    # The label is mostly the parity of the user id: only the embedding can learn it (x alone
    # gives 0.50; here 0.83 after 1.7 epochs).
    assert load_report(job)["final"]["metrics"]["accuracy"] > 0.7


@pytest.mark.slow
def test_a_million_rows_end_to_end(tmp_path):
    """Census-shaped gzip shards of 1,000,000 rows: scanned, streamed (over the memory budget),
    trained, evaluated on a 10% hold-out, exported."""
    with gzip.open(CENSUS_TRAIN, "rt") as f:
        header, *lines = f.read().splitlines()
    rng = np.random.default_rng(0)
    for shard in range(4):
        picked = rng.integers(0, len(lines), 250_000)
        with gzip.open(tmp_path / f"part-{shard}.csv.gz", "wt", compresslevel=1) as f:
            f.write(header + "\n" + "\n".join(lines[i] for i in picked) + "\n")
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={tmp_path / 'part-*.csv.gz'}",
            "--label_column=income_bracket",
            f"--job_dir={job}",
            "--max_iterations=1",
            "--max_iteration_steps=1000",
            "--batch_size=256",
        ],
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["input"]["mode"] == "streamed from the files"
    assert report["input"]["training_rows"] + report["input"]["eval_rows"] == 1_000_000
    assert report["final"]["examples"] == report["input"]["eval_rows"] > 90_000
    assert report["final"]["metrics"]["accuracy"] > 0.82


@pytest.mark.slow
def test_a_resume_on_other_files_is_refused(tmp_path):
    rows = synthetic_rows("binary", 200, 1)
    write_csv(tmp_path / "part-0.csv", HEADER, rows[:100])
    write_csv(tmp_path / "part-1.csv", HEADER, rows[100:])
    args = [
        f"--train_data={tmp_path / 'part-*.csv'}",
        "--label_column=target",
        f"--job_dir={tmp_path / 'job'}",
        "--bags=1",
        "--max_iterations=1",
        "--max_iteration_steps=20",
    ]
    assert run_task(args).returncode == 0
    write_csv(tmp_path / "part-2.csv", HEADER, rows[:10])  # the glob now matches three
    result = run_task(args[:-2] + ["--max_iterations=2", "--max_iteration_steps=20"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "--train_data now matches 3 files, but the job in this --job_dir was started on 2"
        in result.stderr
    )
    assert "part-2.csv" in result.stderr
