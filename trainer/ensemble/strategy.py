"""Ensemble strategies: which candidate ensembles to form from the new subnetworks.

Pure functions of names: a strategy never sees a tensor.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class CandidateSpec:
    """One candidate ensemble's membership: keep the previous members or not, plus new
    subnetworks (by builder name)."""

    name: str
    keep_previous: bool
    new_subnetworks: tuple[str, ...]

    def __post_init__(self):
        if not self.new_subnetworks:
            raise ValueError(f"candidate '{self.name}' has no new subnetwork.")


class Strategy(abc.ABC):
    """Turns an iteration's new subnetworks into candidate ensemble memberships."""

    name: str

    @abc.abstractmethod
    def candidates(self, new_subnetworks: Sequence[str]) -> list[CandidateSpec]:
        """Candidate memberships for the new subnetworks' names."""


class GrowStrategy(Strategy):
    """Previous ensemble + one new subnetwork: one candidate per new subnetwork."""

    name = "grow"

    def candidates(self, new_subnetworks: Sequence[str]) -> list[CandidateSpec]:
        return [CandidateSpec(f"grow_{s}", True, (s,)) for s in new_subnetworks]


class AllStrategy(Strategy):
    """Previous ensemble + all new subnetworks: one candidate."""

    name = "all"

    def candidates(self, new_subnetworks: Sequence[str]) -> list[CandidateSpec]:
        return [CandidateSpec("all", True, tuple(new_subnetworks))]


class SoloStrategy(Strategy):
    """Each new subnetwork alone: one candidate per new subnetwork."""

    name = "solo"

    def candidates(self, new_subnetworks: Sequence[str]) -> list[CandidateSpec]:
        return [CandidateSpec(f"solo_{s}", False, (s,)) for s in new_subnetworks]


STRATEGIES = {s.name: s for s in (GrowStrategy(), AllStrategy(), SoloStrategy())}


def candidate_specs(
    strategies: Sequence[Strategy], new_subnetworks: Sequence[str], *, has_previous: bool
) -> list[CandidateSpec]:
    """All strategies' candidates, without duplicates of the same membership.

    Without a previous ensemble (iteration 0), Grow, All and Solo can yield the same
    membership; each membership is trained once, under the first name that proposed it.
    """
    seen, out = set(), []
    for strategy in strategies:
        for spec in strategy.candidates(new_subnetworks):
            key = (spec.keep_previous and has_previous, frozenset(spec.new_subnetworks))
            if key not in seen:
                seen.add(key)
                out.append(spec)
    return out
