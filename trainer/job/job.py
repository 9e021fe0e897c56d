"""The job: the input once, then the iterations (`trainer/job/controller.py`), the export,
the exported model's metrics and the report.

`run(config, cluster)` is the whole job as one replica of its cluster. Everything that can be
wrong with the user's input is checked before the job dir is touched (the chief's statistics
pass reads all of it); after that, every step is resumable: finished iterations are recorded
(`trainer/storage/job_dir.py`), the running one is checkpointed periodically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

import tensorflow as tf
from absl import logging

from trainer import config as config_lib
from trainer import ensemble as ens
from trainer.config import RunConfig
from trainer.distribute import runtime as distributed
from trainer.distribute.cluster import Cluster
from trainer.distribute.loops import LoopMaker
from trainer.errors import InputError, TrainingError
from trainer.evaluation import calibration as calibration_lib
from trainer.evaluation import exported
from trainer.input import job_input as input_lib
from trainer.input import splits
from trainer.input.features import Preprocessor
from trainer.job import bagging, ending
from trainer.job.controller import Controller
from trainer.model.heads import Head
from trainer.placement import Placement
from trainer.reporting import leaderboard
from trainer.reporting import report as report_lib
from trainer.reporting.experiments import Tracker
from trainer.search import adapt
from trainer.search import record as record_lib
from trainer.search.budget import TimeBudget
from trainer.search.factory import Models
from trainer.serving import export as export_lib
from trainer.serving import monitoring
from trainer.storage import files as storage
from trainer.storage import job_dir as job_dir_lib


def prepare_input(
    config: RunConfig, job: job_dir_lib.JobDir, role: input_lib.Role | None = None
) -> input_lib.JobInput:
    """The input of the job `config` describes, in job dir `job`, as replica `role` (default:
    the chief) opens it (`trainer.input.job_input.prepare`)."""
    data = config.data
    return input_lib.prepare(
        train_data=data.train_data,
        eval_data=data.eval_data,
        columns=data.columns,
        holdout_fraction=data.holdout_fraction,
        options=data.input,
        seed=config.seed,
        job=job,
        role=role or input_lib.Role.chief(),
        holdout_fold=config.bag,
        test_data=data.test_data,
        validation=data.split.enabled,
    )


def _train(
    config: RunConfig,
    data: input_lib.JobInput,
    job: job_dir_lib.JobDir,
    runtime: distributed.Runtime,
    *,
    started: float,
    timing: dict,
    adapted: dict,
    budget: TimeBudget | None,
    tracker: Tracker | None = None,
) -> dict:
    """Runs the iterations (the chief: then exports, evaluates and reports); returns the
    report (the chief's; {} on other replicas). `timing`: the startup's and the input's
    seconds, for the report."""
    models = Models(
        config,
        data.schema,
        strategy=runtime.strategy,
        layout=runtime.layout,
        checkpoint_options=runtime.checkpoint_options,
    )
    loops = LoopMaker(
        runtime=runtime,
        data=data,
        batch_size=config.train.batch_size,
        seed=config.training_seed,
        steps_per_loop=config.steps_per_loop,
        stall_secs=config.distribution.stall_secs,
        chunk_secs=config.distribution.chunk_secs,
        budget=config.search.max_iteration_steps,
    )
    writes = job_dir_lib.ReplicaWrites(job, chief=runtime.is_chief)
    controller = Controller(
        config=config,
        models=models,
        data=data,
        writes=writes,
        loops=loops,
        started=started,
        budget=budget,
    )
    reporter = _Reporter(config, data, job, controller, loops, timing, adapted, budget)
    if runtime.is_chief and job.complete_report():  # resumed: "training" until it is done
        reporter.write(records=record_lib.finished(job))
    for record in controller.iterations():
        if runtime.is_chief:
            reporter.write()
            if tracker:
                tracker.on_iteration(record)
    writes.close()
    if not runtime.is_chief:
        return {}
    ending_started = time.monotonic()
    records = controller.records
    source = _export(config, data, job, controller, models.head)
    ended = _evaluate_export(config, data, job, models.head, budget, records, source)
    value = reporter.write(
        final=ended.final,
        importance=ended.importance,
        calibration=ended.calibration,
        test=ended.test,
        ending_seconds=time.monotonic() - ending_started,
    )
    return ending.publish(
        job,
        value,
        leaderboard_png=leaderboard.plot(
            value["iterations"], models.head.objective_metric, ended.final.get("constant")
        ),
        head=models.head,
        hypertune_metric=config.hypertune_metric,
        steps=sum(r.steps for r in records),
        tracker=tracker,
    )


@dataclasses.dataclass(frozen=True)
class _Reporter:
    """Writes the job's report.json: while it trains (no final metrics yet), and at its end."""

    config: RunConfig
    data: input_lib.JobInput
    job: job_dir_lib.JobDir
    controller: Controller
    loops: LoopMaker
    timing: dict
    adapted: dict
    budget: TimeBudget | None

    def write(
        self,
        *,
        final: dict | None = None,
        importance: dict | None = None,
        calibration: dict | None = None,
        records: list | None = None,
        ending_seconds: float | None = None,
        test: dict | None = None,
    ) -> dict:
        summary = self.data.schema.summary
        value = report_lib.build_report(
            config=self.config,
            schema=self.data.schema,
            records=self.controller.records if records is None else records,
            final=final,
            job=self.job,
            input_summary={
                **self.data.reads(list(self.loops.readers())),
                "bad_rows": report_lib.bad_rows(summary),
                "statistics": summary.get("statistics"),
                "warnings": summary.get("warnings", []),
            },
            timing={
                **self.timing,
                "first_step_seconds": self.controller.first_step_seconds,
                "ending_seconds": ending_seconds,
            },
            budget=self.budget.to_json() if self.budget else None,
            adapted=self.adapted,
            feature_importance=importance,
            calibration=calibration,
            test=test,
        )
        job_dir_lib.write_json(self.job.report, value)
        return value


def _export(
    config: RunConfig,
    data: input_lib.JobInput,
    job: job_dir_lib.JobDir,
    controller: Controller,
    head: Head,
) -> dict:
    """Exports the chosen ensemble, calibrated, unless the model dir holds it already (a
    resumed job); returns what the export is of (its `source`)."""
    records = controller.records
    source = {
        "iterations": len(records),
        "chosen": records[-1].chosen,
        **config.calibration.to_json(),
    }
    if job.exported_from() == source:
        return source
    # A copy on this machine, under no strategy: the SavedModel holds plain variables wherever
    # training kept them (parameter servers, mirrored replicas).
    local = controller.restore(records, local=True)
    fitted = calibration_lib.calibrate(
        local,
        head,
        data.calibration_rows(),
        method=config.calibration.method,
        objective=config.calibration.objective,
    )
    model = export_lib.ServingModel(
        Preprocessor(data.schema), local, fitted.head, fitted.temperature
    )
    baseline = monitoring.files(data.schema, config.data.train_data, jsonl=config.data.input.jsonl)
    export_lib.export(model, job, source, fitted.to_json(), extras=baseline)
    logging.info("Exported the chosen ensemble of iteration %d to %s", len(records) - 1, job.model)
    return source


@dataclasses.dataclass(frozen=True)
class _Evaluated:
    final: dict
    test: dict | None
    importance: dict | None
    calibration: dict


def _evaluate_export(
    config: RunConfig,
    data: input_lib.JobInput,
    job: job_dir_lib.JobDir,
    head: Head,
    budget: TimeBudget | None,
    records: list,
    source: dict,
) -> _Evaluated:
    """The exported model, loaded back, on the eval rows (and the test data), its feature
    importance, and its calibration's figures on the eval rows."""
    calibration = job.exported_calibration() or {}
    deciding = calibration_lib.deciding(head, calibration)
    serve = export_lib.load_serving_fn(job.model)
    # A bag keeps its predictions on its hold-out fold for the bagged job's out-of-bag metrics
    # (trainer/job/bagging.py; with --eval_data the bagged model is evaluated on it instead).
    bag_keeps = config.bag is not None and not data.eval_data
    # The calibration's figures on the eval rows need their logits (a few numbers a row), kept
    # up to a bound: a larger stream of eval rows is not held in memory for them.
    on_eval = "before" in calibration and data.eval_rows <= calibration_lib.EVAL_ROWS_KEPT
    predictions: list[exported.Batch] = []
    keep = predictions.extend if bag_keeps or on_eval else None
    final = exported.evaluate_export(serve, data, deciding, keep=keep)
    test = exported.evaluate_test(serve, data, deciding)
    if bag_keeps:
        exported.save_predictions(job.eval_predictions, predictions, source=source)
    if on_eval and predictions:
        calibration["eval"] = calibration_lib.on_eval(
            deciding, predictions, calibration["temperature"]
        )
    search_seconds = sum(r.seconds.total for r in records)
    importance = exported.feature_importance(config, serve, data, deciding, budget, search_seconds)
    return _Evaluated(final, test, importance, calibration)


def check_cluster(config: RunConfig, cluster: Cluster) -> None:
    """The rules of flags and cluster shapes: InputError for a job this cluster cannot run
    (a placement without parameter servers, bags on a cluster, a time budget on synchronous
    replicas)."""
    placement = config.distribution.placement
    if cluster.is_distributed and not cluster.has_ps and placement is not Placement.REPLICATION:
        raise InputError(
            f"--placement={placement.value} needs parameter servers (a ps pool: "
            "workerPoolSpecs[2]); a cluster of workers alone trains "
            "synchronously, every worker on everything. Use "
            "--placement=replication or add parameter servers."
        )
    if config.bags > 1 and cluster.is_distributed:
        raise InputError(
            f"--bags={config.bags} trains its bags one after the other on one machine; a "
            "cluster trains one search. Drop --bags, or run on one machine."
        )
    if config.time_budget_secs and cluster.is_distributed and not cluster.has_ps:
        raise InputError(
            "--time_budget_secs needs one machine or parameter servers: synchronous replicas "
            "(workers without parameter servers) would each decide on their own clock."
        )


def _runtime(config: RunConfig, cluster: Cluster) -> distributed.Runtime:
    return distributed.make_runtime(
        cluster,
        config.distribution.placement.strategy(),
        timeout_secs=config.distribution.cluster_timeout_secs,
    )


def _start_job_dir(
    config: RunConfig,
    resolved: RunConfig,
    job: job_dir_lib.JobDir,
    data: input_lib.JobInput,
    shape: adapt.Shape,
) -> None:
    """Creates the job dir (removing what a crash left), and on a new job writes its schema,
    the flags a resume must match (`config`), what they resolved to (`resolved`) and the
    cluster they were resolved for (`shape`: the evaluator resolves its flags for the same)."""
    job.create()
    if not job.exists():
        job_dir_lib.write_atomically(job.schema, data.schema.to_json())
        job_dir_lib.write_json(
            job.run,
            {
                "fingerprint": config.fingerprint(),
                "resolved": resolved.fingerprint(),
                "resolved_for": dataclasses.asdict(shape),
            },
        )


def run(
    config: RunConfig,
    cluster: Cluster | None = None,
    *,
    started: float | None = None,
    tracker: Tracker | None = None,
) -> dict:
    """Trains (or resumes) the job described by `config` as this replica of `cluster`
    (`_run`); a full disk is a TrainingError that says so (what is finished is kept).
    Arguments, return value and exceptions: `_run`'s."""
    try:
        return _run(config, cluster, started=started, tracker=tracker)
    except (tf.errors.ResourceExhaustedError, OSError) as e:
        if not storage.is_disk_full(e):  # (memory, or Cloud Storage's rate limit)
            raise
        if isinstance(e, OSError):
            where = e.filename or "a file"
        else:  # "{{function_node ...}} PATH; No space left on device [Op:SaveV2]"
            where = e.message.split("}} ", 1)[-1].split("; No space left")[0].strip()
        raise TrainingError(
            f"the disk is full: writing {where} failed (no space left on device). Free "
            "space there, or give another --job_dir to start afresh; run the same command "
            "again to resume: finished iterations are kept."
        ) from None


def _run(
    config: RunConfig,
    cluster: Cluster | None = None,
    *,
    started: float | None = None,
    tracker: Tracker | None = None,
) -> dict:
    """Trains (or resumes) the job described by `config` as this replica of `cluster`.

    Args:
        config: the run's settings (`trainer.task` builds them from flags).
        cluster: this replica's role and cluster (`trainer.distribute.cluster.parse`); None: one
            machine, no cluster.
        started: when the process began (time.monotonic()): where --time_budget_secs
            counts from (default: now).
        tracker: the chief's experiment tracker (`trainer.reporting.experiments`): told when
            training starts (the input checked), each iteration's record and the final report.

    Returns:
        The report (`JOB_DIR/report.json`) on the chief; {} on other replicas.

    Raises:
        InputError: bad flags, data or job dir, found before any work starts.
        TrainingError: training started but cannot go on (see `trainer.errors`); finished
            iterations stay in the job dir.
    """
    cluster = cluster or Cluster()
    job = _open_job_dir(config, cluster)
    budget = _budget(config, cluster, started)
    startup_seconds = None if started is None else time.monotonic() - started
    started = time.monotonic()
    # Synchronous replicas (MultiWorkerMirroredStrategy) must start their collectives before
    # any TensorFlow op runs: their cluster starts first, then the chief scans the data and
    # the others wait for the schema it writes. Elsewhere all input is checked first, and a
    # cluster that never starts leaves nothing written.
    synchronous = cluster.is_distributed and not cluster.has_ps
    runtime = _runtime(config, cluster) if synchronous else None
    replicas = runtime.strategy.num_replicas_in_sync if runtime else 1
    adapt.check_global_batch(config, replicas)
    data = prepare_input(config, job, _role(config, cluster))
    input_seconds = time.monotonic() - started
    timing = {"startup_seconds": startup_seconds, "input_seconds": input_seconds}
    _check_hypertune_metric(config, data)
    flags_config = config
    shape = adapt.Shape(one_machine=not cluster.is_distributed, replicas=replicas)
    config, adapted = _resolve(config, data, job, shape, chief=cluster.is_chief)
    if config.bags > 1:
        _start_job_dir(flags_config, config, job, data, shape)
        return bagging.run(
            flags_config,
            config,
            data,
            job,
            run_one=run,
            budget=budget,
            adapted=adapted,
            input_seconds=input_seconds,
            tracker=tracker,
        )
    data = data.for_selection(on_holdout=config.search.selection is ens.Selection.HOLDOUT)
    _check_decision_objective(config, data)
    runtime = runtime or _runtime(config, cluster)
    if cluster.is_chief:  # from here on the job dir is written, by the chief alone
        _start_job_dir(flags_config, config, job, data, shape)
        if tracker:
            tracker.on_start()
    with _training_errors(cluster):
        return _train(
            config,
            data,
            job,
            runtime,
            started=started,
            timing=timing,
            adapted=adapted,
            budget=budget,
            tracker=tracker if cluster.is_chief else None,
        )


def _budget(config: RunConfig, cluster: Cluster, started: float | None) -> TimeBudget | None:
    """The chief's --time_budget_secs, counted from `started` (default: now)."""
    if not (config.time_budget_secs and cluster.is_chief):
        return None
    return TimeBudget(config.time_budget_secs, time.monotonic() if started is None else started)


def _open_job_dir(config: RunConfig, cluster: Cluster) -> job_dir_lib.JobDir:
    """The job dir, checked before any input is read (after the chief made the split files
    every replica reads: `--split_column` and its kin)."""
    job = job_dir_lib.JobDir.of(config.outputs)
    storage.preflight(outputs=job.output_flags(), inputs=config.data.input_flags())
    split = config.data.split
    if split.enabled and cluster.is_chief:  # before any other input is opened: it reads them
        splits.write(split, split.source or "", config.data.input, job.root)
    elif split.enabled:
        splits.wait_for(job.root, config.distribution.cluster_timeout_secs)
    check_cluster(config, cluster)
    config_lib.check_resumable(config, job)
    job.check_model_dir()
    return job


def _role(config: RunConfig, cluster: Cluster) -> input_lib.Role:
    """How this replica opens the input (ps workers read files, never a table's streams)."""
    stage_tables = cluster.has_ps
    if cluster.is_chief:
        return input_lib.Role.chief(stage_tables=stage_tables)
    return input_lib.Role.worker(
        config.distribution.cluster_timeout_secs, stage_tables=stage_tables
    )


def _check_hypertune_metric(config: RunConfig, data: input_lib.JobInput) -> None:
    metrics = Head(data.schema.label).metric_names
    if config.hypertune_metric and config.hypertune_metric not in metrics:
        raise InputError(
            f"--hypertune_metric={config.hypertune_metric} is not an eval metric "
            f"of a {data.schema.label.head.value} head; choose from "
            f"{', '.join(metrics)}."
        )


def _resolve(
    config: RunConfig,
    data: input_lib.JobInput,
    job: job_dir_lib.JobDir,
    shape: adapt.Shape,
    *,
    chief: bool,
) -> tuple[RunConfig, dict]:
    """The flags left to the data's size resolved (`trainer.search.adapt`), each said in the
    log, and (the chief) checked against what a resumed job resolved them to."""
    config, adapted = adapt.resolve(config, data.train_rows, data.schema.label.head, shape=shape)
    if "bags" in adapted and record_lib.finished(job):  # a job dir of one search, before --bags
        config = dataclasses.replace(config, bags=1)
        del adapted["bags"]
        logging.info("The job in --job_dir began as one search: it resumes as one (no bags).")
    for flag, change in adapted.items():
        logging.info("--%s=%s (%s).", flag, change["value"], change["why"])
    if chief:
        config_lib.check_resolved(config, job)
    return config, adapted


def _check_decision_objective(config: RunConfig, data: input_lib.JobInput) -> None:
    objective = config.calibration.objective
    if objective.chosen_on_rows and not data.has_calibration_rows:
        raise InputError(
            f"--decision_objective={objective} chooses a threshold on rows held out from "
            "training, and the search chooses on --eval_data, which stays a test set: add "
            "--selection=holdout (it holds training rows out), or give --decision_objective="
            "threshold=T."
        )


@contextlib.contextmanager
def _training_errors(cluster: Cluster) -> Iterator[None]:
    """TensorFlow's errors of a changed input or a lost replica, as TrainingErrors that say so."""
    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        if "a row that cannot be used" not in str(e):
            raise
        raise TrainingError(
            f"the input changed since its scan: {e.message.splitlines()[0]}"
        ) from None
    except distributed.LOST_REPLICA_ERRORS as e:
        if not cluster.is_distributed:
            raise
        raise distributed.lost_replica(e) from None
