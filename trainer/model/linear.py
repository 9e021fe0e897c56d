"""The linear search space: one linear model per iteration."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras

from trainer.model.subnetwork import Builder, Generator, IterationContext

# A linear model's loss is convex and its inputs are standardised: it takes a step 100 times
# as long as the networks'. On diabetes (`bench/quality.py --datasets=diabetes
# --trainer_flags='--generator=linear --max_iterations=1 --learning_rate=R'` at 2790b72, where
# the scale was 10, R = 0.003, 0.01, 0.03, 0.1; 5 seeds, 5 bags of 263 steps each) the bagged
# linear model's test RMSE at 10, 33, 100 and 333 times the default rate: 56.65, 56.51,
# 56.39, 56.35, against Ridge's 56.46 and the exact least-squares fit's 56.39 (both on all the
# training rows): at 10 times it stops short of its optimum within an iteration.
LINEAR_RATE_SCALE = 100.0


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
