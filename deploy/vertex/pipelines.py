"""deploy.pipeline's run as Kubeflow Pipelines v2 builds it: the steps (lightweight Python
components, each alone in its container: `COMPONENTS`), the checks after training
(`Requirement`), the options of the steps after training (`PipelineOptions`), the compiled
spec and its PipelineJob request (`TrainingPipeline`, `create_job`)."""

# No `from __future__ import annotations` here: kfp reads the components' annotations as
# objects (dsl.Output[dsl.Metrics], str), and a string annotation is not one.

import dataclasses
import datetime
import json
import os
import re
import tempfile
from typing import TYPE_CHECKING

try:
    from kfp import compiler, dsl
except ImportError as e:  # the `pipeline` extra: see setup.py
    raise SystemExit(
        "deploy.pipeline needs the Kubeflow Pipelines SDK: pip install 'trainer[pipeline]' "
        f"(kfp 2.13, beside TensorFlow 2.17's protobuf < 5). ({e})"
    ) from e

from deploy.cloud import api
from deploy.vertex import custom_job, publishing

# At run time only with a batch step: it loads TensorFlow (deploy.batch_prediction.local).
if TYPE_CHECKING:
    from deploy.batch_prediction import vertex as batch_vertex


# The image each step runs in, and what it installs there at start (kfp adds itself).
COMPONENT_IMAGE = "python:3.11-slim"


COMPONENT_PACKAGES = ["google-cloud-aiplatform>=1.60,<3"]


# How often a step asks whether its job is done.
POLL_SECONDS = 60.0


_REQUIREMENT = re.compile(r"^\s*(?P<metric>[A-Za-z_]\w*)\s*(?P<op>>=|<=)\s*(?P<bound>\S+)\s*$")


# Vertex AI's PipelineJob ids (the SDK's check of the ids it generates: name-timestamp).
_JOB_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")


_STAMP = "%Y%m%d%H%M%S"


# The components. Each runs alone in its container: kfp copies the function's source into the
# pipeline spec, so it imports what it needs inside and shares no code with this module (the
# wait loop is written twice for that reason). `api_endpoint` is empty on Vertex AI (the
# regional endpoint), a private endpoint or a fake in tests.


def train(project: str, location: str, api_endpoint: str, custom_job: dict, poll: float) -> str:
    """Creates the CustomJob and waits for it to end.

    Returns:
        The job's resource name; the step fails if the job did not succeed.
    """
    import json
    import time

    from google.cloud import aiplatform_v1

    client = aiplatform_v1.JobServiceClient(
        transport="rest",
        client_options={"api_endpoint": api_endpoint or f"{location}-aiplatform.googleapis.com"},
    )
    job = client.create_custom_job(
        parent=f"projects/{project}/locations/{location}",
        custom_job=aiplatform_v1.CustomJob.from_json(json.dumps(custom_job)),
    )
    print(f"created {job.name}", flush=True)
    state = aiplatform_v1.JobState
    ended = {
        state.JOB_STATE_SUCCEEDED,
        state.JOB_STATE_FAILED,
        state.JOB_STATE_CANCELLED,
        state.JOB_STATE_EXPIRED,
    }
    while job.state not in ended:
        time.sleep(poll)
        job = client.get_custom_job(name=job.name)
    if job.state != state.JOB_STATE_SUCCEEDED:
        raise RuntimeError(f"{job.name} ended {job.state.name}: {job.error.message}")
    return job.name


def evaluate(
    job: str, report_uri: str, requirements: list, metrics: dsl.Output[dsl.Metrics]
) -> str:
    """Reads the job's report.json, logs the exported model's eval metrics, and checks them.

    Args:
        job: the training job (for the messages).
        report_uri: the report (gs:// or a local path).
        requirements: [metric, ">=" or "<=", bound] lists, all of which must hold.
        metrics: the step's Metrics artifact (the console shows it).

    Returns:
        The exported model's directory (gs://), as the report names it.
    """
    import json

    if report_uri.startswith("gs://"):
        from google.cloud import storage  # type: ignore[attr-defined]  # a namespace package

        bucket, _, name = report_uri[len("gs://") :].partition("/")
        text = storage.Client().bucket(bucket).blob(name).download_as_text()
    else:
        with open(report_uri) as f:
            text = f.read()
    report = json.loads(text)
    final = report.get("final") or {}
    values = final.get("metrics") or {}
    if report.get("status") != "complete" or not values or not report.get("model_dir"):
        raise RuntimeError(
            f"{report_uri} (of {job}) has no exported model with metrics (status "
            f"{report.get('status')!r}): the training ended before its export."
        )
    for name, value in sorted(values.items()):
        if isinstance(value, (int, float)):
            metrics.log_metric(name, value)
    metrics.metadata["eval_data"] = str(final.get("eval_data", ""))
    if "examples" in final:
        metrics.metadata["examples"] = final["examples"]
    failed = []
    for name, op, bound in requirements:
        value = values.get(name)
        if value is None:
            failed.append(f"{name} is not among the metrics ({', '.join(sorted(values))})")
        elif not (value >= bound if op == ">=" else value <= bound):
            failed.append(f"{name} {value:.4f} is not {op} {bound}")
    if failed:
        raise RuntimeError(f"the model of {job} is not registered: {'; '.join(failed)}.")
    model_dir = report["model_dir"]
    if model_dir.startswith("/gcs/"):  # Cloud Storage FUSE: the bucket's own name
        model_dir = "gs://" + model_dir[len("/gcs/") :]
    if not model_dir.startswith("gs://"):
        raise RuntimeError(f"the model of {job} is at {model_dir}, not in Cloud Storage.")
    print(json.dumps({"metrics": values, "model_dir": model_dir}), flush=True)
    return model_dir


def register(project: str, location: str, api_endpoint: str, upload: dict, model_dir: str) -> str:
    """Uploads the model to the Model Registry (a new version of the request's parentModel,
    if it names one).

    Args:
        upload: the UploadModelRequest body; its model's artifactUri becomes `model_dir`.

    Returns:
        The registered version, MODEL@VERSION_ID.
    """
    import json

    from google.cloud import aiplatform_v1

    client = aiplatform_v1.ModelServiceClient(
        transport="rest",
        client_options={"api_endpoint": api_endpoint or f"{location}-aiplatform.googleapis.com"},
    )
    request = {
        **upload,
        "parent": f"projects/{project}/locations/{location}",
        "model": {**upload["model"], "artifactUri": model_dir},
    }
    response = client.upload_model(
        request=aiplatform_v1.UploadModelRequest.from_json(json.dumps(request))
    ).result()
    version = f"{response.model}@{response.model_version_id}"
    print(f"registered {version}", flush=True)
    return version


def batch_predict(
    project: str, location: str, api_endpoint: str, batch_job: dict, model: str, poll: float
) -> str:
    """Creates the BatchPredictionJob on `model` and waits for it to end.

    Returns:
        The directory of its predictions; the step fails if the job did not succeed.
    """
    import json
    import time

    from google.cloud import aiplatform_v1

    client = aiplatform_v1.JobServiceClient(
        transport="rest",
        client_options={"api_endpoint": api_endpoint or f"{location}-aiplatform.googleapis.com"},
    )
    job = client.create_batch_prediction_job(
        parent=f"projects/{project}/locations/{location}",
        batch_prediction_job=aiplatform_v1.BatchPredictionJob.from_json(
            json.dumps({**batch_job, "model": model})
        ),
    )
    print(f"created {job.name}", flush=True)
    state = aiplatform_v1.JobState
    ended = {
        state.JOB_STATE_SUCCEEDED,
        state.JOB_STATE_FAILED,
        state.JOB_STATE_CANCELLED,
        state.JOB_STATE_EXPIRED,
        state.JOB_STATE_PARTIALLY_SUCCEEDED,
    }
    while job.state not in ended:
        time.sleep(poll)
        job = client.get_batch_prediction_job(name=job.name)
    if job.state != state.JOB_STATE_SUCCEEDED:
        raise RuntimeError(f"{job.name} ended {job.state.name}: {job.error.message}")
    return job.output_info.gcs_output_directory


@dataclasses.dataclass(frozen=True)
class Requirement:
    """A bound the exported model's eval metric must meet for the model to be registered."""

    metric: str
    op: str  # ">=" or "<="
    bound: float

    @classmethod
    def parse(cls, text: str) -> "Requirement":
        """`accuracy>=0.8`, `loss<=0.35`; DeployError naming the text otherwise."""
        match = _REQUIREMENT.match(text)
        bound = _number(match.group("bound")) if match else None
        if match is None or bound is None:
            raise api.DeployError(
                f"--require ({text!r}) must be METRIC>=NUMBER or METRIC<=NUMBER, a metric of "
                "report.json's final metrics, as in --require='accuracy>=0.8'."
            )
        return cls(match.group("metric"), match.group("op"), bound)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """What the pipeline does after training; checked on construction.

    `batch` is the BatchPredictionJob over JSON Lines `deploy.batch vertex` would create, its
    model `publishing.PENDING_MODEL` (the step uses the registered version); None: no batch step.
    """

    pipeline_root: str
    model_display_name: str | None = None  # default: the training job's display name
    parent_model: str | None = None  # an id or resource name: register a new version of it
    serving_image: str = publishing.SERVING_IMAGE
    requirements: tuple[Requirement, ...] = ()
    batch: "batch_vertex.VertexBatchJob | None" = None
    service_account: str | None = None  # the pipeline run's (default: Compute Engine's)
    poll_seconds: float = POLL_SECONDS

    def __post_init__(self):
        if not self.pipeline_root:
            raise api.DeployError(
                "--pipeline_root is missing: Vertex AI Pipelines keeps the steps' outputs "
                "there; pass --pipeline_root=gs://YOUR_BUCKET/pipeline-root."
            )
        api.gcs_uri("--pipeline_root", self.pipeline_root)
        if not self.serving_image:
            raise api.DeployError("--serving_image must not be empty.")
        if self.batch is not None:
            check_jsonl(self.batch.instances_format)
        if not self.poll_seconds > 0:
            raise api.DeployError(f"poll_seconds ({self.poll_seconds}) must be positive.")


def check_jsonl(instances_format: str) -> None:
    if instances_format != "jsonl":
        raise api.DeployError(
            f"--batch_instances_format ({instances_format!r}): the pipeline predicts JSON "
            "Lines only (jsonl); a Vertex job would send CSV rows as arrays, which the model's "
            "named inputs do not take. Convert them first (python -m deploy.batch vertex "
            "--instances_format=csv does) and pass the JSON Lines files."
        )


@dataclasses.dataclass(frozen=True)
class TrainingPipeline:
    """The pipeline of one training job: its spec, and the PipelineJob that runs it.

    A `custom_job.Job`: `custom_job.stage` checks it before building the sdist.
    """

    cloud: api.Cloud
    submission: custom_job.Submission
    options: PipelineOptions
    job_id: str

    def __post_init__(self):
        if not _JOB_ID.match(self.job_id):
            raise api.DeployError(
                f"the pipeline job id ({self.job_id!r}) must be lowercase letters, digits and "
                "hyphens, up to 128 (it comes from --display_name)."
            )
        custom_job.job_dirs(self.submission.spec)  # a job dir no step could read fails here
        if self.options.parent_model:
            self.cloud.resource("models", self.options.parent_model)

    @classmethod
    def of(
        cls,
        cloud: api.Cloud,
        submission: custom_job.Submission,
        options: PipelineOptions,
        now: datetime.datetime | None = None,
    ) -> "TrainingPipeline":
        """The pipeline of `submission`, its job id the pipeline's name and the time."""
        stamp = (now or datetime.datetime.now()).strftime(_STAMP)
        return cls(cloud, submission, options, f"{pipeline_name(submission.display_name)}-{stamp}")

    @property
    def report_uri(self) -> str:
        """Where the job's report.json will be (`job_dirs`)."""
        return f"{custom_job.job_dirs(self.submission.spec)[0]}/report.json"

    def upload_body(self) -> dict:
        """The UploadModelRequest of the register step, its artifactUri the model dir the
        trainer will choose (the step uses the one report.json names)."""
        name = self.options.model_display_name or self.submission.display_name
        parent = self.options.parent_model
        return publishing.Deployment(
            model_dir=custom_job.job_dirs(self.submission.spec)[1],
            display_name=name,
            endpoint_name=name,
            serving_image=self.options.serving_image,
        ).upload_body(self.cloud.resource("models", parent) if parent else None)

    def pipeline_func(self):
        """The kfp pipeline: every value a constant of the spec (a run takes no parameters)."""
        place = dict(
            project=self.cloud.project,
            location=self.cloud.region,
            api_endpoint=self.cloud.api_endpoint or "",
        )
        poll = self.options.poll_seconds
        upload = self.upload_body()
        batch = self.options.batch

        @dsl.pipeline(
            name=pipeline_name(self.submission.display_name),
            description="AdaNet on Vertex AI: train, evaluate, register, batch predict.",
            pipeline_root=self.options.pipeline_root,
        )
        def adanet():
            trained = COMPONENTS["train"](
                **place, custom_job=self.submission.body(), poll=poll
            ).set_display_name("train")
            evaluated = COMPONENTS["evaluate"](
                job=trained.output,
                report_uri=self.report_uri,
                requirements=[[r.metric, r.op, r.bound] for r in self.options.requirements],
            ).set_display_name("evaluate")
            registered = COMPONENTS["register"](
                **place, upload=upload, model_dir=evaluated.outputs["Output"]
            ).set_display_name("register")
            tasks = [trained, evaluated, registered]
            if batch is not None:
                predicted = COMPONENTS["batch_predict"](
                    **place, batch_job=batch.body(self.cloud), model=registered.output, poll=poll
                ).set_display_name("batch-predict")
                tasks.append(predicted)
            for task in tasks:
                task.set_caching_options(False)  # each step creates a job or a model

        return adanet

    def pipeline_spec(self) -> dict:
        """The compiled pipeline spec (KFP's IR, schema 2.1.0), as JSON values."""
        import yaml

        with tempfile.TemporaryDirectory(prefix="pipeline-") as folder:
            path = os.path.join(folder, "pipeline.yaml")
            self.compile(path)
            with open(path) as f:
                return yaml.safe_load(f)

    def compile(self, path: str) -> None:
        """Writes the compiled pipeline spec to `path` (YAML, as kfp writes it)."""
        compiler.Compiler().compile(pipeline_func=self.pipeline_func(), package_path=path)

    def body(self) -> dict:
        """The PipelineJob as the client library sends it (the spec a Struct: its numbers
        are doubles)."""
        job = {
            "displayName": self.submission.display_name,
            "pipelineSpec": self.pipeline_spec(),
            "runtimeConfig": {"gcsOutputDirectory": self.options.pipeline_root},
        }
        if self.options.service_account:
            job["serviceAccount"] = self.options.service_account
        return api.canonical("PipelineJob", job, "the PipelineJob")

    def request(self, cloud: api.Cloud) -> api.ApiRequest:
        return api.ApiRequest(
            "POST",
            cloud.url(f"{cloud.parent}/pipelineJobs?pipelineJobId={self.job_id}"),
            self.body(),
        )


def pipeline_name(display_name: str) -> str:
    """The pipeline's name (lowercase letters, digits, hyphens) from a display name."""
    name = re.sub(r"[^a-z0-9-]+", "-", display_name.lower()).strip("-")[:100].rstrip("-")
    if not name:
        raise api.DeployError(
            f"--display_name ({display_name!r}) needs a letter or digit: it names the pipeline."
        )
    return name


def create_job(cloud: api.Cloud, job: TrainingPipeline):
    """Creates the PipelineJob (the body `--dry_run` prints) and returns without waiting.

    Through the client library's PipelineServiceClient, as deploy.submit creates CustomJobs:
    the SDK's `PipelineJob.submit` also looks up the pipeline root's bucket, creates it (and
    grants the Compute Engine account on it) if missing, and asks Resource Manager for the
    project number to check the bucket's owner, logging an error when that fails; none of it
    is part of the PipelineJob. `aiplatform.PipelineJob.get(name)` follows the run.
    """
    from google.cloud import aiplatform_v1

    return cloud.pipeline_client().create_pipeline_job(
        parent=cloud.parent,
        pipeline_job=aiplatform_v1.PipelineJob.from_json(json.dumps(job.body())),
        pipeline_job_id=job.job_id,
    )


COMPONENTS = {
    f.__name__: dsl.component(
        f, base_image=COMPONENT_IMAGE, packages_to_install=list(COMPONENT_PACKAGES)
    )
    for f in (train, evaluate, register, batch_predict)
}
