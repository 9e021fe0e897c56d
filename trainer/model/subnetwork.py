"""The subnetwork interface.

A `Builder` makes one subnetwork from Keras layers; a `Generator` proposes the builders to try
in an iteration. Both are small frozen values: a generator is a pure function of the iteration
context, so the trainer can ask it again, after a restart, for the builder that made a member.

Example, a user's own search space::

    @dataclasses.dataclass(frozen=True)
    class WideBuilder(Builder):
        units: int

        @property
        def name(self):
            return f"wide_{self.units}"

        @property
        def complexity(self):
            return math.sqrt(self.units / 64)

        def build_body(self, *, input_dim, seed):
            return keras.layers.Dense(self.units, "relu", kernel_initializer=
                                      keras.initializers.GlorotUniform(seed))

    @dataclasses.dataclass(frozen=True)
    class WideGenerator(Generator):
        def generate_candidates(self, context):
            return [WideBuilder(64), WideBuilder(256)]

`examples/wide_generator.py` is this search space, runnable from the command line as
`python -m trainer.task --generator=examples.wide_generator:WideGenerator`
(trainer/model/registry.py).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer import flags
from trainer.errors import InputError
from trainer.input.features import Encoded
from trainer.input.schema import Embedded
from trainer.model import embedding


class Builder(abc.ABC):
    """Makes one subnetwork: a Keras body whose output is the subnetwork's last layer."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Unique among the builders a generator proposes in one iteration."""

    @property
    @abc.abstractmethod
    def complexity(self) -> float:
        """r(h) in the AdaNet objective, e.g. sqrt(depth) for a DNN."""

    @abc.abstractmethod
    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        """Returns Keras layers mapping features [batch, input_dim] to a last layer
        [batch, units]. The trainer adds the logits layer on top."""

    @property
    def plain_inputs(self) -> bool:
        """Whether the body reads only the plain encoding (`Inputs.plain`: each numeric
        column's standardised value and the one-hots, without the piecewise-linear bins)."""
        return False

    @property
    def complexity_scale(self) -> str:
        """The family whose members' complexities compare: the one-standard-error rule
        (`trainer.ensemble.selection`) prefers a simpler candidate only over one of the same
        scale. Networks (depth-based: DNNs, k-head and cross networks, the linear model) share
        "network"."""
        return "network"

    @property
    def learning_rate_scale(self) -> float:
        """The subnetwork's learning rate as a multiple of --learning_rate."""
        return 1.0

    # -- members that are not one network with one head (defaults: one) --------------------
    @property
    def heads(self) -> int:
        """k: the body returns [batch, k, units], read by k linear heads trained together
        on the mean of their losses; the member hands the ensemble the mean of its heads'
        predictions (`Head.mean_of_heads`). 1: the body returns [batch, units]."""
        return 1

    @property
    def fitted(self) -> bool:
        """Whether the member is fitted once by `fit` before its iteration trains (then
        fixed), not trained by gradient steps; it reads the embedded columns' ids as numbers
        (`Subnetwork.fit_inputs`)."""
        return False

    def build_member(
        self, *, input_dim: int, logits_dimension: int, seed: int
    ) -> keras.layers.Layer | None:
        """A layer whose output is the member's logits [batch, logits_dimension] itself (the
        trainer adds no logits layer); None (the default): `build_body` plus a logits layer."""
        return None

    def fit(self, member: keras.layers.Layer, rows: FitRows) -> dict:
        """Fits a `fitted` member (`build_member`'s layer) on the training rows; returns what
        the report says of it."""
        raise NotImplementedError(f"{self.name} is not a fitted member")


FIT_ROWS = 200_000  # the training rows a fitted member is fitted on, at most


@dataclasses.dataclass(frozen=True)
class FitRows:
    """The training rows a fitted member is fitted on: `x` its inputs [rows, width] (float64),
    `labels` as the head reads them (class ids; regression targets standardised, as the
    head's loss takes them), `weights` the example weights (None: equal), a seed, the head's
    per-example loss of those labels and raw scores [rows, logits] (`Head.target_losses`), and
    when (time.monotonic()) a fit that can stop early should (None: no limit)."""

    x: np.ndarray
    labels: np.ndarray
    weights: np.ndarray | None
    regression: bool
    seed: int
    losses: Callable[[np.ndarray, np.ndarray], np.ndarray]
    deadline: float | None = None


@dataclasses.dataclass(frozen=True)
class IterationContext:
    """What a generator may look at: the iteration number and the previous best ensemble's
    members (their builders, oldest first)."""

    iteration: int
    previous_ensemble: tuple[Builder, ...] = ()


@dataclasses.dataclass(frozen=True)
class GeneratorOptions:
    """What `--generator`'s factories get from the flags of `python -m trainer.task`: the
    search-space flags and `--seed` (for a search space that draws its candidates; the
    builders get their own seeds in `build_body`)."""

    layer_size: int = flags.field("layer_size")
    initial_num_layers: int = flags.field("initial_num_layers")
    dropout: float = flags.field("dropout")
    seed: int = flags.field("seed")

    def __post_init__(self):
        flags.check_fields(self)


class Generator(abc.ABC):
    """Proposes candidate subnetworks for an iteration.

    A generator is a value (a frozen dataclass, say): the same settings make an equal
    generator with the same `repr`, which a job dir records to refuse a resume with another.
    """

    @abc.abstractmethod
    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        """Returns the builders to train in `context.iteration`; names must be unique."""

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> Generator:
        """The generator `--generator` makes of this class from the flags; the default takes
        none of them (`cls()`). Override it to read `options`."""
        return cls()


@dataclasses.dataclass(frozen=True)
class UnionGenerator(Generator):
    """Proposes the candidates of every generator it holds, in order."""

    generators: tuple[Generator, ...]

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        return [b for g in self.generators for b in g.generate_candidates(context)]


def parts(generator: Generator) -> tuple[Generator, ...]:
    """The generators `generator` proposes the union of (itself unless it is a union)."""
    if isinstance(generator, UnionGenerator):
        return tuple(g for part in generator.generators for g in parts(part))
    return (generator,)


def propose(generator: Generator, context: IterationContext) -> list[Builder]:
    """Asks the generator for candidates and checks its answer (none after iteration 0: the
    search ends there)."""
    builders = list(generator.generate_candidates(context))
    if not builders and context.iteration > 0:
        return []  # the search ends: nothing more to try
    if not builders:
        raise ValueError(
            f"{type(generator).__name__} proposed no subnetwork in iteration "
            f"{context.iteration}; a generator must propose at least one."
        )
    names = [b.name for b in builders]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"{type(generator).__name__} proposed builders with the same name "
            f"{repeated} in iteration {context.iteration}; names must be unique."
        )
    return builders


def find_builder(generator: Generator, context: IterationContext, name: str) -> Builder:
    """The builder named `name` that the generator proposes in `context` (used on resume)."""
    builders = propose(generator, context)
    for builder in builders:
        if builder.name == name:
            return builder
    raise InputError(
        f"the job dir records subnetwork '{name}' from iteration {context.iteration}, but the "
        f"generator now proposes {[b.name for b in builders]} there. The generator changed "
        "since the job dir was written: use the flags of the first run or a new --job_dir."
    )


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What the subnetworks take (see `trainer.input.features.Encoded`): `dense_width` float inputs
    and the ids of the `embedded` columns; `plain`, the positions of the dense inputs that are
    not piecewise-linear bins (None: all of them); `indicated`, (value, missing indicator)
    positions of the numeric columns with an indicator."""

    dense_width: int
    embedded: tuple[Embedded, ...] = ()
    plain: tuple[int, ...] | None = None
    indicated: tuple[tuple[int, int], ...] = ()

    def width(self, plain: bool = False, ids_as_numbers: bool = False) -> int:
        """The width of what a builder's body gets: the (plain) dense inputs and the
        embeddings (or the ids themselves, one number each)."""
        dense = len(self.plain) if plain and self.plain is not None else self.dense_width
        if ids_as_numbers:
            return dense + len(self.embedded)
        return dense + sum(e.dim for e in self.embedded)


def _missing_as_nan(
    inputs: Inputs, plain: tuple[int, ...] | None
) -> tuple[list[int], list[int]] | None:
    """For a member that reads a missing value as NaN: (the positions of the indicators in
    what it reads, and for each position there the 1-based indicator that makes it NaN, 0 for
    none); None where no column has an indicator."""
    if not inputs.indicated:
        return None
    at = {p: i for i, p in enumerate(plain)} if plain is not None else None

    def position(p: int) -> int:
        return p if at is None else at[p]

    width = len(plain) if plain is not None else inputs.dense_width
    slots = [0] * width
    indicators = []
    for k, (value, indicator) in enumerate(inputs.indicated, start=1):
        slots[position(value)] = k
        indicators.append(position(indicator))
    return indicators, slots


class Subnetwork(tf.Module):
    """A builder's body plus a linear logits layer (k of them for a k-head body; none where
    the builder's `build_member` makes the logits itself): returns (last_layer, logits).
    Embedded columns are looked up in the subnetwork's own tables (`embedding_tables`, trained
    by `LazyAdam`, not by the Keras optimizer) and joined to the dense inputs; a fitted
    member reads their ids as numbers instead."""

    def __init__(
        self,
        builder: Builder,
        *,
        inputs: Inputs,
        logits_dimension: int,
        seed: int,
        name: str,
        mean_of_heads: Callable[[tf.Tensor], tf.Tensor] | None = None,
    ):
        super().__init__(name=name)
        self.builder = builder
        self.inputs = inputs
        self._ids_as_numbers = builder.fitted
        self._tables = (
            [] if builder.fitted else embedding.make_tables(inputs.embedded, seed=seed + 2)
        )
        self._plain = inputs.plain if builder.plain_inputs else None
        self._missing = _missing_as_nan(inputs, self._plain) if builder.fitted else None
        width = inputs.width(plain=builder.plain_inputs, ids_as_numbers=builder.fitted)
        member = builder.build_member(input_dim=width, logits_dimension=logits_dimension, seed=seed)
        self._mean_of_heads = mean_of_heads
        if builder.heads > 1 and mean_of_heads is None:
            raise ValueError(f"{builder.name} has {builder.heads} heads: give mean_of_heads")
        self.logits_layer: keras.layers.Layer | None = None
        if member is not None:
            self.body = member
        else:
            self.body = builder.build_body(input_dim=width, seed=seed)
            self.logits_layer = (
                HeadsLayer(builder.heads, logits_dimension, seed=seed + 1)
                if builder.heads > 1
                else keras.layers.Dense(
                    logits_dimension,
                    kernel_initializer=keras.initializers.GlorotUniform(seed + 1),
                    name="logits",
                )
            )
        last, _, _ = self.forward_inputs(tf.zeros([1, width]))  # creates the variables
        self._last_layer_dim = int(last.shape[-1])

    def fit_inputs(self, features: Encoded) -> tf.Tensor:
        """What the body reads of encoded rows: the (plain) dense inputs, then each embedded
        column's vectors (or, for a fitted member, its id as a number)."""
        x = features["dense"]
        if self._plain is not None:
            x = tf.gather(x, self._plain, axis=1)
        if self._missing is not None:  # a fitted member (trees) routes missing values itself
            indicators, slots = self._missing
            missing = tf.gather(x, indicators, axis=1) > 0.5
            padded = tf.concat([tf.zeros_like(missing[:, :1]), missing], axis=1)
            x = tf.where(tf.gather(padded, slots, axis=1), tf.constant(np.nan, x.dtype), x)
        if self._ids_as_numbers and self.inputs.embedded:
            x = tf.concat([x, tf.cast(features["ids"], x.dtype)], axis=-1)
        if self._tables:
            x = tf.concat([x, *embedding.lookup(self._tables, features["ids"])], axis=-1)
        return x

    def forward(self, features: Encoded, training: bool = False):
        """(last_layer, logits, each head's logits [batch, k, logits] or None for one head)."""
        return self.forward_inputs(self.fit_inputs(features), training=training)

    def forward_inputs(self, x: tf.Tensor, training: bool = False):
        if self.logits_layer is None:
            logits = self.body(x, training=training)
            return logits, logits, None
        last_layer = self.body(x, training=training)
        logits = self.logits_layer(last_layer)
        if self.builder.heads == 1:
            return last_layer, logits, None
        assert self._mean_of_heads is not None
        return tf.reduce_mean(last_layer, axis=1), self._mean_of_heads(logits), logits

    def __call__(self, features: Encoded, training: bool = False):
        last_layer, logits, _ = self.forward(features, training=training)
        return last_layer, logits

    @property
    def embedding_tables(self) -> list[tf.Variable]:
        return list(self._tables)

    @property
    def _layers(self) -> list[keras.layers.Layer]:
        return [self.body] + ([self.logits_layer] if self.logits_layer is not None else [])

    @property
    def dense_variables(self) -> list:
        """The trainable variables the Keras optimizer updates (all but the tables)."""
        return [v for layer in self._layers for v in layer.trainable_variables]

    @property
    def keras_variables(self) -> list[keras.Variable]:
        """The Keras layers' variables, trainable or not (all but the tables)."""
        return [v for layer in self._layers for v in layer.variables]

    def checkpoint_variables(self) -> dict[str, tf.Variable]:
        """Every variable, keyed by creation order, for `tf.train.Checkpoint`.

        Keras 3 layers do not expose layers kept in Python lists (a `Sequential`'s layers, a
        list of sublayers) as checkpoint dependencies, so checkpointing the body silently
        drops their weights. A builder makes the same variables in the same order every time,
        so the position is a stable key.
        """
        variables = self._tables + [getattr(v, "value", v) for v in self.keras_variables]
        return {str(i): v for i, v in enumerate(variables)}

    @property
    def variable_bytes(self) -> int:
        """The bytes of all its variables (what `trainer/placement/cost.py`'s
        `subnetwork_bytes` counts)."""
        variables = self.checkpoint_variables().values()
        return sum(v.shape.num_elements() * v.dtype.size for v in variables)

    @property
    def parameters(self) -> int:
        """How many trainable numbers it holds (embedding tables included); for a fitted
        member, the numbers its fit chose (`parameters` of its layer, e.g. the trees' split
        features, thresholds and leaf values)."""
        if self.builder.fitted and hasattr(self.body, "parameters"):
            return int(self.body.parameters)
        variables = self._tables + self.dense_variables
        return sum(int(np.prod(v.shape)) for v in variables)

    @property
    def last_layer_dim(self) -> int:
        return self._last_layer_dim


class HeadsLayer(keras.layers.Layer):
    """k linear heads, one per slice of a k-head body's output: [batch, k, units] ->
    [batch, k, logits]."""

    def __init__(self, heads: int, logits_dimension: int, *, seed: int):
        super().__init__(name="logits")
        self.heads, self.logits_dimension, self.seed = heads, logits_dimension, seed

    def build(self, input_shape):
        units = int(input_shape[-1])
        limit = float(np.sqrt(6.0 / (units + self.logits_dimension)))  # Glorot, per head
        self.kernel = self.add_weight(
            shape=(self.heads, units, self.logits_dimension),
            initializer=keras.initializers.RandomUniform(-limit, limit, seed=self.seed),
            name="kernel",
        )
        self.bias = self.add_weight(
            shape=(self.heads, self.logits_dimension), initializer="zeros", name="bias"
        )

    def call(self, x):
        return tf.einsum("bku,kul->bkl", x, self.kernel) + self.bias
