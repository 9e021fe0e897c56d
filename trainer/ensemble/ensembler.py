"""Ensemblers: how the members' outputs combine into the ensemble's logits.

An `Ensembler` is a frozen description; `build` makes the `MixtureWeights` (a tf.Module of
variables) of one candidate ensemble. `--ensemblers` names them in `ENSEMBLERS`, each made
from the flags' `EnsemblerOptions` (`from_options`), as `--generator` names generators: a new
ensembler is a class here and a line there.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer.ensemble import objective


class MixtureWeightType(str, enum.Enum):
    SCALAR = "scalar"  # w_j is a scalar times member j's logits
    VECTOR = "vector"  # w_j is a [logits_dim] vector times member j's logits, elementwise
    MATRIX = "matrix"  # w_j is a [last_layer_dim, logits_dim] matrix on member j's last layer


@dataclasses.dataclass(frozen=True)
class EnsemblerOptions:
    """The flags of the ensemblers (those of complexity_regularized; mean takes none)."""

    mixture_weight_type: MixtureWeightType = MixtureWeightType.SCALAR
    adanet_lambda: float = 0.0
    adanet_beta: float = 0.0
    use_bias: bool = False
    learn_mixture_weights: bool = False
    warm_start_mixture_weights: bool = False


@dataclasses.dataclass(frozen=True)
class Member:
    """What an ensembler needs to know of a member: a stable key, its last layer's width and
    its complexity r(h)."""

    key: str
    last_layer_dim: int
    complexity: float


class MixtureWeights(tf.Module, abc.ABC):
    """The variables of one candidate ensemble and its combination rule. The variables are
    Keras variables: a worker's chunk of steps reads them through `keras.StatelessScope`."""

    members: tuple[Member, ...]

    @property
    def keras_variables(self) -> tuple[keras.Variable, ...]:
        """Every variable (`tf.Module` does not list Keras variables as its own)."""
        return ()

    @property
    def variables(self) -> tuple[keras.Variable, ...]:
        return self.keras_variables

    @property
    def trainable_variables(self) -> tuple[keras.Variable, ...]:
        return tuple(v for v in self.keras_variables if v.trainable)

    @abc.abstractmethod
    def __call__(self, outputs: Sequence[tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
        """Combines the members' (last_layer, logits) into the ensemble's logits."""

    def penalty(self) -> tf.Tensor:
        """The complexity term of the AdaNet objective (0 unless the ensembler has one)."""
        return tf.constant(0.0)

    @property
    def reads_last_layers(self) -> bool:
        """Whether `__call__` reads the members' last layers (else their logits alone)."""
        return False

    @property
    def is_trained(self) -> bool:
        return bool(self.trainable_variables)

    def describe(self) -> dict:
        """A JSON-able view of the mixture weights, for the report."""
        return {}


class Ensembler(abc.ABC):
    """Builds the mixture weights of candidate ensembles."""

    name: str

    @abc.abstractmethod
    def build(
        self,
        *,
        members: Sequence[Member],
        logits_dimension: int,
        previous: MixtureWeights | None = None,
    ) -> MixtureWeights:
        """Mixture weights for `members`; `previous` is the previous best ensemble's weights
        (for warm starts), or None."""

    def kept_share(self, members: int) -> float:
        """How much of the previous ensemble's logits a grow candidate of `members` members
        starts with (its new member starts at 1 / members): an even share, (members - 1) /
        members, unless the ensembler keeps the previous weights."""
        return (members - 1) / members


@dataclasses.dataclass(frozen=True)
class ComplexityRegularizedEnsembler(EnsemblerOptions, Ensembler):
    """logits = bias + sum_j w_j * h_j, trained on the AdaNet objective.

    Mixture weights start at 1/N (MATRIX: Glorot uniform); with `learn_mixture_weights=False`
    they stay there (AdaNet's default: a uniform average). `warm_start_mixture_weights` starts
    the members kept from the previous ensemble at their previous weights.

    Cost per step: one multiply-add per member (SCALAR, VECTOR) or one
    [batch, last_layer] x [last_layer, logits] matmul per member (MATRIX).

    Example::

        ComplexityRegularizedEnsembler(mixture_weight_type=MixtureWeightType.VECTOR,
                                       adanet_lambda=0.001, learn_mixture_weights=True)

    Its fields are the flags' `EnsemblerOptions`.
    """

    name = "complexity_regularized"

    @classmethod
    def from_options(cls, options: EnsemblerOptions) -> ComplexityRegularizedEnsembler:
        return cls(**dataclasses.asdict(options))

    def __post_init__(self):
        if self.adanet_lambda < 0 or self.adanet_beta < 0:
            raise ValueError(
                f"adanet_lambda ({self.adanet_lambda}) and adanet_beta "
                f"({self.adanet_beta}) must be >= 0."
            )

    def build(self, *, members, logits_dimension, previous=None):
        return _WeightedSum(self, tuple(members), logits_dimension, previous)

    def kept_share(self, members: int) -> float:
        warm = self.warm_start_mixture_weights and self.mixture_weight_type is not (
            MixtureWeightType.MATRIX
        )
        return 1.0 if warm else super().kept_share(members)


class _WeightedSum(MixtureWeights):
    weights: list[keras.Variable]
    bias: keras.Variable | None

    def __init__(
        self,
        spec: ComplexityRegularizedEnsembler,
        members: tuple[Member, ...],
        logits_dimension: int,
        previous: MixtureWeights | None,
    ):
        super().__init__(name="weighted_sum")
        self.spec = spec
        self.members = members
        warm = {}
        if (
            spec.warm_start_mixture_weights
            and isinstance(previous, _WeightedSum)
            and previous.spec.mixture_weight_type is spec.mixture_weight_type
        ):
            warm = {m.key: w for m, w in zip(previous.members, previous.weights)}
        self.weights = []
        for i, member in enumerate(members):
            if member.key in warm:
                initial = tf.identity(warm[member.key])
            elif spec.mixture_weight_type is MixtureWeightType.MATRIX:
                initial = keras.initializers.GlorotUniform(seed=i)(
                    [member.last_layer_dim, logits_dimension]
                )
            else:
                shape = (
                    []
                    if spec.mixture_weight_type is MixtureWeightType.SCALAR
                    else [logits_dimension]
                )
                initial = tf.fill(shape, 1.0 / len(members))
            self.weights.append(
                keras.Variable(initial, trainable=spec.learn_mixture_weights, name=f"w_{i}")
            )
        self.bias = None
        if spec.use_bias:
            initial = tf.zeros([logits_dimension])
            if warm and isinstance(previous, _WeightedSum) and previous.bias is not None:
                initial = tf.identity(previous.bias)
            self.bias = keras.Variable(initial, trainable=spec.learn_mixture_weights, name="bias")

    @property
    def keras_variables(self):
        return tuple(self.weights) + ((self.bias,) if self.bias is not None else ())

    @property
    def reads_last_layers(self) -> bool:
        return self.spec.mixture_weight_type is MixtureWeightType.MATRIX

    def __call__(self, outputs):
        matrix = self.reads_last_layers
        terms = [
            tf.matmul(last, w) if matrix else logits * w
            for (last, logits), w in zip(outputs, self.weights)
        ]
        logits = tf.add_n(terms)
        return logits + self.bias if self.bias is not None else logits

    def penalty(self):
        return objective.complexity_penalty(
            self.weights,
            [m.complexity for m in self.members],
            adanet_lambda=self.spec.adanet_lambda,
            adanet_beta=self.spec.adanet_beta,
        )

    def describe(self):
        def view(w):
            w = w.numpy()
            if w.ndim == 2:  # a matrix: too big to list; its L1 norm says how much it counts
                return {"l1_norm": float(np.abs(w).sum()), "shape": list(w.shape)}
            return w.tolist()

        out = {
            "type": self.spec.mixture_weight_type.value,
            "weights": {m.key: view(w) for m, w in zip(self.members, self.weights)},
        }
        if self.bias is not None:
            out["bias"] = self.bias.numpy().tolist()
        return out


@dataclasses.dataclass(frozen=True)
class MeanEnsembler(Ensembler):
    """logits = mean_j h_j. No variables, no penalty. Cost per step: one add per member."""

    name = "mean"

    @classmethod
    def from_options(cls, options: EnsemblerOptions) -> MeanEnsembler:
        return cls()

    def build(self, *, members, logits_dimension, previous=None):
        return _Mean(tuple(members))


class _Mean(MixtureWeights):
    def __init__(self, members: tuple[Member, ...]):
        super().__init__(name="mean")
        self.members = members

    def __call__(self, outputs):
        return tf.add_n([logits for _, logits in outputs]) / float(len(outputs))

    def describe(self):
        return {"type": "mean", "weights": {m.key: 1.0 / len(self.members) for m in self.members}}


# What --ensemblers names.
ENSEMBLERS: dict[str, type[ComplexityRegularizedEnsembler] | type[MeanEnsembler]] = {
    ComplexityRegularizedEnsembler.name: ComplexityRegularizedEnsembler,
    MeanEnsembler.name: MeanEnsembler,
}
