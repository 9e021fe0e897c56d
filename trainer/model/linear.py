"""The linear search space: one linear model per iteration."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras

from trainer.model.subnetwork import Builder, Generator, IterationContext


@dataclasses.dataclass(frozen=True)
class LinearBuilder(Builder):
    """A linear model: the last layer is the encoded features themselves. Complexity 0."""

    @property
    def name(self) -> str:
        return "linear"

    @property
    def complexity(self) -> float:
        return 0.0

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        return keras.layers.Identity()


@dataclasses.dataclass(frozen=True)
class LinearGenerator(Generator):
    """Proposes one linear model each iteration (boosting-like growth of linear members)."""

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        return [LinearBuilder()]
