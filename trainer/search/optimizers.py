"""The optimizers of subnetworks and mixture weights, as pure update rules over tensors.

A rule maps (value, gradient, slots, step) to (new value, new slots); `Optimizer` keeps each
variable's slots in variables beside it and runs the rule two ways:

- on variables, one step at a time (`apply`), under any strategy: the synchronous replicas
  of a mirrored strategy sum their gradients and update each copy alike;
- on tensors carried through a compiled loop (`update`): a worker of a parameter-server
  cluster reads its unit's variables and slots once per chunk of steps, trains them in its own
  memory, and writes them back once (`trainer/search/iteration.py`), instead of a round trip to the
  servers for every variable at every step.

The formulas are Keras's (Adam with bias correction, SGD, RMSprop with rho 0.9, Adagrad with
accumulators from 0.1), with the same defaults, so a job trains as it did on Keras optimizers.

Example::

    optimizer = Optimizer("adam", learning_rate=1e-3, variables=model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)   # in a replica context
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from trainer.config import OPTIMIZER_NAMES

_EPSILON = 1e-7
# A rule: (value, gradient, slots, step as float32, learning rate) -> (value, slots).
# The rate may be a tensor: a schedule's (`cosine_decay`) times the learning rate.
Rule = Callable[
    [tf.Tensor, tf.Tensor, tuple[tf.Tensor, ...], tf.Tensor, float],
    tuple[tf.Tensor, tuple[tf.Tensor, ...]],
]


@dataclasses.dataclass(frozen=True)
class _Kind:
    rule: Rule
    slots: tuple[float, ...]  # the initial value of each slot


def _adam(value, grad, slots, step, rate, beta_1=0.9, beta_2=0.999):
    m, v = slots
    m = m + (grad - m) * (1.0 - beta_1)
    v = v + (tf.square(grad) - v) * (1.0 - beta_2)
    alpha = rate * tf.sqrt(1.0 - beta_2**step) / (1.0 - beta_1**step)
    return value - alpha * m / (tf.sqrt(v) + _EPSILON), (m, v)


def _sgd(value, grad, slots, step, rate):
    return value - rate * grad, slots


def _rmsprop(value, grad, slots, step, rate, rho=0.9):
    (v,) = slots
    v = rho * v + (1.0 - rho) * tf.square(grad)
    return value - rate * grad / (tf.sqrt(v) + _EPSILON), (v,)


def _adagrad(value, grad, slots, step, rate):
    (accumulator,) = slots
    accumulator = accumulator + tf.square(grad)
    return value - rate * grad / tf.sqrt(accumulator + _EPSILON), (accumulator,)


_KINDS = dict(
    zip(
        OPTIMIZER_NAMES,
        (
            _Kind(_adam, (0.0, 0.0)),
            _Kind(_sgd, ()),
            _Kind(_rmsprop, (0.0,)),
            _Kind(_adagrad, (0.1,)),
        ),
    )
)


def cosine_decay(progress: tf.Tensor, steps: int) -> tf.Tensor:
    """The learning rate's factor after `progress` of an iteration's `steps` steps: 1 at the
    first step, falling along a half cosine to 0 at the last (SGDR's schedule without restarts,
    Loshchilov & Hutter 2017). Each iteration's new subnetworks get the whole schedule: on
    census it adds 0.0013 test accuracy over a constant rate at the same speed (5 seeds,
    bench/results/defaults_schedule.json)."""
    done = tf.minimum(tf.cast(progress, tf.float32) / float(steps), 1.0)
    return 0.5 * (1.0 + tf.cos(math.pi * done))


def _flat(tensors: Sequence) -> tf.Tensor:
    """`tensors` (or variables) flattened and joined into one float32 vector."""
    if not tensors:
        return tf.zeros([0])
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def _unflat(flat: tf.Tensor, variables: Sequence) -> list[tf.Tensor]:
    """`flat` (from `_flat`) split back into tensors of `variables`' shapes."""
    shapes = [tuple(v.shape) for v in variables]
    parts = tf.split(flat, [math.prod(shape) for shape in shapes])
    return [tf.reshape(part, shape) for part, shape in zip(parts, shapes)]


def tf_variable(variable) -> tf.Variable:
    """The tf.Variable of a Keras variable (outside a `keras.StatelessScope`), or `variable`."""
    return variable.value if isinstance(variable, keras.Variable) else variable


class State(NamedTuple):
    """An optimizer's state as tensors: the steps taken, and each slot of every variable
    flattened into one vector (the variables' values one after the other, in their order; a
    NamedTuple, so a compiled loop carries it as it is)."""

    steps: tf.Tensor
    slots: tuple[tf.Tensor, ...]


class Optimizer:
    """One of `OPTIMIZER_NAMES` over a fixed list of variables, each at the learning rate
    times its `rate_scales` entry (default 1). Create it in the strategy and device scope of
    the variables: each slot is created beside its variable."""

    def __init__(
        self,
        name: str,
        *,
        learning_rate: float,
        variables: Sequence,
        weight_decay: float = 0.0,
        rate_scales: Sequence[float] | None = None,
    ):
        if name not in _KINDS:
            raise ValueError(f"optimizer '{name}' is not one of {OPTIMIZER_NAMES}.")
        self.name, self.learning_rate = name, learning_rate
        self.weight_decay = weight_decay
        self._kind = _KINDS[name]
        strategy = tf.distribute.get_strategy()
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self.slots: dict[int, tuple[tf.Variable, ...]] = {}
        scales = [1.0] * len(variables) if rate_scales is None else list(rate_scales)
        self._rate_scales = {id(v): scale for v, scale in zip(variables, scales, strict=True)}
        for variable in variables:
            with strategy.extended.colocate_vars_with(tf_variable(variable)):
                self.slots[id(variable)] = tuple(
                    tf.Variable(tf.fill(variable.shape, initial), trainable=False, name=f"slot_{j}")
                    for j, initial in enumerate(self._kind.slots)
                )

    def checkpoint(self) -> tf.train.Checkpoint:
        ordered = list(self.slots.values())
        return tf.train.Checkpoint(
            steps=self.steps,
            slots={str(i): {str(j): s for j, s in enumerate(v)} for i, v in enumerate(ordered)},
        )

    def _step(self, value, grad, slots, step, rate):
        """The rule's step, then decoupled weight decay (Loshchilov & Hutter's AdamW): the
        value shrinks by `rate` x `weight_decay` of itself, apart from the gradient's
        moments."""
        new_value, slots = self._kind.rule(value, grad, slots, step, rate)
        if self.weight_decay:
            new_value -= rate * self.weight_decay * value
        return new_value, slots

    # -- on tensors -----------------------------------------------------------------------
    # The rules are elementwise, so a step on tensors runs once over all the variables'
    # values flattened into one vector: a dozen ops per step instead of a dozen per variable
    # (on census, op overhead is most of a step's time and of tracing the loop).
    def read(self, variables: Sequence) -> State:
        """The state of `variables`' slots now."""
        return State(
            tf.identity(self.steps),
            tuple(
                _flat([self.slots[id(v)][j] for v in variables])
                for j in range(len(self._kind.slots))
            ),
        )

    def update(
        self,
        values: Sequence[tf.Tensor],
        grads: Sequence[tf.Tensor],
        state: State,
        *,
        variables: Sequence,
        scale: tf.Tensor | float = 1.0,
    ) -> tuple[list[tf.Tensor], State]:
        """One step on tensors (the values of `variables`) at `scale` times the learning rate:
        the new values and state."""
        if not variables:
            return list(values), state
        steps = state.steps + 1
        rate = self.learning_rate * scale * self._flat_rate_scales(variables)
        value, slots = self._step(
            _flat(values),
            _flat([tf.convert_to_tensor(g) for g in grads]),
            state.slots,
            tf.cast(steps, tf.float32),
            rate,
        )
        return _unflat(value, variables), State(steps, tuple(slots))

    def write(self, variables: Sequence, state: State, *, steps_taken: tf.Tensor) -> None:
        """Stores `state` (reached after `steps_taken` steps from what `read` gave) for
        `variables`. Steps add up; slots are the last writer's, as a worker's chunk ends."""
        self.steps.assign_add(steps_taken)
        if not variables:
            return
        for j, flat in enumerate(state.slots):
            for variable, value in zip(variables, _unflat(flat, variables)):
                self.slots[id(variable)][j].assign(value)

    def _flat_rate_scales(self, variables: Sequence) -> tf.Tensor | float:
        """Each value's rate scale, as one vector beside the flattened values (a number when
        they are all the same)."""
        scales = [self._rate_scales[id(v)] for v in variables]
        if len(set(scales)) == 1:
            return scales[0]
        sizes = [math.prod(v.shape) for v in variables]
        return tf.constant(np.repeat(np.asarray(scales, np.float32), sizes))

    # -- on variables ---------------------------------------------------------------------
    def apply(
        self, grads: Sequence[tf.Tensor], variables: Sequence, *, scale: tf.Tensor | float = 1.0
    ) -> None:
        """One step on `variables` at `scale` times the learning rate (in a replica context of
        any strategy)."""
        strategy = tf.distribute.get_strategy()
        grads = list(grads)
        if strategy.num_replicas_in_sync > 1:
            grads = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, grads
            )

        def update(strategy, grads):
            strategy.extended.update(self.steps, lambda s: s.assign_add(1), group=False)
            step = tf.cast(self.steps, tf.float32)
            for grad, variable in zip(grads, variables):
                strategy.extended.update(
                    tf_variable(variable),
                    self._update_variable,
                    args=(grad, self.slots[id(variable)], step, self._rate(variable, scale)),
                )

        tf.__internal__.distribute.interim.maybe_merge_call(update, strategy, grads)

    def _rate(self, variable, scale: tf.Tensor | float) -> tf.Tensor | float:
        return self.learning_rate * scale * self._rate_scales[id(variable)]

    def _update_variable(self, variable, grad, slots, step, rate):
        value, new_slots = self._step(
            variable.read_value(), grad, tuple(s.read_value() for s in slots), step, rate
        )
        for slot, new in zip(slots, new_slots):
            slot.assign(new)
        return variable.assign(value)


class DelayedNesterov:
    """The outer step of workers that train the same variables apart, each a chunk of steps
    from what it read, and add their chunk's change when it ends (replication on parameter
    servers): delayed Nesterov momentum (Liu et al. 2024, "Asynchronous Local-SGD"; DiLoCo's
    outer Nesterov for arrivals that do not wait for each other).

    Each arriving change, over `writers` (the workers training these variables), moves them
    at once by `learning_rate` times that share, and adds it to a buffer; every `writers`
    arrivals (about one change from each worker) the momentum becomes `momentum` x itself
    plus the buffer, and the variables move by `learning_rate` x `momentum` x the momentum
    too. `learning_rate` 1 and `momentum` 0 is the plain average of the changes (asynchronous
    FedAvg). Arrivals are counted in `groups` apart (placement's units: each trains variables
    of its own, with workers of its own). Create it in the strategy scope of the variables:
    its slots live beside them."""

    def __init__(
        self, variables: Sequence, *, learning_rate: float, momentum: float, groups: int = 1
    ):
        self.learning_rate, self.momentum = learning_rate, momentum
        strategy = tf.distribute.get_strategy()
        self.arrivals = tuple(
            tf.Variable(0, dtype=tf.int64, trainable=False, name="arrivals") for _ in range(groups)
        )
        self.slots: dict[int, tuple[tf.Variable, tf.Variable]] = {}
        for variable in variables if momentum else ():  # no momentum: a rate alone, no state
            with strategy.extended.colocate_vars_with(tf_variable(variable)):
                self.slots[id(variable)] = tuple(
                    tf.Variable(tf.zeros(variable.shape), trainable=False, name=name)
                    for name in ("buffer", "momentum")
                )

    def checkpoint(self) -> tf.train.Checkpoint:
        ordered = list(self.slots.values())
        return tf.train.Checkpoint(
            arrivals={str(g): a for g, a in enumerate(self.arrivals)},
            slots={str(i): {"buffer": b, "momentum": m} for i, (b, m) in enumerate(ordered)},
        )

    def apply(
        self, variables: Sequence, changes: Sequence[tf.Tensor], *, writers: int, group: int = 0
    ) -> None:
        """Adds one worker's chunk `changes` (end minus start, per variable) to `variables`,
        the variables of `group`."""
        if not variables:
            return
        for variable, change in zip(variables, changes):
            share = change / writers
            tf_variable(variable).assign_add(self.learning_rate * share)
            if self.momentum:
                self.slots[id(variable)][0].assign_add(share)
        arrival = self.arrivals[group].assign_add(1)
        if not self.momentum:
            return

        def outer_step():
            for variable in variables:
                buffer, momentum = self.slots[id(variable)]
                moved = momentum.assign(self.momentum * momentum + buffer)
                buffer.assign(tf.zeros_like(buffer))
                tf_variable(variable).assign_add(self.learning_rate * self.momentum * moved)
            return tf.constant(True)

        tf.cond(tf.equal(arrival % writers, 0), outer_step, lambda: tf.constant(False))
