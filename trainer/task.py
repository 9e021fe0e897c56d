"""Entry point: `python -m trainer.task [flags]`.

Parses flags, builds the frozen `RunConfig`, and calls `job_lib.run(config)`. With no flags
it trains on the census data shipped in the package.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time

STARTED = time.monotonic()  # before the imports: a --time_budget_secs counts them

from absl import app, flags, logging

from trainer.reporting import console

# Run as `python -m trainer.task`: the libraries' noise is off before TensorFlow loads (below).
VERBOSE = console.quiet_libraries() if __name__ == "__main__" else True

from trainer import config as config_lib
from trainer import ensemble as ens
from trainer import model
from trainer.config import (
    LEARNING_RATE_SCHEDULES,
    OPTIMIZER_NAMES,
    SUBNETWORK_LOSSES,
    ImportanceOptions,
    TrainOptions,
)
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import preemption
from trainer.distribute import runtime as distributed
from trainer.distribute.environment import Environment
from trainer.errors import InputError, TrainingError
from trainer.input import files as files_lib
from trainer.input.options import BadRows, BigQueryConnection, InputOptions
from trainer.input.schema import ColumnChoices, HeadType
from trainer.job import evaluator
from trainer.job import job as job_lib
from trainer.placement import Placement
from trainer.reporting import experiments
from trainer.reporting import report as report_lib
from trainer.search import adapt
from trainer.storage import job_dir as job_dir_lib

FLAGS = flags.FLAGS

# -- data -------------------------------------------------------------------------------------
flags.DEFINE_string(
    "train_data",
    None,
    "CSV (with header, optionally .gz), TFRecord (tf.Example) or JSON Lines (*.jsonl, "
    "*.ndjson, optionally .gz: one object per line, its keys the columns) "
    "files: a path, a glob or a comma-separated list; or a BigQuery table, "
    "bq://PROJECT.DATASET.TABLE. Default: a Vertex AI managed dataset's "
    "AIP_TRAINING_DATA_URI if set, else the census training data shipped in the package.",
)
flags.DEFINE_string(
    "eval_data",
    None,
    "Eval data in the same format. Default: the census test "
    "data with the default --train_data, else --holdout_fraction of it.",
)
flags.DEFINE_float(
    "holdout_fraction",
    0.1,
    "Share of --train_data held out for evaluation when --eval_data is not given.",
)
flags.DEFINE_string("label_column", None, "The column to predict (required with --train_data).")
flags.DEFINE_list("numeric_columns", [], "Columns to treat as numeric (default: inferred).")
flags.DEFINE_list("categorical_columns", [], "Columns to treat as categorical (default: inferred).")
flags.DEFINE_list("ignore_columns", [], "Columns not to use as features.")
flags.DEFINE_string(
    "weight_column",
    None,
    "A numeric column of example weights (>= 0, not a feature): they weight the training "
    "loss and every eval metric, e.g. up-weighting a rare class. A row whose weight is "
    "missing, negative or not a number is a bad row (see --bad_rows).",
)
flags.DEFINE_enum(
    "head",
    "auto",
    ["auto"] + [h.value for h in HeadType],
    "The kind of label (default: inferred from the label values).",
)
flags.DEFINE_integer(
    "num_bins",
    32,
    "Quantile bins of the piecewise-linear encoding of "
    "each numeric column (0: standardised value only).",
)
flags.DEFINE_integer(
    "max_vocabulary_size",
    100_000,
    "Most frequent categories kept per column; the others share one out-of-vocabulary id.",
)
flags.DEFINE_integer(
    "one_hot_max_size",
    64,
    "Categorical columns with at most this many "
    "categories are one-hot encoded; larger ones get a learned embedding in "
    "each subnetwork (its cost per example does not grow with the vocabulary).",
)
flags.DEFINE_integer(
    "embedding_dim",
    16,
    "Largest embedding width (a column of n categories gets min(embedding_dim, 1.6 n^0.56)).",
)
flags.DEFINE_enum(
    "bad_rows",
    BadRows.ERROR.value,
    [b.value for b in BadRows],
    "A row that cannot be used (wrong field count, a number that is not one, a "
    "missing label): error stops the job before training, naming its file and "
    "line; skip skips such rows and counts them per file in report.json.",
)
flags.DEFINE_float(
    "cache_mb",
    256.0,
    "Keep the encoded training rows in memory when a reader's share fits in this many MB "
    "(else stream them from the files every epoch; 0: always stream); likewise the eval rows, "
    "and each iteration's previous ensemble's outputs on the training rows.",
)
flags.DEFINE_integer("shuffle_buffer", 65_536, "Rows shuffled together when streaming.")
# 128 units was tried on census: 0.8725 against 0.8719 at 64 (bench/defaults.py, seeds 1-3)
# but 0.8712 against 0.8716 in bench/quality.py (5 seeds, paired 1 better, 4 worse): no gain.
DEFAULT_LAYER_SIZE = 64
# -- the search -------------------------------------------------------------------------------
flags.DEFINE_list(
    "generator",
    ["dnn", "cross"],
    "Search spaces: any of dnn, cross, linear; several propose the union of their candidates.",
)
flags.DEFINE_integer(
    "layer_size", DEFAULT_LAYER_SIZE, "Units per hidden layer of dnn and cross subnetworks."
)
flags.DEFINE_integer("initial_num_layers", 0, "Depth of the shallower DNN at iteration 0.")
flags.DEFINE_float("dropout", 0.0, "Dropout rate of dnn subnetworks.")
flags.DEFINE_list(
    "ensemblers",
    ["complexity_regularized"],
    "complexity_regularized and/or mean; every ensemble strategy x ensembler pair is a candidate.",
)
flags.DEFINE_enum(
    "mixture_weight_type",
    "scalar",
    [t.value for t in ens.MixtureWeightType],
    "Mixture weights of complexity_regularized ensembles.",
)
flags.DEFINE_float("adanet_lambda", 0.0, "Complexity penalty per unit of complexity.")
flags.DEFINE_float("adanet_beta", 0.0, "Complexity penalty per mixture weight.")
flags.DEFINE_boolean(
    "learn_mixture_weights",
    False,
    "Train the mixture weights on the AdaNet objective (default: fixed at 1/N, AdaNet's default).",
)
flags.DEFINE_boolean("use_bias", False, "Add a bias to complexity_regularized ensembles.")
flags.DEFINE_boolean(
    "warm_start_mixture_weights", False, "Start kept members at their previous mixture weights."
)
flags.DEFINE_list("ensemble_strategies", ["grow"], "Any of grow, all, solo.")
flags.DEFINE_enum(
    "selection",
    ens.Selection.MOVING_AVERAGE.value,
    [s.value for s in ens.Selection],
    "How the best candidate is chosen: moving_average of the training objective, "
    "or an evaluator pass over the train data or the held-out eval data.",
)
flags.DEFINE_float(
    "selection_margin",
    1.0,
    "With --selection=holdout or train: choose the simplest candidate (the previous ensemble "
    "first, then the least complex new subnetwork, then the one with the fewest parameters) "
    "whose objective is within this many standard errors of the lowest (the "
    "one-standard-error rule); 0: the lowest objective.",
)
flags.DEFINE_boolean("force_grow", False, "Never keep the previous ensemble unchanged.")
flags.DEFINE_integer("max_iterations", 7, "AdaNet iterations.")
flags.DEFINE_integer(
    "patience",
    0,
    "End the search early once this many iterations in a row kept the previous ensemble "
    "(it stopped growing); 0: run --max_iterations.",
)
flags.DEFINE_integer("max_iteration_steps", 750, "Train steps per iteration.")
flags.DEFINE_float(
    "time_budget_secs",
    None,
    "End the search, with an exported model, within this many seconds of the start: later "
    "iterations are skipped and the running one stops early when time runs out "
    "(report.json 'budget' says what was cut). Default: no budget.",
)
flags.DEFINE_integer(
    "bags",
    1,
    "Bagging: train this many searches, each holding out its own --holdout_fraction of the "
    "rows (or all on --eval_data) with its own seed, and export one model serving the mean "
    "of their probabilities (regression: of each row's predictions without its highest and "
    "lowest, from 3 bags on); the report scores it out of bag (each hold-out row by the bag "
    "that never trained on it). Default: 5 on one machine below 1,000 training rows "
    "(fewer if the hold-outs or --time_budget_secs cannot pay for 5), else 1.",
)
# -- training ---------------------------------------------------------------------------------
flags.DEFINE_integer("batch_size", 256, "Examples per train step.")
flags.DEFINE_float("learning_rate", 0.003, "Learning rate of the subnetworks.")
flags.DEFINE_float(
    "mixture_learning_rate",
    None,
    "Learning rate of the mixture weights (default: --learning_rate).",
)
flags.DEFINE_enum("optimizer", "adam", list(OPTIMIZER_NAMES), "Optimizer.")
flags.DEFINE_enum(
    "learning_rate_schedule",
    "cosine",
    list(LEARNING_RATE_SCHEDULES),
    "The learning rates over each iteration: cosine decays them from the full rate at the "
    "iteration's first step to 0 at its last (--max_iteration_steps); constant keeps them.",
)
flags.DEFINE_float(
    "weight_decay",
    0.0,
    "Decoupled weight decay of the subnetworks' layers (AdamW's): each step shrinks every "
    "weight by learning rate x this fraction of itself. 0: none.",
)
flags.DEFINE_enum(
    "subnetwork_loss",
    "residual",
    list(SUBNETWORK_LOSSES),
    "What a new subnetwork is trained on: residual, the loss of the previous ensemble grown "
    "by it at an equal share, so it learns what the ensemble still gets wrong (boosting's "
    "idea; census: 0.8719 against 0.8707 with own and 3 iterations, 5 seeds); own, its own "
    "loss (AdaNet's).",
)
flags.DEFINE_integer("seed", 42, "Seed of initialisation, data order and hold-out split.")
flags.DEFINE_string(
    "job_dir",
    None,
    "Where checkpoints, logs, the model and the "
    "report go (local, gs://BUCKET/... or /gcs/BUCKET/...). Re-running with the "
    "same job dir resumes. Default: Vertex AI's AIP_* dirs when set (the job "
    "dir is then AIP_CHECKPOINT_DIR), else runs/adanet.",
)
# -- output dirs outside the job dir (Cloud Storage, Vertex AI; see job_dir.OutputDirs) ------
flags.DEFINE_string(
    "model_dir",
    None,
    "Where the SavedModel goes. Default: AIP_MODEL_DIR without --job_dir, else JOB_DIR/model.",
)
flags.DEFINE_string(
    "checkpoint_dir",
    None,
    "Where checkpoints go. Default: "
    "AIP_CHECKPOINT_DIR without --job_dir, else JOB_DIR/checkpoints.",
)
flags.DEFINE_string(
    "tensorboard_log_dir",
    None,
    "Where TensorBoard logs go. Default: "
    "AIP_TENSORBOARD_LOG_DIR without --job_dir, else JOB_DIR/logs. (absl "
    "owns --log_dir: its own log files.)",
)
flags.DEFINE_integer("steps_per_loop", 100, "Train steps per compiled loop call.")
flags.DEFINE_float("checkpoint_every_secs", 30.0, "Seconds between periodic checkpoints.")
flags.DEFINE_string(
    "hypertune_metric",
    None,
    "Metric reported to Vertex AI hyperparameter "
    "tuning (default: accuracy, or mse for regression).",
)
flags.DEFINE_integer(
    "feature_importance_rows",
    10_000,
    "Eval rows for the permutation feature importance of the exported model "
    "(report.json, feature_importance.png); 0 turns it off.",
)
flags.DEFINE_integer(
    "feature_importance_repeats", 3, "Shuffles per column for the feature importance."
)

# -- cluster ----------------------------------------------------------------------------------
flags.DEFINE_enum(
    "placement",
    Placement.REPLICATION.value,
    [p.value for p in Placement],
    "With parameter servers: replication (every worker trains everything) or "
    "round_robin (AdaNet's: one worker per subnetwork, one for the ensemble).",
)
flags.DEFINE_float(
    "cluster_timeout_secs",
    600.0,
    "How long a replica waits for the others to start: the chief for its workers and "
    "parameter servers, and they and the evaluator for the chief (which opens its port once "
    "its input is checked), synchronous replicas for each other. A replica whose peers never "
    "come exits with code 1 naming them.",
)
flags.DEFINE_float(
    "stall_secs",
    120.0,
    "A worker's share of an iteration that makes no "
    "progress this long (worker lost) is taken over by idle workers.",
)
flags.DEFINE_float(
    "chunk_secs",
    1.0,
    "With parameter servers: about how long a worker trains on its own copy of its variables "
    "between two exchanges with the parameter servers (at least --steps_per_loop steps).",
)
flags.DEFINE_float(
    "server_grace_secs",
    120.0,
    "How long workers, parameter servers and the evaluator wait "
    "for a vanished chief to come back before they exit.",
)
# -- Vertex AI Experiments (trainer/reporting/experiments.py) --------------------------------------
flags.DEFINE_string(
    "experiment",
    None,
    "Log the run's flags, per-iteration and final metrics to this Vertex AI experiment "
    "(created if new; 4-128 lowercase letters, digits and hyphens). Default: "
    "AIP_EXPERIMENT_NAME, set by Vertex AI for a CustomJob that names an experiment.",
)
flags.DEFINE_string(
    "experiment_run",
    None,
    "The run's name in --experiment (an existing run is resumed). Default: "
    "AIP_EXPERIMENT_RUN_NAME, else job-<CLOUD_ML_JOB_ID> on Vertex AI, else run-<UTC time>.",
)
flags.DEFINE_string(
    "experiment_project", None, "Project of --experiment. Default: CLOUD_ML_PROJECT_ID."
)
flags.DEFINE_string(
    "experiment_region", None, "Region of --experiment. Default: CLOUD_ML_REGION, else us-central1."
)
flags.DEFINE_string(
    "experiment_api_endpoint",
    None,
    "Another Vertex AI API endpoint for --experiment (a private endpoint; tests: a local fake).",
)

_GENERATORS = set(model.GENERATOR_NAMES.values())


def _choice(flag: str, values: list[str], allowed) -> list[str]:
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise InputError(
            f"--{flag}={','.join(values)}: unknown or missing value(s) {unknown}; "
            f"choose from {', '.join(sorted(allowed))}."
        )
    if len(set(values)) != len(values):
        raise InputError(f"--{flag}={','.join(values)} names a value twice.")
    return values


def build_config(f=FLAGS, environment: Environment | None = None) -> config_lib.RunConfig:
    """Turns flags into the frozen run configuration, checking combinations."""
    environment = environment or Environment()
    train_data, eval_data, label = f.train_data, f.eval_data, f.label_column
    jsonl = False  # every file read as JSON Lines, whatever its name
    if train_data is None and environment.training_data_uri:  # a Vertex managed dataset
        jsonl = (environment.data_format or "").strip().lower() == "jsonl"
        train_data, validation = files_lib.managed_dataset(
            environment.data_format,
            training=environment.training_data_uri,
            validation=environment.validation_data_uri,
        )
        eval_data = eval_data or validation
        if not label:
            raise InputError(
                f"--label_column is required with a managed dataset ({train_data}): name "
                "the column to predict."
            )
    elif train_data is None:
        train_data = files_lib.CENSUS_TRAIN
        eval_data = eval_data or files_lib.CENSUS_TEST
        label = label or files_lib.CENSUS_LABEL
    elif not label:
        raise InputError(
            "--label_column is required with --train_data: name the column to predict."
        )
    generators: list[model.Generator] = []
    for name in _choice("generator", f.generator, _GENERATORS):
        if name == "dnn":
            generators.append(
                model.DNNGenerator(
                    layer_size=f.layer_size,
                    initial_num_layers=f.initial_num_layers,
                    dropout=f.dropout,
                )
            )
        elif name == "cross":
            generators.append(model.CrossGenerator(layer_size=f.layer_size))
        else:
            generators.append(model.LinearGenerator())
    generator = generators[0] if len(generators) == 1 else model.UnionGenerator(tuple(generators))

    ensembler_names = _choice("ensemblers", f.ensemblers, {"complexity_regularized", "mean"})
    regularized_flags = {
        "adanet_lambda": f.adanet_lambda != 0.0,
        "adanet_beta": f.adanet_beta != 0.0,
        "learn_mixture_weights": f.learn_mixture_weights,
        "use_bias": f.use_bias,
        "mixture_weight_type": f.mixture_weight_type != "scalar",
        "warm_start_mixture_weights": f.warm_start_mixture_weights,
    }
    if "complexity_regularized" not in ensembler_names:
        set_flags = [k for k, v in regularized_flags.items() if v]
        if set_flags:
            raise InputError(
                f"--{', --'.join(set_flags)} only apply to "
                "--ensemblers=complexity_regularized, not to mean. Add "
                "complexity_regularized to --ensemblers or drop those flags."
            )
    if f.mixture_learning_rate is not None and not f.learn_mixture_weights:
        raise InputError("--mixture_learning_rate needs --learn_mixture_weights.")
    ensemblers: list[ens.Ensembler] = []
    for name in ensembler_names:
        if name == "mean":
            ensemblers.append(ens.MeanEnsembler())
        else:
            try:
                ensemblers.append(
                    ens.ComplexityRegularizedEnsembler(
                        mixture_weight_type=ens.MixtureWeightType(f.mixture_weight_type),
                        adanet_lambda=f.adanet_lambda,
                        adanet_beta=f.adanet_beta,
                        use_bias=f.use_bias,
                        learn_mixture_weights=f.learn_mixture_weights,
                        warm_start_mixture_weights=f.warm_start_mixture_weights,
                    )
                )
            except ValueError as e:
                raise InputError(f"--adanet_lambda/--adanet_beta: {e}") from None
    strategies = tuple(
        ens.STRATEGIES[n]
        for n in _choice("ensemble_strategies", f.ensemble_strategies, ens.STRATEGIES)
    )

    overlapping = set(f.numeric_columns) & set(f.categorical_columns)
    if overlapping:
        raise InputError(
            f"column(s) {sorted(overlapping)} are in both --numeric_columns and "
            "--categorical_columns; name each column once."
        )
    columns = ColumnChoices(
        label=label,
        numeric=tuple(f.numeric_columns),
        categorical=tuple(f.categorical_columns),
        ignore=tuple(f.ignore_columns),
        head=None if f.head == "auto" else HeadType(f.head),
        num_bins=f.num_bins,
        max_vocabulary_size=f.max_vocabulary_size,
        one_hot_max_size=f.one_hot_max_size,
        embedding_dim=f.embedding_dim,
        weight=f.weight_column or None,
    )
    if f.layer_size < 1 or f.initial_num_layers < 0 or not 0 <= f.dropout < 1:
        raise InputError(
            f"--layer_size ({f.layer_size}) must be >= 1, --initial_num_layers "
            f"({f.initial_num_layers}) >= 0 and --dropout ({f.dropout}) in [0, 1)."
        )
    return config_lib.RunConfig(
        auto=frozenset(name for name in adapt.ADAPTIVE_FLAGS if not f[name].present),
        data=config_lib.DataConfig(
            train_data=train_data,
            eval_data=eval_data,
            columns=columns,
            holdout_fraction=f.holdout_fraction,
            input=InputOptions(
                bad_rows=BadRows(f.bad_rows),
                cache_mb=f.cache_mb,
                shuffle_buffer=f.shuffle_buffer,
                bigquery=BigQueryConnection(
                    project=environment.project, emulator_host=environment.bigquery_emulator_host
                ),
                jsonl=jsonl,
            ),
        ),
        search=config_lib.SearchConfig(
            generator=generator,
            ensemblers=tuple(ensemblers),
            strategies=strategies,
            selection=ens.Selection(f.selection),
            force_grow=f.force_grow,
            selection_margin=f.selection_margin,
            max_iterations=f.max_iterations,
            patience=f.patience,
            max_iteration_steps=f.max_iteration_steps,
        ),
        train=TrainOptions(
            batch_size=f.batch_size,
            learning_rate=f.learning_rate,
            optimizer=f.optimizer,
            mixture_learning_rate=f.mixture_learning_rate,
            learning_rate_schedule=f.learning_rate_schedule,
            weight_decay=f.weight_decay,
            subnetwork_loss=f.subnetwork_loss,
        ),
        **_output_dirs(f, environment),
        seed=f.seed,
        bags=f.bags,
        steps_per_loop=f.steps_per_loop,
        checkpoint_every_secs=f.checkpoint_every_secs,
        time_budget_secs=f.time_budget_secs,
        importance=ImportanceOptions(
            rows=f.feature_importance_rows, repeats=f.feature_importance_repeats
        ),
        hypertune_metric=(f.hypertune_metric or "") if environment.is_tuning else None,
        distribution=config_lib.DistributionConfig(
            placement=Placement(f.placement),
            cluster_timeout_secs=f.cluster_timeout_secs,
            stall_secs=f.stall_secs,
            server_grace_secs=f.server_grace_secs,
            chunk_secs=f.chunk_secs,
        ),
    )


def _output_dirs(f, environment: Environment) -> dict:
    """job_dir, model_dir, checkpoint_dir, log_dir: flags, then AIP_*, then runs/adanet."""
    outputs = job_dir_lib.OutputDirs.resolve(
        job_dir=f.job_dir,
        model_dir=f.model_dir,
        checkpoint_dir=f.checkpoint_dir,
        log_dir=f.tensorboard_log_dir,
        aip_model_dir=environment.model_dir,
        aip_checkpoint_dir=environment.checkpoint_dir,
        aip_log_dir=environment.log_dir,
    )
    return dataclasses.asdict(outputs)


def _tracker(
    f, environment: Environment, cluster: cluster_lib.Cluster
) -> experiments.VertexExperiment | None:
    """The chief's Vertex AI Experiments run (--experiment, or Vertex AI's variables); every
    replica checks the names, so a bad one stops the job before any work."""
    target = experiments.resolve(
        experiment=f.experiment,
        run=f.experiment_run,
        project=f.experiment_project,
        region=f.experiment_region,
        api_endpoint=f.experiment_api_endpoint,
        environ_experiment=environment.experiment,
        environ_run=environment.experiment_run,
        environ_project=environment.project,
        environ_region=environment.region,
        job_id=environment.job_id,
        trial_id=environment.trial_id,
    )
    if target is None or not cluster.is_chief:
        return None
    values = {
        flag.name: flag.value
        for flag in f.get_flags_for_module(sys.modules[__name__])
        if not flag.name.startswith("experiment")
    }
    return experiments.VertexExperiment(target, params=experiments.params_of(values))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; all options are --flags.")
    watched = False  # whether `preemption.watch` took SIGINT over (and then gave it back)
    try:
        environment = Environment.from_environ()
        config = build_config(FLAGS, environment)
        cluster = environment.cluster
        tracker = _tracker(FLAGS, environment, cluster)
        timeouts = config.distribution
        if cluster.task_type in (cluster_lib.WORKER, cluster_lib.PS) and cluster.has_ps:
            distributed.serve(
                cluster,
                timeout_secs=timeouts.cluster_timeout_secs,
                grace_secs=timeouts.server_grace_secs,
            )
        if cluster.task_type == cluster_lib.EVALUATOR:
            # Only a chief that runs a server answers on its address: one with no workers or
            # ps trains alone, and the evaluator then waits for its job dir instead.
            chief = None
            if cluster.is_distributed:
                chief = cluster_lib.ChiefWatch(
                    cluster,
                    timeout_secs=timeouts.cluster_timeout_secs,
                    grace_secs=timeouts.server_grace_secs,
                )
            with preemption.watch():  # nothing to save: SIGTERM or Ctrl-C ends it at once
                watched = True
                evaluator.run(config, chief=chief)
            return 0
        # SIGTERM (a Spot VM's preemption) or Ctrl-C: a checkpoint, then exit 143 (130) so that
        # Vertex AI restarts this replica. A synchronous cluster's replica cannot checkpoint
        # alone: it just stops.
        synchronous = cluster.is_distributed and not cluster.has_ps
        with preemption.watch(can_defer=not synchronous):
            watched = True
            report = job_lib.run(config, cluster, started=STARTED, tracker=tracker)
        if not cluster.is_chief:
            return 0
    except preemption.Preempted as e:
        print(preemption.stopped_line(e.signum, str(e)), file=sys.stderr)
        return preemption.exit_code(e.signum)
    except KeyboardInterrupt:  # Ctrl-C outside `preemption.watch`: before it, or just after
        what = (
            "SIGINT after the work had ended; what it finished is saved"
            if watched
            else "SIGINT before any work"
        )
        print(preemption.stopped_line(signal.SIGINT, what), file=sys.stderr)
        return preemption.exit_code(signal.SIGINT)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"training stopped: {e}", file=sys.stderr)
        return 1
    print(report_lib.table(report))
    return 0


def run():
    """The `python -m trainer.task` entry point: parses the flags (absl), then trains, or
    evaluates on an evaluator replica. Bad input exits with code 2 and one line."""
    logging.set_verbosity(logging.INFO)
    if not VERBOSE:
        console.plain_lines()
    if {"-h", "--help", "--helpshort"} & set(sys.argv[1:]):  # absl's own --help exits with 1
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    app.run(main)


if __name__ == "__main__":
    run()
