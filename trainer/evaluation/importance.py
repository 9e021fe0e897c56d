"""Permutation feature importance of the exported model: how much its eval metric drops when
one input column's values are shuffled across the eval rows, breaking that column's link to
the label while keeping its distribution (report.json `feature_importance`, and
`feature_importance.png` beside report.png).

The metric is the head's main one, as `trainer.model.heads.Metrics` computes it: AUC for a binary
label, accuracy for several classes, RMSE for regression (the root of Metrics' mse); a drop is
the loss of quality, so a positive figure means the model uses the column. A column the model
ignores scores about 0; a negative figure means shuffling helped, i.e. noise. With a weight
column (--weight_column) the metric is weighted, as every eval metric is.

Cost: `rows` x (1 + columns x repeats) rows through the serving function (census, 14
columns, 10,000 rows, 3 repeats: 430,000 rows), in calls of up to PREDICT_BATCH rows (the
shuffled copies of a small eval set share calls), after reading the first `rows` eval rows
once. Each shuffle comes from a seeded generator, and the rows are put in a canonical order
first, so the figures repeat for the same rows; with more eval rows than `rows`, which rows
come first depends on the order the parallel parser delivers them.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from trainer.config import ImportanceOptions
from trainer.input.schema import HeadType
from trainer.model.heads import Head, Metrics

PREDICT_BATCH = 8192  # rows per call of the serving function
MIN_BUDGET_ROWS = 200  # fewer rows than this fit a time budget: no importance
PLOT_COLUMNS = 30  # the chart shows at most this many columns, the most important

Features = dict[str, np.ndarray]
Predict = Callable[[Features], np.ndarray]  # raw columns -> logits [rows, logits]


@dataclasses.dataclass(frozen=True)
class Quality:
    """The metric a drop is measured in, and whether higher is better."""

    name: str
    higher_is_better: bool

    @classmethod
    def of(cls, head: Head) -> Quality:
        return {
            HeadType.BINARY: cls("auc", True),
            HeadType.MULTICLASS: cls("accuracy", True),
            HeadType.REGRESSION: cls("rmse", False),
        }[head.type]

    def score(
        self, head: Head, labels: np.ndarray, logits: np.ndarray, weights: np.ndarray | None = None
    ) -> float:
        metrics = Metrics(head)
        metrics.update(labels, logits, weights)
        result = metrics.result()
        if self.name == "rmse":
            return math.sqrt(result["mse"]) if "mse" in result else float("nan")
        return result.get(self.name, float("nan"))

    def drop(self, baseline: float, shuffled: float) -> float:
        """How much worse `shuffled` is than `baseline` (positive: worse)."""
        return baseline - shuffled if self.higher_is_better else shuffled - baseline


@dataclasses.dataclass(frozen=True)
class Rows:
    """Eval rows in memory: one array per column, the labels, the weights (or None)."""

    features: Features
    labels: np.ndarray
    weights: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)


def first_rows(batches: Iterable[tuple], rows: int) -> Rows:
    """Up to `rows` rows of `(features, labels)` or `(features, labels, weights)` batches
    (tensors or arrays) as numpy columns, in a canonical order (sorted by label, then by every
    column) so that the shuffles do not depend on the order they were read in."""
    parts: dict[str, list[np.ndarray]] = {}
    labels: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    count = 0
    for batch in batches:
        take = min(rows - count, len(_numpy(batch[1])))
        for name, value in batch[0].items():
            parts.setdefault(name, []).append(_numpy(value)[:take])
        labels.append(_numpy(batch[1])[:take])
        if len(batch) > 2:
            weights.append(_numpy(batch[2])[:take])
        count += take
        if count >= rows:
            break
    if not count:
        return Rows({}, np.zeros(0))
    columns = {name: np.concatenate(p) for name, p in parts.items()}
    label = np.concatenate(labels)
    keys = [_sortable(columns[name]) for name in sorted(columns, reverse=True)]
    order = np.lexsort([*keys, _sortable(label)])  # the last key sorts first
    return Rows(
        {name: v[order] for name, v in columns.items()},
        label[order],
        np.concatenate(weights)[order] if weights else None,
    )


def permutation_importance(
    predict: Predict,
    features: Features,
    labels: np.ndarray,
    head: Head,
    *,
    repeats: int,
    seed: int,
    weights: np.ndarray | None = None,
) -> dict:
    """Each column's drop in the head's metric when its values are shuffled `repeats` times.

    Args:
        predict: raw columns -> logits (the serving function's "logits" output).
        features: the eval rows, one array per input column.
        labels: their labels, as `Metrics` takes them.
        head: the label's head (which metric, how to score it).
        repeats: shuffles per column; each uses a new permutation.
        seed: seeds the permutations.
        weights: the rows' example weights (--weight_column), which weight the metric as
            they weight the eval metrics; None: all 1.

    Returns:
        {"metric", "baseline", "rows", "repeats", "seed", "columns"}: `columns` one entry per
        column, {"column", "mean_drop", "std_drop", "drops"}, the largest mean drop first.
        `std_drop` is the sample standard deviation over the repeats (0 for one repeat).
    """
    quality = Quality.of(head)
    logits = _predict(predict, features)
    baseline = quality.score(head, labels, logits, weights)
    if not math.isfinite(baseline):  # e.g. AUC of rows with one class only
        quality = Quality("loss", False)
        baseline = quality.score(head, labels, logits, weights)
    rng = np.random.default_rng(seed)
    shuffles = (
        (name, rng.permutation(len(labels))) for name in sorted(features) for _ in range(repeats)
    )
    scores = iter(_shuffled_scores(predict, features, shuffles, labels, head, quality, weights))
    columns: list[dict[str, Any]] = []
    for name in sorted(features):
        drops = [quality.drop(baseline, next(scores)) for _ in range(repeats)]
        columns.append(
            {
                "column": name,
                "mean_drop": float(np.mean(drops)),
                "std_drop": float(np.std(drops, ddof=1)) if repeats > 1 else 0.0,
                "drops": [float(d) for d in drops],
            }
        )
    columns.sort(key=lambda c: (-c["mean_drop"], c["column"]))
    return {
        "metric": quality.name,
        "baseline": baseline,
        "rows": len(labels),
        "weighted": weights is not None,
        "repeats": repeats,
        "seed": seed,
        "columns": columns,
    }


def of_model(
    serve: Any,
    batches: Iterable[tuple],
    head: Head,
    options: ImportanceOptions,
    *,
    seed: int,
    seconds: float | None = None,
) -> dict | None:
    """Permutation importance of `serve` (the export's `serving_default`, a ConcreteFunction)
    on the first `options.rows` rows of `batches`, its inputs alone shuffled; None without
    rows. Adds `seconds` (reading the rows included).

    With `seconds` (what a --time_budget_secs leaves), a timed pass over the rows estimates
    the shuffles' time; if they would take longer, they use a sample of the rows that fits
    (seeded; `rows_before_budget` says how many there were), or none (None) when under
    MIN_BUDGET_ROWS fit."""
    started = time.monotonic()
    rows = first_rows(batches, options.rows)
    if not len(rows):
        return None
    import tensorflow as tf

    inputs = serve.structured_input_signature[1]
    features = {name: rows.features[name] for name in inputs}  # the serving inputs alone

    def predict(columns: Features) -> np.ndarray:
        return serve(**{k: tf.constant(v) for k, v in columns.items()})["logits"].numpy()

    labels, weights, fitted = rows.labels, rows.weights, {}
    if seconds is not None:
        timed = time.monotonic()
        _predict(predict, features)
        passes = 1 + len(features) * options.repeats
        left = seconds - (time.monotonic() - started)
        need = passes * (time.monotonic() - timed)
        if need > left:
            keep = int(len(labels) * max(left, 0.0) / need)
            if keep < MIN_BUDGET_ROWS:
                return None
            fitted = {"rows_before_budget": len(labels)}
            # (A sample, not the first rows: `first_rows` sorted them by their values.)
            sample = np.sort(np.random.default_rng(seed).choice(len(labels), keep, replace=False))
            features = {k: v[sample] for k, v in features.items()}
            labels = labels[sample]
            weights = None if weights is None else weights[sample]
    result = permutation_importance(
        predict, features, labels, head, repeats=options.repeats, seed=seed, weights=weights
    )
    return {**result, **fitted, "seconds": time.monotonic() - started}


def mean_of(values: Sequence[dict | None]) -> dict | None:
    """The mean of several models' importances (a bagged job's bags, each on its own rows):
    the mean drop per column over the models, the standard deviation over every shuffle of
    every model; None when none has one. Only those measured with the first one's metric
    count (a model whose rows had one class falls back to the loss)."""
    measured = [v for v in values if v]
    if not measured:
        return None
    same = [v for v in measured if v["metric"] == measured[0]["metric"]]
    drops: dict[str, list[list[float]]] = {}
    for value in same:
        for column in value["columns"]:
            drops.setdefault(column["column"], []).append(column["drops"])
    columns: list[dict[str, Any]] = [
        {
            "column": name,
            "mean_drop": float(np.mean([np.mean(d) for d in per_model])),
            "std_drop": float(np.std(np.concatenate(per_model), ddof=1))
            if sum(map(len, per_model)) > 1
            else 0.0,
            "drops": [float(x) for d in per_model for x in d],
        }
        for name, per_model in drops.items()
    ]
    columns.sort(key=lambda c: (-c["mean_drop"], c["column"]))
    return {
        "metric": same[0]["metric"],
        "baseline": float(np.mean([v["baseline"] for v in same])),
        "rows": sum(v["rows"] for v in same),
        "weighted": same[0]["weighted"],
        "repeats": same[0]["repeats"],
        "models": len(same),
        "columns": columns,
        "seconds": sum(v["seconds"] for v in same),
    }


def summary(importance: dict, top: int = 5) -> str:
    """'feature importance (drop in eval auc when shuffled, 10,000 rows x 3): age 0.0412,
    ...' for the final table."""
    columns = ", ".join(f"{c['column']} {c['mean_drop']:.4f}" for c in importance["columns"][:top])
    more = len(importance["columns"]) - top
    models = f", the mean of {importance['models']} bags" if importance.get("models") else ""
    return (
        f"feature importance (drop in eval {importance['metric']} when shuffled, "
        f"{importance['rows']:,} rows x {importance['repeats']}{models}): {columns}"
        + (f", ... ({more} more)" if more > 0 else "")
    )


def plot(importance: dict) -> bytes:
    """A PNG: one horizontal bar per column (the most important on top), its mean drop, and
    the standard deviation over the repeats as an error bar."""
    import matplotlib

    matplotlib.use("Agg")  # no display
    from matplotlib import pyplot

    shown = importance["columns"][:PLOT_COLUMNS][::-1]
    figure, axes = pyplot.subplots(figsize=(6.4, 1.2 + 0.3 * len(shown)), dpi=100)
    means = [c["mean_drop"] for c in shown]
    axes.barh(
        [c["column"] for c in shown],
        means,
        xerr=[c["std_drop"] for c in shown],
        color=["tab:blue" if m > 0 else "0.6" for m in means],
        capsize=3,
    )
    axes.axvline(0.0, color="0.3", linewidth=0.8)
    axes.set_xlabel(f"drop in eval {importance['metric']} when the column is shuffled")
    hidden = len(importance["columns"]) - len(shown)
    axes.set_title(
        f"Permutation importance ({importance['rows']:,} eval rows, "
        f"{importance['repeats']} shuffles each)"
        + (f"; {hidden} less important not shown" if hidden > 0 else "")
    )
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    pyplot.close(figure)
    return png.getvalue()


def _shuffled_scores(
    predict: Predict,
    features: Features,
    shuffles: Iterable[tuple[str, np.ndarray]],
    labels: np.ndarray,
    head: Head,
    quality: Quality,
    weights: np.ndarray | None,
) -> Iterator[float]:
    """The metric of the rows with each (column, permutation) of `shuffles` applied, in
    order; as many shuffled copies as fit in PREDICT_BATCH rows go through one call (a small
    eval set: one call for many columns, not one each)."""
    rows = len(labels)
    shuffles = iter(shuffles)
    while group := list(itertools.islice(shuffles, max(1, PREDICT_BATCH // rows))):
        stacked = {
            key: np.concatenate([values[p] if key == name else values for name, p in group])
            for key, values in features.items()
        }
        logits = _predict(predict, stacked)
        for i in range(len(group)):
            yield quality.score(head, labels, logits[i * rows : (i + 1) * rows], weights)


def _predict(predict: Predict, features: Features) -> np.ndarray:
    rows = len(next(iter(features.values())))
    return np.concatenate(
        [
            predict({k: v[start : start + PREDICT_BATCH] for k, v in features.items()})
            for start in range(0, rows, PREDICT_BATCH)
        ]
    )


def _numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _sortable(values: np.ndarray) -> np.ndarray:
    """Strings (object arrays of bytes) as fixed-width bytes, which lexsort orders."""
    return values.astype(bytes) if values.dtype == object else values
