"""Every flag of `python -m trainer.task`, once: its type, default, range and help.

`FLAGS` is a table of frozen `Flag` values, read three ways:

- `trainer.task` defines them in absl (`define`), so `--help` lists them and absl parses them;
- the run configuration (`trainer.config`) declares each field that a flag sets with
  `field(name)`: its default is the flag's, `fields_of` fills it from the parsed flags, and
  `check_fields` checks it by the flag's range when the dataclass is built, from flags or
  directly (tests, benchmarks);
- `deploy.tune` checks a study's parameters against the `tunable` flags' types and ranges.

The module imports no TensorFlow (deploy/ may import it: pyproject.toml's contracts). So the
choices of the ensemble's enums (`--selection`, `--mixture_weight_type`) are spelled here, and a
test checks them against `trainer.ensemble`.

A flag that reaches the train step: a row here, a `field(...)` of `trainer.config.TrainOptions`
(filled and fingerprinted from there), and the code that reads it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from absl import flags as absl_flags

from trainer.errors import InputError
from trainer.input.options import BadRows
from trainer.input.schema import HeadType
from trainer.placement import Placement


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a flag takes: from `low` to `high` (None: unbounded), each end included
    unless open. `str` says it as the error messages do ("> 0", "in [0, 1)")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return (
            f"in {'(' if self.low_open else '['}{self.low:g}, "
            f"{self.high:g}{')' if self.high_open else ']'}"
        )


POSITIVE = Range(low=0, low_open=True)
AT_LEAST_0 = Range(low=0)
AT_LEAST_1 = Range(low=1)
FRACTION = Range(low=0, high=1, high_open=True)  # [0, 1)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: `kind` is str, int, float, bool, enum (one of `choices`) or list (of
    strings); `default` None means unset. `range` (numbers) and `note` (what an edge value
    means) make its error message; `tunable`: deploy.tune may tune it (it changes the model
    or its training)."""

    name: str
    kind: str
    default: Any
    help: str
    range: Range | None = None
    note: str = ""
    choices: tuple[str, ...] = ()
    tunable: bool = False

    def accepts(self, value: object) -> bool:
        """Whether the trainer takes `value` (None: the flag left unset)."""
        if value is None or (self.range is None and not self.choices):
            return True
        if self.choices:
            return getattr(value, "value", value) in self.choices
        return value in self.range  # type: ignore[operator]

    def check(self, value: object) -> None:
        """Raises InputError naming the flag, the value and the rule unless it `accepts` it."""
        if self.accepts(value):
            return
        if self.choices:
            raise InputError(f"--{self.name} ({value}) must be one of {', '.join(self.choices)}.")
        note = f" ({self.note})" if self.note else ""
        raise InputError(f"--{self.name} ({value}) must be {self.range}{note}.")

    def define(self, flag_values: absl_flags.FlagValues) -> None:
        """Defines the flag in absl's `flag_values`."""
        if self.kind == "enum":
            absl_flags.DEFINE_enum(
                self.name, self.default, list(self.choices), self.help, flag_values=flag_values
            )
            return
        _DEFINE[self.kind](self.name, self.default, self.help, flag_values=flag_values)


# absl's definition of each kind of flag but enum (whose choices come before the help).
_DEFINE: Mapping[str, Callable[..., Any]] = {
    "str": absl_flags.DEFINE_string,
    "int": absl_flags.DEFINE_integer,
    "float": absl_flags.DEFINE_float,
    "bool": absl_flags.DEFINE_boolean,
    "list": absl_flags.DEFINE_list,
}


# The choices of --optimizer, --learning_rate_schedule and --subnetwork_loss.
OPTIMIZER_NAMES = ("adam", "sgd", "rmsprop", "adagrad")
LEARNING_RATE_SCHEDULES = ("cosine", "constant")
SUBNETWORK_LOSSES = ("own", "residual")

FLAGS: tuple[Flag, ...] = (
    # -- data ---------------------------------------------------------------------------------
    Flag(
        "train_data",
        "str",
        None,
        "CSV (with header, optionally .gz), TFRecord (tf.Example), JSON Lines (*.jsonl, "
        "*.ndjson, optionally .gz: one object per line, its keys the columns) or Parquet "
        "(*.parquet, *.parq, *.pq) files: a path, a glob or a comma-separated list; or a "
        "BigQuery table, bq://PROJECT.DATASET.TABLE. Default: a Vertex AI managed dataset's "
        "AIP_TRAINING_DATA_URI if set, else the census training data shipped in the package.",
    ),
    Flag(
        "eval_data",
        "str",
        None,
        "Eval data in the same format: a test set, scored once by the exported model (a "
        "search that selects on held-out rows holds out --holdout_fraction of --train_data to "
        "choose on, never these rows). Default: the census test data with the default "
        "--train_data, else --holdout_fraction of it.",
    ),
    Flag(
        "test_data",
        "str",
        None,
        "Test data in the same format: scored once by the exported model after the eval data "
        "(report.json test, the console, the Model Registry evaluation), never read by the "
        "search. Default: a Vertex AI managed dataset's test split (AIP_TEST_DATA_URI).",
    ),
    Flag(
        "split_column",
        "str",
        None,
        "A column of each row's split: TRAIN, VALIDATE (the eval data) or TEST (the test "
        "data); other values are left out. Not a feature. Not with --eval_data or --test_data.",
    ),
    Flag(
        "timestamp_split_column",
        "str",
        None,
        "Split by time on this column (a date-time or seconds): the oldest rows train, then "
        "validate (the eval data), the newest test, by --split_fractions. Still a feature "
        "unless --ignore_columns names it.",
    ),
    Flag(
        "split_fractions",
        "list",
        ["0.8", "0.1", "0.1"],
        "Train, validate and test shares of --timestamp_split_column's split.",
    ),
    Flag(
        "holdout_fraction",
        "float",
        0.1,
        "Share of --train_data held out: the rows the search selects on (with --selection="
        "holdout) and, without --eval_data, the exported model's eval rows.",
        range=Range(low=0, high=1, low_open=True, high_open=True),
    ),
    Flag("label_column", "str", None, "The column to predict (required with --train_data)."),
    Flag("numeric_columns", "list", [], "Columns to treat as numeric (default: inferred)."),
    Flag("categorical_columns", "list", [], "Columns to treat as categorical (default: inferred)."),
    Flag("ignore_columns", "list", [], "Columns not to use as features."),
    Flag(
        "date_columns",
        "list",
        [],
        "Columns of dates or date-times, each NAME or NAME:FORMAT (iso, mdy: 3/1/2024, dmy: "
        "1/3/2024; default iso). Text columns of ISO dates are found without it; a column "
        "named --categorical_columns stays a category.",
    ),
    Flag(
        "weight_column",
        "str",
        None,
        "A numeric column of example weights (>= 0, not a feature): they weight the training "
        "loss and every eval metric, e.g. up-weighting a rare class. A row whose weight is "
        "missing, negative or not a number is a bad row (see --bad_rows).",
    ),
    Flag(
        "head",
        "enum",
        "auto",
        "The kind of label (default: inferred from the label values).",
        choices=("auto", *(h.value for h in HeadType)),
    ),
    Flag(
        "num_bins",
        "int",
        32,
        "Quantile bins of the piecewise-linear encoding of "
        "each numeric column (0: standardised value only).",
        range=AT_LEAST_0,
        tunable=True,
    ),
    Flag(
        "missing_indicators",
        "bool",
        True,
        "Give each numeric column missing in some training rows an input that says so (1 "
        "where missing, the value then at the mean), inside the exported model; boosted "
        "trees get the missing value itself. Read at the scan of a new job dir.",
        tunable=True,
    ),
    Flag(
        "max_vocabulary_size",
        "int",
        100_000,
        "Most frequent categories kept per column; the others share one out-of-vocabulary id.",
        range=AT_LEAST_1,
    ),
    Flag(
        "one_hot_max_size",
        "int",
        64,
        "Categorical columns with at most this many "
        "categories are one-hot encoded; larger ones get a learned embedding in "
        "each subnetwork (its cost per example does not grow with the vocabulary).",
        range=AT_LEAST_1,
        tunable=True,
    ),
    Flag(
        "embedding_dim",
        "int",
        16,
        "Largest embedding width (a column of n categories gets min(embedding_dim, 1.6 n^0.56)).",
        range=AT_LEAST_1,
        tunable=True,
    ),
    Flag(
        "bad_rows",
        "enum",
        BadRows.ERROR.value,
        "A row that cannot be used (wrong field count, a number that is not one, a "
        "missing label): error stops the job before training, naming its file and "
        "line; skip skips such rows and counts them per file in report.json.",
        choices=tuple(b.value for b in BadRows),
    ),
    Flag(
        "cache_mb",
        "float",
        256.0,
        "Keep the encoded training rows in memory when a reader's share fits in this many MB "
        "(else stream them from the files every epoch; 0: always stream); likewise the eval "
        "rows, and each iteration's previous ensemble's outputs on the training rows.",
        range=AT_LEAST_0,
        note="0: always stream",
    ),
    Flag(
        "shuffle_buffer", "int", 65_536, "Rows shuffled together when streaming.", range=AT_LEAST_1
    ),
    # -- the search ---------------------------------------------------------------------------
    Flag(
        "generator",
        "list",
        ["trees", "kheads"],
        "Search spaces: any of dnn, cross, linear, kheads (k heads sharing one body), trees "
        "(boosted trees, at iteration 0), or package.module:factory for your own (a "
        "function of trainer.model.GeneratorOptions, or a Generator class); several propose "
        "the union of their candidates.",
    ),
    # 128 units was tried on census: 0.8725 against 0.8719 at 64 (bench/defaults.py, seeds
    # 1-3) but 0.8712 against 0.8716 in bench/quality.py (5 seeds, paired 1 better, 4 worse).
    Flag(
        "layer_size",
        "int",
        64,
        "Units per hidden layer of dnn and cross subnetworks.",
        range=AT_LEAST_1,
        tunable=True,
    ),
    Flag(
        "initial_num_layers",
        "int",
        0,
        "Depth of the shallower DNN at iteration 0.",
        range=AT_LEAST_0,
        tunable=True,
    ),
    Flag("dropout", "float", 0.0, "Dropout rate of dnn subnetworks.", range=FRACTION, tunable=True),
    Flag(
        "ensemblers",
        "list",
        ["complexity_regularized"],
        "complexity_regularized and/or mean; every ensemble strategy x ensembler pair is a "
        "candidate.",
    ),
    Flag(
        "mixture_weight_type",
        "enum",
        "scalar",
        "Mixture weights of complexity_regularized ensembles.",
        choices=("scalar", "vector", "matrix"),  # trainer.ensemble.MixtureWeightType
        tunable=True,
    ),
    Flag(
        "adanet_lambda",
        "float",
        0.0,
        "Complexity penalty per unit of complexity.",
        range=AT_LEAST_0,
        tunable=True,
    ),
    Flag(
        "adanet_beta",
        "float",
        0.0,
        "Complexity penalty per mixture weight.",
        range=AT_LEAST_0,
        tunable=True,
    ),
    Flag(
        "learn_mixture_weights",
        "bool",
        False,
        "Train the mixture weights on the AdaNet objective (default: fixed at 1/N, AdaNet's "
        "default).",
        tunable=True,
    ),
    Flag(
        "use_bias", "bool", False, "Add a bias to complexity_regularized ensembles.", tunable=True
    ),
    Flag(
        "warm_start_mixture_weights",
        "bool",
        False,
        "Start kept members at their previous mixture weights.",
        tunable=True,
    ),
    Flag("ensemble_strategies", "list", ["grow"], "Any of grow, all, solo."),
    Flag(
        "selection",
        "enum",
        "moving_average",
        "How the best candidate is chosen: moving_average of the training objective, "
        "or an evaluator pass over the train data or the held-out eval data.",
        choices=("moving_average", "train", "holdout"),  # trainer.ensemble.Selection
        tunable=True,
    ),
    Flag(
        "selection_margin",
        "float",
        1.0,
        "With --selection=holdout or train: choose the simplest candidate (the previous "
        "ensemble first, then the least complex new subnetwork, then the one with the fewest "
        "parameters) whose objective is within this many standard errors of the lowest (the "
        "one-standard-error rule); 0: the lowest objective.",
        range=AT_LEAST_0,
        note="standard errors; 0 chooses the lowest objective whatever its noise",
        tunable=True,
    ),
    Flag("force_grow", "bool", False, "Never keep the previous ensemble unchanged.", tunable=True),
    Flag("max_iterations", "int", 7, "AdaNet iterations.", range=AT_LEAST_1, tunable=True),
    Flag(
        "patience",
        "int",
        0,
        "End the search early once this many iterations in a row kept the previous ensemble "
        "(it stopped growing); 0: run --max_iterations.",
        range=AT_LEAST_0,
        note="0: run every iteration",
        tunable=True,
    ),
    Flag(
        "max_iteration_steps",
        "int",
        750,
        "Train steps per iteration.",
        range=AT_LEAST_1,
        tunable=True,
    ),
    Flag(
        "time_budget_secs",
        "float",
        None,
        "End the search, with an exported model, within this many seconds of the start: later "
        "iterations are skipped and the running one stops early when time runs out "
        "(report.json 'budget' says what was cut). Default: no budget.",
        range=POSITIVE,
    ),
    Flag(
        "bags",
        "int",
        1,
        "Bagging: train this many searches, each holding out its own --holdout_fraction of "
        "the rows with its own seed, and export one model serving the "
        "mean of their probabilities (regression: of each row's predictions without its "
        "highest and lowest, from 3 bags on); the report scores it out of bag (each hold-out "
        "row by the bag that never trained on it; with --eval_data, on it). Default: 5 on one "
        "machine below 1,000 training rows for a search without k-head members (fewer if "
        "the hold-outs or --time_budget_secs cannot pay for 5), else 1.",
        range=AT_LEAST_1,
        note="1: no bagging",
    ),
    # -- training -----------------------------------------------------------------------------
    Flag("batch_size", "int", 256, "Examples per train step.", range=AT_LEAST_1, tunable=True),
    Flag(
        "learning_rate",
        "float",
        0.003,
        "Learning rate of the subnetworks.",
        range=POSITIVE,
        tunable=True,
    ),
    Flag(
        "mixture_learning_rate",
        "float",
        None,
        "Learning rate of the mixture weights (default: --learning_rate).",
        range=POSITIVE,
        tunable=True,
    ),
    Flag("optimizer", "enum", "adam", "Optimizer.", choices=OPTIMIZER_NAMES, tunable=True),
    Flag(
        "learning_rate_schedule",
        "enum",
        "cosine",
        "The learning rates over each iteration: cosine decays them from the full rate at the "
        "iteration's first step to 0 at its last (--max_iteration_steps); constant keeps them.",
        choices=LEARNING_RATE_SCHEDULES,
    ),
    Flag(
        "weight_decay",
        "float",
        0.0,
        "Decoupled weight decay of the subnetworks' layers (AdamW's): each step shrinks every "
        "weight by learning rate x this fraction of itself. 0: none.",
        range=FRACTION,
        tunable=True,
    ),
    Flag(
        "outer_learning_rate",
        "float",
        1.0,
        "Replication on parameter servers: each worker trains a chunk of steps from what it "
        "read and adds its change over N (the workers) times this rate when the chunk ends. "
        "1 with --outer_momentum=0: the plain average of the workers' changes.",
        range=POSITIVE,
    ),
    Flag(
        "outer_momentum",
        "float",
        0.0,
        "Replication on parameter servers: momentum of the outer step on the workers' "
        "changes (delayed Nesterov: one momentum step per N arriving changes, N the "
        "workers; DiLoCo's 0.9). 0: none.",
        range=FRACTION,
    ),
    Flag(
        "subnetwork_loss",
        "enum",
        "residual",
        "What a new subnetwork is trained on: residual, the loss of the previous ensemble "
        "grown by it at an equal share, so it learns what the ensemble still gets wrong "
        "(boosting's idea; census: 0.8719 against 0.8707 with own and 3 iterations, 5 seeds); "
        "own, its own loss (AdaNet's).",
        choices=SUBNETWORK_LOSSES,
        tunable=True,
    ),
    Flag("seed", "int", 42, "Seed of initialisation, data order and hold-out split."),
    Flag(
        "job_dir",
        "str",
        None,
        "Where checkpoints, logs, the model and the "
        "report go (local, gs://BUCKET/... or /gcs/BUCKET/...). Re-running with the "
        "same job dir resumes. Default: Vertex AI's AIP_* dirs when set (the job "
        "dir is then AIP_CHECKPOINT_DIR), else runs/adanet.",
    ),
    # -- output dirs outside the job dir (Cloud Storage, Vertex AI; see paths.OutputDirs) --
    Flag(
        "model_dir",
        "str",
        None,
        "Where the SavedModel goes. Default: AIP_MODEL_DIR without --job_dir, else JOB_DIR/model.",
    ),
    Flag(
        "checkpoint_dir",
        "str",
        None,
        "Where checkpoints go. Default: "
        "AIP_CHECKPOINT_DIR without --job_dir, else JOB_DIR/checkpoints.",
    ),
    Flag(
        "tensorboard_log_dir",
        "str",
        None,
        "Where TensorBoard logs go. Default: "
        "AIP_TENSORBOARD_LOG_DIR without --job_dir, else JOB_DIR/logs. (absl "
        "owns --log_dir: its own log files.)",
    ),
    Flag("steps_per_loop", "int", 100, "Train steps per compiled loop call.", range=AT_LEAST_1),
    Flag("checkpoint_every_secs", "float", 30.0, "Seconds between periodic checkpoints."),
    Flag(
        "hypertune_metric",
        "str",
        None,
        "Metric reported to Vertex AI hyperparameter "
        "tuning (default: accuracy, or mse for regression).",
    ),
    Flag(
        "calibration",
        "enum",
        "temperature",
        "How the exported model's class probabilities are calibrated on the rows the search "
        "chose on (held out from training): temperature scales the logits by one number "
        "fitted to their log loss (each row's most probable class is unchanged); none "
        "serves them as trained. report.json and calibration.png show the expected "
        "calibration error and log loss before and after.",
        choices=("temperature", "none"),  # trainer.evaluation.calibration.METHODS
    ),
    Flag(
        "decision_objective",
        "str",
        None,
        "A binary head's decision threshold, chosen on the rows the search chose on and "
        "served in the model: accuracy, f1, precision_at_recall=R (the most precise "
        "threshold with recall >= R), recall_at_precision=P, or threshold=T (T itself); "
        "unset: the most probable class (0.5). report.json and calibration.png show the "
        "precision-recall curve and the point chosen.",
    ),
    Flag(
        "feature_importance_rows",
        "int",
        10_000,
        "Eval rows for the permutation feature importance of the exported model "
        "(report.json, feature_importance.png); fewer, sampled, where the passes would take "
        "longer than half the search's time (at least 10 s) or than --time_budget_secs "
        "leaves (report.json's rows_before_budget); 0 turns it off.",
        range=AT_LEAST_0,
        note="0 turns it off",
    ),
    Flag(
        "feature_importance_repeats",
        "int",
        3,
        "Shuffles per column for the feature importance.",
        range=AT_LEAST_1,
    ),
    # -- cluster ------------------------------------------------------------------------------
    Flag(
        "placement",
        "enum",
        Placement.REPLICATION.value,
        "With parameter servers: replication (every worker trains everything) or "
        "round_robin (AdaNet's: one worker per subnetwork, one for the ensemble).",
        choices=tuple(p.value for p in Placement),
    ),
    Flag(
        "cluster_timeout_secs",
        "float",
        600.0,
        "How long a replica waits for the others to start: the chief for its workers and "
        "parameter servers, and they and the evaluator for the chief (which opens its port "
        "once its input is checked), synchronous replicas for each other. A replica whose "
        "peers never come exits with code 1 naming them.",
        range=POSITIVE,
    ),
    Flag(
        "stall_secs",
        "float",
        120.0,
        "A worker's share of an iteration that makes no "
        "progress this long (worker lost) is taken over by idle workers.",
        range=POSITIVE,
    ),
    Flag(
        "chunk_secs",
        "float",
        1.0,
        "With parameter servers: about how long a worker trains on its own copy of its "
        "variables between two exchanges with the parameter servers (at least "
        "--steps_per_loop steps).",
        range=POSITIVE,
    ),
    Flag(
        "server_grace_secs",
        "float",
        120.0,
        "How long workers, parameter servers and the evaluator wait "
        "for a vanished chief to come back before they exit.",
        range=POSITIVE,
    ),
    # -- Vertex AI Experiments (trainer/reporting/experiments.py) -----------------------------
    Flag(
        "experiment",
        "str",
        None,
        "Log the run's flags, per-iteration and final metrics to this Vertex AI experiment "
        "(created if new; 4-128 lowercase letters, digits and hyphens). Default: "
        "AIP_EXPERIMENT_NAME, set by Vertex AI for a CustomJob that names an experiment.",
    ),
    Flag(
        "experiment_run",
        "str",
        None,
        "The run's name in --experiment (an existing run is resumed). Default: "
        "AIP_EXPERIMENT_RUN_NAME, else job-<CLOUD_ML_JOB_ID> on Vertex AI, else "
        "run-<UTC time>.",
    ),
    Flag(
        "experiment_project", "str", None, "Project of --experiment. Default: CLOUD_ML_PROJECT_ID."
    ),
    Flag(
        "experiment_region",
        "str",
        None,
        "Region of --experiment. Default: CLOUD_ML_REGION, else us-central1.",
    ),
    Flag(
        "experiment_api_endpoint",
        "str",
        None,
        "Another Vertex AI API endpoint for --experiment (a private endpoint; tests: a local "
        "fake).",
    ),
)

BY_NAME: Mapping[str, Flag] = {flag.name: flag for flag in FLAGS}


def define(flag_values: absl_flags.FlagValues) -> None:
    """Defines every flag in absl's `flag_values` (trainer.task: `absl.flags.FLAGS`)."""
    for flag in FLAGS:
        flag.define(flag_values)


def check(values: Mapping[str, object]) -> None:
    """Checks every flag's value in `values` ({name: value}) by its rule (InputError)."""
    for name, value in values.items():
        BY_NAME[name].check(value)


def field(name: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """A dataclass field set by flag `name`: the flag's default (through `convert`, e.g. an
    enum), checked by `check_fields` and filled by `fields_of`."""
    default = BY_NAME[name].default
    if convert is not None and default is not None:
        default = convert(default)
    return dataclasses.field(default=default, metadata={"flag": name, "convert": convert})


def check_fields(instance: object) -> None:
    """Checks each flag field of a dataclass instance by its flag's rule (InputError)."""
    for f in dataclasses.fields(instance):  # type: ignore[arg-type]
        if "flag" in f.metadata:
            BY_NAME[f.metadata["flag"]].check(getattr(instance, f.name))


def fields_of(cls: type, values: Mapping[str, object]) -> dict[str, Any]:
    """The keyword arguments of dataclass `cls`'s flag fields, from `values` ({flag: value})."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if "flag" in f.metadata:
            value = values[f.metadata["flag"]]
            convert = f.metadata["convert"]
            kwargs[f.name] = convert(value) if convert is not None and value is not None else value
    return kwargs
