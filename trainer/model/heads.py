"""Heads: how logits become a loss, predictions and metrics, for each kind of label."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.input.schema import HeadType, Label


class Head:
    """Loss (per example, in TF), serving outputs (in TF) and metrics (numpy) of one label.
    A binary head predicts the positive class where its probability is above `threshold`
    (`trainer/model/decision.py`; 0.5: the most probable class)."""

    def __init__(self, label: Label, *, threshold: float = 0.5):
        self.label = label
        self.type = label.head
        self.logits_dimension = label.logits_dimension
        self.threshold = threshold
        # the logit of `threshold`: a row's class is positive above it
        self.decision_logit = float(np.log(threshold / (1.0 - threshold)))

    def with_threshold(self, threshold: float) -> Head:
        """This head deciding at another threshold (binary heads)."""
        return Head(self.label, threshold=threshold)

    # -- training (TF) --------------------------------------------------------------------
    def loss(
        self, labels: tf.Tensor, logits: tf.Tensor, weights: tf.Tensor | None = None
    ) -> tf.Tensor:
        """Per-example loss, times each example's weight if given; regression is trained on
        standardised targets."""
        if self.type is HeadType.BINARY:
            loss = tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=logits[:, 0]
            )
        elif self.type is HeadType.MULTICLASS:
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        else:
            target = self.standardised(labels)
            loss = tf.square(logits[:, 0] - target)
        return loss if weights is None else loss * weights

    def standardised(self, labels):
        """Regression targets as the loss takes them (numpy or TF): (label - mean) / std."""
        return (labels - self.label.mean) / self.label.std

    def mean_of_heads(self, logits: tf.Tensor) -> tf.Tensor:
        """The logits [batch, logits] of the mean of k heads' predictions, from their logits
        [batch, k, logits]: the mean probability (classification) or value (regression)."""
        if self.type is HeadType.REGRESSION:
            return tf.reduce_mean(logits, axis=1)
        if self.type is HeadType.BINARY:  # logit of the mean probability (log k cancels)
            positive = tf.reduce_logsumexp(tf.math.log_sigmoid(logits), axis=1)
            return positive - tf.reduce_logsumexp(tf.math.log_sigmoid(-logits), axis=1)
        # log of the mean probability, less log k (softmax takes logits up to a constant)
        return tf.reduce_logsumexp(tf.nn.log_softmax(logits, axis=-1), axis=1)

    # -- serving (TF) ---------------------------------------------------------------------
    def predictions(self, logits: tf.Tensor) -> dict[str, tf.Tensor]:
        """Serving outputs: probabilities, class ids and class names, or the predicted value."""
        if self.type is HeadType.REGRESSION:
            return {"predictions": logits[:, 0] * self.label.std + self.label.mean}
        if self.type is HeadType.BINARY:
            p = tf.sigmoid(logits[:, 0])
            probabilities = tf.stack([1.0 - p, p], axis=-1)
            class_ids = tf.cast(logits[:, 0] > self.decision_logit, tf.int64)
        else:
            probabilities = tf.nn.softmax(logits, axis=-1)
            class_ids = tf.argmax(probabilities, axis=-1)
        return {
            "probabilities": probabilities,
            "class_ids": class_ids,
            "classes": tf.gather(tf.constant(self.label.classes), class_ids),
        }

    # -- evaluation (numpy) ---------------------------------------------------------------
    def probabilities_of(self, logits: np.ndarray) -> np.ndarray:
        """The numpy twin of `predictions`' probabilities (float64, [rows, classes]) of a
        classification head."""
        z = logits.astype(np.float64)
        if self.type is HeadType.BINARY:
            p = 1.0 / (1.0 + np.exp(-z[:, 0]))
            return np.stack([1.0 - p, p], axis=1)
        exp = np.exp(z - z.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)

    def losses(self, labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Per-example loss, the numpy twin of `loss` (same formulas, float64)."""
        regression = self.type is HeadType.REGRESSION
        return self.target_losses(self.standardised(labels) if regression else labels, logits)

    def target_losses(self, targets: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """`losses` of labels as the loss reads them: class ids, or regression targets
        already standardised (a fitted member's `FitRows.labels`)."""
        logits = logits.astype(np.float64)
        if self.type is HeadType.BINARY:
            z, y = logits[:, 0], targets.astype(np.float64)
            return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
        if self.type is HeadType.MULTICLASS:
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_z = np.log(np.exp(shifted).sum(axis=1))
            return log_z - shifted[np.arange(len(targets)), targets.astype(np.int64)]
        return np.square(logits[:, 0] - targets)

    def metrics(
        self, labels: np.ndarray, logits: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """Eval metrics of one model's logits on labelled data (in one piece)."""
        metrics = Metrics(self)
        metrics.update(labels, logits, weights)
        return metrics.result()

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The keys of `metrics` for finite logits."""
        return {
            HeadType.BINARY: ("loss", "accuracy", "auc", "auc_pr"),
            HeadType.MULTICLASS: ("loss", "accuracy"),
            HeadType.REGRESSION: ("loss", "mse", "mae"),
        }[self.type]

    @property
    def objective_metric(self) -> str:
        """The metric reported to hyperparameter tuning unless the user picks another."""
        return "mse" if self.type is HeadType.REGRESSION else "accuracy"


class Metrics:
    """Eval metrics accumulated over batches, in memory that does not grow with the data:
    mean loss, accuracy and AUC (binary), accuracy (multi-class), loss, mse and mae
    (regression). With example weights every metric is weighted: means are weighted means
    (sum of weight x value over the sum of the weights), and AUC counts each pair of a
    positive and a negative example with the product of their weights (as scikit-learn's
    `roc_auc_score(sample_weight=...)` does). `count` is the rows, `weight` their total
    weight (the rows without weights).

    AUC is the Mann-Whitney statistic over a histogram of `AUC_BINS` equal bins of the
    predicted probability: pairs in the same bin count one half, as tied scores do. It
    differs from the exact figure only through pairs of a positive and a negative example
    whose probabilities fall in one bin (width 1/65,536); `auc_error_bound` is half their
    share of all pairs.

    `constant()` gives the metrics of the best constant prediction for the same rows, from
    label statistics kept on the way (no second pass).
    """

    AUC_BINS = 1 << 16

    def __init__(self, head: Head):
        self.head = head
        self.count = 0
        self.weight = 0.0
        self.loss_sum = 0.0
        self.correct = 0.0
        self.squared_error = 0.0
        self.absolute_error = 0.0
        self.finite = True
        # Weights of the positive and negative examples per bin (counts without weights).
        self.positives = np.zeros(self.AUC_BINS, np.float64)
        self.negatives = np.zeros(self.AUC_BINS, np.float64)
        # The labels: each class's weight, or the weighted sums of (label - the training
        # mean) and of its square.
        self.class_weights = np.zeros(len(head.label.classes), np.float64)
        self.label_sums = np.zeros(2, np.float64)

    def update(
        self,
        labels: np.ndarray,
        logits: np.ndarray,
        weights: np.ndarray | None = None,
        losses: np.ndarray | None = None,
    ) -> None:
        """Adds a batch; `losses` are `head.losses(labels, logits)` if the caller has them."""
        if not self.finite or not len(labels):
            return
        if not np.isfinite(logits).all():
            self.finite = False
            return
        head = self.head
        w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
        self.count += len(labels)
        self.weight += float(w.sum())
        self.loss_sum += float(w @ (head.losses(labels, logits) if losses is None else losses))
        if head.type is HeadType.REGRESSION:
            error = logits[:, 0].astype(np.float64) * head.label.std + head.label.mean - labels
            self.squared_error += float(w @ np.square(error))
            self.absolute_error += float(w @ np.abs(error))
            centred = labels.astype(np.float64) - head.label.mean
            self.label_sums += (w @ centred, w @ np.square(centred))
            return
        self.class_weights += np.bincount(labels, weights=w, minlength=len(self.class_weights))
        if head.type is HeadType.BINARY:
            self.correct += float(w @ ((logits[:, 0] > head.decision_logit) == (labels == 1)))
            probability = head.probabilities_of(logits)[:, 1]
            bins = np.minimum((probability * self.AUC_BINS).astype(np.int64), self.AUC_BINS - 1)
            positive = labels == 1
            self.positives += np.bincount(
                bins[positive], weights=w[positive], minlength=self.AUC_BINS
            )
            self.negatives += np.bincount(
                bins[~positive], weights=w[~positive], minlength=self.AUC_BINS
            )
        else:
            self.correct += float(w @ (np.argmax(logits, axis=1) == labels))

    @property
    def mean_loss(self) -> float:
        """The (weighted) mean loss; NaN once a model's logits were not finite."""
        return self.loss_sum / (self.weight or 1.0) if self.finite else float("nan")

    def result(self) -> dict[str, float]:
        if not self.finite:
            return {"loss": float("nan")}
        n = self.weight or 1.0
        out = {"loss": self.loss_sum / n}
        if self.head.type is HeadType.REGRESSION:
            out.update(mse=self.squared_error / n, mae=self.absolute_error / n)
            return out
        out["accuracy"] = self.correct / n
        if self.head.type is HeadType.BINARY:
            out["auc"] = self._auc()
            out["auc_pr"] = self._auc_pr()
        return out

    def constant(self) -> dict[str, float] | None:
        """The metrics of the best constant prediction for these rows, what a model that
        learned nothing from the features scores: the rows' own class frequencies (loss
        their entropy, accuracy the largest one's share, AUC 0.5) or their own mean (mse
        their variance; loss in standardised units, as the model's). None without rows or
        once a model's logits were not finite."""
        if not self.weight or not self.finite:
            return None
        n = self.weight
        if self.head.type is HeadType.REGRESSION:
            mean, square = self.label_sums / n
            mse = max(float(square - mean * mean), 0.0)
            return {"loss": mse / self.head.label.std**2, "mse": mse}
        shares = self.class_weights / n
        present = shares[shares > 0]
        out = {"loss": float(-(present * np.log(present)).sum()), "accuracy": float(shares.max())}
        if self.head.type is HeadType.BINARY:
            # One score for every row: one threshold, precision the positives' share.
            out.update(auc=0.5, auc_pr=float(shares[1]))
        return out

    def _auc(self) -> float:
        positives, negatives = self.positives.sum(), self.negatives.sum()
        if not positives or not negatives:
            return float("nan")
        below = np.cumsum(self.negatives) - self.negatives  # negatives in lower bins
        pairs = (self.positives * below).sum() + 0.5 * (self.positives * self.negatives).sum()
        return float(pairs / (positives * negatives))

    def _auc_pr(self) -> float:
        """The area under the precision-recall curve as average precision (scikit-learn's
        `average_precision_score`: precision at each threshold weighted by the recall it
        adds), the thresholds being the bins' edges from the top: a bin's rows enter
        together, as tied scores do."""
        total = self.positives.sum()
        if not total:
            return float("nan")
        positives, negatives = self.positives[::-1], self.negatives[::-1]  # from the top bin
        true = np.cumsum(positives)
        predicted = true + np.cumsum(negatives)
        added = positives > 0
        return float((positives[added] * true[added] / predicted[added]).sum() / total)

    @property
    def auc_error_bound(self) -> float:
        """At most how far the binned AUC is from the exact one."""
        total = self.positives.sum() * self.negatives.sum()
        return float(0.5 * (self.positives * self.negatives).sum() / total) if total else 0.0
