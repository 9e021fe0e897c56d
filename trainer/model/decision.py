"""A binary head's decision threshold: which probability of the positive class makes the
predicted class positive, chosen on held-out rows by the objective the user names
(`--decision_objective`).

The objectives, by name:
  (unset or empty)         the most probable class: threshold 0.5, nothing chosen
  accuracy                 the threshold of the highest accuracy on the rows
  f1                       the threshold of the highest F1 score of the positive class
  precision_at_recall=R    the highest precision among the thresholds with recall >= R
  recall_at_precision=P    the highest recall among the thresholds with precision >= P
  threshold=T              T itself, chosen by the user

A threshold falls halfway (in logit space) between two neighbouring probabilities of the rows,
so that a row's class does not hinge on float rounding of its own probability.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from trainer.errors import InputError

KINDS = ("accuracy", "f1", "precision_at_recall", "recall_at_precision", "threshold")
_WITH_VALUE = ("precision_at_recall", "recall_at_precision", "threshold")
CURVE_POINTS = 101  # the precision-recall curve kept for the report, at most


@dataclasses.dataclass(frozen=True)
class Objective:
    """A parsed `--decision_objective`: `kind` one of KINDS or "" (the most probable class),
    `value` the target of the kinds that take one."""

    kind: str = ""
    value: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Objective:
        """`Objective` of a flag's text (None: unset); InputError naming the rule when it is
        not one."""
        text = (text or "").strip()
        if not text:
            return cls()
        kind, _, value = text.partition("=")
        if kind not in KINDS:
            raise InputError(
                f"--decision_objective ({text}) must be one of accuracy, f1, "
                "precision_at_recall=R, recall_at_precision=P, threshold=T (R, P, T in (0, 1)), "
                "or unset for the most probable class."
            )
        if kind not in _WITH_VALUE:
            if value:
                raise InputError(f"--decision_objective ({text}): {kind} takes no value.")
            return cls(kind)
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not 0.0 < number < 1.0:
            raise InputError(
                f"--decision_objective ({text}): {kind} takes a number in (0, 1), e.g. {kind}=0.8."
            )
        return cls(kind, number)

    @property
    def chosen_on_rows(self) -> bool:
        """Whether the threshold is chosen on rows (not 0.5, not given)."""
        return self.kind not in ("", "threshold")

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}={self.value:g}"


@dataclasses.dataclass(frozen=True)
class Point:
    """The positive class's precision, recall and F1, and the accuracy, at one threshold."""

    threshold: float
    precision: float
    recall: float
    f1: float
    accuracy: float


@dataclasses.dataclass(frozen=True)
class Decision:
    """The threshold an objective chose, its point on the rows it was chosen on, whether the
    objective's target was met there (`met`: False when no threshold reaches it, and the
    nearest was taken) and the rows' precision-recall curve (at most CURVE_POINTS)."""

    objective: Objective
    point: Point
    met: bool
    curve: list[Point]

    def to_json(self) -> dict:
        return {
            "objective": str(self.objective) or "most probable class",
            "threshold": self.point.threshold,
            "met": self.met,
            "chosen_on": dataclasses.asdict(self.point),
            "curve": [dataclasses.asdict(p) for p in self.curve],
        }


class Curve:
    """Every threshold that changes a row's class, from the highest (the rows of the highest
    probability predicted positive) to the lowest (every row positive), with the point at
    each, as arrays: weighted counts where the rows have weights."""

    def __init__(
        self, labels: np.ndarray, probability: np.ndarray, weights: np.ndarray | None = None
    ):
        w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
        order = np.argsort(-probability, kind="stable")
        p, y, w = probability[order].astype(np.float64), labels[order] == 1, w[order]
        last = np.r_[np.flatnonzero(np.diff(p)), len(p) - 1]  # the last row of each p
        tp, fp = np.cumsum(w * y)[last], np.cumsum(w * ~y)[last]
        lower = np.r_[p[last[:-1] + 1], 0.0]  # the next lower probability (0 after the last)
        self.threshold = _between(p[last], lower)
        self.precision, self.recall, self.f1, self.accuracy = _rates(
            tp, fp, float(w @ y), float(w.sum())
        )

    def __len__(self) -> int:
        return len(self.threshold)

    def point(self, i: int) -> Point:
        return Point(
            float(self.threshold[i]),
            float(self.precision[i]),
            float(self.recall[i]),
            float(self.f1[i]),
            float(self.accuracy[i]),
        )

    def best(self, score: np.ndarray, allowed: np.ndarray | None = None) -> int:
        """The index of the highest `score` (ties: the highest threshold) among `allowed`."""
        candidates = np.arange(len(self)) if allowed is None else np.flatnonzero(allowed)
        return int(candidates[np.lexsort((self.threshold[candidates], score[candidates]))[-1]])

    def thinned(self) -> list[Point]:
        """At most CURVE_POINTS points, evenly spread over the thresholds, for the report."""
        keep = np.unique(np.linspace(0, len(self) - 1, min(len(self), CURVE_POINTS)).round())
        return [self.point(int(i)) for i in keep]


def choose(
    objective: Objective,
    labels: np.ndarray,
    probability: np.ndarray,
    weights: np.ndarray | None = None,
) -> Decision:
    """The threshold `objective` chooses on rows of `labels` (0/1) and their predicted
    `probability` of class 1."""
    curve = Curve(labels, probability, weights)
    if objective.kind in ("", "threshold"):
        threshold = 0.5 if objective.value is None else objective.value
        return Decision(
            objective, at(threshold, labels, probability, weights), True, curve.thinned()
        )
    met = True
    if objective.kind == "accuracy":
        chosen = curve.best(curve.accuracy)
    elif objective.kind == "f1":
        chosen = curve.best(curve.f1)
    elif objective.kind == "precision_at_recall":  # the lowest threshold has recall 1
        chosen = curve.best(curve.precision, curve.recall >= objective.value)
    else:  # recall_at_precision: where no threshold reaches it, the most precise one
        reaching = curve.precision >= objective.value
        met = bool(reaching.any())
        chosen = curve.best(curve.recall, reaching) if met else curve.best(curve.precision)
    return Decision(objective, curve.point(chosen), met, curve.thinned())


def at(
    threshold: float, labels: np.ndarray, probability: np.ndarray, weights: np.ndarray | None
) -> Point:
    """The point of a given threshold (a row of probability above it is positive)."""
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    predicted, y = probability > threshold, labels == 1
    tp, fp = np.array([w @ (predicted & y)]), np.array([w @ (predicted & ~y)])
    rates = _rates(tp, fp, float(w @ y), float(w.sum()))
    return Point(threshold, *(float(r[0]) for r in rates))


def _rates(
    tp: np.ndarray, fp: np.ndarray, positives: float, total: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Precision (1 where nothing is predicted positive), recall, F1 and accuracy of the
    (weighted) true and false positives at each threshold, of rows with `positives` of
    `total` positive."""

    def ratio(top: np.ndarray, bottom, empty: float) -> np.ndarray:
        bottom = np.broadcast_to(np.asarray(bottom, np.float64), top.shape)
        return np.divide(top, bottom, out=np.full(top.shape, empty), where=bottom > 0)

    precision = ratio(tp, tp + fp, 1.0)
    recall = ratio(tp, positives, 0.0)
    f1 = ratio(2 * precision * recall, precision + recall, 0.0)
    accuracy = ratio(tp + (total - positives) - fp, total, 0.0)
    return precision, recall, f1, accuracy


def _between(higher: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Halfway between neighbouring probabilities in logit space; below the lowest, half of
    it (every row positive)."""
    eps = 1e-12
    h, lo = np.clip(higher, eps, 1 - eps), np.clip(lower, eps, 1 - eps)
    middle = 0.5 * (np.log(h / (1 - h)) + np.log(lo / (1 - lo)))
    return np.where(lower > 0.0, 1.0 / (1.0 + np.exp(-middle)), 0.5 * higher)
