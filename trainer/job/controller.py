"""The controller: runs a job's iterations and owns resume, checkpoint cadence and summaries
(the shape of Orbit's `Controller` over a train loop).

For each iteration it asks the search for a proposal, has the factory build it, restores its
last checkpoint, trains it through a `TrainLoop` a chunk at a time (checkpoints, progress lines
and summaries between chunks), scores the candidates (one streaming eval pass), lets the search
choose, freezes the choice and publishes the iteration's record. A restarted job rebuilds the
last frozen ensemble from the records and goes on; finished iterations are never redone.

A SIGTERM while an iteration trains (`trainer/distribute/preemption.py`) is answered between
two loop calls: a checkpoint at the step reached, then `Preempted`; the restart resumes at that
step.
"""

from __future__ import annotations

import dataclasses
import gc
import signal
import time
from collections.abc import Iterator

import tensorflow as tf
from absl import logging

from trainer import ensemble as ens
from trainer.config import RunConfig
from trainer.distribute import preemption
from trainer.distribute.loops import LoopMaker, TrainLoop
from trainer.distribute.preemption import NOTICE_SECS, Notice, Preempted
from trainer.ensemble.objective import selection_objective
from trainer.errors import first_line
from trainer.evaluation import streaming as evaluation
from trainer.input.job_input import JobInput
from trainer.reporting.progress import Progress, SummaryWriters, TrainingTime
from trainer.search import record as record_lib
from trainer.search.budget import TimeBudget
from trainer.search.factory import Models
from trainer.search.frozen import FrozenEnsemble
from trainer.search.iteration import Iteration
from trainer.search.record import (
    PREVIOUS_ENSEMBLER,
    Architecture,
    CandidateRecord,
    IterationRecord,
    MemberRecord,
    Seconds,
    SubnetworkRecord,
    UnitRecord,
    finite,
    finite_metrics,
)
from trainer.search.rules import Proposal, Search
from trainer.storage.job_dir import CHECKPOINT_ERRORS, PERIODIC, ReplicaWrites, is_damage

# What the objective a search chooses by is measured on, for the "chose" line.
_OBJECTIVE_OF = {
    ens.Selection.MOVING_AVERAGE: "moving-average train",
    ens.Selection.TRAIN: "train",
    ens.Selection.HOLDOUT: "held-out",
}


class Controller:
    """Runs the iterations of one job as this replica (see the module doc)."""

    def __init__(
        self,
        *,
        config: RunConfig,
        models: Models,
        data: JobInput,
        writes: ReplicaWrites,
        loops: LoopMaker,
        started: float | None = None,
        budget: TimeBudget | None = None,
        notice: Notice | None = None,
    ):
        """
        Args:
            config: the run's flags.
            models: builds iterations and frozen ensembles (under this replica's strategy).
            data: the job's input, for the eval passes of selection.
            writes: where this replica's checkpoints, records and summaries go.
            loops: makes each iteration's train loop.
            started: when the job began (time.monotonic()), for `first_step_seconds`.
            budget: the job's time budget, if any: it may skip iterations and cut one short.
            notice: SIGTERM (preemption): training stops at the next safe point with a
                checkpoint (default: the one `preemption.watch` installed, if any).
        """
        self.config = config
        self.models = models
        self.search: Search = models.search
        self.data = data
        self.writes = writes
        self.loops = loops
        self.started = time.monotonic() if started is None else started
        self.first_step_seconds: float | None = None  # after `started`, in this process
        self.records: list[IterationRecord] = []  # the finished iterations (`iterations`)
        self.chosen: FrozenEnsemble | None = None  # the last finished iteration's choice
        self._previous_end: float | None = None  # the previous iteration's training end
        self.budget = budget
        self.notice = notice or preemption.current()

    def iterations(self) -> Iterator[IterationRecord]:
        """Trains (or resumes) every iteration not finished yet, yielding each one's record
        once it is published; `records` and `chosen` then hold all of them and the last
        chosen ensemble.

        Raises:
            TrainingError: every candidate of an iteration diverged.
            InputError: the job dir's records do not fit these flags.
            Preempted: SIGTERM; the running iteration was checkpointed where it stopped.
        """
        self.records = record_lib.finished(self.writes.job)
        self.chosen = self._restore_intact()
        if self.writes.is_chief:  # records past a damaged one built on it: trained again
            self.writes.job.set_aside_records(len(self.records))
        if self.records:
            logging.info(
                "Resuming %s: iterations 0..%d are finished.",
                self.writes.job.root,
                len(self.records) - 1,
            )
        last = self.config.search.max_iterations
        while self.search.may_grow(self.records):
            t = len(self.records)
            if self.budget and not self.budget.may_start(t, self.records):
                self.budget.skip(range(t, last))
                logging.info(
                    "The time budget leaves no room for iterations %d..%d: the search ends.",
                    t,
                    last - 1,
                )
                break
            previous = [m.builder for m in self.chosen.members] if self.chosen else []
            proposal = self.search.propose(t, previous)
            if not proposal.builders:
                logging.info("The generator proposes nothing at iteration %d: the search ends.", t)
                break
            record, self.chosen = self.run_iteration(proposal, self.chosen)
            self.records.append(record)
            # The iteration's models, datasets and traced functions hold reference cycles:
            # freed now, not at the next full collection (ames, 74 columns: 50-60 MB each).
            gc.collect()
            yield record
        t = len(self.records)
        if t < last and self.search.is_over(self.records):
            patience = self.config.search.patience
            logging.info(
                "The search stopped growing: iteration%s %s kept the previous ensemble "
                "(--patience=%d), so iterations %d..%d do not run.",
                "s" if patience > 1 else "",
                f"{t - patience}..{t - 1}" if patience > 1 else t - 1,
                patience,
                t,
                last - 1,
            )

    def _restore_intact(self) -> FrozenEnsemble | None:
        """The last finished iteration's chosen ensemble whose frozen weights can be read;
        the iterations after it (their weights damaged) are dropped from `records`, to be
        trained again."""
        while self.records:
            try:
                return self.restore(self.records)
            except CHECKPOINT_ERRORS as e:
                if not is_damage(e):
                    raise
                t = self.records[-1].iteration
                logging.warning(
                    "The frozen weights of iteration %d (%s) cannot be read (%s): it is "
                    "trained again.",
                    t,
                    self.writes.job.frozen_prefix(t),
                    first_line(e),
                )
                self.records = self.records[:-1]
        return None

    def _resume_iteration(self, checkpoint: tf.train.Checkpoint, t: int) -> str | None:
        """Restores the newest periodic checkpoint of iteration `t` that can be read (an older
        one where the newest is damaged; the state file that names them is not needed);
        None: none can, the iteration starts afresh."""
        directory = self.writes.iteration_checkpoints(t)
        numbers = []
        if tf.io.gfile.isdir(directory):
            names = tf.io.gfile.listdir(directory)
            numbers = sorted(
                (int(m.group(1)) for n in names if (m := PERIODIC.match(n))), reverse=True
            )
        for number in numbers:
            prefix = f"{directory}/ckpt-{number}"
            try:
                checkpoint.restore(
                    prefix, options=self.models.checkpoint_options
                ).assert_existing_objects_matched()
                return prefix
            except CHECKPOINT_ERRORS as e:
                if not is_damage(e):
                    raise
                logging.warning(
                    "Iteration %d: the checkpoint %s cannot be read (%s); trying an older one.",
                    t,
                    prefix,
                    first_line(e),
                )
        if numbers:
            logging.warning("Iteration %d: no checkpoint of it can be read; it starts afresh.", t)
        return None

    def restore(self, records: list[IterationRecord], *, local: bool = False) -> FrozenEnsemble:
        """The last record's chosen ensemble, rebuilt (under no strategy if `local`)."""
        return self.models.restore(records, self.writes.job, local=local)

    def run_iteration(
        self, proposal: Proposal, previous: FrozenEnsemble | None
    ) -> tuple[IterationRecord, FrozenEnsemble]:
        """Trains (or resumes) the iteration of `proposal`, grown from `previous`."""
        started = time.monotonic()
        t = proposal.number
        iteration = self.models.iteration(proposal, previous)
        checkpoint = iteration.checkpoint()
        latest = self._resume_iteration(checkpoint, t)
        if latest is None:  # (resumed: the fitted members' arrays are in the checkpoint)
            deadline = self.budget.fit_deadline() if self.budget else None
            for name, fit in iteration.fit_members(
                self.data.train_encoded(), self.data.train_rows, deadline=deadline
            ).items():
                logging.info("Iteration %d: fitted %s: %s.", t, name, fit)
        self.writes.drop_checkpoint_state(t)  # damaged, or naming a damaged checkpoint
        manager = tf.train.CheckpointManager(
            checkpoint, self.writes.iteration_checkpoints(t), max_to_keep=2
        )  # the latest two: an evaluator may be reading the older one
        if latest:
            logging.info(
                "Iteration %d: resumed from %s at step %d.", t, latest, int(iteration.step.numpy())
            )
            for name in iteration.stop_diverged():
                logging.warning(
                    "Iteration %d: %s diverged before the restart; it stays "
                    "stopped and will not be selected.",
                    t,
                    name,
                )
        logging.info(
            "Iteration %d: training %d subnetworks %s and %d candidate ensembles for %d steps.",
            t,
            len(proposal.builders),
            [b.name for b in proposal.builders],
            len(iteration.candidates),
            self.config.search.max_iteration_steps,
        )
        writers = SummaryWriters(
            self.writes.logs, iteration, first_step=sum(r.steps for r in self.records)
        )
        loop = self.loops(iteration)
        timing = self._train(iteration, loop, manager, writers)
        pause_started = self._previous_end = time.monotonic()
        record, chosen = self._select(iteration, timing, loop.placement())
        record = dataclasses.replace(record, placement_note=loop.placement_note)
        frozen = iteration.freeze(chosen)
        frozen.checkpoint().write(
            self.writes.frozen_prefix(t), options=self.models.checkpoint_options
        )
        record = _finished(
            record,
            frozen,
            Seconds(
                total=time.monotonic() - started,
                training=timing.seconds,
                first_step=timing.first_step_seconds,
                selection_and_freeze=time.monotonic() - pause_started,
                pause_before=timing.pause_before,
            ),
        )
        writers.write_eval(record)
        writers.close()
        self.writes.publish_record(record.iteration, record.to_json())  # the iteration is finished
        logging.info(
            "Iteration %d: chose %s (%s objective %.5f).",
            t,
            record.chosen,
            _OBJECTIVE_OF[self.config.search.selection],
            record.chosen_candidate.objective or float("nan"),
        )
        return record, frozen

    def _train(
        self,
        iteration: Iteration,
        loop: TrainLoop,
        manager: tf.train.CheckpointManager,
        writers: SummaryWriters,
    ) -> TrainingTime:
        """Trains until the loop is done, checkpointing and reporting between chunks."""
        budget = self.config.search.max_iteration_steps
        progress = Progress(
            iteration=iteration,
            manager=manager,
            writers=writers,
            total=budget,
            batch_size=self.config.train.batch_size,
            checkpoint_every_secs=self.config.checkpoint_every_secs,
            options=self.models.checkpoint_options,
            previous_end=self._previous_end,
        )
        step = progress.first_step
        stopped = False
        slow_warned = False
        with self.notice.deferred():  # SIGTERM sets a flag, looked at between loop calls
            while not loop.done:
                if self.notice.requested:
                    raise self._checkpoint_preempted(iteration, progress)
                called = time.monotonic()
                step, stopped = self._chunk(iteration, loop, progress, step, stopped)
                seconds = time.monotonic() - called
                if not slow_warned and step > progress.first_step + 1 and seconds > NOTICE_SECS / 2:
                    logging.warning(
                        "Iteration %d: one loop call took %.0f s, so a preemption notice (about "
                        "%.0f s) may end before the next checkpoint can be saved: lower "
                        "--steps_per_loop (now %d).",
                        iteration.number,
                        seconds,
                        NOTICE_SECS,
                        self.config.steps_per_loop,
                    )
                    slow_warned = True
            if iteration.is_exhausted and step < budget:
                logging.warning(
                    "Iteration %d: every new candidate diverged at step %d.", iteration.number, step
                )
            if stopped and self.budget and step < budget:
                self.budget.cut_steps(iteration.number, step, budget)
                logging.info(
                    "Iteration %d: the time budget stops its training at step %d of %d.",
                    iteration.number,
                    step,
                    budget,
                )
            timing = progress.finish(int(iteration.step.numpy()))  # (a checkpoint)
        if self.notice.requested:  # during the last loop call or that checkpoint
            raise self.notice.stop(
                f"iteration {iteration.number} trained to step {int(iteration.step.numpy())} "
                "and checkpointed; the restart resumes there"
            )
        if self.first_step_seconds is None and timing.first_step_at is not None:
            self.first_step_seconds = timing.first_step_at - self.started
        return timing

    def _chunk(
        self, iteration: Iteration, loop: TrainLoop, progress: Progress, step: int, stopped: bool
    ) -> tuple[int, bool]:
        """One loop call (or, once the time budget is over, the loop told to stop): the step
        count after it, and whether the loop was stopped."""
        # At least one chunk: an iteration the budget cuts still trains its candidates.
        over = (
            not stopped
            and step > progress.first_step
            and self.budget
            and self.budget.training_over(self.records)
        )
        if over:
            loop.stop()
            return step, True
        chunk = loop.train()
        for name in chunk.diverged:
            logging.warning(
                "Iteration %d: %s diverged (non-finite loss) by step %d; it "
                "stops training and will not be selected.",
                iteration.number,
                name,
                chunk.step,
            )
        progress.update(chunk.step)
        return chunk.step, stopped

    def _checkpoint_preempted(self, iteration: Iteration, progress: Progress) -> Preempted:
        """After SIGTERM (or Ctrl-C), at a safe point: a checkpoint at the step reached (how long
        it took, against the notice, is logged); returns the `Preempted` to raise."""
        if progress.bar is not None:
            progress.bar.close()
        step = int(iteration.step.numpy())
        started = time.monotonic()
        path = progress.manager.save(checkpoint_number=step, options=progress.options)
        saved = time.monotonic() - started
        logging.warning(
            "Iteration %d: %s: saved %s at step %d in %.2f s, %.1f s after the signal (a "
            "preemption's notice is about %.0f s). Stopping; the restart resumes there.",
            iteration.number,
            "SIGINT (Ctrl-C)" if self.notice.signum == signal.SIGINT else "SIGTERM (preemption)",
            path,
            step,
            saved,
            self.notice.seconds_since(),
            NOTICE_SECS,
        )
        return self.notice.stop(f"iteration {iteration.number} checkpointed at step {step}")

    def _select(
        self, iteration: Iteration, timing: TrainingTime, placement: tuple[UnitRecord, ...]
    ) -> tuple[IterationRecord, int]:
        """Scores every candidate and chooses one: the iteration's record (its architecture
        still that of the previous ensemble) and the chosen index. One streaming pass over the
        eval rows (and, to select on the training data, one over those)."""
        search = self.config.search
        on_eval = search.selection is ens.Selection.HOLDOUT
        evaluated = evaluation.evaluate_iteration(
            iteration, self.data.selection_encoded(), standard_errors=on_eval
        )
        standard_errors = None  # of the objectives' differences, with per-example losses
        if search.selection is ens.Selection.MOVING_AVERAGE:
            objectives = list(iteration.moving_average_objectives())
        else:
            scored = (
                evaluated
                if on_eval
                else evaluation.evaluate_iteration(
                    iteration, self.data.train_encoded(), standard_errors=True
                )
            )
            objectives = [
                selection_objective(loss, float(c.weights.penalty().numpy()))
                for loss, c in zip(scored.mean_losses, iteration.candidates)
            ]
            assert scored.standard_errors is not None  # asked for above
            standard_errors = scored.standard_errors.tolist()
        scores = iteration.scores(objectives)
        chosen = self.search.choose(scores, standard_errors)
        best = ens.choose(scores, force_grow=search.force_grow)
        snapshot = iteration.snapshot()
        record = IterationRecord(
            iteration=iteration.number,
            steps=snapshot.step,
            steps_per_sec=timing.steps_per_sec,
            batch_size=self.config.train.batch_size,
            selection=search.selection.value,
            chosen=scores[chosen].name,
            eval_examples=evaluated.examples,
            candidates=tuple(
                CandidateRecord(
                    c.name,
                    c.ensembler.name if c.ensembler else PREVIOUS_ENSEMBLER,
                    tuple(m.key for m in c.weights.members),
                    finite(s.objective),
                    s.diverged,
                    finite_metrics(m),
                    None if standard_errors is None else finite(standard_errors[i][best]),
                )
                for i, (c, s, m) in enumerate(
                    zip(iteration.candidates, scores, evaluated.candidates)
                )
            ),
            subnetworks=tuple(
                SubnetworkRecord(
                    s.name,
                    b.name,
                    b.complexity,
                    steps,
                    finite(loss),
                    diverged,
                    finite_metrics(m),
                    s.parameters,
                )
                for s, b, steps, loss, diverged, m in zip(
                    iteration.subnetworks,
                    iteration.builders,
                    snapshot.subnetwork_steps,
                    snapshot.subnetwork_losses,
                    snapshot.subnetwork_diverged,
                    evaluated.subnetworks,
                )
            ),
            placement=placement,
            architecture=Architecture("", (), {}),
            seconds=Seconds(0.0, 0.0, 0.0, 0.0),
        )
        return record, chosen


def _finished(record: IterationRecord, frozen: FrozenEnsemble, seconds: Seconds) -> IterationRecord:
    """The record with the frozen choice's architecture and the iteration's timing."""
    architecture = Architecture(
        frozen.ensembler.name,
        tuple(
            MemberRecord(m.key, m.iteration, m.builder.name, m.builder.complexity)
            for m in frozen.members
        ),
        frozen.weights.describe(),
    )
    return dataclasses.replace(record, architecture=architecture, seconds=seconds)
