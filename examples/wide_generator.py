"""Your own search space, from the command line: one hidden layer that grows in width.

Run from the repository's root (`python -m` puts the current directory on the import path),
alone or beside the built-in search spaces:

    python -m trainer.task --generator=examples.wide_generator:WideGenerator
    python -m trainer.task --generator=dnn,examples.wide_generator:WideGenerator
    python -m trainer.task --generator=examples.wide_generator:wide_and_deep

`--generator=package.module:NAME` names a `Generator` class (the trainer calls its
`from_options` with the flags' `trainer.model.GeneratorOptions`) or a function of those options
that returns a generator. A generator is a frozen dataclass: the job dir records its repr, and
a resumed job with another generator is refused. On Vertex AI, the module must be installed
with the trainer (in a package that setup.py lists).
"""

from __future__ import annotations

import dataclasses
import math

import keras

from trainer.model import (
    Builder,
    DNNGenerator,
    Generator,
    GeneratorOptions,
    IterationContext,
    UnionGenerator,
)


@dataclasses.dataclass(frozen=True)
class WideBuilder(Builder):
    """One ReLU layer of `units`; complexity sqrt(units / 64), a DNN layer of 64 counting 1."""

    units: int

    @property
    def name(self) -> str:
        return f"wide_{self.units}"

    @property
    def complexity(self) -> float:
        return math.sqrt(self.units / 64)

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        return keras.layers.Dense(
            self.units, activation="relu", kernel_initializer=keras.initializers.HeUniform(seed)
        )


@dataclasses.dataclass(frozen=True)
class WideGenerator(Generator):
    """Proposes a layer as wide as the newest wide member of the previous ensemble and one
    twice as wide; at iteration 0, `units` (--layer_size) and twice it."""

    units: int = 64

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> WideGenerator:
        return cls(units=options.layer_size)

    def generate_candidates(self, context: IterationContext) -> list[Builder]:
        wide = [b for b in context.previous_ensemble if isinstance(b, WideBuilder)]
        units = wide[-1].units if wide else self.units
        return [WideBuilder(units), WideBuilder(2 * units)]


def wide_and_deep(options: GeneratorOptions) -> Generator:
    """A factory: the wide search space and the built-in DNN's, from the same flags."""
    return UnionGenerator((WideGenerator.from_options(options), DNNGenerator.from_options(options)))
