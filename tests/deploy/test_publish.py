"""deploy.publish: upload, endpoint, deploy, traffic split and clean-up through the SDK;
--explain's explanation spec, validated by the fake as Vertex would; the command line's Model
Registry flags, checked before any request and shown by --dry_run (what they do:
tests/deploy/test_registry.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from deploy import publish
from deploy.cloud import api
from deploy.serving import signature
from deploy.vertex import publishing, registry
from tests.deploy import discovery
from tests.deploy import test_signature as signature_test
from tests.deploy.fake_vertex import ApiFailure, FakeVertex, explanation_problems
from tests.deploy.test_registry import PARENT, trainer_report
from tests.gcs import outside_environment
from tests.support import REPO


def _deployment(**changes) -> publishing.Deployment:
    options = dict(
        model_dir="gs://test-bucket/runs/1/model",
        display_name="census-v1",
        endpoint_name="census",
        machine_type="n2-standard-4",
        max_replica_count=3,
    )
    return publishing.Deployment(**{**options, **changes})


def test_publish_sends_the_dry_run_bodies_and_deploys(cloud_sdk):
    fake, cloud = cloud_sdk
    d = _deployment()
    dry = publishing.deploy_requests(cloud, d)
    published = publishing.publish(cloud, d)

    assert fake.bodies("models.upload") == [dry[0].body]
    assert fake.bodies("endpoints.create") == [dry[2].body]
    # The SDK names the uploaded version (model@1) in the deploy request.
    expected = json.loads(
        json.dumps(dry[3].body).replace(publishing.PENDING_MODEL, published.model + "@1")
    )
    assert fake.bodies("endpoints.deployModel") == [expected]
    endpoint = fake.resources[published.endpoint]
    assert endpoint["trafficSplit"] == {published.deployed_model_id: 100}
    resources = endpoint["deployedModels"][0]["dedicatedResources"]
    assert resources["maxReplicaCount"] == 3
    assert fake.resources[published.model]["containerSpec"]["imageUri"] == publishing.SERVING_IMAGE


def test_second_model_reuses_the_endpoint_and_splits_traffic_then_cleanup(cloud_sdk):
    fake, cloud = cloud_sdk
    first = publishing.publish(cloud, _deployment())
    second = publishing.publish(cloud, _deployment(display_name="census-v2", traffic_percentage=30))
    assert second.endpoint == first.endpoint
    assert len(fake.bodies("endpoints.create")) == 1
    assert fake.resources[first.endpoint]["trafficSplit"] == {
        second.deployed_model_id: 30,
        first.deployed_model_id: 70,
    }

    publishing.cleanup(cloud, first.endpoint, first.model)
    assert first.endpoint not in fake.resources and first.model not in fake.resources
    assert len(fake.bodies("endpoints.undeployModel")) == 2
    assert second.model in fake.resources  # only the named model is deleted


@pytest.mark.parametrize(
    "current, percentage, expected",
    [
        ({}, 100, {"0": 100}),
        ({"a": 100}, 30, {"0": 30, "a": 70}),
        ({"a": 50, "b": 50}, 25, {"0": 25, "a": 38, "b": 37}),
        ({"a": 90, "b": 10}, 0, {"0": 0, "a": 90, "b": 10}),
        ({"a": 1, "b": 1, "c": 1}, 1, {"0": 1, "a": 33, "b": 33, "c": 33}),
    ],
)
def test_traffic_split_adds_up_to_100(current, percentage, expected):
    split = publishing.traffic_split(current, percentage)
    assert split == expected and sum(split.values()) == 100


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_dir="runs/1/model"), "--model_dir"),
        (dict(min_replica_count=0), "--min_replica_count"),
        (dict(min_replica_count=4), r"--max_replica_count \(3\) is below"),
        (dict(traffic_percentage=101), "between 0 and 100"),
    ],
)
def test_bad_deployments_fail_before_any_request(changes, message):
    with pytest.raises(api.DeployError, match=message):
        _deployment(**changes)


def test_first_model_on_an_endpoint_needs_all_traffic():
    with pytest.raises(api.DeployError, match="must be 100 for the first model"):
        publishing.traffic_split({}, 50)


def test_command_line_dry_run_prints_requests():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.publish",
            "deploy",
            "--project=my-project",
            "--model_dir=gs://b/model",
            "--display_name=m",
            "--endpoint_name=e",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    requests = json.loads(result.stdout)
    assert [r["method"] for r in requests] == ["POST", "GET", "POST", "POST"]
    assert requests[0]["url"] == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/"
        "my-project/locations/us-central1/models:upload"
    )
    cleanup = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.publish",
            "cleanup",
            "--project=my-project",
            "--endpoint=12",
            "--model=34",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert [r["method"] for r in json.loads(cleanup.stdout)] == ["GET", "POST", "DELETE", "DELETE"]


# -- explanations ----------------------------------------------------------------------------

EXPLANATION = publishing.Explanation(inputs=("age", "occupation"), output="probabilities")
UPLOAD = "/v1/projects/my-project/locations/us-central1/models:upload"


def test_explain_uploads_the_dry_run_spec_and_the_fake_accepts_it(cloud_sdk):
    fake, cloud = cloud_sdk
    d = _deployment(explanation=publishing.Explanation(("age", "occupation"), "probabilities", 12))
    dry = publishing.deploy_requests(cloud, d)
    published = publishing.publish(cloud, d)

    (sent,) = fake.bodies("models.upload")
    assert sent == dry[0].body  # what --dry_run prints is what the SDK sends
    assert sent["model"]["explanationSpec"] == {
        "parameters": {"sampledShapleyAttribution": {"pathCount": 12}},
        "metadata": {
            "inputs": {
                "age": {"inputTensorName": "age"},
                "occupation": {"inputTensorName": "occupation"},
            },
            "outputs": {"probabilities": {"outputTensorName": "probabilities"}},
        },
    }
    assert discovery.route("POST", UPLOAD) == (
        "aiplatform.projects.locations.models.upload",
        "GoogleCloudAiplatformV1UploadModelRequest",
    )
    assert discovery.validate(sent, "GoogleCloudAiplatformV1UploadModelRequest") == []
    assert explanation_problems(sent["model"]) == []
    stored = fake.resources[published.model]["explanationSpec"]
    assert stored["parameters"]["sampledShapleyAttribution"]["pathCount"] == 12


def _upload_body(**spec_changes) -> dict:
    spec = EXPLANATION.spec()
    for path, value in spec_changes.items():
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        node[leaf] = value
    return {"model": {**_deployment().upload_body()["model"], "explanationSpec": spec}}


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"parameters.sampledShapleyAttribution.pathCount": 0},
            r"pathCount: 0 is not in \[1, 50\]",
        ),
        ({"parameters.sampledShapleyAttribution.pathCount": 51}, "pathCount: 51 is not in"),
        ({"parameters.xraiAttribution": {"stepCount": 50}}, "needs exactly one of"),
        ({"metadata.outputs.logits": {"outputTensorName": "logits"}}, "exactly one output, got 2"),
        ({"metadata.inputs": {}}, r"metadata.inputs: required"),
        ({"metadata.inputs.age": {}}, r"inputs\['age'\].inputTensorName: required"),
        # the schema: an unknown field, a wrong type
        ({"parameters.sampledShapleyAttribution.pathCounts": 5}, "unknown field"),
        ({"metadata.inputs.age.inputTensorName": 3}, "expected string"),
    ],
)
def test_the_fake_refuses_the_specs_vertex_refuses(changes, message):
    with FakeVertex() as fake:
        fake.handle("POST", UPLOAD, {}, _upload_body())  # the unchanged spec is accepted
        with pytest.raises(ApiFailure, match=message) as failure:
            fake.handle("POST", UPLOAD, {}, _upload_body(**changes))
        assert failure.value.code == 400


@pytest.mark.parametrize("path_count", [0, 51, -3])
def test_a_path_count_outside_vertex_range_is_a_named_error(path_count):
    with pytest.raises(api.DeployError, match=rf"--explain_path_count \({path_count}\) must be"):
        publishing.Explanation(("age",), "probabilities", path_count)


def test_explain_needs_an_output_to_explain():
    outputs = {"scores": signature.Tensor("StatefulPartitionedCall:0", "float32")}
    inputs = {"age": signature.Tensor("serving_default_age:0", "float32")}
    with pytest.raises(api.DeployError, match="needs a float32 output named probabilities"):
        publishing.Explanation.of(signature.Signature(inputs, outputs), 10)


def _dry_run(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.publish",
            "deploy",
            "--project=my-project",
            "--display_name=m",
            "--endpoint_name=e",
            "--dry_run",
            *flags,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )


def test_a_dry_run_needs_no_credentials(tmp_path):
    """Without credentials (none in the environment, no metadata server asked) a dry run of
    --report and --explain on gs:// prints the requests it can, saying what it left out; the
    same command run for real stops in one line naming the fix."""
    env = {  # this machine's, without the session's Cloud Storage emulator (tests/gcs.py)
        k: v
        for k, v in outside_environment().items()
        if not k.startswith(("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR"))
    }
    env.update(NO_GCE_CHECK="true", HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path))
    flags = [
        "--model_dir=gs://my-bucket/runs/2/model",
        "--report=gs://my-bucket/runs/2/checkpoints/report.json",
        "--parent_model=census",
        "--champion_alias=champion",
        "--explain",
    ]
    dry = _dry_run(*flags, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: --report not read" in dry.stderr
    assert "dry run: the model's signature not read" in dry.stderr
    (upload,) = [r for r in json.loads(dry.stdout) if r["url"].endswith("/models:upload")]
    inputs = upload["body"]["model"]["explanationSpec"]["metadata"]["inputs"]
    assert list(inputs) == [publishing.DRY_RUN_INPUTS]
    real = subprocess.run(
        [sys.executable, "-m", "deploy.publish", "deploy", "--project=my-project",
         "--display_name=m", "--endpoint_name=e", *flags],
        cwd=REPO, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert real.returncode == 2
    assert real.stderr.count("\n") == 1 and "DefaultCredentialsError" in real.stderr


def test_command_line_refuses_a_bad_path_count_before_reading_the_model():
    result = _dry_run(
        "--model_dir=gs://no-such-bucket/model", "--explain", "--explain_path_count=60"
    )
    assert result.returncode == 2
    assert "--explain_path_count (60) must be between 1 and 50" in result.stderr
    assert result.stdout == ""
    alone = _dry_run("--model_dir=gs://b/model", "--explain_path_count=5")
    assert alone.returncode == 2 and "--explain_path_count needs --explain" in alone.stderr


def test_command_line_dry_run_shows_the_spec_of_the_models_inputs(gcs, tmp_path):
    model = signature_test.save_tiny_model(tmp_path / "model")
    blob = gcs.bucket("test-bucket").blob("runs/1/model/saved_model.pb")
    blob.upload_from_filename(str(model / "saved_model.pb"))

    result = _dry_run("--model_dir=gs://test-bucket/runs/1/model", "--explain")
    assert result.returncode == 0, result.stderr
    upload = json.loads(result.stdout)[0]
    assert upload["url"].endswith("/models:upload")
    spec = upload["body"]["model"]["explanationSpec"]
    assert spec["parameters"] == {
        "sampledShapleyAttribution": {"pathCount": publishing.DEFAULT_PATH_COUNT}
    }
    assert spec["metadata"]["inputs"] == {
        "age": {"inputTensorName": "age"},
        "workclass": {"inputTensorName": "workclass"},
    }
    assert spec["metadata"]["outputs"] == {"probabilities": {"outputTensorName": "probabilities"}}

    missing = _dry_run("--model_dir=gs://test-bucket/runs/2/model", "--explain")
    assert missing.returncode == 2
    assert "--model_dir gs://test-bucket/runs/2/model: cannot read" in missing.stderr


# -- the Model Registry flags (what they do: test_registry.py) -------------------------------


def _write_report(tmp_path, name: str, report: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--version_aliases=Champion"], r"--version_aliases \('Champion'\) is not a Vertex"),
        (["--version_aliases=2"], "never reads as a version id"),
        (["--version_aliases=a"], "2-128 lowercase letters"),
        (["--version_aliases=canary-"], "a letter or digit last"),
        (["--version_aliases=canary,canary"], "names an alias twice"),
        (["--version_aliases=default"], "'default' is not set there"),
        (["--champion_alias=champion"], "needs --report=JOB_DIR/report.json"),
        (["--champion_metric=auc"], "--champion_metric needs --champion_alias"),
        (["--champion_alias=Best", "--report={ok}"], r"--champion_alias \('Best'\)"),
        (["--champion_alias=best", "--champion_metric=f1", "--report={ok}"], "choose from"),
        (
            ["--champion_alias=best", "--version_aliases=best", "--report={ok}"],
            "in --version_aliases too",
        ),
        (
            ["--champion_alias=best", "--champion_metric=auc", "--report={multiclass}"],
            "has no finite auc; it has loss, accuracy",
        ),
        (
            ["--champion_alias=best", "--champion_metric=loss", "--report={regression}"],
            "compare mse or mae",
        ),
        (["--report={other}"], "not of --model_dir gs://test-bucket/runs/1/model"),
        (["--report={unfinished}"], "has not exported and evaluated its model"),
        (["--report={missing}"], "cannot read it"),
        # the flags' own mistakes come before the report is read
        (["--version_aliases=canary,canary", "--report={missing}"], "names an alias twice"),
        (["--champion_alias=best", "--version_aliases=best", "--report={missing}"], "too"),
        (["--report={no_metrics}"], "'final' has no metrics object"),
        (
            ["--parent_model=projects/my-project/locations/europe-west4/models/7"],
            "pass --region=europe-west4",
        ),
        (
            ["--parent_model=projects/my-project/locations/us-central1/models/7@2"],
            "without @VERSION",
        ),
    ],
)
def test_bad_registry_flags_are_refused_before_any_request(tmp_path, capsys, flags, message):
    reports = {
        "ok": _write_report(tmp_path, "ok.json", trainer_report(1)),
        "multiclass": _write_report(
            tmp_path, "m.json", trainer_report(1, "multiclass", loss=0.5, accuracy=0.7)
        ),
        "regression": _write_report(
            tmp_path, "r.json", trainer_report(1, "regression", loss=0.2, mse=4.0)
        ),
        "other": _write_report(tmp_path, "other.json", trainer_report(2)),
        "unfinished": _write_report(
            tmp_path, "u.json", {**trainer_report(1), "status": "training", "final": None}
        ),
        "missing": str(tmp_path / "missing.json"),
        "no_metrics": _write_report(
            tmp_path, "n.json", {**trainer_report(1), "final": {"metrics": None}}
        ),
    }
    with FakeVertex() as fake:
        code = publish.main(
            [
                "deploy",
                "--project=my-project",
                f"--api_endpoint={fake.url}",
                "--model_dir=gs://test-bucket/runs/1/model",
                "--display_name=census",
                "--endpoint_name=census",
                *[f.format(**reports) for f in flags],
            ]
        )
        assert fake.requests == []
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_command_line_dry_run_shows_the_registry_requests(tmp_path):
    report = _write_report(tmp_path, "report.json", trainer_report(1))
    result = _dry_run(
        "--model_dir=gs://test-bucket/runs/1/model",
        "--parent_model=census",
        "--version_aliases=retrained",
        f"--report={report}",
        "--champion_alias=champion",
        "--champion_metric=auc",
    )
    assert result.returncode == 0, result.stderr
    requests = json.loads(result.stdout)
    calls = [(r["method"], r["url"].split("/v1/")[1]) for r in requests]
    pending_model = f"{registry.PENDING_PARENT}@{registry.PENDING_VERSION}"
    assert calls[:6] == [
        ("GET", f'{PARENT}/models?filter=display_name="census"'),
        ("POST", f"{PARENT}/models:upload"),
        ("POST", f"{pending_model}/evaluations:import"),
        ("GET", f"{registry.PENDING_PARENT}:listVersions"),
        ("GET", f"{registry.PENDING_PARENT}@{registry.PENDING_HOLDER}/evaluations"),
        ("POST", f"{pending_model}:mergeVersionAliases"),
    ]
    upload = requests[1]["body"]
    assert upload["parentModel"] == registry.PENDING_PARENT
    assert upload["model"]["versionAliases"] == ["retrained", "default"]
    assert requests[2]["body"]["modelEvaluation"]["metrics"] == {"logLoss": 0.36, "auRoc": 0.89}
    assert requests[5]["body"] == {"versionAliases": ["champion"]}


def test_the_baseline_exported_with_the_model_is_the_endpoints_too(cloud_sdk, census_model):
    """--explain reads the model's assets.extra/explanation_baseline.json (what deploy.serve
    explains from) into the spec's inputBaselines, so both start their walks from one row."""
    from deploy.serving import explain

    fake, cloud = cloud_sdk
    baselines = explain.read_baseline(census_model)
    spec = publishing.Explanation(("age", "occupation"), "probabilities", 10, baselines).spec()
    assert spec["metadata"]["inputs"]["age"] == {
        "inputTensorName": "age",
        "inputBaselines": [baselines["age"]],
    }
    assert isinstance(spec["metadata"]["inputs"]["occupation"]["inputBaselines"][0], str)
    body = {"model": {**_deployment().upload_body()["model"], "explanationSpec": spec}}
    assert discovery.validate(body, "GoogleCloudAiplatformV1UploadModelRequest") == []
    assert explanation_problems(body["model"]) == []
    assert publish._baselines(census_model) == baselines
    assert publish._baselines("/nonexistent/model") is None
