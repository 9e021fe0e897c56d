"""A search space for tabular data: cross networks (DCN-v2 style) that grow in crossing depth.

Tabular labels often hinge on products of features (marital status x capital gain), which
ReLU stacks approximate slowly. A cross layer computes x_{l+1} = x_0 * (V U x_l + b) + x_l,
so l layers express feature crosses of degree l + 1 explicitly; a small ReLU layer on top
gives the last layer that mixture weights see.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import keras

from trainer.model.subnetwork import Builder, Generator, GeneratorOptions, IterationContext


class CrossLayer(keras.layers.Layer):
    """One low-rank cross layer: x0 * (V(U(x))) + x, with U: d -> rank, V: rank -> d."""

    def __init__(self, *, rank: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.rank = rank
        self.seed = seed

    def build(self, input_shape):
        dim = input_shape[0][-1]
        self.down = keras.layers.Dense(
            self.rank,
            use_bias=False,
            kernel_initializer=keras.initializers.GlorotUniform(self.seed),
        )
        self.up = keras.layers.Dense(
            dim, kernel_initializer=keras.initializers.GlorotUniform(self.seed + 1)
        )
        self.down.build(input_shape[1])
        self.up.build((None, self.rank))

    def call(self, inputs):
        x0, x = inputs
        return x0 * self.up(self.down(x)) + x


class CrossBody(keras.layers.Layer):
    """`num_cross` cross layers, then a ReLU layer of `layer_size`."""

    def __init__(self, *, num_cross: int, layer_size: int, rank: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.crosses = [CrossLayer(rank=rank, seed=seed + 2 * i) for i in range(num_cross)]
        self.deep = keras.layers.Dense(
            layer_size,
            activation="relu",
            kernel_initializer=keras.initializers.HeUniform(seed + 2 * num_cross),
        )

    def call(self, features):
        x = features
        for cross in self.crosses:
            x = cross((features, x))
        return self.deep(x)


@dataclasses.dataclass(frozen=True)
class CrossBuilder(Builder):
    """A cross network of `num_cross` low-rank cross layers plus one ReLU layer.

    Complexity sqrt(num_cross + 1), counting the ReLU layer like a DNN layer.
    """

    num_cross: int
    layer_size: int = 64
    rank: int = 16

    def __post_init__(self):
        if self.num_cross < 1 or self.layer_size < 1 or self.rank < 1:
            raise ValueError(
                f"CrossBuilder(num_cross={self.num_cross}, layer_size="
                f"{self.layer_size}, rank={self.rank}): all must be >= 1."
            )

    @property
    def name(self) -> str:
        return f"cross_{self.num_cross}x{self.layer_size}"

    @property
    def complexity(self) -> float:
        return math.sqrt(self.num_cross + 1)

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        return CrossBody(
            num_cross=self.num_cross, layer_size=self.layer_size, rank=self.rank, seed=seed
        )


@dataclasses.dataclass(frozen=True)
class CrossGenerator(Generator):
    """Proposes a cross network as deep (in cross layers) as the newest cross member of the
    previous ensemble, and one a cross layer deeper; at iteration 0, depths 1 and 2.

    Example::

        CrossGenerator(layer_size=64)  # iteration 0: cross_1x64, cross_2x64
    """

    layer_size: int = 64
    rank: int = 16

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> CrossGenerator:
        return cls(layer_size=options.layer_size)

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        crosses = [b for b in context.previous_ensemble if isinstance(b, CrossBuilder)]
        depth = crosses[-1].num_cross if crosses else 1
        return [
            CrossBuilder(depth, self.layer_size, self.rank),
            CrossBuilder(depth + 1, self.layer_size, self.rank),
        ]
