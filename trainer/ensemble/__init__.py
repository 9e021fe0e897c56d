"""Ensembles: ensemblers, ensemble strategies, the AdaNet objective and selection."""

from trainer.ensemble.ensembler import (
    ENSEMBLERS,
    ComplexityRegularizedEnsembler,
    Ensembler,
    EnsemblerOptions,
    MeanEnsembler,
    Member,
    MixtureWeights,
    MixtureWeightType,
)
from trainer.ensemble.selection import MOVING_AVERAGE_DECAY, Score, Selection, choose
from trainer.ensemble.strategy import (
    STRATEGIES,
    AllStrategy,
    CandidateSpec,
    GrowStrategy,
    SoloStrategy,
    Strategy,
    candidate_specs,
)

__all__ = [
    "ENSEMBLERS",
    "ComplexityRegularizedEnsembler",
    "Ensembler",
    "EnsemblerOptions",
    "MeanEnsembler",
    "Member",
    "MixtureWeights",
    "MixtureWeightType",
    "MOVING_AVERAGE_DECAY",
    "Score",
    "Selection",
    "choose",
    "STRATEGIES",
    "AllStrategy",
    "CandidateSpec",
    "GrowStrategy",
    "SoloStrategy",
    "Strategy",
    "candidate_specs",
]
