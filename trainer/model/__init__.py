"""Subnetworks: the `Builder`/`Generator` interface, the search spaces and their registry
(`--generator`)."""

from trainer.model.cross import CrossBuilder, CrossGenerator
from trainer.model.dnn import DNNBuilder, DNNGenerator
from trainer.model.kheads import KHeadBuilder, KHeadGenerator
from trainer.model.linear import LinearBuilder, LinearGenerator
from trainer.model.registry import GENERATORS, GeneratorFactory, make_generator, name_of
from trainer.model.subnetwork import (
    Builder,
    FitRows,
    Generator,
    GeneratorOptions,
    Inputs,
    IterationContext,
    Subnetwork,
    UnionGenerator,
    find_builder,
    parts,
)
from trainer.model.trees import TreesBuilder, TreesGenerator

__all__ = [
    "Builder",
    "FitRows",
    "Generator",
    "GeneratorFactory",
    "GeneratorOptions",
    "Inputs",
    "IterationContext",
    "Subnetwork",
    "UnionGenerator",
    "find_builder",
    "parts",
    "GENERATORS",
    "make_generator",
    "name_of",
    "CrossBuilder",
    "CrossGenerator",
    "DNNBuilder",
    "DNNGenerator",
    "KHeadBuilder",
    "KHeadGenerator",
    "LinearBuilder",
    "LinearGenerator",
    "TreesBuilder",
    "TreesGenerator",
]
