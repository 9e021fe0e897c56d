"""A boosted-tree member: scikit-learn's HistGradientBoosting fitted on the training rows, then
compiled into ordinary TensorFlow ops, so the exported model needs no custom op and no
tensorflow-decision-forests, and loads wherever TensorFlow does (2.15 included).

The fitted trees become constant-shape arrays, one row per node of every tree (`Forest`): the
feature a node splits on, its threshold, its children, the side a missing value (NaN) takes,
whether it is a leaf and its value. Prediction walks every tree at once: each row's current
node per tree, one gather per level, until every row sits on a leaf; the leaves' values summed
per output plus the baseline are the raw scores (logits), equal to the library's own to float
rounding
(comparisons are made in float64, as the library makes them).

The arrays have a fixed capacity (`TreesBuilder.max_trees` x the nodes a tree of
`max_leaf_nodes` can have), so that a member rebuilt from its builder has the same variables
and reads its fitted trees from a checkpoint; unused trees are a single leaf of value 0.

The member sees what the other members see, encoded (their plain inputs): each numeric column
standardised (a missing number is the training mean), the one-hot columns of the small
vocabularies, and each embedded column's id as a number (vocabularies of hundreds and more:
the library's categorical splits take at most 255 values, and would make the library reorder
and re-code the columns). So no split is categorical, and an unseen category is the encoder's
out-of-vocabulary value, as for every member.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer.model.subnetwork import Builder, FitRows, Generator, GeneratorOptions, IterationContext


@dataclasses.dataclass
class Forest:
    """Fitted trees as arrays (see the module's docstring); `roots[j]` is tree j's first node
    and `outputs[j]` the logit it adds to."""

    feature: np.ndarray  # [nodes] int32
    threshold: np.ndarray  # [nodes] float64
    left: np.ndarray  # [nodes] int32
    right: np.ndarray  # [nodes] int32
    missing_left: np.ndarray  # [nodes] bool
    is_leaf: np.ndarray  # [nodes] bool
    value: np.ndarray  # [nodes] float64
    roots: np.ndarray  # [trees] int32
    outputs: np.ndarray  # [trees] int32
    baseline: np.ndarray  # [logits] float64

    @classmethod
    def of(cls, model) -> Forest:
        """The trees of a fitted HistGradientBoostingClassifier or -Regressor (with no
        categorical features)."""
        if model.is_categorical_ is not None:
            raise ValueError("categorical splits are not compiled; pass categories as numbers")
        columns: dict[str, list] = {f.name: [] for f in dataclasses.fields(cls)}
        roots, outputs = [], []
        offset = 0
        for trees in model._predictors:
            for output, tree in enumerate(trees):
                nodes = tree.nodes
                roots.append(offset)
                outputs.append(output)
                columns["feature"].append(nodes["feature_idx"].astype(np.int32))
                columns["threshold"].append(nodes["num_threshold"].astype(np.float64))
                columns["left"].append(nodes["left"].astype(np.int32) + offset)
                columns["right"].append(nodes["right"].astype(np.int32) + offset)
                columns["missing_left"].append(nodes["missing_go_to_left"].astype(bool))
                columns["is_leaf"].append(nodes["is_leaf"].astype(bool))
                columns["value"].append(nodes["value"].astype(np.float64))
                offset += len(nodes)
        per_node = {name: np.concatenate(parts) for name, parts in columns.items() if parts}
        return cls(
            **per_node,
            roots=np.asarray(roots, np.int32),
            outputs=np.asarray(outputs, np.int32),
            baseline=np.asarray(model._baseline_prediction, np.float64).reshape(-1),
        )

    def padded(self, *, trees: int, nodes: int) -> Forest:
        """The same trees in arrays of a fixed capacity: unused trees are one leaf of 0."""
        if len(self.roots) > trees or len(self.value) + 1 > nodes:
            raise ValueError(
                f"{len(self.roots)} trees of {len(self.value)} nodes do not fit the capacity "
                f"({trees} trees, {nodes - 1} nodes)"
            )
        empty = len(self.value)  # the leaf the unused trees are

        def grow(array, size, fill=0):
            out = np.full((size, *array.shape[1:]), fill, array.dtype)
            out[: len(array)] = array
            return out

        return Forest(
            feature=grow(self.feature, nodes),
            threshold=grow(self.threshold, nodes),
            left=grow(self.left, nodes, empty),
            right=grow(self.right, nodes, empty),
            missing_left=grow(self.missing_left, nodes),
            is_leaf=grow(self.is_leaf, nodes, True),
            value=grow(self.value, nodes),
            roots=grow(self.roots, trees, empty),
            outputs=grow(self.outputs, trees),
            baseline=self.baseline,
        )


def raw_scores(forest: dict[str, tf.Tensor], x: tf.Tensor, logits_dimension: int) -> tf.Tensor:
    """The trees' raw scores [batch, logits_dimension] of rows `x` [batch, features] (float64),
    `forest` holding a `Forest`'s arrays as tensors."""
    batch = tf.shape(x)[0]
    start = tf.tile(forest["roots"][None, :], [batch, 1])  # [batch, trees]

    def not_done(node):
        return tf.logical_not(tf.reduce_all(tf.gather(forest["is_leaf"], node)))

    def step(node):
        feature = tf.gather(forest["feature"], node)
        value = tf.gather(x, feature, batch_dims=1)  # [batch, trees]
        goes_left = tf.where(
            tf.math.is_nan(value),
            tf.gather(forest["missing_left"], node),
            value <= tf.gather(forest["threshold"], node),
        )
        child = tf.where(
            goes_left, tf.gather(forest["left"], node), tf.gather(forest["right"], node)
        )
        return (tf.where(tf.gather(forest["is_leaf"], node), node, child),)

    (leaves,) = tf.while_loop(not_done, step, (start,))
    values = tf.gather(forest["value"], leaves)  # [batch, trees]
    per_output = tf.math.unsorted_segment_sum(
        tf.transpose(values), forest["outputs"], logits_dimension
    )  # [logits, batch]
    return tf.transpose(per_output) + forest["baseline"][None, :]


class TreesLayer(keras.layers.Layer):
    """The compiled trees as a Keras layer: its weights are a `Forest`'s arrays (not trained;
    in the checkpoint), its output the raw scores [batch, logits_dimension] in float32."""

    def __init__(self, *, trees: int, nodes: int, logits: int):
        super().__init__(name="trees")
        self.logits = logits
        shapes = {
            "feature": ([nodes], "int32"),
            "threshold": ([nodes], "float64"),
            "left": ([nodes], "int32"),
            "right": ([nodes], "int32"),
            "missing_left": ([nodes], "bool"),
            "is_leaf": ([nodes], "bool"),
            "value": ([nodes], "float64"),
            "roots": ([trees], "int32"),
            "outputs": ([trees], "int32"),
            "baseline": ([logits], "float64"),
        }
        empty = Forest(
            **{k: np.zeros(shape, dtype) for k, (shape, dtype) in shapes.items()}
        )  # until fitted: every tree one leaf of 0
        empty.is_leaf[:] = True
        self.arrays = {
            name: self.add_weight(
                shape=shape,
                dtype=dtype,
                initializer=_constant(getattr(empty, name)),
                trainable=False,
                name=name,
            )
            for name, (shape, dtype) in shapes.items()
        }

    def assign(self, forest: Forest) -> None:
        for name, variable in self.arrays.items():
            variable.assign(getattr(forest, name))

    @property
    def capacity(self) -> tuple[int, int]:
        """(trees, nodes) the arrays hold."""
        return int(self.arrays["roots"].shape[0]), int(self.arrays["value"].shape[0])

    def call(self, x):
        forest = {name: v.value for name, v in self.arrays.items()}
        return tf.cast(raw_scores(forest, tf.cast(x, tf.float64), self.logits), tf.float32)


def _constant(value: np.ndarray):
    return lambda shape, dtype=None: tf.constant(value)


@dataclasses.dataclass(frozen=True)
class TreesBuilder(Builder):
    """Boosted trees (scikit-learn's HistGradientBoosting) as a member: fitted before its
    iteration trains, on the encoded training rows (at most `FIT_ROWS`, every n-th row), then fixed.

    Complexity: sqrt(depth) of a tree of `max_leaf_nodes` leaves grown evenly, log2 of the
    leaves (31 leaves: 2.2), on the scale of a DNN's sqrt(layers): the AdaNet penalty weighs a
    boosted forest like a network of 5 layers, whatever the number of trees (each tree's step
    is shrunk by the learning rate, so depth, not count, bounds what one tree adds)."""

    max_trees: int = 200
    max_leaf_nodes: int = 31
    learning_rate: float = 0.1
    l2_regularization: float = 0.0

    @property
    def name(self) -> str:
        return f"trees_{self.max_trees}x{self.max_leaf_nodes}"

    @property
    def complexity(self) -> float:
        return math.sqrt(math.log2(self.max_leaf_nodes))

    @property
    def fitted(self) -> bool:
        return True

    @property
    def plain_inputs(self) -> bool:
        return True

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        raise NotImplementedError("a TreesBuilder's member is build_member's")

    def build_member(self, *, input_dim: int, logits_dimension: int, seed: int) -> TreesLayer:
        trees = self.max_trees * logits_dimension
        nodes = trees * (2 * self.max_leaf_nodes - 1) + 1
        return TreesLayer(trees=trees, nodes=nodes, logits=logits_dimension)

    def fit(self, member: keras.layers.Layer, rows: FitRows) -> dict:
        """Fits the trees on the rows and writes them into the member's arrays."""
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        assert isinstance(member, TreesLayer)
        kind = HistGradientBoostingRegressor if rows.regression else HistGradientBoostingClassifier
        model = kind(
            max_iter=self.max_trees,
            max_leaf_nodes=self.max_leaf_nodes,
            learning_rate=self.learning_rate,
            l2_regularization=self.l2_regularization,
            random_state=rows.seed,
        )
        model.fit(rows.x, rows.labels, sample_weight=rows.weights)
        trees, nodes = member.capacity
        member.assign(Forest.of(model).padded(trees=trees, nodes=nodes))
        return {"trees": int(model.n_iter_), "rows": len(rows.x)}


@dataclasses.dataclass(frozen=True)
class TreesGenerator(Generator):
    """Proposes one boosted-tree member at iteration 0 and none after (the networks of later
    iterations learn what the ensemble with it still gets wrong)."""

    max_trees: int = 200
    max_leaf_nodes: int = 31

    @classmethod
    def from_options(cls, options: GeneratorOptions) -> TreesGenerator:
        return cls()

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        if context.iteration > 0:
            return []
        return [TreesBuilder(self.max_trees, self.max_leaf_nodes)]
