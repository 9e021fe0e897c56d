"""The complexity term of the AdaNet objective, checked numerically."""

import numpy as np
import pytest
import tensorflow as tf

from trainer.ensemble.objective import complexity_penalty


@pytest.mark.parametrize(
    "lam, beta, expected",
    [
        (0.0, 0.0, 0.0),
        # weights [1.5, [-1, 2]], complexities [1, 3]
        (1.0, 0.0, 1 * 1.5 + 3 * 3.0),
        (0.0, 1.0, 1.5 + 3.0),
        (0.1, 0.2, (0.1 * 1 + 0.2) * 1.5 + (0.1 * 3 + 0.2) * 3.0),
    ],
)
def test_penalty_values(lam, beta, expected):
    weights = [tf.constant(1.5), tf.constant([-1.0, 2.0])]
    got = complexity_penalty(weights, [1.0, 3.0], adanet_lambda=lam, adanet_beta=beta)
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def test_penalty_matches_numpy_for_matrices():
    rng = np.random.default_rng(0)
    weights = [
        rng.normal(size=(4, 3)).astype(np.float32),
        rng.normal(size=(2, 3)).astype(np.float32),
    ]
    complexities = [np.sqrt(2.0), np.sqrt(5.0)]
    got = complexity_penalty(
        [tf.constant(w) for w in weights], complexities, adanet_lambda=0.01, adanet_beta=0.001
    )
    expected = sum((0.01 * r + 0.001) * np.abs(w).sum() for w, r in zip(weights, complexities))
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def test_penalty_is_a_scalar_float32():
    got = complexity_penalty([tf.constant([1.0, 2.0])], [1.0], adanet_lambda=1.0, adanet_beta=0.0)
    assert got.shape == ()
    assert got.dtype == tf.float32


def test_penalty_gradient_is_lambda_r_plus_beta_times_sign():
    w = [tf.Variable([0.5, -0.25]), tf.Variable(-3.0)]
    with tf.GradientTape() as tape:
        penalty = complexity_penalty(w, [2.0, 1.0], adanet_lambda=0.25, adanet_beta=0.5)
    grads = tape.gradient(penalty, w)
    np.testing.assert_allclose(grads[0].numpy(), [1.0, -1.0])
    np.testing.assert_allclose(grads[1].numpy(), -0.75)


def test_zero_complexity_members_still_pay_beta():
    got = complexity_penalty([tf.constant(2.0)], [0.0], adanet_lambda=10.0, adanet_beta=0.5)
    np.testing.assert_allclose(float(got), 1.0)
