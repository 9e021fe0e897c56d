"""The outer loop: data once, then iterations, checkpoints, selection, export and the report.

`run(config)` is the whole job. Everything that can be wrong with the user's input is checked
before the job dir is touched; after that, every step is resumable: finished iterations are
recorded (see `job_dir.py`), the running one is checkpointed periodically.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from typing import Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from trainer import data as data_lib
from trainer import ensemble as ens
from trainer import export as export_lib
from trainer import job_dir as job_dir_lib
from trainer import report as report_lib
from trainer import distributed
from trainer.cluster import Cluster
from trainer import storage
from trainer.config import RunConfig
from trainer.errors import InputError
from trainer.features import Preprocessor
from trainer.heads import Head
from trainer.iteration import FrozenEnsemble, FrozenMember, Iteration
from trainer.model import Builder, IterationContext, Subnetwork, find_builder
from trainer.model.subnetwork import propose
from trainer.placement import Placement, ReplicationStrategy
from trainer.schema import Schema

_PROGRESS_EVERY_SECS = 5.0
_ENCODE_CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Validated input, ready to train on: the schema and the train and eval examples."""

    schema: Schema
    train: data_lib.Examples
    eval: data_lib.Examples
    eval_source: str


def load_inputs(config: RunConfig, job: job_dir_lib.JobDir) -> Inputs:
    """Reads and checks all input; raises InputError before anything is written."""
    data = config.data
    train_table = data_lib.read(data.train_data, flag="--train_data")
    if job.exists():
        schema = Schema.from_json(job_dir_lib.read_text(job.schema))
    else:
        schema = data_lib.schema_from(train_table, data.columns, source=data.train_data)
    train = data_lib.examples_from(train_table, schema, flag="--train_data")
    if data.eval_data:
        eval_examples = data_lib.examples_from(
            data_lib.read(data.eval_data, flag="--eval_data"), schema, flag="--eval_data")
        source = data.eval_data
    else:
        train, eval_examples = data_lib.split_holdout(train, data.holdout_fraction, config.seed)
        source = f"{data.holdout_fraction:.0%} of --train_data held out"
    return Inputs(schema, train, eval_examples, source)


def check_resumable(config: RunConfig, job: job_dir_lib.JobDir) -> None:
    """Fails when the job dir was written by a run with a different search."""
    if not job.exists():
        return
    recorded = job_dir_lib.read_json(job.run)["fingerprint"]
    current = config.fingerprint()
    changed = {k: (recorded.get(k), v) for k, v in current.items() if recorded.get(k) != v}
    if changed:
        lines = "; ".join(f"{k}: was {old!r}, now {new!r}" for k, (old, new) in changed.items())
        raise InputError(f"--job_dir {job.root} holds a run with other settings ({lines}). "
                         "Re-run with the same flags to resume it, or pick a new --job_dir.")


def encode(preprocessor: Preprocessor, examples: data_lib.Examples) -> np.ndarray:
    """Encodes raw columns to the dense float32 matrix the subnetworks take."""
    parts = []
    for start in range(0, len(examples), _ENCODE_CHUNK):
        chunk = {k: tf.constant(v[start:start + _ENCODE_CHUNK])
                 for k, v in examples.features.items()}
        parts.append(preprocessor(chunk).numpy())
    return np.concatenate(parts, axis=0)


def train_dataset(features: np.ndarray, labels: np.ndarray, *, batch_size: int,
                  seed: int) -> tf.data.Dataset:
    """Endless shuffled batches from memory: shuffles row indices, gathers whole batches."""
    x, y = tf.constant(features), tf.constant(labels)
    n = len(features)
    return (tf.data.Dataset.range(n)
            .shuffle(n, seed=seed, reshuffle_each_iteration=True)
            .repeat()
            .batch(batch_size, drop_remainder=True)
            .map(lambda i: (tf.gather(x, i), tf.gather(y, i)),
                 num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


@dataclasses.dataclass(frozen=True)
class TrainingTime:
    """How an iteration's training went, in seconds."""

    seconds: float  # the whole training phase
    first_step_seconds: float  # building and compiling the train loop, and the first step
    steps_per_sec: float | None  # after the first step (None if there was no other)
    # From the end of the previous iteration's training to this one's first step (select,
    # freeze, build and compile); None for the first iteration this process trains.
    pause_before: float | None = None


def _rate(steps: int, seconds: float) -> float | None:
    return steps / seconds if steps > 0 and seconds > 0 else None


class _Progress:
    """An iteration's training bookkeeping, the same for every train loop: the time to the
    first step (building and compiling), a progress line and training summaries every
    `_PROGRESS_EVERY_SECS`, a checkpoint every `checkpoint_every_secs`, and at the end a last
    line, summaries and checkpoint, and the `TrainingTime` (its pause counted from
    `previous_end`, when the previous iteration's training ended)."""

    def __init__(self, *, iteration: Iteration, manager: tf.train.CheckpointManager,
                 writers: report_lib.SummaryWriters, total: int, batch_size: int,
                 checkpoint_every_secs: float, options: tf.train.CheckpointOptions | None,
                 previous_end: float | None):
        self.iteration, self.manager, self.writers = iteration, manager, writers
        self.total, self.batch_size = total, batch_size
        self.checkpoint_every_secs, self.options = checkpoint_every_secs, options
        self.previous_end = previous_end
        self.started = self.last_line = self.last_checkpoint = time.monotonic()
        self.first: float | None = None  # when the first step was done
        self.first_step = int(iteration.step.numpy())  # the step count then

    def update(self, step: int) -> None:
        """After a chunk of steps: `step` is the iteration's step count now."""
        now = time.monotonic()
        if self.first is None:
            self.first, self.first_step = now, step
        if now - self.last_line >= _PROGRESS_EVERY_SECS:
            self._line(step, now)
        if now - self.last_checkpoint >= self.checkpoint_every_secs:
            self.manager.save(checkpoint_number=step, options=self.options)
            self.last_checkpoint = now

    def finish(self, step: int) -> TrainingTime:
        ended = time.monotonic()
        self._line(step, ended)
        self.manager.save(checkpoint_number=step, options=self.options)
        first = self.first or ended
        pause = (None if self.first is None or self.previous_end is None
                 else self.first - self.previous_end)
        return TrainingTime(seconds=time.monotonic() - self.started,
                            first_step_seconds=first - self.started,
                            steps_per_sec=_rate(step - self.first_step, ended - first),
                            pause_before=pause)

    def _line(self, step: int, now: float) -> None:
        first = self.first or now
        logging.info(report_lib.progress_line(
            self.iteration, step, self.total, _rate(step - self.first_step, now - first),
            self.batch_size))
        self.writers.write_training(self.iteration, step)
        self.last_line = now


class Trainer:
    """Runs the iterations of one job and owns its checkpoints, summaries and report."""

    def __init__(self, config: RunConfig, inputs: Inputs, job: job_dir_lib.JobDir, *,
                 runtime: distributed.Runtime | None = None):
        self.config = config
        self.inputs = inputs
        self.job = job
        self.runtime = runtime or distributed.Runtime(
            Cluster(), tf.distribute.get_strategy(), ReplicationStrategy())
        self.strategy = self.runtime.strategy
        # Replicas other than the chief (synchronous training) save their share of each
        # checkpoint to a scratch dir: every replica must take part, only the chief publishes.
        self.scratch = None if self.runtime.is_chief else tempfile.mkdtemp(prefix="replica-")
        self.head = Head(inputs.schema.label)
        self.preprocessor = Preprocessor(inputs.schema)
        self.x_train = encode(self.preprocessor, inputs.train)
        self.x_eval = encode(self.preprocessor, inputs.eval)
        self.input_dim = self.x_train.shape[1]
        self._previous_training_end: float | None = None  # the pause before the next starts
        self._worker_iterator = None  # under a coordinator: built on first use

    # -- the job --------------------------------------------------------------------------
    def run(self) -> dict:
        records = self.job.records()
        previous = self.restore(records) if records else None
        if records:
            logging.info("Resuming %s: iterations 0..%d are finished.", self.job.root,
                         len(records) - 1)
        for t in range(len(records), self.config.search.max_iterations):
            record, previous = self.run_iteration(t, previous)
            records.append(record)
            if self.runtime.is_chief:
                self.write_report(records, final=None)
        if not self.runtime.is_chief:
            shutil.rmtree(self.scratch, ignore_errors=True)
            return {}
        if not self.job.has_model():
            # A copy on this machine, under no strategy: the SavedModel holds plain variables
            # wherever training kept them (parameter servers, mirrored replicas).
            local = self.restore(records, strategy=tf.distribute.get_strategy())
            export_lib.export(export_lib.ServingModel(self.preprocessor, local, self.head),
                              self.job)
            logging.info("Exported the chosen ensemble to %s", self.job.model)
        final = self.evaluate_export()
        report = self.write_report(records, final=final)
        if self.config.hypertune_metric is not None:
            self.report_to_hypertune(final["metrics"], sum(r["steps"] for r in records))
        return report

    def report_to_hypertune(self, metrics: dict, steps: int) -> None:
        """Reports the exported model's eval metric to Vertex AI hyperparameter tuning."""
        import hypertune  # cloudml-hypertune: writes CLOUD_ML_HP_METRIC_FILE

        name = self.config.hypertune_metric or self.head.objective_metric
        hypertune.HyperTune().report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=name, metric_value=metrics[name], global_step=steps)
        logging.info("Reported %s=%s to hyperparameter tuning.", name, metrics[name])

    def run_iteration(self, t: int, previous: FrozenEnsemble | None
                      ) -> tuple[dict, FrozenEnsemble]:
        search = self.config.search
        started = time.monotonic()
        iteration = self.build_iteration(t, previous)
        builders = iteration.builders
        checkpoint = iteration.checkpoint()
        latest = tf.train.latest_checkpoint(self.job.iteration_checkpoints(t))
        manager = tf.train.CheckpointManager(
            checkpoint, self.job.iteration_checkpoints(t) if self.scratch is None
            else job_dir_lib.join(self.scratch, f"iteration-{t}"),
            max_to_keep=2)  # the latest two: an evaluator may be reading the older one
        if latest:
            checkpoint.restore(latest, options=self.runtime.checkpoint_options
                               ).assert_existing_objects_matched()
            logging.info("Iteration %d: resumed from %s at step %d.", t, latest,
                         int(iteration.step.numpy()))
            for name in iteration.stop_diverged():
                logging.warning("Iteration %d: %s diverged before the restart; it stays "
                                "stopped and will not be selected.", t, name)
        logging.info("Iteration %d: training %d subnetworks %s and %d candidate ensembles for "
                     "%d steps.", t, len(builders), [b.name for b in builders],
                     len(iteration.candidates), search.max_iteration_steps)
        writers = report_lib.SummaryWriters(self.job.logs if self.runtime.is_chief
                                            else None, iteration)
        if self.runtime.coordinator is not None:
            timing, placement = self.train_coordinated(iteration, manager, writers)
        else:
            timing = self.train_iteration(iteration, manager, writers)
            placement = self.replicated_record(iteration)
        pause_started = self._previous_training_end = time.monotonic()
        record = self.select(iteration, timing)
        record["placement"] = placement
        writers.write_eval(record)
        writers.close()
        chosen = next(i for i, c in enumerate(iteration.candidates)
                      if c.name == record["chosen"])
        frozen = iteration.freeze(chosen)
        frozen.checkpoint().write(
            self.job.frozen_prefix(t) if self.scratch is None
            else job_dir_lib.join(self.scratch, f"frozen-{t}", "ensemble"),
            options=self.runtime.checkpoint_options)
        record["architecture"] = report_lib.architecture(frozen)
        record["seconds"] = {"total": time.monotonic() - started, "training": timing.seconds,
                             "first_step": timing.first_step_seconds,
                             "selection_and_freeze": time.monotonic() - pause_started,
                             "pause_before": timing.pause_before}
        if self.runtime.is_chief:
            job_dir_lib.write_json(self.job.record_path(t), record)  # the iteration is finished
            self.job.drop_iteration_checkpoints(t)
        logging.info("Iteration %d: chose %s (objective %.5f).", t, record["chosen"],
                     report_lib.chosen_candidate(record)["objective"])
        return record, frozen

    def build_iteration(self, t: int, previous: FrozenEnsemble | None) -> Iteration:
        """Iteration `t`'s candidates: the generator's proposals grown from `previous`."""
        search = self.config.search
        context = IterationContext(t, tuple(m.builder for m in previous.members)
                                   if previous else ())
        builders = propose(search.generator, context)
        specs = ens.candidate_specs(search.strategies, [b.name for b in builders],
                                    has_previous=previous is not None)
        return Iteration(number=t, head=self.head, input_dim=self.input_dim,
                         seed=self.config.seed, builders=builders, specs=specs,
                         ensemblers=search.ensemblers, previous=previous,
                         options=self.config.train, strategy=self.strategy,
                         layout=self.runtime.layout(len(builders)))

    def train_iteration(self, iteration: Iteration, manager: tf.train.CheckpointManager,
                        writers: report_lib.SummaryWriters) -> TrainingTime:
        """Trains until `max_iteration_steps`."""
        total = self.config.search.max_iteration_steps
        step = int(iteration.step.numpy())
        # A new order per iteration, and per resume point: a resumed run does not replay the
        # batches it already trained on.
        seed = (self.config.seed * 1_000_003 + iteration.number * 10_007 + step) % 2 ** 31
        iterator = iter(self.strategy.experimental_distribute_dataset(
            train_dataset(self.x_train, self.inputs.train.labels,
                          batch_size=self.config.train.batch_size, seed=seed)))
        progress = self._progress(iteration, manager, writers)
        while step < total and not iteration.is_exhausted:
            # The first call runs one step: it builds the graph, and the pause between
            # iterations (select, freeze, build and compile the next) ends with it.
            steps = 1 if progress.first is None else min(self.config.steps_per_loop,
                                                         total - step)
            for name in iteration.train(iterator, steps):
                logging.warning("Iteration %d: %s diverged (non-finite loss) by step %d; it "
                                "stops training and will not be selected.", iteration.number,
                                name, step + steps)
            step += steps
            progress.update(step)
        if iteration.is_exhausted and step < total:
            logging.warning("Iteration %d: every new candidate diverged at step %d.",
                            iteration.number, step)
        return progress.finish(step)

    def train_coordinated(self, iteration: Iteration, manager: tf.train.CheckpointManager,
                          writers: report_lib.SummaryWriters) -> tuple[TrainingTime, list]:
        """Trains on the cluster's workers through the coordinator (see CoordinatedLoop)."""
        loop = distributed.CoordinatedLoop(
            runtime=self.runtime, iteration=iteration, iterator=self._per_worker_iterator(),
            budget=self.config.search.max_iteration_steps,
            steps_per_loop=self.config.steps_per_loop,
            stall_secs=self.config.distribution.stall_secs)
        progress = self._progress(iteration, manager, writers)

        def on_diverged(names):
            for name in names:
                logging.warning("Iteration %d: %s diverged (non-finite loss); it stops "
                                "training and will not be selected.", iteration.number, name)

        loop.run(on_progress=lambda: progress.update(int(iteration.step.numpy())),
                 on_diverged=on_diverged)
        timing = progress.finish(int(iteration.step.numpy()))
        return timing, loop.record(self.runtime.worker_name)

    def _progress(self, iteration: Iteration, manager: tf.train.CheckpointManager,
                  writers: report_lib.SummaryWriters) -> _Progress:
        return _Progress(iteration=iteration, manager=manager, writers=writers,
                         total=self.config.search.max_iteration_steps,
                         batch_size=self.config.train.batch_size,
                         checkpoint_every_secs=self.config.checkpoint_every_secs,
                         options=self.runtime.checkpoint_options,
                         previous_end=self._previous_training_end)

    def _per_worker_iterator(self):
        """Each worker's endless shuffled batches (built once; the coordinator rebuilds a
        restarted worker's). Workers shuffle with different seeds."""
        if self._worker_iterator is None:
            x, y = self.x_train, self.inputs.train.labels
            batch_size, seed = self.config.train.batch_size, self.config.seed

            def dataset_fn():
                worker = tf.distribute.coordinator.experimental_get_current_worker_index()
                return train_dataset(x, y, batch_size=batch_size, seed=seed * 7919 + worker)

            self._worker_iterator = iter(
                self.runtime.coordinator.create_per_worker_dataset(dataset_fn))
        return self._worker_iterator

    def replicated_record(self, iteration: Iteration) -> list[dict]:
        """Every replica trained everything for every step (one machine, or synchronously)."""
        steps = int(iteration.step.numpy())
        names = [self.runtime.worker_name(w) for w in range(self.runtime.num_workers)]
        return [{"unit": "everything",
                 "trains": ["ensemble"] + [s.name for s in iteration.subnetworks],
                 "assigned_to": names, "steps_by_worker": {n: steps for n in names}}]

    # -- selection ------------------------------------------------------------------------
    def select(self, iteration: Iteration, timing: TrainingTime) -> dict:
        """Scores every candidate, chooses the best, and returns the iteration's record."""
        search = self.config.search
        eval_logits, eval_sub_logits = iteration.predict_logits(self.x_eval)
        labels = self.inputs.eval.labels
        if search.selection is ens.Selection.MOVING_AVERAGE:
            objectives = iteration.moving_average_objectives()
        else:
            if search.selection is ens.Selection.TRAIN:
                logits, _ = iteration.predict_logits(self.x_train)
                data_labels = self.inputs.train.labels
            else:
                logits, data_labels = eval_logits, labels
            objectives = np.array([
                self.head.losses(data_labels, logits[c]).mean()
                + float(cand.weights.penalty().numpy())
                for c, cand in enumerate(iteration.candidates)])
        scores = iteration.scores(objectives)
        chosen = ens.choose(scores, force_grow=search.force_grow)
        return report_lib.iteration_record(
            iteration, scores, chosen, selection=search.selection,
            candidate_metrics=[self.head.metrics(labels, lg) for lg in eval_logits],
            subnetwork_metrics=[self.head.metrics(labels, lg) for lg in eval_sub_logits],
            steps=int(iteration.step.numpy()), steps_per_sec=timing.steps_per_sec,
            batch_size=self.config.train.batch_size)

    # -- resume ---------------------------------------------------------------------------
    def restore(self, records: Sequence[dict], *,
                strategy: tf.distribute.Strategy | None = None) -> FrozenEnsemble:
        """Rebuilds the last chosen ensemble: replays the generator for each member's builder
        (it is a pure function of the iteration context), then restores frozen weights.
        Under `strategy` (default: the one training runs under)."""
        search = self.config.search
        strategy = strategy or self.strategy
        chain: dict[str, Builder] = {}
        previous: tuple[Builder, ...] = ()
        for record in records:
            context = IterationContext(record["iteration"], previous)
            members = []
            for m in record["architecture"]["members"]:
                if m["key"] not in chain:
                    chain[m["key"]] = find_builder(search.generator, context, m["builder"])
                members.append(chain[m["key"]])
            previous = tuple(members)
        last = records[-1]
        by_name = {e.name: e for e in search.ensemblers}
        ensembler = by_name[last["architecture"]["ensembler"]]
        frozen_members = []
        with strategy.scope():
            for m, builder in zip(last["architecture"]["members"], previous):
                subnetwork = Subnetwork(builder, input_dim=self.input_dim,
                                        logits_dimension=self.head.logits_dimension,
                                        seed=self.config.seed, name=m["key"])
                frozen_members.append(FrozenMember(m["iteration"], builder, subnetwork))
            weights = ensembler.build(members=[f.as_member() for f in frozen_members],
                                      logits_dimension=self.head.logits_dimension)
        frozen = FrozenEnsemble(tuple(frozen_members), weights, ensembler)
        options = self.runtime.checkpoint_options if strategy is self.strategy else None
        frozen.checkpoint().read(self.job.frozen_prefix(last["iteration"]),
                                 options=options).assert_existing_objects_matched()
        return frozen

    # -- the exported model ---------------------------------------------------------------
    def evaluate_export(self) -> dict:
        """Metrics of the exported model itself (loaded back) on the eval data."""
        serve = export_lib.load_serving_fn(self.job.model)
        features = self.inputs.eval.features
        logits = []
        for start in range(0, len(self.inputs.eval), 8192):
            batch = {k: tf.constant(v[start:start + 8192]) for k, v in features.items()}
            logits.append(serve(**batch)["logits"].numpy())
        metrics = self.head.metrics(self.inputs.eval.labels, np.concatenate(logits))
        return {"eval_data": self.inputs.eval_source, "examples": len(self.inputs.eval),
                "metrics": metrics}

    def write_report(self, records: Sequence[dict], *, final: dict | None) -> dict:
        report = report_lib.build_report(self.config, self.inputs.schema, records, final,
                                         self.job)
        job_dir_lib.write_json(self.job.report, report)
        return report


def run(config: RunConfig, cluster: Cluster = Cluster()) -> dict:
    """Trains (or resumes) the job described by `config` as this replica of `cluster`;
    returns the report (the chief's; {} on other replicas)."""
    job = job_dir_lib.JobDir.of(config.outputs)
    storage.preflight(outputs=job.output_flags(), inputs=config.data.input_flags())
    placement = config.distribution.placement
    if cluster.is_distributed and not cluster.has_ps and placement is not Placement.REPLICATION:
        raise InputError(f"--placement={placement.value} needs parameter servers (a ps pool: "
                         "workerPoolSpecs[2]); a cluster of workers alone trains "
                         "synchronously, every worker on everything. Use "
                         "--placement=replication or add parameter servers.")
    check_resumable(config, job)
    inputs = load_inputs(config, job)
    metrics = Head(inputs.schema.label).metric_names
    if config.hypertune_metric and config.hypertune_metric not in metrics:
        raise InputError(f"--hypertune_metric={config.hypertune_metric} is not an eval metric "
                         f"of a {inputs.schema.label.head.value} head; choose from "
                         f"{', '.join(metrics)}.")
    runtime = distributed.make_runtime(
        cluster, placement.strategy(),
        timeout_secs=config.distribution.cluster_timeout_secs)
    # From here on the job dir is written (by the chief alone).
    if runtime.is_chief:
        job.create()
        if not job.exists():
            job_dir_lib.write_atomically(job.schema, inputs.schema.to_json())
            job_dir_lib.write_json(job.run, {"fingerprint": config.fingerprint()})
    trainer = Trainer(config, inputs, job, runtime=runtime)
    try:
        return trainer.run()
    except distributed.LOST_REPLICA_ERRORS as e:
        if not cluster.is_distributed:
            raise
        raise distributed.lost_replica(e) from None


