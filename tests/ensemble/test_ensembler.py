"""Ensemblers: shapes, initial values and the logits formula, checked against numpy."""

import json

import numpy as np
import pytest
import tensorflow as tf

from trainer.ensemble.ensembler import (
    ComplexityRegularizedEnsembler,
    MeanEnsembler,
    Member,
    MixtureWeightType,
)

SCALAR = MixtureWeightType.SCALAR
VECTOR = MixtureWeightType.VECTOR
MATRIX = MixtureWeightType.MATRIX
LOGITS_DIM = 3
BATCH = 4


def make_members(dims=(5, 2, 7), complexities=(0.0, 1.0, 2**0.5)):
    return [Member(f"m{i}", d, r) for i, (d, r) in enumerate(zip(dims, complexities))]


def make_outputs(members, logits_dim=LOGITS_DIM, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.normal(size=(BATCH, m.last_layer_dim)).astype(np.float32),
            rng.normal(size=(BATCH, logits_dim)).astype(np.float32),
        )
        for m in members
    ]


def randomise(weights, seed=1):
    rng = np.random.default_rng(seed)
    for w in weights.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    if weights.bias is not None:
        weights.bias.assign(rng.normal(size=weights.bias.shape).astype(np.float32))


def build(members, logits_dim=LOGITS_DIM, previous=None, **options):
    return ComplexityRegularizedEnsembler(**options).build(
        members=members, logits_dimension=logits_dim, previous=previous
    )


@pytest.mark.parametrize(
    "kind, shapes",
    [(SCALAR, [(), (), ()]), (VECTOR, [(3,), (3,), (3,)]), (MATRIX, [(5, 3), (2, 3), (7, 3)])],
)
def test_weight_shapes(kind, shapes):
    weights = build(make_members(), mixture_weight_type=kind)
    assert [tuple(w.shape) for w in weights.weights] == shapes


@pytest.mark.parametrize("kind", [SCALAR, VECTOR])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_initial_weights_are_one_over_n(kind, n):
    members = make_members()[:n]
    weights = build(members, mixture_weight_type=kind)
    for w in weights.weights:
        np.testing.assert_allclose(w.numpy(), np.full(w.shape, 1.0 / n), rtol=1e-7)


def test_initial_uniform_average_equals_mean_of_logits():
    members = make_members()
    outputs = make_outputs(members)
    logits = build(members, mixture_weight_type=VECTOR)(outputs).numpy()
    np.testing.assert_allclose(
        logits, np.mean([o[1] for o in outputs], axis=0), rtol=1e-5, atol=1e-6
    )


def test_matrix_initial_weights_are_glorot_uniform():
    members = make_members(dims=(40, 10))
    weights = build(members, mixture_weight_type=MATRIX)
    for m, w in zip(members, weights.weights):
        values = w.numpy()
        limit = np.sqrt(6.0 / (m.last_layer_dim + LOGITS_DIM))
        assert np.all(np.abs(values) <= limit)
        # Uniform on [-limit, limit], not a constant: spread over most of the range.
        assert values.max() > 0.5 * limit and values.min() < -0.5 * limit
    again = build(members, mixture_weight_type=MATRIX)
    for a, b in zip(weights.weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kind", [SCALAR, VECTOR, MATRIX])
@pytest.mark.parametrize("use_bias", [False, True])
def test_logits_formula(kind, use_bias):
    members = make_members()
    outputs = make_outputs(members)
    weights = build(members, mixture_weight_type=kind, use_bias=use_bias)
    randomise(weights)
    expected = np.zeros((BATCH, LOGITS_DIM))
    for (last, logits), w in zip(outputs, weights.weights):
        w = w.numpy().astype(np.float64)
        expected += last @ w if kind is MATRIX else logits * w
    if use_bias:
        expected += weights.bias.numpy()
    got = weights(outputs).numpy()
    assert got.shape == (BATCH, LOGITS_DIM)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [SCALAR, VECTOR, MATRIX])
def test_bias_starts_at_zero_and_only_with_use_bias(kind):
    assert build(make_members(), mixture_weight_type=kind).bias is None
    weights = build(make_members(), mixture_weight_type=kind, use_bias=True)
    np.testing.assert_array_equal(weights.bias.numpy(), np.zeros(LOGITS_DIM))


@pytest.mark.parametrize("kind", [SCALAR, VECTOR, MATRIX])
@pytest.mark.parametrize("use_bias", [False, True])
def test_learn_mixture_weights_controls_trainability(kind, use_bias):
    frozen = build(make_members(), mixture_weight_type=kind, use_bias=use_bias)
    assert frozen.trainable_variables == ()
    assert not frozen.is_trained
    assert len(frozen.variables) == 3 + use_bias
    learned = build(
        make_members(), mixture_weight_type=kind, use_bias=use_bias, learn_mixture_weights=True
    )
    assert len(learned.trainable_variables) == 3 + use_bias
    assert learned.is_trained


def test_frozen_weights_get_no_gradient():
    members = make_members()
    weights = build(members)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(weights(make_outputs(members)))
    assert tape.watched_variables() == ()
    del loss


@pytest.mark.parametrize("kind", [SCALAR, VECTOR, MATRIX])
def test_warm_start_copies_kept_members_by_key(kind):
    previous = build(
        make_members()[:2], mixture_weight_type=kind, use_bias=True, learn_mixture_weights=True
    )
    randomise(previous)
    old = {m.key: w.numpy().copy() for m, w in zip(previous.members, previous.weights)}
    # m1 is kept (now first), m0 is dropped, m2 is new.
    members = [make_members()[1], make_members()[2]]
    weights = build(
        members,
        previous=previous,
        mixture_weight_type=kind,
        use_bias=True,
        learn_mixture_weights=True,
        warm_start_mixture_weights=True,
    )
    np.testing.assert_array_equal(weights.weights[0].numpy(), old["m1"])
    np.testing.assert_array_equal(weights.bias.numpy(), previous.bias.numpy())
    fresh = build(members, mixture_weight_type=kind)
    np.testing.assert_array_equal(weights.weights[1].numpy(), fresh.weights[1].numpy())
    # A copy, not the same variable: training the new candidate leaves the old one alone.
    weights.weights[0].assign(weights.weights[0] + 1.0)
    np.testing.assert_array_equal(previous.weights[1].numpy(), old["m1"])


@pytest.mark.parametrize(
    "warm_flag, previous_kind, kind",
    [
        (False, SCALAR, SCALAR),  # warm start off
        (True, SCALAR, VECTOR),  # different weight type: nothing to copy
    ],
)
def test_no_warm_start(warm_flag, previous_kind, kind):
    members = make_members()[:2]
    previous = build(members, mixture_weight_type=previous_kind, use_bias=True)
    randomise(previous)
    weights = build(
        members,
        previous=previous,
        mixture_weight_type=kind,
        use_bias=True,
        warm_start_mixture_weights=warm_flag,
    )
    for w in weights.weights:
        np.testing.assert_allclose(w.numpy(), np.full(w.shape, 0.5))
    np.testing.assert_array_equal(weights.bias.numpy(), np.zeros(LOGITS_DIM))


def test_warm_start_from_mean_ensemble_starts_fresh():
    members = make_members()[:2]
    previous = MeanEnsembler().build(members=members, logits_dimension=LOGITS_DIM)
    weights = build(members, previous=previous, warm_start_mixture_weights=True)
    for w in weights.weights:
        np.testing.assert_allclose(w.numpy(), 0.5)


@pytest.mark.parametrize("kind", [SCALAR, VECTOR, MATRIX])
def test_penalty_exact_value(kind):
    members = make_members(complexities=(0.0, 1.0, 2.0))
    weights = build(
        members, mixture_weight_type=kind, adanet_lambda=0.1, adanet_beta=0.01, use_bias=True
    )
    randomise(weights)
    expected = sum(
        (0.1 * m.complexity + 0.01) * np.abs(w.numpy()).sum()
        for m, w in zip(members, weights.weights)
    )
    # The bias is not penalised.
    weights.bias.assign(weights.bias * 100.0)
    np.testing.assert_allclose(float(weights.penalty()), expected, rtol=1e-6)


def test_penalty_hand_computed():
    members = [Member("a", 1, 1.0), Member("b", 1, 4.0)]
    weights = build(members, adanet_lambda=0.5, adanet_beta=0.25)
    weights.weights[0].assign(-2.0)
    weights.weights[1].assign(0.5)
    # (0.5*1 + 0.25)*2 + (0.5*4 + 0.25)*0.5 = 1.5 + 1.125
    np.testing.assert_allclose(float(weights.penalty()), 2.625, rtol=1e-7)


def test_penalty_zero_without_lambda_and_beta():
    weights = build(make_members(complexities=(3.0, 3.0, 3.0)))
    assert float(weights.penalty()) == 0.0


def test_penalty_gradient_counts_the_penalty_once():
    members = [Member("a", 1, 2.0), Member("b", 1, 0.0)]
    weights = build(members, adanet_lambda=0.5, adanet_beta=0.125, learn_mixture_weights=True)
    weights.weights[0].assign(0.3)
    weights.weights[1].assign(-0.7)
    with tf.GradientTape() as tape:
        penalty = weights.penalty()
    grads = tape.gradient(penalty, weights.weights)
    np.testing.assert_allclose([float(g) for g in grads], [1.125, -0.125], rtol=1e-7)


def test_negative_lambda_or_beta_rejected():
    with pytest.raises(ValueError, match="adanet_lambda"):
        ComplexityRegularizedEnsembler(adanet_lambda=-0.1)
    with pytest.raises(ValueError, match="adanet_beta"):
        ComplexityRegularizedEnsembler(adanet_beta=-1.0)


def test_mean_ensembler_averages_logits():
    members = make_members()
    outputs = make_outputs(members)
    weights = MeanEnsembler().build(members=members, logits_dimension=LOGITS_DIM)
    np.testing.assert_allclose(
        weights(outputs).numpy(), np.mean([o[1] for o in outputs], axis=0), rtol=1e-6, atol=1e-6
    )
    assert weights.variables == ()
    assert not weights.is_trained
    assert float(weights.penalty()) == 0.0


@pytest.mark.parametrize(
    "ensembler, kind",
    [
        (ComplexityRegularizedEnsembler(mixture_weight_type=SCALAR, use_bias=True), "scalar"),
        (ComplexityRegularizedEnsembler(mixture_weight_type=VECTOR), "vector"),
        (ComplexityRegularizedEnsembler(mixture_weight_type=MATRIX, use_bias=True), "matrix"),
        (MeanEnsembler(), "mean"),
    ],
)
def test_describe_is_json(ensembler, kind):
    members = make_members()
    weights = ensembler.build(members=members, logits_dimension=LOGITS_DIM)
    view = json.loads(json.dumps(weights.describe()))
    assert view["type"] == kind
    assert list(view["weights"]) == ["m0", "m1", "m2"]


def test_describe_values():
    members = make_members()
    scalar = build(members, use_bias=True)
    randomise(scalar)
    view = scalar.describe()
    np.testing.assert_allclose(
        [view["weights"][m.key] for m in members], [w.numpy() for w in scalar.weights], rtol=1e-6
    )
    np.testing.assert_allclose(view["bias"], scalar.bias.numpy(), rtol=1e-6)
    matrix = build(members, mixture_weight_type=MATRIX)
    view = matrix.describe()["weights"]["m2"]
    assert view["shape"] == [7, LOGITS_DIM]
    np.testing.assert_allclose(view["l1_norm"], np.abs(matrix.weights[2].numpy()).sum(), rtol=1e-6)
    mean = MeanEnsembler().build(members=members[:2], logits_dimension=LOGITS_DIM)
    assert mean.describe()["weights"] == {"m0": 0.5, "m1": 0.5}
