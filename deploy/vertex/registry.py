"""The Model Registry side of publishing: the uploaded model as a new version of a parent model,
with its aliases; the training job's eval metrics (its `report.json`) imported as that version's
ModelEvaluation; and a champion alias moved to the new version only when its metric beats the
one imported for the version holding it. `deploy.publish` uploads the model and deploys it; this
module says what the upload names (`parentModel`, `versionAliases`) and what is sent around it:

    registration = Registration(
        parent_model="census",  # a display name, or projects/P/locations/L/models/ID
        version_aliases=("retrained",),
        evaluation=JobEvaluation.read("gs://B/runs/job-2/report.json", "gs://B/runs/job-2/model"),
        champion=Champion("champion", "auc"),
    )

REST methods, all of `projects.locations.models` (ModelServiceClient over REST, or printed by
`--dry_run`): `list` (a parent model named by display name), `upload`'s `parentModel` and
`versionAliases` (the upload itself is `deploy.publish`'s), `evaluations.import` (the job's
metrics, for MODEL@VERSION), and for the champion `listVersions` (who holds the alias),
`evaluations.list` (the holder's figure) and `mergeVersionAliases` (only when the new version
wins).

Of Vertex's ModelEvaluation metrics schemas (`classification_metrics_1.0.0.yaml`,
`regression_metrics_1.0.0.yaml`) it fills what the report measures: `logLoss` and, for a binary
label, `auRoc`; regression `rootMeanSquaredError` and `meanAbsoluteError`. Curves, confusion
matrices, `auPrc` and slices stay empty (the report has none); every metric of the report goes
into the evaluation's `metadata` (`JobEvaluation`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping
from typing import TypeGuard

from deploy.cloud import api, storage
from trainer.storage import paths

# What a dry run of a new version cannot know yet: the answers of earlier requests.
PENDING_PARENT = "{model found by display name}"
PENDING_VERSION = "{version from the upload response}"
PENDING_HOLDER = "{version holding the alias, from the listVersions response}"
# The alias one version of every model holds: the version used where a request names none.
DEFAULT_ALIAS = "default"
# Vertex's version alias rule (its model-alias page; Model.versionAliases): lowercase letters,
# digits and hyphens, 2-128 characters, a letter first, so that no alias reads as a version id.
_ALIAS = re.compile(r"^[a-z][a-z0-9-]{0,126}[a-z0-9]$")
_MODEL_NAME = re.compile(r"^projects/[^/]+/locations/([^/]+)/models/[^/@]+$")
# The metrics schemas of a ModelEvaluation (their fields: the discovery document's
# GoogleCloudAiplatformV1SchemaModelevaluationMetrics{Classification,Regression}EvaluationMetrics).
CLASSIFICATION_METRICS = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml"
)
REGRESSION_METRICS = (
    "gs://google-cloud-aiplatform/schema/modelevaluation/regression_metrics_1.0.0.yaml"
)
HEADS = ("binary", "multiclass", "regression")  # report.json `head`
# Whether more is better, for each metric the trainer reports (deploy/tune.py's METRIC_GOALS
# say the same: a test checks).
HIGHER_IS_BETTER = {"accuracy": True, "auc": True, "loss": False, "mse": False, "mae": False}


# Aliases and the job's evaluation --------------------------------------------------------


def check_alias(flag: str, alias: str) -> str:
    if not _ALIAS.match(alias):
        raise api.DeployError(
            f"{flag} ({alias!r}) is not a Vertex version alias: 2-128 lowercase letters, digits "
            "and hyphens, a letter first and a letter or digit last (so that it never reads as "
            "a version id), e.g. champion or retrained-2026-11."
        )
    return alias


def parse_aliases(text: str) -> tuple[str, ...]:
    """`--version_aliases=a,b` as ("a", "b") (`Registration` checks them)."""
    return tuple(a.strip() for a in text.split(",")) if text.strip() else ()


@dataclasses.dataclass(frozen=True)
class JobEvaluation:
    """A training job's eval metrics (report.json `final`: the exported model itself on the eval
    data; `test` in its place where the job had test data, `--test_data` or a managed
    dataset's test split), imported as a ModelEvaluation of the uploaded version.

    Of Vertex's metrics schemas it fills what the report measures: classification `logLoss`
    (the report's loss, the mean cross-entropy) and, for a binary label, `auRoc` (its auc);
    regression `rootMeanSquaredError` (the square root of its mse) and `meanAbsoluteError` (its
    mae). The report has no curve, confusion matrix or per-class figures, so `confidenceMetrics`,
    `confusionMatrix` and `auPrc` stay empty and no slices are imported. Every metric of the
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
            metrics={name: float(v) for name, v in metrics.items() if _finite(v)},
            eval_data=str(scored.get("test_data") or scored.get("eval_data")),
            examples=examples or 0,
            constant={k: float(v) for k, v in constant.items() if _finite(v)} or None,
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
            fields = {"logLoss": m.get("loss"), "auRoc": m.get("auc")}
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


def _finite(value) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _same_model(report: dict, report_uri: str, model_dir: str) -> bool:
    """Whether the report is of the model in `model_dir`: it names that dir, or it lies beside
    it (a job dir copied whole: JOB_DIR/report.json and JOB_DIR/model)."""
    if paths.as_gcs(str(report.get("model_dir") or "")) == paths.as_gcs(model_dir):
        return True
    return paths.as_gcs(report_uri) == paths.as_gcs(model_dir).rsplit("/", 1)[0] + "/report.json"


# The champion alias ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Champion:
    """An alias that moves to the new version only when the new version's eval metric beats
    the one imported for the version holding it (a tie keeps the holder)."""

    alias: str
    metric: str

    def __post_init__(self):
        check_alias("--champion_alias", self.alias)
        if self.metric not in HIGHER_IS_BETTER:
            raise api.DeployError(
                f"--champion_metric ({self.metric!r}) is not a metric the trainer reports; "
                f"choose from {', '.join(HIGHER_IS_BETTER)}."
            )

    def beats(self, new: float, held: float) -> bool:
        return new > held if HIGHER_IS_BETTER[self.metric] else new < held


@dataclasses.dataclass(frozen=True)
class Measured:
    """A version and its value of the champion metric (None: none of its imported evaluations
    has it), with the eval data it was measured on where known."""

    version: str
    value: float | None
    eval_data: str | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    move: bool
    reason: str


def decide(champion: Champion, new: Measured, holder: Measured | None) -> Decision:
    """Whether the champion alias moves to the `new` version, and why, given the version
    holding it now (None: no version does)."""
    alias, metric = repr(champion.alias), champion.metric
    if new.value is None:
        return Decision(False, f"{alias} does not move: version {new.version} has no {metric}.")
    if holder is None:
        return Decision(True, f"{alias} goes to version {new.version}: no version held it.")
    if holder.version == new.version:
        return Decision(
            False,
            f"version {new.version} holds {alias} already (a model's first version always "
            f"holds {DEFAULT_ALIAS!r}).",
        )
    if holder.value is None:
        return Decision(
            False,
            f"{alias} stays on version {holder.version}: it has no imported evaluation with "
            f"{metric}, so nothing shows that version {new.version} is better. Import one for "
            f"it, or move the alias yourself (mergeVersionAliases on version {new.version}).",
        )
    better = "higher" if HIGHER_IS_BETTER[metric] else "lower"
    figures = (
        f"version {new.version} {metric} {new.value:.4f}, "
        f"version {holder.version} {metric} {holder.value:.4f}; {better} is better"
    )
    note = ""
    if new.eval_data and holder.eval_data and new.eval_data != holder.eval_data:
        note = (
            f" (measured on different eval data, {holder.eval_data} and {new.eval_data}: "
            "the comparison is as fair as those are alike)"
        )
    if champion.beats(new.value, holder.value):
        return Decision(
            True,
            f"{alias} moves from version {holder.version} to version {new.version}: "
            f"{figures}{note}.",
        )
    tie = ", and a tie keeps the holder" if new.value == holder.value else ""
    return Decision(False, f"{alias} stays on version {holder.version}: {figures}{tie}{note}.")


# A trainer metric as another tool's evaluation may hold it: (schema, metric) -> (field, power).
_FROM_SCHEMA = {
    (CLASSIFICATION_METRICS, "loss"): ("logLoss", 1),
    (CLASSIFICATION_METRICS, "auc"): ("auRoc", 1),
    (REGRESSION_METRICS, "mse"): ("rootMeanSquaredError", 2),
    (REGRESSION_METRICS, "mae"): ("meanAbsoluteError", 1),
}


def _created(evaluation: dict) -> tuple[str, float]:
    """An evaluation's createTime as a sortable key: Vertex writes RFC 3339 in UTC with 0, 3, 6
    or 9 digits of fraction ("...:00Z", "...:00.500Z"), which sort wrongly as text."""
    stamp = str(evaluation.get("createTime", "")).removesuffix("Z")
    whole, _, fraction = stamp.partition(".")
    return whole, float(f"0.{fraction}") if fraction.isdigit() else 0.0


def measured(version: str, evaluations: list[dict], metric: str, head: str) -> Measured:
    """The version's value of `metric` in the newest of its evaluations that has it: the
    trainer's own figure (`metadata.trainer_metrics`, of an evaluation imported for the same
    kind of label), else the metrics schema's field another tool may have filled (loss from
    logLoss, auc from auRoc, mse from rootMeanSquaredError, mae from meanAbsoluteError)."""
    for evaluation in sorted(evaluations, key=_created, reverse=True):
        metadata = evaluation.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("trainer_metrics"), dict):
            value = metadata["trainer_metrics"].get(metric)
            if metadata.get("head") == head and _finite(value):
                return Measured(version, float(value), metadata.get("eval_data"))
            continue
        field = _FROM_SCHEMA.get((str(evaluation.get("metricsSchemaUri")), metric))
        value = (evaluation.get("metrics") or {}).get(field[0]) if field else None
        if field and _finite(value):
            return Measured(version, float(value) ** field[1])
    return Measured(version, None)


# What the upload names and what comes with it --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Registration:
    """Where the upload goes in the Model Registry, and what comes with it.

    Without `parent_model` the upload is a new model (version 1, which Vertex makes the
    default). With it, the next version of that model: `parent_model` is its resource name, or
    its display name (found by listing the models of that name; none: a new model; several: an
    error naming them). The new version takes `version_aliases` and, unless
    `keep_default_version`, the `default` alias (what a request naming no version gets).
    `evaluation`, the job's eval metrics, is imported for the new version. `champion` moves its
    alias to the new version only when its metric beats the holder's (`champion.alias ==
    "default"`: the new version becomes the default only then).

    Cost: a display name costs one models.list; the evaluation one evaluations.import; the
    champion one listVersions, one evaluations.list of the holder and, when it moves, one
    mergeVersionAliases.
    """

    parent_model: str | None = None
    version_aliases: tuple[str, ...] = ()
    keep_default_version: bool = False
    evaluation: JobEvaluation | None = None
    champion: Champion | None = None

    def __post_init__(self):
        parent = self.parent_model
        if parent is not None:
            if not parent.strip() or '"' in parent or "\\" in parent:
                raise api.DeployError(
                    f"--parent_model ({parent!r}) must be a model's resource name or display "
                    "name, without quotes or backslashes."
                )
            if parent.startswith("projects/") and not _MODEL_NAME.match(parent):
                raise api.DeployError(
                    f"--parent_model ({parent!r}) is not a model resource name like "
                    "projects/P/locations/L/models/ID (without @VERSION: a new version goes "
                    "into the model itself)."
                )
        for alias in self.version_aliases:
            check_alias("--version_aliases", alias)
        if len(set(self.version_aliases)) != len(self.version_aliases):
            raise api.DeployError(
                f"--version_aliases ({','.join(self.version_aliases)}) names an alias twice."
            )
        if DEFAULT_ALIAS in self.version_aliases:
            raise api.DeployError(
                f"--version_aliases: {DEFAULT_ALIAS!r} is not set there. The new version "
                "becomes the default unless --keep_default_version, or only when it is better "
                f"with --champion_alias={DEFAULT_ALIAS}."
            )
        if self.champion:
            self.check_champion_alias(self.champion.alias)
            self._check_champion(self.champion)

    def check_champion_alias(self, alias: str) -> None:
        if alias in self.version_aliases:
            raise api.DeployError(
                f"--champion_alias ({alias!r}) is in --version_aliases too, which would give "
                "it to the new version whatever its metric. Name it in one of the two."
            )

    def _check_champion(self, champion: Champion) -> None:
        alias, metric = champion.alias, champion.metric
        if self.evaluation is None:
            raise api.DeployError(
                f"--champion_alias ({alias!r}) needs --report=JOB_DIR/report.json: the new "
                "version's metric comes from the job's report."
            )
        if metric not in self.evaluation.metrics:
            raise api.DeployError(
                f"--champion_metric ({metric!r}): {self.evaluation.report} has no finite "
                f"{metric}; it has {', '.join(self.evaluation.metrics) or 'none'}."
            )
        if metric == "loss" and self.evaluation.head == "regression":
            raise api.DeployError(
                "--champion_metric (loss): a regression's loss is in units of the training "
                "labels' standard deviation, which differs from one training to the next; "
                "compare mse or mae."
            )

    @property
    def is_default_version(self) -> bool:
        """Whether the upload takes the `default` alias (the SDK's `is_default_version`)."""
        champion_default = self.champion is not None and self.champion.alias == DEFAULT_ALIAS
        return not self.keep_default_version and not champion_default

    def upload_aliases(self) -> list[str]:
        """`versionAliases` as the SDK sends them: the aliases, then `default` if taken."""
        return [*self.version_aliases, *([DEFAULT_ALIAS] if self.is_default_version else [])]

    def parent_name(self, cloud: api.Cloud) -> str | None:
        """The parent model's resource name when `parent_model` is one; None for a display
        name (looked up by `find_parent`) or no parent."""
        parent = self.parent_model
        if not parent or not parent.startswith("projects/"):
            return None
        location = _MODEL_NAME.match(parent).group(1)  # type: ignore[union-attr]
        if location != cloud.region:
            raise api.DeployError(
                f"--parent_model ({parent}) is in {location}, but --region is {cloud.region}: "
                f"a version goes to its model's region; pass --region={location}."
            )
        return parent


# What is sent around the upload: for --dry_run, then through the client library ----------


def parent_requests(cloud: api.Cloud, r: Registration) -> tuple[list[api.ApiRequest], str | None]:
    """For --dry_run: the models.list that finds a parent model named by display name (none
    for a resource name or no parent), and the `parentModel` the upload then names (None: a new
    model)."""
    parent = r.parent_name(cloud)
    if r.parent_model and parent is None:
        models = cloud.url(f"{cloud.parent}/models")
        lookup = api.ApiRequest("GET", f'{models}?filter=display_name="{r.parent_model}"')
        return [lookup], PENDING_PARENT
    return [], parent


def register_requests(cloud: api.Cloud, r: Registration, model: str) -> list[api.ApiRequest]:
    """For --dry_run: what follows the upload of a version of `model` (its resource name, or a
    placeholder): the evaluation's import, then the champion's listVersions, the holder's
    evaluations and the mergeVersionAliases sent only when the new version's metric is better."""
    version = f"{model}@{PENDING_VERSION}"
    requests = []
    if r.evaluation:
        requests.append(
            api.ApiRequest(
                "POST",
                cloud.url(f"{version}/evaluations:import"),
                {"modelEvaluation": r.evaluation.body()},
            )
        )
    if r.champion:
        requests += [
            api.ApiRequest("GET", cloud.url(f"{model}:listVersions")),
            api.ApiRequest("GET", cloud.url(f"{model}@{PENDING_HOLDER}/evaluations")),
            api.ApiRequest(
                "POST",
                cloud.url(f"{version}:mergeVersionAliases"),
                {"versionAliases": [r.champion.alias]},
            ),
        ]
    return requests


def register(client, name: str, version: str, r: Registration, notes: list[str]) -> str | None:
    """After the upload of `version` of model `name`: imports the job's evaluation for it and
    moves the champion alias if it is better (`r`), through `client` (a ModelServiceClient),
    noting what was decided and why in `notes`. Returns the imported evaluation's name (None
    without one)."""
    from google.cloud import aiplatform_v1

    evaluation = None
    if r.evaluation:
        evaluation = client.import_model_evaluation(
            parent=f"{name}@{version}",
            model_evaluation=aiplatform_v1.ModelEvaluation.from_json(
                json.dumps(r.evaluation.body())
            ),
        ).name
        notes.append(f"version {version}: the job's eval metrics imported as {evaluation}.")
    if r.champion:
        assert r.evaluation is not None  # Registration requires it
        notes.append(crown(client, name, version, r.champion, r.evaluation).reason)
    return evaluation


def find_parent(cloud: api.Cloud, client, display_name: str, notes: list[str]) -> str | None:
    """The model named `display_name` (None: there is none, the upload is a new model);
    DeployError naming them when several have that name."""
    found = [
        m.name
        for m in client.list_models(
            request={"parent": cloud.parent, "filter": f'display_name="{display_name}"'}
        )
        if m.display_name == display_name
    ]
    if len(found) > 1:
        raise api.DeployError(
            f"--parent_model ({display_name!r}): {len(found)} models have that display name "
            f"({', '.join(found)}); pass the resource name of the one to add a version to."
        )
    if not found:
        notes.append(f"no model is named {display_name!r} in {cloud.parent}: a new model.")
        return None
    notes.append(f"--parent_model {display_name!r} is {found[0]}: a new version of it.")
    return found[0]


def crown(
    client, name: str, version: str, champion: Champion, evaluation: JobEvaluation
) -> Decision:
    """Moves the champion alias to `version` of model `name` when its metric (from the job's
    `evaluation`) beats the holder's (from the holder's imported evaluations)."""
    new = Measured(version, evaluation.metrics[champion.metric], evaluation.eval_data)
    holders = [
        v.version_id
        for v in client.list_model_versions(name=name)
        if champion.alias in v.version_aliases
    ]
    holder = None
    if holders and holders[0] != version:
        evaluations = client.list_model_evaluations(parent=f"{name}@{holders[0]}")
        rows = [json.loads(type(e).to_json(e)) for e in evaluations]
        holder = measured(holders[0], rows, champion.metric, evaluation.head)
    elif holders:
        holder = Measured(version, None)
    decision = decide(champion, new, holder)
    if decision.move:
        client.merge_version_aliases(name=f"{name}@{version}", version_aliases=[champion.alias])
    return decision


# Command-line flags ----------------------------------------------------------------------


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a `Registration` (`registration_from` reads them)."""
    g = p.add_argument_group("Model Registry: versions, evaluation, champion alias")
    g.add_argument(
        "--parent_model",
        help="Upload a new version of this model: its resource name "
        "(projects/P/locations/L/models/ID) or its display name (no model of that name: a "
        "new model). Default: a new model.",
    )
    g.add_argument(
        "--version_aliases",
        default="",
        help="Comma-separated aliases of the new version (lowercase letters, digits, hyphens; "
        "a letter first), e.g. retrained,canary.",
    )
    g.add_argument(
        "--keep_default_version",
        action="store_true",
        help="Leave the model's 'default' alias where it is (else the new version takes it).",
    )
    g.add_argument(
        "--report",
        help="The job's report.json (JOB_DIR/report.json): its eval metrics are imported as "
        "the new version's ModelEvaluation.",
    )
    g.add_argument(
        "--champion_alias",
        help="An alias moved to the new version only when its --champion_metric (from "
        "--report) beats the current holder's (from the holder's imported evaluation).",
    )
    g.add_argument(
        "--champion_metric",
        help=f"One of {', '.join(HIGHER_IS_BETTER)} (default: accuracy; regression: mse).",
    )


def registration_from(args: argparse.Namespace) -> Registration:
    """The registry flags of `add_flags` (and `--model_dir`, the model the report must be of),
    checked before --report is read."""
    aliases = parse_aliases(args.version_aliases)
    # The flags alone first, so that their mistakes are named before --report is read.
    flags_only = Registration(parent_model=args.parent_model, version_aliases=aliases)
    if args.champion_alias is None:
        if args.champion_metric is not None:
            raise api.DeployError("--champion_metric needs --champion_alias.")
    else:
        Champion(args.champion_alias, args.champion_metric or "accuracy")
        flags_only.check_champion_alias(args.champion_alias)
    evaluation = None
    if args.report:
        api.gcs_uri("--model_dir", args.model_dir)
        try:
            evaluation = JobEvaluation.read(args.report, args.model_dir)
        except api.Unreachable as e:
            if not args.dry_run:
                raise
            # A dry run needs no credentials or network: what needs the report is left out.
            print(
                f"dry run: --report not read ({e}); the requests that need it (the evaluation "
                "import, the champion comparison) are left out below.",
                file=sys.stderr,
            )
            return dataclasses.replace(flags_only, keep_default_version=args.keep_default_version)
    champion = None
    if args.champion_alias is not None:  # without --report, Registration says it needs one
        regression = evaluation is not None and evaluation.head == "regression"
        default = "mse" if regression else "accuracy"
        champion = Champion(args.champion_alias, args.champion_metric or default)
    return Registration(
        parent_model=args.parent_model,
        version_aliases=aliases,
        keep_default_version=args.keep_default_version,
        evaluation=evaluation,
        champion=champion,
    )
