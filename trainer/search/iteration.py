"""One AdaNet iteration: the candidates, their variables, and the compiled train loop.

All new subnetworks and all candidate ensembles train together on the same batches: each
subnetwork on its own loss, each ensemble's mixture weights on its AdaNet objective, with the
members' outputs behind a stop-gradient. The sum of these losses has one backward pass whose
gradient, per variable, is the gradient of that variable's own loss. The previous best
ensemble (candidate 0 at t > 0) is frozen: its objective is measured on the same batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import keras
import numpy as np
import tensorflow as tf

from trainer import ensemble as ens
from trainer.config import TrainOptions
from trainer.ensemble.objective import (
    debiased,
    moving_average_step,
    moving_average_update,
    training_objective,
)
from trainer.input.features import FITTED_LOGITS, PREVIOUS_LOGITS, PREVIOUS_OUTPUTS, WEIGHT, Encoded
from trainer.input.pipeline import Derived
from trainer.input.schema import HeadType
from trainer.model import Builder, Inputs, Subnetwork
from trainer.model.embedding import LazyAdam
from trainer.model.heads import Head
from trainer.model.subnetwork import FIT_ROWS, FitRows
from trainer.placement import Unit, everything
from trainer.search.frozen import (
    PREVIOUS,
    FrozenEnsemble,
    FrozenMember,
    compile_encoded,
    member_key,
)
from trainer.search.optimizers import DelayedNesterov, Optimizer, cosine_decay, tf_variable


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An iteration's state as plain values: the ensemble's and each new subnetwork's steps,
    each candidate's debiased moving-average objective and each subnetwork's training loss,
    what diverged, and the candidates still training."""

    step: int
    subnetwork_steps: tuple[int, ...]
    objectives: tuple[float, ...]
    subnetwork_losses: tuple[float, ...]
    candidate_diverged: tuple[bool, ...]
    subnetwork_diverged: tuple[bool, ...]
    active_candidates: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate ensemble: previous members (if kept) + new subnetworks, one ensembler."""

    name: str
    new_subnetworks: tuple[int, ...]  # indices into the iteration's new subnetworks
    keep_previous: bool
    weights: ens.MixtureWeights
    ensembler: ens.Ensembler | None  # None for the frozen previous ensemble

    @property
    def is_previous(self) -> bool:
        return self.ensembler is None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where an iteration's work runs: the units its workers train (`trainer/placement`),
    the device scope each new subnetwork's variables are created in, and whether the
    bookkeeping variables (steps, moving averages) live with the model (on parameter servers,
    where every worker updates them) or on the coordinating host."""

    units: tuple[Unit, ...] | None = None  # None: one unit that trains everything
    subnetwork_scope: Callable[[int], AbstractContextManager] = lambda _: contextlib.nullcontext()
    shared_bookkeeping: bool = False


@dataclasses.dataclass(frozen=True)
class _LocalGroups:
    """What a local loop (`Iteration._local_steps`) carries and reads: the trained variables
    (the subnetworks', the mixtures'), the Keras variables it carries untrained (a dropout
    layer's seed), those it only reads, the embedding tables it updates in place, and where
    its subnetworks' and candidates' statistics are."""

    trained: list
    candidates: list
    subnetwork_vars: list
    mixture_vars: list
    carried: list
    read_only: list
    tables: list
    sub_index: tf.Tensor
    cand_index: tf.Tensor

    @property
    def trainable(self) -> list:
        return self.subnetwork_vars + self.mixture_vars


class Iteration:
    """The candidates of iteration `number` and the loop that trains them."""

    def __init__(
        self,
        *,
        number: int,
        head: Head,
        inputs: Inputs,
        seed: int,
        builders: Sequence[Builder],
        specs: Sequence[ens.CandidateSpec],
        ensemblers: Sequence[ens.Ensembler],
        previous: FrozenEnsemble | None,
        options: TrainOptions,
        strategy: tf.distribute.Strategy,
        layout: Layout = Layout(),
        decay_steps: int | None = None,
    ):
        self.number = number
        self.decay_steps = decay_steps  # the learning rate's cosine schedule (None: constant)
        self.head = head
        self.inputs = inputs
        self.previous = previous
        self.options = options
        self.strategy = strategy
        self.builders = tuple(builders)
        self.ensemblers = tuple(ensemblers)
        self.units = layout.units or (everything(len(builders)),)
        self.seed = seed + 1000 * number  # the iteration's: its members' come from it
        with strategy.scope():
            self.subnetworks, self.embedding_optimizers = self._make_subnetworks(layout)
            self.candidates = self._make_candidates(specs, ensemblers)
            self._make_optimizers(layout)
        self._make_bookkeeping(layout)
        self.stopped: frozenset[str] = frozenset()
        self._loop: Callable | None = None
        self._predict: Callable | None = None

    def _make_subnetworks(self, layout: Layout) -> tuple[tuple[Subnetwork, ...], dict]:
        """The new subnetworks (each in its layout's scope), and the lazy optimizers of those
        with embedding tables (the moments beside their tables), by subnetwork index."""
        subnetworks, embedding_optimizers = [], {}
        for i, b in enumerate(self.builders):
            with layout.subnetwork_scope(i):
                subnetwork = Subnetwork(
                    b,
                    inputs=self.inputs,
                    logits_dimension=self.head.logits_dimension,
                    seed=self.seed + 10 * i,
                    name=member_key(self.number, b),
                    mean_of_heads=self.head.mean_of_heads,
                )
                if subnetwork.embedding_tables:
                    embedding_optimizers[i] = LazyAdam(
                        subnetwork.embedding_tables,
                        learning_rate=self.options.learning_rate * b.learning_rate_scale,
                    )
            subnetworks.append(subnetwork)
        return tuple(subnetworks), embedding_optimizers

    def _make_optimizers(self, layout: Layout) -> None:
        """The subnetworks' optimizer, the mixture weights' and (workers on parameter servers
        adding their chunks' changes) the outer step."""
        options, count = self.options, len(self.candidates)
        every = range(len(self.builders))
        self.subnetwork_optimizer = Optimizer(
            options.optimizer,
            learning_rate=options.learning_rate,
            variables=self._subnetwork_variables(every),
            weight_decay=options.weight_decay,
            rate_scales=[
                b.learning_rate_scale
                for s, b in zip(self.subnetworks, self.builders)
                for _ in s.dense_variables
            ],
        )
        self.mixture_optimizer = Optimizer(
            options.optimizer,
            learning_rate=options.mixture_learning_rate or options.learning_rate,
            variables=self._mixture_variables(range(count)),
        )
        outer = options.outer_learning_rate != 1.0 or options.outer_momentum
        self.outer = (
            DelayedNesterov(
                self._subnetwork_variables(every) + self._mixture_variables(range(count)),
                learning_rate=options.outer_learning_rate,
                momentum=options.outer_momentum,
                groups=len(self.units),
            )
            if outer and layout.shared_bookkeeping
            else None
        )

    def _make_bookkeeping(self, layout: Layout) -> None:
        """Bookkeeping, updated once per step in cross-replica context: ordinary variables on
        the coordinating host, or on the parameter servers when workers train on their own.
        `step` counts the ensemble's steps (the candidates' objectives), and `subnetwork_steps`
        each new subnetwork's: placement may train them apart."""
        new, count = len(self.builders), len(self.candidates)
        with self.strategy.scope() if layout.shared_bookkeeping else contextlib.nullcontext():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.subnetwork_steps = tf.Variable(tf.zeros([new], tf.int64), trainable=False)
            self.objective_ema = tf.Variable(tf.zeros([count]), trainable=False)
            self.subnetwork_loss_ema = tf.Variable(tf.zeros([new]), trainable=False)
            self.candidate_diverged = tf.Variable(tf.zeros([count], tf.bool), trainable=False)
            self.subnetwork_diverged = tf.Variable(tf.zeros([new], tf.bool), trainable=False)

    def fit_members(
        self, batches: tf.data.Dataset, rows: int, *, deadline: float | None = None
    ) -> dict[str, dict]:
        """Fits the new fitted members (boosted trees, say) on one pass over the training
        `batches` (`rows` rows; at most `FIT_ROWS` of them are kept, every n-th, so the
        sample spans the whole table), each by `deadline` (time.monotonic(); a time budget's)
        where it can stop early; returns what each fit reports, by member name."""
        fitted = self._fitted()
        if not fitted:
            return {}
        stride = max(1, -(-rows // FIT_ROWS))
        inputs: dict[int, list[np.ndarray]] = {i: [] for i in fitted}
        labels, weights = [], []
        seen = 0
        for features, batch_labels in batches:
            kept = slice((-seen) % stride, None, stride)
            seen += int(batch_labels.shape[0])
            for i in fitted:
                inputs[i].append(self.subnetworks[i].fit_inputs(features).numpy()[kept])
            labels.append(batch_labels.numpy()[kept])
            if WEIGHT in features:
                weights.append(features[WEIGHT].numpy()[kept])
        y = np.concatenate(labels)
        regression = self.head.type is HeadType.REGRESSION
        if regression:
            y = self.head.standardised(y.astype(np.float64))
        reports = {}
        for i in fitted:
            started = time.monotonic()
            fit_rows = FitRows(
                np.concatenate(inputs[i]).astype(np.float64),
                y,
                np.concatenate(weights) if weights else None,
                regression,
                self.seed + 10 * i,
                self.head.target_losses,
                deadline,
            )
            report = self.builders[i].fit(self.subnetworks[i].body, fit_rows)
            reports[self.subnetworks[i].name] = {
                **report,
                "seconds": round(time.monotonic() - started, 2),
            }
        return reports

    # -- construction ---------------------------------------------------------------------
    def _make_candidates(self, specs, ensemblers) -> tuple[Candidate, ...]:
        index = {b.name: i for i, b in enumerate(self.builders)}
        previous_members = [m.as_member() for m in self.previous.members] if self.previous else []
        candidates = []
        if self.previous is not None:
            candidates.append(Candidate(PREVIOUS, (), True, self.previous.weights, None))
        for spec in specs:
            keep = spec.keep_previous and self.previous is not None
            new = tuple(index[n] for n in spec.new_subnetworks)
            members = (previous_members if keep else []) + [
                ens.Member(
                    self.subnetworks[i].name,
                    self.subnetworks[i].last_layer_dim,
                    self.builders[i].complexity,
                )
                for i in new
            ]
            for ensembler in ensemblers:
                weights = ensembler.build(
                    members=members,
                    logits_dimension=self.head.logits_dimension,
                    previous=self.previous.weights if keep and self.previous else None,
                )
                candidates.append(
                    Candidate(f"{spec.name}_{ensembler.name}", new, keep, weights, ensembler)
                )
        return tuple(candidates)

    def _subnetwork_variables(self, indices) -> list[tf.Variable]:
        """What the Keras optimizer trains (embedding tables are `LazyAdam`'s)."""
        return [v for i in indices for v in self.subnetworks[i].dense_variables]

    def _mixture_variables(self, indices) -> list[tf.Variable]:
        return [
            v
            for i in indices
            if not self.candidates[i].is_previous
            for v in self.candidates[i].weights.trainable_variables
        ]

    def checkpoint(self) -> tf.train.Checkpoint:
        """Everything a resumed iteration needs (data order aside)."""
        return tf.train.Checkpoint(
            step=self.step,
            subnetwork_steps=self.subnetwork_steps,
            objective_ema=self.objective_ema,
            subnetwork_loss_ema=self.subnetwork_loss_ema,
            candidate_diverged=self.candidate_diverged,
            subnetwork_diverged=self.subnetwork_diverged,
            subnetworks={s.name: s.checkpoint_variables() for s in self.subnetworks},
            mixture_weights={c.name: c.weights for c in self.candidates if not c.is_previous},
            subnetwork_optimizer=self.subnetwork_optimizer.checkpoint(),
            mixture_optimizer=self.mixture_optimizer.checkpoint(),
            **({"outer": self.outer.checkpoint()} if self.outer is not None else {}),
            embedding_optimizers={
                str(i): tf.train.Checkpoint(**o.variables())
                for i, o in self.embedding_optimizers.items()
            },
        )

    # -- forward --------------------------------------------------------------------------
    def _forward(self, features, *, trained, candidates, training_rows=False):
        """Returns ({subnetwork index: (last, logits, heads' logits or None)}, {candidate
        index: logits}, the previous ensemble's members' (last, logits), oldest first).

        Subnetworks in `trained` run in training mode; the others that `candidates` need run
        in inference mode (a worker that trains only mixture weights reads them). On
        `training_rows` a fitted member, new or previous, gives each row the scores of what
        was fitted without it (see trainer/model/trees.py).
        """
        if PREVIOUS_OUTPUTS in features:  # computed once for a table in memory
            previous = list(features[PREVIOUS_OUTPUTS])
        elif PREVIOUS_LOGITS in features:  # (no mixture weights read a last layer)
            previous = [(None, logits) for logits in features[PREVIOUS_LOGITS]]
        elif self.previous:
            previous = [
                m.subnetwork(features, training=training_rows and m.builder.fitted)
                for m in self.previous.members
            ]
        else:
            previous = []
        needed = sorted(
            set(trained).union(*(self.candidates[c].new_subnetworks for c in candidates))
        )
        fitted = dict(zip(self._fitted(), features.get(FITTED_LOGITS, ())))
        new = {
            i: (fitted[i], fitted[i], None)
            if i in fitted and training_rows
            else self.subnetworks[i].forward(
                features, training=i in trained or (training_rows and self.builders[i].fitted)
            )
            for i in needed
        }
        detached = {i: tuple(tf.stop_gradient(t) for t in out[:2]) for i, out in new.items()}
        logits = {}
        for c in candidates:
            candidate = self.candidates[c]
            outputs = (previous if candidate.keep_previous else []) + [
                detached[i] for i in candidate.new_subnetworks
            ]
            logits[c] = candidate.weights(outputs)
        return new, logits, previous

    def _fitted(self) -> list[int]:
        """The new subnetworks that are fitted members."""
        return [i for i, b in enumerate(self.builders) if b.fitted]

    def previous_outputs(self) -> Derived | None:
        """The outputs that never change within an iteration, on encoded rows: the frozen
        previous members' and the new fitted members' (each row's held-out scores), as
        columns a training table held in memory computes once: a step then runs only the
        trained subnetworks, and a late iteration costs about what the first did. None
        without a previous ensemble or a fitted member."""
        fitted = [self.subnetworks[i] for i in self._fitted()]
        if self.previous is None and not fitted:
            return None
        members = [m.subnetwork for m in self.previous.members] if self.previous else []
        lasts = any(c.weights.reads_last_layers for c in self.candidates if c.keep_previous)

        def outputs(features):
            columns = {}
            if members:
                both = tuple(m(features, training=m.builder.fitted) for m in members)
                if lasts:
                    columns[PREVIOUS_OUTPUTS] = both
                else:
                    columns[PREVIOUS_LOGITS] = tuple(logits for _, logits in both)
            if fitted:
                columns[FITTED_LOGITS] = tuple(s(features, training=True)[1] for s in fitted)
            return columns

        width = (
            sum((m.last_layer_dim if lasts else 0) + self.head.logits_dimension for m in members)
            + len(fitted) * self.head.logits_dimension
        )
        # (compiled: traced once, not run op by op on every chunk)
        return Derived(compile_encoded(outputs, self.inputs), bytes_per_example=4 * width)

    # -- training -------------------------------------------------------------------------
    def active(self) -> tuple[list[int], list[int]]:
        subnetworks = [i for i, s in enumerate(self.subnetworks) if s.name not in self.stopped]
        alive = set(subnetworks)
        candidates = [
            c
            for c, cand in enumerate(self.candidates)
            if cand.name not in self.stopped and all(i in alive for i in cand.new_subnetworks)
        ]
        return subnetworks, candidates

    def unit_jobs(self, unit: Unit) -> tuple[list[int], list[int]]:
        """The active subnetworks and candidates that `unit` trains."""
        active_subnetworks, active_candidates = self.active()
        return (
            [i for i in active_subnetworks if i in unit.subnetworks],
            active_candidates if unit.ensemble and not self.is_exhausted else [],
        )

    def steps_fn(self, unit: Unit, *, writers: int = 1) -> Callable:
        """`fn(iterator, steps)`: builds a graph loop of `steps` train steps of `unit`'s jobs
        (for use inside a `tf.function`); returns the steps taken.

        With one replica (one process, or a worker of a parameter-server cluster) the loop
        reads the unit's variables, optimizer slots and statistics once, trains them as
        tensors in this process, and writes them back once at the end (`_local_steps`); with
        synchronous replicas every step updates the variables (`_variable_steps`).
        """
        trained, candidates = self.unit_jobs(unit)
        if self.strategy.num_replicas_in_sync == 1:
            group = self.units.index(unit)
            return self._local_steps(trained, candidates, writers=writers, group=group)
        return self._variable_steps(trained, candidates)

    def _losses(self, features, labels, trained, candidates):
        """This replica's (total, subnetwork losses, candidate objectives): the total is what
        one backward pass differentiates (previous ensemble's objective measured, not
        trained). With example weights each example's loss is weighted (the weights are
        scaled to a mean of 1 over the training data, so the sum over the global batch size
        estimates the weighted mean)."""
        new, logits, previous = self._forward(
            features, trained=trained, candidates=candidates, training_rows=True
        )
        global_batch = self.options.batch_size
        weights = features.get(WEIGHT)
        sub_logits = self._subnetwork_training_logits(
            previous, {i: new[i][1] if new[i][2] is None else new[i][2] for i in trained}
        )
        sub_losses = [self._subnetwork_loss(labels, sub_logits[i], weights) for i in trained]
        objectives = [
            training_objective(
                self.head.loss(labels, logits[c], weights),
                self.candidates[c].weights.penalty(),
                global_batch_size=global_batch,
                replicas=self.strategy.num_replicas_in_sync,
            )
            for c in candidates
        ]
        total = tf.add_n(
            [tf.constant(0.0)]
            + sub_losses
            + [o for c, o in zip(candidates, objectives) if not self.candidates[c].is_previous]
        )
        return (
            total,
            tf.stack(sub_losses) if trained else tf.zeros([0]),
            tf.stack(objectives) if candidates else tf.zeros([0]),
        )

    def _subnetwork_loss(self, labels, logits, weights) -> tf.Tensor:
        """A subnetwork's loss: on its logits [batch, logits], or the mean of its heads'
        losses on their logits [batch, k, logits] (each head a row of its own)."""
        global_batch = self.options.batch_size
        if logits.shape.rank == 3:
            k = int(logits.shape[1])
            labels = tf.repeat(labels, k, axis=0)
            weights = None if weights is None else tf.repeat(weights, k, axis=0)
            logits = tf.reshape(logits, [-1, logits.shape[2]])
            global_batch *= k
        return tf.nn.compute_average_loss(
            self.head.loss(labels, logits, weights), global_batch_size=global_batch
        )

    def _subnetwork_training_logits(self, previous_outputs: list, logits: dict) -> dict:
        """The logits each trained subnetwork's loss is taken on: its own, or with
        `--subnetwork_loss=residual` (and a previous ensemble) those of the previous ensemble
        grown by it as the first ensembler's grow candidate starts: 1 / n of its own logits
        for n members plus the kept share of the previous ensemble's, (n - 1) / n (an even
        share: the default grow candidate's logits exactly), or all of it when the mixture
        weights are warm-started (additive growth, as in boosting with a step of 1 / n).
        A new subnetwork learns what the ensemble still gets wrong. `previous_outputs` are
        the previous members' outputs `_forward` computed."""
        if self.options.subnetwork_loss != "residual" or self.previous is None or not logits:
            return logits
        previous = tf.stop_gradient(self.previous.weights(previous_outputs))
        n = len(previous_outputs) + 1
        kept = self.ensemblers[0].kept_share(n)
        return {
            i: (previous[:, None, :] if own.shape.rank == 3 else previous) * kept + own / n
            for i, own in logits.items()
        }

    def _apply_to_tables(self, trained, grads, scale) -> None:
        """The embedding tables' sparse updates, in place (wherever the tables live)."""
        grads = iter(grads)
        for i in trained:
            if i in self.embedding_optimizers:
                own = self.subnetworks[i].embedding_tables
                self.embedding_optimizers[i].apply([next(grads) for _ in own], own, scale=scale)

    def _progress(self, trained, candidates) -> tf.Tensor:
        """The steps the jobs of a unit have taken in this iteration, all workers' together:
        where its learning rate schedule stands (the jobs a unit trains step together)."""
        if trained:
            return tf.reduce_max(tf.gather(self.subnetwork_steps, trained))
        return tf.identity(self.step) if candidates else tf.constant(0, tf.int64)

    def _rate_scale(self, progress) -> tf.Tensor:
        if self.decay_steps is None:
            return tf.constant(1.0)
        return cosine_decay(progress, self.decay_steps)

    def _tables(self, trained) -> list[tf.Variable]:
        return [
            t
            for i in trained
            if i in self.embedding_optimizers
            for t in self.subnetworks[i].embedding_tables
        ]

    def _count(self, trained, candidates, steps) -> list:
        """Adds `steps` to the step counters of the jobs trained (ops to run)."""
        ops = []
        if len(trained) == len(self.subnetworks):
            ops.append(self.subnetwork_steps.assign_add(tf.fill([len(trained)], steps)))
        elif trained:
            index = tf.constant(trained, tf.int32)[:, None]
            ops.append(self.subnetwork_steps.scatter_nd_add(index, tf.fill([len(trained)], steps)))
        if candidates:
            ops.append(self.step.assign_add(steps))
        return ops

    def _variable_steps(self, trained, candidates) -> Callable:
        """Synchronous replicas: each step updates the variables where they live."""
        subnetwork_vars = self._subnetwork_variables(trained)
        mixture_vars = self._mixture_variables(candidates)
        tables = self._tables(trained)

        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                total, sub_losses, objectives = self._losses(features, labels, trained, candidates)
            grads = tape.gradient(total, subnetwork_vars + mixture_vars + tables)
            scale = self._rate_scale(self._progress(trained, candidates))
            if subnetwork_vars:
                self.subnetwork_optimizer.apply(
                    grads[: len(subnetwork_vars)], subnetwork_vars, scale=scale
                )
            if mixture_vars:
                self.mixture_optimizer.apply(
                    grads[len(subnetwork_vars) : len(subnetwork_vars) + len(mixture_vars)],
                    mixture_vars,
                    scale=scale,
                )
            self._apply_to_tables(trained, grads[len(subnetwork_vars) + len(mixture_vars) :], scale)
            return sub_losses, objectives

        update_subnetworks = moving_average_update(trained, len(self.subnetworks))
        update_candidates = moving_average_update(candidates, len(self.candidates))

        def body(i, iterator):
            features, labels = next(iterator)
            sub_losses, objectives = self.strategy.run(replica_step, args=(features, labels))
            sub_losses = self.strategy.reduce("SUM", sub_losses, axis=None)
            objectives = self.strategy.reduce("SUM", objectives, axis=None)
            update_subnetworks(self.subnetwork_loss_ema, self.subnetwork_diverged, sub_losses)
            update_candidates(self.objective_ema, self.candidate_diverged, objectives)
            self._count(trained, candidates, tf.constant(1, tf.int64))
            return i + 1, iterator

        def run_steps(iterator, steps):
            return tf.while_loop(
                lambda i, _: i < steps, body, (tf.constant(0, tf.int64), iterator)
            )[0]

        return run_steps

    def _local_steps(self, trained, candidates, *, writers: int, group: int) -> Callable:
        """One replica: read once, train in this process's memory, write once.

        The trained variables (Keras's, trainable or not) and their optimizer state are
        carried through the loop as tensors; the forward pass reads them, and the variables
        it only reads (previous members, subnetworks other workers train), through
        `keras.StatelessScope`. At the end each trained variable gets its share of the change
        this loop made: 1 / `writers`, the workers that train the same unit at once (their
        changes from about the same start average, as in local SGD; summed, four replicating
        workers lost 4 points of census accuracy, `bench/cluster.py`), or with an outer step
        (--outer_learning_rate, --outer_momentum) `DelayedNesterov`'s, the optimizer
        slots and moving averages this loop's values, and the step counters the steps taken.
        Embedding tables are updated in place, sparsely, at every step.
        """
        held = self._local_groups(trained, candidates)
        return functools.partial(self._run_local_steps, held, writers=writers, group=group)

    def _local_groups(self, trained, candidates) -> _LocalGroups:
        subnetwork_vars = self._subnetwork_variables(trained)
        mixture_vars = self._mixture_variables(candidates)
        watched = {id(v) for v in subnetwork_vars + mixture_vars}
        carried = [
            v for i in trained for v in self.subnetworks[i].keras_variables if id(v) not in watched
        ]  # e.g. a dropout layer's seed
        held = watched | {id(v) for v in carried}
        return _LocalGroups(
            trained=list(trained),
            candidates=list(candidates),
            subnetwork_vars=subnetwork_vars,
            mixture_vars=mixture_vars,
            carried=carried,
            read_only=[
                v for v in self._forward_variables(trained, candidates) if id(v) not in held
            ],
            tables=self._tables(trained),
            sub_index=tf.constant(trained or [0], tf.int32)[:, None],
            cand_index=tf.constant(candidates or [0], tf.int32)[:, None],
        )

    def _local_replica_step(self, g: _LocalGroups, features, labels, params, others, fixed, scale):
        """One step of one replica on the carried values: the losses, the gradients of the
        trainable values and the carried ones' new values (the tables updated in place)."""
        mapping = list(zip(g.trainable + g.carried + g.read_only, [*params, *others, *fixed]))
        with tf.GradientTape() as tape:
            tape.watch(params)
            with keras.StatelessScope(state_mapping=mapping) as scope:
                total, sub_losses, objectives = self._losses(
                    features, labels, g.trained, g.candidates
                )
                others = [scope.get_current_value(v) for v in g.carried]
        grads = tape.gradient(
            total, [*params, *g.tables], unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        self._apply_to_tables(g.trained, grads[len(params) :], scale)
        return sub_losses, objectives, grads[: len(params)], others

    def _run_local_steps(self, g: _LocalGroups, iterator, steps, *, writers: int, group: int):
        params = [tf.identity(tf_variable(v)) for v in g.trainable]
        fixed = [tf.identity(tf_variable(v)) for v in g.read_only]
        start = self._progress(g.trained, g.candidates)  # other workers' chunks may add later
        n = len(g.subnetwork_vars)
        replica_step = functools.partial(self._local_replica_step, g)

        def body(i, iterator, params, others, sub_state, mix_state, stats):
            features, labels = next(iterator)
            scale = self._rate_scale(start + i)
            sub_losses, objectives, grads, others = self.strategy.run(
                replica_step, args=(features, labels, params, others, fixed, scale)
            )
            sub_params, sub_state = self.subnetwork_optimizer.update(
                params[:n], grads[:n], sub_state, variables=g.subnetwork_vars, scale=scale
            )
            mix_params, mix_state = self.mixture_optimizer.update(
                params[n:], grads[n:], mix_state, variables=g.mixture_vars, scale=scale
            )
            sub_ema, sub_div, cand_ema, cand_div = stats
            if g.trained:
                sub_ema, sub_div = moving_average_step(sub_ema, sub_div, sub_losses)
            if g.candidates:
                cand_ema, cand_div = moving_average_step(cand_ema, cand_div, objectives)
            return (
                i + 1, iterator, sub_params + mix_params, others,
                sub_state, mix_state, (sub_ema, sub_div, cand_ema, cand_div),
            )  # fmt: skip

        stats = (
            tf.gather_nd(self.subnetwork_loss_ema, g.sub_index),
            tf.gather_nd(self.subnetwork_diverged, g.sub_index),
            tf.gather_nd(self.objective_ema, g.cand_index),
            tf.gather_nd(self.candidate_diverged, g.cand_index),
        )
        taken, _, final, others, sub_state, mix_state, stats = tf.while_loop(
            lambda i, *_: i < steps,
            body,
            (
                tf.constant(0, tf.int64), iterator, params,
                [tf.identity(tf_variable(v)) for v in g.carried],
                self.subnetwork_optimizer.read(g.subnetwork_vars),
                self.mixture_optimizer.read(g.mixture_vars),
                stats,
            ),
        )  # fmt: skip
        changes = [end - begin for begin, end in zip(params, final)]
        if self.outer is not None and writers > 1:
            self.outer.apply(g.trainable, changes, writers=writers, group=group)
        else:
            for v, change in zip(g.trainable, changes):
                tf_variable(v).assign_add(change / writers)
        for v, value in zip(g.carried, others):
            tf_variable(v).assign(value)
        self.subnetwork_optimizer.write(g.subnetwork_vars, sub_state, steps_taken=taken)
        self.mixture_optimizer.write(g.mixture_vars, mix_state, steps_taken=taken)
        self._write_stats(g, stats)
        self._count(g.trained, g.candidates, taken)
        return taken

    def _write_stats(self, g: _LocalGroups, stats) -> None:
        """The moving averages and divergence flags a local loop carried, written back."""
        sub_ema, sub_div, cand_ema, cand_div = stats
        if g.trained:
            self.subnetwork_loss_ema.scatter_nd_update(g.sub_index, sub_ema)
            self.subnetwork_diverged.scatter_nd_update(g.sub_index, sub_div)
        if g.candidates:
            self.objective_ema.scatter_nd_update(g.cand_index, cand_ema)
            self.candidate_diverged.scatter_nd_update(g.cand_index, cand_div)

    def _forward_variables(self, trained, candidates) -> list:
        """The Keras variables a forward pass of these jobs reads."""
        needed = set(trained).union(*(self.candidates[c].new_subnetworks for c in candidates))
        variables = [v for i in sorted(needed) for v in self.subnetworks[i].keras_variables]
        if self.previous is not None and any(self.candidates[c].keep_previous for c in candidates):
            variables += [v for m in self.previous.members for v in m.subnetwork.keras_variables]
        variables += [v for c in candidates for v in self.candidates[c].weights.keras_variables]
        return variables

    def _compile_loop(self) -> Callable:
        # Written without autograph: converting this code costs more tracing time than the
        # explicit while_loop takes to write, and tracing is most of the pause between
        # iterations.
        return tf.function(self.steps_fn(self.units[0]), autograph=False)

    def train(self, iterator, steps: int) -> list[str]:
        """Runs `steps` train steps of the first unit (the only one on a single machine);
        returns the names of candidates that diverged in them (they stop training and are
        never selected)."""
        if self._loop is None:
            self._loop = self._compile_loop()
        self._loop(iterator, tf.constant(steps, tf.int64))
        return self.stop_diverged()

    def stop_diverged(self) -> list[str]:
        """Stops training whatever is flagged diverged (by training, or in a restored
        checkpoint) and not yet stopped; returns those names."""
        names = [s.name for s, d in zip(self.subnetworks, self.subnetwork_diverged.numpy()) if d]
        names += [c.name for c, d in zip(self.candidates, self.candidate_diverged.numpy()) if d]
        newly = [n for n in names if n not in self.stopped]
        if newly:
            self.stopped = self.stopped | frozenset(newly)
            self._loop = None  # rebuilt without them at the next call
        return newly

    @property
    def is_exhausted(self) -> bool:
        """True when every new candidate has stopped: nothing is left to train."""
        return not any(not self.candidates[c].is_previous for c in self.active()[1])

    def moving_average_objectives(self) -> np.ndarray:
        """Zero-debiased EMA of each candidate's training objective."""
        return debiased(self.objective_ema.numpy(), self.step.numpy())

    def subnetwork_train_losses(self) -> np.ndarray:
        """Zero-debiased EMA of each new subnetwork's training loss."""
        return debiased(self.subnetwork_loss_ema.numpy(), self.subnetwork_steps.numpy())

    def snapshot(self) -> Snapshot:
        """The iteration's counters and statistics now, as plain values."""
        return Snapshot(
            step=int(self.step.numpy()),
            subnetwork_steps=tuple(int(n) for n in self.subnetwork_steps.numpy()),
            objectives=tuple(float(v) for v in self.moving_average_objectives()),
            subnetwork_losses=tuple(float(v) for v in self.subnetwork_train_losses()),
            candidate_diverged=tuple(bool(d) for d in self.candidate_diverged.numpy()),
            subnetwork_diverged=tuple(bool(d) for d in self.subnetwork_diverged.numpy()),
            active_candidates=tuple(self.active()[1]),
        )

    def scores(self, objectives: Sequence[float]) -> list[ens.Score]:
        """Each candidate's score for selection: its objective, whether it diverged, and
        the complexity and trainable parameters of the subnetworks it adds."""
        diverged = self.candidate_diverged.numpy()
        return [
            ens.Score(
                c.name,
                float(o),
                c.is_previous,
                bool(d),
                sum(self.builders[i].complexity for i in c.new_subnetworks),
                sum(self.subnetworks[i].parameters for i in c.new_subnetworks),
                "+".join(sorted({self.builders[i].complexity_scale for i in c.new_subnetworks})),
            )
            for c, o, d in zip(self.candidates, objectives, diverged)
        ]

    # -- evaluation -----------------------------------------------------------------------
    def predict_fn(self) -> Callable[[Encoded], tuple[tf.Tensor, tf.Tensor]]:
        """fn(features) -> (logits of every candidate [C, N, L], of every new subnetwork
        [S, N, L]), compiled once."""
        if self._predict is None:
            every_subnetwork = list(range(len(self.subnetworks)))
            every_candidate = list(range(len(self.candidates)))

            def predict(features):
                new, logits, _ = self._forward(features, trained=(), candidates=every_candidate)
                return (
                    tf.stack([logits[c] for c in every_candidate]),
                    tf.stack(
                        [
                            (new[i] if i in new else self.subnetworks[i](features, training=False))[
                                1
                            ]
                            for i in every_subnetwork
                        ]
                    ),
                )

            self._predict = compile_encoded(predict, self.inputs)
        return self._predict

    def freeze(self, candidate_index: int) -> FrozenEnsemble:
        """The chosen candidate as the next iteration's frozen previous ensemble."""
        candidate = self.candidates[candidate_index]
        if self.previous is not None and candidate.is_previous:
            return self.previous
        members = list(self.previous.members) if self.previous and candidate.keep_previous else []
        members += [
            FrozenMember(self.number, self.builders[i], self.subnetworks[i])
            for i in candidate.new_subnetworks
        ]
        assert candidate.ensembler is not None  # only the previous ensemble has none
        return FrozenEnsemble(tuple(members), candidate.weights, candidate.ensembler)
