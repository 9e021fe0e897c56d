"""BigQuery input against a local emulator (tests/bigquery_emulator.py) with the real client
libraries: the Storage Read API's streams as the pipeline's files, sharded across readers,
and bad tables stopping the trainer before any work."""

from __future__ import annotations

import concurrent.futures
import csv
import datetime
import gzip
import json
import os

import grpc
import numpy as np
import pytest

from tests import bigquery_emulator
from tests.support import FAST_FLAGS, load_report, parsed_flags, run_in_process, run_task, task_env
from trainer import task
from trainer.distribute.cluster import ClusterShape
from trainer.distribute.environment import Environment
from trainer.errors import InputError
from trainer.input import job_input as input_lib
from trainer.input import scan
from trainer.input.formats import bigquery
from trainer.input.formats import shards as shards_lib
from trainer.input.options import BadRows, BigQueryConnection, InputOptions
from trainer.input.pipeline import Pipeline, Selection, Shard
from trainer.input.schema import CategoricalColumn, ColumnChoices, DateColumn, NumericColumn
from trainer.storage import job_dir as job_dir_lib

SMALL_ROWS, EVAL_ROWS, BIG_ROWS = 1200, 300, 25_000


def _learnable(first: int, last: int) -> str:
    """A query of rows `first..last` of a table with a learnable label."""
    return f"""
        SELECT x1, x2, color, flag, amount, day,
               IF(1.5 * x1 - x2 + IF(color = 'red', 1.0, 0.0) > 0, 'yes', 'no') AS target
        FROM (SELECT MOD(x * 7919, 2003) / 1001.5 - 1.0 AS x1,
                     MOD(x * 104729, 3001) / 1500.5 - 1.0 AS x2,
                     IF(MOD(x, 3) = 0, 'red', IF(MOD(x, 3) = 1, 'green', 'blue')) AS color,
                     MOD(x, 2) = 0 AS flag,
                     CAST(MOD(x, 100) AS NUMERIC) AS amount,
                     DATE_ADD(DATE '2020-01-01', INTERVAL x DAY) AS day
              FROM UNNEST(GENERATE_ARRAY({first}, {last})) AS x)"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with bigquery_emulator.start(tmp_path_factory.mktemp("bqemulator")) as emulator:
        emulator.client().create_dataset("ds")
        # Features with a learnable signal, every type the trainer reads, and a DATE.
        emulator.query(f"CREATE TABLE ds.small AS {_learnable(1, SMALL_ROWS)}")
        emulator.query(f"CREATE TABLE ds.small_eval AS {_learnable(5001, 5000 + EVAL_ROWS)}")
        emulator.query(
            "CREATE TABLE ds.timed AS SELECT x1, TIME '09:00:00' AS at, target FROM ds.small"
        )
        # Over 1 MB of Arrow data: the emulator splits it into several streams (10).
        emulator.query(
            f"""CREATE TABLE ds.big AS
            SELECT x AS id, MOD(x * 7919, 2003) / 1001.5 AS value,
                   CONCAT('name, "quoted"\\n', CAST(MOD(x, 50) AS STRING)) AS name,
                   IF(MOD(x, 2) = 0, 'even', 'odd') AS target
            FROM UNNEST(GENERATE_ARRAY(1, {BIG_ROWS})) AS x"""
        )
        yield emulator


@pytest.fixture
def emulator_env(emulator, monkeypatch):
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    return emulator


def _connection(emulator) -> BigQueryConnection:
    return BigQueryConnection(project=emulator.project, emulator_host=emulator.grpc)


# -- a training run ---------------------------------------------------------------------------
@pytest.mark.slow
def test_trains_end_to_end_on_a_managed_bigquery_dataset(emulator, tmp_path):
    """A Vertex AI training pipeline on a BigQuery managed dataset: no data flags, the
    tables named by AIP_* variables."""
    job = tmp_path / "job"
    env = task_env(
        **emulator.env(),
        AIP_DATA_FORMAT="bigquery",
        AIP_TRAINING_DATA_URI=emulator.uri("ds.small"),
        AIP_VALIDATION_DATA_URI=emulator.uri("ds.small_eval"),
        AIP_TEST_DATA_URI=emulator.uri("ds.small_eval"),
    )
    args = ["--label_column=target", "--ignore_columns=day", f"--job_dir={job}", *FAST_FLAGS]
    result = run_task(args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["status"] == "complete"
    assert report["final"]["examples"] == EVAL_ROWS
    assert report["final"]["metrics"]["accuracy"] > 0.8
    schema = json.loads((job / "schema.json").read_text())
    # kinds from the table's types: STRING and BOOL categorical, NUMERIC numeric
    assert {c["name"]: c["kind"] for c in schema["columns"]} == {
        "x1": "numeric",
        "x2": "numeric",
        "color": "categorical",
        "flag": "categorical",
        "amount": "numeric",
    }
    for key, table, rows in (
        ("train", "ds.small", SMALL_ROWS),
        ("eval", "ds.small_eval", EVAL_ROWS),
    ):
        summary = schema["input"][key]
        assert summary["format"] == "bigquery" and summary["rows"] == rows
        assert summary["bigquery"]["table"] == emulator.uri(table)
        assert [f["path"] for f in summary["files"]] == summary["bigquery"]["streams"]


# -- streams and shards -----------------------------------------------------------------------
@pytest.mark.slow
def test_streams_are_split_across_two_readers_without_losing_a_row(emulator):
    uri = emulator.uri("ds.big")
    source = bigquery.open_table(uri, flag="--train_data", connection=_connection(emulator))
    assert len(source.files) > 1, "the table should span several read streams"
    choices = bigquery.table_choices(source, ColumnChoices(label="target"))
    schema = scan.scan_training(source, choices, bad_rows=BadRows.ERROR, holdout=None)
    assert schema.summary["train"]["rows"] == BIG_ROWS
    assert [c.name for c in schema.columns] == ["id", "value", "name"]
    # strings with commas, quotes and a line end, whole
    (name,) = [c for c in schema.columns if c.name == "name"]
    assert isinstance(name, CategoricalColumn)
    names = name.vocabulary
    assert 'name, "quoted" 7' in names and len(names) == 50

    def ids(shard: Shard | None) -> np.ndarray:
        pipeline = Pipeline(source, schema)
        batches = pipeline.raw(Selection(shard=shard), with_label=False)
        return np.concatenate([b["id"].numpy() for b in batches]).astype(np.int64)

    # two readers: whole streams each, then every other row of every stream
    for by_file in (True, False):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            shards = list(pool.map(ids, [Shard(i, 2, by_file=by_file) for i in range(2)]))
        assert all(len(s) > BIG_ROWS // 3 for s in shards)
        everything = np.concatenate(shards)
        assert len(everything) == BIG_ROWS, f"by_file={by_file}: rows lost or read twice"
        assert set(everything.tolist()) == set(range(1, BIG_ROWS + 1))
    two_workers = Shard.of(0, 2, num_files=len(source.files))
    assert two_workers is not None and two_workers.by_file  # what a 2-worker job reads


def test_a_replica_reads_the_streams_the_job_recorded(emulator):
    connection = _connection(emulator)
    first = bigquery.open_table(emulator.uri("ds.big"), flag="--train_data", connection=connection)
    recorded = bigquery.recorded_session(first)
    again = bigquery.open_table(
        emulator.uri("ds.big"), flag="--train_data", connection=connection, recorded=recorded
    )
    assert again.files == first.files and again.columns == first.columns
    with pytest.raises(InputError, match=r"job in this --job_dir reads bq://test-project.ds.big"):
        bigquery.open_table(
            emulator.uri("ds.small"), flag="--train_data", connection=connection, recorded=recorded
        )


def test_workers_read_the_chief_s_read_session(emulator, tmp_path):
    """The chief opens a read session and scans; a replica waiting for it (a worker, the
    evaluator, a resumed chief) opens no session of its own but the streams schema.json
    records."""
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    common = dict(
        train_data=emulator.uri("ds.small"),
        eval_data=emulator.uri("ds.small_eval"),
        columns=ColumnChoices(label="target", ignore=("day",)),
        holdout_fraction=0.1,
        options=InputOptions(bigquery=_connection(emulator)),
        seed=0,
        job=job,
    )
    with pytest.raises(InputError, match="did not write"):  # waits; opens nothing before
        input_lib.prepare(**common, role=input_lib.Role.worker(0))
    chief = input_lib.prepare(**common, role=input_lib.Role.chief())
    assert chief.train_rows == SMALL_ROWS and chief.eval_rows == EVAL_ROWS
    job.create()
    (tmp_path / "job" / "schema.json").write_text(chief.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    worker = input_lib.prepare(**common, role=input_lib.Role.worker(5))
    for theirs, ours in ((worker.train_source, chief.train_source), (worker.eval, chief.eval)):
        assert theirs.state is not None and ours.state is not None
        assert theirs.files == ours.files and theirs.state.name == ours.state.name
    assert worker.schema.feature_names == chief.schema.feature_names


# -- bad tables: exit 2, named, before any work ------------------------------------------------
@pytest.mark.parametrize(
    "table, said",
    [
        ("test-project.ds.missing", "bq://test-project.ds.missing was not found"),
        ("other-project.nowhere.small", "bq://other-project.nowhere.small was not found"),
    ],
)
def test_a_missing_table_stops_before_any_work(emulator_env, tmp_path, table, said):
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [f"--train_data=bq://{table}", "--label_column=target", f"--job_dir={job}"]
    )
    assert code == 2
    assert said in stderr and "--train_data" in stderr
    assert not job.exists() or not any(job.iterdir())


def test_a_column_of_another_type_is_named_unless_ignored(emulator_env, tmp_path):
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [
            f"--train_data={emulator_env.uri('ds.timed')}",
            "--label_column=target",
            f"--job_dir={job}",
        ]
    )
    assert code == 2
    assert "at (TIME)" in stderr and "--ignore_columns=at" in stderr
    assert not job.exists() or not any(job.iterdir())


def test_a_date_column_is_read_as_dates(emulator):
    """A DATE column is a date column of ISO text (trainer/input/dates.py), its days counted
    from the table's values."""
    source = bigquery.open_table(
        emulator.uri("ds.small"), flag="--train_data", connection=_connection(emulator)
    )
    choices = bigquery.table_choices(source, ColumnChoices(label="target"))
    assert choices.dates == (("day", "iso"),)
    schema = scan.scan_training(source, choices, bad_rows=BadRows.ERROR, holdout=None)
    (day,) = [c for c in schema.columns if c.name == "day"]
    assert isinstance(day, DateColumn) and not day.has_time and day.missing == 0
    first = datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc).timestamp()
    assert (day.min, day.max) == (first, first + (SMALL_ROWS - 1) * 86400)
    assert day.count == SMALL_ROWS


@pytest.fixture
def denying_server():
    """A gRPC server that answers every call PERMISSION_DENIED, as BigQuery does to a
    service account without roles/bigquery.readSessionUser (the emulator has no IAM)."""

    class Deny(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            def deny(request, context):
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "bigquery.readsessions.create")

            return grpc.unary_unary_rpc_method_handler(deny)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2), handlers=[Deny()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_a_permission_error_stops_before_any_work(denying_server, monkeypatch, tmp_path):
    monkeypatch.setenv("BIGQUERY_STORAGE_EMULATOR_HOST", denying_server)
    monkeypatch.setenv("CLOUD_ML_PROJECT_ID", "1234")
    job = tmp_path / "job"
    code, stderr = run_in_process(
        ["--train_data=bq://data-project.ds.table", "--label_column=y", f"--job_dir={job}"]
    )
    assert code == 2
    assert "no permission to read BigQuery table bq://data-project.ds.table" in stderr
    assert "roles/bigquery.readSessionUser on projects/1234" in stderr
    assert not job.exists() or not any(job.iterdir())


# -- Vertex AI managed datasets ---------------------------------------------------------------
def _config(environ: dict, args=("--label_column=target",)):
    with parsed_flags(list(args)) as flags:
        return task.build_config(flags, Environment.from_environ(environ)).data


def test_managed_bigquery_dataset_is_read_when_no_data_flag_is_given():
    data = _config(
        {
            "AIP_DATA_FORMAT": "bigquery",
            "AIP_TRAINING_DATA_URI": "bq://p.ds.train",
            "AIP_VALIDATION_DATA_URI": "bq://p.ds.validation",
            "AIP_TEST_DATA_URI": "bq://p.ds.test",
            "CLOUD_ML_PROJECT_ID": "1234",
            "BIGQUERY_STORAGE_EMULATOR_HOST": "localhost:9060",
        }
    )
    assert (data.train_data, data.eval_data) == ("bq://p.ds.train", "bq://p.ds.validation")
    assert data.input.bigquery == BigQueryConnection(project="1234", emulator_host="localhost:9060")


def test_managed_csv_dataset_and_flags_that_win():
    environ = {
        "AIP_DATA_FORMAT": "csv",
        "AIP_TRAINING_DATA_URI": "gs://b/dataset/training-*",
        "AIP_VALIDATION_DATA_URI": "gs://b/dataset/validation-*",
    }
    data = _config(environ)
    assert (data.train_data, data.eval_data) == (
        "gs://b/dataset/training-*",
        "gs://b/dataset/validation-*",
    )
    data = _config(environ, ["--label_column=target", "--train_data=local.csv"])
    assert (data.train_data, data.eval_data) == ("local.csv", None)
    data = _config({k: v for k, v in environ.items() if "VALIDATION" not in k})
    assert data.eval_data is None  # a hold-out of the training data


@pytest.mark.parametrize(
    "environ, said",
    [
        ({"AIP_DATA_FORMAT": "parquet"}, "AIP_DATA_FORMAT='parquet' is not a managed dataset"),
        ({}, "AIP_DATA_FORMAT=None is not a managed dataset"),
        ({"AIP_DATA_FORMAT": "jsonl", "AIP_TRAINING_DATA_URI": "bq://p.d.t"}, "start with gs://"),
        ({"AIP_DATA_FORMAT": "bigquery"}, "does not start with bq://"),
    ],
)
def test_a_bad_managed_dataset_is_named(environ, said):
    with pytest.raises(InputError, match=said.replace("(", r"\(")):
        _config({"AIP_TRAINING_DATA_URI": "gs://b/training-*", **environ})


def test_a_table_with_parameter_servers_is_accepted():
    """With a ps pool the chief stages the table (below); the flags are not refused."""
    tf_config = (
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},'
        ' "task": {"type": "chief", "index": 0}}'
    )
    data = _config({"TF_CONFIG": tf_config}, ["--label_column=y", "--train_data=bq://p.ds.t"])
    assert data.train_data == "bq://p.ds.t"


# -- staging for parameter-server clusters ----------------------------------------------------
def _staged_rows(folder) -> tuple[list[str], list[dict]]:
    """(header, rows) of every train shard in `folder`, in the manifest's order."""
    manifest = json.loads((folder / "train.json").read_text())
    header, rows = None, []
    for entry in manifest["files"]:
        with gzip.open(entry["path"], "rt", newline="") as f:
            reader = csv.reader(f)
            file_header = next(reader)
            assert header in (None, file_header)
            header = file_header
            shard = [dict(zip(header, r)) for r in reader]
        assert len(shard) == entry["rows"], entry["path"]
        rows.extend(shard)
    return header or [], rows


@pytest.fixture(scope="module")
def staged_table(emulator):
    """ds.big with a STRING column of digits (categorical by the table's type, numeric by
    its text) and a BOOL: several read streams."""
    emulator.query(
        "CREATE TABLE ds.staged AS SELECT id, value, name, CAST(MOD(id, 10) AS STRING) AS code,"
        " MOD(id, 3) = 0 AS flag, target FROM ds.big"
    )
    return emulator.uri("ds.staged")


def _staging_prepare(emulator, job, uri, *, opens_train: bool = True):
    return input_lib.prepare(
        train_data=uri,
        eval_data=None,
        columns=ColumnChoices(label="target"),
        holdout_fraction=0.1,
        options=InputOptions(bigquery=_connection(emulator)),
        seed=0,
        job=job,
        role=input_lib.Role(opens_train=opens_train, stage_tables=True),
    )


def test_staging_writes_every_row_once_and_a_second_prepare_reuses_it(
    emulator, staged_table, tmp_path, monkeypatch
):
    monkeypatch.setattr(shards_lib, "ROWS_PER_SHARD", 1000)  # several shards per stream
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    data = _staging_prepare(emulator, job, staged_table)
    folder = tmp_path / "job" / "data"
    shards = sorted(p.name for p in folder.iterdir())
    assert "train.json" in shards and not [n for n in shards if "tmp" in n]
    session = bigquery.open_table(
        staged_table, flag="--train_data", connection=_connection(emulator)
    )
    manifest = json.loads((folder / "train.json").read_text())
    streams = {f["path"].rsplit("-", 2)[-2] for f in manifest["files"]}
    assert len(streams) == len(session.files) > 1, "one or more shards per read stream"
    assert len(manifest["files"]) > len(streams), "streams of over 1,000 rows split"
    header, rows = _staged_rows(folder)
    assert header == ["id", "value", "name", "code", "flag", "target"]
    ids = sorted(int(r["id"]) for r in rows)
    assert ids == list(range(1, BIG_ROWS + 1)), "every row once: none lost, none twice"
    assert {r["name"] for r in rows if r["id"] == "57"} == {'name, "quoted" 7'}
    assert {r["flag"] for r in rows} == {"true", "false"}
    # The job reads the shards, with the kinds the table's types give.
    train = data.train_source
    assert train.format.name == "csv" and train.files == tuple(f["path"] for f in manifest["files"])
    kinds = {c.name: type(c) for c in data.schema.columns}
    assert kinds == {
        "id": NumericColumn,
        "value": NumericColumn,
        "name": CategoricalColumn,
        "code": CategoricalColumn,  # digits, but a STRING column
        "flag": CategoricalColumn,
    }
    summary = data.schema.summary["train"]
    assert summary["rows"] == BIG_ROWS and summary["staged"]["table"] == staged_table
    assert summary["staged"]["files"] == manifest["files"]
    # A second start before the job dir exists reuses the shards: no read session, no read.
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def no_bigquery(*args, **kwargs):
        raise AssertionError("the table was read again")

    monkeypatch.setattr(bigquery, "_create_session", no_bigquery)
    monkeypatch.setattr(bigquery, "csv_chunks", no_bigquery)
    again = _staging_prepare(emulator, job, staged_table)
    assert again.train_source.files == train.files
    assert again.schema.columns == data.schema.columns
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    # A resume (schema.json written) opens the shards the schema records.
    job.create()
    (tmp_path / "job" / "schema.json").write_text(data.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    resumed = _staging_prepare(emulator, job, staged_table)
    assert resumed.train_source.files == train.files and resumed.train_rows == data.train_rows
    evaluator = _staging_prepare(emulator, job, staged_table, opens_train=False)
    assert evaluator.eval.files == train.files  # the hold-out of the shards


def test_an_interrupted_staging_is_done_again_from_the_start(
    emulator, staged_table, tmp_path, monkeypatch
):
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    folder = tmp_path / "job" / "data"
    write = bigquery._write_stream
    calls = []

    def crash_on_the_third(stream, *args):
        calls.append(stream)
        if len(calls) == 3:
            raise RuntimeError("the chief was preempted")
        return write(stream, *args)

    monkeypatch.setattr(bigquery, "_write_stream", crash_on_the_third)
    with pytest.raises(RuntimeError, match="preempted"):
        _staging_prepare(emulator, job, staged_table)
    assert not (folder / "train.json").exists()  # not finished: no manifest
    monkeypatch.setattr(bigquery, "_write_stream", write)
    data = _staging_prepare(emulator, job, staged_table)
    _, rows = _staged_rows(folder)
    assert sorted(int(r["id"]) for r in rows) == list(range(1, BIG_ROWS + 1))
    manifest = json.loads((folder / "train.json").read_text())
    assert sorted(os.listdir(folder)) == sorted(
        ["train.json"] + [os.path.basename(f["path"]) for f in manifest["files"]]
    )
    assert data.train_rows + data.eval_rows == BIG_ROWS


def test_bad_input_found_after_staging_leaves_no_shards(emulator, tmp_path, monkeypatch):
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    stage, staged = bigquery.BigQuery.stage, list[str]()

    def stage_and_look(self, source, **kwargs):
        result = stage(self, source, **kwargs)
        staged.extend(result.files)
        return result

    monkeypatch.setattr(bigquery.BigQuery, "stage", stage_and_look)
    with pytest.raises(InputError, match="'nope' is not a column of bq://test-project.ds.small"):
        input_lib.prepare(
            train_data=emulator.uri("ds.small"),
            eval_data=emulator.uri("ds.small_eval"),
            columns=ColumnChoices(label="nope", ignore=("day",)),
            holdout_fraction=0.1,
            options=InputOptions(bigquery=_connection(emulator)),
            seed=0,
            job=job,
            role=input_lib.Role.chief(stage_tables=True),
        )
    assert len(staged) == 2  # both tables were staged (one stream each) before the scan
    folder = tmp_path / "job" / "data"
    assert not folder.exists() or not list(folder.iterdir())


def test_a_job_that_reads_streams_is_not_resumed_with_parameter_servers(emulator, tmp_path):
    job = job_dir_lib.JobDir(str(tmp_path / "job"))
    common = dict(
        train_data=emulator.uri("ds.small"),
        eval_data=None,
        columns=ColumnChoices(label="target", ignore=("day",)),
        holdout_fraction=0.1,
        options=InputOptions(bigquery=_connection(emulator)),
        seed=0,
        job=job,
    )
    chief = input_lib.prepare(**common, role=input_lib.Role.chief())  # no ps: the streams
    job.create()
    (tmp_path / "job" / "schema.json").write_text(chief.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    with pytest.raises(InputError, match="started without parameter servers"):
        input_lib.prepare(**common, role=input_lib.Role.chief(stage_tables=True))


@pytest.mark.slow
def test_a_parameter_server_cluster_trains_on_a_table(emulator, tmp_path):
    """The default Vertex shape (chief, workers, ps) on bq:// tables: the chief stages them,
    the workers read the shards through the dataset function it traces."""
    from tests.distribute.test_distributed import Job

    env = task_env(**emulator.env())
    args = (
        f"--train_data={emulator.uri('ds.small')}",
        f"--eval_data={emulator.uri('ds.small_eval')}",
        "--label_column=target",
        "--ignore_columns=day",
        "--max_iterations=1",
        "--max_iteration_steps=400",
        "--learning_rate=0.01",
    )
    with Job(tmp_path, ClusterShape(workers=2, ps=1), *args, env=env) as job:
        assert job.cluster.wait(timeout=400) == 0
        report = job.report()
        assert report["status"] == "complete"
        assert report["final"]["examples"] == EVAL_ROWS
        # 181 of the 300 eval rows say "yes" (0.60). Asynchronous training reached 0.94-0.97
        # in nine runs here, but one CI run on two busy cores ended at 0.797; above 0.75 the
        # model has learned from the staged shards, which is what this test is about (inside
        # the `with`, a failure prints the cluster's log).
        trained = [
            (s["name"], s["steps"], s["eval"]) for s in report["iterations"][0]["subnetworks"]
        ]
        assert report["final"]["metrics"]["accuracy"] > 0.75, trained
    assert set(report["input"]["readers"]) == {"worker 0", "worker 1"}
    schema = json.loads((job.dir / "schema.json").read_text())
    for key, table, rows in (
        ("train", "ds.small", SMALL_ROWS),
        ("eval", "ds.small_eval", EVAL_ROWS),
    ):
        summary = schema["input"][key]
        assert summary["format"] == "csv" and summary["rows"] == rows
        assert summary["staged"]["table"] == emulator.uri(table)
        for entry in summary["staged"]["files"]:
            assert os.path.exists(entry["path"]) and f"/data/{key}-" in entry["path"]
    assert {c["name"]: c["kind"] for c in schema["columns"]}["flag"] == "categorical"
