"""The record of a finished iteration: the one thing the job dir holds about it.

`checkpoints/iteration-<t>.json` is a versioned `IterationRecord`: its candidates with their
objectives and eval metrics, the choice, each new subnetwork, who trained what (placement),
the chosen ensemble's architecture, and timing. A resume rebuilds the frozen ensemble from the
architecture, the evaluator finds an iteration's choice in it, and `report.json` lists the
records as they are. A record of another version, or a file that is not one, fails with a
message naming the file.

The types are frozen values built from plain numbers (no TensorFlow here).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.errors import InputError

if TYPE_CHECKING:
    from trainer.storage.job_dir import JobDir

RECORD_VERSION = 1
PREVIOUS_ENSEMBLER = "frozen"  # the `ensembler` of the previous iteration's ensemble

Metrics = Mapping[str, float | None]  # eval metrics; None where not finite (JSON has no NaN)


def finite(value: float | None) -> float | None:
    """JSON has no NaN: non-finite numbers are written as null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def finite_metrics(metrics: Mapping[str, float]) -> dict[str, float | None]:
    return {k: finite(v) for k, v in metrics.items()}


@dataclasses.dataclass(frozen=True)
class CandidateRecord:
    """A candidate ensemble: its members, AdaNet objective (None if not finite) and eval
    metrics. `ensembler` is "frozen" for the previous iteration's ensemble.
    `standard_error` is that of its objective minus the lowest objective (selection on
    held-out or training rows; None otherwise): the one-standard-error rule's yardstick."""

    name: str
    ensembler: str
    members: tuple[str, ...]
    objective: float | None
    diverged: bool
    eval: Metrics
    standard_error: float | None = None


@dataclasses.dataclass(frozen=True)
class SubnetworkRecord:
    """A new subnetwork: its builder, the steps it trained, its last training loss (a
    debiased moving average), eval metrics and size."""

    name: str
    builder: str
    complexity: float
    steps: int
    train_loss: float | None
    diverged: bool
    eval: Metrics
    parameters: int = 0  # trainable numbers (0 in records from before it was kept)


@dataclasses.dataclass(frozen=True)
class MemberRecord:
    """A member of the chosen ensemble: `key` names its frozen weights, `builder` is what the
    generator proposed in `iteration` (a resume asks the generator for it again)."""

    key: str
    iteration: int
    builder: str
    complexity: float


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The chosen ensemble: its ensembler, members (oldest first) and mixture weights."""

    ensembler: str
    members: tuple[MemberRecord, ...]
    mixture_weights: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class UnitRecord:
    """A unit of work of the iteration (`trainer/placement`): what it trains, the workers
    assigned to it, the steps each really ran, and (under parameter servers) the servers that
    hold each of its subnetworks' variables, and how many chunk changes its workers added
    by an outer step (`DelayedNesterov`; None: at their plain share)."""

    unit: str
    trains: tuple[str, ...]
    assigned_to: tuple[str, ...]
    steps_by_worker: Mapping[str, int]
    subnetwork_variables_on_ps: Mapping[str, tuple[int, ...]] | None = None
    outer_arrivals: int | None = None


@dataclasses.dataclass(frozen=True)
class Seconds:
    """How long the iteration took: all of it, training, building and compiling until the
    first step, selecting and freezing, and the pause before it (the previous iteration's
    end to this one's first step; None for the first iteration a process trains)."""

    total: float
    training: float
    first_step: float
    selection_and_freeze: float
    pause_before: float | None = None


@dataclasses.dataclass(frozen=True)
class IterationRecord:
    """A finished iteration (see the module doc)."""

    iteration: int
    steps: int
    steps_per_sec: float | None
    batch_size: int
    selection: str
    chosen: str
    eval_examples: int
    candidates: tuple[CandidateRecord, ...]
    subnetworks: tuple[SubnetworkRecord, ...]
    placement: tuple[UnitRecord, ...]
    architecture: Architecture
    seconds: Seconds
    # A line on the placement (round-robin predicted slower than replication), or None.
    placement_note: str | None = None

    def __post_init__(self):
        if self.chosen not in [c.name for c in self.candidates]:
            raise ValueError(
                f"iteration {self.iteration}: the chosen candidate "
                f"{self.chosen!r} is not one of its candidates."
            )

    @property
    def chosen_candidate(self) -> CandidateRecord:
        return next(c for c in self.candidates if c.name == self.chosen)

    @property
    def kept_previous(self) -> bool:
        """Whether the iteration chose the previous ensemble (it added nothing)."""
        return self.chosen_candidate.ensembler == PREVIOUS_ENSEMBLER

    @property
    def examples_per_sec(self) -> float | None:
        return self.steps_per_sec * self.batch_size if self.steps_per_sec else None

    def to_json(self) -> dict:
        """The record as JSON values (lists for tuples), as `from_json` reads it back."""
        data = _json_values(dataclasses.asdict(self))
        data["examples_per_sec"] = self.examples_per_sec
        return {"version": RECORD_VERSION, **data}

    @classmethod
    def from_json(cls, data: Any, *, path: str) -> IterationRecord:
        """The record in `data` (read from `path`); InputError for another version or a file
        that is not an iteration record."""
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise InputError(
                f"{path} is not an iteration record this trainer reads (record "
                f"version {version}, this one reads {RECORD_VERSION}): the job dir "
                "was written by another version. Train in a new --job_dir."
            )
        try:
            return cls(
                iteration=data["iteration"],
                steps=data["steps"],
                steps_per_sec=data["steps_per_sec"],
                batch_size=data["batch_size"],
                selection=data["selection"],
                chosen=data["chosen"],
                eval_examples=data["eval_examples"],
                candidates=tuple(
                    CandidateRecord(**{**c, "members": tuple(c["members"])})
                    for c in data["candidates"]
                ),
                subnetworks=tuple(SubnetworkRecord(**s) for s in data["subnetworks"]),
                placement=tuple(_unit(u) for u in data["placement"]),
                architecture=Architecture(
                    ensembler=data["architecture"]["ensembler"],
                    members=tuple(MemberRecord(**m) for m in data["architecture"]["members"]),
                    mixture_weights=data["architecture"]["mixture_weights"],
                ),
                seconds=Seconds(**data["seconds"]),
                placement_note=data.get("placement_note"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"{path} is not a complete iteration record ({type(e).__name__}: "
                f"{e}). Train in a new --job_dir."
            ) from None


def _json_values(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _json_values(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json_values(v) for v in value]
    return value


def _unit(data: dict) -> UnitRecord:
    on_ps = data.get("subnetwork_variables_on_ps")
    return UnitRecord(
        data["unit"],
        tuple(data["trains"]),
        tuple(data["assigned_to"]),
        dict(data["steps_by_worker"]),
        None if on_ps is None else {k: tuple(v) for k, v in on_ps.items()},
        data.get("outer_arrivals"),
    )


def finished(job: JobDir) -> list[IterationRecord]:
    """The records of the job's finished iterations 0..t-1, in order.

    Raises:
        InputError: a record file that this trainer does not read (another version).
    """
    return [IterationRecord.from_json(data, path=path) for path, data in job.record_documents()]
