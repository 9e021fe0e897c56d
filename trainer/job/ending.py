"""What a finished job publishes beside its report.json, the same for one search
(`trainer.job.job`) and a bagged job (`trainer.job.bagging`): the leaderboard, feature
importance and calibration plots, the hyperparameter tuning metric, and the end of the
Vertex AI Experiments run."""

from __future__ import annotations

from trainer.evaluation import importance as importance_lib
from trainer.model.heads import Head
from trainer.reporting import calibration as calibration_plot
from trainer.reporting import hypertune
from trainer.reporting.experiments import Tracker
from trainer.storage import job_dir as job_dir_lib


def publish(
    job: job_dir_lib.JobDir,
    report: dict,
    *,
    leaderboard_png: bytes,
    head: Head,
    hypertune_metric: str | None,
    steps: int,
    tracker: Tracker | None,
) -> dict:
    """What goes with `report` (report.json, written); returns `report`.
    `hypertune_metric`: None outside a tuning trial, "" for the head's objective metric."""
    job_dir_lib.write_atomically(job.report_png, leaderboard_png)
    importance = report.get("feature_importance")
    if importance:
        job_dir_lib.write_atomically(job.importance_png, importance_lib.plot(importance))
    calibration_png = calibration_plot.plot(report.get("calibration") or {})
    if calibration_png:
        job_dir_lib.write_atomically(job.calibration_png, calibration_png)
    if hypertune_metric is not None:
        hypertune.report(
            hypertune_metric or head.objective_metric, report["final"]["metrics"], steps
        )
    if tracker:
        tracker.on_end(report)
    return report
