"""JSON Lines input (trainer/input/formats/jsonl.py): lines converted to CSV lines for the CSV row
parser, the columns from the first lines' keys, bad lines named by file and line, Vertex AI
managed datasets in AIP_DATA_FORMAT=jsonl."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random

import pytest
import tensorflow as tf

from tests.input.support import ps_prepare
from tests.support import (
    FAST_FLAGS,
    HEADER,
    parsed_flags,
    run_task,
    synthetic_rows,
    task_env,
    write_csv,
)
from trainer import task
from trainer.distribute.environment import Environment
from trainer.errors import InputError
from trainer.input import files, scan
from trainer.input import schema as S
from trainer.input.formats import jsonl
from trainer.input.options import BadRows


def _rows(n: int, seed: int) -> list[dict]:
    """Synthetic rows as JSON objects: x2 absent from every 50th row, x1 null in every 70th,
    a weight column of 1s and 2s."""
    rows = []
    for i, (x1, x2, color, target) in enumerate(synthetic_rows("binary", n, seed)):
        row = {"x1": float(x1), "x2": float(x2), "color": color, "target": target, "w": 1 + i % 2}
        if i % 50 == 0:
            del row["x2"]
        if i % 70 == 0:
            row["x1"] = None
        rows.append(row)
    return rows


def _write_jsonl(path, rows: list[dict], *, shuffle_keys: int | None = 0, lines=()) -> str:
    """`rows` as JSON Lines (keys in a random order per line), then the raw `lines`."""
    rng = random.Random(shuffle_keys)
    text = []
    for row in rows:
        items = list(row.items())
        if shuffle_keys is not None:
            rng.shuffle(items)
        text.append(json.dumps(dict(items)))
    data = "\n".join([*text, *lines]) + "\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(data)
    else:
        path.write_text(data)
    return str(path)


def _write_same_csv(path, rows: list[dict]):
    header = [*HEADER, "w"]
    values = [["" if row.get(k) is None else row[k] for k in header] for row in rows]
    return write_csv(path, header, values)


def _scan(path: str, *, bad_rows=BadRows.ERROR, **choices):
    source = files.open_source(path, flag="--train_data")
    return scan.scan_training(
        source, S.ColumnChoices("target", **choices), bad_rows=bad_rows, holdout=None
    )


# -- a training run ---------------------------------------------------------------------------
@pytest.mark.slow
def test_training_on_jsonl_gz_gives_the_schema_of_the_same_csv(tmp_path):
    """Two .jsonl.gz training files (keys in any order, absent keys and nulls) and a .ndjson
    eval file train a model whose schema.json has the kinds and statistics that the same
    data as CSV gives, the weight column included."""
    train, evaluation = _rows(1200, 1), _rows(300, 2)
    (tmp_path / "json").mkdir()
    jsonl_args = [
        f"--train_data={_write_jsonl(tmp_path / 'json' / 'a.jsonl.gz', train[:700])},"
        f"{_write_jsonl(tmp_path / 'json' / 'b.jsonl.gz', train[700:], shuffle_keys=1)}",
        f"--eval_data={_write_jsonl(tmp_path / 'json' / 'eval.ndjson', evaluation)}",
    ]
    csv_args = [
        f"--train_data={_write_same_csv(tmp_path / 'train.csv', train)}",
        f"--eval_data={_write_same_csv(tmp_path / 'eval.csv', evaluation)}",
    ]
    schemas = {}
    for name, args in (("jsonl", jsonl_args), ("csv", csv_args)):
        job = tmp_path / f"job_{name}"
        flags = [*args, "--label_column=target", "--weight_column=w", f"--job_dir={job}"]
        result = run_task([*flags, *FAST_FLAGS, "--max_iterations=1"], env=task_env())
        assert result.returncode == 0, result.stderr[-3000:]
        schemas[name] = json.loads((job / "schema.json").read_text())
        assert json.loads((job / "report.json").read_text())["status"] == "complete"
    got, want = schemas["jsonl"], schemas["csv"]
    assert {c["name"]: c["kind"] for c in got["columns"]} == {
        "x1": "numeric",
        "x2": "numeric",
        "color": "categorical",
    }
    # kinds, counts, missing, moments, bins, vocabularies (in the order the keys first came:
    # x2 is absent from line 1)
    by_name = lambda schema: {c["name"]: c for c in schema["columns"]}  # noqa: E731
    assert by_name(got) == by_name(want)
    assert got["label"] == want["label"] and got["weight"] == want["weight"]
    assert got["input"]["train"]["format"] == "jsonl"
    assert [f["rows"] for f in got["input"]["train"]["files"]] == [700, 500]
    assert got["input"]["eval"]["rows"] == want["input"]["eval"]["rows"] == 300


# -- Vertex AI managed datasets ---------------------------------------------------------------
def test_managed_jsonl_dataset_reads_every_file_as_json_lines(tmp_path):
    environ = {
        "AIP_DATA_FORMAT": "jsonl",
        "AIP_TRAINING_DATA_URI": "gs://b/dataset/training-*",
        "AIP_VALIDATION_DATA_URI": "gs://b/dataset/validation-*",
        "AIP_TEST_DATA_URI": "gs://b/dataset/test-*",
    }
    with parsed_flags(["--label_column=target"]) as flags:
        data = task.build_config(flags, Environment.from_environ(environ)).data
    assert (data.train_data, data.eval_data, data.test_data) == (
        "gs://b/dataset/training-*",
        "gs://b/dataset/validation-*",
        "gs://b/dataset/test-*",
    )
    assert data.input.jsonl
    # Vertex AI names the files training-00000-of-00002 and so on: no .jsonl suffix
    for i, part in enumerate((_rows(40, 1)[:20], _rows(40, 1)[20:])):
        _write_jsonl(tmp_path / f"training-{i:05d}-of-00002", part, shuffle_keys=i)
    pattern = str(tmp_path / "training-*")
    source = files.open_source(pattern, flag="--train_data", jsonl=data.input.jsonl)
    assert source.format is jsonl.JSONL
    assert set(source.columns) == {"x1", "x2", "color", "target", "w"}
    schema = scan.scan_training(
        source, S.ColumnChoices("target"), bad_rows=BadRows.ERROR, holdout=None
    )
    assert schema.summary["train"]["rows"] == 40
    # without the managed dataset's format the same files are CSV, with a header of JSON
    first = str(tmp_path / "training-00000-of-00002")
    assert files.open_source(first, flag="--train_data").format.name == "csv"
    with parsed_flags(["--label_column=target", "--train_data=x.csv"]) as flags:
        assert not task.build_config(flags, Environment.from_environ(environ)).data.input.jsonl


@pytest.mark.slow
def test_trains_on_a_managed_jsonl_dataset_in_cloud_storage(gcs, bucket, tmp_path):
    """No data flags: AIP_DATA_FORMAT=jsonl and gs:// wildcards of files without a suffix,
    read through the Cloud Storage emulator; the test split is scored by the exported model."""
    for name, rows in (
        ("training-00000-of-00001", _rows(1000, 1)),
        ("validation-0", _rows(300, 2)),
        ("test-0", _rows(200, 3)),
    ):
        local = _write_jsonl(tmp_path / name, rows)
        tf.io.gfile.copy(local, f"gs://{bucket}/dataset/{name}")
    job = tmp_path / "job"
    env = gcs.env(task_env())
    env.update(
        AIP_DATA_FORMAT="jsonl",
        AIP_TRAINING_DATA_URI=f"gs://{bucket}/dataset/training-*",
        AIP_VALIDATION_DATA_URI=f"gs://{bucket}/dataset/validation-*",
        AIP_TEST_DATA_URI=f"gs://{bucket}/dataset/test-*",
    )
    result = run_task(["--label_column=target", f"--job_dir={job}", *FAST_FLAGS], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((job / "report.json").read_text())
    assert report["final"]["examples"] == 300
    assert report["final"]["metrics"]["accuracy"] > 0.8
    assert report["test"]["test_data"] == f"gs://{bucket}/dataset/test-*"
    assert report["test"]["examples"] == 200 and report["test"]["metrics"]["accuracy"] > 0.8
    assert "exported model on the test data" in result.stdout
    summary = json.loads((job / "schema.json").read_text())["input"]
    assert summary["train"]["format"] == "jsonl" and summary["train"]["rows"] == 1000


# -- bad lines --------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_line_that_is_not_json_exits_2_naming_file_and_line_before_any_work(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", _rows(100, 1), lines=['{"x1": 1.0, "colo'])
    job = tmp_path / "job"
    result = run_task(
        [f"--train_data={path}", "--label_column=target", f"--job_dir={job}", *FAST_FLAGS],
        env=task_env(),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"{path} line 101 is not JSON" in result.stderr
    assert not (job / "schema.json").exists() and not (job / "model").exists()


@pytest.mark.parametrize(
    "line, said",
    [
        ('{"x1": 1, "x2": [1, 2], "color": "red", "target": "yes", "w": 1}', "nested value"),
        ('{"x1": 1, "x2": 2, "color": {"a": 1}, "target": "yes", "w": 1}', "key 'color'"),
        ('[1, 2, "red", "yes", 1]', "holds a JSON list, not an object"),
        ("not json", "is not JSON"),
        # Each of these two stopped the sniffing or the conversion with a traceback.
        (
            '{"x1": ' + "[" * 100_000 + "]" * 100_000 + ', "color": "red", "target": "yes"}',
            "nests arrays or objects too deeply to be read",
        ),
        ('{"x1": 1, "x2": 2, "color": "\\ud800", "target": "yes"}', "lone surrogate escape"),
    ],
)
def test_a_bad_line_is_named_or_skipped(tmp_path, line, said):
    rows = _rows(30, 1)
    path = _write_jsonl(tmp_path / "train.jsonl", rows[:10], lines=[line])
    with open(path, "a") as f:
        f.write("\n".join(json.dumps(r) for r in rows[10:]) + "\n")
    with pytest.raises(InputError, match=f"{path} line 11 .*{said}"):
        _scan(path)
    schema = _scan(path, bad_rows=BadRows.SKIP)
    assert schema.summary["train"]["rows"] == 30
    assert schema.summary["train"]["bad_rows"] == 1


def test_a_nested_value_in_an_ignored_column_is_no_bad_row(tmp_path):
    rows = [dict(r, extra={"deep": [1, 2]} if i % 3 else None) for i, r in enumerate(_rows(30, 1))]
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(InputError, match="line 2 has a nested value .* key 'extra'"):
        _scan(path)
    schema = _scan(path, ignore=("extra",))
    assert schema.summary["train"]["rows"] == 30 and schema.summary["train"]["bad_rows"] == 0


def test_the_columns_are_the_keys_of_the_first_lines_and_a_later_key_is_a_bad_row(
    tmp_path, monkeypatch
):
    from trainer.input import blocks

    monkeypatch.setattr(blocks, "CHUNK_BYTES", 4096)  # the first lines span many chunks
    rows = _rows(jsonl.SNIFF_LINES + 10, 1)
    rows[jsonl.SNIFF_LINES - 1]["mid"] = "a"  # line SNIFF_LINES: a column
    rows[jsonl.SNIFF_LINES + 4]["late"] = 1  # line SNIFF_LINES + 5: a bad row
    path = _write_jsonl(tmp_path / "train.jsonl", rows, shuffle_keys=None)
    source = files.open_source(path, flag="--train_data")
    assert source.columns == ("x1", "color", "target", "w", "x2", "mid")  # x2 from line 2
    with pytest.raises(InputError, match=f"line {jsonl.SNIFF_LINES + 5} has key 'late'"):
        _scan(path)
    assert _scan(path, bad_rows=BadRows.SKIP).summary["train"]["bad_rows"] == 1


def test_pyarrow_and_the_json_module_convert_lines_alike():
    """A chunk pyarrow reads is converted by it; one with a blank line by the json module,
    line by line: the same fields either way (numbers as numbers, booleans as true/false,
    strings with commas, quotes and line ends, nulls and absent keys empty)."""
    lines = [
        '{"a": 1, "b": "x, \\"y\\"\\nz", "c": true, "d": null}',
        '{"c": false, "a": 2.5e-07, "b": "plain"}',
        '{"b": "", "a": -3}',
    ]
    columns = ("a", "b", "c", "d")
    by_arrow = jsonl._arrow_csv("\n".join(lines).encode(), columns)
    assert by_arrow is not None
    by_json = jsonl.to_csv("\n".join([*lines, ""]).encode(), columns)  # a blank line last
    parse = lambda text: list(csv.reader(io.StringIO(text.decode())))  # noqa: E731
    arrow_rows, json_rows = parse(by_arrow), parse(by_json)
    assert len(arrow_rows) == 3 and json_rows[3:] == []  # the blank line stays a line
    for a, j in zip(arrow_rows, json_rows[:3]):
        assert (float(a[0]), a[1:]) == (float(j[0]), j[1:])
    assert json_rows[0][1:] == ['x, "y" z', "true", ""]
    assert json_rows[2] == ["-3", "", "", ""]


# -- sharding, chunks, parameter servers ------------------------------------------------------
def _id_files(tmp_path, count: int, rows: int = 300) -> str:
    """`count` JSON Lines files; key id numbers the rows (0..rows-1), every 7th lacks x."""
    paths = []
    for k in range(count):
        lines = [{"id": i, "y": i % 2, **({"x": i / 7} if i % 7 else {})} for i in range(rows)]
        paths.append(_write_jsonl(tmp_path / f"part-{k}.jsonl", lines[k::count], shuffle_keys=k))
    return ",".join(paths)


@pytest.mark.parametrize(
    "files_count, readers", [pytest.param(1, 2, marks=pytest.mark.slow), (3, 2)]
)
def test_readers_share_json_lines_read_in_small_chunks(tmp_path, monkeypatch, files_count, readers):
    """Chunks of 256 bytes (many per file, each converted on its own): every row is read
    once across the readers (whole files, or every n-th row of one file), and a bad line
    in a later chunk is named by its own line number."""
    from trainer.input import blocks
    from trainer.input.pipeline import Pipeline, Selection, Shard

    monkeypatch.setattr(blocks, "CHUNK_BYTES", 256)
    source = files.open_source(_id_files(tmp_path, files_count), flag="--train_data")
    schema = scan.scan_training(
        source, S.ColumnChoices("y", numeric=("id",)), bad_rows=BadRows.ERROR, holdout=None
    )
    assert schema.summary["train"]["rows"] == 300
    data = Pipeline(source, schema)
    seen = []
    for reader in range(readers):
        shard = Shard.of(reader, readers, num_files=files_count)
        for features, _ in data.raw(Selection(shard=shard)):
            seen += features["id"].numpy().astype(int).tolist()
    assert sorted(seen) == list(range(300))
    with open(source.files[0], "a") as f:
        f.write('{"id": 1, "y": 0}\n{"id": 2, "y": 1, "x": [3]}\n')
    lines = 300 // files_count + 2
    with pytest.raises(InputError, match=f"part-0.jsonl line {lines} has a nested value"):
        scan.scan_training(
            files.open_source(source.pattern, flag="--train_data"),
            S.ColumnChoices("y"),
            bad_rows=BadRows.ERROR,
            holdout=None,
        )


def test_parameter_servers_stage_json_lines_once_and_a_second_prepare_reuses_it(
    tmp_path, monkeypatch
):
    """With a ps pool the chief converts the JSON Lines files once into CSV shards under
    JOB_DIR/data (every line once, the manifest last), the job reads the shards with the
    kinds reading the JSON files gives, and a restarted chief, a resume and a worker reuse
    them without converting a line again."""
    from trainer.input.formats import shards
    from trainer.storage import job_dir as job_dir_lib

    pattern = _id_files(tmp_path, 3)
    direct = ps_prepare(job_dir_lib.JobDir(str(tmp_path / "direct")), pattern)
    monkeypatch.setattr(shards, "ROWS_PER_SHARD", 40)  # several shards per file
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    data = ps_prepare(job, pattern, stage_tables=True)
    folder = tmp_path / "job" / "data"
    manifest = json.loads((folder / "train.json").read_text())
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["train.json"] + [p.split("/")[-1] for p in (f["path"] for f in manifest["files"])]
    ), "no temporary file left"
    assert len(manifest["files"]) == 9  # 100 lines per file: shards of 40, 40 and 20
    ids = []
    for entry in manifest["files"]:
        with gzip.open(entry["path"], "rt", newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == list(data.train_source.columns) and len(rows) - 1 == entry["rows"]
        ids += [int(r[rows[0].index("id")]) for r in rows[1:]]
    assert sorted(ids) == list(range(300)), "every line once: none lost, none twice"
    train = data.train_source
    assert train.format.name == "csv" and train.files == tuple(f["path"] for f in manifest["files"])
    assert data.schema.columns == direct.schema.columns  # the kinds of the JSON files
    assert data.train_rows == direct.train_rows
    assert data.schema.summary["train"]["staged"]["files"] == manifest["files"]

    def no_conversion(*args, **kwargs):
        raise AssertionError("the JSON Lines files were converted again")

    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    monkeypatch.setattr(jsonl, "csv_chunks", no_conversion)
    again = ps_prepare(job, pattern, stage_tables=True)  # a chief restarted before its scan
    assert again.train_source.files == train.files
    assert again.schema.columns == data.schema.columns
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    job.create()  # a resume, and a worker, open the shards the schema records
    (tmp_path / "job" / "schema.json").write_text(data.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    resumed = ps_prepare(job, pattern, stage_tables=True)
    worker = ps_prepare(job, pattern, stage_tables=True, worker=True)
    assert resumed.train_source.files == worker.train_source.files == train.files
    assert resumed.train_rows == data.train_rows


def test_a_bad_json_line_staged_for_parameter_servers_is_named_and_leaves_no_shards(tmp_path):
    from trainer.storage import job_dir as job_dir_lib

    pattern = _id_files(tmp_path, 1)
    with open(pattern, "a") as f:
        f.write('{"id": 1, "y": 0\n')
    with pytest.raises(InputError, match=r"data/train-00000-0000.csv.gz line 302 is not JSON"):
        ps_prepare(job_dir_lib.JobDir(str(tmp_path / "job")), pattern, stage_tables=True)
    assert not (tmp_path / "job" / "schema.json").exists()
    assert not list((tmp_path / "job" / "data").iterdir())


@pytest.mark.slow
def test_a_parameter_server_cluster_trains_on_json_lines(tmp_path):
    """The default Vertex shape (chief, workers, ps) on .jsonl files: the chief stages them,
    the workers read the shards through the dataset function it traces."""
    from tests.distribute.test_distributed import Job
    from trainer.distribute.cluster import ClusterShape

    (tmp_path / "json").mkdir()
    train, evaluation = _rows(1200, 1), _rows(300, 2)
    args = (
        f"--train_data={_write_jsonl(tmp_path / 'json' / 'a.jsonl', train[:700])},"
        f"{_write_jsonl(tmp_path / 'json' / 'b.jsonl.gz', train[700:], shuffle_keys=1)}",
        f"--eval_data={_write_jsonl(tmp_path / 'json' / 'eval.ndjson', evaluation)}",
        "--label_column=target",
        "--weight_column=w",
        "--max_iterations=1",
        "--max_iteration_steps=400",
        "--learning_rate=0.01",
    )
    with Job(tmp_path, ClusterShape(workers=2, ps=1), *args, env=task_env()) as job:
        assert job.cluster.wait(timeout=400) == 0
        report = job.report()
    assert report["status"] == "complete"
    assert report["final"]["metrics"]["accuracy"] > 0.7
    assert set(report["input"]["readers"]) == {"worker 0", "worker 1"}
    schema = json.loads((job.dir / "schema.json").read_text())
    assert {c["name"]: c["kind"] for c in schema["columns"]} == {
        "x1": "numeric",
        "x2": "numeric",
        "color": "categorical",
    }
    for key, rows in (("train", 1200), ("eval", 300)):
        summary = schema["input"][key]
        assert summary["format"] == "csv" and summary["rows"] == rows
        assert summary["staged"]["jsonl"].endswith((".jsonl.gz", ".ndjson"))
        for entry in summary["staged"]["files"]:
            assert os.path.exists(entry["path"]) and f"/data/{key}-" in entry["path"]
