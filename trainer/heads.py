"""Heads: how logits become a loss, predictions and metrics, for each kind of label."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.schema import HeadType, Label


class Head:
    """Loss (per example, in TF), serving outputs (in TF) and metrics (numpy) of one label."""

    def __init__(self, label: Label):
        self.label = label
        self.type = label.head
        self.logits_dimension = label.logits_dimension

    # -- training (TF) --------------------------------------------------------------------
    def loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """Per-example loss; regression is trained on standardised targets."""
        if self.type is HeadType.BINARY:
            return tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=logits[:, 0])
        if self.type is HeadType.MULTICLASS:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        target = (labels - self.label.mean) / self.label.std
        return tf.square(logits[:, 0] - target)

    # -- serving (TF) ---------------------------------------------------------------------
    def predictions(self, logits: tf.Tensor) -> dict[str, tf.Tensor]:
        """Serving outputs: probabilities, class ids and class names, or the predicted value."""
        if self.type is HeadType.REGRESSION:
            return {"predictions": logits[:, 0] * self.label.std + self.label.mean}
        if self.type is HeadType.BINARY:
            p = tf.sigmoid(logits[:, 0])
            probabilities = tf.stack([1.0 - p, p], axis=-1)
        else:
            probabilities = tf.nn.softmax(logits, axis=-1)
        class_ids = tf.argmax(probabilities, axis=-1)
        return {
            "probabilities": probabilities,
            "class_ids": class_ids,
            "classes": tf.gather(tf.constant(self.label.classes), class_ids),
        }

    # -- evaluation (numpy) ---------------------------------------------------------------
    def losses(self, labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Per-example loss, the numpy twin of `loss` (same formulas, float64)."""
        logits = logits.astype(np.float64)
        if self.type is HeadType.BINARY:
            z, y = logits[:, 0], labels.astype(np.float64)
            return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
        if self.type is HeadType.MULTICLASS:
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_z = np.log(np.exp(shifted).sum(axis=1))
            return log_z - shifted[np.arange(len(labels)), labels]
        target = (labels - self.label.mean) / self.label.std
        return np.square(logits[:, 0] - target)

    def metrics(self, labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
        """Eval metrics of one model's logits on labelled data."""
        if not np.isfinite(logits).all():
            return {"loss": float("nan")}
        out = {"loss": float(self.losses(labels, logits).mean())}
        if self.type is HeadType.REGRESSION:
            error = logits[:, 0] * self.label.std + self.label.mean - labels
            out.update(mse=float(np.mean(error ** 2)), mae=float(np.mean(np.abs(error))))
            return out
        if self.type is HeadType.BINARY:
            out["accuracy"] = float(np.mean((logits[:, 0] > 0) == (labels == 1)))
            out["auc"] = roc_auc(labels, logits[:, 0])
        else:
            out["accuracy"] = float(np.mean(np.argmax(logits, axis=1) == labels))
        return out

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The keys of `metrics` for finite logits."""
        return {HeadType.BINARY: ("loss", "accuracy", "auc"),
                HeadType.MULTICLASS: ("loss", "accuracy"),
                HeadType.REGRESSION: ("loss", "mse", "mae")}[self.type]

    @property
    def objective_metric(self) -> str:
        """The metric reported to hyperparameter tuning unless the user picks another."""
        return "mse" if self.type is HeadType.REGRESSION else "accuracy"


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties averaged."""
    positives = labels == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    # Average the ranks of tied scores.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(average, counts)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
