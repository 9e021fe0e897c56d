"""deploy.vertex.registry: Model Registry versions and their aliases, the job's evaluation (its
metrics as Vertex's schemas have them) and the champion alias, decided as a truth table and
published through `deploy.publish` against the fake's registry, which refuses what Vertex
refuses. (The command line's registry flags: tests/deploy/test_publish.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from deploy.cloud import api
from deploy.vertex import aliases, publishing, registry
from deploy.vertex import evaluation as evaluation_lib
from tests.deploy import discovery
from tests.deploy.fake_vertex import ApiFailure, FakeVertex

CLASSIFICATION = (
    "GoogleCloudAiplatformV1SchemaModelevaluationMetricsClassificationEvaluationMetrics"
)
REGRESSION = "GoogleCloudAiplatformV1SchemaModelevaluationMetricsRegressionEvaluationMetrics"
EVAL_DATA = "gs://test-bucket/data/eval.csv"
PARENT = "projects/my-project/locations/us-central1"


def trainer_report(run: int, head: str = "binary", status: str = "complete", **metrics) -> dict:
    """A report.json as the trainer writes it, of the model of runs/<run>."""
    if not metrics:
        metrics = {"loss": 0.36, "accuracy": 0.84, "auc": 0.89}
    constant = {"loss": 0.55, "accuracy": 0.76, "auc": 0.5}
    if head == "regression":
        constant = {"loss": 1.0, "mse": 9.0}
    return {
        "status": status,
        "model_dir": f"gs://test-bucket/runs/{run}/model",
        "head": head,
        "final": {
            "eval_data": EVAL_DATA,
            "examples": 16281,
            "metrics": metrics,
            "constant": constant,
        },
    }


def _evaluation(run: int, head: str = "binary", **metrics) -> evaluation_lib.JobEvaluation:
    return evaluation_lib.JobEvaluation.of_report(
        trainer_report(run, head, **metrics),
        f"gs://test-bucket/runs/{run}/report.json",
        f"gs://test-bucket/runs/{run}/model",
    )


def _version(run: int, **registration) -> publishing.Deployment:
    """The model of runs/<run> as a version of the model "census"."""
    return publishing.Deployment(
        model_dir=f"gs://test-bucket/runs/{run}/model",
        display_name="census",
        endpoint_name="census",
        machine_type="n2-standard-4",
        max_replica_count=3,
        registration=registry.Registration(**registration),
    )


def _aliases(fake: FakeVertex, model: str) -> dict[str, list[str]]:
    """Each version's aliases, by version id."""
    return {v["versionId"]: v["versionAliases"] for v in fake._versions(model)}


def test_a_second_publish_is_version_2_of_the_same_model_with_its_aliases(cloud_sdk):
    fake, cloud = cloud_sdk
    first = publishing.publish(cloud, _version(1))
    d = _version(2, parent_model=first.model, version_aliases=("retrained", "canary"))
    dry = publishing.deploy_requests(cloud, d)  # (a first deployment, to a new endpoint)
    d = dataclasses.replace(d, traffic_percentage=10)
    second = publishing.publish(cloud, d)

    assert (second.model, first.version_id, second.version_id) == (first.model, "1", "2")
    sent = fake.bodies("models.upload")[1]
    assert sent == dry[0].body  # what --dry_run prints is what the SDK sends
    assert sent["parentModel"] == first.model
    assert sent["model"]["versionAliases"] == ["retrained", "canary", "default"]
    assert discovery.validate(sent, "GoogleCloudAiplatformV1UploadModelRequest") == []
    # "default" (the version a request naming none gets) moved to version 2 with the upload
    assert _aliases(fake, first.model) == {"1": [], "2": ["retrained", "canary", "default"]}
    assert fake.resources[first.model]["artifactUri"] == "gs://test-bucket/runs/2/model"
    # version 2 is deployed next to version 1, on the same endpoint
    deployed = fake.resources[second.endpoint]["deployedModels"]
    assert [m["model"] for m in deployed] == [f"{first.model}@1", f"{first.model}@2"]
    assert fake.resources[second.endpoint]["trafficSplit"] == {
        first.deployed_model_id: 90,
        second.deployed_model_id: 10,
    }


def test_keep_default_version_leaves_the_default_on_the_version_that_had_it(cloud_sdk):
    fake, cloud = cloud_sdk
    first = publishing.publish(cloud, _version(1))
    publishing.publish(cloud, _version(2, parent_model=first.model, keep_default_version=True))
    assert "versionAliases" not in fake.bodies("models.upload")[1]["model"]
    assert _aliases(fake, first.model) == {"1": ["default"], "2": []}
    assert fake.resources[first.model]["artifactUri"] == "gs://test-bucket/runs/1/model"


def test_a_parent_model_named_by_display_name_is_looked_up(cloud_sdk):
    fake, cloud = cloud_sdk
    model = fake.add_model(cloud.parent, "census")
    fake.add_model(cloud.parent, "census-eu")
    published = publishing.publish(cloud, _version(2, parent_model="census"))
    assert (published.model, published.version_id) == (model, "2")
    assert fake.bodies("models.upload")[0]["parentModel"] == model
    (listed,) = [r for r in fake.requests if r.method_id and r.method_id.endswith("models.list")]
    assert f"--parent_model 'census' is {model}" in published.notes[0]

    # no model of that name: a new model
    new = publishing.publish(cloud, _version(3, parent_model="census-us"))
    assert new.model != model and new.version_id == "1"
    assert "no model is named 'census-us'" in new.notes[0]
    assert "parentModel" not in fake.bodies("models.upload")[1]


def test_a_display_name_of_several_models_is_an_error_naming_them(cloud_sdk):
    fake, cloud = cloud_sdk
    models = [fake.add_model(cloud.parent, "census") for _ in range(2)]
    with pytest.raises(api.DeployError, match="2 models have that display name") as error:
        publishing.publish(cloud, _version(2, parent_model="census"))
    assert all(m in str(error.value) for m in models)
    assert fake.bodies("models.upload") == []


def test_the_champion_alias_moves_only_when_the_metric_improves(cloud_sdk):
    fake, cloud = cloud_sdk

    def run(number: int, metric: str = "accuracy", **metrics) -> publishing.Published:
        return publishing.publish(
            cloud,
            _version(
                number,
                parent_model="census",
                evaluation=_evaluation(number, **metrics),
                champion=aliases.Champion("champion", metric),
            ),
        )

    first = run(1, loss=0.40, accuracy=0.80)
    model = first.model
    assert "'champion' goes to version 1: no version held it" in first.notes[-1]
    assert _aliases(fake, model) == {"1": ["default", "champion"]}

    better = run(2, loss=0.35, accuracy=0.84)
    assert "'champion' moves from version 1 to version 2" in better.notes[-1]
    assert (
        "version 2 accuracy 0.8400, version 1 accuracy 0.8000; higher is better"
        in (better.notes[-1])
    )
    worse = run(3, loss=0.30, accuracy=0.82)
    assert "'champion' stays on version 2" in worse.notes[-1]
    tie = run(4, loss=0.36, accuracy=0.84)
    assert "a tie keeps the holder" in tie.notes[-1]
    assert _aliases(fake, model)["2"] == ["champion"]
    # loss: lower is better; version 2's loss (0.35) comes from its imported evaluation
    lower = run(5, "loss", loss=0.33, accuracy=0.70)
    assert "version 5 loss 0.3300, version 2 loss 0.3500; lower is better" in lower.notes[-1]
    assert _aliases(fake, model) == {
        "1": [],
        "2": [],
        "3": [],
        "4": [],
        "5": ["default", "champion"],  # every upload took "default": not gated
    }
    assert fake.bodies("mergeVersionAliases") == [{"versionAliases": ["champion"]}] * 3
    assert len(fake.bodies("evaluations.import")) == 5


def test_the_default_alias_as_champion_goes_only_to_a_better_version(cloud_sdk):
    fake, cloud = cloud_sdk

    def run(number: int, accuracy: float) -> publishing.Published:
        return publishing.publish(
            cloud,
            _version(
                number,
                parent_model="census",
                evaluation=_evaluation(number, loss=0.4, accuracy=accuracy),
                champion=aliases.Champion("default", "accuracy"),
            ),
        )

    first = run(1, 0.80)
    assert "version 1 holds 'default' already" in first.notes[-1]
    run(2, 0.79)
    assert "versionAliases" not in fake.bodies("models.upload")[1]["model"]
    assert fake.resources[first.model]["artifactUri"] == "gs://test-bucket/runs/1/model"
    run(3, 0.81)
    assert _aliases(fake, first.model) == {"1": [], "2": [], "3": ["default"]}
    assert fake.resources[first.model]["artifactUri"] == "gs://test-bucket/runs/3/model"


def test_a_holder_without_an_imported_evaluation_keeps_the_alias(cloud_sdk):
    fake, cloud = cloud_sdk
    first = publishing.publish(cloud, _version(1, version_aliases=("champion",)))
    second = publishing.publish(
        cloud,
        _version(
            2,
            parent_model=first.model,
            evaluation=_evaluation(2),
            champion=aliases.Champion("champion", "auc"),
        ),
    )
    assert (
        "'champion' stays on version 1: it has no imported evaluation with auc"
        in (second.notes[-1])
    )
    assert _aliases(fake, first.model)["1"] == ["champion"]


def test_the_evaluation_import_validates_against_the_api_schema(cloud_sdk):
    fake, cloud = cloud_sdk
    d = _version(1, evaluation=_evaluation(1))
    dry = publishing.deploy_requests(cloud, d)
    published = publishing.publish(cloud, d)

    (sent,) = fake.bodies("evaluations.import")
    assert sent == dry[1].body
    assert discovery.validate(sent, "GoogleCloudAiplatformV1ImportModelEvaluationRequest") == []
    evaluation = sent["modelEvaluation"]
    assert evaluation["metricsSchemaUri"] == evaluation_lib.CLASSIFICATION_METRICS
    assert evaluation["metrics"] == {"logLoss": 0.36, "auRoc": 0.89}
    assert discovery.validate(evaluation["metrics"], CLASSIFICATION) == []
    assert evaluation["metadata"]["trainer_metrics"] == {
        "loss": 0.36,
        "accuracy": 0.84,
        "auc": 0.89,
    }
    assert evaluation["metadata"]["eval_data"] == EVAL_DATA
    # imported for the new version, and read back through the client library
    assert published.evaluation and published.evaluation.startswith(published.model)
    listed = cloud.model_client().list_model_evaluations(parent=f"{published.model}@1")
    assert [e.name for e in listed] == [published.evaluation]
    assert [r.method_id for r in fake.requests if "evaluations" in (r.method_id or "")] == [
        "aiplatform.projects.locations.models.evaluations.import",
        "aiplatform.projects.locations.models.evaluations.list",
    ]


@pytest.mark.parametrize(
    "head, metrics, expected",
    [
        ("binary", {"loss": 0.3, "accuracy": 0.9, "auc": 0.95}, {"logLoss": 0.3, "auRoc": 0.95}),
        (
            "binary",
            {"loss": 0.3, "accuracy": 0.9, "auc": 0.95, "auc_pr": 0.8},
            {"logLoss": 0.3, "auRoc": 0.95, "auPrc": 0.8},
        ),
        ("multiclass", {"loss": 0.7, "accuracy": 0.6}, {"logLoss": 0.7}),
        (
            "regression",
            {"loss": 0.2, "mse": 4.0, "mae": 1.5},
            {"rootMeanSquaredError": 2.0, "meanAbsoluteError": 1.5},
        ),
        ("binary", {"loss": float("nan")}, {}),  # not finite: left out
    ],
)
def test_evaluation_metrics_are_the_schema_fields_the_report_measures(head, metrics, expected):
    body = _evaluation(1, head, **metrics).body()
    schema = REGRESSION if head == "regression" else CLASSIFICATION
    uri = (
        evaluation_lib.REGRESSION_METRICS
        if head == "regression"
        else evaluation_lib.CLASSIFICATION_METRICS
    )
    assert body["metricsSchemaUri"] == uri
    assert body["metrics"] == expected
    assert discovery.validate(body["metrics"], schema) == []
    assert discovery.validate(body, "GoogleCloudAiplatformV1ModelEvaluation") == []


@pytest.mark.parametrize(
    "metric, new, held, move, reason",
    [
        ("accuracy", 0.85, 0.80, True, "moves from version 1 to version 2"),
        ("accuracy", 0.80, 0.85, False, "stays on version 1"),
        ("auc", 0.90, 0.90, False, "a tie keeps the holder"),
        ("loss", 0.30, 0.35, True, "lower is better"),
        ("mse", 4.1, 4.0, False, "stays on version 1"),
        ("mae", 1.0, 1.2, True, "moves"),
        ("accuracy", 0.85, None, False, "no imported evaluation with accuracy"),
        ("accuracy", None, 0.85, False, "version 2 has no accuracy"),
    ],
)
def test_champion_decisions(metric, new, held, move, reason):
    decision = aliases.decide(
        aliases.Champion("champion", metric),
        aliases.Measured("2", new, EVAL_DATA),
        aliases.Measured("1", held, EVAL_DATA),
    )
    assert decision.move is move and reason in decision.reason


def test_champion_decisions_without_a_holder_or_on_other_data():
    champion = aliases.Champion("champion", "accuracy")
    first = aliases.decide(champion, aliases.Measured("1", 0.8), None)
    assert first.move and "no version held it" in first.reason
    same = aliases.decide(champion, aliases.Measured("1", 0.8), aliases.Measured("1", None))
    assert not same.move and "holds 'champion' already" in same.reason
    other = aliases.decide(
        champion, aliases.Measured("2", 0.9, "b.csv"), aliases.Measured("1", 0.8, "a.csv")
    )
    assert other.move and "measured on different eval data, a.csv and b.csv" in other.reason


def _imported(head: str, newer: bool = False, **trainer_metrics) -> dict:
    body = _evaluation(1, head, **trainer_metrics).body()
    return {**body, "createTime": "2026-11-23T00:00:00Z" if newer else "2026-11-22T00:00:00Z"}


@pytest.mark.parametrize(
    "evaluations, metric, head, expected",
    [
        ([_imported("binary", accuracy=0.8)], "accuracy", "binary", 0.8),
        # the newest evaluation that has the metric
        (
            [_imported("binary", accuracy=0.8), _imported("binary", True, accuracy=0.7)],
            "accuracy",
            "binary",
            0.7,
        ),
        # another kind of label: not comparable
        ([_imported("multiclass", accuracy=0.8)], "accuracy", "binary", None),
        # another tool's evaluation: the metrics schema's fields
        (
            [
                {
                    "metricsSchemaUri": evaluation_lib.CLASSIFICATION_METRICS,
                    "metrics": {"logLoss": 0.4},
                }
            ],
            "loss",
            "binary",
            0.4,
        ),
        (
            [
                {
                    "metricsSchemaUri": evaluation_lib.REGRESSION_METRICS,
                    "metrics": {"rootMeanSquaredError": 3.0},
                }
            ],
            "mse",
            "regression",
            9.0,
        ),
        (
            [
                {
                    "metricsSchemaUri": evaluation_lib.CLASSIFICATION_METRICS,
                    "metrics": {"auRoc": 0.9},
                }
            ],
            "accuracy",
            "binary",
            None,
        ),
        ([], "auc", "binary", None),
        (  # another tool's auPrc
            [
                {
                    "metricsSchemaUri": evaluation_lib.CLASSIFICATION_METRICS,
                    "metrics": {"auPrc": 0.7},
                }
            ],
            "auc_pr",
            "binary",
            0.7,
        ),
    ],
)
def test_the_holders_metric_is_read_from_its_evaluations(evaluations, metric, head, expected):
    assert aliases.measured("1", evaluations, metric, head).value == expected


UPLOAD_VERSION = "/v1/projects/my-project/locations/us-central1/models:upload"


@pytest.mark.parametrize(
    "method, path, body, code, message",
    [
        (
            "POST",
            UPLOAD_VERSION,
            {"model": {"displayName": "m", "versionAliases": ["2"]}},
            400,
            "does not match",
        ),
        (
            "POST",
            UPLOAD_VERSION,
            {"model": {"displayName": "m"}, "parentModel": f"{PARENT}/models/9"},
            404,
            "not found",
        ),
        (
            "POST",
            UPLOAD_VERSION,
            {"model": {"displayName": "m"}, "parentModel": "{model}@1"},
            400,
            "no @",
        ),
        ("POST", "/v1/{model}:mergeVersionAliases", {"versionAliases": ["best"]}, 400, "MODEL@ID"),
        (
            "POST",
            "/v1/{model}@1:mergeVersionAliases",
            {"versionAliases": ["-default"]},
            400,
            "one version must hold",
        ),
        (
            "POST",
            "/v1/{model}@1:mergeVersionAliases",
            {"versionAliases": ["Best!"]},
            400,
            "does not match",
        ),
        (
            "POST",
            "/v1/{model}@1:mergeVersionAliases",
            {"versionAlias": ["best"]},
            400,
            "unknown field",
        ),
        (
            "POST",
            "/v1/{model}@3/evaluations:import",
            {"modelEvaluation": {}},
            404,
            "no version or alias '3'",
        ),
        (
            "POST",
            "/v1/{model}@1/evaluations:import",
            {
                "modelEvaluation": {
                    "metricsSchemaUri": evaluation_lib.CLASSIFICATION_METRICS,
                    "metrics": {"accuracy": 0.8},
                }
            },
            400,
            r"metrics.accuracy: unknown field",
        ),
        (
            "POST",
            "/v1/{model}@1/evaluations:import",
            {
                "modelEvaluation": {
                    "metricsSchemaUri": evaluation_lib.REGRESSION_METRICS,
                    "metrics": {"meanAbsoluteError": "1"},
                }
            },
            400,
            "expected number",
        ),
        (
            "POST",
            "/v1/{model}@1/evaluations:import",
            {"modelEvaluation": {"metricsSchemaUri": "gs://b/mine.yaml", "metrics": {"x": 1}}},
            400,
            "is not one of",
        ),
        (
            "POST",
            "/v1/{model}@1/evaluations:import",
            {
                "modelEvaluation": {
                    "name": "e",
                    "metricsSchemaUri": evaluation_lib.REGRESSION_METRICS,
                }
            },
            400,
            "output-only field",
        ),
    ],
)
def test_the_fake_registry_refuses_what_vertex_refuses(method, path, body, code, message):
    with FakeVertex() as fake:
        model = fake.add_model(PARENT, "census")
        path = path.replace("{model}", model)
        body = json.loads(json.dumps(body).replace("{model}", model))
        with pytest.raises(ApiFailure, match=message) as failure:
            fake.handle(method, path, {}, body)
        assert failure.value.code == code


def test_the_fake_moves_an_alias_given_to_another_version():
    with FakeVertex() as fake:
        model = fake.add_model(PARENT, "census")
        upload = {
            "model": {"displayName": "census", "versionAliases": ["best"]},
            "parentModel": model,
        }
        fake.handle("POST", UPLOAD_VERSION, {}, upload)
        fake.handle("POST", UPLOAD_VERSION, {}, {**upload, "model": {"displayName": "census"}})
        assert _aliases(fake, model) == {"1": ["default"], "2": ["best"], "3": []}
        fake.handle(
            "POST",
            f"/v1/{model}@3:mergeVersionAliases",
            {},
            {"versionAliases": ["best", "default"]},
        )
        assert _aliases(fake, model) == {"1": [], "2": [], "3": ["best", "default"]}
        assert fake.handle("GET", f"/v1/{model}@best", {}, None)["versionId"] == "3"
        assert fake.handle("GET", f"/v1/{model}", {}, None)["versionId"] == "3"
        listed = fake.handle(
            "GET", f"/v1/{PARENT}/models", {"filter": 'display_name="census"'}, None
        )
        assert [m["versionId"] for m in listed["models"]] == ["3"]  # one per model: its default


def test_the_newest_evaluation_wins_also_within_one_second():
    """RFC 3339 stamps with and without fractions: '...00.500Z' is after '...00Z'."""
    older = {**_imported("binary", accuracy=0.80), "createTime": "2026-11-27T10:00:00Z"}
    newer = {**_imported("binary", accuracy=0.90), "createTime": "2026-11-27T10:00:00.500Z"}
    for evaluations in ([older, newer], [newer, older]):
        assert aliases.measured("1", evaluations, "accuracy", "binary").value == 0.90


def test_a_job_with_test_data_imports_its_test_metrics():
    """A job given test data (--test_data, a managed dataset's test split) is evaluated on it:
    the imported evaluation is the test split's, not the eval rows'."""
    report = trainer_report(1, "binary", loss=0.30, auc=0.90)
    report["test"] = {
        "test_data": "gs://test-bucket/dataset/test-*",
        "examples": 5000,
        "metrics": {"loss": 0.35, "auc": 0.88, "accuracy": 0.84},
        "constant": {"loss": 0.55},
    }
    evaluation = evaluation_lib.JobEvaluation.of_report(
        report, "gs://test-bucket/runs/1/report.json", "gs://test-bucket/runs/1/model"
    )
    assert evaluation.eval_data == "gs://test-bucket/dataset/test-*"
    assert evaluation.examples == 5000
    assert evaluation.body()["metrics"] == {"logLoss": 0.35, "auRoc": 0.88}


def test_every_metric_the_trainer_reports_has_a_direction():
    from tests.model.test_heads import BINARY, MULTICLASS, REGRESSION
    from trainer.model.heads import Head

    reported = {m for label in (BINARY, MULTICLASS, REGRESSION) for m in Head(label).metric_names}
    assert set(evaluation_lib.HIGHER_IS_BETTER) == reported
