"""Placement: which worker trains what in an iteration, and which parameter servers hold it.

An iteration trains `k` new subnetworks and the candidate ensembles' mixture weights. Each of
these is a *job*; a `Unit` is the set of jobs one worker trains together in each step. A
placement strategy maps the workers of a cluster to units (`assign`) and each subnetwork to a
group of parameter servers (`ps_group`). Both are pure functions of small integers: they are
tested as truth tables, and the coordinated train loop (`trainer/distribute/loops.py`,
`CoordinatedLoop`) executes them.

Every job trains for the iteration's step budget, whatever the placement, so the search is
the same; what changes is the work per step and per worker, stated in each docstring.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Sequence
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Unit:
    """The jobs one worker trains together each step: the ensemble's mixture weights (all
    candidates) and/or some of the iteration's new subnetworks."""

    ensemble: bool
    subnetworks: tuple[int, ...]

    def __post_init__(self):
        if not self.ensemble and not self.subnetworks:
            raise ValueError("A unit trains the ensemble, some subnetworks, or both.")

    def describe(self, num_subnetworks: int) -> str:
        if self.ensemble and len(self.subnetworks) == num_subnetworks:
            return "everything"
        parts = ["ensemble"] if self.ensemble else []
        if self.subnetworks:
            noun = "subnetwork" if len(self.subnetworks) == 1 else "subnetworks"
            parts.append(f"{noun} {','.join(map(str, self.subnetworks))}")
        return " + ".join(parts)


def everything(num_subnetworks: int) -> Unit:
    return Unit(ensemble=True, subnetworks=tuple(range(num_subnetworks)))


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The unit of each worker task (`units[worker_index]`), and the distinct units."""

    units: tuple[Unit, ...]

    @property
    def distinct(self) -> tuple[Unit, ...]:
        return tuple(dict.fromkeys(self.units))

    def unit_index(self, worker: int) -> int:
        """The position of `worker`'s unit in `distinct`."""
        return self.distinct.index(self.units[worker])

    def workers_of(self, unit: Unit) -> tuple[int, ...]:
        return tuple(w for w, u in enumerate(self.units) if u == unit)


class PlacementStrategy(Protocol):
    name: str

    def assign(self, *, num_workers: int, num_subnetworks: int) -> Assignment:
        """The unit each worker task trains."""

    def ps_group(
        self, *, num_ps: int, num_subnetworks: int, subnetwork: int
    ) -> tuple[int, ...] | None:
        """The parameter servers that hold `subnetwork`'s variables (None: spread over all)."""


class ReplicationStrategy:
    """Every worker trains every job on its own batches; updates meet on the ps, unsynchronised.

    Cost per step on a worker: the forward and backward pass of all `k` subnetworks and all
    candidate ensembles, reading every variable of the iteration from the parameter servers
    and writing every gradient update back. Memory per worker grows with `k`; speed grows with
    the number of workers (each adds a full stream of steps towards the shared budget).
    """

    name = "replication"

    def assign(self, *, num_workers: int, num_subnetworks: int) -> Assignment:
        _check_counts(num_workers, num_subnetworks)
        return Assignment((everything(num_subnetworks),) * num_workers)

    def ps_group(
        self, *, num_ps: int, num_subnetworks: int, subnetwork: int
    ) -> tuple[int, ...] | None:
        return None


class RoundRobinStrategy:
    """AdaNet's round-robin placement: worker `i` does task `i mod (k + 1)`.

    Task 0 trains the ensembles' mixture weights (reading the subnetworks, training none of
    them); task `j` trains subnetwork `j - 1` alone. A trailing block of `r < k + 1` workers
    keeps its ensemble worker and splits the subnetworks modulo `r - 1` over the others; a
    single worker trains everything. Each subnetwork's variables live on their own group of
    parameter servers (subnetwork `s` on server `s mod n` when there are fewer servers than
    subnetworks), so subnetwork workers talk to disjoint servers.

    Cost per step: a subnetwork worker runs the forward and backward pass of its own
    subnetwork only and moves only its variables, O(1) in `k`; the ensemble worker runs every
    subnetwork forward (no backward) and updates only mixture weights. With `m >= k + 1`
    workers all jobs advance in parallel: O(m / k) speed-up per job over one worker, O(1)
    memory per subnetwork worker.
    """

    name = "round_robin"

    def assign(self, *, num_workers: int, num_subnetworks: int) -> Assignment:
        _check_counts(num_workers, num_subnetworks)
        k = num_subnetworks
        if num_workers == 1:
            return Assignment((everything(k),))
        block = k + 1
        units = []
        for worker in range(num_workers):
            start = worker - worker % block
            size = min(block, num_workers - start)  # r < k + 1 in a trailing partial block
            position = worker - start
            if position == 0:
                units.append(Unit(ensemble=True, subnetworks=()))
            elif size == block:
                units.append(Unit(ensemble=False, subnetworks=(position - 1,)))
            else:
                split = size - 1
                units.append(
                    Unit(
                        ensemble=False,
                        subnetworks=tuple(s for s in range(k) if s % split == position - 1),
                    )
                )
        return Assignment(tuple(units))

    def ps_group(
        self, *, num_ps: int, num_subnetworks: int, subnetwork: int
    ) -> tuple[int, ...] | None:
        if num_ps < 1:
            return None
        if num_subnetworks > num_ps:
            return (subnetwork % num_ps,)
        return tuple(p for p in range(num_ps) if p % num_subnetworks == subnetwork)


def ps_for_variable(group: Sequence[int], variable_name: str) -> int:
    """The server of `group` that holds a variable: a stable hash of its name (not Python's
    `hash`, which changes between processes)."""
    digest = hashlib.md5(variable_name.encode()).digest()
    return group[int.from_bytes(digest[:4], "little") % len(group)]


class Placement(enum.Enum):
    REPLICATION = "replication"
    ROUND_ROBIN = "round_robin"

    def strategy(self) -> PlacementStrategy:
        if self is Placement.ROUND_ROBIN:
            return RoundRobinStrategy()
        return ReplicationStrategy()


def _check_counts(num_workers: int, num_subnetworks: int) -> None:
    if num_workers < 1:
        raise ValueError(f"num_workers ({num_workers}) must be >= 1.")
    if num_subnetworks < 1:
        raise ValueError(f"num_subnetworks ({num_subnetworks}) must be >= 1.")
