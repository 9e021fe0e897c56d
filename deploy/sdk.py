"""The Python API for notebooks, in the style of the Vertex AI SDK: train here or on Vertex
AI, wait, read the report, predict, batch-predict and explain, with DataFrames in and out.

    from deploy import sdk

    run = sdk.train_local("runs/nb", flags={"max_iterations": 2})   # logs streamed
    run.report                      # the job's report.json as an object (a table in Jupyter)
    model = run.model               # or sdk.LocalModel("runs/nb/model")
    model.predict(frame)            # a DataFrame: the class and each class's probability
    model.batch_predict(frame, key_field="id")    # the local twin of a Vertex batch job
    model.explain(frame.iloc[0]).plot()           # one row's attributions, as a bar chart

    job = sdk.submit(sdk.Cloud("my-project"), display_name="census", staging_uri="gs://b/s")
    job.wait()                      # state changes and the job's logs, until it ends
    job.report()                    # its report.json, read from Cloud Storage
    sdk.Endpoint(cloud, "123").predict(frame)

Every function takes what the command of the same name takes (`deploy.submit`,
`deploy.batch`, `deploy.predict`) and raises its errors: `DeployError` for bad input before
anything is sent or written, `ServiceError` for a service's refusal, `TrainingFailed` for a
local job that ended with an error (its last lines in the message).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import trainer
from deploy import predict
from deploy.batch_prediction import local as batch_local
from deploy.batch_prediction.frames import (
    instances_of,
    predictions_frame,
    records_of,
    results_frame,
)
from deploy.cloud import storage
from deploy.cloud.api import Cloud, DeployError
from deploy.serving.explain import DEFAULT_PATH_COUNT, Explainer
from deploy.serving.instances import InstanceError, Predictor
from deploy.vertex import custom_job, job_options, job_spec
from deploy.vertex.waiting import Job, JobFailed, LogStream

__all__ = [
    "Cloud",
    "DeployError",
    "Endpoint",
    "Explanation",
    "JobFailed",
    "LocalModel",
    "LocalTraining",
    "Report",
    "TrainingFailed",
    "TrainingJob",
    "submit",
    "train_local",
]


class TrainingFailed(RuntimeError):
    """A local training job ended with an error; the message ends with its last lines."""


# -- the report ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Report:
    """A job's report.json (`data`: all of it), with its main figures as attributes."""

    data: dict
    path: str

    @classmethod
    def read(cls, path: str) -> Report:
        """The report at `path` (local or gs://): a job dir's report.json."""
        try:
            return cls(json.loads(storage.read_bytes(path)), path)
        except FileNotFoundError:
            raise DeployError(
                f"{path} does not exist: a job writes its report.json in its job dir when it "
                "ends (on Vertex AI, BASE_OUTPUT_DIR/checkpoints/report.json)."
            ) from None

    @property
    def status(self) -> str:
        return self.data.get("status", "")

    @property
    def model_dir(self) -> str:
        return self.data["model_dir"]

    @property
    def metrics(self) -> dict[str, float]:
        """The exported model's metrics on the eval rows."""
        return dict((self.data.get("final") or {}).get("metrics") or {})

    @property
    def constant_metrics(self) -> dict[str, float]:
        """A constant prediction's metrics on the same rows (what the model must beat)."""
        return dict((self.data.get("final") or {}).get("constant") or {})

    @property
    def members(self) -> list[str]:
        """The final ensemble's members."""
        return [m["key"] for m in self.data.get("architecture", {}).get("members", [])]

    @property
    def threshold(self) -> float | None:
        """The decision threshold of a binary head (None: the most probable class)."""
        decision = (self.data.get("calibration") or {}).get("decision") or {}
        return decision.get("threshold")

    @property
    def temperature(self) -> float:
        """The calibration temperature applied in the exported model (1: none)."""
        return float((self.data.get("calibration") or {}).get("temperature", 1.0))

    def leaderboard(self):
        """Every candidate of every iteration, as a DataFrame."""
        import pandas as pd

        rows = [
            {
                "iteration": c["iteration"],
                "candidate": c["candidate"],
                "chosen": c["chosen"],
                "objective": c["objective"],
                **{f"eval {k}": v for k, v in (c.get("eval") or {}).items()},
                "parameters": c.get("parameters"),
            }
            for c in self.data.get("leaderboard", [])
        ]
        return pd.DataFrame(rows)

    def feature_importance(self):
        """Each column's drop in the eval metric when shuffled, largest first."""
        import pandas as pd

        importance = self.data.get("feature_importance") or {}
        return pd.DataFrame(
            [
                {"column": c["column"], "mean_drop": c["mean_drop"], "std_drop": c["std_drop"]}
                for c in importance.get("columns", [])
            ]
        )

    def _repr_html_(self) -> str:
        rows = [("status", self.status), ("head", self.data.get("head", ""))]
        rows += [(f"eval {k}", f"{v:.4f}") for k, v in self.metrics.items()]
        rows += [(f"constant {k}", f"{v:.4f}") for k, v in self.constant_metrics.items()]
        rows += [("members", ", ".join(self.members)), ("temperature", f"{self.temperature:.3f}")]
        if self.threshold is not None:
            rows.append(("threshold", f"{self.threshold:.4f}"))
        rows.append(("model", self.data.get("model_dir", "")))
        cells = "".join(f"<tr><th>{k}</th><td>{_html(v)}</td></tr>" for k, v in rows)
        return f"<table>{cells}</table>"


def _html(value) -> str:
    import html

    return html.escape(str(value))


# -- training here --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """A finished local training job: its job dir, report and exported model."""

    job_dir: str
    report: Report

    @property
    def model(self) -> LocalModel:
        return LocalModel(self.report.model_dir)


def train_local(
    job_dir: str,
    *,
    flags: Mapping[str, Any] | Sequence[str] = (),
    out=None,
    python: str = sys.executable,
) -> LocalTraining:
    """Runs the trainer here (`python -m trainer.task`) in its own process, its output
    printed to `out` line by line as it comes, and returns the finished job. Interrupted (a
    notebook's stop button), it stops the trainer, whose job dir keeps what it finished.

    Args:
        job_dir: the job dir (a job already there resumes, or is re-exported if finished).
        flags: the trainer's flags, `{"train_data": "train.csv", "label_column": "y"}` or
            `["--max_iterations=2"]` (docs/flags.md). Default: the embedded census data.
        out: where the output goes (default: stdout, the notebook's cell).
        python: the interpreter that runs the trainer.

    Raises:
        TrainingFailed: the trainer ended with an error (a bad flag, bad data: its message).
    """
    out = out or sys.stdout
    command = [python, "-m", "trainer.task", f"--job_dir={job_dir}", *_flag_args(flags)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(trainer.__file__)))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    tail: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                print(line, end="", file=out, flush=True)
                tail = [*tail[-19:], line]
        except BaseException:  # a stopped cell stops the job (run it again: it resumes)
            process.terminate()
            raise
    if process.returncode:
        raise TrainingFailed(
            f"the trainer ended with exit status {process.returncode}:\n{''.join(tail)}"
        )
    return LocalTraining(job_dir, Report.read(f"{job_dir.rstrip('/')}/report.json"))


def _flag_args(flags: Mapping[str, Any] | Sequence[str]) -> list[str]:
    if isinstance(flags, Mapping):
        return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in flags.items()]
    if isinstance(flags, str):
        raise DeployError(f"flags ({flags!r}) must be a dict or a list of --flag=value strings.")
    return list(flags)


# -- a model here ------------------------------------------------------------------------------
class LocalModel:
    """An exported model (`JOB_DIR/model`), loaded once, predicting DataFrames. `classes`
    name the probability columns (default: the report.json of the model's job dir, where
    there is one; else `p[0]`, `p[1]`, ...)."""

    def __init__(self, model_dir: str, *, classes: Sequence[str] | None = None):
        self.model_dir = model_dir
        self.predictor = Predictor(model_dir, what=f"model_dir ({model_dir!r})")
        self.classes = list(classes) if classes is not None else _job_classes(model_dir)

    @property
    def fields(self) -> list[str]:
        """The model's input columns."""
        return list(self.predictor.fields.kinds)

    def predict(self, instances):
        """A DataFrame of predictions, one row per instance (a DataFrame, or a list of dicts):
        `predicted` (the class or value) and `p(CLASS)` for each class.

        Raises:
            DeployError: an instance does not fit the model (its row and why), before any
                is predicted.
        """
        records = instances_of(instances, self.fields)
        try:
            return predictions_frame(self.predictor.predict(records), self.classes)
        except InstanceError as e:
            raise DeployError(f"row {e.index}: {e.reason}") from None

    def batch_predict(
        self,
        source,
        *,
        key_field: str | None = None,
        included_fields: Sequence[str] = (),
        excluded_fields: Sequence[str] = (),
        explain: bool = False,
        output_prefix: str | None = None,
        instances_format: str | None = None,
    ):
        """The local twin of a Vertex AI batch job (`deploy.batch local`) over a DataFrame or
        files (a path, glob or list; `gs://` too), read back as a DataFrame: the key (with
        `key_field`) or the instance's fields, the prediction's columns (`predict`'s), and
        with `explain` each column's attribution as `attribution(COLUMN)`. The job's output
        stays in `output_prefix` (default: a temporary folder); the frame's
        `attrs["output_dir"]` names it and `attrs["errors"]` lists the rows that did not fit.
        """
        import pandas as pd

        with tempfile.TemporaryDirectory(prefix="batch-input-") as staging:
            if isinstance(source, pd.DataFrame):
                sources = [os.path.join(staging, "instances.jsonl")]
                with open(sources[0], "w") as f:
                    for record in records_of(source):
                        f.write(json.dumps(record) + "\n")
                instances_format = "jsonl"
            else:
                sources = [source] if isinstance(source, str) else list(source)
                instances_format = instances_format or _format_of(sources[0])
            result = batch_local.predict_local(
                model_dir=self.model_dir,
                sources=sources,
                output_prefix=output_prefix or tempfile.mkdtemp(prefix="batch-prediction-"),
                instances_format=instances_format,
                key_field=key_field,
                included_fields=included_fields,
                excluded_fields=excluded_fields,
                predictor=self.predictor,
                explain_path_count=DEFAULT_PATH_COUNT if explain else None,
            )
        return results_frame(result.output_dir, self.classes)

    def explain(self, instance, *, path_count: int = DEFAULT_PATH_COUNT) -> Explanation:
        """One instance's attributions (sampled Shapley from the model's baseline, as
        `deploy.serve`'s `:explain` computes them): a dict, a Series or a one-row frame."""
        records = instances_of(instance, self.fields)
        if len(records) != 1:
            raise DeployError(f"explain takes one instance; got {len(records)}.")
        try:
            checked = self.predictor.check(records)
        except InstanceError as e:
            raise DeployError(e.reason) from None
        explainer = Explainer.of(self.predictor, path_count)
        _, explanations = explainer.explain(checked)
        return Explanation(explanations[0]["attributions"][0])


def _job_classes(model_dir: str) -> list[str] | None:
    """The classes in the report.json beside `model_dir` (a job dir's), or None."""
    path = f"{model_dir.rstrip('/').rsplit('/', 1)[0]}/report.json"
    try:
        return json.loads(storage.read_bytes(path)).get("classes")
    except (FileNotFoundError, ValueError):
        return None


def _format_of(path: str) -> str:
    name = path.removesuffix(".gz")
    return "csv" if name.endswith(".csv") else "jsonl"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """One instance's attributions, as a Vertex AI endpoint's `Attribution` (`data`)."""

    data: dict

    @property
    def attributions(self):
        """Each input column's share of the output's change from the baseline, a Series
        ordered by size."""
        import pandas as pd

        series = pd.Series(self.data["featureAttributions"], name="attribution")
        return series.reindex(series.abs().sort_values(ascending=False).index)

    @property
    def baseline_output(self) -> float:
        return self.data["baselineOutputValue"]

    @property
    def instance_output(self) -> float:
        return self.data["instanceOutputValue"]

    @property
    def approximation_error(self) -> float:
        return self.data["approximationError"]

    @property
    def output(self) -> str:
        """What is explained: the predicted class's probability, or the predicted value."""
        label = self.data.get("outputDisplayName")
        return f"p({label})" if label is not None else self.data["outputName"]

    def plot(self, ax=None, *, top: int = 15):
        """A horizontal bar chart of the `top` largest attributions; returns the axes."""
        import matplotlib.pyplot as plt

        values = self.attributions.head(top)[::-1]
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 0.3 * len(values) + 1.2))
        ax.barh(
            values.index,
            values.to_numpy(),
            color=["#c0392b" if v < 0 else "#2e86c1" for v in values],
        )
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(
            f"change of {self.output} from the baseline's {self.baseline_output:.3f} "
            f"to {self.instance_output:.3f}"
        )
        return ax


# -- Vertex AI --------------------------------------------------------------------------------
@dataclasses.dataclass
class TrainingJob:
    """A CustomJob of the trainer on Vertex AI: wait on it, then read its report and model."""

    job: Job
    job_dir: str
    model_dir: str

    @property
    def name(self) -> str:
        return self.job.name

    def state(self) -> str:
        return self.job.state()

    def wait(
        self, *, logs: bool = True, poll_seconds: float = 30.0, timeout_seconds=None, out=None
    ):
        """Waits for the job to end, printing its state changes and (with `logs`) its log
        lines as they come; raises JobFailed unless it succeeded."""
        self.job.logs = self.job.logs if logs else None
        self.job.wait(poll_seconds=poll_seconds, timeout_seconds=timeout_seconds, out=out)
        return self

    def report(self) -> Report:
        return Report.read(f"{self.job_dir}/report.json")


def submit(
    cloud: Cloud,
    *,
    display_name: str,
    staging_uri: str | None = None,
    output_dir: str | None = None,
    flags: Mapping[str, Any] | Sequence[str] = (),
    options: job_options.JobOptions | None = None,
    config: str = job_spec.CONFIG,
    logging_endpoint: str | None = None,
) -> TrainingJob:
    """Creates the CustomJob of `config` (`deploy.submit`: the sdist built and uploaded where
    a pool runs it) and returns it to wait on. The job dir must be in Cloud Storage, where
    its report is read (DeployError otherwise, before anything is sent)."""
    staged = custom_job.stage(
        cloud,
        lambda spec: custom_job.Submission(display_name, spec),
        staging_uri=staging_uri,
        config=config,
        output_dir=output_dir,
        extra_args=_flag_args(flags),
        options=options or job_options.JobOptions(),
        dist_dir=tempfile.mkdtemp(prefix="trainer-sdist-"),
    )
    job_dir, model_dir = custom_job.job_dirs(staged.job.spec)
    custom_job.send_or_show(staged, cloud, dry_run=False, out=sys.stdout)
    created = custom_job.create_job(cloud, staged.job)
    client = cloud.job_client()
    job = Job(
        cloud,
        created.name,
        lambda name: client.get_custom_job(name=name),
        LogStream(cloud, created.name.rsplit("/", 1)[-1], endpoint=logging_endpoint),
    )
    return TrainingJob(job, job_dir, model_dir)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A Vertex AI endpoint, predicting DataFrames; `classes` name the probability columns."""

    cloud: Cloud
    endpoint: str
    classes: Sequence[str] | None = None

    def predict(self, instances):
        """Predictions of the deployed model as a DataFrame (`LocalModel.predict`'s columns).
        Each instance is sent with every field of the deployed model's signature, a missing
        value as TensorFlow Serving takes it (`deploy.predict --endpoint` does the same)."""
        fields = predict.endpoint_fields(self.cloud, self.endpoint)
        if fields is None:
            raise DeployError(
                f"endpoint {self.endpoint} has no one model to read the inputs of (none "
                "deployed, or models with different inputs): predict with deploy.predict."
            )
        records = predict.for_tf_serving(fields, instances_of(instances, list(fields.kinds)))
        answer = predict.predict_endpoint(self.cloud, self.endpoint, records)
        return predictions_frame(answer, self.classes)
