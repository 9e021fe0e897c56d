"""The monitoring baseline a model is exported with: what Vertex AI Model Monitoring needs to
compare serving traffic with the training data (`deploy.monitor` reads it to create the job).

`assets.extra/monitoring/baseline.json`: the training data's location as the monitoring job's
`trainingDataset` takes it (Cloud Storage files and their format, or a BigQuery table; `null`
for data Vertex cannot read, local files), the label (`targetField`), and each feature's kind
and statistics from the scan (numbers: mean, standard deviation, range, quantile edges and
the missing share; categories: the most frequent values and their shares; dates: their range).
`assets.extra/monitoring/instance_schema.yaml`: one instance as OpenAPI (each feature a number
or a string), the `predictInstanceSchemaUri` the job takes; with every field a string, the
`analysisInstanceSchemaUri` (what Vertex asks of models trained with it).
"""

from __future__ import annotations

from trainer.input.schema import CategoricalColumn, DateColumn, NumericColumn, Schema
from trainer.storage import paths

BASELINE = paths.MONITORING_BASELINE
INSTANCE_SCHEMA = paths.MONITORING_INSTANCE_SCHEMA
ANALYSIS_SCHEMA = paths.MONITORING_ANALYSIS_SCHEMA
_TOP_VALUES = 20


def baseline(schema: Schema, train_data: str, *, jsonl: bool = False) -> dict:
    """The baseline document of a model trained on `train_data` with `schema`."""
    return {
        "training_dataset": paths.vertex_dataset(train_data, jsonl=jsonl),
        "train_data": train_data,
        "target_field": schema.label.name,
        "rows": (schema.summary.get("train") or {}).get("rows"),
        "features": {c.name: _statistics(c) for c in schema.columns},
    }


def _statistics(column) -> dict:
    if isinstance(column, NumericColumn):
        return {
            "type": "number",
            "mean": column.mean,
            "std": column.std,
            "min": column.min,
            "max": column.max,
            "quantile_edges": list(column.edges),
            "missing_share": _missing_share(column),
        }
    if isinstance(column, DateColumn):
        return {
            "type": "string",
            "date_format": column.format,
            "min_seconds": column.min,
            "max_seconds": column.max,
            "missing_share": _missing_share(column),
        }
    assert isinstance(column, CategoricalColumn)
    total = sum(column.counts) or 1
    return {
        "type": "string",
        "distinct": len(column.vocabulary),
        "top_values": {
            v: c / total
            for v, c in zip(column.vocabulary[:_TOP_VALUES], column.counts[:_TOP_VALUES])
        },
    }


def _missing_share(column: NumericColumn | DateColumn) -> float:
    total = column.count + column.missing
    return column.missing / total if total else 0.0


def instance_schema(schema: Schema, *, as_text: bool = False) -> str:
    """One instance as an OpenAPI object in YAML (every field a string with `as_text`)."""
    lines = ["type: object", "properties:"]
    for c in schema.columns:
        kind = "number" if isinstance(c, NumericColumn) and not as_text else "string"
        lines += [f"  {c.name}:", f"    type: {kind}"]
    lines += ["required:", *(f"- {c.name}" for c in schema.columns)]
    return "\n".join(lines) + "\n"


def files(schema: Schema, train_data: str, *, jsonl: bool = False) -> dict[str, str | dict]:
    """{path in the model dir: content} of the baseline's files."""
    return {
        BASELINE: baseline(schema, train_data, jsonl=jsonl),
        INSTANCE_SCHEMA: instance_schema(schema),
        ANALYSIS_SCHEMA: instance_schema(schema, as_text=True),
    }
