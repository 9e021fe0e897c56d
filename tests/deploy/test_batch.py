"""deploy.batch: the local twin's output layout and error handling, gs:// in and out, and the
Vertex BatchPredictionJob the SDK creates."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from deploy import api, batch
from tests.support import REPO

def _assert_same_predictions(got: list[dict], expected: list[dict]) -> None:
    """Equal classes; probabilities equal up to float32 rounding (batch sizes differ)."""
    assert [g["classes"] for g in got] == [e["classes"] for e in expected]
    np.testing.assert_allclose([g["probabilities"] for g in got],
                               [e["probabilities"] for e in expected], rtol=1e-5, atol=1e-7)


def _write_jsonl(path, rows, bad_lines=()):
    lines = [json.dumps(r) for r in rows]
    for index, text in bad_lines:
        lines.insert(index, text)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_bad_lines_are_reported_and_the_rest_predicted(tmp_path, predictor, census_rows):
    rows = census_rows[:20]
    wrong_type = dict(rows[0], age="forty")
    source = _write_jsonl(tmp_path / "in.jsonl", rows,
                          bad_lines=[(3, "{not json"), (7, json.dumps(wrong_type))])
    result = batch.predict_local(model_dir="", sources=[source], predictor=predictor,
                                 output_prefix=str(tmp_path / "out"), batch_size=8,
                                 num_shards=3, model_name="census")
    assert os.path.basename(result.output_dir).startswith("prediction-census-")
    names = sorted(os.listdir(result.output_dir))
    assert names == ["prediction.errors_stats-00000-of-00001",
                     *[f"prediction.results-0000{i}-of-00003" for i in range(3)]]
    results, errors = batch.read_results(result.output_dir)
    assert [r["instance"] for r in results] == rows  # in input order, none lost
    _assert_same_predictions([r["prediction"] for r in results], predictor.predict(rows))
    assert [e["error"]["message"] for e in errors] == [
        f"{source}:4: not JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))",
        f"{source}:8: field 'age' must be a number, got 'forty'."]
    assert errors[0]["instance"] == "{not json" and errors[1]["instance"] == wrong_type
    assert (result.num_predictions, result.num_errors) == (20, 2)


def test_csv_with_an_excluded_label_and_bad_rows(tmp_path, predictor, census_rows):
    header = [*census_rows[0], "income_bracket"]
    path = tmp_path / "in.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in census_rows[:10]:
            writer.writerow([*row.values(), "<=50K"])
        writer.writerow(["1", "2"])  # line 12: too few fields
        writer.writerow(["x", *list(census_rows[0].values())[1:], "<=50K"])  # line 13
    result = batch.predict_local(model_dir="", sources=[str(path)], predictor=predictor,
                                 output_prefix=str(tmp_path / "out"), instances_format="csv",
                                 excluded_fields=["income_bracket"])
    results, errors = batch.read_results(result.output_dir)
    assert [r["instance"] for r in results] == census_rows[:10]
    assert [e["error"]["message"].split(": ", 1) for e in errors] == [
        [f"{path}:12", "2 fields, the header has 15 (quote values that contain commas)"],
        [f"{path}:13", "field 'age' must be a number, got 'x'."]]


def test_gcs_in_and_out_through_the_emulator(gcs, tmp_path, predictor, census_rows):
    bucket = gcs.bucket("test-bucket")
    for part in range(2):
        bucket.blob(f"in/part-{part}.jsonl").upload_from_string(
            "".join(json.dumps(r) + "\n" for r in census_rows[part * 5:part * 5 + 5]))
    bucket.blob("in/other.txt").upload_from_string("not an input")
    result = batch.predict_local(model_dir="", sources=["gs://test-bucket/in/*.jsonl"],
                                 output_prefix="gs://test-bucket/out", predictor=predictor)
    assert result.output_dir.startswith("gs://test-bucket/out/prediction-model-")
    results, errors = batch.read_results(result.output_dir)
    assert [r["instance"] for r in results] == census_rows[:10] and errors == []


def test_nothing_is_written_for_bad_arguments(tmp_path, predictor):
    with pytest.raises(api.DeployError, match="--instances_format \\('parquet'\\)"):
        batch.predict_local(model_dir="", sources=["x"], output_prefix=str(tmp_path / "o"),
                            instances_format="parquet", predictor=predictor)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        batch.predict_local(model_dir="", sources=[str(tmp_path / "none-*.jsonl")],
                            output_prefix=str(tmp_path / "o"), predictor=predictor)
    assert not (tmp_path / "o").exists()


def test_vertex_job_through_the_sdk_matches_the_dry_run(cloud_sdk):
    fake, cloud = cloud_sdk
    model = fake.add_model(cloud.parent, "m")
    job = batch.VertexBatchJob(display_name="census-batch", model=model.rsplit("/", 1)[1],
                               sources=("gs://test-bucket/in/*.jsonl",),
                               output_prefix="gs://test-bucket/out", max_replica_count=4)
    created = batch.submit_vertex(cloud, job)
    assert created.resource_name.startswith(f"{cloud.parent}/batchPredictionJobs/")
    assert fake.bodies("batchPredictionJobs.create") == [job.request(cloud).body]


@pytest.mark.parametrize("changes, message", [
    (dict(sources=("data/in.jsonl",)), "--source"),
    (dict(output_prefix="out"), "--output_prefix"),
    (dict(instances_format="tf-record"), "--instances_format"),
    (dict(starting_replica_count=5), "below --starting_replica_count"),
])
def test_bad_vertex_jobs_fail_before_any_request(changes, message):
    options = dict(display_name="b", model="1", sources=("gs://b/in.jsonl",),
                   output_prefix="gs://b/out")
    with pytest.raises(api.DeployError, match=message):
        batch.VertexBatchJob(**{**options, **changes})


def test_command_line_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "deploy.batch", "vertex", "--project=my-project", "--model=7",
         "--source=gs://b/a.csv", "--output_prefix=gs://b/out", "--instances_format=csv",
         "--dry_run"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (request,) = json.loads(result.stdout)
    assert request["body"]["model"] == "projects/my-project/locations/us-central1/models/7"
    assert request["body"]["inputConfig"] == {"instancesFormat": "csv",
                                              "gcsSource": {"uris": ["gs://b/a.csv"]}}
