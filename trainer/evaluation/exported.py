"""The exported model's own metrics and feature importance, from its serving function loaded
back: what the job reports is what serving computes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from absl import logging

from trainer.config import RunConfig
from trainer.evaluation import importance as importance_lib
from trainer.input.job_input import JobInput
from trainer.model.heads import Head, Metrics
from trainer.search.budget import TimeBudget


def evaluate_export(serve: Any, data: JobInput, head: Head) -> dict:
    """Metrics of the exported model itself (`serve`: its serving function, loaded back) on
    the eval data, streamed."""
    return evaluate_pooled([(serve, data)], head, data.describe_eval())


def evaluate_pooled(parts: Sequence[tuple[Any, JobInput]], head: Head, eval_data: str) -> dict:
    """Metrics over several (serving function, its eval rows) parts pooled, as one set of
    predictions (a bagged job's out-of-bag metrics: each bag on its own hold-out)."""
    metrics = Metrics(head)
    for serve, data in parts:
        for batch in data.eval_raw(with_weight=True):
            features, labels = batch[:2]
            weights = batch[2].numpy() if len(batch) > 2 else None
            metrics.update(labels.numpy(), serve(**features)["logits"].numpy(), weights)
    weight = parts[0][1].schema.weight
    return {
        "eval_data": eval_data,
        "examples": metrics.count,
        **({"weight_column": weight.name, "weight": metrics.weight} if weight else {}),
        "metrics": metrics.result(),
    }


def feature_importance(
    config: RunConfig, serve: Any, data: JobInput, head: Head, budget: TimeBudget | None
) -> dict | None:
    """Permutation importance of the exported model (`serve`, as `evaluate_export`) on the
    first eval rows (`trainer/evaluation/importance.py`), on fewer rows if a time budget says
    so; None when
    --feature_importance_rows=0 or the budget leaves no time for it."""
    if not config.importance.enabled:
        return None
    seconds = None if budget is None else budget.left() - budget.EXIT_SECS
    value = (
        None
        if seconds is not None and seconds <= 0  # not even the rows' read
        else importance_lib.of_model(
            serve,
            data.eval_raw(with_weight=True),
            head,
            config.importance,
            seed=config.training_seed,
            seconds=seconds,
        )
    )
    if value is None and seconds is not None:
        logging.info("Feature importance skipped: %.1f s of the time budget left.", seconds)
    if value:
        logging.info(
            "Feature importance of %d columns on %d eval rows in %.1f s.",
            len(value["columns"]),
            value["rows"],
            value["seconds"],
        )
    return value
