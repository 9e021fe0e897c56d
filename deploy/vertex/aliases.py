"""A model's version aliases: each checked as Vertex takes them (`check_alias`), and the
champion alias, moved to a new version only when its imported metric beats the one of the
version holding the alias (`Champion`, `decide`, `crown`)."""

from __future__ import annotations

import dataclasses
import json
import re

from deploy.cloud import api
from deploy.vertex.evaluation import FROM_SCHEMA, HIGHER_IS_BETTER, JobEvaluation, finite

# The alias one version of every model holds: the version used where a request names none.
DEFAULT_ALIAS = "default"


# Vertex's version alias rule (its model-alias page; Model.versionAliases): lowercase letters,
# digits and hyphens, 2-128 characters, a letter first, so that no alias reads as a version id.
_ALIAS = re.compile(r"^[a-z][a-z0-9-]{0,126}[a-z0-9]$")


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
            if metadata.get("head") == head and finite(value):
                return Measured(version, float(value), metadata.get("eval_data"))
            continue
        field = FROM_SCHEMA.get((str(evaluation.get("metricsSchemaUri")), metric))
        value = (evaluation.get("metrics") or {}).get(field[0]) if field else None
        if field and finite(value):
            return Measured(version, float(value) ** field[1])
    return Measured(version, None)


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
