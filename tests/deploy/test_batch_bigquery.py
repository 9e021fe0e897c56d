"""Batch prediction from a BigQuery table (`--instances_format=bigquery`), against the local
BigQuery emulator (tests/bigquery_emulator.py): the local twin, the Vertex job over the table
converted first, and the job over the table as it is; with a key on every output line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deploy import batch
from deploy.batch_prediction import convert as batch_convert
from deploy.batch_prediction import local as batch_local
from deploy.batch_prediction import output
from deploy.batch_prediction import vertex as batch_vertex
from deploy.cloud import api
from tests import bigquery_emulator
from tests.deploy import discovery
from trainer.input.files import CENSUS_LABEL

TABLE = "ds.people"
ROWS = 120


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, census_rows_module):
    from google.cloud import bigquery

    with bigquery_emulator.start(tmp_path_factory.mktemp("bqemulator")) as emulator:
        client = emulator.client()
        client.create_dataset("ds")
        first = census_rows_module[0]
        schema = [bigquery.SchemaField("id", "STRING")] + [
            bigquery.SchemaField(name, "FLOAT64" if isinstance(v, float) else "STRING")
            for name, v in first.items()
        ]
        client.create_table(bigquery.Table(f"{emulator.project}.{TABLE}", schema=schema))
        rows = [{"id": f"p-{i:03d}", **row} for i, row in enumerate(census_rows_module)]
        rows[3]["age"] = None  # NULL: a missing value
        rows[4]["occupation"] = "Sales\nand more"  # a line end, which training reads as " "
        assert client.insert_rows_json(f"{emulator.project}.{TABLE}", rows) == []
        yield emulator


@pytest.fixture(scope="module")
def census_rows_module():
    import csv
    import gzip

    from trainer.input.files import CENSUS_TEST

    numeric = {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"}
    with gzip.open(CENSUS_TEST, "rt") as f:
        rows = [r for _, r in zip(range(ROWS), csv.DictReader(f, skipinitialspace=True))]
    return [{k: float(v) if k in numeric else v for k, v in r.items()} for r in rows]


@pytest.fixture
def table(emulator, monkeypatch):
    monkeypatch.setenv("BIGQUERY_STORAGE_EMULATOR_HOST", emulator.grpc)
    return emulator.uri(TABLE)


def _expected(predictor, census_rows_module) -> dict:
    """Each id's prediction, from the rows as JSON instances."""
    instances = [{k: v for k, v in r.items() if k != CENSUS_LABEL} for r in census_rows_module]
    instances[3]["age"] = None
    instances[4]["occupation"] = "Sales and more"
    return {f"p-{i:03d}": p for i, p in enumerate(predictor.predict(instances))}


def test_the_local_twin_predicts_a_table_with_a_key_on_every_line(
    table, predictor, census_model, census_rows_module, tmp_path
):
    result = batch_local.predict_local(
        model_dir=census_model,
        sources=[table],
        output_prefix=str(tmp_path),
        instances_format="bigquery",
        key_field="id",
        excluded_fields=[CENSUS_LABEL],
        predictor=predictor,
        batch_size=50,
    )
    assert (result.num_predictions, result.num_errors) == (ROWS, 0)
    results, errors = output.read_results(result.output_dir)
    assert errors == [] and all(set(r) == {"key", "prediction"} for r in results)
    expected = _expected(predictor, census_rows_module)
    assert sorted(r["key"] for r in results) == sorted(expected)
    for r in results:
        np.testing.assert_allclose(
            r["prediction"]["probabilities"], expected[r["key"]]["probabilities"], rtol=1e-5
        )


def test_a_table_s_rows_that_do_not_fit_are_listed_with_their_stream_and_row(
    table, predictor, census_model, tmp_path
):
    result = batch_local.predict_local(
        model_dir=census_model,
        sources=[table],
        output_prefix=str(tmp_path),
        instances_format="bigquery",
        key_field="no_such_column",
        predictor=predictor,
    )
    assert (result.num_predictions, result.num_errors) == (0, ROWS)
    _, errors = output.read_results(result.output_dir)
    assert errors[0]["error"]["message"] == (
        f"{table} stream 0 row 1: no field 'no_such_column' (--key_field)."
    )


@pytest.mark.parametrize(
    "sources, said",
    [
        (["bq://test-project.ds.people", "bq://test-project.ds.other"], "reads one table"),
        (["gs://b/a.jsonl"], "reads one table, bq://PROJECT.DATASET.TABLE"),
        (["bq://test-project.ds.missing"], "ds.missing was not found"),
    ],
)
def test_a_bad_table_is_refused_before_anything_is_written(
    table, predictor, census_model, tmp_path, sources, said
):
    with pytest.raises(api.DeployError, match=said):
        batch_local.predict_local(
            model_dir=census_model,
            sources=sources,
            output_prefix=str(tmp_path / "out"),
            instances_format="bigquery",
            predictor=predictor,
        )
    assert not (tmp_path / "out").exists()


def test_a_vertex_job_over_a_table_reads_it_converted_with_its_keys(
    table, cloud_sdk, gcs, census_model
):
    fake, cloud = cloud_sdk
    model = fake.add_model(cloud.parent, "census", "gs://test-bucket/model")
    job = batch_vertex.VertexBatchJob(
        display_name="census-table",
        model=model.rsplit("/", 1)[1],
        sources=(table,),
        output_prefix="gs://test-bucket/out",
        instances_format="bigquery",
    )
    converted = batch_convert.ConvertedVertexJob.of(
        job, key_field="id", excluded_fields=[CENSUS_LABEL], model_dir=census_model
    )
    conversion, created = batch_convert.submit_vertex_converted(cloud, converted)
    assert (conversion.num_rows, conversion.num_errors) == (ROWS, 0)
    (path,) = conversion.files
    assert path.endswith("/00000-test-project.ds.people.jsonl")
    bucket, name = path.removeprefix("gs://").split("/", 1)
    lines = [json.loads(x) for x in gcs.bucket(bucket).blob(name).download_as_text().splitlines()]
    assert sorted(x["id"] for x in lines) == [f"p-{i:03d}" for i in range(ROWS)]
    assert all(CENSUS_LABEL not in x for x in lines)
    assert np.isnan(next(x for x in lines if x["id"] == "p-003")["age"])  # NULL: NaN
    (body,) = fake.bodies("batchPredictionJobs.create")
    assert body["inputConfig"] == {
        "instancesFormat": "jsonl",
        "gcsSource": {"uris": [f"{conversion.instances_dir}/*.jsonl"]},
    }
    assert body["instanceConfig"] == {"keyField": "id"}
    assert created.name.startswith(f"{cloud.parent}/batchPredictionJobs/")


def test_a_vertex_job_over_a_table_as_it_is_sends_objects_and_the_instance_config(
    cloud_sdk, capsys
):
    fake, cloud = cloud_sdk
    model = fake.add_model(cloud.parent, "census", "gs://test-bucket/model")
    code = batch.main(
        [
            "vertex",
            "--project=my-project",
            f"--model={model.rsplit('/', 1)[1]}",
            "--source=bq://my-project.ds.people",
            "--instances_format=bigquery",
            "--output_prefix=gs://test-bucket/out",
            "--key_field=id",
            f"--excluded_fields={CENSUS_LABEL}",
            "--send_as_is",
            "--dry_run",
        ]
    )
    assert code == 0
    (request,) = json.loads(capsys.readouterr().out)
    body = request["body"]
    assert body["inputConfig"] == {
        "instancesFormat": "bigquery",
        "bigquerySource": {"inputUri": "bq://my-project.ds.people"},
    }
    assert body["instanceConfig"] == {
        "keyField": "id",
        "excludedFields": [CENSUS_LABEL],
        "instanceType": "object",
    }
    assert discovery.validate(body, "GoogleCloudAiplatformV1BatchPredictionJob") == []
    job = batch_vertex.VertexBatchJob(
        display_name="t",
        model=model,
        sources=("bq://my-project.ds.people",),
        output_prefix="gs://test-bucket/out",
        instances_format="bigquery",
        key_field="id",
    )
    batch_vertex.submit_vertex(cloud, job)  # the fake validates what the client sends
    (sent,) = fake.bodies("batchPredictionJobs.create")
    assert sent["instanceConfig"] == {"keyField": "id", "instanceType": "object"}
