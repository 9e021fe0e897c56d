"""Streaming evaluation: one pass over an eval dataset, metrics accumulated per model, so an
eval set of any size is evaluated in bounded memory and every row is counted once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.input.features import WEIGHT
from trainer.model.heads import Head, Metrics
from trainer.search.frozen import FrozenEnsemble, compile_encoded
from trainer.search.iteration import Iteration


class PairedLosses:
    """The per-example losses of several models on the same rows, accumulated as sums of
    products (memory [count, count], whatever the rows), so that any two models' mean loss
    difference gets its standard error: the rows are a sample, and a difference smaller than
    its noise is no evidence. Weighted rows count with their weights; the effective number of
    rows is (sum w)^2 / sum w^2 (Kish)."""

    def __init__(self, count: int):
        self.count = count
        self.weight = 0.0
        self.weight_squared = 0.0
        self.sums = np.zeros(count)
        self.products = np.zeros((count, count))

    def update(self, losses: np.ndarray, weights: np.ndarray | None = None) -> None:
        """`losses`: [count, rows] per-example losses of the same rows."""
        w = np.ones(losses.shape[1]) if weights is None else np.asarray(weights, np.float64)
        self.weight += float(w.sum())
        self.weight_squared += float(w @ w)
        self.sums += losses @ w
        self.products += (losses * w) @ losses.T

    def standard_errors(self) -> np.ndarray:
        """[count, count]: the standard error of model i's mean loss minus model j's (NaN
        where a loss was not finite or fewer than two rows were seen)."""
        if self.weight_squared == 0 or self.weight**2 / self.weight_squared < 2:
            return np.full(self.products.shape, np.nan)
        mean = self.sums / self.weight
        second = self.products / self.weight  # E[l_i l_j]
        diagonal = np.diag(second)
        with np.errstate(invalid="ignore"):
            variance = (
                diagonal[:, None]
                + diagonal[None, :]
                - 2 * second
                - np.square(mean[:, None] - mean[None, :])
            )
            rows = self.weight**2 / self.weight_squared
            errors = np.sqrt(np.maximum(variance, 0.0) / (rows - 1))
        finite = np.isfinite(np.diag(errors))
        np.fill_diagonal(errors, np.where(finite, 0.0, np.nan))  # not rounding's 1e-9
        return errors


def evaluate(
    dataset: tf.data.Dataset,
    predict: Callable[[Any], tf.Tensor],
    head: Head,
    count: int,
    paired: PairedLosses | None = None,
) -> list[Metrics]:
    """Metrics of `count` models over one pass of `dataset` (`(features, labels)` batches,
    weighted by the features' example weights if they have them); `predict(features)`
    returns their logits stacked, [count, batch, logits]. `paired` accumulates the
    per-example losses of its first models (computed once for both)."""
    metrics = [Metrics(head) for _ in range(count)]
    pairs = paired.count if paired is not None else 0
    for features, labels in dataset:
        labels = labels.numpy()
        weights = features[WEIGHT].numpy() if WEIGHT in features else None
        logits = predict(features).numpy()
        losses = [head.losses(labels, z) for z in logits[:pairs]]
        for i, (accumulated, model_logits) in enumerate(zip(metrics, logits)):
            accumulated.update(labels, model_logits, weights, losses[i] if i < pairs else None)
        if paired is not None and len(labels):
            paired.update(np.stack(losses), weights)
    return metrics


@dataclasses.dataclass(frozen=True)
class IterationMetrics:
    """Every candidate's and every new subnetwork's metrics, and the rows they saw."""

    candidates: list[dict]
    subnetworks: list[dict]
    mean_losses: list[float]  # each candidate's mean loss (what selection adds penalties to)
    # [C, C]: of candidate i's mean loss minus candidate j's (None unless asked for)
    standard_errors: np.ndarray | None
    examples: int


def evaluate_iteration(
    iteration: Iteration, dataset: tf.data.Dataset, *, standard_errors: bool = False
) -> IterationMetrics:
    """Every candidate's and new subnetwork's metrics over one pass of `dataset`; with
    `standard_errors`, those of the candidates' mean loss differences too (what selection on
    these rows needs; the per-example products cost a pass over [C, C] per batch)."""
    predict = iteration.predict_fn()
    count = len(iteration.candidates)
    paired = PairedLosses(count) if standard_errors else None
    metrics = evaluate(
        dataset,
        lambda features: tf.concat(predict(features), axis=0),
        iteration.head,
        count + len(iteration.subnetworks),
        paired,
    )
    return IterationMetrics(
        [m.result() for m in metrics[:count]],
        [m.result() for m in metrics[count:]],
        [m.mean_loss for m in metrics[:count]],
        paired.standard_errors() if paired is not None else None,
        metrics[0].count,
    )


def evaluate_frozen(frozen: FrozenEnsemble, head: Head, dataset: tf.data.Dataset) -> Metrics:
    logits = compile_encoded(frozen.logits, frozen.members[0].subnetwork.inputs)
    return evaluate(dataset, lambda features: logits(features)[None], head, 1)[0]
