"""Heads: TF loss == numpy loss, serving outputs, metrics and ROC AUC."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from trainer.evaluation import exported
from trainer.input.schema import HeadType, Label
from trainer.model.heads import Head, Metrics

BINARY = Label("y", HeadType.BINARY, ("no", "yes"))
MULTICLASS = Label("y", HeadType.MULTICLASS, ("a", "b", "c"))
REGRESSION = Label("y", HeadType.REGRESSION, mean=2.0, std=4.0)


def sample(label, n=16, seed=0):
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(n, label.logits_dimension)) * 3).astype(np.float32)
    if label.head is HeadType.REGRESSION:
        labels = rng.normal(2.0, 4.0, size=n).astype(np.float32)
    else:
        labels = rng.integers(0, len(label.classes), size=n).astype(np.int64)
    return labels, logits


@pytest.mark.parametrize("label", [BINARY, MULTICLASS, REGRESSION])
def test_tf_loss_equals_numpy_loss(label):
    head = Head(label)
    labels, logits = sample(label)
    tf_loss = head.loss(tf.constant(labels), tf.constant(logits)).numpy()
    np_loss = head.losses(labels, logits)
    assert tf_loss.shape == np_loss.shape == (16,)
    np.testing.assert_allclose(tf_loss, np_loss, rtol=1e-5, atol=1e-6)


def test_losses_by_hand():
    np.testing.assert_allclose(
        Head(BINARY).losses(np.array([1, 0]), np.array([[0.0], [2.0]])),
        [np.log(2.0), np.log1p(np.exp(2.0))],
    )
    np.testing.assert_allclose(
        Head(MULTICLASS).losses(np.array([2]), np.array([[1.0, 1.0, 1.0]])), [np.log(3.0)]
    )
    # regression trains on standardised targets: (logit - (label - mean) / std)^2
    np.testing.assert_allclose(Head(REGRESSION).losses(np.array([10.0]), np.array([[1.0]])), [1.0])


def test_binary_loss_is_stable_for_large_logits():
    losses = Head(BINARY).losses(np.array([0, 1]), np.array([[1000.0], [-1000.0]]))
    np.testing.assert_allclose(losses, [1000.0, 1000.0])


@pytest.mark.parametrize("label, dim", [(BINARY, 1), (MULTICLASS, 3), (REGRESSION, 1)])
def test_logits_dimension(label, dim):
    assert Head(label).logits_dimension == dim


def test_binary_predictions():
    logits = tf.constant([[0.0], [2.0], [-1.0]])
    out = Head(BINARY).predictions(logits)
    assert set(out) == {"probabilities", "class_ids", "classes"}
    p = 1 / (1 + np.exp(-np.array([0.0, 2.0, -1.0])))
    np.testing.assert_allclose(out["probabilities"].numpy(), np.stack([1 - p, p], -1), rtol=1e-6)
    assert out["class_ids"].numpy().tolist() == [0, 1, 0]
    assert [c.decode() for c in out["classes"].numpy()] == ["no", "yes", "no"]


def test_multiclass_predictions():
    logits = np.array([[1.0, 2.0, 0.0], [0.0, -1.0, 3.0]], np.float32)
    out = Head(MULTICLASS).predictions(tf.constant(logits))
    e = np.exp(logits)
    np.testing.assert_allclose(out["probabilities"].numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
    assert out["probabilities"].shape == (2, 3)
    assert out["class_ids"].numpy().tolist() == [1, 2]
    assert [c.decode() for c in out["classes"].numpy()] == ["b", "c"]


def test_regression_predictions_undo_standardisation():
    out = Head(REGRESSION).predictions(tf.constant([[0.0], [1.5]]))
    assert set(out) == {"predictions"}
    assert out["predictions"].shape == (2,)
    np.testing.assert_allclose(out["predictions"].numpy(), [2.0, 8.0])


@pytest.mark.parametrize(
    "label, keys",
    [
        (BINARY, {"loss", "accuracy", "auc", "auc_pr"}),
        (MULTICLASS, {"loss", "accuracy"}),
        (REGRESSION, {"loss", "mse", "mae"}),
    ],
)
def test_metric_keys(label, keys):
    labels, logits = sample(label)
    metrics = Head(label).metrics(labels, logits)
    assert set(metrics) == keys
    assert all(isinstance(v, float) for v in metrics.values())
    np.testing.assert_allclose(metrics["loss"], Head(label).losses(labels, logits).mean())


def test_metric_values():
    binary = Head(BINARY).metrics(np.array([1, 0, 1, 0]), np.array([[2.0], [-1.0], [-0.5], [0.5]]))
    assert binary["accuracy"] == 0.5
    assert binary["auc"] == 0.75
    multi = Head(MULTICLASS).metrics(np.array([0, 2]), np.array([[3.0, 0, 0], [3.0, 0, 0]]))
    assert multi["accuracy"] == 0.5
    regression = Head(REGRESSION).metrics(np.array([2.0, 0.0]), np.array([[0.5], [0.0]]))
    # predictions 4 and 2: errors 2 and 2
    assert regression["mse"] == pytest.approx(4.0)
    assert regression["mae"] == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_metrics_of_non_finite_logits(bad):
    labels, logits = sample(BINARY)
    logits[3, 0] = bad
    metrics = Head(BINARY).metrics(labels, logits)
    assert list(metrics) == ["loss"] and np.isnan(metrics["loss"])


@pytest.mark.parametrize(
    "label, metric", [(BINARY, "accuracy"), (MULTICLASS, "accuracy"), (REGRESSION, "mse")]
)
def test_objective_metric(label, metric):
    assert Head(label).objective_metric == metric


def brute_force_auc(labels, scores):
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y != 1]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def binned_auc(labels, logits):
    return Head(BINARY).metrics(np.asarray(labels), np.asarray(logits, float)[:, None])["auc"]


@pytest.mark.parametrize("seed", range(6))
def test_auc_matches_pairwise_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 40
    labels = rng.integers(0, 2, size=n)
    logits = rng.integers(-2, 3, size=n).astype(float)  # many ties, each in its own bin
    assert binned_auc(labels, logits) == pytest.approx(brute_force_auc(labels, logits), abs=1e-12)


@pytest.mark.parametrize(
    "labels, logits, expected",
    [
        ([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4], 1.0),
        ([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4], 0.0),
        ([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5], 0.5),
        ([0, 1, 1], [0.2, 0.2, 0.9], 0.75),
        ([1, 0, 1, 0], [3.0, -1.0, 0.0, 1.0], 0.75),
    ],
)
def test_auc_small_cases(labels, logits, expected):
    got = binned_auc(labels, logits)
    assert got == pytest.approx(expected, abs=1e-12)
    assert got == pytest.approx(brute_force_auc(labels, logits), abs=1e-12)


@pytest.mark.parametrize("labels", [[0, 0, 0], [1, 1]])
def test_auc_of_one_class_is_nan(labels):
    assert np.isnan(binned_auc(labels, np.arange(len(labels), dtype=float)))


def test_binned_auc_is_within_its_stated_bound_of_the_exact_one():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=3000)
    logits = rng.normal(size=3000) + labels  # continuous scores: no exact ties
    metrics = Metrics(Head(BINARY))
    metrics.update(labels, logits[:, None])
    exact = brute_force_auc(labels, logits)
    assert 0 < metrics.auc_error_bound < 1e-3
    assert abs(metrics.result()["auc"] - exact) <= metrics.auc_error_bound + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_auc_pr_is_scikit_learns_average_precision(seed):
    """Tied scores (each in its own bin) enter together, as in scikit-learn; with weights each
    row counts its weight."""
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=200)
    logits = rng.integers(-3, 4, size=200).astype(float) + labels
    weights = rng.uniform(0.5, 2.0, size=200)
    p = 1 / (1 + np.exp(-logits))
    got = Head(BINARY).metrics(labels, logits[:, None])["auc_pr"]
    assert got == pytest.approx(average_precision_score(labels, p), abs=1e-12)
    got = Head(BINARY).metrics(labels, logits[:, None], weights)["auc_pr"]
    assert got == pytest.approx(
        average_precision_score(labels, p, sample_weight=weights), abs=1e-12
    )


def test_auc_pr_of_the_constant_prediction_is_the_positive_share():
    labels = np.array([1, 0, 0, 0])
    metrics = Metrics(Head(BINARY))
    metrics.update(labels, np.zeros((4, 1)))
    constant = metrics.constant()
    assert constant is not None
    assert metrics.result()["auc_pr"] == constant["auc_pr"] == 0.25
    assert np.isnan(Head(BINARY).metrics(np.zeros(3, int), np.zeros((3, 1)))["auc_pr"])


@pytest.mark.parametrize("label", [BINARY, MULTICLASS, REGRESSION])
def test_metrics_over_batches_equal_metrics_in_one_piece(label):
    labels, logits = sample(label)
    streamed = Metrics(Head(label))
    for start in range(0, len(labels), 7):
        streamed.update(labels[start : start + 7], logits[start : start + 7])
    whole = Head(label).metrics(labels, logits)
    assert streamed.count == len(labels)
    assert streamed.result() == pytest.approx(whole, rel=1e-9)


@pytest.mark.parametrize("label", [BINARY, MULTICLASS, REGRESSION])
def test_metric_names_are_the_keys_of_metrics(label):
    labels, logits = sample(label)
    assert tuple(Head(label).metrics(labels, logits)) == Head(label).metric_names


@pytest.mark.parametrize("label", [BINARY, MULTICLASS, REGRESSION])
def test_the_constant_scores_what_its_own_logits_score(label):
    """`Metrics.constant()`, kept on the way through weighted batches, equals the metrics of
    the best constant's logits (the rows' own class frequencies or mean) fed like a model's."""
    head = Head(label)
    labels, logits = sample(label, n=300, seed=3)
    weights = np.random.default_rng(4).uniform(0.5, 2.0, 300)
    metrics = Metrics(head)
    for part in np.array_split(np.arange(300), 7):
        metrics.update(labels[part], logits[part], weights[part])
    if label.head is HeadType.REGRESSION:
        mean = np.average(labels, weights=weights)
        constant = np.full((300, 1), (mean - label.mean) / label.std)
    else:
        shares = np.bincount(labels, weights=weights) / weights.sum()
        constant = np.log(shares)[None, :].repeat(300, axis=0)
        if label.head is HeadType.BINARY:
            constant = constant[:, 1:] - constant[:, :1]
    expected = head.metrics(labels, constant, weights)
    got = metrics.constant()
    assert got is not None and set(got) == set(expected) - {"mae"}
    for name, value in got.items():
        assert value == pytest.approx(expected[name], rel=1e-7, abs=1e-9), name
    assert metrics.result()["loss"] != pytest.approx(got["loss"])  # the model's own, not it
    assert Metrics(head).constant() is None


def test_a_model_no_better_than_a_constant_gets_a_warning():
    head = Head(BINARY)
    labels = np.array([0, 0, 0, 1] * 25)
    for sign, warned in ((1.0, False), (-1.0, True)):  # right with confidence; wrong
        metrics = Metrics(head)
        metrics.update(labels, sign * np.where(labels == 1, 3.0, -3.0)[:, None])
        final = {"eval_data": "the hold-out", **exported_metrics(metrics)}
        message = exported.no_better_than_constant(final, head)
        assert (message is not None) == warned
    assert "always predicting those rows' own class frequencies (0.5623)" in str(message)
    final["constant"] = None  # no rows
    assert exported.no_better_than_constant(final, head) is None


def exported_metrics(metrics):
    return {"metrics": metrics.result(), "constant": metrics.constant()}
