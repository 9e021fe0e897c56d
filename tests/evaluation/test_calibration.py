"""Calibration (temperature scaling) and a binary head's decision threshold: the arithmetic
against known answers and scikit-learn, and a real trainer process that serves the calibrated
probabilities and the class at the threshold its objective chose."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import precision_recall_curve

from tests.support import (
    FAST_FLAGS,
    HEADER,
    load_report,
    predict_csv,
    run_in_process,
    run_task,
    write_csv,
)
from trainer.errors import InputError
from trainer.evaluation import calibration
from trainer.input.schema import HeadType, Label
from trainer.model import decision
from trainer.model.heads import Head


def _head(kind: HeadType, classes=("no", "yes")) -> Head:
    return Head(Label(name="target", head=kind, classes=tuple(classes)))


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


@pytest.mark.parametrize("kind", [HeadType.BINARY, HeadType.MULTICLASS])
def test_the_temperature_undoes_an_overconfident_models_scale(kind):
    # labels drawn from the true logits; the model's logits are 3x those: T = 3 undoes it
    rng = np.random.default_rng(0)
    n = 20_000
    if kind is HeadType.BINARY:
        head = _head(kind)
        true = rng.normal(0, 1.5, size=(n, 1))
        labels = (rng.random(n) < _sigmoid(true[:, 0])).astype(np.int64)
    else:
        head = _head(kind, ("a", "b", "c"))
        true = rng.normal(0, 1.5, size=(n, 3))
        p = np.exp(true) / np.exp(true).sum(axis=1, keepdims=True)
        labels = np.array([rng.choice(3, p=row) for row in p])
    logits = 3.0 * true
    temperature = calibration.fit_temperature(head, labels, logits)
    assert temperature == pytest.approx(3.0, rel=0.08)
    before = calibration.summary(head, labels, logits)
    after = calibration.summary(head, labels, logits / temperature)
    assert after["loss"] < before["loss"] and after["ece"] < 0.02 < before["ece"]
    # the true model is calibrated: its ECE is sampling noise, and T = 1 fits it
    assert calibration.summary(head, labels, true)["ece"] < 0.02
    assert calibration.fit_temperature(head, labels, true) == pytest.approx(1.0, rel=0.08)
    bins = after["reliability"]
    assert sum(b["weight"] for b in bins) == n
    assert all(b["low"] <= b["confidence"] <= b["high"] for b in bins)


def test_a_temperature_is_applied_only_where_its_gain_is_beyond_two_standard_errors():
    rng = np.random.default_rng(4)
    head = _head(HeadType.BINARY)
    true = rng.normal(0, 1.5, size=(300, 1))
    labels = (rng.random(300) < _sigmoid(true[:, 0])).astype(np.int64)
    # calibrated logits: a fitted temperature gains next to nothing, within its noise
    fitted = calibration.fit_temperature(head, labels, true)
    gain, error = calibration.paired_gain(head, labels, true, fitted)
    assert 0 <= gain < calibration.SIGNIFICANT_SE * error
    # 3x over-confident: far beyond it
    fitted = calibration.fit_temperature(head, labels, 3 * true)
    gain, error = calibration.paired_gain(head, labels, 3 * true, fitted)
    assert gain > 2 * calibration.SIGNIFICANT_SE * error


def test_weights_count_as_repeated_rows():
    rng = np.random.default_rng(1)
    head = _head(HeadType.BINARY)
    logits = rng.normal(0, 2, size=(500, 1))
    labels = (rng.random(500) < _sigmoid(logits[:, 0] / 2)).astype(np.int64)
    weights = rng.integers(1, 4, size=500).astype(np.float64)
    repeated = np.repeat(np.arange(500), weights.astype(int))
    weighted = calibration.summary(head, labels, logits, weights)
    plain = calibration.summary(head, labels[repeated], logits[repeated])
    assert weighted["ece"] == pytest.approx(plain["ece"])
    assert weighted["loss"] == pytest.approx(plain["loss"])
    assert calibration.fit_temperature(head, labels, logits, weights) == pytest.approx(
        calibration.fit_temperature(head, labels[repeated], logits[repeated]), rel=1e-4
    )
    probability = _sigmoid(logits[:, 0])
    objective = decision.Objective.parse("precision_at_recall=0.7")
    assert decision.choose(objective, labels, probability, weights) == decision.choose(
        objective, labels[repeated], probability[repeated]
    )


def test_the_curve_is_scikit_learns_precision_recall_curve():
    rng = np.random.default_rng(2)
    labels = (rng.random(3000) < 0.3).astype(np.int64)
    probability = np.round(_sigmoid(rng.normal(labels * 1.2, 1.0)), 3)  # ties too
    curve = decision.Curve(labels, probability)
    precision, recall, thresholds = precision_recall_curve(labels, probability)
    # scikit-learn's point at threshold t predicts p >= t; ours, between t and the next lower
    # probability, predicts the same rows
    ours = {}
    for i in range(len(curve)):
        higher = probability[probability > curve.threshold[i]].min()
        ours[round(float(higher), 6)] = (curve.precision[i], curve.recall[i])
    for p, r, t in zip(precision, recall, thresholds):
        assert ours[round(float(t), 6)] == pytest.approx((p, r))
    assert len(ours) == len(thresholds)


def test_each_objective_chooses_its_point():
    rng = np.random.default_rng(3)
    labels = (rng.random(5000) < 0.25).astype(np.int64)
    probability = _sigmoid(rng.normal(labels * 1.5 - 1.0, 1.0))
    curve = decision.Curve(labels, probability)

    def chosen(text):
        return decision.choose(decision.Objective.parse(text), labels, probability)

    assert chosen("accuracy").point.accuracy == pytest.approx(curve.accuracy.max())
    assert chosen("f1").point.f1 == pytest.approx(curve.f1.max())
    at_recall = chosen("precision_at_recall=0.8")
    assert at_recall.point.recall >= 0.8
    assert at_recall.point.precision == pytest.approx(curve.precision[curve.recall >= 0.8].max())
    at_precision = chosen("recall_at_precision=0.7")
    assert at_precision.met and at_precision.point.precision >= 0.7
    assert at_precision.point.recall == pytest.approx(curve.recall[curve.precision >= 0.7].max())
    given = chosen("threshold=0.3")
    assert given.point.threshold == 0.3
    assert given.point.recall == pytest.approx(np.mean(probability[labels == 1] > 0.3))
    assert chosen("").point.threshold == 0.5
    # a precision no threshold reaches: the most precise one, said so
    labels[np.argmax(probability)] = 0  # the highest-scored row is a negative
    unreachable = chosen("recall_at_precision=0.999")
    assert not unreachable.met and unreachable.point.precision < 0.999


@pytest.mark.parametrize(
    "text, says",
    [
        ("best", "must be one of accuracy, f1"),
        ("f1=0.5", "f1 takes no value"),
        ("precision_at_recall", "takes a number in (0, 1)"),
        ("recall_at_precision=1", "takes a number in (0, 1)"),
        ("threshold=abc", "takes a number in (0, 1)"),
    ],
)
def test_a_decision_objective_that_is_not_one_is_named(text, says):
    with pytest.raises(InputError, match=f"--decision_objective \\({text}\\)"):
        decision.Objective.parse(text)
    with pytest.raises(InputError) as e:
        decision.Objective.parse(text)
    assert says in str(e.value)


def _noisy_rows(n: int, seed: int) -> list:
    """HEADER rows whose label is a noisy function of the features (about 30% "yes"): no
    threshold has both precision and recall near 1."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    color = rng.choice(["red", "green", "blue"], size=n)
    score = 1.2 * x1 - 0.8 * x2 + np.where(color == "red", 0.7, 0.0)
    label = np.where(score + 1.3 * rng.normal(size=n) > 1.0, "yes", "no")
    return [[f"{a:.4f}", f"{b:.4f}", c, y] for a, b, c, y in zip(x1, x2, color, label)]


def test_the_model_serves_calibrated_probabilities_and_the_class_at_the_chosen_recall(tmp_path):
    train = write_csv(tmp_path / "train.csv", HEADER, _noisy_rows(6000, 1))
    test = write_csv(tmp_path / "test.csv", HEADER, _noisy_rows(4000, 2))
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={train}",
            f"--eval_data={test}",
            "--label_column=target",
            f"--job_dir={job}",
            "--generator=dnn",
            "--selection=holdout",  # rows held out from training, to calibrate and decide on
            "--decision_objective=precision_at_recall=0.8",
            "--feature_importance_rows=0",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "calibration: " in result.stdout
    assert "decision threshold" in result.stdout
    report = load_report(job)
    fitted = report["calibration"]
    assert 500 < fitted["rows"] < 700  # about 10% held out
    assert fitted["fitted_temperature"] > 0 and fitted["loss_gain_se"] > 0
    applied = fitted["loss_gain"] > calibration.SIGNIFICANT_SE * fitted["loss_gain_se"]
    assert fitted["method"] == ("temperature" if applied else "none")
    assert fitted["temperature"] == (fitted["fitted_temperature"] if applied else 1.0)
    assert fitted["after"]["loss"] <= fitted["before"]["loss"]
    # the eval rows' figures are the served model's: the report's final loss is the after
    assert fitted["eval"]["after"]["loss"] == pytest.approx(report["final"]["metrics"]["loss"])
    chosen = fitted["decision"]
    assert chosen["objective"] == "precision_at_recall=0.8" and chosen["met"]
    assert chosen["chosen_on"]["recall"] >= 0.8
    assert (job / "calibration.png").read_bytes().startswith(b"\x89PNG")

    outputs, targets = predict_csv(job / "model", test)
    positive = outputs["probabilities"].numpy()[:, 1]
    classes = np.array([c.decode() for c in outputs["classes"].numpy()])
    threshold = chosen["threshold"]
    assert 0.05 < threshold < 0.5  # recall 0.8 of a 30% class needs more than the likelier
    np.testing.assert_array_equal(classes == "yes", positive > threshold)
    np.testing.assert_allclose(positive, _sigmoid(outputs["logits"].numpy()[:, 0]), rtol=1e-5)
    # on 4,000 unseen rows the recall is the one asked for, within sampling error: the
    # threshold was chosen on 600 rows (about 180 positives), so both estimates move
    truth = np.array(targets) == "yes"
    recall = float(np.mean(classes[truth] == "yes"))
    spread = np.sqrt(0.8 * 0.2 / (0.3 * 600)) + np.sqrt(0.8 * 0.2 / truth.sum())
    assert abs(recall - 0.8) < 3 * spread, (recall, spread)
    assert fitted["eval"]["decision"]["recall"] == pytest.approx(recall)


def test_a_threshold_chosen_on_rows_without_held_out_rows_is_refused_before_training(
    binary_data, tmp_path
):
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [
            f"--train_data={binary_data.train}",
            f"--eval_data={binary_data.eval}",
            "--label_column=target",
            f"--job_dir={job}",
            "--generator=dnn",
            "--selection=moving_average",
            "--decision_objective=f1",
            *FAST_FLAGS,
        ]
    )
    assert code == 2
    assert "--decision_objective=f1 chooses a threshold on rows held out" in stderr
    assert "--selection=holdout" in stderr
    assert not (job / "checkpoints").exists()
