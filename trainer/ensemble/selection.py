"""Choosing the best candidate ensemble of an iteration by its AdaNet objective."""

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


@dataclasses.dataclass(frozen=True)
class Score:
    """A candidate's objective; `diverged` once any of its losses went non-finite."""

    name: str
    objective: float
    is_previous: bool = False
    diverged: bool = False

    @property
    def is_selectable(self) -> bool:
        return not self.diverged and math.isfinite(self.objective)


def choose(scores: Sequence[Score], *, force_grow: bool) -> int:
    """Index of the candidate with the lowest objective.

    Never a diverged candidate (NaN or infinite objective or losses). With `force_grow`, the
    previous ensemble is not eligible, unless every new candidate diverged: then keeping the
    previous ensemble is the only safe choice. Raises TrainingError when nothing is selectable.
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
    return min(eligible, key=lambda i: (scores[i].objective, i))
