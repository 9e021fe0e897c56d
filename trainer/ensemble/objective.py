"""The AdaNet objective.

F(w) = loss(ensemble) + sum_j (lambda * r(h_j) + beta) * |w_j|_1

The complexity penalty is counted once: the same F trains the mixture weights and selects the
best candidate (AdaNet 0.9 added it twice to the mixture-weight loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from trainer.ensemble.selection import MOVING_AVERAGE_DECAY


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


def moving_average_step(
    ema: tf.Tensor, diverged: tf.Tensor, values: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Folds one step's `values` into the moving averages `ema` and marks the entries that went
    non-finite in `diverged` (tensors of the same length)."""
    decay = MOVING_AVERAGE_DECAY
    return decay * ema + (1.0 - decay) * values, diverged | ~tf.math.is_finite(values)


def moving_average_update(active: Sequence[int], size: int) -> Callable:
    """`update(ema, diverged, values)`: in graph, `moving_average_step` on the `active` entries
    of the variables `ema` and `diverged` (vectors of `size`), with this step's `values` (one
    per active entry). Whole-vector ops while all are active (the usual case), gather/scatter
    otherwise; nothing when none is."""
    if not active:
        return lambda ema, diverged, values: None
    if len(active) == size:

        def update(ema, diverged, values):
            new_ema, new_diverged = moving_average_step(ema, diverged, values)
            ema.assign(new_ema)
            diverged.assign(new_diverged)

        return update
    index = tf.constant(list(active), tf.int32)[:, None]

    def update_active(ema, diverged, values):
        new_ema, new_diverged = moving_average_step(
            tf.gather_nd(ema, index), tf.gather_nd(diverged, index), values
        )
        ema.scatter_nd_update(index, new_ema)
        diverged.scatter_nd_update(index, new_diverged)

    return update_active


def debiased(ema: np.ndarray, steps) -> np.ndarray:
    """An exponential moving average started at zero, divided by its bias after `steps`."""
    steps = np.maximum(np.asarray(steps, np.float64), 1.0)
    return ema / (1.0 - MOVING_AVERAGE_DECAY**steps)
