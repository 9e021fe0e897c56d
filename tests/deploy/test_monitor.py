"""deploy.monitor: a model monitoring job on an endpoint, with the training data the trainer
recorded beside the exported model as the skew baseline; the request validated against the
discovery document by the fake Vertex AI service."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout

import pytest

from deploy import monitor
from deploy.cloud import api
from tests.deploy import discovery
from tests.deploy.test_predict import _deployed

MODEL = "gs://test-bucket/model"


def _text(model_dir: str, path: str) -> str:
    with open(os.path.join(model_dir, path)) as f:
        return f.read()


@pytest.fixture
def uploaded(census_model, gcs) -> dict:
    """The census model's monitoring files in the bucket (MODEL); its baseline."""
    bucket = gcs.bucket("test-bucket")
    for path in (monitor.BASELINE, monitor.INSTANCE_SCHEMA, monitor.ANALYSIS_SCHEMA):
        bucket.blob(f"model/{path}").upload_from_filename(os.path.join(census_model, path))
    return monitor.read_baseline(MODEL)


def test_the_trainer_exports_the_training_data_schema_and_statistics(census_model):
    baseline = json.loads(_text(census_model, monitor.BASELINE))
    assert baseline["target_field"] == "income_bracket"
    assert baseline["training_dataset"] is None, "local training data: Vertex cannot read it"
    assert baseline["train_data"].endswith("train.csv.gz")
    age, workclass = baseline["features"]["age"], baseline["features"]["workclass"]
    assert age["type"] == "number" and 17 <= age["min"] < age["mean"] < age["max"] <= 90
    assert workclass["type"] == "string" and 0.5 < workclass["top_values"]["Private"] < 0.9
    schema = _text(census_model, monitor.INSTANCE_SCHEMA)
    assert "  age:\n    type: number" in schema and "  workclass:\n    type: string" in schema
    analysis = _text(census_model, monitor.ANALYSIS_SCHEMA)
    assert "type: number" not in analysis, "the analysis schema has every field a string"


def test_the_job_monitors_every_feature_of_each_deployed_model(cloud_sdk, uploaded):
    fake, cloud = cloud_sdk
    endpoint = _deployed(cloud)
    monitoring = monitor.Monitoring(
        endpoint=endpoint,
        model_dir=MODEL,
        baseline=uploaded,
        emails=("me@example.com",),
        skew_threshold=0.2,
        thresholds={"age": 0.05},
        monitor_interval_hours=6,
        training_data="gs://test-bucket/data/train.csv",
    )
    created = monitor.create(cloud, monitoring)
    assert created.name.startswith(f"{cloud.parent}/modelDeploymentMonitoringJobs/")
    (body,) = fake.bodies("modelDeploymentMonitoringJobs.create")
    assert discovery.validate(body, "GoogleCloudAiplatformV1ModelDeploymentMonitoringJob") == []
    (config,) = body["modelDeploymentMonitoringObjectiveConfigs"]
    objective = config["objectiveConfig"]
    assert objective["trainingDataset"] == {
        "gcsSource": {"uris": ["gs://test-bucket/data/train.csv"]},
        "dataFormat": "csv",
        "targetField": "income_bracket",
    }
    skew = objective["trainingPredictionSkewDetectionConfig"]["skewThresholds"]
    assert set(skew) == set(uploaded["features"]) and skew["age"] == {"value": 0.05}
    assert skew["workclass"] == {"value": 0.2}
    assert objective["predictionDriftDetectionConfig"]["driftThresholds"]["age"] == {"value": 0.05}
    assert body["modelDeploymentMonitoringScheduleConfig"] == {"monitorInterval": "21600s"}
    assert body["predictInstanceSchemaUri"] == f"{MODEL}/{monitor.INSTANCE_SCHEMA}"
    assert body["modelMonitoringAlertConfig"] == {
        "emailAlertConfig": {"userEmails": ["me@example.com"]}
    }


@pytest.mark.parametrize(
    "change, said",
    [
        ({"skew_threshold": 0.0}, r"--skew_threshold \(0\) is a distance"),
        ({"drift_threshold": 1.5}, r"--drift_threshold \(1.5\)"),
        ({"thresholds": {"agee": 0.1}}, "--thresholds names agee, not a feature of the model"),
        ({"thresholds": {"age": -1}}, r"--thresholds age \(-1\)"),
        ({"sample_rate": 0}, "--sample_rate"),
        ({"training_data": None}, "cannot read .* pass it with --training_data=gs://"),
        ({"training_data": "/data/train.csv"}, "must be gs://"),
        ({"model_dir": "/local/model"}, "--model_dir"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_sent(census_model, change, said):
    baseline = json.loads(_text(census_model, monitor.BASELINE))
    settings = dict(
        endpoint="1", model_dir=MODEL, baseline=baseline, training_data="gs://b/train.csv"
    )
    with pytest.raises(api.DeployError, match=said):
        monitor.Monitoring(**{**settings, **change})


def test_a_model_without_a_baseline_is_refused(gcs, capsys):
    code = monitor.main(
        ["--project=my-project", "--endpoint=1", "--model_dir=gs://test-bucket/old", "--dry_run"]
    )
    assert code == 2
    assert "has no monitoring baseline" in capsys.readouterr().err


def test_dry_run_prints_the_request(uploaded):
    printed = io.StringIO()
    with redirect_stdout(printed):
        code = monitor.main(
            [
                "--project=my-project",
                "--endpoint=7",
                f"--model_dir={MODEL}",
                "--training_data=bq://my-project.census.train",
                "--drift_threshold=0",
                "--dry_run",
            ]
        )
    assert code == 0
    (request,) = json.loads(printed.getvalue())
    body = request["body"]
    assert request["url"].endswith("/locations/us-central1/modelDeploymentMonitoringJobs")
    (config,) = body["modelDeploymentMonitoringObjectiveConfigs"]
    assert config["deployedModelId"] == monitor.DEPLOYED_MODEL_PLACEHOLDER
    objective = config["objectiveConfig"]
    assert objective["trainingDataset"]["bigquerySource"] == {
        "inputUri": "bq://my-project.census.train"
    }
    assert "predictionDriftDetectionConfig" not in objective
    assert discovery.validate(body, "GoogleCloudAiplatformV1ModelDeploymentMonitoringJob") == []
