"""The optimizers' rules are Keras's, and the two ways of running them agree."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.config import OPTIMIZER_NAMES
from trainer.search.optimizers import DelayedNesterov, Optimizer, cosine_decay

KERAS = {
    "adam": keras.optimizers.Adam,
    "sgd": keras.optimizers.SGD,
    "rmsprop": keras.optimizers.RMSprop,
    "adagrad": keras.optimizers.Adagrad,
}
GRADS = [np.array([[0.5, -1.0], [2.0, 0.1]], np.float32) * (s + 1) for s in range(5)]
START = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)


@pytest.mark.parametrize("weight_decay", [0.0, 0.3])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_steps_on_variables_match_keras(name, weight_decay):
    ours = tf.Variable(START)
    optimizer = Optimizer(name, learning_rate=0.01, variables=[ours], weight_decay=weight_decay)
    theirs = keras.Variable(START)
    reference = KERAS[name](learning_rate=0.01, weight_decay=weight_decay or None)
    for grad in GRADS:
        optimizer.apply([tf.constant(grad)], [ours])
        reference.apply_gradients([(tf.constant(grad), theirs)])
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-7)
    assert int(optimizer.steps.numpy()) == len(GRADS)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_a_rate_scale_steps_as_that_multiple_of_the_learning_rate(name):
    """A variable's rate scale: on variables and on tensors alike, its steps are those of the
    scaled learning rate; the other variables keep the plain rate."""
    scaled, plain = tf.Variable(START), tf.Variable(START)
    optimizer = Optimizer(
        name, learning_rate=0.01, variables=[scaled, plain], rate_scales=[3.0, 1.0]
    )
    on_tensors = tf.Variable(START)
    chunked = Optimizer(name, learning_rate=0.01, variables=[on_tensors], rate_scales=[3.0])
    values, state = [tf.identity(on_tensors)], chunked.read([on_tensors])
    reference = {
        rate: (keras.Variable(START), KERAS[name](learning_rate=rate)) for rate in (0.03, 0.01)
    }
    for grad in GRADS:
        optimizer.apply([tf.constant(grad)] * 2, [scaled, plain])
        values, state = chunked.update(values, [tf.constant(grad)], state, variables=[on_tensors])
        for variable, keras_optimizer in reference.values():
            keras_optimizer.apply_gradients([(tf.constant(grad), variable)])
    np.testing.assert_allclose(scaled.numpy(), reference[0.03][0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values[0].numpy(), reference[0.03][0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain.numpy(), reference[0.01][0].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_steps_on_tensors_then_written_back_equal_steps_on_variables(name):
    """Variables of several shapes and rate scales (a step on tensors runs over all of them
    flattened into one vector) end where steps on the variables themselves end."""
    scales = [1.0, 3.0, 0.5]

    def made():
        return [tf.Variable(START), tf.Variable(START[0]), tf.Variable(START[1, 0])]

    def grads(grad):
        return [tf.constant(grad), tf.constant(-grad[1]), tf.constant(grad[0, 1])]

    on_variables = made()
    stepwise = Optimizer(
        name, learning_rate=0.01, variables=on_variables, weight_decay=0.3, rate_scales=scales
    )
    for grad in GRADS:
        stepwise.apply(grads(grad), on_variables)

    on_tensors = made()
    chunked = Optimizer(
        name, learning_rate=0.01, variables=on_tensors, weight_decay=0.3, rate_scales=scales
    )
    values, state = [tf.identity(v) for v in on_tensors], chunked.read(on_tensors)
    for grad in GRADS:
        values, state = chunked.update(values, grads(grad), state, variables=on_tensors)
    for variable, value in zip(on_tensors, values):
        variable.assign(value)
    chunked.write(on_tensors, state, steps_taken=tf.constant(len(GRADS), tf.int64))

    assert int(chunked.steps.numpy()) == int(stepwise.steps.numpy())
    for ours, theirs in zip(on_tensors, on_variables):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
        for a, b in zip(chunked.slots[id(ours)], stepwise.slots[id(theirs)]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    assert not np.allclose(on_tensors[1].numpy(), START[0])  # every variable moved


def test_an_unknown_optimizer_is_refused_by_name():
    with pytest.raises(ValueError, match="'adamw' is not one of"):
        Optimizer("adamw", learning_rate=0.1, variables=[])


def test_cosine_decay_falls_from_1_to_0_over_its_steps_and_stays_there():
    factors = [float(cosine_decay(tf.constant(p, tf.int64), 100)) for p in (0, 50, 100, 150)]
    np.testing.assert_allclose(factors, [1.0, 0.5, 0.0, 0.0], atol=1e-6)


def test_delayed_nesterov_adds_each_change_at_its_share_and_a_momentum_step_per_round():
    """Two workers: each arriving change moves the variable by rate x change / 2 at once;
    every second arrival the momentum (0.5 x itself + the round's shares) moves it by rate x
    0.5 x the momentum as well. Rate 1 and no momentum: the plain average of the changes."""
    variable = tf.Variable([1.0, 2.0])
    outer = DelayedNesterov([variable], learning_rate=0.8, momentum=0.5)
    changes = [np.array(c, np.float32) for c in ([0.2, -0.4], [0.6, 0.0], [-0.2, 0.2], [0.4, 0.4])]
    expected, momentum, buffer = np.array([1.0, 2.0]), np.zeros(2), np.zeros(2)
    for arrival, change in enumerate(changes, start=1):
        outer.apply([variable], [tf.constant(change)], writers=2)
        expected = expected + 0.8 * change / 2
        buffer = buffer + change / 2
        if arrival % 2 == 0:
            momentum = 0.5 * momentum + buffer
            expected, buffer = expected + 0.8 * 0.5 * momentum, np.zeros(2)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
    assert int(outer.arrivals[0].numpy()) == 4

    plain = tf.Variable([1.0, 2.0])
    averaged = DelayedNesterov([plain], learning_rate=1.0, momentum=0.0)
    averaged.apply([plain], [tf.constant(changes[0])], writers=2)
    np.testing.assert_allclose(plain.numpy(), [1.1, 1.8], rtol=1e-6)
    assert averaged.slots == {} and int(averaged.arrivals[0].numpy()) == 1  # counted, no state
