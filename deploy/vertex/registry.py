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
label, `auRoc` and `auPrc`; regression `rootMeanSquaredError` and `meanAbsoluteError`. Curves,
confusion matrices and slices stay empty (the report has none); every metric of the report
goes into the evaluation's `metadata` (`JobEvaluation`, `evaluation.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from deploy.cloud import api
from deploy.vertex.aliases import DEFAULT_ALIAS, Champion, check_alias, crown, parse_aliases
from deploy.vertex.evaluation import HIGHER_IS_BETTER, JobEvaluation

# What a dry run of a new version cannot know yet: the answers of earlier requests.
PENDING_PARENT = "{model found by display name}"
PENDING_VERSION = "{version from the upload response}"
PENDING_HOLDER = "{version holding the alias, from the listVersions response}"
_MODEL_NAME = re.compile(r"^projects/[^/]+/locations/([^/]+)/models/[^/@]+$")


# Aliases and the job's evaluation --------------------------------------------------------


# The champion alias ----------------------------------------------------------------------


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
