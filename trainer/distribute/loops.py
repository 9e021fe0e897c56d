"""Train loops: how an iteration's steps run, behind one protocol.

A `TrainLoop` trains a chunk of steps per `train()` call and says what happened (`Chunk`: the
step count, what diverged, whether it is done); the controller calls it until it is done and
does its bookkeeping between calls. Nothing calls back into the controller.

- `LocalLoop`: this process (one machine, or one replica of a synchronous cluster) runs the
  compiled loop for `steps_per_loop` steps per call.
- `CoordinatedLoop`: the chief schedules chunks of steps on the cluster's workers through the
  `ClusterCoordinator` (placement decides which unit each worker trains).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Protocol

import tensorflow as tf
from absl import logging

from trainer.distribute import runtime as distributed
from trainer.errors import first_line
from trainer.input.job_input import JobInput
from trainer.input.pipeline import Derived, Shard
from trainer.placement import Placement, cost
from trainer.search.iteration import Iteration
from trainer.search.record import UnitRecord

_IDLE_PAUSE_SECS = 0.05


@dataclasses.dataclass(frozen=True)
class Chunk:
    """What one `train()` call did: the iteration's (ensemble's) step count after it, the
    candidates and subnetworks that diverged in it (they stop training), and whether every
    job now has its budget (or nothing is left to train)."""

    step: int
    diverged: tuple[str, ...] = ()
    done: bool = False


class TrainLoop(Protocol):
    """Trains one iteration, a chunk at a time."""

    @property
    def done(self) -> bool:
        """Every job has its budget, or nothing is left to train."""

    def train(self) -> Chunk:
        """Trains a chunk of steps and says what happened."""

    def stop(self) -> None:
        """Trains no further than the chunks already started (a time budget)."""

    def placement(self) -> tuple[UnitRecord, ...]:
        """Who trained what, for the iteration's record."""

    @property
    def placement_note(self) -> str | None:
        """A line on the placement, for the iteration's record (None: nothing to say)."""


class LocalLoop:
    """The compiled loop in this process, `steps_per_loop` steps per call (one step in the
    first call: it builds the graph, and the pause between iterations ends with it). Every
    replica trains everything for every step."""

    def __init__(
        self,
        *,
        iteration: Iteration,
        iterator,
        budget: int,
        steps_per_loop: int,
        replicas: tuple[str, ...],
    ):
        self.iteration, self.iterator = iteration, iterator
        self.budget, self.steps_per_loop, self.replicas = budget, steps_per_loop, replicas
        self.step = int(iteration.step.numpy())
        self._calls = 0
        self.placement_note: str | None = None

    @property
    def done(self) -> bool:
        return self.step >= self.budget or self.iteration.is_exhausted

    def stop(self) -> None:
        """Ends the iteration's training at the step it has reached (a time budget)."""
        self.budget = self.step

    def train(self) -> Chunk:
        steps = 1 if not self._calls else min(self.steps_per_loop, self.budget - self.step)
        diverged = self.iteration.train(self.iterator, steps)
        self._calls += 1
        self.step += steps
        return Chunk(self.step, tuple(diverged), self.done)

    def placement(self) -> tuple[UnitRecord, ...]:
        steps = int(self.iteration.step.numpy())
        return (
            UnitRecord(
                "everything",
                ("ensemble", *(s.name for s in self.iteration.subnetworks)),
                self.replicas,
                dict.fromkeys(self.replicas, steps),
            ),
        )


class CoordinatedLoop:
    """Trains one iteration on the workers: each scheduled chunk runs `steps_per_loop` steps of
    the unit of whichever worker takes it (`Assignment`), clipped to what that unit's jobs
    still need. A worker whose jobs are done idles; when some unit has made no progress for
    `stall_secs` (its workers lost), idle workers take over its remaining steps, so no job is
    ever left untrained and the chief never waits forever. A worker that fails has its chunk
    rescheduled by the coordinator, and rejoins when it is restarted.

    Each `train()` call keeps up to two chunks per worker in flight and waits for one.
    """

    def __init__(
        self,
        *,
        runtime: distributed.Runtime,
        iteration: Iteration,
        iterator,
        budget: int,
        steps_per_loop: int,
        stall_secs: float,
        chunk_secs: float = 1.0,
    ):
        self.runtime = runtime
        self.iteration = iteration
        self.iterator = iterator
        self.budget = budget
        self.steps_per_loop = steps_per_loop
        self.stall_secs = stall_secs
        self.chunk_secs = chunk_secs
        self.assignment = runtime.assignment(len(iteration.subnetworks))
        self.units = self.assignment.distinct
        self.placement_note = self._round_robin_note()
        if self.placement_note:
            logging.warning("%s", self.placement_note)
        with runtime.strategy.scope():
            self.steal = tf.Variable(False, trainable=False, name="steal")
        # steps[worker][unit index] actually run (a unit taken over counts for its taker).
        self.steps: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self._chunk: Callable | None = None
        self._inflight: collections.deque = collections.deque()
        counters = self.counters()
        self._left = self.remaining(counters)
        self._progress = (counters, time.monotonic())
        self._stealing = False  # what `steal` holds, without a read from the ps
        self._trained = 0  # worker steps fetched so far, and since when (for the chunk size)
        self._since: float | None = None
        self._stopped = False

    @property
    def done(self) -> bool:
        return self._left <= 0 and not self._inflight

    def stop(self) -> None:
        """Schedules no more chunks (a time budget); those in flight still finish."""
        self._stopped = True
        self._left = 0

    def _build_chunk(self) -> Callable:
        iteration, units, budget = self.iteration, self.units, self.budget
        unit_of_worker = tf.constant(
            [self.assignment.unit_index(w) for w in range(len(self.assignment.units))], tf.int64
        )
        runs = [iteration.steps_fn(u, writers=len(self.assignment.workers_of(u))) for u in units]
        jobs = [iteration.unit_jobs(u) for u in units]
        idle = len(units)
        active = iteration.active()[0]
        lead = self.steps_per_loop

        def remaining():
            left = []
            for trained, candidates in jobs:
                parts = []
                if candidates and len(trained) < len(active):
                    # Mixture weights trained apart from (some of) their subnetworks never run
                    # more than `lead` steps ahead of the slowest: they are fitted to
                    # subnetworks as trained as their own step count says.
                    slowest = tf.reduce_min(tf.gather(iteration.subnetwork_steps, active))
                    parts.append(
                        tf.minimum(tf.constant(budget, tf.int64), slowest + lead) - iteration.step
                    )
                elif candidates:
                    parts.append(budget - iteration.step)
                if trained:
                    parts.append(
                        budget - tf.reduce_min(tf.gather(iteration.subnetwork_steps, trained))
                    )
                left.append(
                    tf.maximum(tf.reduce_max(tf.stack(parts)), 0)
                    if parts
                    else tf.constant(0, tf.int64)
                )
            return tf.stack([*left, tf.constant(0, tf.int64)])

        def chunk(iterator, steps):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            left = remaining()
            own = tf.gather(unit_of_worker, worker)
            neediest = tf.argmax(left, output_type=tf.int64)
            target = tf.where(
                left[own] > 0, own, tf.where(self.steal & (left[neediest] > 0), neediest, idle)
            )
            count = tf.minimum(steps, tf.gather(left, target))
            done = tf.switch_case(
                tf.cast(target, tf.int32),
                [lambda run=run: run(iterator, count) for run in runs]
                + [lambda: tf.constant(0, tf.int64)],
            )
            return worker, target, done

        return tf.function(chunk, autograph=False)

    def counters(self) -> tuple[int, tuple[int, ...]]:
        """The ensemble's and each subnetwork's steps so far (read from the parameter
        servers once per chunk)."""
        return (
            int(self.iteration.step.numpy()),
            tuple(int(n) for n in self.iteration.subnetwork_steps.numpy()),
        )

    def remaining(self, counters: tuple[int, tuple[int, ...]]) -> int:
        """The most steps any active job still needs."""
        step, subnetwork_steps = counters
        needs = []
        for unit in self.units:
            trained, candidates = self.iteration.unit_jobs(unit)
            if candidates:
                needs.append(self.budget - step)
            needs += [self.budget - subnetwork_steps[i] for i in trained]
        return max([0, *needs])

    def train(self) -> Chunk:
        coordinator = self.runtime.coordinator
        assert coordinator is not None, "a coordinated loop runs under a ClusterCoordinator"
        workers = len(self.assignment.units)
        if self._chunk is None:
            self._chunk = self._build_chunk()
        try:
            while self._left > 0 and len(self._inflight) < 2 * workers:
                steps = min(self.chunk_steps(), max(1, math.ceil(self._left / workers)))
                self._inflight.append(
                    coordinator.schedule(
                        self._chunk, args=(self.iterator, tf.constant(steps, tf.int64))
                    )
                )
            worker, target, done = (int(v) for v in self._inflight.popleft().fetch())
        except tf.errors.OpError as e:
            if not distributed.lost_workers_only(e):
                raise
            # The coordinator retries a lost worker's chunks; an error it passes on
            # anyway (and the chunks it cancels with it) loses only that chunk's steps,
            # which the counters on the ps say are still to do.
            if not isinstance(e, tf.errors.CancelledError):
                logging.log_every_n_seconds(
                    logging.WARNING,
                    "A chunk failed with a lost worker; its steps are scheduled again (%s: %s).",
                    10,
                    type(e).__name__,
                    first_line(e),
                )
            return Chunk(self._progress[0][0], (), self.done)
        if target < len(self.units):
            self.steps[worker][target] += done
            if self._since is None:  # the first chunk also traced and shipped the graph
                self._since = time.monotonic()
            else:
                self._trained += done
        else:
            time.sleep(_IDLE_PAUSE_SECS)
        diverged = self.iteration.stop_diverged()
        if diverged:
            self._chunk = None  # rebuilt without them
        counters = self.counters()
        exhausted = self.iteration.is_exhausted or self._stopped
        self._left = 0 if exhausted else self.remaining(counters)
        self._watch_stall(counters)
        return Chunk(counters[0], tuple(diverged), self.done)

    def chunk_steps(self) -> int:
        """Steps per chunk: about `chunk_secs` of a worker's training at the rate seen so far
        (the first chunks, before any rate is known: `steps_per_loop`), and never fewer than
        `steps_per_loop`. Each chunk costs a round trip to the parameter servers and through
        the coordinator; this keeps that cost a small share of a worker's time whatever the
        model's size."""
        if not self._trained:
            return self.steps_per_loop
        elapsed = time.monotonic() - (self._since or 0.0)
        per_worker = self._trained / elapsed / len(self.assignment.units)
        return max(self.steps_per_loop, int(per_worker * self.chunk_secs))

    def _watch_stall(self, counters: tuple[int, tuple[int, ...]]) -> None:
        last, since = self._progress
        if counters != last:
            self._progress = (counters, time.monotonic())
        elif self._left > 0 and time.monotonic() - since > self.stall_secs and not self._stealing:
            logging.warning(
                "No progress for %.0f s (a worker lost?): idle workers take over "
                "the remaining steps.",
                self.stall_secs,
            )
            self.steal.assign(True)
            self._stealing = True

    def placement(self) -> tuple[UnitRecord, ...]:
        """Per unit: its assigned workers, and the steps each worker ran of it."""
        k = len(self.iteration.subnetworks)
        name = self.runtime.worker_name
        return tuple(
            UnitRecord(
                unit.describe(k),
                (("ensemble",) if unit.ensemble else ())
                + tuple(self.iteration.subnetworks[i].name for i in unit.subnetworks),
                tuple(name(w) for w in self.assignment.workers_of(unit)),
                {name(w): counts[u] for w, counts in sorted(self.steps.items()) if counts[u]},
                {
                    self.iteration.subnetworks[i].name: _ps_tasks(
                        self.iteration.subnetworks[i].checkpoint_variables().values()
                    )
                    for i in unit.subnetworks
                },
                self._outer_arrivals(unit),
            )
            for u, unit in enumerate(self.units)
        )

    def _round_robin_note(self) -> str | None:
        """Under round-robin, when the cost model (`trainer/placement/cost.py`, its simulated
        cluster's fit) predicts replication would get this iteration's steps done sooner on
        these workers: a line saying so (round-robin is kept: at equal examples it learns
        more per example; docs/benchmarks.md "The same job on more workers")."""
        workers = len(self.assignment.units)
        if self.runtime.placement.name != Placement.ROUND_ROBIN.value or workers < 2:
            return None
        job = cost.ClusterJob(
            placement=Placement.ROUND_ROBIN,
            workers=workers,
            ps=max(1, self.runtime.cluster.num_ps),
            batch_size=self.iteration.options.batch_size,
            chunks=cost.Chunks(self.steps_per_loop, self.chunk_secs, self.budget),
            subnetwork_bytes=tuple(s.variable_bytes for s in self.iteration.subnetworks),
            optimizer_slots=cost.OPTIMIZER_SLOTS.get(self.iteration.options.optimizer, 2),
        )
        robin = cost.predict(job, cost.SIMULATED_PARAMS).job_steps_per_s
        replication = cost.predict(
            dataclasses.replace(job, placement=Placement.REPLICATION), cost.SIMULATED_PARAMS
        ).job_steps_per_s
        if robin >= replication:
            return None
        return (
            f"Round-robin on {workers} workers is predicted to train this iteration at "
            f"{robin:.0f} steps/s per job, replication at {replication:.0f} "
            "(trainer/placement/cost.py): --placement=replication would end sooner, but "
            "learns less per example."
        )

    def _outer_arrivals(self, unit) -> int | None:
        """The chunk changes an outer step added to `unit`'s variables (None: none did)."""
        outer = self.iteration.outer
        if outer is None or len(self.assignment.workers_of(unit)) < 2:
            return None
        return int(outer.arrivals[self.iteration.units.index(unit)].numpy())


def _ps_tasks(variables) -> tuple[int, ...]:
    """The parameter servers that hold `variables` (tf.Variables)."""
    devices = [tf.DeviceSpec.from_string(v.device) for v in variables]
    return tuple(sorted({d.task for d in devices if d.job == "ps"}))


class LoopMaker:
    """Makes each iteration's loop for this replica: coordinated under a `ClusterCoordinator`,
    else local. Owns the datasets the loops read."""

    def __init__(
        self,
        *,
        runtime: distributed.Runtime,
        data: JobInput,
        batch_size: int,
        seed: int,
        steps_per_loop: int,
        stall_secs: float,
        budget: int,
        chunk_secs: float = 1.0,
    ):
        self.runtime, self.data = runtime, data
        self.batch_size, self.seed = batch_size, seed
        self.steps_per_loop, self.stall_secs, self.budget = steps_per_loop, stall_secs, budget
        self.chunk_secs = chunk_secs
        self._worker_iterator = None

    def readers(self) -> tuple[str, ...]:
        """Who reads training data: each worker under a coordinator, else each host."""
        return tuple(self.runtime.worker_name(w) for w in range(self.runtime.num_workers))

    def __call__(self, iteration: Iteration) -> TrainLoop:
        if self.runtime.coordinator is not None:
            return CoordinatedLoop(
                runtime=self.runtime,
                iteration=iteration,
                iterator=self._per_worker_iterator(),
                budget=self.budget,
                steps_per_loop=self.steps_per_loop,
                stall_secs=self.stall_secs,
                chunk_secs=self.chunk_secs,
            )
        # A new order per iteration, and per resume point: a resumed run does not replay the
        # batches it already trained on.
        step = int(iteration.step.numpy())
        seed = (self.seed * 1_000_003 + iteration.number * 10_007 + step) % 2**31
        iterator = iter(
            self.runtime.strategy.distribute_datasets_from_function(
                lambda context: self._replica_batches(context, seed, iteration.previous_outputs())
            )
        )
        return LocalLoop(
            iteration=iteration,
            iterator=iterator,
            budget=self.budget,
            steps_per_loop=self.steps_per_loop,
            replicas=self.readers(),
        )

    def _replica_batches(
        self, context: tf.distribute.InputContext, seed: int, derived: Derived | None
    ) -> tf.data.Dataset:
        """The batches of one input pipeline (of each host, under a synchronous strategy): its
        shard of the training rows, in batches of the per-replica size (held in memory, with
        the `derived` columns, when they fit)."""
        readers = context.num_input_pipelines
        return self.data.training(
            readers=readers,
            shard=Shard.of(
                context.input_pipeline_id, readers, num_files=len(self.data.train_source.files)
            ),
            batch_size=context.get_per_replica_batch_size(self.batch_size),
            seed=seed,
            derived=derived,
        )

    def _per_worker_iterator(self):
        """Each worker's endless shuffled batches of its own shard of the training rows (built
        once; the coordinator rebuilds a restarted worker's). The workers build these datasets
        from a function the chief traces: they read the files themselves, with no Python."""
        if self._worker_iterator is None:
            data, workers = self.data, self.runtime.num_workers
            batch_size, seed = self.batch_size, self.seed

            def dataset_fn():
                worker = tf.distribute.coordinator.experimental_get_current_worker_index()
                return data.training(
                    readers=workers,
                    shard=Shard.of(worker, workers, num_files=len(data.train_source.files)),
                    batch_size=batch_size,
                    seed=seed,
                    in_process=False,
                )

            coordinator = self.runtime.coordinator
            assert coordinator is not None, "per-worker datasets need a ClusterCoordinator"
            self._worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        return self._worker_iterator
