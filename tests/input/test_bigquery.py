"""BigQuery input against a local emulator (tests/bigquery_emulator.py) with the real client
libraries: the Storage Read API's streams as the pipeline's files, sharded across readers,
and bad tables stopping the trainer before any work."""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import numpy as np
import pytest

from tests import bigquery_emulator
from tests.support import FAST_FLAGS, load_report, parsed_flags, run_in_process, run_task, task_env
from trainer import job_dir as job_dir_lib
from trainer import task
from trainer.environment import Environment
from trainer.errors import InputError
from trainer.input import bigquery, scan
from trainer.input import job as input_lib
from trainer.input.options import BadRows, BigQueryConnection, InputOptions
from trainer.input.pipeline import Pipeline, Selection, Shard
from trainer.schema import CategoricalColumn, ColumnChoices

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
        input_lib.prepare(**common, scan_if_new=False, wait_secs=0)
    chief = input_lib.prepare(**common, scan_if_new=True)
    assert chief.train_rows == SMALL_ROWS and chief.eval_rows == EVAL_ROWS
    job.create()
    (tmp_path / "job" / "schema.json").write_text(chief.schema.to_json())
    (tmp_path / "job" / "run.json").write_text("{}")
    worker = input_lib.prepare(**common, scan_if_new=False, wait_secs=5)
    for theirs, ours in ((worker.train_source, chief.train_source), (worker.eval, chief.eval)):
        assert theirs.session is not None and ours.session is not None
        assert theirs.files == ours.files and theirs.session.name == ours.session.name
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
            f"--train_data={emulator_env.uri('ds.small')}",
            "--label_column=target",
            f"--job_dir={job}",
        ]
    )
    assert code == 2
    assert "day (DATE)" in stderr and "--ignore_columns=day" in stderr
    assert not job.exists() or not any(job.iterdir())


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
        ({"AIP_DATA_FORMAT": "jsonl"}, "JSON Lines input is not supported"),
        ({"AIP_DATA_FORMAT": "bigquery"}, "does not start with bq://"),
    ],
)
def test_a_bad_managed_dataset_is_named(environ, said):
    with pytest.raises(InputError, match=said.replace("(", r"\(")):
        _config({"AIP_TRAINING_DATA_URI": "gs://b/training-*", **environ})


def test_a_table_with_parameter_servers_is_refused():
    tf_config = (
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},'
        ' "task": {"type": "chief", "index": 0}}'
    )
    with pytest.raises(InputError, match="parameter-server workers cannot run"):
        _config({"TF_CONFIG": tf_config}, ["--label_column=y", "--train_data=bq://p.ds.t"])
