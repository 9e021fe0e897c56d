"""The AdaNet objective.

F(w) = loss(ensemble) + sum_j (lambda * r(h_j) + beta) * |w_j|_1

The complexity penalty is counted once: the same F trains the mixture weights and selects the
best candidate (AdaNet 0.9 added it twice to the mixture-weight loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def complexity_penalty(
    weights: Sequence[tf.Tensor],
    complexities: Sequence[float],
    *,
    adanet_lambda: float,
    adanet_beta: float,
) -> tf.Tensor:
    """sum_j (lambda * r_j + beta) * |w_j|_1 over the members' mixture weights."""
    penalty = tf.constant(0.0)
    if adanet_lambda == 0.0 and adanet_beta == 0.0:
        return penalty
    for w, r in zip(weights, complexities):
        penalty += (adanet_lambda * r + adanet_beta) * tf.reduce_sum(tf.abs(w))
    return penalty


def training_objective(
    losses: tf.Tensor, penalty: tf.Tensor, *, global_batch_size: int, replicas: int
) -> tf.Tensor:
    """One replica's share of F on its part of a batch: its per-example losses summed over the
    global batch size, plus its share of the penalty (the replicas' shares add up to F)."""
    return (
        tf.nn.compute_average_loss(losses, global_batch_size=global_batch_size) + penalty / replicas
    )


def selection_objective(mean_loss: float, penalty: float) -> float:
    """F over a whole data set: the mean loss plus the complexity penalty."""
    return mean_loss + penalty
