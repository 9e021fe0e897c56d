"""Checkpoints hold every variable of every kind of subnetwork, and a restored iteration
continues exactly as the original would have."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainer import ensemble as ens
from trainer.heads import Head
from trainer.iteration import FrozenEnsemble, FrozenMember, Iteration, TrainOptions
from trainer.model import CrossBuilder, DNNBuilder, LinearBuilder, Subnetwork
from trainer.schema import HeadType, Label

BUILDERS = [DNNBuilder(0), DNNBuilder(2, 8, dropout=0.1), CrossBuilder(2, 8, rank=3),
            LinearBuilder()]
HEAD = Head(Label("y", HeadType.MULTICLASS, classes=("a", "b", "c")))


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.name)
def test_frozen_ensemble_round_trips_every_variable(builder, tmp_path):
    def frozen(seed):
        subnetwork = Subnetwork(builder, input_dim=6, logits_dimension=3, seed=seed, name="s")
        weights = ens.ComplexityRegularizedEnsembler(
            mixture_weight_type=ens.MixtureWeightType.MATRIX, use_bias=True).build(
            members=[ens.Member("t0_s", subnetwork.last_layer_dim, 1.0)], logits_dimension=3)
        return FrozenEnsemble((FrozenMember(0, builder, subnetwork),), weights,
                              ens.ComplexityRegularizedEnsembler())

    original, other = frozen(1), frozen(99)
    prefix = original.checkpoint().write(str(tmp_path / "ensemble"))
    features = tf.random.stateless_normal([5, 6], seed=[1, 2])
    if original.members[0].subnetwork.variables[:-2]:  # a hidden layer: seeds differ
        assert not np.allclose(original.logits(features), other.logits(features))
    other.checkpoint().read(prefix).assert_existing_objects_matched()
    np.testing.assert_allclose(other.logits(features), original.logits(features), rtol=1e-6)
    assert len(tf.train.list_variables(prefix)) - 1 >= len(
        original.members[0].subnetwork.variables)


def _iteration():
    builders = [DNNBuilder(1, 8), CrossBuilder(1, 8, rank=2)]
    return Iteration(number=0, head=HEAD, input_dim=6, seed=3, builders=builders,
                     specs=ens.candidate_specs([ens.GrowStrategy(), ens.AllStrategy()],
                                               [b.name for b in builders], has_previous=False),
                     ensemblers=[ens.ComplexityRegularizedEnsembler(
                         learn_mixture_weights=True, use_bias=True)],
                     previous=None, options=TrainOptions(batch_size=16, learning_rate=0.01),
                     strategy=tf.distribute.get_strategy())


def _batches(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=64)
    return iter(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16))


def _state(iteration):
    return [v.numpy() for s in iteration.subnetworks for v in s.variables] + [
        v.numpy() for c in iteration.candidates for v in c.weights.variables] + [
        iteration.objective_ema.numpy(), iteration.step.numpy()]


def test_restored_iteration_continues_exactly_like_the_original(tmp_path):
    original = _iteration()
    original.train(_batches(0), 7)
    prefix = original.checkpoint().write(str(tmp_path / "ckpt"))
    original.train(_batches(1), 5)

    restored = _iteration()
    restored.checkpoint().read(prefix).assert_existing_objects_matched()
    assert int(restored.step.numpy()) == 7
    restored.train(_batches(1), 5)
    for a, b in zip(_state(original), _state(restored)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
