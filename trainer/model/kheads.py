"""k heads sharing one body (TabM-mini, Gorishniy et al. 2024): each head sees the inputs
scaled by its own vector, one MLP serves every head, and k linear heads train together on
the mean of their losses. The member's output is the mean of the heads' predictions
(`Head.mean_of_heads`): an ensemble of k networks at about the cost of one.

Its inputs are every member's default ones: standardised numbers with their piecewise-linear
bins (a numeric embedding), one-hots, and the embedded columns' vectors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import keras
import numpy as np

from trainer.model.subnetwork import Builder, Generator, IterationContext


class KHeadBody(keras.layers.Layer):
    """[batch, d] -> [batch, k, units]: per head, the inputs times its scaling vector
    (initialised to random signs, as TabM-mini's), then the shared ReLU layers."""

    def __init__(self, *, heads: int, num_layers: int, units: int, dropout: float, seed: int):
        super().__init__(name="k_head_body")
        self.heads, self.seed = heads, seed
        self.hidden = []
        for i in range(num_layers):
            self.hidden.append(
                keras.layers.Dense(
                    units,
                    activation="relu",
                    kernel_initializer=keras.initializers.HeUniform(seed + i),
                )
            )
            if dropout:
                self.hidden.append(keras.layers.Dropout(dropout, seed=seed + i))

    def build(self, input_shape):
        width = int(input_shape[-1])
        signs = np.where(
            np.random.default_rng(self.seed).random((self.heads, width)) < 0.5, -1.0, 1.0
        )
        self.scaling = self.add_weight(
            shape=(self.heads, width),
            initializer=keras.initializers.Constant(signs.astype(np.float32)),
            name="scaling",
        )
        shape = (None, self.heads, width)
        for layer in self.hidden:
            layer.build(shape)
            shape = layer.compute_output_shape(shape)

    def call(self, x, training=False):
        h = x[:, None, :] * self.scaling  # [batch, k, d]
        for layer in self.hidden:
            h = layer(h, training=training)
        return h


@dataclasses.dataclass(frozen=True)
class KHeadBuilder(Builder):
    """A k-head MLP of `num_layers` x `layer_size`; complexity sqrt(depth), as a DNN's (the
    heads share the body: k of them bound what it can fit no more than one)."""

    num_layers: int
    layer_size: int = 128
    heads_count: int = 8
    dropout: float = 0.1

    def __post_init__(self):
        if self.num_layers < 1 or self.layer_size < 1 or self.heads_count < 2:
            raise ValueError(
                f"KHeadBuilder(num_layers={self.num_layers}, layer_size={self.layer_size}, "
                f"heads_count={self.heads_count}): depth >= 1, layer_size >= 1, heads >= 2."
            )

    @property
    def name(self) -> str:
        return f"kheads_{self.num_layers}x{self.layer_size}k{self.heads_count}"

    @property
    def complexity(self) -> float:
        return math.sqrt(self.num_layers)

    @property
    def heads(self) -> int:
        return self.heads_count

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        return KHeadBody(
            heads=self.heads_count,
            num_layers=self.num_layers,
            units=self.layer_size,
            dropout=self.dropout,
            seed=seed,
        )


@dataclasses.dataclass(frozen=True)
class KHeadGenerator(Generator):
    """Proposes a k-head network as deep as the newest k-head member of the previous
    ensemble and one a layer deeper (at iteration 0: depths 1 and 2)."""

    layer_size: int = 128
    heads_count: int = 8
    dropout: float = 0.1

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        members = [b for b in context.previous_ensemble if isinstance(b, KHeadBuilder)]
        depth = members[-1].num_layers if members else 1
        return [
            KHeadBuilder(d, self.layer_size, self.heads_count, self.dropout)
            for d in (depth, depth + 1)
        ]
