"""Permutation feature importance (trainer/evaluation/importance.py): the figures on hand-made
models, and a real training run writing report.json `feature_importance` and
feature_importance.png."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from tests.support import run_in_process, write_csv
from trainer.config import ImportanceOptions
from trainer.errors import InputError
from trainer.evaluation import importance
from trainer.input.schema import HeadType, Label
from trainer.model.heads import Head

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _label(head: HeadType) -> Label:
    classes = {HeadType.BINARY: ("no", "yes"), HeadType.MULTICLASS: ("a", "b", "c")}
    return Label(name="y", head=head, classes=classes.get(head, ()), mean=0.0, std=1.0)


def _rows(n: int = 2000, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "signal": rng.normal(size=n).astype(np.float32),
        "noise": rng.normal(size=n).astype(np.float32),
        "color": rng.choice([b"red", b"green"], size=n).astype(object),
    }


def test_a_column_the_model_uses_matters_and_one_it_ignores_scores_zero():
    features = _rows()
    labels = (features["signal"] > 0).astype(np.int64)

    def predict(columns):  # logits of a model that reads only `signal`
        return 4.0 * columns["signal"][:, None].astype(np.float64)

    head = Head(_label(HeadType.BINARY))
    result = importance.permutation_importance(predict, features, labels, head, repeats=3, seed=7)
    by_name = {c["column"]: c for c in result["columns"]}
    assert result["metric"] == "auc" and result["baseline"] == pytest.approx(1.0)
    assert by_name["signal"]["mean_drop"] > 0.4  # AUC falls to about 0.5
    assert by_name["noise"]["mean_drop"] == 0.0 and by_name["color"]["mean_drop"] == 0.0
    assert [c["column"] for c in result["columns"]][0] == "signal"
    assert len(by_name["signal"]["drops"]) == 3 and by_name["signal"]["std_drop"] > 0
    again = importance.permutation_importance(predict, features, labels, head, repeats=3, seed=7)
    assert again == result  # the seed fixes the shuffles


@pytest.mark.parametrize(
    "head, metric, labels_of",
    [
        # regression: RMSE rises when the column is shuffled, reported as a positive drop
        (HeadType.REGRESSION, "rmse", lambda s: s.astype(np.float64)),
        (HeadType.MULTICLASS, "accuracy", lambda s: np.digitize(s, [-0.5, 0.5])),
    ],
)
def test_each_head_measures_the_drop_in_its_own_metric(head, metric, labels_of):
    features = _rows()
    labels = labels_of(features["signal"])

    def predict(columns):
        s = columns["signal"].astype(np.float64)
        if head is HeadType.REGRESSION:
            return s[:, None]
        return np.stack([-5 * (s + 0.5), -5 * np.abs(s) + 1.25, 5 * (s - 0.5)], axis=1)

    result = importance.permutation_importance(
        predict, features, labels, Head(_label(head)), repeats=2, seed=1
    )
    by_name = {c["column"]: c["mean_drop"] for c in result["columns"]}
    assert result["metric"] == metric
    assert by_name["signal"] > 0.3 and by_name["noise"] == 0.0


def test_rows_are_taken_up_to_the_limit_in_an_order_that_does_not_depend_on_reading():
    features = _rows(100)
    labels = np.arange(100) % 2
    weights = np.linspace(0.5, 2.0, 100)
    batches = [
        ({k: v[i : i + 30] for k, v in features.items()}, labels[i : i + 30], weights[i : i + 30])
        for i in (0, 30, 60, 90)
    ]
    first = importance.first_rows(batches, 100)
    reordered = importance.first_rows(batches[::-1], 100)
    assert len(first) == 100 and first.weights is not None and reordered.weights is not None
    for name in features:
        np.testing.assert_array_equal(first.features[name], reordered.features[name])
    np.testing.assert_array_equal(first.labels, reordered.labels)
    np.testing.assert_array_equal(first.weights, reordered.weights)
    # each row keeps its own label and weight through the reordering
    row = int(np.argmax(first.features["signal"] == features["signal"][17]))
    assert first.labels[row] == labels[17] and first.weights[row] == weights[17]
    limited = importance.first_rows([b[:2] for b in batches], 45)
    assert len(limited) == 45 and len(limited.features["signal"]) == 45
    assert limited.weights is None


def test_weights_weight_the_metric():
    """`signal` decides the label in half the rows and not at all in the other half: with those
    other rows weighted 0, the model's use of `signal` counts fully; weighted the other way
    round, shuffling `signal` costs nothing."""
    rng = np.random.default_rng(5)
    features = _rows(4000)
    decided = np.arange(4000) % 2 == 0
    labels = np.where(decided, features["signal"] > 0, rng.random(4000) > 0.5).astype(np.int64)

    def predict(columns):
        return 4.0 * columns["signal"][:, None].astype(np.float64)

    head = Head(_label(HeadType.BINARY))

    def signal_drop(weights):
        result = importance.permutation_importance(
            predict, features, labels, head, repeats=2, seed=2, weights=weights
        )
        assert result["weighted"] is (weights is not None)
        return {c["column"]: c["mean_drop"] for c in result["columns"]}["signal"]

    only_decided = signal_drop(decided.astype(np.float64))
    unweighted = signal_drop(None)
    only_random = signal_drop((~decided).astype(np.float64))
    assert only_decided > 0.45 and abs(only_random) < 0.05
    assert only_random < unweighted < only_decided


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(rows=-1), r"--feature_importance_rows \(-1\) must be >= 0"),
        (dict(repeats=0), r"--feature_importance_repeats \(0\) must be >= 1"),
    ],
)
def test_bad_options_are_named(options, message):
    with pytest.raises(InputError, match=message):
        ImportanceOptions(**options)


def test_plot_is_a_png():
    result = {
        "metric": "auc",
        "rows": 10,
        "repeats": 2,
        "columns": [
            {"column": "a", "mean_drop": 0.2, "std_drop": 0.01},
            {"column": "b", "mean_drop": -0.01, "std_drop": 0.02},
        ],
    }
    assert importance.plot(result).startswith(PNG_MAGIC)


def test_a_serving_signature_is_measured_on_its_own_inputs_only(tmp_path):
    import tensorflow as tf

    class Model(tf.Module):  # reads `signal`; `color` is an input it ignores
        @tf.function(
            input_signature=[
                {
                    "signal": tf.TensorSpec([None], tf.float32, name="signal"),
                    "color": tf.TensorSpec([None], tf.string, name="color"),
                }
            ]
        )
        def serve(self, features):
            unused = tf.cast(tf.strings.length(features["color"]), tf.float32)
            return {"logits": (4.0 * features["signal"] + 0.0 * unused)[:, None]}

    model = Model()
    tf.saved_model.save(model, str(tmp_path), signatures={"serving_default": model.serve})
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]  # as exported

    rows = _rows(3000)  # `noise` too, which the signature does not take
    labels = (rows["signal"] > 0).astype(np.int64)
    batches = [
        ({k: v[i : i + 1024] for k, v in rows.items()}, labels[i : i + 1024])
        for i in range(0, 3000, 1024)
    ]
    options = ImportanceOptions(rows=2500, repeats=2)
    head = Head(_label(HeadType.BINARY))
    result = importance.of_model(serve, batches, head, options, seed=3)
    assert result is not None and result["rows"] == 2500
    assert [c["column"] for c in result["columns"]] == ["signal", "color"]
    assert result["columns"][0]["mean_drop"] > 0.4 and result["columns"][1]["mean_drop"] == 0.0
    assert importance.of_model(serve, [], head, options, seed=3) is None


class SlowServe:  # a serving function of 0.05 s per call, whatever the rows
    structured_input_signature = ((), {"signal": None, "color": None})

    def __call__(self, signal, color):
        import tensorflow as tf

        time.sleep(0.05)
        return {"logits": tf.reshape(4.0 * signal, [-1, 1])}


def test_a_time_budget_samples_the_rows_that_fit_or_skips(tmp_path):
    rows = _rows(3000)
    labels = (rows["signal"] > 0).astype(np.int64)
    batches = [(rows, labels)]
    options = ImportanceOptions(rows=2500, repeats=2)  # 1 + 2 x 2 passes: 0.25 s
    head = Head(_label(HeadType.BINARY))
    full = importance.of_model(SlowServe(), batches, head, options, seed=3, seconds=60.0)
    assert full is not None and full["rows"] == 2500 and "rows_before_budget" not in full
    cut = importance.of_model(SlowServe(), batches, head, options, seed=3, seconds=0.2)
    assert cut is not None and cut["rows_before_budget"] == 2500
    assert importance.MIN_BUDGET_ROWS <= cut["rows"] < 2500
    assert cut["columns"][0]["column"] == "signal" and cut["columns"][0]["mean_drop"] > 0.4
    assert importance.of_model(SlowServe(), batches, head, options, seed=3, seconds=0.01) is None


def test_without_a_budget_the_importance_takes_at_most_half_the_search_s_time(monkeypatch):
    """A diagnostic does not double the job: the passes get IMPORTANCE_SHARE of the search's
    seconds (at least IMPORTANCE_MIN_SECS), on a sample of the rows where they would take
    longer."""
    from types import SimpleNamespace

    from trainer.evaluation import exported

    rows = _rows(3000)
    labels = (rows["signal"] > 0).astype(np.int64)
    config: Any = SimpleNamespace(
        importance=ImportanceOptions(rows=2500, repeats=2), training_seed=3
    )
    data: Any = SimpleNamespace(eval_raw=lambda with_weight: [(rows, labels)])
    head = Head(_label(HeadType.BINARY))
    monkeypatch.setattr(exported, "IMPORTANCE_MIN_SECS", 0.0)
    full = exported.feature_importance(config, SlowServe(), data, head, None, search_seconds=60)
    assert full is not None and full["rows"] == 2500 and "rows_before_budget" not in full
    cut = exported.feature_importance(config, SlowServe(), data, head, None, search_seconds=0.4)
    assert cut is not None and cut["rows_before_budget"] == 2500 and cut["rows"] < 2500


def _signal_and_noise(tmp_path, n: int, seed: int):
    """CSV rows where `signal` decides the label and `noise` and `color` are random; `weight`
    is an example weight (1 or 2), not a feature."""
    rng = np.random.default_rng(seed)
    signal, noise = rng.normal(size=n), rng.normal(size=n)
    color = rng.choice(["red", "green", "blue"], size=n)
    label = np.where(signal + 0.2 * rng.normal(size=n) > 0, "yes", "no")
    weight = rng.choice([1, 2], size=n)
    return write_csv(
        tmp_path / f"rows-{seed}.csv",
        ["signal", "noise", "color", "weight", "label"],
        [
            [f"{a:.4f}", f"{b:.4f}", c, w, y]
            for a, b, c, w, y in zip(signal, noise, color, weight, label)
        ],
    )


TRAIN_FLAGS = [
    "--label_column=label",
    "--generator=linear",
    "--max_iterations=1",
    "--max_iteration_steps=150",
    "--batch_size=64",
    "--learning_rate=0.05",
    "--steps_per_loop=50",
]


@pytest.mark.slow
def test_training_reports_the_importance_of_the_exported_model(tmp_path):
    job = tmp_path / "job"
    train, eval_ = _signal_and_noise(tmp_path, 3000, 1), _signal_and_noise(tmp_path, 1500, 2)
    code, stderr = run_in_process(
        [
            f"--train_data={train}",
            f"--eval_data={eval_}",
            f"--job_dir={job}",
            "--feature_importance_rows=1000",
            "--feature_importance_repeats=2",
            "--weight_column=weight",
            *TRAIN_FLAGS,
        ]
    )
    assert code == 0, stderr
    report = json.loads((job / "report.json").read_text())
    found = report["feature_importance"]
    assert found["metric"] == "auc" and found["rows"] == 1000 and found["repeats"] == 2
    assert found["weighted"]  # the weight column weights the metric, and is no feature
    by_name = {c["column"]: c for c in found["columns"]}
    assert set(by_name) == {"signal", "noise", "color"}
    assert found["columns"][0]["column"] == "signal"
    assert by_name["signal"]["mean_drop"] > 0.2
    assert by_name["signal"]["mean_drop"] > 10 * max(
        abs(by_name["noise"]["mean_drop"]), abs(by_name["color"]["mean_drop"]), 0.001
    )
    assert found["seconds"] > 0
    assert (job / "feature_importance.png").read_bytes().startswith(PNG_MAGIC)
    assert (job / "report.png").exists()


@pytest.mark.slow
def test_importance_can_be_turned_off(tmp_path):
    job = tmp_path / "job"
    train, eval_ = _signal_and_noise(tmp_path, 2000, 1), _signal_and_noise(tmp_path, 500, 2)
    code, stderr = run_in_process(
        [
            f"--train_data={train}",
            f"--eval_data={eval_}",
            f"--job_dir={job}",
            "--feature_importance_rows=0",
            "--ignore_columns=weight",
            *TRAIN_FLAGS,
        ]
    )
    assert code == 0, stderr
    assert json.loads((job / "report.json").read_text())["feature_importance"] is None
    assert not (job / "feature_importance.png").exists()


def test_a_negative_row_count_exits_2_before_any_work(tmp_path):
    job = tmp_path / "job"
    train = _signal_and_noise(tmp_path, 50, 1)
    code, stderr = run_in_process(
        [f"--train_data={train}", f"--job_dir={job}", "--feature_importance_rows=-5", *TRAIN_FLAGS]
    )
    assert code == 2 and "--feature_importance_rows (-5) must be >= 0" in stderr
    assert not job.exists()
