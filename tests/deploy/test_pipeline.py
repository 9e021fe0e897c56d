"""deploy.pipeline: the compiled pipeline spec, bad input refused before any work, the
PipelineJob the client library creates (checked by the fake service against the published
schema), and the steps run here as their containers would run them, against the fake service
and the Cloud Storage emulator."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deploy import pipeline
from deploy.cloud import api
from deploy.vertex import custom_job, job_spec, pipelines, publishing
from deploy.vertex.pipelines import PipelineOptions, Requirement, TrainingPipeline
from tests.deploy import discovery
from tests.deploy.fake_vertex import NOW, FakeVertex
from tests.deploy.job_configs import CLOUD, IMAGE, package_config

PACKAGE = "gs://test-bucket/dist/trainer-0.1.0.tar.gz"
BASE = "gs://test-bucket/runs/1"
PARENT = "projects/my-project/locations/us-central1"


def _batch():
    from deploy.batch_prediction import (
        vertex as batch_vertex,
    )  # loads TensorFlow (deploy.batch_prediction.local)

    return batch_vertex.VertexBatchJob(
        display_name="census-batch",
        model=publishing.PENDING_MODEL,
        sources=("gs://test-bucket/in/*.jsonl",),
        output_prefix="gs://test-bucket/predictions",
    )


def _pipeline(cloud: api.Cloud, extra_args=(), **options) -> TrainingPipeline:
    spec = custom_job.resolve(
        job_spec.load_config(),
        package_uri=None,
        output_dir=BASE,
        extra_args=extra_args,
        cloud=cloud,
    )
    options.setdefault("pipeline_root", "gs://test-bucket/pipeline-root")
    return TrainingPipeline.of(
        cloud, custom_job.Submission("census", spec), PipelineOptions(**options)
    )


def _tasks(spec: dict) -> dict:
    return spec["root"]["dag"]["tasks"]


def _constant(spec: dict, task: str, parameter: str):
    return _tasks(spec)[task]["inputs"]["parameters"][parameter]["runtimeValue"]["constant"]


def test_compiled_spec_chains_the_steps_with_the_bodies_of_the_deploy_commands():
    cloud = api.Cloud(project="my-project")
    job = _pipeline(
        cloud,
        requirements=(Requirement.parse("accuracy>=0.8"), Requirement.parse("loss <= 0.4")),
        parent_model="123",
        batch=_batch(),
    )
    spec = job.pipeline_spec()
    assert spec["schemaVersion"] == "2.1.0" and spec["pipelineInfo"]["name"] == "census"
    assert spec["defaultPipelineRoot"] == "gs://test-bucket/pipeline-root"
    tasks = _tasks(spec)
    assert {name: task.get("dependentTasks", []) for name, task in tasks.items()} == {
        "train": [],
        "evaluate": ["train"],
        "register": ["evaluate"],
        "batch-predict": ["register"],
    }
    # Each step creates something: none is taken from the cache of an earlier run.
    assert all(not task["cachingOptions"].get("enableCache") for task in tasks.values())
    # train: the CustomJob deploy.submit creates, field for field.
    # (The spec's numbers are doubles; a step parses a body into its message, as here.)
    custom_job = api.canonical("CustomJob", _constant(spec, "train", "custom_job"), "")
    assert custom_job == job.submission.body()
    assert discovery.validate(custom_job, "GoogleCloudAiplatformV1CustomJob") == []
    pools = custom_job["jobSpec"]["workerPoolSpecs"]
    assert [p["containerSpec"]["imageUri"] for p in pools] == [IMAGE] * 4  # config.yaml's
    assert _constant(spec, "train", "poll") == pipelines.POLL_SECONDS
    # evaluate: the report where the trainer writes it on Vertex AI, and the bounds.
    assert _constant(spec, "evaluate", "report_uri") == f"{BASE}/checkpoints/report.json"
    assert _constant(spec, "evaluate", "requirements") == [
        ["accuracy", ">=", 0.8],
        ["loss", "<=", 0.4],
    ]
    # register: deploy.publish's upload, as a version of the parent; the model dir comes
    # from evaluate (report.json's), the one here is what the trainer will choose.
    upload = _constant(spec, "register", "upload")
    assert upload["model"]["artifactUri"] == f"{BASE}/model"
    assert upload["model"]["containerSpec"] == {"imageUri": publishing.SERVING_IMAGE}
    assert upload["parentModel"] == f"{PARENT}/models/123"
    sent = api.canonical("UploadModelRequest", upload, "")
    assert discovery.validate(sent, "GoogleCloudAiplatformV1UploadModelRequest") == []
    register_inputs = tasks["register"]["inputs"]["parameters"]
    assert register_inputs["model_dir"]["taskOutputParameter"]["producerTask"] == "evaluate"
    # batch predict: deploy.batch vertex's job, on the version register returns.
    batch_job = _constant(spec, "batch-predict", "batch_job")
    assert batch_job == _batch().body(cloud)
    model = {**batch_job, "model": f"{PARENT}/models/123@2"}
    model = api.canonical("BatchPredictionJob", model, "")
    assert discovery.validate(model, "GoogleCloudAiplatformV1BatchPredictionJob") == []
    # Every step runs the Vertex AI SDK it installs, on the regional endpoint.
    for name, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        assert container["image"] == pipelines.COMPONENT_IMAGE, name
        assert "google-cloud-aiplatform>=1.60,<3" in container["command"][2], name
    assert _constant(spec, "train", "api_endpoint") == ""
    assert _constant(spec, "train", "project") == "my-project"
    body = job.body()
    assert discovery.validate(body, "GoogleCloudAiplatformV1PipelineJob") == []
    assert FakeVertex._pipeline_job_problems(job.job_id, body) == []


def test_without_a_batch_source_the_pipeline_ends_at_register():
    spec = _pipeline(api.Cloud(project="my-project")).pipeline_spec()
    assert sorted(_tasks(spec)) == ["evaluate", "register", "train"]
    assert _constant(spec, "evaluate", "requirements") == []
    assert "parentModel" not in _constant(spec, "register", "upload")


@pytest.mark.parametrize(
    "args, flags, dirs",
    [
        ([], {}, (f"{BASE}/checkpoints", f"{BASE}/model")),
        (["--job_dir=gs://b/job"], {"job_dir": "gs://b/job"}, ("gs://b/job", "gs://b/job/model")),
        (
            ["--job_dir", "/gcs/b/job/"],
            {"job_dir": "/gcs/b/job/"},
            ("gs://b/job", "gs://b/job/model"),
        ),
        (
            ["--checkpoint_dir=gs://b/c"],
            {"checkpoint_dir": "gs://b/c"},
            ("gs://b/c", f"{BASE}/model"),
        ),
        (
            ["--model_dir=gs://b/m", "--job_dir=gs://b/j"],
            {"model_dir": "gs://b/m", "job_dir": "gs://b/j"},
            ("gs://b/j", "gs://b/m"),
        ),
    ],
)
def test_report_and_model_are_where_the_trainer_puts_them(args, flags, dirs):
    from trainer.storage.paths import OutputDirs

    spec = custom_job.resolve(
        job_spec.load_config(), package_uri=None, output_dir=BASE, extra_args=args, cloud=CLOUD
    )
    assert custom_job.job_dirs(spec) == dirs
    # The trainer's own rule on Vertex AI (the AIP_* dirs of the base output directory).
    trainer = OutputDirs.resolve(
        **flags, aip_model_dir=f"{BASE}/model/", aip_checkpoint_dir=f"{BASE}/checkpoints/"
    )
    as_gs = [
        path.rstrip("/").replace("/gcs/", "gs://", 1)
        for path in (trainer.job_dir, trainer.model_dir)
    ]
    assert tuple(as_gs) == dirs


def test_a_container_pool_s_args_say_where_the_report_is():
    pool = {"containerSpec": {"imageUri": "eu.gcr.io/p/trainer:1", "args": ["--job_dir=gs://b/j"]}}
    spec = {"workerPoolSpecs": [pool], "baseOutputDirectory": {"outputUriPrefix": BASE}}
    assert custom_job.job_dirs(spec) == ("gs://b/j", "gs://b/j/model")


FLAGS = [
    "--project=my-project",
    "--staging_uri=gs://test-bucket/dist",
    f"--output_dir={BASE}",
    "--pipeline_root=gs://test-bucket/pipeline-root",
]


@pytest.mark.parametrize(
    "change, message",
    [
        (["--pipeline_root="], "--pipeline_root is missing"),
        (["--pipeline_root=/tmp/root"], "--pipeline_root ('/tmp/root') must be a Cloud Storage"),
        (["--require=accuracy>0.8"], "--require ('accuracy>0.8') must be METRIC>=NUMBER"),
        (["--require=auc>=high"], "--require ('auc>=high') must be METRIC>=NUMBER"),
        (["--require=loss<=nan"], "--require ('loss<=nan') must be METRIC>=NUMBER"),
        (["--batch_source=gs://test-bucket/in.jsonl"], "--batch_output_prefix go together"),
        (
            [
                "--batch_source=gs://test-bucket/in.csv",
                "--batch_output_prefix=gs://test-bucket/out",
                "--batch_instances_format=csv",
            ],
            "the pipeline predicts JSON Lines only",
        ),
        (["--extra_args=--job_dir=runs/local"], "--job_dir ('runs/local') is not in Cloud Storage"),
        (["--parent_model=census"], "model ('census') is neither a numeric id nor"),
        (["--display_name=___"], "--display_name ('___') needs a letter or digit"),
        (["--output_dir=/tmp/runs"], "--output_dir ('/tmp/runs') must be a Cloud Storage URI"),
    ],
)
def test_bad_input_stops_before_the_sdist_is_built(capsys, tmp_path, change, message):
    code = pipeline.main([*FLAGS, f"--dist_dir={tmp_path}", *change, "--dry_run"])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert list(tmp_path.iterdir()) == [], "bad input built something"


@pytest.mark.parametrize("package", [False, True], ids=["config.yaml", "package config"])
def test_dry_run_prints_the_pipeline_job_that_run_submits(cloud_sdk, gcs, tmp_path, package):
    fake, cloud = cloud_sdk
    arguments: dict = dict(
        display_name="census",
        output_dir=BASE,
        extra_args=["--max_iterations=1"],
        pipeline=PipelineOptions(
            pipeline_root="gs://test-bucket/pipeline-root",
            requirements=(Requirement.parse("accuracy>=0.8"),),
            service_account="pipelines@my-project.iam.gserviceaccount.com",
        ),
        dist_dir=str(tmp_path),
    )
    if package:  # the sdist on a prebuilt image: built and uploaded first
        arguments.update(staging_uri="gs://test-bucket/dist", config=package_config(tmp_path))
    printed = io.StringIO()
    assert pipeline.run(cloud, dry_run=True, out=printed, **arguments) is None
    assert fake.requests == [], "a dry run sent a request"
    text = printed.getvalue()
    dry = json.loads(text[: text.index("\n]\n") + 2])
    template = tmp_path / "pipeline-census.yaml"
    assert text.endswith(f"# the compiled pipeline spec: {template}\n")
    if package:
        upload, request = dry
        assert upload["body"] == {"file": str(tmp_path / "trainer-0.1.0.tar.gz")}
    else:
        (request,) = dry  # the trainer's image: nothing to upload
    assert request["url"].startswith(cloud.url(f"{PARENT}/pipelineJobs?pipelineJobId=census-"))
    assert request["body"]["runtimeConfig"] == {
        "gcsOutputDirectory": "gs://test-bucket/pipeline-root"
    }
    assert request["body"]["serviceAccount"] == "pipelines@my-project.iam.gserviceaccount.com"
    written = api.canonical(
        "PipelineJob", {"pipelineSpec": yaml.safe_load(template.read_text())}, ""
    )
    assert written["pipelineSpec"] == request["body"]["pipelineSpec"]
    custom_job = _constant(request["body"]["pipelineSpec"], "train", "custom_job")
    chief = custom_job["jobSpec"]["workerPoolSpecs"][0]
    if package:
        assert chief["pythonPackageSpec"]["packageUris"] == [PACKAGE]
    else:
        assert chief["containerSpec"]["imageUri"] == IMAGE

    created = pipeline.run(cloud, out=io.StringIO(), **arguments)
    assert created.name.startswith(f"{PARENT}/pipelineJobs/census-")
    # The fake got, field for field, what the dry run printed, and found it valid.
    assert fake.bodies("pipelineJobs.create") == [request["body"]]
    # The SDK follows the run.
    from google.cloud import aiplatform

    cloud.init_sdk()
    followed = aiplatform.PipelineJob.get(created.name)
    assert followed.state is not None and followed.state.name == "PIPELINE_STATE_PENDING"
    assert followed.gca_resource.pipeline_spec["pipelineInfo"]["name"] == "census"
    assert {r.method_id for r in fake.requests} == {
        "aiplatform.projects.locations.pipelineJobs.create",
        "aiplatform.projects.locations.pipelineJobs.get",
    }
    blob = gcs.bucket("test-bucket").get_blob("dist/trainer-0.1.0.tar.gz")
    if package:
        assert blob is not None
        assert blob.size == (tmp_path / "trainer-0.1.0.tar.gz").stat().st_size
    else:
        assert blob is None and not list(tmp_path.glob("*.tar.gz")), "an sdist was built"


def test_the_fake_refuses_a_pipeline_job_vertex_would_refuse():
    spec = _pipeline(api.Cloud(project="my-project")).pipeline_spec()
    del spec["components"]["comp-register"]
    body = {"pipelineSpec": spec, "runtimeConfig": {"parameterValues": {"epochs": 3}}}
    assert FakeVertex._pipeline_job_problems("Census_1", body) == [
        "pipelineJobId 'Census_1': lowercase letters, digits, hyphens",
        "body.runtimeConfig.gcsOutputDirectory: required, a gs:// path",
        "task register: no component 'comp-register'",
        "body.runtimeConfig.parameterValues.epochs: not a parameter of the pipeline",
    ]


# The steps, run here ------------------------------------------------------------------------


@pytest.fixture
def credentials() -> Iterator[dict]:
    """What a step's process needs for application default credentials: as on Vertex AI, a
    metadata server that hands out the run's service account token (here on loopback)."""

    class MetadataServer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            account = {"email": "pipelines@my-project.iam.gserviceaccount.com", "aliases": []}
            answers: dict[str, object] = {
                "/": "",
                "/computeMetadata/v1/project/project-id": "my-project",
                "/computeMetadata/v1/universe/universe-domain": "googleapis.com",
                "/computeMetadata/v1/instance/service-accounts/default/": account,
            }
            answer = answers.get(path)
            if path.endswith("/token"):
                answer = {"access_token": "test-token", "expires_in": 3600, "token_type": "Bearer"}
            if answer is None:
                self.send_error(404)
                return
            data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
            self.send_response(200)
            self.send_header("Metadata-Flavor", "Google")
            kind = "text/plain" if isinstance(answer, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetadataServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_port}"
    try:
        yield {"GCE_METADATA_HOST": host, "GCE_METADATA_IP": host, "NO_GCE_CHECK": "false"}
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def jobs_end(fake: FakeVertex, state: str = "JOB_STATE_SUCCEEDED"):
    """Ends every custom and batch prediction job the fake holds, as Vertex AI would once it
    ran them (a batch job with its output directory)."""
    stop = threading.Event()

    def end():
        while not stop.wait(0.05):
            for name, resource in list(fake.resources.items()):
                if resource.get("state") != "JOB_STATE_PENDING":
                    continue
                if "/batchPredictionJobs/" in name:
                    prefix = resource["outputConfig"]["gcsDestination"]["outputUriPrefix"]
                    resource["outputInfo"] = {
                        "gcsOutputDirectory": f"{prefix}/prediction-model-{NOW}"
                    }
                resource["state"] = state

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_steps(spec: dict, workdir: Path, env: dict, done: dict | None = None):
    """Runs the spec's tasks here in order, each as its container runs it: the component's
    source from the spec through kfp's executor, with the inputs the spec names (constants,
    or an earlier task's output), minus the pip installs.

    Returns:
        (each task's executor output, the failed task's name and log or None).
    """
    outputs = dict(done or {})
    tasks = _tasks(spec)
    while len(outputs) < len(tasks):
        name = next(
            n
            for n, t in tasks.items()
            if n not in outputs and all(d in outputs for d in t.get("dependentTasks", []))
        )
        component = spec["components"][tasks[name]["componentRef"]["name"]]
        executor = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        values = {}
        for key, value in tasks[name]["inputs"]["parameters"].items():
            if "runtimeValue" in value:
                values[key] = value["runtimeValue"]["constant"]
            else:
                ref = value["taskOutputParameter"]
                parameters = outputs[ref["producerTask"]]["parameterValues"]
                values[key] = parameters[ref["outputParameterKey"]]
        folder = workdir / name
        folder.mkdir()
        artifacts = {
            key: {"artifacts": [{"name": key, "type": a["artifactType"], "uri": str(folder / key)}]}
            for key, a in component.get("outputDefinitions", {}).get("artifacts", {}).items()
        }
        executor_input = {
            "inputs": {"parameterValues": values},
            "outputs": {"artifacts": artifacts, "outputFile": str(folder / "output.json")},
        }
        (folder / "component.py").write_text(executor["command"][-1])
        args = [json.dumps(executor_input) if a == "{{$}}" else a for a in executor["args"]]
        result = subprocess.run(
            [sys.executable, "-m", "kfp.dsl.executor_main"]
            + ["--component_module_path", str(folder / "component.py"), *args],
            env={**env, "_KFP_RUNTIME": "true"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode:
            return outputs, (name, result.stdout + result.stderr)
        outputs[name] = json.loads((folder / "output.json").read_text())
    return outputs, None


REPORT = {
    "status": "complete",
    "job_dir": "/gcs/test-bucket/runs/1/checkpoints",
    "model_dir": "/gcs/test-bucket/runs/1/model",  # a FUSE path: registered as gs://
    "final": {"eval_data": "test.csv", "examples": 1000, "metrics": {"loss": 0.3, "auc": 0.9}},
}


def test_the_steps_as_compiled_train_evaluate_register_and_predict(
    cloud_sdk, gcs, credentials, tmp_path
):
    fake, cloud = cloud_sdk
    report = gcs.bucket("test-bucket").blob("runs/1/checkpoints/report.json")
    report.upload_from_string(json.dumps(REPORT))
    parent = fake.add_model(PARENT, "census", f"{BASE}/earlier-model")  # its version 1
    job = _pipeline(
        cloud,
        requirements=(Requirement.parse("auc>=0.85"),),
        parent_model=parent,
        batch=_batch(),
        poll_seconds=0.05,
    )
    env = {**os.environ, **credentials}
    with jobs_end(fake):
        outputs, failed = run_steps(job.pipeline_spec(), tmp_path, env)
    assert failed is None, failed[1][-3000:]
    trained = outputs["train"]["parameterValues"]["Output"]
    assert trained.startswith(f"{PARENT}/customJobs/")
    assert fake.bodies("customJobs.create") == [job.submission.body()]
    assert outputs["evaluate"]["parameterValues"]["Output"] == f"{BASE}/model"
    metrics = outputs["evaluate"]["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics == {"auc": 0.9, "loss": 0.3, "eval_data": "test.csv", "examples": 1000}
    (upload,) = fake.bodies("models.upload")
    assert upload["parentModel"] == parent
    assert upload["model"]["artifactUri"] == f"{BASE}/model"
    assert upload["model"]["versionAliases"] == ["default"]
    registered = outputs["register"]["parameterValues"]["Output"]
    assert registered == f"{parent}@2"  # the new default version of the parent
    assert fake.resources[parent]["artifactUri"] == f"{BASE}/model"
    (batch_job,) = fake.bodies("batchPredictionJobs.create")
    assert batch_job["model"] == registered
    assert batch_job["inputConfig"]["gcsSource"] == {"uris": ["gs://test-bucket/in/*.jsonl"]}
    predicted = outputs["batch-predict"]["parameterValues"]["Output"]
    assert predicted == f"gs://test-bucket/predictions/prediction-model-{NOW}"


@pytest.mark.parametrize(
    "report, requirement, message",
    [
        (REPORT, "auc>=0.95", "is not registered: auc 0.9000 is not >= 0.95."),
        (REPORT, "accuracy>=0.5", "accuracy is not among the metrics (auc, loss)"),
        ({**REPORT, "status": "training", "final": None}, "auc>=0", "status 'training'"),
    ],
)
def test_evaluate_stops_the_run_before_register(
    cloud_sdk, gcs, tmp_path, report, requirement, message
):
    fake, cloud = cloud_sdk
    gcs.bucket("test-bucket").blob("runs/1/checkpoints/report.json").upload_from_string(
        json.dumps(report)
    )
    spec = _pipeline(cloud, requirements=(Requirement.parse(requirement),)).pipeline_spec()
    trained = {"parameterValues": {"Output": f"{PARENT}/customJobs/1"}}
    outputs, failed = run_steps(spec, tmp_path, dict(os.environ), done={"train": trained})
    assert failed is not None and failed[0] == "evaluate"
    assert message in failed[1], failed[1][-3000:]
    assert fake.requests == [], "nothing is registered"


def test_train_fails_with_the_job_that_failed(cloud_sdk, credentials, tmp_path):
    fake, cloud = cloud_sdk
    spec = _pipeline(cloud, poll_seconds=0.05).pipeline_spec()
    with jobs_end(fake, "JOB_STATE_FAILED"):
        outputs, failed = run_steps(spec, tmp_path, {**os.environ, **credentials})
    assert failed is not None and failed[0] == "train" and outputs == {}
    assert f"{PARENT}/customJobs/" in failed[1] and "ended JOB_STATE_FAILED" in failed[1]
