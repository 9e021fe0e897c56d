"""The training job's eval metrics (its `report.json`) as a ModelEvaluation of Vertex's metrics
schemas (`JobEvaluation`), imported for the new model version; `FROM_SCHEMA` reads a metric
back from one."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import TypeGuard

from deploy.cloud import api, storage
from trainer.storage import paths

# The metrics schemas of a ModelEvaluation (their fields: the discovery document's
# GoogleCloudAiplatformV1SchemaModelevaluationMetrics{Classification,Regression}EvaluationMetrics).
CLASSIFICATION_METRICS = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"
)


REGRESSION_METRICS = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/regression_metrics_1.0.0.yaml"
)


HEADS = ("binary", "multiclass", "regression")  # report.json `head`


# Whether more is better, for each metric the trainer reports (trainer/model/heads.py:
# Head.metric_names): how a champion is chosen (aliases.py) and a study's goal (study.py).
HIGHER_IS_BETTER = {
    "accuracy": True,
    "auc": True,
    "auc_pr": True,
    "loss": False,
    "mse": False,
    "mae": False,
}


@dataclasses.dataclass(frozen=True)
class JobEvaluation:
    """A training job's eval metrics (report.json `final`: the exported model itself on the eval
    data; `test` in its place where the job had test data, `--test_data` or a managed
    dataset's test split), imported as a ModelEvaluation of the uploaded version.

    Of Vertex's metrics schemas it fills what the report measures: classification `logLoss`
    (the report's loss, the mean cross-entropy) and, for a binary label, `auRoc` and `auPrc`
    (its auc and auc_pr); regression `rootMeanSquaredError` (the square root of its mse) and
    `meanAbsoluteError` (its mae). The report has no curve, confusion matrix or per-class
    figures, so `confidenceMetrics` and `confusionMatrix` stay empty and no slices are
    imported. Every metric of the
    report, accuracy included (neither schema has it), goes into the evaluation's `metadata`
    (`trainer_metrics`), where a later champion comparison reads it back.
    """

    report: str  # where it was read
    head: str  # one of HEADS
    metrics: Mapping[str, float]  # the report's metrics, finite values only
    eval_data: str
    examples: int
    constant: Mapping[str, float] | None = None  # the best constant prediction on the same rows
    weight_column: str | None = None

    def __post_init__(self):
        if self.head not in HEADS:
            raise api.DeployError(
                f"--report {self.report}: head {self.head!r} is not one of {', '.join(HEADS)}: "
                "not a report.json the trainer wrote."
            )

    @classmethod
    def read(cls, report_uri: str, model_dir: str) -> JobEvaluation:
        """The evaluation in the report.json at `report_uri` (local or gs://) of the model
        exported to `model_dir`; DeployError when it cannot be read or is another model's."""
        try:
            data = storage.read_bytes(report_uri)
        except Exception as e:  # a missing object or file, no permission, ...
            raise api.cannot_read(e)(
                f"--report {report_uri}: cannot read it ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no detail'}). Point --report at the "
                "job's report.json: JOB_DIR/report.json, or OUTPUT_DIR/checkpoints/report.json "
                "for a job on Vertex AI given no --job_dir."
            ) from None
        try:
            report = json.loads(data)
        except ValueError as e:
            raise api.DeployError(f"--report {report_uri}: not JSON ({e}).") from None
        return cls.of_report(report, report_uri, model_dir)

    @classmethod
    def of_report(cls, report: dict, report_uri: str, model_dir: str) -> JobEvaluation:
        final = report.get("final") if isinstance(report, dict) else None
        if not isinstance(final, dict) or report.get("status") != "complete":
            status = report.get("status") if isinstance(report, dict) else None
            raise api.DeployError(
                f"--report {report_uri}: the job has not exported and evaluated its model "
                f"(status {status!r}, no final metrics). Publish once the job is complete."
            )
        if not _same_model(report, report_uri, model_dir):
            raise api.DeployError(
                f"--report {report_uri} is the report of the model at "
                f"{report.get('model_dir')!r}, not of --model_dir {model_dir}. Pass the report "
                "of the job that exported this model (a job dir copied whole keeps them "
                "together: JOB_DIR/report.json beside JOB_DIR/model; a job on Vertex AI given no "
                "--job_dir: OUTPUT_DIR/checkpoints/report.json for OUTPUT_DIR/model)."
            )
        test = report.get("test")
        scored: dict = test if isinstance(test, dict) else final
        metrics, constant, examples = (
            scored.get("metrics"),
            scored.get("constant") or {},
            scored.get("examples"),
        )
        if (
            not isinstance(metrics, dict)
            or not isinstance(constant, dict)
            or not isinstance(examples, (int, type(None)))
        ):
            raise api.DeployError(
                f"--report {report_uri}: 'final' has no metrics object (or a malformed "
                "'constant' or 'examples'): not a report.json the trainer wrote."
            )
        return cls(
            report=report_uri,
            head=str(report.get("head")),
            metrics={name: float(v) for name, v in metrics.items() if finite(v)},
            eval_data=str(scored.get("test_data") or scored.get("eval_data")),
            examples=examples or 0,
            constant={k: float(v) for k, v in constant.items() if finite(v)} or None,
            weight_column=scored.get("weight_column"),
        )

    @property
    def schema_uri(self) -> str:
        return REGRESSION_METRICS if self.head == "regression" else CLASSIFICATION_METRICS

    def body(self) -> dict:
        """The ModelEvaluation as the REST API takes it."""
        m = self.metrics
        if self.head == "regression":
            fields = {
                "rootMeanSquaredError": math.sqrt(m["mse"]) if "mse" in m else None,
                "meanAbsoluteError": m.get("mae"),
            }
        else:
            fields = {"logLoss": m.get("loss"), "auRoc": m.get("auc"), "auPrc": m.get("auc_pr")}
        metadata: dict = {
            "report": self.report,
            "head": self.head,
            "eval_data": self.eval_data,
            "examples": self.examples,
            "trainer_metrics": dict(m),
        }
        if self.constant:
            metadata["constant_metrics"] = dict(self.constant)
        if self.weight_column:
            metadata["weight_column"] = self.weight_column
        return {
            "displayName": f"{self.examples} rows of {self.eval_data}"[:128],
            "metricsSchemaUri": self.schema_uri,
            "metrics": {k: v for k, v in fields.items() if v is not None},
            "metadata": metadata,
        }


def finite(value) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _same_model(report: dict, report_uri: str, model_dir: str) -> bool:
    """Whether the report is of the model in `model_dir`: it names that dir, or it lies beside
    it (a job dir copied whole: JOB_DIR/report.json and JOB_DIR/model)."""
    if paths.as_gcs(str(report.get("model_dir") or "")) == paths.as_gcs(model_dir):
        return True
    return paths.as_gcs(report_uri) == paths.as_gcs(model_dir).rsplit("/", 1)[0] + "/report.json"


# A trainer metric as another tool's evaluation may hold it: (schema, metric) -> (field, power).
FROM_SCHEMA = {
    (CLASSIFICATION_METRICS, "loss"): ("logLoss", 1),
    (CLASSIFICATION_METRICS, "auc"): ("auRoc", 1),
    (CLASSIFICATION_METRICS, "auc_pr"): ("auPrc", 1),
    (REGRESSION_METRICS, "mse"): ("rootMeanSquaredError", 2),
    (REGRESSION_METRICS, "mae"): ("meanAbsoluteError", 1),
}
