"""Calibrating the exported model's probabilities and choosing a binary head's decision
threshold, on the rows the search chose on (held out from training), before the export.

Calibration is temperature scaling (Guo et al., 2017, "On Calibration of Modern Neural
Networks"): the ensemble's logits divided by one number T, fitted to the lowest log loss on
those rows. One number for every head, binary and multi-class alike: it keeps each row's
order of classes, so accuracy and AUC are unchanged and only the probabilities move; and one
parameter does not overfit a hold-out of a few hundred rows, where vector or matrix scaling
(K or K^2 parameters for K classes) can, and did no better in that paper's tables. A binary
head then takes its threshold from the calibrated probabilities (`trainer/model/decision.py`).

The expected calibration error (ECE) is the top-label one of that paper: rows binned by the
probability of their predicted class into ECE_BINS equal bins, the rows' weighted mean of
|accuracy - confidence| over the bins.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from scipy import optimize

from trainer.errors import InputError
from trainer.evaluation import exported
from trainer.input.features import WEIGHT
from trainer.input.schema import HeadType
from trainer.model import decision as decision_lib
from trainer.model.heads import Head
from trainer.search.frozen import FrozenEnsemble, compile_encoded

ECE_BINS = 15
# T is searched over this range (log-uniformly); a fit at either end says the logits carry
# next to no information (T large) or are far too timid (T small).
TEMPERATURE_RANGE = (0.05, 20.0)
METHODS = ("temperature", "none")
# The fitted temperature is applied only where it lowers the held-out rows' log loss by more
# than this many standard errors of the per-row differences. The search chose its candidate on
# the same rows, which flatters it there (it looks under-confident): on the suite's small
# tables the temperatures fitted without this test were below 1 and made the test rows' log
# loss worse (titanic 0.4750 -> 0.4930, cells 0.3510 -> 0.3542, hpc 0.4340 -> 0.4358;
# bench/HISTORY.md "Temperature without a significance test").
SIGNIFICANT_SE = 2.0
# The eval rows whose logits the job keeps for the calibration's figures on them (`on_eval`):
# 2M binary rows are about 24 MB; more are streamed and not summarised.
EVAL_ROWS_KEPT = 2_000_000


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """What the export applies (`temperature`, and the head deciding at its threshold) and
    what report.json says of it (`to_json`)."""

    temperature: float
    head: Head
    report: dict

    def to_json(self) -> dict:
        return self.report


def calibrate(
    frozen: FrozenEnsemble,
    head: Head,
    rows: tuple[tf.data.Dataset, str] | None,
    *,
    method: str,
    objective: decision_lib.Objective,
) -> Calibrated:
    """Fits the temperature (`method`) and chooses the threshold (`objective`, binary heads)
    on `rows` (encoded `(features, labels)` batches, and what they are:
    `JobInput.calibration_rows`); None: there are no rows to fit on."""
    if head.type is HeadType.REGRESSION:
        return Calibrated(1.0, head, {"method": "none", "why": "a regression head"})
    if rows is None:
        return _uncalibrated(head, objective, NO_ROWS)
    dataset, rows_name = rows
    labels, logits, weights = _predict(frozen, dataset)
    if not len(labels):
        return _uncalibrated(head, objective, "the held-out rows are empty")
    temperature = 1.0
    report: dict = {"method": method}
    if method != "none":
        fitted = fit_temperature(head, labels, logits, weights)
        gain, error = paired_gain(head, labels, logits, fitted, weights)
        report.update(fitted_temperature=fitted, loss_gain=gain, loss_gain_se=error)
        if gain > SIGNIFICANT_SE * error:
            temperature = fitted
        else:
            report["method"] = "none"
            report["why"] = (
                f"the fitted temperature {fitted:.3f} lowered the held-out log loss by "
                f"{gain:.4f}, within {SIGNIFICANT_SE:g} standard errors ({error:.4f}): not "
                "applied"
            )
    report.update({
        "temperature": temperature,
        "fitted_on": rows_name,
        "rows": int(len(labels)),
        "before": summary(head, labels, logits, weights),
        "after": summary(head, labels, logits / temperature, weights),
    })  # fmt: skip
    if head.type is HeadType.BINARY:
        probability = head.probabilities_of(logits / temperature)[:, 1]
        chosen = decision_lib.choose(objective, labels, probability, weights)
        head = head.with_threshold(chosen.point.threshold)
        report["decision"] = chosen.to_json()
    return Calibrated(temperature, head, report)


NO_ROWS = (
    "the search chose on --eval_data, which stays a test set: no rows held out from training "
    "to calibrate on (--selection=holdout holds some out)"
)


def _uncalibrated(head: Head, objective: decision_lib.Objective, why: str) -> Calibrated:
    """No rows to fit on: the logits as trained, and a binary head's threshold only where the
    objective names it (threshold=T)."""
    if objective.chosen_on_rows:  # refused before training (`trainer/job/job.py`)
        raise InputError(f"--decision_objective={objective} needs held-out rows, and {why}.")
    if head.type is HeadType.BINARY and objective.value is not None:
        head = head.with_threshold(objective.value)
    return Calibrated(1.0, head, {"method": "none", "why": why, "threshold": head.threshold})


def deciding(head: Head, calibration: dict) -> Head:
    """`head` deciding at the threshold a model was exported with (its stamp's calibration)."""
    threshold = calibration.get("decision", {}).get("threshold", calibration.get("threshold"))
    return head if threshold is None else head.with_threshold(threshold)


def on_eval(head: Head, predictions: list[exported.Batch], temperature: float) -> dict:
    """The calibration's `summary` on the eval rows, before and after: `predictions`, the
    exported model's (calibrated) logits per batch (`exported.Batch`)."""
    labels, logits, weights = exported.concatenated(predictions)
    result = {
        "rows": int(len(labels)),
        "before": summary(head, labels, logits * temperature, weights),
        "after": summary(head, labels, logits, weights),
    }
    if head.type is HeadType.BINARY:  # the threshold's point on these rows
        positive = head.probabilities_of(logits)[:, 1]
        point = decision_lib.at(head.threshold, labels, positive, weights)
        result["decision"] = dataclasses.asdict(point)
    return result


def paired_gain(
    head: Head,
    labels: np.ndarray,
    logits: np.ndarray,
    temperature: float,
    weights: np.ndarray | None = None,
) -> tuple[float, float]:
    """How much `temperature` lowers the (weighted) mean log loss of these rows, and the
    standard error of that mean of per-row differences."""
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    diff = head.losses(labels, logits) - head.losses(labels, logits / temperature)
    mean = float(w @ diff / w.sum())
    effective = w.sum() ** 2 / (w @ w)  # rows, for unequal weights
    variance = float(w @ (diff - mean) ** 2 / w.sum())
    return mean, float(np.sqrt(variance / max(effective - 1, 1)))


def fit_temperature(
    head: Head, labels: np.ndarray, logits: np.ndarray, weights: np.ndarray | None = None
) -> float:
    """The T in TEMPERATURE_RANGE of the lowest (weighted) mean log loss of `logits` / T."""
    w = np.ones(len(labels)) if weights is None else weights

    def loss(log_t: float) -> float:
        return float(w @ head.losses(labels, logits / np.exp(log_t)) / w.sum())

    low, high = np.log(TEMPERATURE_RANGE)
    found = optimize.minimize_scalar(loss, bounds=(low, high), method="bounded")
    return float(np.exp(found.x))


def summary(
    head: Head, labels: np.ndarray, logits: np.ndarray, weights: np.ndarray | None = None
) -> dict:
    """Log loss, ECE and the reliability diagram's bins of `logits` on labelled rows."""
    w = np.ones(len(labels)) if weights is None else weights
    bins = reliability(head, labels, logits, weights)
    total = sum(b["weight"] for b in bins) or 1.0
    ece = sum(b["weight"] * abs(b["accuracy"] - b["confidence"]) for b in bins) / total
    return {
        "loss": float(w @ head.losses(labels, logits) / w.sum()),
        "ece": float(ece),
        "reliability": bins,
    }


def reliability(
    head: Head, labels: np.ndarray, logits: np.ndarray, weights: np.ndarray | None = None
) -> list[dict]:
    """The reliability diagram: for each of ECE_BINS equal bins of the most probable class's
    probability that holds rows (a decision threshold aside: calibration is of the
    probabilities), their mean probability (`confidence`), the share of them
    whose prediction is right (`accuracy`) and their weight (rows without weights)."""
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    probabilities = head.probabilities_of(logits)
    predicted = probabilities.argmax(axis=1)  # the most probable class, whatever the threshold
    confidence = probabilities[np.arange(len(labels)), predicted]
    right = (predicted == labels).astype(np.float64)
    index = np.minimum((confidence * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    bins = []
    for b in range(ECE_BINS):
        inside = index == b
        weight = float(w[inside].sum())
        if weight > 0:
            bins.append(
                {
                    "low": b / ECE_BINS,
                    "high": (b + 1) / ECE_BINS,
                    "confidence": float(w[inside] @ confidence[inside] / weight),
                    "accuracy": float(w[inside] @ right[inside] / weight),
                    "weight": weight,
                }
            )
    return bins


def _predict(
    frozen: FrozenEnsemble, rows: tf.data.Dataset
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The labels, the ensemble's logits and the weights (None without) of every row."""
    logits_of = compile_encoded(frozen.logits, frozen.members[0].subnetwork.inputs)
    labels, logits, weights = [], [], []
    for features, batch_labels in rows:
        labels.append(batch_labels.numpy())
        logits.append(logits_of(features).numpy())
        if WEIGHT in features:
            weights.append(features[WEIGHT].numpy())
    if not labels:
        return np.zeros(0, np.int64), np.zeros((0, 1), np.float32), None
    return (
        np.concatenate(labels),
        np.concatenate(logits),
        np.concatenate(weights) if weights else None,
    )
