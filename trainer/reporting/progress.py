"""An iteration's training bookkeeping, the same for every train loop: progress lines,
TensorBoard summaries of the training objectives, periodic checkpoints, and how long it took.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time

import rich.console
import rich.progress
import tensorflow as tf
from absl import logging

from trainer.reporting import console
from trainer.search.iteration import Iteration, Snapshot
from trainer.search.record import IterationRecord
from trainer.storage import job_dir as job_dir_lib

PROGRESS_EVERY_SECS = 5.0


@dataclasses.dataclass(frozen=True)
class TrainingTime:
    """How an iteration's training went, in seconds."""

    seconds: float  # the whole training phase
    first_step_seconds: float  # building and compiling the train loop, and the first step
    steps_per_sec: float | None  # after the first step (None if there was no other)
    # From the end of the previous iteration's training to this one's first step (select,
    # freeze, build and compile); None for the first iteration this process trains.
    pause_before: float | None = None
    first_step_at: float | None = None  # when the first step was done (time.monotonic())


def rate(steps: int, seconds: float) -> float | None:
    return steps / seconds if steps > 0 and seconds > 0 else None


def progress_line(
    number: int,
    names: tuple[str, ...],
    snapshot: Snapshot,
    total: int,
    steps_per_sec: float | None,
    batch_size: int,
) -> str:
    """'iteration 1 step 300/3000 (10%) | 700 steps/s, 44,800 examples/s | 0:00:04 left |
    lowest train objective <candidate> <objective>'."""
    step = snapshot.step
    return (
        f"iteration {number} step {step}/{total} ({step / total:.0%}) | "
        f"{progress_status(names, snapshot, total, steps_per_sec, batch_size)}"
    )


def progress_status(
    names: tuple[str, ...] | None,
    snapshot: Snapshot,
    total: int,
    steps_per_sec: float | None,
    batch_size: int,
) -> str:
    """'700 steps/s, 44,800 examples/s | 0:00:04 left | lowest train objective <candidate>
    <objective>'; without `names`, '44,800 examples/s | 0:00:04 left | train obj <objective>'
    (for the bar). The training objective's moving average, which is not what a search that
    selects on held-out rows chooses by: it is named for what it is."""
    steps_per_sec = steps_per_sec or 0.0
    # Parameter-server workers' chunks in flight may overshoot the total: nothing is left.
    left = max(total - snapshot.step, 0) / steps_per_sec if steps_per_sec > 0 else float("inf")
    eta = str(datetime.timedelta(seconds=round(left))) if math.isfinite(left) else "?"
    alive = snapshot.active_candidates
    best = min(alive, key=lambda i: snapshot.objectives[i]) if alive else None
    best_text = ""
    if best is not None:
        # On the bar (no names) short, so that an 80-column terminal keeps the bar itself.
        label = f"lowest train objective {names[best]}" if names else "train obj"
        best_text = f" | {label} {snapshot.objectives[best]:.4f}"
    speed = f"{steps_per_sec * batch_size:,.0f} examples/s"
    if names:
        speed = f"{steps_per_sec:,.0f} steps/s, {speed}"
    return f"{speed} | {eta} left{best_text}"


class Bar:
    """An iteration's progress bar on a terminal (rich), redrawn after every chunk; it stays
    on screen, complete, when the iteration's training ends."""

    def __init__(self, number: int, total: int):
        self._progress = rich.progress.Progress(
            rich.progress.TextColumn(f"iteration {number}"),
            rich.progress.BarColumn(),
            rich.progress.MofNCompleteColumn(),
            rich.progress.TextColumn("{task.fields[status]}"),
            console=rich.console.Console(stderr=True),
        )
        self._task = self._progress.add_task("", total=total, status="")
        self._progress.start()

    def show(self, step: int, status: str) -> None:
        self._progress.update(self._task, completed=step, status=status)

    def close(self) -> None:
        self._progress.stop()


class SummaryWriters:
    """TensorBoard runs that last the whole search, their steps counted across iterations
    (`first_step`: the steps of the iterations before this one): `candidates/NAME` per
    candidate ensemble name (the same names recur each iteration: grow_dnn_0x64_..., the
    previous ensemble), `subnetworks/BUILDER` per subnetwork builder, with the training
    objective or loss as it trains and the held-out metrics at each iteration's end, and
    `chosen`, the chosen ensemble's held-out metrics at each iteration's end: the search's
    path as one curve."""

    def __init__(self, logs: str | None, iteration: Iteration, first_step: int = 0):
        """Writes nothing when `logs` is None (replicas other than the chief)."""
        self.first_step = first_step
        self.candidates: list = []
        self.subnetworks: list = []
        self.chosen = None
        if logs is None:
            return
        self.candidates = [
            tf.summary.create_file_writer(job_dir_lib.join(logs, "candidates", c.name))
            for c in iteration.candidates
        ]
        self.subnetworks = [
            tf.summary.create_file_writer(job_dir_lib.join(logs, "subnetworks", b.name))
            for b in iteration.builders
        ]
        self.chosen = tf.summary.create_file_writer(job_dir_lib.join(logs, "chosen"))

    def write_training(self, snapshot: Snapshot) -> None:
        step = self.first_step + snapshot.step
        for writer, value in zip(self.candidates, snapshot.objectives):
            with writer.as_default(step=step):
                tf.summary.scalar("train/adanet_objective", value)
        for writer, value in zip(self.subnetworks, snapshot.subnetwork_losses):
            with writer.as_default(step=step):
                tf.summary.scalar("train/loss", value)

    def write_eval(self, record: IterationRecord) -> None:
        step = self.first_step + record.steps
        written = [
            *zip(self.candidates, [c.eval for c in record.candidates]),
            *zip(self.subnetworks, [s.eval for s in record.subnetworks]),
        ]
        if self.chosen is not None:
            written.append((self.chosen, record.chosen_candidate.eval))
        for writer, entry in written:
            with writer.as_default(step=step):
                for name, value in entry.items():
                    if value is not None:
                        tf.summary.scalar(f"eval/{name}", value)

    def close(self) -> None:
        for writer in [*self.candidates, *self.subnetworks, self.chosen]:
            if writer is not None:
                writer.close()


class Progress:
    """An iteration's training bookkeeping: the time to the first step (building and
    compiling), a progress line and training summaries every `PROGRESS_EVERY_SECS`, a
    checkpoint every `checkpoint_every_secs`, and at the end a last line, summaries and
    checkpoint, and the `TrainingTime` (its pause counted from `previous_end`, when the
    previous iteration's training ended)."""

    def __init__(
        self,
        *,
        iteration: Iteration,
        manager: tf.train.CheckpointManager,
        writers: SummaryWriters,
        total: int,
        batch_size: int,
        checkpoint_every_secs: float,
        options: tf.train.CheckpointOptions | None,
        previous_end: float | None,
    ):
        self.iteration, self.manager, self.writers = iteration, manager, writers
        self.total, self.batch_size = total, batch_size
        self.checkpoint_every_secs, self.options = checkpoint_every_secs, options
        self.previous_end = previous_end
        self.started = self.last_line = self.last_checkpoint = time.monotonic()
        self.first: float | None = None  # when the first step was done
        self.first_step = int(iteration.step.numpy())  # the step count then
        # On a terminal a bar redrawn every chunk; in a log a line every PROGRESS_EVERY_SECS.
        self.bar = Bar(iteration.number, total) if console.on_terminal() else None

    def update(self, step: int) -> None:
        """After a chunk of steps: `step` is the iteration's step count now."""
        now = time.monotonic()
        if self.first is None:
            self.first, self.first_step = now, step
        due = now - self.last_line >= PROGRESS_EVERY_SECS
        if due or self.bar is not None:
            self._line(step, now, summaries=due)
        if now - self.last_checkpoint >= self.checkpoint_every_secs:
            self.manager.save(checkpoint_number=step, options=self.options)
            self.last_checkpoint = now

    def finish(self, step: int) -> TrainingTime:
        ended = time.monotonic()
        self._line(step, ended, summaries=True)
        if self.bar is not None:
            self.bar.close()
        self.manager.save(checkpoint_number=step, options=self.options)
        first = self.first or ended
        pause = (
            None
            if self.first is None or self.previous_end is None
            else self.first - self.previous_end
        )
        return TrainingTime(
            seconds=time.monotonic() - self.started,
            first_step_seconds=first - self.started,
            steps_per_sec=rate(step - self.first_step, ended - first),
            pause_before=pause,
            first_step_at=self.first,
        )

    def _line(self, step: int, now: float, *, summaries: bool) -> None:
        """Shows the progress (the bar, or a line) and writes the training summaries."""
        snapshot = self.iteration.snapshot()
        steps_per_sec = rate(step - self.first_step, now - (self.first or now))
        if self.bar is not None:
            status = progress_status(None, snapshot, self.total, steps_per_sec, self.batch_size)
            self.bar.show(step, status)
        else:
            logging.info(
                progress_line(
                    self.iteration.number,
                    tuple(c.name for c in self.iteration.candidates),
                    snapshot,
                    self.total,
                    steps_per_sec,
                    self.batch_size,
                )
            )
        if summaries:
            self.writers.write_training(snapshot)
            self.last_line = now
