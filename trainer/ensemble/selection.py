"""Choosing the best candidate ensemble of an iteration by its AdaNet objective.

With per-example losses (selection on held-out or training rows), an objective is an
estimate from a sample of rows, and on a small table two candidates' objectives differ by
noise. There the one-standard-error rule (Breiman et al., "Classification and Regression
Trees", 1984) applies: the simplest candidate whose objective is within `margin` standard
errors of the lowest one's is chosen; the previous ensemble, which adds nothing, is the
simplest, then candidates by the complexity of their new subnetworks, and at equal complexity
by their trainable parameters (a linear model of the plain columns before one of their
piecewise-linear bins). Complexities compare within one scale only (`Score.scale`: networks'
depths, boosted trees' leaves): a candidate of another scale than the lowest objective's is
not "simpler" (the previous ensemble always is).

Differences under `TIE` are ties whatever their standard error: once every candidate's
held-out loss is near zero (a table the first member already separates), the errors of the
differences shrink with them, and without a floor each later iteration "wins" by 1e-6 and
grows the ensemble for nothing but time (penguins, 275 rows: bags of 5 iterations now stop
at 2 or 3).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from trainer.errors import TrainingError


class Selection(str, enum.Enum):
    """Where the objective that picks the winner comes from."""

    MOVING_AVERAGE = "moving_average"  # EMA (decay 0.9) of the training objective
    TRAIN = "train"  # an evaluator pass over the training data (AdaNet proper)
    HOLDOUT = "holdout"  # an evaluator pass over the eval data (AdaNet.HoldOut)


MOVING_AVERAGE_DECAY = 0.9
# Objective differences (mean loss per row: nats, or squared standardized units) below this
# are ties under the one-standard-error rule.
TIE = 1e-4


@dataclasses.dataclass(frozen=True)
class Score:
    """A candidate's objective; `diverged` once any of its losses went non-finite."""

    name: str
    objective: float
    is_previous: bool = False
    diverged: bool = False
    complexity: float = 0.0  # of the new subnetworks the candidate adds
    parameters: int = 0  # trainable numbers of the new subnetworks the candidate adds
    scale: str = ""  # the complexity scale of the new subnetworks (`Builder.complexity_scale`)

    @property
    def simplicity_order(self) -> tuple[bool, float, int]:
        return (not self.is_previous, self.complexity, self.parameters)

    @property
    def is_selectable(self) -> bool:
        return not self.diverged and math.isfinite(self.objective)


def choose(
    scores: Sequence[Score],
    *,
    force_grow: bool,
    standard_errors: Sequence[Sequence[float]] | None = None,
    margin: float = 0.0,
) -> int:
    """Index of the candidate with the lowest objective, or (with `standard_errors` and a
    positive `margin`) of the simplest one of its complexity scale (or the previous ensemble)
    within `margin` standard errors of it (or within `TIE`).

    `standard_errors[i][j]` is the standard error of candidate i's objective minus j's (NaN
    where unknown: then only the lowest objective counts). Never a diverged candidate (NaN or
    infinite objective or losses). With `force_grow`, the previous ensemble is not eligible,
    unless every new candidate diverged: then keeping the previous ensemble is the only safe
    choice. Raises TrainingError when nothing is selectable.
    """
    eligible = [i for i, s in enumerate(scores) if s.is_selectable]
    if force_grow and any(not scores[i].is_previous for i in eligible):
        eligible = [i for i in eligible if not scores[i].is_previous]
    if not eligible:
        raise TrainingError(
            "every candidate ensemble diverged (non-finite loss): "
            f"{[s.name for s in scores]}. Lower --learning_rate or check the data for "
            "extreme values; finished iterations are kept in the job dir."
        )
    best = min(eligible, key=lambda i: (scores[i].objective, i))
    if standard_errors is None or margin <= 0:
        return best

    def close_enough(i: int) -> bool:
        error = standard_errors[i][best]
        return math.isfinite(error) and scores[i].objective <= (
            scores[best].objective + max(margin * error, TIE)
        )

    def comparable(i: int) -> bool:
        return scores[i].is_previous or scores[i].scale == scores[best].scale

    within = [i for i in eligible if i == best or (close_enough(i) and comparable(i))]
    return min(within, key=lambda i: (scores[i].simplicity_order, scores[i].objective, i))
