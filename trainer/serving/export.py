"""Exporting the chosen ensemble as a SavedModel that Vertex AI's prebuilt TensorFlow
prediction containers serve: `saved_model.pb` at the root, tag `serve`, signature
`serving_default` taking raw feature columns by name.

Only the chosen ensemble is inside (AdaNet 0.9 exported every candidate and picked one at run
time, so serving paid for the losers).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from trainer.input.features import Preprocessor
from trainer.input.schema import Column, DateColumn, NumericColumn, Schema
from trainer.model.heads import Head
from trainer.search.frozen import FrozenEnsemble
from trainer.storage import files as storage
from trainer.storage import job_dir as job_dir_lib
from trainer.storage import paths


def baseline_of(schema: Schema) -> dict:
    """The instance explanations start from (`deploy/serving/explain.py`): each number at its
    training mean, each category at its most frequent value (the typical row, as the model saw the
    training data; "" for a column with no vocabulary; a date column at its training mean)."""
    return {c.name: _typical(c) for c in schema.columns}


def _typical(column: Column) -> float | str:
    if isinstance(column, NumericColumn):
        return column.mean
    if isinstance(column, DateColumn):
        return column.baseline_text()
    return (column.vocabulary or ("",))[0]


class ServingModel(tf.Module):
    """Raw columns -> preprocessing -> the frozen ensemble -> head outputs (+ logits). The
    logits are divided by `temperature` (`trainer/evaluation/calibration.py`; 1: as trained)
    and `head` decides at its threshold: both are constants of the graph."""

    def __init__(
        self,
        preprocessor: Preprocessor,
        ensemble: FrozenEnsemble,
        head: Head,
        temperature: float = 1.0,
    ):
        super().__init__(name="adanet_ensemble")
        self.preprocessor = preprocessor
        self.members = [m.subnetwork for m in ensemble.members]
        self.weights = ensemble.weights
        self._head = head
        self._temperature = temperature
        self.serve = tf.function(self._serve, input_signature=[preprocessor.input_signature()])

    def baseline(self) -> dict:
        return baseline_of(self.preprocessor.schema)

    def _serve(self, features):
        encoded = self.preprocessor(features)
        logits = self.weights([m(encoded, training=False) for m in self.members])
        if self._temperature != 1.0:
            logits = logits / self._temperature
        return {**self._head.predictions(logits), "logits": logits}


def export(
    model: tf.Module,
    job: job_dir_lib.JobDir,
    source: dict,
    calibration: dict | None = None,
    extras: Mapping[str, str | dict] | None = None,
) -> str:
    """Saves `model` (its `serve` function as `serving_default`) to a temporary dir, then
    publishes it as `job.model`, replacing the model there (or what an interrupted publish
    left): one rename locally; on Cloud Storage a copy with `saved_model.pb` last, so that
    `job.has_model()` is true only for a complete model. Then stamps it as exported from
    `source` (`job.exported_from()`) with its `calibration` (report.json's). `extras`: more
    files beside the graph ({path in the model dir: text, or a document written as JSON}: the
    monitoring baseline, `trainer/serving/monitoring.py`). A failure leaves no temporary dir
    behind."""
    temp = job.model_temp()
    try:
        tf.saved_model.save(model, temp, signatures={"serving_default": model.serve})
        baseline = getattr(model, "baseline", None)
        if baseline is not None:  # beside the graph, where TensorFlow Serving looks for none
            tf.io.gfile.makedirs(f"{temp}/{paths.MODEL_EXTRA}")
            job_dir_lib.write_json(f"{temp}/{paths.EXPLANATION_BASELINE}", baseline())
        for path, content in (extras or {}).items():
            tf.io.gfile.makedirs(f"{temp}/{path.rsplit('/', 1)[0]}")
            if isinstance(content, str):
                job_dir_lib.write_atomically(f"{temp}/{path}", content)
            else:
                job_dir_lib.write_json(f"{temp}/{path}", content)
        job.remove_model()
        storage.publish_dir(temp, job.model, complete_marker=job_dir_lib.MODEL_MARKER)
    finally:
        if tf.io.gfile.exists(temp):
            tf.io.gfile.rmtree(temp)
    job.stamp_model(source, calibration)
    return job.model


def load_serving_fn(path: str):
    """The `serving_default` function of an exported model."""
    return tf.saved_model.load(path).signatures["serving_default"]
