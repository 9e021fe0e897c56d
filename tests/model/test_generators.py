"""Generators (pure functions of the iteration context) and the subnetworks builders make."""

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from trainer.errors import InputError
from trainer.input.features import encoded
from trainer.model import (
    CrossBuilder,
    CrossGenerator,
    DNNBuilder,
    DNNGenerator,
    Inputs,
    IterationContext,
    LinearBuilder,
    LinearGenerator,
    Subnetwork,
    UnionGenerator,
    find_builder,
)
from trainer.model.subnetwork import Generator, propose


def names(builders):
    return [b.name for b in builders]


def context(iteration, *previous):
    return IterationContext(iteration, tuple(previous))


@pytest.mark.parametrize(
    "ctx, expected",
    [
        (context(0), ["dnn_0x64", "dnn_1x64"]),
        (context(1, DNNBuilder(1)), ["dnn_1x64", "dnn_2x64"]),
        (context(1, DNNBuilder(0)), ["dnn_0x64", "dnn_1x64"]),
        # the newest DNN member decides, not the deepest
        (context(3, DNNBuilder(1), DNNBuilder(3), DNNBuilder(2)), ["dnn_2x64", "dnn_3x64"]),
        # non-DNN members are skipped
        (context(2, DNNBuilder(2), LinearBuilder(), CrossBuilder(4)), ["dnn_2x64", "dnn_3x64"]),
        # no DNN member yet: start at the initial depth
        (context(1, LinearBuilder()), ["dnn_0x64", "dnn_1x64"]),
    ],
)
def test_dnn_generator(ctx, expected):
    assert names(DNNGenerator().generate_candidates(ctx)) == expected


def test_dnn_generator_options_reach_builders():
    builders = DNNGenerator(layer_size=8, initial_num_layers=2, dropout=0.25).generate_candidates(
        context(0)
    )
    assert builders == [DNNBuilder(2, 8, 0.25), DNNBuilder(3, 8, 0.25)]


@pytest.mark.parametrize(
    "ctx, expected",
    [
        (context(0), ["cross_1x64", "cross_2x64"]),
        (context(1, CrossBuilder(2)), ["cross_2x64", "cross_3x64"]),
        (context(2, CrossBuilder(3), DNNBuilder(5), CrossBuilder(1)), ["cross_1x64", "cross_2x64"]),
        (context(1, DNNBuilder(3)), ["cross_1x64", "cross_2x64"]),
    ],
)
def test_cross_generator(ctx, expected):
    assert names(CrossGenerator().generate_candidates(ctx)) == expected


def test_cross_generator_options_reach_builders():
    assert CrossGenerator(layer_size=8, rank=2).generate_candidates(context(0)) == [
        CrossBuilder(1, 8, 2),
        CrossBuilder(2, 8, 2),
    ]


@pytest.mark.parametrize("ctx", [context(0), context(3, LinearBuilder(), LinearBuilder())])
def test_linear_generator(ctx):
    assert LinearGenerator().generate_candidates(ctx) == [LinearBuilder()]


def test_union_generator_concatenates_in_order():
    union = UnionGenerator(
        (LinearGenerator(), DNNGenerator(layer_size=16), CrossGenerator(layer_size=16))
    )
    got = names(union.generate_candidates(context(1, DNNBuilder(2, 16), CrossBuilder(1, 16))))
    assert got == ["linear", "dnn_2x16", "dnn_3x16", "cross_1x16", "cross_2x16"]


class Fixed(Generator):
    def __init__(self, builders):
        self.builders = builders

    def generate_candidates(self, context):
        return self.builders


def test_propose_returns_a_list_of_the_builders():
    assert propose(DNNGenerator(), context(0)) == [DNNBuilder(0), DNNBuilder(1)]


def test_propose_rejects_no_builders_at_the_start_and_ends_the_search_later():
    with pytest.raises(ValueError, match="Fixed proposed no subnetwork in iteration 0"):
        propose(Fixed([]), context(0))
    assert propose(Fixed([]), context(4)) == []


@pytest.mark.parametrize(
    "generator, repeated",
    [
        (Fixed([DNNBuilder(1), DNNBuilder(1)]), "dnn_1x64"),
        (UnionGenerator((DNNGenerator(), DNNGenerator())), "dnn_0x64"),
        (UnionGenerator((LinearGenerator(), LinearGenerator())), "linear"),
    ],
)
def test_propose_rejects_duplicate_names(generator, repeated):
    with pytest.raises(ValueError, match="same name") as info:
        propose(generator, context(0))
    assert repeated in str(info.value)


def test_propose_accepts_distinct_union():
    union = UnionGenerator((DNNGenerator(layer_size=8), DNNGenerator(layer_size=16)))
    assert names(propose(union, context(0))) == ["dnn_0x8", "dnn_1x8", "dnn_0x16", "dnn_1x16"]


def test_find_builder():
    ctx = context(2, DNNBuilder(3, 16))
    assert find_builder(DNNGenerator(layer_size=16), ctx, "dnn_4x16") == DNNBuilder(4, 16)


def test_find_builder_error_names_what_was_recorded_and_what_is_proposed():
    with pytest.raises(InputError) as info:  # bad input: a resume with other flags
        find_builder(DNNGenerator(), context(2, DNNBuilder(1)), "dnn_7x64")
    message = str(info.value)
    for part in ("dnn_7x64", "iteration 2", "dnn_1x64", "dnn_2x64", "--job_dir"):
        assert part in message


@pytest.mark.parametrize(
    "builder, name, complexity",
    [
        (DNNBuilder(0), "dnn_0x64", 0.0),
        (DNNBuilder(1, 32), "dnn_1x32", 1.0),
        (DNNBuilder(4, 8), "dnn_4x8", 2.0),
        (DNNBuilder(3), "dnn_3x64", math.sqrt(3)),
        (CrossBuilder(1), "cross_1x64", math.sqrt(2)),
        (CrossBuilder(3, 16), "cross_3x16", 2.0),
        (LinearBuilder(), "linear", 0.0),
    ],
)
def test_builder_name_and_complexity(builder, name, complexity):
    assert builder.name == name
    assert builder.complexity == pytest.approx(complexity, rel=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda: DNNBuilder(-1),
        lambda: DNNBuilder(1, 0),
        lambda: DNNBuilder(1, 4, 1.0),
        lambda: DNNBuilder(1, 4, -0.1),
        lambda: CrossBuilder(0),
        lambda: CrossBuilder(1, 0),
        lambda: CrossBuilder(1, 4, 0),
    ],
)
def test_builders_check_themselves(make):
    with pytest.raises(ValueError, match="must be|must all|>= 0|>= 1"):
        make()


def test_builders_are_frozen_values():
    assert DNNBuilder(2, 8) == DNNBuilder(2, 8)
    assert hash(CrossBuilder(1)) == hash(CrossBuilder(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        DNNBuilder(2).num_layers = 3  # type: ignore[misc]  # what the test checks


INPUT_DIM = 6


@pytest.mark.parametrize(
    "builder, last_dim",
    [
        (DNNBuilder(0, 8), INPUT_DIM),
        (DNNBuilder(1, 8), 8),
        (DNNBuilder(2, 5, dropout=0.5), 5),
        (CrossBuilder(1, 4, rank=2), 4),
        (CrossBuilder(2, 3, rank=2), 3),
        (LinearBuilder(), INPUT_DIM),
    ],
)
@pytest.mark.parametrize("logits_dim", [1, 3])
def test_subnetwork_output_shapes(builder, last_dim, logits_dim):
    net = Subnetwork(
        builder, inputs=Inputs(INPUT_DIM), logits_dimension=logits_dim, seed=3, name="s"
    )
    features = tf.constant(np.random.default_rng(0).normal(size=(5, INPUT_DIM)), tf.float32)
    last, logits = net(encoded(features))
    assert tuple(last.shape) == (5, last_dim)
    assert tuple(logits.shape) == (5, logits_dim)
    assert net.last_layer_dim == last_dim
    # logits are a linear layer on the last layer
    assert net.logits_layer is not None
    kernel, bias = net.logits_layer.kernel.numpy(), net.logits_layer.bias.numpy()
    np.testing.assert_allclose(logits.numpy(), last.numpy() @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_linear_subnetwork_last_layer_is_the_plain_features():
    """Without bins in the encoding every input is plain; with them, the linear model reads
    only the positions `Inputs.plain` names, while a DNN reads everything."""
    features = tf.constant([[1.0, -2.0, 3.0]])
    net = Subnetwork(LinearBuilder(), inputs=Inputs(3), logits_dimension=1, seed=0, name="lin")
    np.testing.assert_array_equal(net(encoded(features))[0].numpy(), features.numpy())

    inputs = Inputs(3, plain=(0, 2))
    net = Subnetwork(LinearBuilder(), inputs=inputs, logits_dimension=1, seed=0, name="lin")
    np.testing.assert_array_equal(net(encoded(features))[0].numpy(), [[1.0, 3.0]])
    assert net.parameters == 3
    dnn = Subnetwork(DNNBuilder(0), inputs=inputs, logits_dimension=1, seed=0, name="dnn")
    assert dnn.last_layer_dim == 3


def test_subnetwork_is_deterministic_in_seed():
    features = encoded(tf.ones([2, INPUT_DIM]))

    def logits(seed):
        return Subnetwork(
            DNNBuilder(1, 4), inputs=Inputs(INPUT_DIM), logits_dimension=1, seed=seed, name="s"
        )(features)[1].numpy()

    np.testing.assert_array_equal(logits(7), logits(7))
    assert not np.allclose(logits(7), logits(8))


def test_dropout_only_in_training():
    net = Subnetwork(
        DNNBuilder(1, 64, dropout=0.5),
        inputs=Inputs(INPUT_DIM),
        logits_dimension=1,
        seed=0,
        name="s",
    )
    features = encoded(tf.ones([4, INPUT_DIM]))
    np.testing.assert_array_equal(net(features)[0].numpy(), net(features)[0].numpy())
    trained = net(features, training=True)[0].numpy()
    assert (trained == 0).sum() > (net(features)[0].numpy() == 0).sum()
