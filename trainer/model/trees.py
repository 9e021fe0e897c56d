"""A boosted-tree member: scikit-learn's HistGradientBoosting fitted on the training rows, then
compiled into ordinary TensorFlow ops, so the exported model needs no custom op and no
tensorflow-decision-forests, and loads wherever TensorFlow does (2.15 included).

The fitted trees become constant-shape arrays, one row per node of every tree (`Forest`): the
feature a node splits on, its threshold, its children, the side a missing value (NaN) takes,
and a leaf's value. Prediction walks every tree at once: each row's current node per tree,
a few gathers per level, as many levels as the deepest leaf; the leaves' values summed per
output plus the baseline are the raw scores (logits), equal to the library's own to float
rounding
(comparisons are made in float64, as the library makes them).

Cross-fitting: the member is `folds` forests, each fitted on the rows of every fold but one
(a row's fold is a hash of its inputs, `fold_of`, the same in numpy and in the graph). On the
rows it trains with (`training=True`: the mixture weights of its iteration and of the later
ones, which read it as a previous member) a row gets the forest that never saw it, so the
ensemble learns how far to trust the trees from what they predict of rows they did not fit,
not from their fit of their own rows (which the training loss of 200 boosted trees flatters:
census 0.246 against 0.277 held out). Everywhere else (selection, evaluation, serving) the
member is the mean of the forests' raw scores.

The arrays have a fixed capacity (`TreesBuilder.max_trees` x the nodes a tree of
`max_leaf_nodes` can have), so that a member rebuilt from its builder has the same variables
and reads its fitted trees from a checkpoint; unused trees are a single leaf of value 0.

The member sees what the other members see, encoded (their plain inputs): each numeric column
standardised (a missing number is NaN where the column has a missing indicator, so each split
learns the side missing values take; else the training mean), the one-hot columns of the small
vocabularies, and each embedded column's id as a number (vocabularies of hundreds and more:
the library's categorical splits take at most 255 values, and would make the library reorder
and re-code the columns). So no split is categorical, and an unseen category is the encoder's
out-of-vocabulary value, as for every member.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer.model.subnetwork import Builder, FitRows, Generator, IterationContext


@dataclasses.dataclass
class Forest:
    """Fitted trees as arrays (see the module's docstring), laid out for a walk of few
    gathers: a split's two children are adjacent (`left`, then `left + 1` for the right), and
    a leaf is its own left child with an infinite threshold, so every row takes `depth` steps
    and stays on its leaf once there. `link` packs a node's left child and the side a
    missing value takes: `left * 2 + missing_goes_left`."""

    feature: np.ndarray  # [nodes] int32
    threshold: np.ndarray  # [nodes] float64 (+inf at a leaf)
    link: np.ndarray  # [nodes] int32
    value: np.ndarray  # [nodes] float64 (0 at a split)
    roots: np.ndarray  # [trees] int32
    outputs: np.ndarray  # [trees] int32: the score each tree adds to (fold x logits + logit)
    baseline: np.ndarray  # [scores] float64
    depth: np.ndarray  # [1] int32: the deepest leaf's depth

    @classmethod
    def of(cls, model, *, first_output: int = 0, trees: int | None = None) -> Forest:
        """The first `trees` boosting rounds (all: None) of a fitted
        HistGradientBoostingClassifier or -Regressor (with no categorical features), adding to
        scores `first_output`... on."""
        if model.is_categorical_ is not None:
            raise ValueError("categorical splits are not compiled; pass categories as numbers")
        columns: dict[str, list] = {"feature": [], "threshold": [], "link": [], "value": []}
        roots, outputs, depth = [], [], 0
        offset = 0
        for one_round in model._predictors[:trees]:
            for output, tree in enumerate(one_round):
                nodes = tree.nodes
                order = _children_adjacent(nodes)  # new position -> the library's node
                position = np.empty(len(nodes), np.int64)
                position[order] = np.arange(len(nodes))
                nodes = nodes[order]
                leaf = nodes["is_leaf"].astype(bool)
                here = np.arange(len(nodes)) + offset
                left = np.where(leaf, here, position[nodes["left"]] + offset)
                missing_left = np.where(leaf, 1, nodes["missing_go_to_left"])
                columns["feature"].append(np.where(leaf, 0, nodes["feature_idx"]))
                columns["threshold"].append(np.where(leaf, np.inf, nodes["num_threshold"]))
                columns["link"].append(left * 2 + missing_left)
                columns["value"].append(np.where(leaf, nodes["value"], 0.0))
                roots.append(offset)
                outputs.append(first_output + output)
                depth = max(depth, int(nodes["depth"].max()))
                offset += len(nodes)
        return cls(
            feature=np.concatenate(columns["feature"]).astype(np.int32),
            threshold=np.concatenate(columns["threshold"]).astype(np.float64),
            link=np.concatenate(columns["link"]).astype(np.int32),
            value=np.concatenate(columns["value"]).astype(np.float64),
            roots=np.asarray(roots, np.int32),
            outputs=np.asarray(outputs, np.int32),
            baseline=np.asarray(model._baseline_prediction, np.float64).reshape(-1),
            depth=np.asarray([depth], np.int32),
        )

    @classmethod
    def joined(cls, forests: Sequence[Forest]) -> Forest:
        """Several forests as one (their scores side by side, as their `first_output` says)."""
        offsets = np.cumsum([0] + [len(f.value) for f in forests[:-1]]).astype(np.int32)
        return cls(
            feature=np.concatenate([f.feature for f in forests]),
            threshold=np.concatenate([f.threshold for f in forests]),
            link=np.concatenate([f.link + 2 * o for f, o in zip(forests, offsets)]),
            value=np.concatenate([f.value for f in forests]),
            roots=np.concatenate([f.roots + o for f, o in zip(forests, offsets)]),
            outputs=np.concatenate([f.outputs for f in forests]),
            baseline=np.concatenate([f.baseline for f in forests]),
            depth=np.max([f.depth for f in forests], axis=0),
        )

    def padded(self, *, trees: int, nodes: int) -> Forest:
        """The same trees in arrays of a fixed capacity, the unused trees last: each is the
        last node, a leaf of 0 that no fitted tree reaches."""
        if len(self.roots) > trees or len(self.value) + 1 > nodes:
            raise ValueError(
                f"{len(self.roots)} trees of {len(self.value)} nodes do not fit the capacity "
                f"({trees} trees, {nodes - 1} nodes)"
            )
        empty = nodes - 1  # a leaf of 0: the unused trees, and the unused nodes

        def grow(array, size, fill):
            out = np.full(size, fill, array.dtype)
            out[: len(array)] = array
            return out

        return Forest(
            feature=grow(self.feature, nodes, 0),
            threshold=grow(self.threshold, nodes, np.inf),
            link=grow(self.link, nodes, empty * 2 + 1),
            value=grow(self.value, nodes, 0.0),
            roots=grow(self.roots, trees, empty),
            outputs=grow(self.outputs, trees, 0),
            baseline=self.baseline,
            depth=self.depth,
        )


def _children_adjacent(nodes: np.ndarray) -> np.ndarray:
    """An order of a tree's nodes (the library's indices), root first, in which each split's
    right child comes right after its left one."""
    order, queue = [0], [0]
    while queue:
        node = queue.pop()
        if not nodes["is_leaf"][node]:
            order += [int(nodes["left"][node]), int(nodes["right"][node])]
            queue += [int(nodes["left"][node]), int(nodes["right"][node])]
    return np.asarray(order, np.int64)


def fold_of(x, folds: int, *, xp=np):
    """Each row's fold, 0..folds-1: a hash of its inputs `x` [rows, features] (float64; a
    missing value counts as 0), the same in numpy (`xp=np`) and TensorFlow (`xp=tf`)."""
    width = int(x.shape[1])
    weights = np.random.default_rng(width).uniform(0.5, 1.5, width) * 7919.0
    if xp is np:
        mixed = np.nan_to_num(x, nan=0.0) @ weights
        return np.floor((mixed - np.floor(mixed)) * folds).astype(np.int64).clip(0, folds - 1)
    clean = tf.where(tf.math.is_nan(x), tf.zeros_like(x), x)
    mixed = tf.linalg.matvec(clean, tf.constant(weights, tf.float64))
    fold = tf.cast(tf.floor((mixed - tf.floor(mixed)) * folds), tf.int64)
    return tf.clip_by_value(fold, 0, folds - 1)


def raw_scores(forest: dict[str, tf.Tensor], x: tf.Tensor, scores: int) -> tf.Tensor:
    """The trees' raw scores [batch, scores] of rows `x` [batch, features] (float64),
    `forest` holding a `Forest`'s arrays as tensors: `depth` steps of three gathers of node
    arrays and one of the rows' values."""
    start = tf.tile(forest["roots"][None, :], [tf.shape(x)[0], 1])  # [batch, trees]
    values = leaf_values(forest, x, start)
    per_output = tf.math.unsorted_segment_sum(
        tf.transpose(values), forest["outputs"], scores
    )  # [scores, batch]
    return tf.transpose(per_output) + forest["baseline"][None, :]


def leaf_values(forest: dict[str, tf.Tensor], x: tf.Tensor, start: tf.Tensor) -> tf.Tensor:
    """The values [batch, trees] of the leaves that rows `x` reach from the nodes `start`
    [batch, trees] (each row may walk trees of its own)."""

    def step(i, node):
        value = tf.gather(x, tf.gather(forest["feature"], node), batch_dims=1)  # [batch, trees]
        link = tf.gather(forest["link"], node)
        goes_right = tf.where(
            tf.math.is_nan(value),
            tf.equal(tf.bitwise.bitwise_and(link, 1), 0),
            value > tf.gather(forest["threshold"], node),
        )
        return i + 1, tf.bitwise.right_shift(link, 1) + tf.cast(goes_right, tf.int32)

    _, leaves = tf.while_loop(
        lambda i, _: i < forest["depth"][0], step, (tf.constant(0, tf.int32), start)
    )
    return tf.gather(forest["value"], leaves)


class TreesLayer(keras.layers.Layer):
    """The compiled trees as a Keras layer: its weights are a `Forest`'s arrays (not trained;
    in the checkpoint) of `folds` forests, its output the raw scores [batch, logits] in
    float32: of the forest that did not see the row in training, their mean otherwise."""

    def __init__(self, *, trees: int, nodes: int, logits: int, folds: int):
        super().__init__(name="trees")
        self.logits, self.folds = logits, folds
        shapes = {
            "feature": ([nodes], "int32"),
            "threshold": ([nodes], "float64"),
            "link": ([nodes], "int32"),
            "value": ([nodes], "float64"),
            "roots": ([trees], "int32"),
            "outputs": ([trees], "int32"),
            "baseline": ([folds * logits], "float64"),
            "depth": ([1], "int32"),
        }
        nothing = Forest(  # until fitted: every tree the one leaf of 0
            **{k: np.zeros(shape, dtype) for k, (shape, dtype) in shapes.items() if k != "link"},
            link=np.ones(nodes, np.int32),
        )
        nothing.threshold[:] = np.inf
        nothing.roots[:] = nodes - 1  # no fitted tree
        self.arrays = {
            name: self.add_weight(
                shape=shape,
                dtype=dtype,
                initializer=_constant(getattr(nothing, name)),
                trainable=False,
                name=name,
            )
            for name, (shape, dtype) in shapes.items()
        }

    def assign(self, forest: Forest) -> None:
        for name, variable in self.arrays.items():
            variable.assign(getattr(forest, name))

    @property
    def parameters(self) -> int:
        """The numbers the fit chose: each split's feature and threshold, each leaf's value
        (the arrays' padding aside)."""
        splits = int(tf.reduce_sum(tf.cast(tf.math.is_finite(self.arrays["threshold"]), tf.int32)))
        trees = int(self._fitted_trees())
        return 2 * splits + splits + trees  # a binary tree has one leaf more than splits

    def _fitted_trees(self) -> tf.Tensor:
        """How many trees were fitted: the unused ones come last, rooted at the last node
        (`Forest.padded`)."""
        padding = int(self.arrays["value"].shape[0]) - 1
        return tf.reduce_sum(tf.cast(self.arrays["roots"] != padding, tf.int32))

    @property
    def capacity(self) -> tuple[int, int]:
        """(trees, nodes) the arrays hold."""
        return int(self.arrays["roots"].shape[0]), int(self.arrays["value"].shape[0])

    def call(self, x, training=False):
        forest = {name: v.value for name, v in self.arrays.items()}
        # Walk the fitted trees alone: the unused capacity (fold models cut to the rounds
        # that held out best) would cost as much as fitted trees.
        fitted = self._fitted_trees()
        forest["roots"], forest["outputs"] = forest["roots"][:fitted], forest["outputs"][:fitted]
        x = tf.cast(x, tf.float64)
        if training:
            return tf.cast(self._held_out_scores(forest, x), tf.float32)
        scores = raw_scores(forest, x, self.folds * self.logits)
        scores = tf.reshape(scores, [-1, self.folds, self.logits])
        return tf.cast(tf.reduce_mean(scores, axis=1), tf.float32)

    def _held_out_scores(self, forest: dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        """Each row's scores by the forest that did not see it, walking that forest alone
        (the forests are stored one after another, with as many trees each)."""
        fold = fold_of(x, self.folds, xp=tf)
        by_fold = {k: tf.reshape(forest[k], [self.folds, -1]) for k in ("roots", "outputs")}
        values = leaf_values(forest, x, tf.gather(by_fold["roots"], fold))  # [batch, trees]
        logit = tf.gather(by_fold["outputs"], fold) % self.logits  # (fold x logits + logit)
        scores = tf.einsum("bt,btl->bl", values, tf.one_hot(logit, self.logits, dtype=tf.float64))
        baseline = tf.reshape(forest["baseline"], [self.folds, self.logits])
        return scores + tf.gather(baseline, fold)


def _constant(value: np.ndarray):
    return lambda shape, dtype=None: tf.constant(value)


# A fold model stops after this many boosting rounds without a lower loss on its left-out fold.
PATIENCE_ROUNDS = 20


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
    folds: int = 5

    @property
    def name(self) -> str:
        return f"trees_{self.max_trees}x{self.max_leaf_nodes}"

    @property
    def complexity(self) -> float:
        return math.sqrt(math.log2(self.max_leaf_nodes))

    @property
    def complexity_scale(self) -> str:
        """A forest's complexity is not a network's: the one-standard-error rule does not
        trade it against a network's (churn: a 2-layer k-head network, 1.41, within one
        standard error of the trees, 2.2, was kept at 0.945 test accuracy; the trees alone
        0.959)."""
        return "boosted trees"

    @property
    def fitted(self) -> bool:
        return True

    @property
    def plain_inputs(self) -> bool:
        return True

    def build_body(self, *, input_dim: int, seed: int) -> keras.layers.Layer:
        raise NotImplementedError("a TreesBuilder's member is build_member's")

    def build_member(self, *, input_dim: int, logits_dimension: int, seed: int) -> TreesLayer:
        trees = self.folds * self.max_trees * logits_dimension
        nodes = trees * (2 * self.max_leaf_nodes - 1) + 1
        return TreesLayer(trees=trees, nodes=nodes, logits=logits_dimension, folds=self.folds)

    def fit(self, member: keras.layers.Layer, rows: FitRows) -> dict:
        """Fits a forest per fold on the rows of the other folds (`fold_of`) and writes them
        into the member's arrays."""
        from threadpoolctl import threadpool_limits

        assert isinstance(member, TreesLayer)
        folds = fold_of(rows.x, self.folds)
        # Half the cores: TensorFlow's thread pools of this process (and, on a shared machine,
        # other processes) keep theirs; 2 cores beside two busy processes, 20,000 rows: 1.59 s
        # with both threads, 1.18 s with one (alone: 0.72 and 0.98 s).
        with threadpool_limits(max(1, (os.cpu_count() or 2) // 2)):
            forests, rounds, grown, stopped = self._fit_folds(member, rows, folds)
        trees, nodes = member.capacity
        member.assign(Forest.joined(forests).padded(trees=trees, nodes=nodes))
        report = {"rows": len(rows.x), "folds": self.folds, "rounds": rounds, "grown": grown}
        if stopped:
            report["stopped"] = "the time budget"
        return report

    def _fit_folds(self, member: TreesLayer, rows: FitRows, folds: np.ndarray):
        """The fold models, each fitted once with the library's early stopping on its own
        left-out fold (no round without improvement for `PATIENCE_ROUNDS`), then all cut to
        the rounds where their summed out-of-fold loss is lowest: cross-validated early
        stopping, on every training row. Past `rows.deadline` the folds still to fit grow
        the rounds the time left pays for, at the first fold's pace (at least
        `PATIENCE_ROUNDS`)."""
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        kind = HistGradientBoostingRegressor if rows.regression else HistGradientBoostingClassifier
        models, started = [], time.monotonic()
        past = rows.deadline is not None and started > rows.deadline
        cap = PATIENCE_ROUNDS if past else self.max_trees
        for k in range(self.folds):
            kept, left_out = folds != k, folds == k
            model = kind(
                max_iter=cap,
                max_leaf_nodes=self.max_leaf_nodes,
                learning_rate=self.learning_rate,
                l2_regularization=self.l2_regularization,
                early_stopping=bool(left_out.any()),  # (a fold no row hashed to)
                n_iter_no_change=PATIENCE_ROUNDS,
                scoring="loss",
                random_state=rows.seed + k,
            )
            validation = {
                "X_val": rows.x[left_out],
                "y_val": rows.labels[left_out],
                "sample_weight_val": _chosen(rows.weights, left_out),
            }
            model.fit(
                rows.x[kept],
                rows.labels[kept],
                sample_weight=_chosen(rows.weights, kept),
                **(validation if left_out.any() else {}),
            )
            models.append(model)
            so_far = sum(m.n_iter_ for m in models)
            cap = min(cap, _rounds_left(rows, started, grown=so_far, folds=self.folds - k - 1))
        grown = min(m.n_iter_ for m in models)
        held_out_loss = sum(
            _loss_by_round(m, rows, folds == k)[:grown] for k, m in enumerate(models)
        )
        best = int(np.argmin(held_out_loss)) + 1
        forests = [
            Forest.of(m, first_output=k * member.logits, trees=best) for k, m in enumerate(models)
        ]
        # a model that grew all its rounds below the library's cap met the deadline
        stopped = any(m.n_iter_ == m.max_iter < self.max_trees for m in models)
        return forests, best, grown, stopped


def _chosen(weights: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if weights is None else weights[rows]


def _rounds_left(rows: FitRows, started: float, *, grown: int, folds: int) -> int:
    """The rounds each of `folds` fold models still to fit may grow before `rows.deadline`,
    at the pace of the `grown` rounds since `started` (at least `PATIENCE_ROUNDS`)."""
    if rows.deadline is None or folds == 0:
        return sys.maxsize
    pace = (time.monotonic() - started) / max(1, grown)
    return max(PATIENCE_ROUNDS, int((rows.deadline - time.monotonic()) / (pace * folds)))


def _loss_by_round(model, rows: FitRows, chosen: np.ndarray) -> np.ndarray:
    """The (weighted) loss summed over the `chosen` rows after each of `model`'s boosting
    rounds, by the head's own per-example loss of the raw scores (`FitRows.losses`)."""
    if not chosen.any():  # (a fold no row hashed to)
        return np.zeros(model.n_iter_)
    labels = rows.labels[chosen]
    weights = np.ones(len(labels)) if rows.weights is None else rows.weights[chosen]
    return np.array(
        [
            float(np.dot(weights, rows.losses(labels, raw)))
            for raw in model._staged_raw_predict(rows.x[chosen])  # [rows, scores] each round
        ]
    )


@dataclasses.dataclass(frozen=True)
class TreesGenerator(Generator):
    """Proposes one boosted-tree member at iteration 0 and none after (the networks of later
    iterations learn what the ensemble with it still gets wrong)."""

    max_trees: int = 200
    max_leaf_nodes: int = 31

    def generate_candidates(self, context: IterationContext) -> Sequence[Builder]:
        if context.iteration > 0:
            return []
        return [TreesBuilder(self.max_trees, self.max_leaf_nodes)]
