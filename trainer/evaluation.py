"""Streaming evaluation: one pass over an eval dataset, metrics accumulated per model, so an
eval set of any size is evaluated in bounded memory and every row is counted once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainer.features import WEIGHT
from trainer.frozen import FrozenEnsemble, compile_encoded
from trainer.heads import Head, Metrics
from trainer.iteration import Iteration


def evaluate(
    dataset: tf.data.Dataset, predict: Callable[[Any], tf.Tensor], head: Head, count: int
) -> list[Metrics]:
    """Metrics of `count` models over one pass of `dataset` (`(features, labels)` batches,
    weighted by the features' example weights if they have them); `predict(features)`
    returns their logits stacked, [count, batch, logits]."""
    metrics = [Metrics(head) for _ in range(count)]
    for features, labels in dataset:
        labels = labels.numpy()
        weights = features[WEIGHT].numpy() if WEIGHT in features else None
        for accumulated, logits in zip(metrics, predict(features).numpy()):
            accumulated.update(labels, logits, weights)
    return metrics


@dataclasses.dataclass(frozen=True)
class IterationMetrics:
    """Every candidate's and every new subnetwork's metrics, and the rows they saw."""

    candidates: list[dict]
    subnetworks: list[dict]
    mean_losses: list[float]  # each candidate's mean loss (what selection adds penalties to)
    examples: int


def evaluate_iteration(iteration: Iteration, dataset: tf.data.Dataset) -> IterationMetrics:
    predict = iteration.predict_fn()
    count = len(iteration.candidates)
    metrics = evaluate(
        dataset,
        lambda features: tf.concat(predict(features), axis=0),
        iteration.head,
        count + len(iteration.subnetworks),
    )
    return IterationMetrics(
        [m.result() for m in metrics[:count]],
        [m.result() for m in metrics[count:]],
        [m.mean_loss for m in metrics[:count]],
        metrics[0].count,
    )


def evaluate_frozen(frozen: FrozenEnsemble, head: Head, dataset: tf.data.Dataset) -> Metrics:
    logits = compile_encoded(frozen.logits, frozen.members[0].subnetwork.inputs)
    return evaluate(dataset, lambda features: logits(features)[None], head, 1)[0]
