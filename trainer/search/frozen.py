"""A finished iteration's chosen ensemble, frozen: its members (each a subnetwork trained in
some iteration, named by `member_key`) and their mixture weights. Later iterations build on it,
the evaluator evaluates it, and the export serves it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainer import ensemble as ens
from trainer.input.features import Encoded, encoded
from trainer.model import Builder, Inputs, Subnetwork

PREVIOUS = "previous_ensemble"


def member_key(iteration: int, builder: Builder) -> str:
    return f"t{iteration}_{builder.name}"


def builder_name(key: str) -> str:
    """The builder's name in a `member_key` ("t2_dnn_1x64" -> "dnn_1x64")."""
    return key.partition("_")[2]


@dataclasses.dataclass(frozen=True)
class FrozenMember:
    iteration: int
    builder: Builder
    subnetwork: Subnetwork

    @property
    def key(self) -> str:
        return member_key(self.iteration, self.builder)

    def as_member(self) -> ens.Member:
        return ens.Member(self.key, self.subnetwork.last_layer_dim, self.builder.complexity)


@dataclasses.dataclass(frozen=True)
class FrozenEnsemble:
    """The best ensemble of a finished iteration: frozen members and their mixture weights."""

    members: tuple[FrozenMember, ...]
    weights: ens.MixtureWeights
    ensembler: ens.Ensembler

    def checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(
            members={m.key: m.subnetwork.checkpoint_variables() for m in self.members},
            weights=self.weights,
        )

    def logits(self, features: tf.Tensor) -> tf.Tensor:
        return self.weights([m.subnetwork(features, training=False) for m in self.members])


def compile_encoded(fn: Callable[[Encoded], Any], inputs: Inputs) -> Callable[[Encoded], Any]:
    """`fn` compiled once for encoded batches of any size (the parts are passed apart: a
    signature of a dict whose keys depend on the schema would do, but less plainly)."""
    dense = tf.TensorSpec([None, inputs.dense_width], tf.float32)
    if inputs.embedded:
        ids = tf.TensorSpec([None, len(inputs.embedded)], tf.int64)
        compiled = tf.function(
            lambda d, i: fn(encoded(d, i)), autograph=False, input_signature=[dense, ids]
        )
        return lambda features: compiled(features["dense"], features["ids"])
    compiled = tf.function(lambda d: fn(encoded(d)), autograph=False, input_signature=[dense])
    return lambda features: compiled(features["dense"])
