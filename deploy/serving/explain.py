"""Explanations without an endpoint: sampled Shapley attributions over the model's raw input
columns, in the response shape of a Vertex AI endpoint's `:explain` (v1 `Explanation`), for
`deploy.serve` and `deploy.batch local --explain`.

For an instance x and the model's baseline instance b (every number at its training mean,
every category at its most frequent value: `assets.extra/explanation_baseline.json`, which the
trainer writes beside the SavedModel), each of `path_count` random orders of the columns
walks from b to x one column at a time; a column's attribution is the mean change of the
explained output when it takes x's value. Every walk's changes sum to f(x) - f(b), so the
attributions do too (to float rounding), whatever the number of walks; the walks only
estimate how f(x) - f(b) is shared. The explained output is the probability of the class
predicted for x (classification) or the predicted value (regression).

`approximationError` is the attributions' sampling error: the root of the summed squared
standard errors of their means over the walks, over |f(x) - f(b)| (0 where every walk agrees,
as for a model without interactions between columns, whose attributions are exact).
All the walks of a batch of instances go to the model in one call: (columns + 1) x
`path_count` rows per instance (census: 15 x 10).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from deploy.cloud import api
from deploy.serving.instances import Predictor
from trainer.storage.paths import EXPLANATION_BASELINE

BASELINE = EXPLANATION_BASELINE  # trainer/serving/export.py writes it
DEFAULT_PATH_COUNT = 10  # deploy/publish.py's default for a Vertex endpoint too


def read_baseline(model_dir: str) -> dict:
    """The baseline instance the trainer exported with the model; DeployError without one."""
    from tensorflow.io import gfile

    path = f"{model_dir.rstrip('/')}/{BASELINE}"
    if not gfile.exists(path):
        raise api.DeployError(
            f"{model_dir} has no {BASELINE}: explanations start from the baseline the trainer "
            "exports with the model since explanations came; export it again (re-run the job "
            "with the same --job_dir)."
        )
    with gfile.GFile(path) as f:
        return json.load(f)


@dataclasses.dataclass
class Explainer:
    """Sampled Shapley attributions of `predictor`'s model, from `baseline`."""

    predictor: Predictor
    baseline: dict
    path_count: int = DEFAULT_PATH_COUNT
    seed: int = 0

    @classmethod
    def of(cls, predictor: Predictor, path_count: int = DEFAULT_PATH_COUNT) -> Explainer:
        return cls(predictor, read_baseline(predictor.model_dir), path_count)

    def explain(self, instances: Sequence[dict]) -> tuple[list[dict], list[dict]]:
        """(the predictions, the explanations) of instances already checked against the
        model's fields, each explanation `{"attributions": [one Vertex Attribution]}`."""
        if not instances:
            return [], []
        names = list(self.predictor.fields.kinds)
        rng = np.random.default_rng(self.seed)
        orders = [rng.permutation(len(names)) for _ in range(self.path_count)]
        walks = [row for x in instances for row in self._walks(x, names, orders)]
        outputs = self.predictor.predict_checked([*instances, self.baseline, *walks])
        predictions, base, walked = outputs[: len(instances)], outputs[len(instances)], outputs
        steps = (len(names) + 1) * self.path_count
        explanations = []
        for i, prediction in enumerate(predictions):
            start = len(instances) + 1 + i * steps
            rows = walked[start : start + steps]
            explanations.append(self._attribution(prediction, base, rows, names, orders))
        return predictions, explanations

    def _walks(self, x: dict, names: list[str], orders: list[np.ndarray]) -> list[dict]:
        rows = []
        for order in orders:
            row = dict(self.baseline)
            rows.append(dict(row))
            for j in order:
                row[names[j]] = x.get(names[j])
                rows.append(dict(row))
        return rows

    def _attribution(
        self, prediction: dict, base: dict, rows: list[dict], names: list[str], orders: list
    ) -> dict:
        name, index, label = _explained(prediction)
        value = _value(prediction, name, index)
        values = np.array([_value(r, name, index) for r in rows]).reshape(len(orders), -1)
        changes = np.zeros((len(orders), len(names)))
        for walk, order in enumerate(orders):
            changes[walk, order] = np.diff(values[walk])
        mean = changes.mean(axis=0)
        spread = _value(prediction, name, index) - _value(base, name, index)
        error = 0.0
        if len(orders) > 1 and spread:
            standard = changes.std(axis=0, ddof=1) / np.sqrt(len(orders))
            error = float(np.sqrt((standard**2).sum()) / abs(spread))
        attribution = {
            "baselineOutputValue": _value(base, name, index),
            "instanceOutputValue": value,
            "featureAttributions": {n: float(a) for n, a in zip(names, mean)},
            "outputIndex": [] if index is None else [index],
            "approximationError": error,
            "outputName": name,
        }
        if label is not None:
            attribution["outputDisplayName"] = label
        return {"attributions": [attribution]}


def _explained(prediction: dict) -> tuple[str, int | None, str | None]:
    """The output explained: (its name, the index in it, the class's name)."""
    if "probabilities" in prediction:
        index = int(prediction["class_ids"]) if "class_ids" in prediction else None
        if index is None:
            index = int(np.argmax(prediction["probabilities"]))
        label = prediction.get("classes")
        return "probabilities", index, None if label is None else str(label)
    return "predictions", None, None


def _value(output: dict, name: str, index: int | None) -> float:
    value = output[name]
    return float(value if index is None else value[index])
