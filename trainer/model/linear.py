"""The linear search space: one linear model per iteration."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras

from trainer.model.subnetwork import Builder, Generator, IterationContext

# A linear model's loss is convex and its inputs are standardised: it takes a step 10 times
# as long as the networks' (on diabetes, 5 seeds, one iteration of 559 steps: 59.47 RMSE at
# 1x, 56.33 at 10x, against Ridge's 56.46; 3,000 steps at 1x: 56.46).
LINEAR_RATE_SCALE = 10.0


@dataclasses.dataclass(frozen=True)
class LinearBuilder(Builder):
    """A linear model of the plain encoding (each numeric column's standardised value and
    the one-hots, not the piecewise-linear bins), trained at `LINEAR_RATE_SCALE` times the
    learning rate. Complexity 0."""

    @property
    def name(self) -> str:
        return "linear"

    @property
    def complexity(self) -> float:
        return 0.0

    @property
    def plain_inputs(self) -> bool:
        return True

    @property
    def learning_rate_scale(self) -> float:
        return LINEAR_RATE_SCALE

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        return keras.layers.Identity()


@dataclasses.dataclass(frozen=True)
class LinearGenerator(Generator):
    """Proposes one linear model each iteration (boosting-like growth of linear members)."""

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        return [LinearBuilder()]
