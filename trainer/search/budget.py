"""A time budget for the whole job (`--time_budget_secs`): the search ends, with an exported
model, within it (the way AutoGluon's `time_limit` plans its fits).

The budget counts from the trainer's start. It keeps back `reserve` seconds for the export
and the exported model's evaluation. Iteration 0 always runs (there must be a model to
export; a fitted member's fit in it stops growing after half the time left); a later
iteration starts only when the time left can pay for an iteration as long as
half the last one, and any iteration stops training at the point where the rest of it
(selecting, freezing) and the reserve still fit. What was cut goes to report.json (`budget`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

from trainer.search.record import Seconds

MIN_RESERVE_SECS = 3.0  # export, the exported model's eval pass, exit: ~2 s for census
RESERVE_FRACTION = 0.05
# A later iteration starts when at least this share of one as long as the last one fits (its
# training is cut short to fit; the search keeps the previous ensemble if that is better).
MIN_SHARE_TO_START = 0.5
# A fitted member's fit may take this share of the time left (`TimeBudget.fit_deadline`).
FIT_SHARE = 0.5
SELECTION_GUESS_SECS = 2.0  # selecting and freezing, before an iteration has measured it


class Timed(Protocol):
    """What the budget reads of a finished iteration's record (`IterationRecord`)."""

    @property
    def seconds(self) -> Seconds: ...


@dataclasses.dataclass
class TimeBudget:
    """The budget of a job that began at `started` (time.monotonic())."""

    seconds: float
    started: float
    skipped: list[int] = dataclasses.field(default_factory=list)
    cut: dict[int, dict] = dataclasses.field(default_factory=dict)

    EXIT_SECS = 1.0  # the report, the plots and the process's exit, after the last measured work

    @property
    def reserve(self) -> float:
        return max(MIN_RESERVE_SECS, RESERVE_FRACTION * self.seconds)

    @property
    def end(self) -> float:
        return self.started + self.seconds

    def left(self, now: float | None = None) -> float:
        return self.end - (time.monotonic() if now is None else now)

    def may_start(self, t: int, records: Sequence[Timed]) -> bool:
        """Whether iteration `t` fits: iteration 0 always, a later one when MIN_SHARE_TO_START
        of an iteration as long as the last finished one fits before the reserve."""
        if t == 0 or not records:
            return True
        return self.left() - self.reserve >= MIN_SHARE_TO_START * records[-1].seconds.total

    def fit_deadline(self) -> float:
        """When (time.monotonic()) a fitted member (boosted trees) stops growing: after
        FIT_SHARE of the time left before the reserve, so that the networks of its iteration
        still train."""
        now = time.monotonic()
        return now + FIT_SHARE * max(0.0, self.left(now) - self.reserve)

    def training_over(self, records: Sequence[Timed]) -> bool:
        """Whether the running iteration must stop training now, so that selecting and
        freezing it (as long as the last iteration's) and the reserve still fit."""
        selection = records[-1].seconds.selection_and_freeze if records else SELECTION_GUESS_SECS
        return self.left() <= self.reserve + selection

    def skip(self, iterations: range) -> None:
        self.skipped = list(iterations)

    def cut_steps(self, t: int, trained: int, planned: int) -> None:
        self.cut[t] = {"steps": trained, "planned_steps": planned}

    def to_json(self) -> dict:
        """For report.json: the budget, its reserve, what it cut and the time left then."""
        return {
            "seconds": self.seconds,
            "reserve_seconds": self.reserve,
            "skipped_iterations": self.skipped,
            "cut_iterations": {str(t): c for t, c in self.cut.items()},
            "seconds_left": self.left(),
        }
