"""The bagged model (`--bags`, `trainer/job/bagging.py`): the exports of K searches behind
one serving signature, the same as one export's, serving the mean of their probabilities
(classification) or the trimmed mean of their predictions (regression)."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from trainer.input.features import Preprocessor
from trainer.input.schema import HeadType, Schema
from trainer.model.heads import Head
from trainer.serving import export

_TINY = 1e-7  # probabilities are kept off 0 and 1 before their logarithm


def trimmed_mean(values: tf.Tensor) -> tf.Tensor:
    """The mean over axis 0 of `values` (one row per bag) without each column's highest and
    lowest value, from 3 rows on; the plain mean of fewer.

    A search on a hold-out of a few dozen rows now and then keeps a network that the hold-out
    flattered: on diabetes (5 seeds x 5 bags, docs/benchmarks.md "Bagging on small tables";
    bench/HISTORY.md "Diabetes and the linear candidate") single bags scored up to 66.4
    RMSE where the others of the same run scored 55.7-59.7, and a mean of predicted values
    carries such a bag. Without each row's extremes the bagged RMSE went from 56.61 to 56.33
    (Ridge: 56.46), and friedman_small, whose bags are all networks, kept its 1.70."""
    count = values.shape[0]
    if count < 3:
        return tf.reduce_mean(values, axis=0)
    extremes = tf.reduce_max(values, axis=0) + tf.reduce_min(values, axis=0)
    return (tf.reduce_sum(values, axis=0) - extremes) / (count - 2)


def bagged_outputs(head: Head, outputs: Sequence[dict[str, tf.Tensor]]) -> dict[str, tf.Tensor]:
    """The serving outputs of several models together: the mean probability of each class
    (regression: the trimmed mean of the predicted values), and logits that give it back
    through the head. Probabilities keep the plain mean, which sums to 1 over the classes."""
    if head.type is HeadType.REGRESSION:
        value = trimmed_mean(tf.stack([o["predictions"] for o in outputs]))
        logits = ((value - head.label.mean) / head.label.std)[:, None]
    else:
        probabilities = tf.add_n([o["probabilities"] for o in outputs]) / len(outputs)
        log_p = tf.math.log(tf.clip_by_value(probabilities, _TINY, 1.0))
        logits = log_p[:, 1:] - log_p[:, :1] if head.type is HeadType.BINARY else log_p
    return {**head.predictions(logits), "logits": logits}


class BaggedModel(tf.Module):
    """Raw columns -> every bag's export -> their outputs together (`bagged_outputs`), a
    binary head deciding at `threshold`."""

    def __init__(self, models: Sequence[str], schema: Schema, threshold: float = 0.5):
        super().__init__(name="adanet_bags")
        self.bags = [tf.saved_model.load(path) for path in models]
        self._head = Head(schema.label, threshold=threshold)
        self._schema = schema
        signature = Preprocessor(schema).input_signature()
        self.serve = tf.function(self._serve, input_signature=[signature])

    def baseline(self) -> dict:
        return export.baseline_of(self._schema)

    def _serve(self, features):
        return bagged_outputs(self._head, [bag.serve(features) for bag in self.bags])
