"""The DNN search space that grows in depth: AdaNet's reference generator."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import keras

from trainer.model.subnetwork import Builder, Generator, GeneratorOptions, IterationContext


@dataclasses.dataclass(frozen=True)
class DNNBuilder(Builder):
    """A fully connected ReLU network of `num_layers` x `layer_size`; complexity sqrt(depth).

    Depth 0 is a linear model.
    """

    num_layers: int
    layer_size: int = 64
    dropout: float = 0.0

    def __post_init__(self):
        if self.num_layers < 0 or self.layer_size < 1 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(
                f"DNNBuilder(num_layers={self.num_layers}, layer_size="
                f"{self.layer_size}, dropout={self.dropout}): depth must be >= 0, "
                "layer_size >= 1 and dropout in [0, 1)."
            )

    @property
    def name(self) -> str:
        return f"dnn_{self.num_layers}x{self.layer_size}"

    @property
    def complexity(self) -> float:
        return math.sqrt(self.num_layers)

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        layers = []
        for i in range(self.num_layers):
            layers.append(
                keras.layers.Dense(
                    self.layer_size,
                    activation="relu",
                    kernel_initializer=keras.initializers.HeUniform(seed + i),
                )
            )
            if self.dropout:
                layers.append(keras.layers.Dropout(self.dropout, seed=seed + i))
        return keras.Sequential(layers) if layers else keras.layers.Identity()


@dataclasses.dataclass(frozen=True)
class DNNGenerator(Generator):
    """Proposes a DNN as deep as the newest member of the previous ensemble, and one a layer
    deeper (at iteration 0: depth `initial_num_layers` and one more).

    Example::

        DNNGenerator(layer_size=64)  # iteration 0: dnn_0x64 (linear), dnn_1x64
    """

    layer_size: int = 64
    initial_num_layers: int = 0
    dropout: float = 0.0

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> DNNGenerator:
        return cls(
            layer_size=options.layer_size,
            initial_num_layers=options.initial_num_layers,
            dropout=options.dropout,
        )

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        depth = self.initial_num_layers
        dnns = [b for b in context.previous_ensemble if isinstance(b, DNNBuilder)]
        if dnns:
            depth = dnns[-1].num_layers
        return [
            DNNBuilder(depth, self.layer_size, self.dropout),
            DNNBuilder(depth + 1, self.layer_size, self.dropout),
        ]
