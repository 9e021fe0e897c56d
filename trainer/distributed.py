"""How this replica takes part in training: the tf.distribute strategy for its cluster, the
server loop of workers and parameter servers, and the coordinated train loop.

- Parameter servers in the cluster: the chief runs `ParameterServerStrategy` with a
  `ClusterCoordinator` and schedules work on the workers; workers and ps run a TensorFlow
  server (`serve`) until the chief is gone. Updates are asynchronous.
- Workers without ps: every worker (the chief included) runs the trainer under
  `MultiWorkerMirroredStrategy`: synchronous all-reduce.
- Several GPUs on one machine: `MirroredStrategy`; else the default strategy.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import re
import signal
import sys
import threading
import time
from typing import Callable

import tensorflow as tf
from absl import logging

from trainer import cluster as cluster_lib
from trainer.cluster import Cluster
from trainer.errors import TrainingError
from trainer.iteration import Iteration, Layout
from trainer.placement import Assignment, PlacementStrategy, ps_for_variable

_CHIEF_DEVICE = "/job:chief/replica:0/task:0/device:CPU:0"


@dataclasses.dataclass
class Runtime:
    """The strategy this replica trains under, and what placement and the cluster imply."""

    cluster: Cluster
    strategy: tf.distribute.Strategy
    placement: PlacementStrategy
    coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None
    _anchors: dict[int, tf.Variable] = dataclasses.field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        return self.cluster.is_chief

    @property
    def num_workers(self) -> int:
        """Workers that train (under the coordinator: the worker tasks; else replicas' hosts)."""
        if self.coordinator is not None:
            return self.cluster.num_workers
        return 1 + self.cluster.num_workers if self.cluster.is_distributed else 1

    def worker_name(self, index: int) -> str:
        if self.coordinator is not None:
            return f"worker {index}"
        return "chief" if index == 0 else f"worker {index - 1}"

    @property
    def checkpoint_options(self) -> tf.train.CheckpointOptions | None:
        """Under parameter servers, the chief writes every shard itself: where a variable lives
        does not decide which machine's disk (or credentials) a checkpoint needs."""
        if self.coordinator is None:
            return None
        return tf.train.CheckpointOptions(experimental_io_device=_CHIEF_DEVICE)

    def assignment(self, num_subnetworks: int) -> Assignment:
        return self.placement.assign(num_workers=max(self.num_workers, 1),
                                     num_subnetworks=num_subnetworks)

    def layout(self, num_subnetworks: int) -> Layout:
        if self.coordinator is None:
            return Layout()

        def subnetwork_scope(index: int):
            group = self.placement.ps_group(num_ps=self.cluster.num_ps,
                                            num_subnetworks=num_subnetworks, subnetwork=index)
            return self._on_ps_group(group) if group else contextlib.nullcontext()

        return Layout(units=self.assignment(num_subnetworks).distinct,
                      subnetwork_scope=subnetwork_scope, shared_bookkeeping=True)

    @contextlib.contextmanager
    def _on_ps_group(self, group: tuple[int, ...]):
        """Creates variables on the servers of `group`, each by a stable hash of its name."""
        anchors = self._ps_anchors()
        created = collections.Counter()

        def creator(next_creator, **kwargs):
            name = str(kwargs.get("name") or "variable")
            created[name] += 1
            kwargs["colocate_with"] = anchors[
                ps_for_variable(group, f"{name}/{created[name]}")]
            return next_creator(**kwargs)

        with tf.variable_creator_scope(creator):
            yield

    def _ps_anchors(self) -> dict[int, tf.Variable]:
        """One tiny variable on each parameter server, to colocate others with."""
        if not self._anchors:
            with self.strategy.scope():
                for _ in range(self.cluster.num_ps):
                    anchor = tf.Variable(0, dtype=tf.int8, trainable=False, name="ps_anchor")
                    self._anchors[tf.DeviceSpec.from_string(anchor.device).task] = anchor
        return self._anchors


def make_runtime(cluster: Cluster, placement: PlacementStrategy, *,
                 timeout_secs: float) -> Runtime:
    """The strategy for this (training) replica. A chief with parameter servers waits, up to
    `timeout_secs`, for every server of the cluster to listen."""
    if cluster.has_ps:
        try:
            cluster_lib.wait_for_servers(cluster, timeout_secs=timeout_secs)
        except TimeoutError as e:
            raise TrainingError(str(e)) from None
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver())
        _recognize_lost_worker_errors()
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        logging.info("Connected to %d workers and %d parameter servers; placement: %s.",
                     cluster.num_workers, cluster.num_ps, placement.name)
        return Runtime(cluster, strategy, placement, coordinator)
    if cluster.is_distributed:
        if placement.name != "replication":
            raise TrainingError(  # checked earlier as bad input; kept as an invariant
                "round_robin placement needs parameter servers.")
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster.resolver())
        logging.info("MultiWorkerMirroredStrategy over %d replicas.",
                     strategy.num_replicas_in_sync)
        return Runtime(cluster, strategy, placement)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
        logging.info("MirroredStrategy over %d GPUs.", len(gpus))
    else:
        strategy = tf.distribute.get_strategy()
    return Runtime(cluster, strategy, placement)


# -- workers and parameter servers under a coordinator -------------------------------------------
def serve(cluster: Cluster, *, grace_secs: float, poll_secs: float = 2.0) -> int:
    """Runs this worker's or ps's TensorFlow server until the chief is done; returns 0.

    The chief's own server goes away when it exits. A chief that restarts (Vertex restarts a
    failed replica under the same name) comes back within `grace_secs`, and this server keeps
    serving it; after that long without a chief, the job is over. SIGTERM (sent by Vertex or
    the local launcher when the chief has succeeded) ends it at once, also with 0.
    """
    server = tf.distribute.Server(cluster.cluster_spec(), job_name=cluster.task_type,
                                  task_index=cluster.task_index, protocol=cluster.rpc_layer,
                                  start=True)
    logging.info("%s %d serving at %s.", cluster.task_type, cluster.task_index, server.target)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    chief = cluster.address(cluster_lib.CHIEF, 0)
    seen_chief, gone_since = False, None
    while not stop.wait(poll_secs):
        if cluster_lib.is_listening(chief):
            seen_chief, gone_since = True, None
        elif seen_chief:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > grace_secs:
                logging.info("The chief (%s) has been gone for %.0f s: done.", chief,
                             grace_secs)
                break
    logging.info("%s %d stops.", cluster.task_type, cluster.task_index)
    sys.stdout.flush()
    return 0


# -- the coordinated train loop ---------------------------------------------------------------
_IDLE_PAUSE_SECS = 0.05


class CoordinatedLoop:
    """Trains one iteration on the workers: each scheduled chunk runs `steps_per_loop` steps of
    the unit of whichever worker takes it (`Assignment`), clipped to what that unit's jobs
    still need. A worker whose jobs are done idles; when some unit has made no progress for
    `stall_secs` (its workers lost), idle workers take over its remaining steps, so no job is
    ever left untrained and the chief never waits forever. A worker that fails has its chunk
    rescheduled by the coordinator, and rejoins when it is restarted.
    """

    def __init__(self, *, runtime: Runtime, iteration: Iteration, iterator, budget: int,
                 steps_per_loop: int, stall_secs: float):
        self.runtime = runtime
        self.iteration = iteration
        self.iterator = iterator
        self.budget = budget
        self.steps_per_loop = steps_per_loop
        self.stall_secs = stall_secs
        self.assignment = runtime.assignment(len(iteration.subnetworks))
        self.units = self.assignment.distinct
        with runtime.strategy.scope():
            self.steal = tf.Variable(False, trainable=False, name="steal")
        # steps[worker][unit index] actually run (a unit taken over counts for its taker).
        self.steps = collections.defaultdict(collections.Counter)
        self._chunk = None
        self._progress = (None, time.monotonic())
        self._stealing = False  # what `steal` holds, without a read from the ps

    def _build_chunk(self) -> Callable:
        iteration, units, budget = self.iteration, self.units, self.budget
        unit_of_worker = tf.constant(
            [self.assignment.unit_index(w) for w in range(len(self.assignment.units))],
            tf.int64)
        runs = [iteration.steps_fn(u) for u in units]
        jobs = [iteration.unit_jobs(u) for u in units]
        idle = len(units)

        def remaining():
            left = []
            for trained, candidates in jobs:
                parts = []
                if candidates:
                    parts.append(budget - iteration.step)
                if trained:
                    parts.append(budget - tf.reduce_min(
                        tf.gather(iteration.subnetwork_steps, trained)))
                left.append(tf.maximum(tf.reduce_max(tf.stack(parts)), 0) if parts
                            else tf.constant(0, tf.int64))
            return tf.stack(left + [tf.constant(0, tf.int64)])

        def chunk(iterator, steps):
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            left = remaining()
            own = tf.gather(unit_of_worker, worker)
            neediest = tf.argmax(left, output_type=tf.int64)
            target = tf.where(left[own] > 0, own,
                              tf.where(self.steal & (left[neediest] > 0), neediest, idle))
            count = tf.minimum(steps, tf.gather(left, target))
            done = tf.switch_case(
                tf.cast(target, tf.int32),
                [lambda run=run: run(iterator, count) for run in runs]
                + [lambda: tf.constant(0, tf.int64)])
            return worker, target, done

        return tf.function(chunk, autograph=False)

    def counters(self) -> tuple[int, tuple[int, ...]]:
        """The ensemble's and each subnetwork's steps so far (read from the parameter
        servers once per chunk)."""
        return (int(self.iteration.step.numpy()),
                tuple(int(n) for n in self.iteration.subnetwork_steps.numpy()))

    def remaining(self, counters: tuple[int, tuple[int, ...]]) -> int:
        """The most steps any active job still needs."""
        step, subnetwork_steps = counters
        needs = []
        for unit in self.units:
            trained, candidates = self.iteration.unit_jobs(unit)
            if candidates:
                needs.append(self.budget - step)
            needs += [self.budget - subnetwork_steps[i] for i in trained]
        return max([0] + needs)

    def run(self, *, on_progress: Callable[[], None], on_diverged: Callable[[list], None]):
        """Schedules chunks until every job has its budget; calls `on_progress` between them."""
        coordinator = self.runtime.coordinator
        workers = len(self.assignment.units)
        inflight = collections.deque()
        left = self.remaining(self.counters())
        while left > 0 or inflight:
            if self._chunk is None:
                self._chunk = self._build_chunk()
            try:
                while left > 0 and len(inflight) < 2 * workers:
                    steps = min(self.steps_per_loop, max(1, math.ceil(left / workers)))
                    inflight.append(coordinator.schedule(
                        self._chunk, args=(self.iterator, tf.constant(steps, tf.int64))))
                worker, target, done = _fetch(inflight.popleft())
            except tf.errors.OpError as e:
                if not lost_workers_only(e):
                    raise
                # The coordinator retries a lost worker's chunks; an error it passes on
                # anyway (and the chunks it cancels with it) loses only that chunk's steps,
                # which the counters on the ps say are still to do.
                if not isinstance(e, tf.errors.CancelledError):
                    logging.log_every_n_seconds(
                        logging.WARNING, "A chunk failed with a lost worker; its steps are "
                        "scheduled again (%s: %s).", 10, type(e).__name__,
                        str(e).splitlines()[0][:200])
                continue
            if target < len(self.units):
                self.steps[int(worker)][int(target)] += int(done)
            else:
                time.sleep(_IDLE_PAUSE_SECS)
            diverged = self.iteration.stop_diverged()
            if diverged:
                on_diverged(diverged)
                self._chunk = None
            counters = self.counters()
            left = self.remaining(counters) if not self.iteration.is_exhausted else 0
            self._watch_stall(left, counters)
            on_progress()

    def _watch_stall(self, left: int, counters: tuple[int, tuple[int, ...]]) -> None:
        last, since = self._progress
        if counters != last:
            self._progress = (counters, time.monotonic())
        elif left > 0 and time.monotonic() - since > self.stall_secs and not self._stealing:
            logging.warning("No progress for %.0f s (a worker lost?): idle workers take over "
                            "the remaining steps.", self.stall_secs)
            self.steal.assign(True)
            self._stealing = True

    def record(self, worker_names: Callable[[int], str]) -> list[dict]:
        """Per unit: its assigned workers, and the steps each worker ran of it."""
        k = len(self.iteration.subnetworks)
        return [{"unit": unit.describe(k),
                 "trains": _jobs(self.iteration, unit),
                 "assigned_to": [worker_names(w) for w in self.assignment.workers_of(unit)],
                 "steps_by_worker": {worker_names(w): counts[u]
                                     for w, counts in sorted(self.steps.items())
                                     if counts[u]},
                 "subnetwork_variables_on_ps": {
                     self.iteration.subnetworks[i].name: _ps_tasks(
                         self.iteration.subnetworks[i].trainable_variables)
                     for i in unit.subnetworks}}
                for u, unit in enumerate(self.units)]


def _ps_tasks(variables) -> list[int]:
    """The parameter servers that hold `variables` (Keras variables wrap a tf.Variable)."""
    devices = [tf.DeviceSpec.from_string(getattr(v, "value", v).device) for v in variables]
    return sorted({d.task for d in devices if d.job == "ps"})


def _jobs(iteration: Iteration, unit) -> list[str]:
    return (["ensemble"] if unit.ensemble else []) + [
        iteration.subnetworks[i].name for i in unit.subnetworks]


def _fetch(remote_value) -> list[int]:
    return [int(v) for v in remote_value.fetch()]


LOST_REPLICA_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                       tf.errors.CancelledError)


def _lost_tasks(error: Exception) -> list[tuple[str, str]]:
    return sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(error))))


# What a chunk's error says when its worker is gone but the error does not name it: its
# inputs (the worker's iterator) no longer resolve.
_LOST_WORKER_TEXTS = ("primary device is not remote", "unknown device",
                      "unable to find the relevant tensor remote_handle")


def lost_workers_only(error: Exception) -> bool:
    """Whether the chief trains on through a chunk's error: a worker is lost and no parameter
    server is. The coordinator retries most such chunks itself but passes some on in a race
    (an error without the worker's name), and cancels queued chunks along with them."""
    jobs = {job for job, _ in _lost_tasks(error)}
    if "ps" in jobs:
        return False
    if isinstance(error, tf.errors.CancelledError):
        return True
    if isinstance(error, tf.errors.InvalidArgumentError):
        return any(text in str(error).lower() for text in _LOST_WORKER_TEXTS)
    return isinstance(error, LOST_REPLICA_ERRORS) and "worker" in jobs


def _recognize_lost_worker_errors() -> None:
    """Makes ClusterCoordinator take a chunk that failed with one of `_LOST_WORKER_TEXTS` (and
    names no ps) for its worker's failure, as it does when the text names the worker.

    Without it (TF 2.17's `_is_worker_failure` wants "/job:worker" in the text), a worker
    SIGKILLed between two chunks fails the next ones with "Primary device is not remote", and
    the coordinator passes each on as an error instead of waiting for the worker to come back:
    a cascade that cancels every queued chunk and can leave it waiting on them forever. This
    patches a private function; where it is missing, the coordinator keeps its own rule."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    own = getattr(cluster_coordinator, "_is_worker_failure", None)
    if own is None or getattr(own, "recognizes_lost_worker_texts", False):
        return

    def is_worker_failure(error) -> bool:
        return own(error) or (isinstance(error, tf.errors.InvalidArgumentError)
                              and lost_workers_only(error))

    is_worker_failure.recognizes_lost_worker_texts = True
    cluster_coordinator._is_worker_failure = is_worker_failure  # pylint: disable=protected-access


def lost_replica(error: Exception) -> TrainingError:
    """The clear error for a cluster member gone in mid-training (workers are replaced by the
    coordinator; a lost parameter server takes the variables with it)."""
    tasks = [t for t in _lost_tasks(error) if t[0] != "chief"]  # the chief is the one asking
    # A lost ps fails the workers' steps too: name the cause.
    tasks = [t for t in tasks if t[0] == "ps"] or tasks
    who = ", ".join(f"{job} {index}" for job, index in tasks) or "a replica"
    return TrainingError(
        f"Training stopped: {who} became unreachable ({type(error).__name__}: "
        f"{str(error).splitlines()[0][:200]}). A parameter server holds the model's variables: "
        "restart the lost replica and then the chief, and training resumes from the last "
        "checkpoint.")
