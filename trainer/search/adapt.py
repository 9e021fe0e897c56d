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
- selection: on the held-out data below `SMALL_TABLE_ROWS` training rows, and on any table
  where a fitted member (boosted trees) is proposed (`holdout`; the training objective's
  moving average rewards the candidate that memorised most), where
  `--selection_margin`'s one-standard-error rule keeps the choice from chasing the noise of
  a small hold-out;
- patience: below `TINY_TABLE_ROWS` (a hold-out of under 100 rows), the search ends at the
  first iteration that keeps the previous ensemble (`TINY_TABLE_PATIENCE`): each later
  iteration is one more chance for some candidate to beat it by the hold-out's noise alone;
  below `SMALL_TABLE_ROWS`, at the second in a row (`SMALL_TABLE_PATIENCE`): on the real-table
  suite's seven tables of 1,000-10,000 rows, 17 of 21 runs chose the same models in fewer
  iterations, 2 scored 3-5 test rows better and 2 scored 1 and 4 worse (churn: 55 -> 37 s);
  at the first at any size when the search has k-head members (the default,
  `K_HEADS_PATIENCE`): on the same seven tables all 21 runs exported the same model as at the
  second, 15-30% sooner, and on the four tables of 30,000-50,000 rows 11 of 12 the same model
  as with no patience, in half the time (census 137 -> 72 s; cps_earnings seed 3 kept one
  member, not two: RMSE 0.4704 against 0.4703);
- generator: a regression table below `SMALL_TABLE_ROWS` also gets the linear model of the
  plain columns among its candidates (the classic strong model of noisy rows, and the
  simplest candidate at equal complexity);
- bags: below `TINY_TABLE_ROWS` on one machine, `TINY_TABLE_BAGS` searches, each on its own
  hold-out fold and seed, served together (`trainer/job/bagging.py`): one search of networks
  on a few hundred rows moves with its seed and its hold-out, and the mean of five moves far
  less and scores better. Fewer when the hold-outs (one --holdout_fraction each) or the time
  budget (`MIN_SECS_PER_BAG` each) cannot pay for five. None when the search has k-head
  members (the default), each already the mean of k networks: on the suite's tables under
  1,000 training rows one search scored as the five bags did (titanic, 3 seeds: 0.7786
  against 0.7761; penguins 0.9855 against 1.0000, one test row of 69) in a quarter of the time
  (11-15 s against 42-48 s).

Every rule only applies to a flag the user did not set (`RunConfig.auto` names those), and
every decision goes into report.json (`adapted`). The figures behind each constant are in
bench/results/quality.json (docs/benchmarks.md, "Quality"), and the alternatives measured in
bench/HISTORY.md, "Defaults that follow the data (small tables)".
"""

from __future__ import annotations

import dataclasses
import math

from trainer import model
from trainer.config import RunConfig
from trainer.ensemble import Selection
from trainer.errors import InputError
from trainer.input.schema import HeadType
from trainer.model import Generator

ROWS_PER_BATCH = 8
MIN_BATCH_SIZE = 16
EPOCHS_PER_ITERATION = 30
SMALL_TABLE_ROWS = 10_000
TINY_TABLE_ROWS = 1_000
TINY_TABLE_PATIENCE = 1
SMALL_TABLE_PATIENCE = 2
K_HEADS_PATIENCE = 1
TINY_TABLE_BAGS = 5
MIN_SECS_PER_BAG = 20.0  # a default search on a few hundred rows: 18-30 s on 2 cores

# The flags these rules may choose; `trainer.task` puts the ones left at their defaults in
# `RunConfig.auto`.
ADAPTIVE_FLAGS = ("batch_size", "max_iteration_steps", "selection", "patience", "generator", "bags")


def batch_size(rows: int, default: int) -> int:
    """The largest power of two <= rows / ROWS_PER_BATCH, within [MIN_BATCH_SIZE, default]
    (and never more than the rows)."""
    power = 2 ** max(0, math.floor(math.log2(max(rows / ROWS_PER_BATCH, 1))))
    return max(1, min(default, rows, max(MIN_BATCH_SIZE, power)))


def divisible_batch(batch: int, replicas: int) -> int:
    """`batch` rounded down to a multiple of `replicas` (at least one example each): the
    global batch that synchronous replicas split evenly."""
    return max(replicas, batch - batch % replicas)


def check_global_batch(config: RunConfig, replicas: int) -> None:
    """A --batch_size the user set must split evenly over `replicas` synchronous replicas
    (MultiWorkerMirroredStrategy: the chief and the workers); one left to the data is rounded
    by `resolve`.

    Raises:
        InputError: it does not, naming the sizes that do.
    """
    batch = config.train.batch_size
    if replicas <= 1 or "batch_size" in config.auto or batch % replicas == 0:
        return
    lower = divisible_batch(batch, replicas)
    raise InputError(
        f"--batch_size={batch} does not split over the {replicas} synchronous replicas (each "
        f"trains batch / {replicas} examples a step): use --batch_size={lower} or "
        f"{lower + replicas}, or leave it to the data."
    )


def iteration_steps(rows: int, batch: int, default: int) -> int:
    """At most EPOCHS_PER_ITERATION epochs of `rows` in batches of `batch`, at most `default`."""
    return max(1, min(default, math.ceil(EPOCHS_PER_ITERATION * rows / batch)))


def bags(config: RunConfig, rows: int, *, one_machine: bool) -> tuple[int, str]:
    """How many bags the data and the job can pay for, and why."""
    if rows >= TINY_TABLE_ROWS or not one_machine:
        return 1, "no bagging: a cluster, or 1,000 training rows or more"
    if has_k_heads(config.search.generator):
        return 1, "no bagging: a k-head member is already an ensemble of k networks"
    count, why = TINY_TABLE_BAGS, f"fewer than {TINY_TABLE_ROWS:,} training rows"
    folds = int(1 / config.data.holdout_fraction + 1e-9)  # --eval_data too: they select on them
    if folds < count:
        count, why = folds, f"{why}; {folds} disjoint hold-outs of --holdout_fraction"
    if config.time_budget_secs:
        affordable = max(1, int(config.time_budget_secs // MIN_SECS_PER_BAG))
        if affordable < count:
            count = affordable
            why = f"{why}; {MIN_SECS_PER_BAG:g} s each in the {config.time_budget_secs:g} s budget"
    return count, f"{why}: {count} searches on their own hold-outs and seeds, served as one model"


def has_fitted_members(generator: Generator) -> bool:
    """Whether the generator proposes a fitted member (boosted trees) at iteration 0."""
    return any(b.fitted for b in model.subnetwork.propose(generator, model.IterationContext(0)))


def _has_part(generator: Generator, kind: type) -> bool:
    return any(isinstance(g, kind) for g in model.parts(generator))


def has_k_heads(generator: Generator) -> bool:
    """Whether the search proposes k-head networks (`--generator=kheads`)."""
    return _has_part(generator, model.KHeadGenerator)


def with_linear(generator: Generator) -> Generator:
    """`generator` with the linear model among its candidates (as it is if it has it)."""
    if _has_part(generator, model.LinearGenerator):
        return generator
    return model.UnionGenerator((*model.parts(generator), model.LinearGenerator()))


def _patience(config: RunConfig, rows: int) -> tuple[int, str]:
    """--patience for `rows` training rows and the search's members, and why."""
    stop = "stop once the search stops growing"
    if rows < TINY_TABLE_ROWS:
        return TINY_TABLE_PATIENCE, f"fewer than {TINY_TABLE_ROWS:,} training rows: {stop}"
    if has_k_heads(config.search.generator):
        return K_HEADS_PATIENCE, f"k-head members: {stop}"
    if rows < SMALL_TABLE_ROWS:
        return SMALL_TABLE_PATIENCE, (
            f"fewer than {SMALL_TABLE_ROWS:,} training rows: {stop} for "
            f"{SMALL_TABLE_PATIENCE} iterations"
        )
    return config.search.patience, ""


def _flag_value(value):
    """A flag's value as the command line and JSON write it (an enum's value, a generator's
    names)."""
    if isinstance(value, Generator):
        return ",".join(model.name_of(g) for g in model.parts(value))
    return getattr(value, "value", value)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What of the cluster the choices depend on: one machine or a cluster, and how many
    synchronous replicas split each batch. The chief records it in run.json
    (`resolved_for`), and the evaluator resolves its flags for the chief's."""

    one_machine: bool = True
    replicas: int = 1


def resolve(
    config: RunConfig, rows: int, head: HeadType, *, shape: Shape = Shape()
) -> tuple[RunConfig, dict]:
    """`config` with its `auto` flags chosen for `rows` training rows of a `head` task on one
    machine or a cluster of `shape.replicas` synchronous replicas (each batch split over
    them), and what changed ({flag: {"value", "default", "why"}}, values as the command line
    writes them; empty when nothing did)."""
    one_machine, replicas = shape.one_machine, shape.replicas
    small = rows < SMALL_TABLE_ROWS
    changes: dict[str, dict] = {}

    def choose(flag: str, default, value, why: str):
        if flag not in config.auto or value == default:
            return default
        changes[flag] = {"value": _flag_value(value), "default": _flag_value(default), "why": why}
        return value

    batch = choose(
        "batch_size",
        config.train.batch_size,
        divisible_batch(batch_size(rows, config.train.batch_size), replicas),
        f"{rows} training rows: about {ROWS_PER_BATCH} batches per epoch or more"
        + (f", a multiple of the {replicas} synchronous replicas" if replicas > 1 else ""),
    )
    steps = choose(
        "max_iteration_steps",
        config.search.max_iteration_steps,
        iteration_steps(rows, batch, config.search.max_iteration_steps),
        f"at most {EPOCHS_PER_ITERATION} epochs of {rows} training rows per iteration",
    )
    fitted = has_fitted_members(config.search.generator)
    selection = choose(
        "selection",
        config.search.selection,
        Selection.HOLDOUT if small or fitted else config.search.selection,
        f"fewer than {SMALL_TABLE_ROWS:,} training rows: choose on the held-out data"
        if small
        else "a fitted member (boosted trees) scores the rows it was fitted on too well: "
        "choose on the held-out data",
    )
    patience = choose("patience", config.search.patience, *_patience(config, rows))
    generator = choose(
        "generator",
        config.search.generator,
        with_linear(config.search.generator)
        if small and head is HeadType.REGRESSION
        else config.search.generator,
        f"a regression table of fewer than {SMALL_TABLE_ROWS:,} training rows: the linear "
        "model is a candidate too",
    )
    bag_count, bags_why = bags(config, rows, one_machine=one_machine)
    bag_count = choose("bags", config.bags, bag_count, bags_why)
    if batch > rows:
        raise InputError(
            f"--batch_size={batch} is larger than the {rows} training rows: every epoch would "
            f"be empty. Use --batch_size={batch_size(rows, batch)} or leave it to the data."
        )
    if not changes:
        return config, {}
    adapted = dataclasses.replace(
        config,
        bags=bag_count,
        train=dataclasses.replace(config.train, batch_size=batch),
        search=dataclasses.replace(
            config.search,
            max_iteration_steps=steps,
            selection=selection,
            patience=patience,
            generator=generator,
        ),
    )
    return adapted, changes
