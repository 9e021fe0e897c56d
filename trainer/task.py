"""Entry point: `python -m trainer.task [flags]`.

Parses the flags (each defined once, in trainer/flags.py), builds the frozen `RunConfig`, and
calls `job_lib.run(config)`. With no flags it trains on the census data shipped in the package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import signal
import sys
import time
from collections.abc import Iterator

STARTED = time.monotonic()  # before the imports: a --time_budget_secs counts them

from absl import app, logging
from absl import flags as absl_flags

from trainer import flags
from trainer.distribute.environment import Environment
from trainer.errors import InputError
from trainer.reporting import console

FLAGS = absl_flags.FLAGS
flags.define(FLAGS)  # every flag, as trainer/flags.py defines it
absl_flags.adopt_module_key_flags(flags)  # `--help` lists them as this module's


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, but a flag it cannot parse (`--batch_size=abc`, an unknown flag) or an
    argument that is not a flag is bad input like any other: one line and exit 2 (absl's own
    parser exits 1)."""
    try:
        rest = FLAGS(argv)
    except absl_flags.Error as e:
        print(f"{e}. Pass --help to see the flags.", file=sys.stderr)
        sys.exit(2)
    if len(rest) > 1:
        print(f"unexpected arguments {rest[1:]}; all options are --flags.", file=sys.stderr)
        sys.exit(2)
    return rest


def _usage_if_asked() -> None:
    """`--help` prints the flags and exits 0 (absl's own --help exits with 1)."""
    if {"-h", "--help", "--helpshort"} & set(sys.argv[1:]):
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)


if __name__ == "__main__":
    # `--help`, flags that cannot be parsed or break their own rule, and a malformed TF_CONFIG
    # answer at once, before TensorFlow loads (5 s); `build_config` checks the combinations.
    _usage_if_asked()
    _parse_flags(sys.argv)
    try:
        flags.check({name: FLAGS[name].value for name in flags.BY_NAME})
        Environment.from_environ()  # TF_CONFIG and Vertex AI's variables
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    # The libraries' noise is off before TensorFlow loads (below).
    VERBOSE = console.quiet_libraries()
else:
    VERBOSE = True

from trainer import config as config_lib
from trainer import ensemble as ens
from trainer import model
from trainer.config import ImportanceOptions, TrainOptions
from trainer.distribute import cluster as cluster_lib
from trainer.distribute import preemption
from trainer.distribute import runtime as distributed
from trainer.errors import TrainingError
from trainer.input import dates, splits
from trainer.input import files as files_lib
from trainer.input.options import BadRows, BigQueryConnection, InputOptions, SplitOptions
from trainer.input.schema import ColumnChoices, HeadType
from trainer.job import evaluator
from trainer.job import job as job_lib
from trainer.reporting import experiments
from trainer.reporting import report as report_lib
from trainer.search import adapt
from trainer.storage import files as storage
from trainer.storage import lease
from trainer.storage.job_dir import JobDir
from trainer.storage.paths import OutputDirs

DEFAULT_LAYER_SIZE: int = flags.BY_NAME["layer_size"].default  # read by bench/cluster.py


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


def _date_columns(values: list[str]) -> tuple[tuple[str, str], ...]:
    """--date_columns' (name, format) pairs."""
    pairs = []
    for value in values:
        name, _, fmt = value.partition(":")
        fmt = fmt.strip().lower() or "iso"
        if fmt not in dates.FORMATS:
            raise InputError(
                f"--date_columns={value}: format '{fmt}' is not one of "
                f"{', '.join(dates.FORMATS)} (iso: 2024-03-01 09:00, mdy: 3/1/2024, dmy: 1/3/2024)."
            )
        pairs.append((name.strip(), fmt))
    return tuple(pairs)


def _split(f, train_data: str) -> SplitOptions:
    """The split users chose (flags) of `train_data`, checked against the data flags it
    replaces."""
    try:
        fractions = tuple(float(x) for x in f.split_fractions)
    except ValueError:
        raise InputError(
            f"--split_fractions={','.join(f.split_fractions)}: give three numbers."
        ) from None
    split = SplitOptions(
        column=f.split_column or None,
        timestamp_column=f.timestamp_split_column or None,
        fractions=fractions,  # type: ignore[arg-type]
        source=train_data,
    )
    if split.enabled and (f.eval_data or f.test_data):
        raise InputError(
            f"--{'split_column' if split.column else 'timestamp_split_column'} gives the eval "
            "and test rows: drop --eval_data and --test_data, or the split."
        )
    return split


def build_config(f=FLAGS, environment: Environment | None = None) -> config_lib.RunConfig:
    """Turns flags into the frozen run configuration: each flag checked by its rule
    (trainer/flags.py), then their combinations."""
    environment = environment or Environment()
    values = {name: f[name].value for name in flags.BY_NAME}
    flags.check(values)
    outputs = _output_dirs(f, environment)
    sources = _sources(f, environment, job_dir=outputs["job_dir"])
    generator = model.make_generator(
        f.generator, model.GeneratorOptions(**flags.fields_of(model.GeneratorOptions, values))
    )
    strategies = tuple(
        ens.STRATEGIES[n]
        for n in _choice("ensemble_strategies", f.ensemble_strategies, ens.STRATEGIES)
    )
    return config_lib.RunConfig(
        **flags.fields_of(config_lib.RunConfig, values),
        auto=frozenset(name for name in adapt.ADAPTIVE_FLAGS if not f[name].present),
        data=config_lib.DataConfig(
            **flags.fields_of(config_lib.DataConfig, values),
            train_data=sources.train,
            eval_data=sources.eval,
            test_data=sources.test,
            split=sources.split,
            columns=_columns(f, sources.label, sources.split),
            input=InputOptions(
                bad_rows=BadRows(f.bad_rows),
                cache_mb=f.cache_mb,
                shuffle_buffer=f.shuffle_buffer,
                bigquery=BigQueryConnection(
                    project=environment.project, emulator_host=environment.bigquery_emulator_host
                ),
                jsonl=sources.jsonl,
            ),
        ),
        search=config_lib.SearchConfig(
            **flags.fields_of(config_lib.SearchConfig, values),
            generator=generator,
            ensemblers=_ensemblers(f),
            strategies=strategies,
        ),
        train=TrainOptions(**flags.fields_of(TrainOptions, values)),
        **outputs,
        importance=ImportanceOptions(**flags.fields_of(ImportanceOptions, values)),
        calibration=config_lib.CalibrationOptions(
            **flags.fields_of(config_lib.CalibrationOptions, values)
        ),
        hypertune_metric=(f.hypertune_metric or "") if environment.is_tuning else None,
        distribution=config_lib.DistributionConfig(
            **flags.fields_of(config_lib.DistributionConfig, values)
        ),
    )


@dataclasses.dataclass(frozen=True)
class _Sources:
    """Where the job's rows come from, and the column to predict."""

    train: str
    eval: str | None
    test: str | None
    label: str
    split: SplitOptions
    jsonl: bool  # every file read as JSON Lines, whatever its name (a JSONL managed dataset)


def _sources(f, environment: Environment, *, job_dir: str) -> _Sources:
    """The data flags, a Vertex managed dataset (AIP_*_DATA_URI) or the embedded census data;
    with a split, the split files the job writes into its job dir."""
    train_data, eval_data, label = f.train_data, f.eval_data, f.label_column
    test_data = f.test_data
    jsonl = False
    if train_data is None and environment.training_data_uri:  # a Vertex managed dataset
        jsonl = (environment.data_format or "").strip().lower() == "jsonl"
        train_data, validation, test = files_lib.managed_dataset(
            environment.data_format,
            training=environment.training_data_uri,
            validation=environment.validation_data_uri,
            test=environment.test_data_uri,
        )
        eval_data = eval_data or validation
        test_data = test_data or test
        if not label:
            raise InputError(
                f"--label_column is required with a managed dataset ({train_data}): name "
                "the column to predict."
            )
    elif train_data is None and (f.split_column or f.timestamp_split_column):
        raise InputError("--split_column and --timestamp_split_column split --train_data: give it.")
    elif train_data is None:
        train_data = files_lib.CENSUS_TRAIN
        eval_data = eval_data or files_lib.CENSUS_TEST
        label = label or files_lib.CENSUS_LABEL
    elif not label:
        raise InputError(
            "--label_column is required with --train_data: name the column to predict."
        )
    split = _split(f, train_data)
    if split.enabled:  # the job reads the split files it writes into its job dir
        fmt = splits.input_format(train_data, jsonl=jsonl)
        at = splits.paths(job_dir, fmt)
        train_data, eval_data, test_data = at["train"], at["validate"], at["test"]
    return _Sources(train_data, eval_data, test_data, label, split, jsonl)


def _ensemblers(f) -> tuple:
    """The ensemblers of --ensemblers, with the flags only complexity_regularized takes
    refused elsewhere."""
    ensembler_names = _choice("ensemblers", f.ensemblers, ens.ENSEMBLERS)
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
    options = ens.EnsemblerOptions(
        mixture_weight_type=ens.MixtureWeightType(f.mixture_weight_type),
        adanet_lambda=f.adanet_lambda,
        adanet_beta=f.adanet_beta,
        use_bias=f.use_bias,
        learn_mixture_weights=f.learn_mixture_weights,
        warm_start_mixture_weights=f.warm_start_mixture_weights,
    )
    return tuple(ens.ENSEMBLERS[name].from_options(options) for name in ensembler_names)


def _columns(f, label: str, split: SplitOptions) -> ColumnChoices:
    """What the column flags say of the table's columns (a split column is not a feature)."""
    overlapping = set(f.numeric_columns) & set(f.categorical_columns)
    if overlapping:
        raise InputError(
            f"column(s) {sorted(overlapping)} are in both --numeric_columns and "
            "--categorical_columns; name each column once."
        )
    return ColumnChoices(
        label=label,
        numeric=tuple(f.numeric_columns),
        categorical=tuple(f.categorical_columns),
        dates=_date_columns(f.date_columns),
        ignore=tuple(f.ignore_columns) + ((split.column,) if split.column else ()),
        head=None if f.head == "auto" else HeadType(f.head),
        num_bins=f.num_bins,
        max_vocabulary_size=f.max_vocabulary_size,
        one_hot_max_size=f.one_hot_max_size,
        embedding_dim=f.embedding_dim,
        weight=f.weight_column or None,
        missing_indicators=f.missing_indicators,
    )


def _output_dirs(f, environment: Environment) -> dict:
    """job_dir, model_dir, checkpoint_dir, log_dir: flags, then AIP_*, then runs/adanet."""
    outputs = OutputDirs.resolve(
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
    values = {name: f[name].value for name in flags.BY_NAME if not name.startswith("experiment")}
    return experiments.VertexExperiment(target, params=experiments.params_of(values))


@contextlib.contextmanager
def _lease(
    config: config_lib.RunConfig, environment: Environment, cluster: cluster_lib.Cluster
) -> Iterator[None]:
    """The job dir's lease (`trainer/storage/lease.py`), held by the replica that writes it
    (the chief, or the one machine; the cluster's other replicas share it) and released
    however the run ends, a signal's immediate exit included."""
    if not cluster.is_chief:
        yield
        return
    root = JobDir.of(config.outputs).root
    storage.check_writable(root, flag="--job_dir")  # a bad path is named before the lease
    job = "/".join(filter(None, (environment.job_id, environment.trial_id)))
    held = lease.take(root, job=job)
    with held, preemption.before_exit_now(held.release):
        yield


def _job_complete(config: config_lib.RunConfig) -> str | None:
    """The evaluator's line when its job is complete (the cluster then stops it), else None."""
    if JobDir.of(config.outputs).complete_report() is None:
        return None
    return "evaluator: stopped at the end of the job, which is complete."


def main(argv):
    del argv  # nothing but flags (`_parse_flags`)
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
            # Nothing to save: SIGTERM or Ctrl-C ends it at once; after a complete job, as the
            # cluster's end stops it, normally.
            with preemption.watch(ended=functools.partial(_job_complete, config)):
                watched = True
                evaluator.run(config, chief=chief)
            return 0
        # SIGTERM (a Spot VM's preemption) or Ctrl-C: a checkpoint, then exit 143 (130) so that
        # Vertex AI restarts this replica. A synchronous cluster's replica cannot checkpoint
        # alone: it just stops.
        synchronous = cluster.is_distributed and not cluster.has_ps
        with preemption.watch(can_defer=not synchronous), _lease(config, environment, cluster):
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
    # The imports' objects (TensorFlow and Keras: about a million) are kept for good: moved
    # out of the collector's generations, so a full collection does not walk them each time.
    gc.freeze()
    logging.set_verbosity(logging.INFO)
    if not VERBOSE:
        console.plain_lines()
    _usage_if_asked()
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
