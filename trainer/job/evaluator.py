"""The evaluator replica: evaluates each new checkpoint on the eval data, outside the cluster.

It reads what the chief writes to the job dir (never the cluster's servers): the schema, the
finished iterations' records and frozen ensembles, and the periodic checkpoints of the running
iteration. It rebuilds the models from the schema and the flags, and reads only the eval rows
(streamed, each once per evaluation); it never reads the training data (unless the eval rows
are held out of it). For each new checkpoint it computes every candidate's and every new
subnetwork's eval metrics and writes them to `eval/iteration-<t>.json` (one entry per
checkpoint) and to TensorBoard (`evaluator/` figures in `logs/candidates/<candidate>`, at the
chief's steps counted across iterations). Each finished iteration's entries end with one
evaluation of its frozen chosen ensemble, the metrics of what the iteration kept (a periodic
checkpoint may be from any step, even before a subnetwork has trained; under round-robin
placement the ensemble's and the subnetworks' steps differ, so each entry gives both). An
evaluator that starts late, or restarts, adds only the closing entries still missing. It stops
once the chief's report says the job is complete, or with an error when the chief never
answers on its address within `--cluster_timeout_secs`, or has been gone for
`--server_grace_secs` with the job incomplete (the bounds workers and parameter servers keep).
A chief without workers or parameter servers runs no server, so there is no address to watch:
the evaluator then waits `--cluster_timeout_secs` for the job dir (which the chief creates once
its input is checked), and after that until the job is complete.
"""

from __future__ import annotations

import dataclasses
import time

import tensorflow as tf
from absl import logging

from trainer import config as config_lib
from trainer.config import RunConfig
from trainer.distribute.cluster import ChiefWatch
from trainer.errors import InputError, TrainingError, first_line
from trainer.evaluation import streaming as evaluation
from trainer.input.job_input import JobInput, Role
from trainer.job import job as job_lib
from trainer.search import adapt
from trainer.search import record as record_lib
from trainer.search.factory import Models
from trainer.search.frozen import builder_name
from trainer.search.record import IterationRecord, finite_metrics
from trainer.storage import job_dir as job_dir_lib


@dataclasses.dataclass(frozen=True)
class _Evaluator:
    job: job_dir_lib.JobDir
    data: JobInput
    models: Models


def run(config: RunConfig, *, chief: ChiefWatch | None, poll_secs: float = 5.0) -> list[dict]:
    """The evaluator replica: evaluates each iteration's checkpoints as the chief writes them,
    and each finished iteration once from its frozen choice, until the job is complete,
    publishing `JOB_DIR/eval/iteration-<t>.json` and TensorBoard events.

    Args:
        config: the run's settings, the same flags as the chief's.
        chief: the chief of the cluster, looked for between two polls (None: a chief that
            runs no server, alone in the cluster or with no cluster at all; then the job dir
            must appear within `--cluster_timeout_secs`, and nothing bounds the wait after).
        poll_secs: how often to look for new checkpoints.

    Returns:
        The evaluations this call made.

    Raises:
        TrainingError: the chief never answered, or has been gone too long (see `chief`), or
            (without `chief`) never created the job dir.
    """
    job = job_dir_lib.JobDir.of(config.outputs)
    timeout_secs = config.distribution.cluster_timeout_secs
    deadline = time.monotonic() + timeout_secs
    while not job.exists():  # the chief creates the job dir once its input is checked
        if chief is None and time.monotonic() > deadline:
            raise TrainingError(
                f"no job in {job.root} after {timeout_secs:.0f} s (--cluster_timeout_secs): "
                f"the chief writes {job.run} once its input is checked, and has not. Check "
                "that the chief is running with the same --job_dir (its logs), or raise "
                "--cluster_timeout_secs if its input takes longer to check."
            )
        logging.info("Evaluator: waiting for the chief to create %s.", job.root)
        _wait(poll_secs, chief)
    data = job_lib.prepare_input(config, job, Role.evaluator())
    config = resolved_as_chief(config, job, data)
    evaluator = _Evaluator(job, data, Models(config, data.schema))
    evaluations, seen = [], set()
    iterations: dict[int, object] = {}  # built once per iteration; checkpoints are read in
    finished = 0  # the finished iterations known to have their closing evaluation on disk
    while True:
        complete = _is_complete(job)
        records = record_lib.finished(job)
        t = len(records)
        for i in range(finished, t):
            if not _closed(job, i):
                evaluation_ = _evaluate_frozen(evaluator, records[: i + 1])
                if evaluation_ is not None:
                    evaluations.append(evaluation_)
                    _publish(job, i, evaluation_)
        finished = t
        latest = _latest_checkpoint(job.iteration_checkpoints(t))
        if latest and latest not in seen:
            seen.add(latest)
            if t not in iterations:
                previous = evaluator.models.restore(records, job) if records else None
                proposal = evaluator.models.search.propose(
                    t, [m.builder for m in previous.members] if previous else []
                )
                iterations = {t: evaluator.models.iteration(proposal, previous)}
            checkpoint_evaluation = _evaluate(evaluator, iterations[t], latest, records)
            if checkpoint_evaluation is not None:
                evaluations.append(checkpoint_evaluation)
                _publish(job, t, checkpoint_evaluation)
        if complete:
            logging.info("Evaluator: the job is complete after %d evaluations.", len(evaluations))
            return evaluations
        _wait(poll_secs, chief)


def resolved_as_chief(config: RunConfig, job: job_dir_lib.JobDir, data: JobInput) -> RunConfig:
    """`config` with the flags the chief left to the data chosen as the chief chose them: for
    the cluster the chief recorded (`resolved_for` in run.json), not this evaluator's (one
    machine, one replica); checked against what the chief recorded it resolved to. A job dir
    of an older version, without the record, is resolved for one machine as it was."""
    run = job_dir_lib.read_json(job.run) if tf.io.gfile.exists(job.run) else {}
    shape = adapt.Shape(**run["resolved_for"]) if "resolved_for" in run else adapt.Shape()
    config, _ = adapt.resolve(config, data.train_rows, data.schema.label.head, shape=shape)
    differ = config_lib.changed_settings(run.get("resolved") or {}, config.fingerprint())
    if differ:
        lines = "; ".join(
            f"{k}: the chief's {old!r}, here {new!r}" for k, (old, new) in differ.items()
        )
        raise InputError(
            f"the evaluator's settings differ from those the chief trained with ({lines}): "
            "give the evaluator the chief's flags."
        )
    return config


def _latest_checkpoint(directory: str) -> str | None:
    """The newest checkpoint its state file names; None while there is none, or while the
    state file cannot be read (damaged: the chief's next checkpoint writes it again)."""
    try:
        return tf.train.latest_checkpoint(directory)
    except Exception as e:  # ValueError or a text_format.ParseError, from the file's text
        logging.info("Evaluator: %s/checkpoint cannot be read (%s); waiting.", directory, e)
        return None


def _evaluate(
    evaluator: _Evaluator, iteration, checkpoint: str, records: list[IterationRecord]
) -> dict | None:
    """`iteration` at `checkpoint`, after the finished `records`."""
    try:
        iteration.checkpoint().read(checkpoint).expect_partial()
    except job_dir_lib.CHECKPOINT_ERRORS as e:
        if not job_dir_lib.is_damage(e):
            raise
        # The chief replaced it meanwhile (it keeps the latest two), or it is damaged.
        logging.info(
            "Evaluator: could not read %s (%s); waiting for the next.", checkpoint, first_line(e)
        )
        return None
    evaluated = evaluation.evaluate_iteration(iteration, evaluator.data.eval_encoded())
    result = {
        "iteration": iteration.number,
        "step": int(iteration.step.numpy()),
        "subnetwork_steps": {
            s.name: int(n)
            for s, n in zip(iteration.subnetworks, iteration.subnetwork_steps.numpy())
        },
        "checkpoint": checkpoint,
        "examples": evaluated.examples,
        "candidates": {
            c.name: finite_metrics(m) for c, m in zip(iteration.candidates, evaluated.candidates)
        },
        "subnetworks": {
            s.name: finite_metrics(m) for s, m in zip(iteration.subnetworks, evaluated.subnetworks)
        },
    }
    _summarize(evaluator.job, result, records)
    return result


def _evaluate_frozen(evaluator: _Evaluator, records: list[IterationRecord]) -> dict | None:
    """The last of `records`' iterations, finished: its chosen ensemble, frozen (None: its
    frozen weights are damaged; the chief trains it again)."""
    record = records[-1]
    try:
        frozen = evaluator.models.restore(records, evaluator.job)
    except job_dir_lib.CHECKPOINT_ERRORS as e:
        if not job_dir_lib.is_damage(e):
            raise
        logging.warning(
            "Evaluator: the frozen weights of iteration %d cannot be read (%s); skipped.",
            record.iteration,
            first_line(e),
        )
        return None
    metrics = evaluation.evaluate_frozen(
        frozen, evaluator.models.head, evaluator.data.eval_encoded()
    )
    result = {
        "iteration": record.iteration,
        "step": record.steps,
        "subnetwork_steps": {s.name: s.steps for s in record.subnetworks},
        "checkpoint": evaluator.job.frozen_prefix(record.iteration),
        "examples": metrics.count,
        "candidates": {record.chosen: finite_metrics(metrics.result())},
        "subnetworks": {},
    }
    _summarize(evaluator.job, result, records[:-1])
    return result


def _summarize(job: job_dir_lib.JobDir, evaluation: dict, before: list[IterationRecord]) -> None:
    """Writes an evaluation to TensorBoard and logs its best candidate: in the chief's runs
    (`trainer.reporting.progress.SummaryWriters`), at its steps, counted across iterations
    from those of the finished ones `before` this one."""
    t, step = evaluation["iteration"], evaluation["step"]
    first_step = sum(r.steps for r in before)
    for group in ("candidates", "subnetworks"):
        for name, metrics in evaluation[group].items():
            run = name if group == "candidates" else builder_name(name)
            writer = tf.summary.create_file_writer(job_dir_lib.join(job.logs, group, run))
            with writer.as_default(step=first_step + step):
                for metric, value in metrics.items():
                    if value is not None:
                        tf.summary.scalar(f"evaluator/{metric}", value)
            writer.close()
    finite = [
        (m["loss"], name) for name, m in evaluation["candidates"].items() if m["loss"] is not None
    ]
    if finite:
        loss, name = min(finite)
        logging.info(
            "Evaluator: iteration %d step %d: best eval loss %.4f (%s).", t, step, loss, name
        )


def _eval_path(job: job_dir_lib.JobDir, t: int) -> str:
    return job_dir_lib.join(job.eval, f"iteration-{t}.json")


def _closed(job: job_dir_lib.JobDir, t: int) -> bool:
    """Whether finished iteration `t`'s evaluations already end with its frozen choice."""
    history = _history(_eval_path(job, t))
    return bool(history) and history[-1]["checkpoint"] == job.frozen_prefix(t)


def _publish(job: job_dir_lib.JobDir, t: int, evaluation: dict) -> None:
    tf.io.gfile.makedirs(job.eval)
    path = _eval_path(job, t)
    job_dir_lib.write_json(path, _history(path) + [evaluation])


def _history(path: str) -> list[dict]:
    """An iteration's evaluations so far; none where the file is missing, or damaged (said:
    the next evaluation writes it again, whole)."""
    if not tf.io.gfile.exists(path):
        return []
    try:
        return job_dir_lib.read_json(path)
    except job_dir_lib.Damaged as e:
        logging.warning("Evaluator: %s Its evaluations start again.", e)
        return []


def _is_complete(job: job_dir_lib.JobDir) -> bool:
    """Whether the chief has written report.json of a complete job (a damaged one is not:
    the chief writes it again at the end)."""
    if not tf.io.gfile.exists(job.report):
        return False
    try:
        return job_dir_lib.read_json(job.report).get("status") == "complete"
    except job_dir_lib.Damaged as e:
        logging.info("Evaluator: %s Waiting for the chief's next.", e)
        return False


def _wait(seconds: float, chief: ChiefWatch | None) -> None:
    """Sleeps, then raises if the chief never came or has gone for good."""
    time.sleep(seconds)
    if chief is None:
        return
    try:
        gone = chief.gone()
    except TimeoutError as e:
        raise TrainingError(str(e)) from None
    if gone:
        raise TrainingError(
            f"the chief at {chief.address} has been gone for more than {chief.grace_secs:.0f} s "
            "(--server_grace_secs) and the job is not complete. Restart the chief (it resumes "
            "the job) and then the evaluator."
        )
