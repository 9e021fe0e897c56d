"""Bagging: `--bags=K` searches, each on its own hold-out and seed, served as one model that
averages them.

One search on a few hundred rows moves with its seed and its hold-out (which rows choose the
candidates); the mean of five scores better and moves far less (bench/quality.py scores the
bagged model and each bag alone on the same test rows: docs/benchmarks.md, "Bagging on small
tables"). So bag b is a whole job of its own in `JOB_DIR/bags/<b>/` (checkpoints, model,
report; resumable like any job) that holds out fold b of the rows (the folds of one --seed are
disjoint, `trainer.input.scan.Holdout`) and trains with its own seed
(`RunConfig.training_seed`). The bagged model (`JOB_DIR/model`, `trainer/serving/bagged.py`)
loads the K exports and serves the mean of their probabilities (classification) or the trimmed
mean of their predictions (regression), with the same signature and outputs as one export.

Its metrics in report.json are out of bag: each hold-out row predicted by the one bag that
did not train on it, pooled (with --eval_data: the bagged model itself on it). That is the
figure of one bag on unseen rows, so it understates the bagged model; the test rows of
bench/quality.py measure the bagged model itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
from absl import logging

from trainer.config import RunConfig
from trainer.errors import TrainingError
from trainer.evaluation import calibration as calibration_lib
from trainer.evaluation import exported
from trainer.evaluation import importance as importance_lib
from trainer.input import job_input as input_lib
from trainer.input.schema import HeadType, Schema
from trainer.job import ending
from trainer.model import decision
from trainer.model.heads import Head
from trainer.reporting import leaderboard
from trainer.reporting import report as report_lib
from trainer.reporting.experiments import Tracker
from trainer.search import record as record_lib
from trainer.search.budget import TimeBudget
from trainer.search.rules import Search
from trainer.serving import export as export_lib
from trainer.serving import monitoring
from trainer.serving.bagged import BaggedModel
from trainer.storage import job_dir as job_dir_lib

# Loading the bags' exports, saving the bagged model and its eval pass, per bag (a 300-row
# table: about 1 s each on 2 cores), kept back from a time budget before the bags share it.
COMBINE_SECS_PER_BAG = 1.5


def bag_config(config: RunConfig, job: job_dir_lib.JobDir, bag: int, seconds: float | None):
    """Bag `bag`'s job: `config` (the flags, not the choices: each bag adapts to its own
    rows) in JOB_DIR/bags/<bag>, its TensorBoard logs under the job's, no hyperparameter
    tuning report and no test data of its own (the bagged model is scored on it)."""
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, test_data=None),
        bags=1,
        bag=bag,
        job_dir=job.bag(bag),
        model_dir=None,
        checkpoint_dir=None,
        log_dir=job_dir_lib.join(job.logs, "bags", str(bag)),
        time_budget_secs=seconds,
        hypertune_metric=None,
        auto=config.auto - {"bags"},
    )


def _finished_report(job: job_dir_lib.JobDir, config: RunConfig) -> dict | None:
    """A bag's report when that bag is done and its search cannot go further under `config`,
    the job's flags, with the --patience the bag chose from its own rows (`trainer.search.adapt`,
    in its report): a resume does not run it again. None when it may (a larger
    --max_iterations or --patience, or a time budget that ended it): it then resumes like
    any job."""
    report = job.complete_report()
    if report is None:
        return None
    chosen = report.get("adapted", {}).get("patience")
    patience = int(chosen["value"]) if chosen else config.search.patience
    search = Search(dataclasses.replace(config.search, patience=patience))
    return None if search.may_grow(record_lib.finished(job)) else report


def _share(budget: TimeBudget | None, bags_left: int, total_bags: int) -> float | None:
    """Seconds of the time budget for the next bag: an equal share of what is left after
    the bagged model's own work."""
    if budget is None:
        return None
    left = budget.left() - budget.reserve - COMBINE_SECS_PER_BAG * total_bags
    return left / bags_left


def train_bags(
    flags_config: RunConfig,
    bags: int,
    job: job_dir_lib.JobDir,
    run_one: Callable[..., dict],
    budget: TimeBudget | None,
) -> list[dict]:
    """Runs (or resumes) the bags in turn; returns their reports. Under a time budget a bag
    starts only while it has time left (bag 0 always runs)."""
    reports: list[dict] = []
    for b in range(bags):
        bag_job = job_dir_lib.JobDir(job.bag(b))
        done = _finished_report(bag_job, flags_config)
        if done:
            logging.info("Bag %d of %d: done before (%s).", b + 1, bags, bag_job.root)
            reports.append(done)
            continue
        seconds = _share(budget, bags - b, bags)
        if seconds is not None and seconds <= 0 and reports:
            logging.info("Bag %d of %d: skipped, the time budget is spent.", b + 1, bags)
            break
        config = bag_config(flags_config, job, b, None if seconds is None else max(seconds, 1.0))
        logging.info(
            "Bag %d of %d: seed %d, %s, in %s.",
            b + 1,
            bags,
            config.training_seed,
            "its own hold-out fold" if not config.data.eval_data else "the eval data",
            bag_job.root,
        )
        reports.append(run_one(config, started=time.monotonic()))
    return reports


def _same_label(schema: Schema, bags: Sequence[str]) -> None:
    """Every bag learned the same label (classes in the same order, the same scaling)."""
    for root in bags:
        path = job_dir_lib.join(root, "schema.json")
        label = Schema.from_document(job_dir_lib.read_json(path), path=path).label
        if label != schema.label:
            raise TrainingError(
                f"bag {root} learned label {label} but the job's is {schema.label}: its data "
                "changed since the job started. Start a new --job_dir."
            )


def evaluate(
    data: input_lib.JobInput, job: job_dir_lib.JobDir, bags: Sequence[str], head: Head
) -> dict:
    """The bagged model's metrics: out of bag on the hold-outs (bag b's export, from job dir
    `bags[b]`, on fold b, pooled), or the bagged model itself on --eval_data. The bags'
    predictions on their folds are those each bag's job saved when it evaluated its export
    (`JobDir.eval_predictions`); a bag without them (of an older version) is evaluated here.
    `head` decides at the bagged model's threshold."""
    if data.eval_data or data.holdout is None:
        return exported.evaluate_export(export_lib.load_serving_fn(job.model), data, head)
    holdout = data.holdout
    folds = len(bags) * holdout.fraction
    described = (
        f"out of bag: {folds:.0%} of the training rows, each held out by one of "
        f"{len(bags)} bags and predicted by that bag"
    )
    saved = [
        batch
        for bag in map(job_dir_lib.JobDir, bags)
        if (batch := exported.saved_predictions(bag.eval_predictions, bag.exported_from()))
    ]
    if len(saved) == len(bags):
        return exported.pooled_metrics(saved, head, described, data.schema.weight)
    parts = [
        (
            export_lib.load_serving_fn(job_dir_lib.JobDir(root).model),
            dataclasses.replace(data, holdout=dataclasses.replace(holdout, fold=b)),
        )
        for b, root in enumerate(bags)
    ]
    return exported.evaluate_pooled(parts, head, described)


def bagged_decision(
    data: input_lib.JobInput, bags: Sequence[str], objective: decision.Objective
) -> dict:
    """The bagged model's calibration: each bag's own (on its fold), and a binary head's
    threshold chosen on the bags' pooled out-of-bag predictions (each fold by the bag that
    held it out: those saved by the bags' jobs); where they are not saved (--eval_data), the
    mean of the bags' thresholds."""
    each = [job_dir_lib.JobDir(root).exported_calibration() or {} for root in bags]
    value: dict = {"method": "per bag", "bags": each}
    if data.schema.label.head is not HeadType.BINARY:
        return value
    saved = [
        batch
        for bag in map(job_dir_lib.JobDir, bags)
        if (batch := exported.saved_predictions(bag.eval_predictions, bag.exported_from()))
    ]
    if objective.chosen_on_rows and saved and len(saved) == len(bags):
        labels, logits, weights = exported.concatenated(saved)
        probability = Head(data.schema.label).probabilities_of(logits)[:, 1]
        chosen = decision.choose(objective, labels, probability, weights).to_json()
        value["decision"] = {**chosen, "chosen_on_rows": "out of bag"}
        return value
    thresholds = [calibration_lib.deciding(Head(data.schema.label), c).threshold for c in each]
    value["threshold"] = float(np.mean(thresholds))
    return value


def summary(b: int, report: dict, seed: int) -> dict:
    """What the bagged job's report keeps of bag `b`'s (trained with `seed`)."""
    final = report["final"]
    return {
        "bag": b,
        "job_dir": report["job_dir"],
        "seed": seed,
        "eval_data": final["eval_data"],
        "examples": final["examples"],
        "metrics": final["metrics"],
        "iterations": len(report["iterations"]),
        "steps": sum(it["steps"] for it in report["iterations"]),
        "ensemble": [m["key"] for m in (report["architecture"] or {}).get("members", [])],
        "training_seconds": round(sum(it["seconds"]["total"] for it in report["iterations"]), 3),
    }


def run(
    flags_config: RunConfig,
    config: RunConfig,
    data: input_lib.JobInput,
    job: job_dir_lib.JobDir,
    *,
    run_one: Callable[..., dict],
    budget: TimeBudget | None,
    adapted: dict,
    input_seconds: float,
    tracker: Tracker | None = None,
) -> dict:
    """The bagged job, on one machine: `config.bags` bags (`run_one`: `trainer.job.run`), the
    bagged model exported and evaluated, the report. `flags_config` is the job's flags and
    `config` what `trainer.search.adapt` chose of them; `data` the job's input (fold 0's
    hold-out)."""

    started = time.monotonic()
    if tracker:
        tracker.on_start()
    reports = train_bags(flags_config, config.bags, job, run_one, budget)
    roots = [r["job_dir"] for r in reports]
    _same_label(data.schema, roots)
    source = {
        "bags": [job_dir_lib.JobDir(root).exported_from() for root in roots],
        **config.calibration.to_json(),
    }
    if job.exported_from() != source:  # none yet, or bags that grew or were added since
        models = [job_dir_lib.JobDir(root).model for root in roots]
        calibration = bagged_decision(data, roots, config.calibration.objective)
        threshold = calibration_lib.deciding(Head(data.schema.label), calibration).threshold
        bagged = BaggedModel(models, data.schema, threshold)
        baseline = monitoring.files(
            data.schema, config.data.train_data, jsonl=config.data.input.jsonl
        )
        export_lib.export(bagged, job, source, calibration, extras=baseline)
        logging.info("Exported the bagged model of %d bags to %s", len(models), job.model)
    calibration = job.exported_calibration() or {}
    head = calibration_lib.deciding(Head(data.schema.label), calibration)
    final = evaluate(data, job, roots, head)
    test = exported.evaluate_test(export_lib.load_serving_fn(job.model), data, head)
    importance = importance_lib.mean_of([r.get("feature_importance") for r in reports])
    bags = [
        summary(b, r, dataclasses.replace(flags_config, bag=b).training_seed)
        for b, r in enumerate(reports)
    ]
    value = report_lib.build_report(
        config=config,
        schema=data.schema,
        records=[],
        final=final,
        job=job,
        input_summary={
            "training_rows": data.schema.summary["train"]["rows"],
            "bad_rows": report_lib.bad_rows(data.schema.summary),
            "statistics": data.schema.summary.get("statistics"),
            "warnings": data.schema.summary.get("warnings", []),
        },
        timing={"input_seconds": input_seconds, "seconds": time.monotonic() - started},
        adapted=adapted,
        budget=None
        if budget is None
        else {**budget.to_json(), "bags_planned": config.bags, "bags_trained": len(bags)},
        feature_importance=importance,
        calibration=calibration,
        test=test,
        bags=bags,
    )
    job_dir_lib.write_json(job.report, value)
    return ending.publish(
        job,
        value,
        leaderboard_png=leaderboard.plot_bags(
            [r["iterations"] for r in reports], head.objective_metric, final
        ),
        head=head,
        hypertune_metric=config.hypertune_metric,
        steps=sum(b["steps"] for b in bags),
        tracker=tracker,
    )
