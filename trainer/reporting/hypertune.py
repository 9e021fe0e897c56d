"""Vertex AI hyperparameter tuning: the exported model's eval metric, reported for the trial
(cloudml-hypertune writes it to CLOUD_ML_HP_METRIC_FILE)."""

from __future__ import annotations

from absl import logging


def report(metric: str, metrics: dict, steps: int) -> None:
    """Reports the exported model's eval metric to Vertex AI hyperparameter tuning."""
    import hypertune  # cloudml-hypertune: writes CLOUD_ML_HP_METRIC_FILE

    hypertune.HyperTune().report_hyperparameter_tuning_metric(
        hyperparameter_metric_tag=metric, metric_value=metrics[metric], global_step=steps
    )
    logging.info("Reported %s=%s to hyperparameter tuning.", metric, metrics[metric])
