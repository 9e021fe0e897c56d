"""Parquet input (trainer/input/formats/parquet.py): row groups converted to CSV lines for the
CSV row parser, column kinds by their types, bad values named by file and row, readers that
share the rows, files cut short, Cloud Storage, and the CSV shards a parameter-server
cluster's chief stages."""

from __future__ import annotations

import csv
import datetime
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from tests.distribute.test_distributed import Job
from tests.input.support import ps_prepare
from tests.support import FAST_FLAGS, run_in_process, synthetic_rows, task_env
from trainer.distribute.cluster import ClusterShape
from trainer.errors import InputError
from trainer.input import files, scan
from trainer.input import schema as S
from trainer.input.formats import parquet
from trainer.input.formats import shards as shards_lib
from trainer.input.options import BadRows
from trainer.input.pipeline import Pipeline, Selection, Shard
from trainer.storage import job_dir as job_dir_lib


def _table(ids: range, **columns) -> pa.Table:
    """Rows `ids`: an id, a number x (null in every 10th row), a dictionary-encoded color, a
    boolean, a timestamp and a date, and the label y; `columns` replace or add columns."""
    n = len(ids)
    day = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    data = {
        "id": pa.array(list(ids), pa.int64()),
        "x": pa.array([None if i % 10 == 0 else i / 7 for i in ids], pa.float64()),
        "color": pa.array([("red", "green", "blue")[i % 3] for i in ids]).dictionary_encode(),
        "flag": pa.array([i % 2 == 0 for i in ids]),
        "when": pa.array([day + datetime.timedelta(hours=i) for i in ids], pa.timestamp("ms")),
        "day": pa.array([datetime.date(2024, 1, 1 + i % 28) for i in ids], pa.date32()),
        "y": pa.array([i % 2 for i in ids], pa.int64()),
    }
    data.update(columns)
    assert all(len(v) == n for v in data.values())
    return pa.table(data)


def _write(path, table: pa.Table, *, row_group_size: int = 64) -> str:
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def _dataset(tmp_path, count: int, rows: int = 300) -> str:
    """`rows` rows in `count` files (ids k, k + count, ...), small row groups."""
    return ",".join(
        _write(tmp_path / f"part-{k}.parquet", _table(range(k, rows, count))) for k in range(count)
    )


def _scan(pattern: str, **flags):
    source = files.open_source(pattern, flag="--train_data")
    choices = source.format.column_choices(source, S.ColumnChoices("y", **flags))
    return source, scan.scan_training(source, choices, bad_rows=BadRows.ERROR, holdout=None)


def test_kinds_follow_the_column_types_and_timestamps_and_dates_are_dates(tmp_path):
    source, schema = _scan(_dataset(tmp_path, 2))
    assert source.format is parquet.PARQUET and source.columns[0] == "id"
    kinds = {c.name: c.kind.value for c in schema.columns}
    assert kinds == {
        "id": "numeric",
        "x": "numeric",
        "color": "categorical",  # dictionary-encoded strings
        "flag": "categorical",  # booleans: "true", "false"
        "when": "datetime",  # read as ISO text (trainer/input/dates.py)
        "day": "datetime",
    }
    columns = {c.name: c for c in schema.columns}
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    when, day = columns["when"], columns["day"]
    assert isinstance(when, S.DateColumn) and isinstance(day, S.DateColumn)
    assert when.mean == pytest.approx(start + 149.5 * 3600) and when.has_time
    assert (when.min, when.max) == (start, start + 299 * 3600)
    assert not day.has_time and day.max == start + 27 * 86400
    assert isinstance(columns["color"], S.CategoricalColumn)
    assert set(columns["color"].vocabulary) == {"red", "green", "blue"}
    assert set(columns["flag"].vocabulary) == {"true", "false"}
    train = schema.summary["train"]
    assert train["format"] == "parquet" and train["rows"] == 300
    assert [f["rows"] for f in train["files"]] == [150, 150]
    assert columns["x"].missing == 30  # nulls are missing values


def test_a_file_streams_one_row_group_at_a_time_numbered_from_row_1(tmp_path):
    path = _write(tmp_path / "a.parquet", _table(range(200)), row_group_size=64)
    chunks = list(parquet.csv_chunks(path))
    assert [first for _, first in chunks] == [1, 65, 129, 193]  # one chunk per row group
    lines = b"\n".join(text for text, _ in chunks).split(b"\n")
    assert len(lines) == 200 and lines[0].startswith(b"0,,")  # id 0, x null


@pytest.mark.parametrize("count", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_two_readers_cover_every_row_exactly_once(tmp_path, count):
    """Whole files per reader (4 files), or every other row of one file: the sharding a
    2-worker job reads with."""
    source, schema = _scan(_dataset(tmp_path, count))
    seen = []
    for reader in range(2):
        shard = Shard.of(reader, 2, num_files=count)
        assert shard is not None and shard.by_file == (count >= 2)
        rows = []
        for features, _ in Pipeline(source, schema).raw(Selection(shard=shard)):
            rows += features["id"].numpy().astype(int).tolist()
        assert len(rows) == 150, f"reader {reader} of 2 reads its share"
        seen += rows
    assert sorted(seen) == list(range(300)), "every row once: none lost, none twice"


def test_bad_values_are_named_by_file_and_row(tmp_path):
    text = pa.array([str(i) if i != 41 else "abc" for i in range(100)])  # numbers as text
    path = _write(tmp_path / "a.parquet", _table(range(100), x=text))
    with pytest.raises(InputError, match=r"numeric column 'x' holds 'abc' at \S+a.parquet row 42"):
        _scan(path, numeric=("x",))
    _, schema = _scan(path)  # a string column is categorical by its type
    assert {c.name: c.kind.value for c in schema.columns}["x"] == "categorical"
    label = pa.array([None if i == 7 else i % 2 for i in range(100)], pa.int64())
    path = _write(tmp_path / "b.parquet", _table(range(100), y=label))
    with pytest.raises(InputError, match=r"label column 'y' is empty at \S+b.parquet row 8"):
        _scan(path)


def test_a_nested_column_is_refused_unless_ignored_and_a_bad_row_where_met_later(tmp_path):
    lists = pa.array([[i, i + 1] for i in range(100)])
    path = _write(tmp_path / "a.parquet", _table(range(100), tags=lists))
    with pytest.raises(InputError, match=r"tags \(list<element: int64>\).*--ignore_columns=tags"):
        _scan(path)
    _, schema = _scan(path, ignore=("tags",))
    assert "tags" not in schema.feature_names
    # eval data (not checked by the training data's types) with a list where x was numbers
    eval_path = _write(tmp_path / "eval.parquet", _table(range(50), x=lists[:50]))
    eval_source = files.open_source(eval_path, flag="--eval_data")
    with pytest.raises(InputError, match=r"eval.parquet row 1 has a nested value .* 'x'"):
        scan.scan_eval(eval_source, schema, bad_rows=BadRows.ERROR)


def test_a_file_cut_short_or_corrupt_is_named_before_any_work(tmp_path):
    whole = _write(tmp_path / "a.parquet", _table(range(300)))
    data = Path(whole).read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])  # its footer is lost
    with pytest.raises(InputError, match=r"cannot read \S+cut.parquet as a Parquet file"):
        files.open_source(f"{whole},{cut}", flag="--train_data")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\x07" * (len(data) - 8) + data[-8:])  # pages overwritten
    with pytest.raises(InputError, match=r"bad.parquet"):
        _scan(str(bad))


def test_files_in_cloud_storage_are_read_through_tf_io_gfile(gcs, bucket, tmp_path):
    for k in range(2):
        local = _write(tmp_path / f"part-{k}.parquet", _table(range(k, 200, 2)))
        tf.io.gfile.copy(local, f"gs://{bucket}/pq/part-{k}.parquet")
    source, schema = _scan(f"gs://{bucket}/pq/*.parquet")
    assert source.files == tuple(f"gs://{bucket}/pq/part-{k}.parquet" for k in range(2))
    assert schema.summary["train"]["rows"] == 200


def test_parameter_servers_read_csv_shards_staged_once(tmp_path, monkeypatch):
    """With a ps pool the chief converts the Parquet files once into CSV shards: every row
    once, the kinds of the Parquet types, reused by a restarted chief and a resume."""
    pattern = _dataset(tmp_path, 3)

    direct = ps_prepare(job_dir_lib.JobDir(str(tmp_path / "direct")), pattern)
    monkeypatch.setattr(shards_lib, "ROWS_PER_SHARD", 40)
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    data = ps_prepare(job, pattern, stage_tables=True)
    manifest = json.loads((tmp_path / "job" / "data" / "train.json").read_text())
    assert manifest["format"] == "parquet" and len(manifest["files"]) == 9  # 100 rows a file
    assert data.train_source.files == tuple(f["path"] for f in manifest["files"])
    # the kinds and statistics of the Parquet files (read in another order: sums may differ
    # in their last bits)
    assert [(c.name, c.kind) for c in data.schema.columns] == [
        (c.name, c.kind) for c in direct.schema.columns
    ]
    for staged, read in zip(data.schema.columns, direct.schema.columns):
        if isinstance(read, S.NumericColumn):
            assert staged.mean == pytest.approx(read.mean, rel=1e-12)
        else:
            assert staged == read
    assert data.train_rows == direct.train_rows
    monkeypatch.setattr(parquet, "csv_chunks", None)  # a second conversion would fail
    again = ps_prepare(job, pattern, stage_tables=True)
    assert again.train_source.files == data.train_source.files
    job.create()
    (tmp_path / "job" / "schema.json").write_text(data.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    worker = ps_prepare(job, pattern, stage_tables=True, worker=True)
    assert worker.train_source.files == data.train_source.files
    assert worker.train_source.format.column_choices(
        worker.train_source, S.ColumnChoices("y")
    ).categorical == ("color", "flag")


@pytest.mark.slow
def test_trains_on_parquet_like_the_other_formats(tmp_path):
    rows = synthetic_rows("binary", 1200, 1)
    table = pa.table(
        {
            "x1": pa.array([float(r[0]) for r in rows]),
            "x2": pa.array([float(r[1]) for r in rows]),
            "color": pa.array([r[2] for r in rows]),
            "target": pa.array([r[3] for r in rows]),
        }
    )
    train = _write(tmp_path / "train.parquet", table.slice(0, 900), row_group_size=256)
    evaluation = _write(tmp_path / "eval.parquet", table.slice(900), row_group_size=256)
    job = tmp_path / "job"
    args = [f"--train_data={train}", f"--eval_data={evaluation}", "--label_column=target"]
    code, stderr = run_in_process([*args, f"--job_dir={job}", *FAST_FLAGS])
    assert code == 0, stderr[-3000:]
    report = json.loads((job / "report.json").read_text())
    assert report["final"]["examples"] == 300
    assert report["final"]["metrics"]["accuracy"] > 0.8
    summary = json.loads((job / "schema.json").read_text())["input"]
    assert summary["train"]["format"] == "parquet" and summary["train"]["rows"] == 900
    assert np.isfinite(report["final"]["metrics"]["loss"])


def _learnable(rows: range) -> pa.Table:
    """Rows `rows`: a row id, then x1, x2, color and the label of `synthetic_rows`."""
    data = synthetic_rows("binary", len(rows), rows.start)
    return pa.table(
        {
            "id": pa.array(list(rows), pa.int64()),
            "x1": pa.array([float(r[0]) for r in data]),
            "x2": pa.array([float(r[1]) for r in data]),
            "color": pa.array([r[2] for r in data]),
            "target": pa.array([r[3] for r in data]),
        }
    )


def _cluster_data(tmp_path) -> tuple[list[str], tuple[str, ...]]:
    """3 training files of 500, 300 and 400 rows (ids 0 to 1199, row groups of 128), eval
    data, and the trainer's flags for a one-iteration job on them."""
    bounds = [0, 500, 800, 1200]
    train = [
        _write(tmp_path / f"part-{k}.parquet", _learnable(range(a, b)), row_group_size=128)
        for k, (a, b) in enumerate(zip(bounds, bounds[1:]))
    ]
    evaluation = _write(tmp_path / "eval.parquet", _learnable(range(5000, 5300)))
    return train, (
        f"--train_data={','.join(train)}",
        f"--eval_data={evaluation}",
        "--label_column=target",
        "--ignore_columns=id",
        "--max_iterations=1",
        "--max_iteration_steps=100",
        "--learning_rate=0.01",
        # every row trained on (selection on held-out rows would hold 10% of them out)
        "--selection=moving_average",
    )


@pytest.mark.slow
def test_a_synchronous_two_worker_cluster_reads_every_parquet_row_once(tmp_path):
    """A MultiWorkerMirrored cluster (chief and one worker: two replicas, each reading the
    Parquet files itself): 3 files of unequal sizes, whole files per reader (files 0 and 2,
    and file 1). The plan in report.json, and the row ids each replica's training dataset
    really took (recorded by tests/input/reads_task.py), cover every row once."""
    train, args = _cluster_data(tmp_path)
    reads = tmp_path / "reads"
    reads.mkdir()
    env = task_env(READS_DIR=str(reads))
    with Job(
        tmp_path, ClusterShape(workers=1), *args, env=env, module="tests.input.reads_task"
    ) as job:
        assert job.cluster.wait(timeout=400) == 0
        assert job.cluster.process("worker", 0).wait(timeout=60) == 0
        report = job.report()
    assert report["status"] == "complete"
    summary = json.loads((job.dir / "schema.json").read_text())["input"]["train"]
    assert summary["format"] == "parquet" and summary["rows"] == 1200
    assert [f["rows"] for f in summary["files"]] == [500, 300, 400]
    assert report["input"]["training_rows"] == 1200
    assert report["input"]["readers"] == {
        "chief": {"files": [train[0], train[2]]},
        "worker 0": {"files": [train[1]]},
    }
    taken = {
        name: [int(i) for i in (reads / f"{role}.txt").read_text().split()]
        for name, role in (("chief", "chief-0"), ("worker 0", "worker-0"))
    }
    assert sorted(taken["chief"]) == [*range(0, 500), *range(800, 1200)]
    assert sorted(taken["worker 0"]) == list(range(500, 800))
    assert sorted(taken["chief"] + taken["worker 0"]) == list(range(1200)), "each row once"


@pytest.mark.slow
def test_a_parameter_server_cluster_stages_parquet_and_its_two_workers_share_every_row_once(
    tmp_path,
):
    """Chief, 2 workers and a ps on the same 3 files: the chief stages them as CSV shards
    (one per file), the workers read whole shards (0 and 2, and 1). Their datasets run a
    function the chief traced (no Python to record with), so the evidence is what the job
    wrote: the staging manifest in schema.json, the plan in report.json, and the ids in the
    shards each worker was given."""
    _, args = _cluster_data(tmp_path)
    with Job(tmp_path, ClusterShape(workers=2, ps=1), *args, env=task_env()) as job:
        assert job.cluster.wait(timeout=400) == 0
        report = job.report()
    assert report["status"] == "complete"
    summary = json.loads((job.dir / "schema.json").read_text())["input"]["train"]
    assert summary["format"] == "csv" and summary["rows"] == 1200
    staged = summary["staged"]["files"]
    assert [f["rows"] for f in staged] == [500, 300, 400]
    assert report["input"]["training_rows"] == 1200
    paths = [f["path"] for f in staged]
    assert report["input"]["readers"] == {
        "worker 0": {"files": [paths[0], paths[2]]},
        "worker 1": {"files": [paths[1]]},
    }

    def ids(path: str) -> list[int]:
        with gzip.open(path, "rt", newline="") as f:
            header, *rows = csv.reader(f)
        assert len(rows) == next(e["rows"] for e in staged if e["path"] == path)
        return [int(row[header.index("id")]) for row in rows]

    taken = {
        name: [i for path in plan["files"] for i in ids(path)]
        for name, plan in report["input"]["readers"].items()
    }
    assert sorted(taken["worker 0"]) == [*range(0, 500), *range(800, 1200)]
    assert sorted(taken["worker 1"]) == list(range(500, 800))
    assert sorted(taken["worker 0"] + taken["worker 1"]) == list(range(1200)), "each row once"


def test_a_column_is_dates_only_where_every_file_types_it_so():
    date, text = parquet.DATE, parquet.CATEGORICAL
    assert parquet._merged([date, date]) == date
    assert parquet._merged([date, ""]) == ""  # a number in one file: the scan decides
    assert parquet._merged([date, text]) == ""
    assert parquet._merged([date, "list<item: int64>"]) == "list<item: int64>"
