"""The exported model's own metrics and feature importance, from its serving function loaded
back: what the job reports is what serving computes."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.config import RunConfig
from trainer.evaluation import importance as importance_lib
from trainer.input.job_input import JobInput
from trainer.input.schema import HeadType, Weight
from trainer.model.heads import Head, Metrics
from trainer.search.budget import TimeBudget
from trainer.storage import job_dir as job_dir_lib

Batch = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # labels, logits, weights


def evaluate_export(
    serve: Any, data: JobInput, head: Head, *, keep: Callable[[list[Batch]], None] | None = None
) -> dict:
    """Metrics of the exported model itself (`serve`: its serving function, loaded back) on
    the eval data, streamed; `keep` is given every batch's labels, logits and weights too
    (a bag's, `save_predictions`)."""
    batches: Iterable[Batch] = _predict(serve, data.eval_raw(with_weight=True))
    if keep is not None:
        batches = list(batches)
        keep(batches)
    return pooled_metrics(batches, head, data.describe_eval(), data.schema.weight)


def evaluate_test(serve: Any, data: JobInput, head: Head) -> dict | None:
    """The exported model's metrics on --test_data (report.json `test`: `final`'s fields,
    `test_data` in place of `eval_data`), streamed; None without test data."""
    if data.test is None:
        return None
    batches = _predict(serve, data.test_raw())
    value = pooled_metrics(batches, head, data.test.pattern, data.schema.weight)
    return {"test_data": value.pop("eval_data"), **value}


def evaluate_pooled(parts: Sequence[tuple[Any, JobInput]], head: Head, eval_data: str) -> dict:
    """Metrics over several (serving function, its eval rows) parts pooled, as one set of
    predictions (a bagged job's out-of-bag metrics: each bag on its own hold-out)."""
    batches = (
        batch for serve, data in parts for batch in _predict(serve, data.eval_raw(with_weight=True))
    )
    return pooled_metrics(batches, head, eval_data, parts[0][1].schema.weight)


def _predict(serve: Any, raw: Iterable[tuple]) -> Iterator[Batch]:
    """(labels, logits, weights or None) of each batch of raw rows `(features, labels[,
    weights])`, predicted by `serve`."""
    for batch in raw:
        weights = batch[2].numpy() if len(batch) > 2 else None
        yield batch[1].numpy(), serve(**batch[0])["logits"].numpy(), weights


def concatenated(batches: Sequence[Batch]) -> Batch:
    """Batches as one: their labels, logits and weights (None without) end to end."""
    weights = None if batches[0][2] is None else np.concatenate([b[2] for b in batches])
    return (
        np.concatenate([b[0] for b in batches]),
        np.concatenate([b[1] for b in batches]),
        weights,
    )


def save_predictions(path: str, batches: list[Batch], source: dict) -> None:
    """The batches of `evaluate_export(keep=...)` in one .npz file, with `source` (what the
    model was exported from: `JobDir.exported_from`). Nothing without rows."""
    if not batches:
        return
    labels, logits, weights = concatenated(batches)
    arrays = {
        "labels": labels,
        "logits": logits,
        "source": np.array(json.dumps(source, sort_keys=True)),
    }
    if weights is not None:
        arrays["weights"] = weights
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    job_dir_lib.write_atomically(path, buffer.getvalue())


def saved_predictions(path: str, source: dict | None) -> Batch | None:
    """What `save_predictions` wrote at `path` for the model exported from `source`; None
    when there is none, or it is of another export."""
    if source is None or not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        saved = np.load(io.BytesIO(f.read()))
        if str(saved["source"]) != json.dumps(source, sort_keys=True):
            return None
        weights = saved.get("weights")
        return saved["labels"], saved["logits"], weights


def pooled_metrics(
    batches: Iterable[Batch], head: Head, eval_data: str, weight: Weight | None
) -> dict:
    """The metrics of `evaluate_export` of predictions made: `final` in report.json."""
    metrics = Metrics(head)
    for labels, logits, weights in batches:
        metrics.update(labels, logits, weights)
    value = {
        "eval_data": eval_data,
        "examples": metrics.count,
        **({"weight_column": weight.name, "weight": metrics.weight} if weight else {}),
        "metrics": metrics.result(),
        "constant": metrics.constant(),
    }
    warning = no_better_than_constant(value, head)
    if warning:
        logging.warning("%s", warning)
        value["warning"] = warning
    return value


def no_better_than_constant(final: dict, head: Head) -> str | None:
    """What to tell the user when the exported model's eval loss is no lower than the best
    constant prediction's on the same rows (`Metrics.constant`), else None. A model trained on
    features that carry any signal beats it; one that does not was trained on rows unlike
    its eval rows, on features that do not predict the label, or is wrong."""
    constant, loss = final.get("constant"), final["metrics"]["loss"]
    if not constant or not loss < float("inf") or loss < constant["loss"]:
        return None
    what = "mean" if head.label.head is HeadType.REGRESSION else "class frequencies"
    return (
        f"The exported model's loss on {final['eval_data']} ({loss:.4f}) is no better than "
        f"always predicting those rows' own {what} ({constant['loss']:.4f}). Its features may "
        "not predict the label, or the eval rows differ from the training rows (a column "
        "whose meaning or units changed, another period or population): check the data "
        "before using this model."
    )


# The permutation importance may take this share of the search's time (at least
# IMPORTANCE_MIN_SECS) on fewer rows: a diagnostic should not double the job (census with
# trees: 10,000 rows x 43 passes took 69 s after a 45 s search).
IMPORTANCE_SHARE = 0.5
IMPORTANCE_MIN_SECS = 10.0


def feature_importance(
    config: RunConfig,
    serve: Any,
    data: JobInput,
    head: Head,
    budget: TimeBudget | None,
    search_seconds: float,
) -> dict | None:
    """Permutation importance of the exported model (`serve`, as `evaluate_export`) on the
    first eval rows (`trainer/evaluation/importance.py`), on fewer rows where the passes
    would take longer than IMPORTANCE_SHARE of `search_seconds` or than a time budget
    leaves; None when --feature_importance_rows=0, or when too few rows fit that time."""
    if not config.importance.enabled:
        return None
    seconds = max(IMPORTANCE_MIN_SECS, IMPORTANCE_SHARE * search_seconds)
    if budget is not None:
        seconds = min(seconds, budget.left() - budget.EXIT_SECS)
    value = (
        None
        if seconds <= 0  # not even the rows' read
        else importance_lib.of_model(
            serve,
            data.eval_raw(with_weight=True),
            head,
            config.importance,
            seed=config.training_seed,
            seconds=seconds,
        )
    )
    if value is None:
        logging.info(
            "Feature importance skipped: no eval rows, or too few fit in the %.1f s it may "
            "take (half the search's time, or what --time_budget_secs leaves).",
            seconds,
        )
    if value:
        logging.info(
            "Feature importance of %d columns on %d eval rows in %.1f s.",
            len(value["columns"]),
            value["rows"],
            value["seconds"],
        )
    return value
