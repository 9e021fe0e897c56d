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
)

__all__ = [
    "Builder",
    "Generator",
    "Inputs",
    "IterationContext",
    "Subnetwork",
    "UnionGenerator",
    "find_builder",
    "CrossBuilder",
    "CrossGenerator",
    "DNNBuilder",
    "DNNGenerator",
    "LinearBuilder",
    "LinearGenerator",
]
