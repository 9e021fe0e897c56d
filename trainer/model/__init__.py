"""Subnetworks: the `Builder`/`Generator` interface and the search spaces."""

from trainer.model.cross import CrossBuilder, CrossGenerator
from trainer.model.dnn import DNNBuilder, DNNGenerator
from trainer.model.linear import LinearBuilder, LinearGenerator
from trainer.model.subnetwork import (
    Builder,
    Generator,
    Inputs,
    IterationContext,
    Subnetwork,
    UnionGenerator,
    find_builder,
    parts,
)

# The --generator name of each built-in search space.
GENERATOR_NAMES = {DNNGenerator: "dnn", CrossGenerator: "cross", LinearGenerator: "linear"}

__all__ = [
    "Builder",
    "Generator",
    "Inputs",
    "IterationContext",
    "Subnetwork",
    "UnionGenerator",
    "find_builder",
    "parts",
    "GENERATOR_NAMES",
    "CrossBuilder",
    "CrossGenerator",
    "DNNBuilder",
    "DNNGenerator",
    "LinearBuilder",
    "LinearGenerator",
]
