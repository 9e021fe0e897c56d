"""The search: what each iteration trains, and which candidate ensemble it keeps.

Pure decisions over small values: the generator proposes builders from the iteration context,
the ensemble strategies make candidate specs from them, the objectives become scores and the
best score is chosen. A resume replays the generator to get each member's builder back. Tested
without building any model (tests/search/test_search.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trainer import ensemble as ens
from trainer.config import SearchConfig
from trainer.model import Builder, IterationContext, find_builder
from trainer.model.subnetwork import propose
from trainer.search.record import IterationRecord


@dataclasses.dataclass(frozen=True)
class Proposal:
    """What iteration `number` trains: new subnetworks from `builders`, and the candidate
    ensembles of `specs` (each with every ensembler)."""

    number: int
    builders: tuple[Builder, ...]
    specs: tuple[ens.CandidateSpec, ...]


@dataclasses.dataclass(frozen=True)
class Search:
    """The search of one job (its `SearchConfig`)."""

    config: SearchConfig

    def propose(self, number: int, previous: Sequence[Builder]) -> Proposal:
        """Iteration `number`'s proposal, grown from the previous ensemble's members.

        Args:
            number: the iteration.
            previous: the builders of the previous chosen ensemble's members, oldest first.

        Returns:
            The builders the generator proposes and the candidate specs built from them.

        Raises:
            ValueError: the generator proposed nothing, or two builders with one name.
        """
        builders = propose(self.config.generator, IterationContext(number, tuple(previous)))
        specs = ens.candidate_specs(
            self.config.strategies, [b.name for b in builders], has_previous=bool(previous)
        )
        return Proposal(number, tuple(builders), tuple(specs))

    def members(self, records: Sequence[IterationRecord]) -> tuple[Builder, ...]:
        """The builders of the last record's chosen members, by replaying the generator
        through every finished iteration (it is a pure function of the iteration context).

        Raises:
            InputError: the generator no longer proposes a recorded member (other flags).
        """
        chain: dict[str, Builder] = {}
        previous: tuple[Builder, ...] = ()
        for record in records:
            context = IterationContext(record.iteration, previous)
            members = []
            for member in record.architecture.members:
                if member.key not in chain:
                    chain[member.key] = find_builder(self.config.generator, context, member.builder)
                members.append(chain[member.key])
            previous = tuple(members)
        return previous

    def may_grow(self, records: Sequence[IterationRecord]) -> bool:
        """Whether another iteration runs after `records` (time budget aside): fewer than
        --max_iterations, and the search has not stopped growing (`is_over`)."""
        return len(records) < self.config.max_iterations and not self.is_over(records)

    def is_over(self, records: Sequence[IterationRecord]) -> bool:
        """Whether the last `patience` iterations all kept the previous ensemble (early
        stopping: the search has stopped growing). Never with patience 0."""
        patience = self.config.patience
        return 0 < patience <= len(records) and all(r.kept_previous for r in records[-patience:])

    def ensembler(self, name: str) -> ens.Ensembler:
        return next(e for e in self.config.ensemblers if e.name == name)

    def choose(
        self, scores: Sequence[ens.Score], standard_errors: Sequence[Sequence[float]] | None = None
    ) -> int:
        """The index of the best selectable score (see `ensemble.choose`); with
        `standard_errors` of the objectives' differences, by the one-standard-error rule.

        Raises:
            TrainingError: every candidate diverged.
        """
        return ens.choose(
            scores,
            force_grow=self.config.force_grow,
            standard_errors=standard_errors,
            margin=self.config.selection_margin,
        )
