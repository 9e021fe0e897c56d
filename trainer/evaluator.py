"""The evaluator replica: evaluates each new checkpoint on the eval data, outside the cluster.

It reads what the chief writes to the job dir (never the cluster's servers): the finished
iterations' records and frozen ensembles, and the periodic checkpoints of the running
iteration. For each new checkpoint it computes every candidate's and every new subnetwork's
eval metrics and writes them to `eval/iteration-<t>.json` (one entry per checkpoint) and to
TensorBoard (`logs/iteration-<t>/<candidate>/eval`). An iteration that finished before any of
its checkpoints was evaluated (the evaluator started late, or the iteration was short) is
evaluated once from its frozen chosen ensemble, so every iteration has its evaluation. It stops
once the chief's report says the job is complete.
"""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from trainer import job_dir as job_dir_lib
from trainer import training
from trainer.report import finite_metrics
from trainer.config import RunConfig


def run(config: RunConfig, *, poll_secs: float = 5.0,
        timeout_secs: float | None = None) -> list[dict]:
    """Evaluates checkpoints until the job is complete; returns the evaluations made."""
    job = job_dir_lib.JobDir.of(config.outputs)
    deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
    while not job.exists():  # the chief creates the job dir once its input is checked
        logging.info("Evaluator: waiting for the chief to create %s.", job.root)
        _sleep(poll_secs, deadline)
    trainer = training.Trainer(config, training.load_inputs(config, job), job)
    evaluations, seen = [], set()
    iterations: dict[int, object] = {}  # built once per iteration; checkpoints are read in
    finished = 0  # the finished iterations known to have an evaluation on disk
    while True:
        complete = _is_complete(job)
        records = job.records()
        t = len(records)
        for i in range(finished, t):
            if not tf.io.gfile.exists(_eval_path(job, i)):  # missed while it ran
                evaluation = _evaluate_frozen(trainer, records[:i + 1])
                evaluations.append(evaluation)
                _publish(job, i, evaluation)
        finished = t
        latest = tf.train.latest_checkpoint(job.iteration_checkpoints(t))
        if latest and latest not in seen:
            seen.add(latest)
            if t not in iterations:
                iterations = {t: trainer.build_iteration(
                    t, trainer.restore(records) if records else None)}
            evaluation = _evaluate(trainer, iterations[t], latest)
            if evaluation is not None:
                evaluations.append(evaluation)
                _publish(job, t, evaluation)
        if complete:
            logging.info("Evaluator: the job is complete after %d evaluations.",
                         len(evaluations))
            return evaluations
        _sleep(poll_secs, deadline)


def _evaluate(trainer: training.Trainer, iteration, checkpoint: str) -> dict | None:
    try:
        iteration.checkpoint().read(checkpoint).expect_partial()
    except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
        # The chief replaced it meanwhile (it keeps the latest two).
        logging.info("Evaluator: could not read %s (%s); waiting for the next.", checkpoint,
                     str(e).splitlines()[0][:200])
        return None
    candidate_logits, subnetwork_logits = iteration.predict_logits(trainer.x_eval)
    evaluation = {
        "iteration": iteration.number, "step": int(iteration.step.numpy()),
        "checkpoint": checkpoint,
        "candidates": {c.name: _metrics(trainer, logits)
                       for c, logits in zip(iteration.candidates, candidate_logits)},
        "subnetworks": {s.name: _metrics(trainer, logits)
                        for s, logits in zip(iteration.subnetworks, subnetwork_logits)}}
    _summarize(trainer, evaluation)
    return evaluation


def _evaluate_frozen(trainer: training.Trainer, records: list[dict]) -> dict:
    """The last of `records`' iterations, finished: its chosen ensemble, frozen."""
    record = records[-1]
    logits = trainer.restore(records).logits(trainer.x_eval).numpy()
    evaluation = {
        "iteration": record["iteration"], "step": record["steps"],
        "checkpoint": trainer.job.frozen_prefix(record["iteration"]),
        "candidates": {record["chosen"]: _metrics(trainer, logits)},
        "subnetworks": {}}
    _summarize(trainer, evaluation)
    return evaluation


def _metrics(trainer: training.Trainer, logits) -> dict:
    return finite_metrics(trainer.head.metrics(trainer.inputs.eval.labels, logits))


def _summarize(trainer: training.Trainer, evaluation: dict) -> None:
    """Writes an evaluation to TensorBoard and logs its best candidate."""
    t, step = evaluation["iteration"], evaluation["step"]
    root = job_dir_lib.join(trainer.job.logs, f"iteration-{t}")
    for group, prefix in (("candidates", ""), ("subnetworks", "subnetwork_")):
        for name, metrics in evaluation[group].items():
            writer = tf.summary.create_file_writer(job_dir_lib.join(root, prefix + name,
                                                                    "eval"))
            with writer.as_default(step=step):
                for metric, value in metrics.items():
                    if value is not None:
                        tf.summary.scalar(metric, value)
            writer.close()
    best = min(evaluation["candidates"].items(), key=lambda kv: kv[1]["loss"])
    logging.info("Evaluator: iteration %d step %d: best eval loss %.4f (%s).", t, step,
                 best[1]["loss"], best[0])


def _eval_path(job: job_dir_lib.JobDir, t: int) -> str:
    return job_dir_lib.join(job.eval, f"iteration-{t}.json")


def _publish(job: job_dir_lib.JobDir, t: int, evaluation: dict) -> None:
    tf.io.gfile.makedirs(job.eval)
    path = _eval_path(job, t)
    history = job_dir_lib.read_json(path) if tf.io.gfile.exists(path) else []
    job_dir_lib.write_json(path, history + [evaluation])


def _is_complete(job: job_dir_lib.JobDir) -> bool:
    if not tf.io.gfile.exists(job.report):
        return False
    return job_dir_lib.read_json(job.report).get("status") == "complete"


def _sleep(seconds: float, deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError("the evaluator timed out waiting for the chief.")
    time.sleep(seconds)
