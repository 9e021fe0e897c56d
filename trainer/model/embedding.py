"""Embeddings of large categorical columns, and the sparse update that trains them.

A categorical column with a large vocabulary reaches a subnetwork as an id; the subnetwork
owns one table [vocabulary + 1, dim] per such column and looks up a row per example. A step
touches only the rows of its batch: `LazyAdam` updates those rows (and their Adam moments)
and nothing else, so a step costs the same for a 100-value column as for a 100,000-value one.
Keras's Adam would update every row and both moment tables of every row at every step.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from trainer.input.schema import Embedded


def make_tables(embedded: Sequence[Embedded], *, seed: int) -> list[tf.Variable]:
    """One table per embedded column, uniform in [-0.05, 0.05] (Keras's default for
    embeddings), created in the current scope (strategy, device)."""
    return [
        tf.Variable(
            tf.random.stateless_uniform([e.size, e.dim], seed=[seed, i], minval=-0.05, maxval=0.05),
            name=f"embedding_{i}",
        )
        for i, e in enumerate(embedded)
    ]


def lookup(tables: Sequence[tf.Variable], ids: tf.Tensor) -> list[tf.Tensor]:
    """Each table's row for its column of `ids` [batch, len(tables)]: [batch, dim] each."""
    return [tf.gather(table, ids[:, j]) for j, table in enumerate(tables)]


class LazyAdam:
    """Adam over rows: a step updates the moments and values of the rows its gradient touches
    (duplicates summed) and leaves the others as they are, with Adam's bias correction by the
    number of steps taken. Works in a replica context of any strategy: gradients are summed
    over replicas first, and each (mirrored or parameter-server) table is updated where it
    lives.

    Create it in the same strategy and device scope as the tables: its moments live beside
    them.
    """

    def __init__(
        self,
        tables: Sequence[tf.Variable],
        *,
        learning_rate: float,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
    ):
        self.learning_rate, self.beta_1, self.beta_2 = learning_rate, beta_1, beta_2
        self.epsilon = epsilon
        self.m = [tf.Variable(tf.zeros(t.shape), trainable=False, name="m") for t in tables]
        self.v = [tf.Variable(tf.zeros(t.shape), trainable=False, name="v") for t in tables]
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")

    def variables(self) -> dict[str, tf.Variable]:
        return {
            "steps": self.steps,
            **{f"m{i}": m for i, m in enumerate(self.m)},
            **{f"v{i}": v for i, v in enumerate(self.v)},
        }

    def apply(
        self,
        grads: Sequence[tf.IndexedSlices],
        tables: Sequence[tf.Variable],
        *,
        scale: tf.Tensor | float = 1.0,
    ) -> None:
        """Applies one step's gradients at `scale` times the learning rate (in a replica
        context)."""
        strategy = tf.distribute.get_strategy()
        if strategy.num_replicas_in_sync > 1:
            grads = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, list(grads)
            )

        def update(strategy, grads):
            strategy.extended.update(self.steps, lambda s: s.assign_add(1), group=False)
            for grad, table, m, v in zip(grads, tables, self.m, self.v):
                strategy.extended.update(
                    table, self._update_rows, args=(grad, m, v, scale), group=False
                )

        tf.__internal__.distribute.interim.maybe_merge_call(update, strategy, list(grads))

    def _update_rows(self, table, grad: tf.IndexedSlices, m, v, scale):
        rows, position = tf.unique(grad.indices)
        g = tf.math.unsorted_segment_sum(grad.values, position, tf.size(rows))
        step = tf.cast(self.steps, tf.float32)  # already counts this step
        rate = (
            scale
            * self.learning_rate
            * tf.sqrt(1.0 - self.beta_2**step)
            / (1.0 - self.beta_1**step)
        )
        m_rows = self.beta_1 * tf.gather(m, rows) + (1.0 - self.beta_1) * g
        v_rows = self.beta_2 * tf.gather(v, rows) + (1.0 - self.beta_2) * tf.square(g)
        m.scatter_update(tf.IndexedSlices(m_rows, rows))
        v.scatter_update(tf.IndexedSlices(v_rows, rows))
        return table.scatter_sub(
            tf.IndexedSlices(rate * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows)
        )
