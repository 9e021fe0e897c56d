"""The run configuration: a frozen dataclass tree, built once from flags by `task.py`.

Each field a flag sets is declared with `flags.field(name)` (trainer/flags.py): its default is
the flag's, `task.py` fills it from the parsed flags, and the dataclass checks it by the flag's
range when built (`flags.check_fields`), from flags or directly; what a combination of flags
must satisfy is checked here.
"""

from __future__ import annotations

import dataclasses

from absl import logging

from trainer import ensemble as ens
from trainer import flags
from trainer.errors import InputError
from trainer.input.options import InputOptions, SplitOptions
from trainer.input.schema import ColumnChoices
from trainer.model import Generator, decision
from trainer.placement import Placement
from trainer.storage import job_dir as job_dir_lib
from trainer.storage.paths import OutputDirs


@dataclasses.dataclass(frozen=True)
class DataConfig:
    train_data: str
    eval_data: str | None
    columns: ColumnChoices
    holdout_fraction: float = flags.field("holdout_fraction")
    input: InputOptions = InputOptions()
    # scored once by the exported model, never by the search: not part of the fingerprint
    test_data: str | None = None
    # a split column or a time split: train_data, eval_data and test_data are its files
    split: SplitOptions = SplitOptions()

    def __post_init__(self):
        flags.check_fields(self)

    def fingerprint(self) -> dict:
        """What must not change when a job dir is resumed: the inputs and every choice that
        shapes the schema (which columns, their kinds and encodings, the label and head).
        The files' contents are checked against the schema's record of them
        (`trainer.input.job_input`)."""
        columns = self.columns
        # The hold-out's rule (`trainer.input.scan.Holdout`), recorded since it changed.
        # With --eval_data, a search that selects on held-out rows holds this share of the
        # training rows out to choose on. Recorded since then: a job dir from before selects
        # on its eval data, as it did (its schema has no such hold-out), whatever the flag.
        rule = (
            {"selection_holdout_fraction": self.holdout_fraction}
            if self.eval_data
            else {"holdout_rows": "by position"}
        )
        return {
            "train_data": self.train_data,
            "eval_data": self.eval_data,
            "holdout_fraction": None if self.eval_data else self.holdout_fraction,
            **rule,
            **self.split.fingerprint(),
            "bad_rows": self.input.bad_rows.value,
            "jsonl": self.input.jsonl,
            "label_column": columns.label,
            "weight_column": columns.weight,
            "numeric_columns": sorted(columns.numeric),
            "categorical_columns": sorted(columns.categorical),
            **({"date_columns": sorted(map(list, columns.dates))} if columns.dates else {}),
            "ignore_columns": sorted(columns.ignore),
            "head": columns.head.value if columns.head else "auto",
            "num_bins": columns.num_bins,
            "max_vocabulary_size": columns.max_vocabulary_size,
            "one_hot_max_size": columns.one_hot_max_size,
            "embedding_dim": columns.embedding_dim,
        }

    def input_flags(self) -> list[tuple[str, str | None]]:
        """(flag, comma-separated files or globs) of every input, for the preflight check."""
        if self.split.enabled:  # the split files are written by the job
            return [("--train_data", self.split.source)]
        return [
            ("--train_data", self.train_data),
            ("--eval_data", self.eval_data),
            ("--test_data", self.test_data),
        ]


# Bag b's training seed is --seed + b x this: far from the next --seed's bags.
BAG_SEED_STRIDE = 7919

OPTIMIZER_NAMES = flags.OPTIMIZER_NAMES  # the optimizers the train step knows (--optimizer)


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """How every candidate trains: the global batch size, the learning rate and optimizer
    (one of OPTIMIZER_NAMES) of the subnetworks, the mixture weights' learning rate (None:
    the same), and the rates' schedule over each iteration (one of
    flags.LEARNING_RATE_SCHEDULES). Every field is part of the fingerprint: a resumed job
    trains as it started."""

    batch_size: int = flags.field("batch_size")
    learning_rate: float = flags.field("learning_rate")
    optimizer: str = flags.field("optimizer")
    mixture_learning_rate: float | None = flags.field("mixture_learning_rate")
    learning_rate_schedule: str = flags.field("learning_rate_schedule")
    weight_decay: float = flags.field("weight_decay")
    subnetwork_loss: str = flags.field("subnetwork_loss")
    outer_learning_rate: float = flags.field("outer_learning_rate")
    outer_momentum: float = flags.field("outer_momentum")

    def __post_init__(self):
        flags.check_fields(self)


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """What AdaNet searches: candidates, how they combine, and how the best is chosen."""

    generator: Generator
    ensemblers: tuple[ens.Ensembler, ...]
    strategies: tuple[ens.Strategy, ...]
    selection: ens.Selection = flags.field("selection", ens.Selection)
    force_grow: bool = flags.field("force_grow")
    max_iterations: int = flags.field("max_iterations")
    max_iteration_steps: int = flags.field("max_iteration_steps")
    # standard errors (`ensemble.choose`); 0: the lowest wins
    selection_margin: float = flags.field("selection_margin")
    # The search ends after this many iterations in a row kept the previous ensemble (0: it
    # runs max_iterations). Like max_iterations, not part of the fingerprint.
    patience: int = flags.field("patience")

    def __post_init__(self):
        flags.check_fields(self)
        if not self.ensemblers or not self.strategies:
            raise InputError("--ensemblers and --ensemble_strategies each need at least one value.")

    def fingerprint(self) -> dict:
        """What must not change when a job dir is resumed (max_iterations may grow)."""
        return {
            "generator": repr(self.generator),
            "ensemblers": [repr(e) for e in self.ensemblers],
            "strategies": [s.name for s in self.strategies],
            "selection": self.selection.value,
            "force_grow": self.force_grow,
            "selection_margin": self.selection_margin,
            "max_iteration_steps": self.max_iteration_steps,
        }


@dataclasses.dataclass(frozen=True)
class DistributionConfig:
    """How a cluster trains (ignored on one machine)."""

    placement: Placement = flags.field("placement", Placement)
    cluster_timeout_secs: float = flags.field("cluster_timeout_secs")
    stall_secs: float = flags.field("stall_secs")
    server_grace_secs: float = flags.field("server_grace_secs")
    chunk_secs: float = flags.field("chunk_secs")

    def __post_init__(self):
        flags.check_fields(self)


@dataclasses.dataclass(frozen=True)
class ImportanceOptions:
    """Permutation importance of the exported model (`trainer/evaluation/importance.py`): `rows`:
    eval rows used (0: no importance); `repeats`: shuffles per column."""

    # eval rows: a baseline and a shuffle each cost a pass over them
    rows: int = flags.field("feature_importance_rows")
    repeats: int = flags.field("feature_importance_repeats")

    def __post_init__(self):
        flags.check_fields(self)

    @property
    def enabled(self) -> bool:
        return self.rows > 0


@dataclasses.dataclass(frozen=True)
class CalibrationOptions:
    """What the export does to the chosen ensemble's outputs
    (`trainer/evaluation/calibration.py`): `method`, the probabilities' calibration;
    `decision_objective`, how a binary head's threshold is chosen."""

    method: str = flags.field("calibration")
    decision_objective: str | None = flags.field("decision_objective")

    def __post_init__(self):
        flags.check_fields(self)
        decision.Objective.parse(self.decision_objective)  # bad input fails before any work

    @property
    def objective(self) -> decision.Objective:
        return decision.Objective.parse(self.decision_objective)

    def to_json(self) -> dict:
        return {"calibration": self.method, "decision_objective": str(self.objective)}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    data: DataConfig
    search: SearchConfig
    train: TrainOptions
    job_dir: str
    seed: int = flags.field("seed")
    steps_per_loop: int = flags.field("steps_per_loop")
    checkpoint_every_secs: float = flags.field("checkpoint_every_secs")
    hypertune_metric: str | None = None
    distribution: DistributionConfig = DistributionConfig()
    # Output dirs outside the job dir (None: `job_dir`/model, /checkpoints, /logs).
    model_dir: str | None = None
    checkpoint_dir: str | None = None
    log_dir: str | None = None
    time_budget_secs: float | None = flags.field("time_budget_secs")  # trainer/search/budget.py
    # Permutation importance of the exported model (trainer/evaluation/importance.py; rows=0: none).
    importance: ImportanceOptions = ImportanceOptions()
    calibration: CalibrationOptions = CalibrationOptions()
    # The flags left at their defaults that `trainer.search.adapt` may choose from the data.
    auto: frozenset[str] = frozenset()
    # Bagging (trainer/job/bagging.py): the job trains `bags` searches and serves their average;
    # `bag` is the index of one of them (its hold-out fold and its training seed).
    bags: int = flags.field("bags")
    bag: int = 0

    @property
    def training_seed(self) -> int:
        """Seeds initialisation and data order: --seed, moved for every bag but the first
        (whose search is the unbagged job's). The hold-out and the scan keep `seed`."""
        return self.seed + BAG_SEED_STRIDE * self.bag

    @property
    def outputs(self) -> OutputDirs:
        return OutputDirs.resolve(
            job_dir=self.job_dir,
            model_dir=self.model_dir,
            checkpoint_dir=self.checkpoint_dir,
            log_dir=self.log_dir,
        )

    def __post_init__(self):
        flags.check_fields(self)
        fraction = self.data.holdout_fraction
        if self.bags * fraction > 1.0 + 1e-9:
            raise InputError(
                f"--bags={self.bags} with --holdout_fraction={fraction:g}: every bag holds out "
                f"its own {fraction:.0%} of the rows, and {self.bags} of them are more than all "
                f"of them. Use at most --bags={int(1 / fraction + 1e-9)}, or a smaller "
                "--holdout_fraction."
            )

    def fingerprint(self) -> dict:
        """What must not change when a job dir is resumed (`check_resumable`): the
        search, how it trains, and the input. What may change: --max_iterations, --patience
        and --time_budget_secs (the search may go further), and the flags of how it runs
        (memory, placement, timeouts, output dirs, reporting); see docs/data.md, "Resume
        rules"."""
        return {
            **self.search.fingerprint(),
            "seed": self.seed,
            **dataclasses.asdict(self.train),
            **self.data.fingerprint(),
            "bags": self.bags,
        }


# Settings added to the fingerprint after job dirs were written without them, and what those
# runs did: a job dir that does not record one ran with this value.
BEFORE_RECORDED = {
    "weight_decay": 0.0,
    "subnetwork_loss": "own",
    "selection_margin": 0.0,
    "bags": 1,
    "holdout_rows": "by text",
}


def check_resolved(config: RunConfig, job: job_dir_lib.JobDir) -> None:
    """Fails when the job dir's run resolved other settings than `config` (what
    `trainer.search.adapt` chose from the data included): flags written out on a resume that
    match what the first run was given (a default) but not what it chose (a value left to the
    data) would otherwise change what the job trains. A job dir that did not record what it
    resolved is not compared."""
    if not job.exists():
        return
    recorded = job_dir_lib.read_json(job.run).get("resolved")
    if recorded is None:
        return
    changed = changed_settings(recorded, config.fingerprint())
    if changed:
        lines = "; ".join(f"{k}: was {old!r}, now {new!r}" for k, (old, new) in changed.items())
        raise InputError(
            f"--job_dir {job.root} holds a run that trained with other settings ({lines}), "
            "some of them chosen from the data when their flags were left out. Re-run with "
            "the flags of its first run to resume it, or start afresh in a new --job_dir."
        )


def changed_settings(recorded: dict, current: dict) -> dict:
    """{setting: (recorded value, current value)} of the recorded settings that differ."""
    return {k: (recorded[k], v) for k, v in current.items() if k in recorded and recorded[k] != v}


def check_resumable(config: RunConfig, job: job_dir_lib.JobDir) -> None:
    """Fails when the job dir was written by a run with other settings (`config.fingerprint`).
    A setting its run did not record (a job dir of an older version) is not compared, unless
    `BEFORE_RECORDED` knows what such runs did."""
    if not job.exists():
        return
    written = job_dir_lib.read_json(job.run)["fingerprint"]
    recorded = {**BEFORE_RECORDED, **written}
    current = config.fingerprint()
    unknown = sorted(k for k in current if k not in recorded)
    if unknown:
        logging.warning(
            "--job_dir %s was started by an older version that did not record %s: resumed "
            "without checking them.",
            job.root,
            ", ".join(unknown),
        )
    changed = changed_settings(recorded, current)
    if changed:
        lines = "; ".join(
            f"{k}: was {old!r}{'' if k in written else ' (before it was recorded)'}, now {new!r}"
            for k, (old, new) in changed.items()
        )
        raise InputError(
            f"--job_dir {job.root} holds a run with other settings ({lines}). "
            "Re-run with the same flags to resume it, or start afresh in a new --job_dir "
            "(or after deleting this one)."
        )
