"""Model monitoring: a Vertex AI ModelDeploymentMonitoringJob on an endpoint, with the exported
model's training data as the skew baseline (`assets.extra/monitoring/`, which the trainer
writes: `trainer/serving/monitoring.py`) and a threshold for each feature.

    python -m deploy.monitor --project=P --endpoint=123 \\
        --model_dir=gs://B/runs/job/model --emails=me@example.com
    python -m deploy.monitor --project=P --endpoint=123 --model_dir=gs://B/runs/job/model \\
        --skew_threshold=0.2 --thresholds=age=0.1,occupation=0.4 --drift_threshold=0.3 \\
        --monitor_interval_hours=6 --sample_rate=0.5 --dry_run

Skew compares serving traffic with the training data, drift with earlier traffic; a threshold
is a distance between distributions (Jensen-Shannon divergence for numbers, L-infinity for
categories), above 0 and at most 1. Every feature is monitored, at `--skew_threshold` (and
`--drift_threshold`) unless `--thresholds` names its own. The job reads the training data
itself, so it must be in Cloud Storage or BigQuery (`--training_data` points elsewhere than
where the model was trained from, e.g. a copy in a bucket of a local training file).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence

from deploy.cloud import api, storage
from trainer.storage import paths
from trainer.storage.paths import (  # trainer/serving/monitoring.py writes them
    MONITORING_ANALYSIS_SCHEMA as ANALYSIS_SCHEMA,
)
from trainer.storage.paths import MONITORING_BASELINE as BASELINE
from trainer.storage.paths import MONITORING_INSTANCE_SCHEMA as INSTANCE_SCHEMA

DEFAULT_THRESHOLD = 0.3  # Vertex AI's console default
DEPLOYED_MODEL_PLACEHOLDER = "DEPLOYED_MODEL_ID"  # a dry run does not read the endpoint


@dataclasses.dataclass(frozen=True)
class Monitoring:
    """A monitoring job's settings, checked; `body` is its request body."""

    endpoint: str
    model_dir: str
    baseline: Mapping
    emails: tuple[str, ...] = ()
    skew_threshold: float = DEFAULT_THRESHOLD
    drift_threshold: float | None = DEFAULT_THRESHOLD
    thresholds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    monitor_interval_hours: int = 1
    sample_rate: float = 0.8
    training_data: str | None = None
    display_name: str = "adanet-monitoring"

    def __post_init__(self):
        api.gcs_uri("--model_dir", self.model_dir)
        _check_threshold("--skew_threshold", self.skew_threshold)
        if self.drift_threshold is not None:
            _check_threshold("--drift_threshold", self.drift_threshold)
        features = list(self.baseline.get("features", {}))
        unknown = [n for n in self.thresholds if n not in features]
        if unknown:
            raise api.DeployError(
                f"--thresholds names {', '.join(unknown)}, not a feature of the model; its "
                f"features are: {', '.join(features)}."
            )
        for name, value in self.thresholds.items():
            _check_threshold(f"--thresholds {name}", value)
        if not 0 < self.sample_rate <= 1:
            raise api.DeployError(
                f"--sample_rate ({self.sample_rate:g}) is the share of requests logged: "
                "above 0, at most 1."
            )
        api.positive("--monitor_interval_hours", self.monitor_interval_hours)
        if self.training_dataset() is None:
            data = self.training_data or self.baseline.get("train_data")
            raise api.DeployError(
                f"the model was trained on {data!r}, which Vertex "
                "AI Model Monitoring cannot read (it reads Cloud Storage CSV, JSON Lines or "
                "TFRecord files and BigQuery tables): copy the training data to a bucket and "
                "pass it with --training_data=gs://...."
            )

    def training_dataset(self) -> dict | None:
        """The job's trainingDataset: `--training_data`, else where the model trained."""
        if self.training_data:
            data = self.training_data.strip()
            if not data.startswith(("gs://", "bq://")):
                raise api.DeployError(
                    f"--training_data ({data!r}) must be gs://... files or a bq:// table."
                )
            dataset = paths.vertex_dataset(data)
        else:
            dataset = self.baseline.get("training_dataset")
        if dataset is None:
            return None
        return {**dataset, "targetField": self.baseline["target_field"]}

    def objective(self) -> dict:
        features = list(self.baseline["features"])

        def each(default: float) -> dict:
            return {n: {"value": float(self.thresholds.get(n, default))} for n in features}

        objective = {
            "trainingDataset": self.training_dataset(),
            "trainingPredictionSkewDetectionConfig": {"skewThresholds": each(self.skew_threshold)},
        }
        if self.drift_threshold is not None:
            objective["predictionDriftDetectionConfig"] = {
                "driftThresholds": each(self.drift_threshold)
            }
        return objective

    def body(self, cloud: api.Cloud, deployed_model_ids: Sequence[str]) -> dict:
        model_dir = self.model_dir.rstrip("/")
        body = {
            "displayName": self.display_name,
            "endpoint": cloud.resource("endpoints", self.endpoint),
            "modelDeploymentMonitoringObjectiveConfigs": [
                {"deployedModelId": i, "objectiveConfig": self.objective()}
                for i in deployed_model_ids
            ],
            "modelDeploymentMonitoringScheduleConfig": {
                "monitorInterval": f"{self.monitor_interval_hours * 3600}s"
            },
            "loggingSamplingStrategy": {"randomSampleConfig": {"sampleRate": self.sample_rate}},
            "predictInstanceSchemaUri": f"{model_dir}/{INSTANCE_SCHEMA}",
            "analysisInstanceSchemaUri": f"{model_dir}/{ANALYSIS_SCHEMA}",
        }
        if self.emails:
            body["modelMonitoringAlertConfig"] = {
                "emailAlertConfig": {"userEmails": list(self.emails)}
            }
        return body

    def request(self, cloud: api.Cloud, deployed_model_ids: Sequence[str]) -> api.ApiRequest:
        return api.ApiRequest(
            "POST",
            cloud.url(f"{cloud.parent}/modelDeploymentMonitoringJobs"),
            self.body(cloud, deployed_model_ids),
        )


def _check_threshold(flag: str, value: float) -> None:
    if not 0 < value <= 1:
        raise api.DeployError(
            f"{flag} ({value:g}) is a distance between distributions (Jensen-Shannon for "
            "numbers, L-infinity for categories): above 0, at most 1."
        )


def read_baseline(model_dir: str) -> dict:
    """The monitoring baseline the trainer exported with the model; DeployError without one."""
    path = f"{model_dir.rstrip('/')}/{BASELINE}"
    try:
        return json.loads(storage.read_bytes(path))
    except FileNotFoundError:
        raise api.DeployError(
            f"{model_dir} has no monitoring baseline ({BASELINE}): the trainer writes it with "
            "the model since monitoring came; export it again (re-run the job with the same "
            "--job_dir), or point --model_dir at the exported model (JOB_DIR/model)."
        ) from None


def deployed_models(cloud: api.Cloud, endpoint: str) -> list[str]:
    """The ids of the models deployed on the endpoint (DeployError for none)."""
    from google.cloud import aiplatform

    cloud.init_sdk()
    ids = [m.id for m in aiplatform.Endpoint(cloud.resource("endpoints", endpoint)).list_models()]
    if not ids:
        raise api.DeployError(
            f"endpoint {endpoint} has no deployed model to monitor: deploy one first "
            "(deploy.publish)."
        )
    return ids


def create(cloud: api.Cloud, monitoring: Monitoring):
    """Creates the monitoring job for every model deployed on the endpoint; returns it (the
    client library's message)."""
    from google.cloud import aiplatform_v1

    body = monitoring.body(cloud, deployed_models(cloud, monitoring.endpoint))
    return cloud.job_client().create_model_deployment_monitoring_job(
        parent=cloud.parent,
        model_deployment_monitoring_job=aiplatform_v1.ModelDeploymentMonitoringJob.from_json(
            json.dumps(body)
        ),
    )


def _thresholds(text: str) -> dict[str, float]:
    found = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")  # no "=": no value, not a number
        try:
            found[name.strip()] = float(value)
        except ValueError:
            raise api.DeployError(
                f"--thresholds: {item!r} is not NAME=VALUE (e.g. age=0.2)."
            ) from None
    return found


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    p.add_argument("--endpoint", required=True, help="The endpoint's id or resource name.")
    p.add_argument("--model_dir", required=True, help="The exported model (gs://.../model).")
    p.add_argument("--emails", default="", help="Comma-separated addresses alerts go to.")
    p.add_argument("--skew_threshold", type=float, default=DEFAULT_THRESHOLD)
    p.add_argument(
        "--drift_threshold", type=float, default=DEFAULT_THRESHOLD, help="0: no drift detection."
    )
    p.add_argument("--thresholds", default="", help="Per feature: NAME=VALUE,... (skew and drift).")
    p.add_argument("--monitor_interval_hours", type=int, default=1)
    p.add_argument("--sample_rate", type=float, default=0.8, help="Share of requests logged.")
    p.add_argument("--training_data", default=None, help="gs:// files or a bq:// table.")
    p.add_argument("--display_name", default="adanet-monitoring")
    args = p.parse_args(argv)
    cloud = api.cloud_from(args)
    cloud.resource("endpoints", args.endpoint)  # a bad id is refused before anything is read
    monitoring = Monitoring(
        endpoint=args.endpoint,
        model_dir=args.model_dir,
        baseline=read_baseline(args.model_dir),
        emails=tuple(e.strip() for e in args.emails.split(",") if e.strip()),
        skew_threshold=args.skew_threshold,
        drift_threshold=args.drift_threshold or None,
        thresholds=_thresholds(args.thresholds),
        monitor_interval_hours=args.monitor_interval_hours,
        sample_rate=args.sample_rate,
        training_data=args.training_data,
        display_name=args.display_name,
    )
    if args.dry_run:
        api.show([monitoring.request(cloud, [DEPLOYED_MODEL_PLACEHOLDER])])
        return 0
    print(create(cloud, monitoring).name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
