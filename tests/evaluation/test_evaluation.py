"""PairedLosses: the standard error of two models' mean loss difference, streamed."""

import numpy as np
import pytest

from trainer.evaluation.streaming import PairedLosses


def _by_hand(losses, weights):
    """The weighted standard error of each pair's difference, from all rows at once."""
    count = len(losses)
    rows = weights.sum() ** 2 / (weights**2).sum()
    out = np.zeros((count, count))
    for i in range(count):
        for j in range(count):
            d = losses[i] - losses[j]
            mean = np.average(d, weights=weights)
            variance = np.average(np.square(d - mean), weights=weights)
            out[i, j] = np.sqrt(variance / (rows - 1))
    return out


@pytest.mark.parametrize("weighted", [False, True])
def test_streamed_batches_give_the_standard_error_of_the_whole(weighted):
    rng = np.random.default_rng(0)
    losses = rng.exponential(size=(3, 500))
    losses[1] = losses[0] + rng.normal(0.1, 0.05, size=500)  # paired: a small, sure gap
    weights = rng.uniform(0.5, 2.0, size=500) if weighted else np.ones(500)
    paired = PairedLosses(3)
    for start in range(0, 500, 64):
        rows = slice(start, start + 64)
        paired.update(losses[:, rows], weights[rows] if weighted else None)
    errors = paired.standard_errors()
    np.testing.assert_allclose(errors, _by_hand(losses, weights), rtol=1e-6, atol=1e-9)
    # Pairing: models 0 and 1 move together, so their difference is far surer than 0 and 2's.
    assert errors[0, 1] < errors[0, 2] / 5
    assert errors[0, 0] == 0.0


def test_non_finite_losses_and_too_few_rows_give_nan():
    paired = PairedLosses(2)
    paired.update(np.array([[1.0], [2.0]]))
    assert np.isnan(paired.standard_errors()).all()  # one row: no spread to measure
    paired.update(np.array([[np.inf, 1.0], [2.0, 3.0]]))
    errors = paired.standard_errors()
    assert np.isnan(errors[0, 1]) and np.isnan(errors[1, 0])
