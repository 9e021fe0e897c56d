"""Defaults that follow the data: the flags a user leaves at their defaults are chosen from
the number of training rows once the chief's scan has counted them.

The defaults of `trainer.task` (batch 256, 750 steps per iteration, selection by the moving
average of the training objective) were measured on census (`bench/defaults.py`, 29k-32k
training rows). On a table of a few hundred rows they make every iteration hundreds of
epochs and a batch larger than the table. So, for `rows` training rows:

- batch size: the largest power of two at most rows / `ROWS_PER_BATCH`, between
  `MIN_BATCH_SIZE` and the flag's default;
- steps per iteration: at most `EPOCHS_PER_ITERATION` passes over the rows, at most the
  flag's default;
- selection: on the held-out data below `SMALL_TABLE_ROWS` training rows (`holdout`; the
  training objective's moving average rewards the candidate that memorised most), where
  `--selection_margin`'s one-standard-error rule keeps the choice from chasing the noise of
  a small hold-out.

Every rule only applies to a flag the user did not set (`RunConfig.auto` names those), and
every decision goes into report.json (`adapted`). The figures behind each constant are in
bench/results/quality.json (README, "Quality").
"""

from __future__ import annotations

import dataclasses
import math

from trainer.config import RunConfig
from trainer.ensemble import Selection
from trainer.errors import InputError

ROWS_PER_BATCH = 8
MIN_BATCH_SIZE = 16
EPOCHS_PER_ITERATION = 30
SMALL_TABLE_ROWS = 10_000

# The flags these rules may choose; `trainer.task` puts the ones left at their defaults in
# `RunConfig.auto`.
ADAPTIVE_FLAGS = ("batch_size", "max_iteration_steps", "selection")


def batch_size(rows: int, default: int) -> int:
    """The largest power of two <= rows / ROWS_PER_BATCH, within [MIN_BATCH_SIZE, default]
    (and never more than the rows)."""
    power = 2 ** max(0, math.floor(math.log2(max(rows / ROWS_PER_BATCH, 1))))
    return max(1, min(default, rows, max(MIN_BATCH_SIZE, power)))


def iteration_steps(rows: int, batch: int, default: int) -> int:
    """At most EPOCHS_PER_ITERATION epochs of `rows` in batches of `batch`, at most `default`."""
    return max(1, min(default, math.ceil(EPOCHS_PER_ITERATION * rows / batch)))


def _flag_value(value):
    """A flag's value as the command line and JSON write it (an enum's value)."""
    return getattr(value, "value", value)


def resolve(config: RunConfig, rows: int) -> tuple[RunConfig, dict]:
    """`config` with its `auto` flags chosen for `rows` training rows, and what changed
    ({flag: {"value", "default", "why"}}, values as the command line writes them; empty when
    nothing did)."""
    changes: dict[str, dict] = {}

    def choose(flag: str, default, value, why: str):
        if flag not in config.auto or value == default:
            return default
        changes[flag] = {"value": _flag_value(value), "default": _flag_value(default), "why": why}
        return value

    batch = choose(
        "batch_size",
        config.train.batch_size,
        batch_size(rows, config.train.batch_size),
        f"{rows} training rows: about {ROWS_PER_BATCH} batches per epoch or more",
    )
    steps = choose(
        "max_iteration_steps",
        config.search.max_iteration_steps,
        iteration_steps(rows, batch, config.search.max_iteration_steps),
        f"at most {EPOCHS_PER_ITERATION} epochs of {rows} training rows per iteration",
    )
    selection = choose(
        "selection",
        config.search.selection,
        Selection.HOLDOUT if rows < SMALL_TABLE_ROWS else config.search.selection,
        f"fewer than {SMALL_TABLE_ROWS:,} training rows: choose on the held-out data",
    )
    if batch > rows:
        raise InputError(
            f"--batch_size={batch} is larger than the {rows} training rows: every epoch would "
            f"be empty. Use --batch_size={batch_size(rows, batch)} or leave it to the data."
        )
    if not changes:
        return config, {}
    adapted = dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, batch_size=batch),
        search=dataclasses.replace(config.search, max_iteration_steps=steps, selection=selection),
    )
    return adapted, changes
