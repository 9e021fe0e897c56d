"""The splits users choose (trainer/input/splits.py): a predefined split column and a time split
write the job's train, validate and test files; the job trains, evaluates and tests on them."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from tests.support import FAST_FLAGS, HEADER, load_report, run_task, synthetic_rows, write_csv
from trainer.errors import InputError
from trainer.input import splits
from trainer.input.options import InputOptions, SplitOptions


def _read(path: str) -> list[dict]:
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _table(tmp_path, rows: list[list], header: list[str]) -> str:
    return str(write_csv(tmp_path / "data.csv", header, rows))


def test_a_split_column_sends_each_row_to_its_split(tmp_path):
    values = [
        "TRAIN",
        "train",
        "Training",
        "VALIDATE",
        "validation",
        "TEST",
        "test",
        "UNASSIGNED",
        "",
    ]
    data = _table(tmp_path, [[i, v] for i, v in enumerate(values)], ["id", "part"])
    job = str(tmp_path / "job")
    counts = splits.write(SplitOptions(column="part", source=data), data, InputOptions(), job)
    assert counts == {"train": 3, "validate": 2, "test": 2, "left_out": 2}
    at = splits.paths(job, "csv")
    assert [r["id"] for r in _read(at["train"])] == ["0", "1", "2"]
    assert [r["id"] for r in _read(at["validate"])] == ["3", "4"]
    assert [r["id"] for r in _read(at["test"])] == ["5", "6"]
    # written once: a second call (a resumed chief) reuses them
    (tmp_path / "data.csv").write_text("id,part\n")
    again = splits.write(SplitOptions(column="part", source=data), data, InputOptions(), job)
    assert again == counts


def test_a_time_split_keeps_the_newest_rows_for_validation_and_test(tmp_path):
    days = [f"2024-01-{d:02d}" for d in range(1, 21)]
    rows = [[i, day] for i, day in enumerate(reversed(days))] + [[99, "not a date"]]
    data = _table(tmp_path, rows, ["id", "when"])
    job = str(tmp_path / "job")
    split = SplitOptions(timestamp_column="when", fractions=(0.8, 0.1, 0.1), source=data)
    counts = splits.write(split, data, InputOptions(), job)
    at = splits.paths(job, "csv")
    train, validate, test = (_read(at[n]) for n in splits.SPLITS)
    assert max(r["when"] for r in train if r["id"] != "99") < min(r["when"] for r in validate)
    assert max(r["when"] for r in validate) < min(r["when"] for r in test)
    assert {r["when"] for r in test} == {"2024-01-19", "2024-01-20"}
    assert "99" in {r["id"] for r in train}, "a row without a timestamp trains"
    assert counts == {"train": 17, "validate": 2, "test": 2, "left_out": 0}
    done = json.loads((tmp_path / "job" / "splits" / "done.json").read_text())
    assert done["by"]["timestamp_split_column"] == "when"


@pytest.mark.parametrize(
    "values, said",
    [
        (["TRAIN", "TEST"], "gives no VALIDATE rows"),
        (["x", "y"], "gives no TRAIN and no VALIDATE and no TEST rows"),
    ],
)
def test_a_split_without_rows_in_one_part_is_refused(tmp_path, values, said):
    data = _table(tmp_path, [[i, v] for i, v in enumerate(values)], ["id", "part"])
    with pytest.raises(InputError, match=said):
        splits.write(SplitOptions(column="part"), data, InputOptions(), str(tmp_path / "job"))
    assert not (tmp_path / "job" / "splits" / "done.json").exists()


def test_bad_split_flags_are_refused():
    with pytest.raises(InputError, match="exclusive"):
        SplitOptions(column="a", timestamp_column="b")
    with pytest.raises(InputError, match="must sum to 1, each share above 0"):
        SplitOptions(timestamp_column="b", fractions=(0.9, 0.1, 0.0))
    with pytest.raises(InputError, match="read CSV or JSON Lines"):
        splits.input_format("data/train.parquet", jsonl=False)


@pytest.mark.slow  # trains a model: ~16 s on 2 cores
def test_a_job_trains_on_its_split_and_reports_validation_and_test(tmp_path):
    rows = synthetic_rows("binary", 1200, 5)
    parts = ["TRAIN"] * 900 + ["VALIDATE"] * 150 + ["TEST"] * 150
    data = write_csv(
        tmp_path / "data.csv", [*HEADER, "part"], [[*r, p] for r, p in zip(rows, parts)]
    )
    job = tmp_path / "job"
    args = [f"--train_data={data}", "--label_column=target", f"--job_dir={job}", *FAST_FLAGS]
    result = run_task([*args, "--split_column=part"])
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    # the search chose on the validation split, and the calibration was fitted there
    assert report["final"]["eval_data"].endswith(
        "splits/validate.csv.gz, the validation split the search chose on"
    )
    assert report["calibration"]["fitted_on"].startswith("the validation split")
    assert report["final"]["examples"] == 150
    assert report["test"]["examples"] == 150 and report["test"]["test_data"].endswith("test.csv.gz")
    schema = json.loads((job / "schema.json").read_text())
    assert "part" not in [c["name"] for c in schema["columns"]]
    assert schema["input"]["train"]["rows"] == 900
    refused = run_task([*args, "--split_column=part", f"--eval_data={data}"])
    assert refused.returncode == 2 and "drop --eval_data and --test_data" in refused.stderr
