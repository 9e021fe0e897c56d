"""Checkpoints hold every variable of every kind of subnetwork, and a restored iteration
continues exactly as the original would have."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainer import ensemble as ens
from trainer.config import TrainOptions
from trainer.input.features import encoded
from trainer.input.schema import Embedded, HeadType, Label
from trainer.model import CrossBuilder, DNNBuilder, Inputs, LinearBuilder, Subnetwork
from trainer.model.heads import Head
from trainer.search.frozen import FrozenEnsemble, FrozenMember
from trainer.search.iteration import Iteration

BUILDERS = [
    DNNBuilder(0),
    DNNBuilder(2, 8, dropout=0.1),
    CrossBuilder(2, 8, rank=3),
    LinearBuilder(),
]
HEAD = Head(Label("y", HeadType.MULTICLASS, classes=("a", "b", "c")))
# Six dense inputs and one embedded column of 50 ids.
INPUTS = Inputs(6, (Embedded("id", 50, 4),))


def _features(n, seed):
    return encoded(
        tf.random.stateless_normal([n, 6], seed=[seed, 2]),
        tf.random.stateless_uniform([n, 1], seed=[seed, 3], maxval=50, dtype=tf.int64),
    )


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.name)
def test_frozen_ensemble_round_trips_every_variable(builder, tmp_path):
    def frozen(seed):
        subnetwork = Subnetwork(builder, inputs=INPUTS, logits_dimension=3, seed=seed, name="s")
        weights = ens.ComplexityRegularizedEnsembler(
            mixture_weight_type=ens.MixtureWeightType.MATRIX, use_bias=True
        ).build(members=[ens.Member("t0_s", subnetwork.last_layer_dim, 1.0)], logits_dimension=3)
        return FrozenEnsemble(
            (FrozenMember(0, builder, subnetwork),), weights, ens.ComplexityRegularizedEnsembler()
        )

    original, other = frozen(1), frozen(99)
    prefix = original.checkpoint().write(str(tmp_path / "ensemble"))
    features = _features(5, 1)
    assert not np.allclose(original.logits(features), other.logits(features))
    other.checkpoint().read(prefix).assert_existing_objects_matched()
    np.testing.assert_allclose(other.logits(features), original.logits(features), rtol=1e-6)
    assert len(tf.train.list_variables(prefix)) - 1 >= len(
        original.members[0].subnetwork.checkpoint_variables()
    )


def _iteration():
    builders = [DNNBuilder(1, 8), CrossBuilder(1, 8, rank=2)]
    return Iteration(
        number=0,
        head=HEAD,
        inputs=INPUTS,
        seed=3,
        builders=builders,
        specs=ens.candidate_specs(
            [ens.GrowStrategy(), ens.AllStrategy()], [b.name for b in builders], has_previous=False
        ),
        ensemblers=[ens.ComplexityRegularizedEnsembler(learn_mixture_weights=True, use_bias=True)],
        previous=None,
        options=TrainOptions(batch_size=16, learning_rate=0.01),
        strategy=tf.distribute.get_strategy(),
    )


def _batches(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=64)
    return iter(tf.data.Dataset.from_tensor_slices((_features(64, seed), y)).repeat().batch(16))


def _state(iteration):
    return (
        [v.numpy() for s in iteration.subnetworks for v in s.checkpoint_variables().values()]
        + [v.numpy() for c in iteration.candidates for v in c.weights.variables]
        + [
            v.numpy()
            for o in iteration.embedding_optimizers.values()
            for v in o.variables().values()
        ]
        + [iteration.objective_ema.numpy(), iteration.step.numpy()]
    )


def test_restored_iteration_continues_exactly_like_the_original(tmp_path):
    original = _iteration()
    original.train(_batches(0), 7)
    prefix = original.checkpoint().write(str(tmp_path / "ckpt"))
    original.train(_batches(1), 5)

    restored = _iteration()
    restored.checkpoint().read(prefix).assert_existing_objects_matched()
    assert int(restored.step.numpy()) == 7
    restored.train(_batches(1), 5)
    state = _state(original)
    assert len(state) == len(_state(restored)) > 10
    for a, b in zip(state, _state(restored)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
