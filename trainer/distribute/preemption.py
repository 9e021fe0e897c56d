"""Preemption and Ctrl-C: SIGTERM with a short notice (a Spot or preempted VM on Vertex AI gets
about 30 s), or SIGINT, ends the job so that it is restarted, and resumes, with no finished
training step lost.

While an iteration trains (`Notice.deferred`), the signal handler only sets a flag; the
controller looks at it between two compiled loop calls (every `--steps_per_loop` steps), saves a
checkpoint at the step reached and raises `Preempted`, which `trainer.task` turns into the exit
code. Anywhere else (the data scan, building an iteration, selection, the export) there is no
training to save and no safe point to wait for: the handler ends the process at once
(`os._exit`), as SIGKILL would but with the same exit code. That is safe because every artifact
is published atomically (see `trainer/storage/job_dir.py`), the property that lets a SIGKILLed
job resume (tests/job/test_resume.py). (Raising an exception from the handler instead, as Python's
own SIGINT handler raises KeyboardInterrupt, is not reliable: the handler may run inside one of
TensorFlow's `__del__` methods, where Python prints an exception and drops it; the job then ran
on to the end. It also printed a traceback and saved nothing.)

The exit code is 128 + the signal's number, what a shell or container runtime reports for a
process killed by that signal, so the exit reads the same whether it saved or not: `EXIT_CODE`,
143, for SIGTERM; 130 for SIGINT, which shells and CI runners read as "interrupted by the user"
rather than as a platform's stop. It must be non-zero: a chief that exits 0 ends a Vertex AI job
as succeeded, without a model. Vertex AI restarts a replica that exits non-zero, on the same
host name and with the same job dir (up to 5 times, then it retries the whole job up to 3
times); 143 is neither the 1 of a `TrainingError` nor the 2 of bad input, so the logs say which
it was.

A second SIGTERM changes nothing: the save it would interrupt is the point of the first one, and
the platform's SIGKILL at the end of the notice is the hard stop. A second SIGINT is a user who
will not wait: it ends the process at once, exit code 130, abandoning the save (the checkpoint
being written is never published half way; the restart resumes from the last periodic checkpoint
or finished iteration). After the save (`Preempted`) SIGTERM is ignored and SIGINT ends the
process as Python's default would, by the signal.

A replica of a synchronous cluster (`watch(can_defer=False)`) cannot checkpoint alone (each
checkpoint needs every replica): it stops at once even in training, and the job resumes from
its last periodic checkpoint. Workers and parameter servers under a coordinator only serve;
`distributed.serve` has its own handler (128 + the signal while the chief runs, else 0).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

EXIT_CODE = 128 + signal.SIGTERM  # 143
NOTICE_SECS = 30.0  # Vertex AI's notice to a preempted VM (Compute Engine's Spot VMs: 30 s)
SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what `watch` handles


def exit_code(signum: int) -> int:
    """The exit code of a process stopped by signal `signum`: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + signum


def stopped_line(signum: int, what: str) -> str:
    """The last line a stopped process prints: what happened, its exit code, what to do."""
    verb = "interrupted" if signum == signal.SIGINT else "preempted"
    return f"{verb}: {what}; exit code {exit_code(signum)} (restart to resume)"


class Preempted(BaseException):
    """SIGTERM (or SIGINT) in training, after the checkpoint: the process stops with
    `exit_code(signum)` so that it is restarted and resumes. A BaseException (like
    KeyboardInterrupt): no `except Exception` on the way out may keep it."""

    def __init__(self, message: str, signum: int = signal.SIGTERM):
        super().__init__(message)
        self.signum = signum


class Notice:
    """SIGTERM or SIGINT as seen by this process: whether one came, which, when, and how
    often. Installed by `watch` (`current()` is the installed one); inert (never set) when not
    installed.

    Example::

        with preemption.watch() as notice:
            ...
            with notice.deferred():
                while training:
                    train_a_chunk()
                    if notice.requested:
                        save_checkpoint()
                        raise notice.stop("saved at step 123")
    """

    def __init__(self, *, can_defer: bool = True, ended: Callable[[], str | None] | None = None):
        """
        Args:
            can_defer: whether this process can save on its own when told to stop (False for a
                replica of a synchronous cluster: its checkpoints need every replica).
            ended: asked when a signal comes outside training: a line saying that the work
                is over (the signal is then the job's normal end: exit 0), or None.
        """
        self.can_defer = can_defer
        self.ended = ended
        self.received_at: float | None = None  # time.monotonic() of the first signal
        self.signum: int = signal.SIGTERM  # the first signal's number, once one came
        self.count = 0
        self._training = False  # in a `deferred` span

    @property
    def requested(self) -> bool:
        """A SIGTERM or SIGINT has come: stop at the next safe point."""
        return self.received_at is not None

    def seconds_since(self) -> float:
        """Seconds since the first signal (0 if none came)."""
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    @contextlib.contextmanager
    def deferred(self) -> Iterator[Notice]:
        """A span (training) in which SIGTERM and SIGINT only set `requested`; the code inside
        looks at it at its safe points and stops there itself."""
        self._training = True
        try:
            yield self
        finally:
            self._training = False

    def stop(self, what: str) -> Preempted:
        """The exception to raise at a safe point, saying what was kept."""
        name = signal.Signals(self.signum).name
        return Preempted(f"{name} {self.seconds_since():.1f} s ago: {what}", self.signum)

    def handle(self, signum: int, frame) -> None:
        """The SIGTERM and SIGINT handler: notes the signal. Outside a deferred span the
        process has nothing to save and ends now, with `exit_code(signum)` (see the module
        doc)."""
        del frame
        self.count += 1
        if self.received_at is not None:  # this process is already stopping
            if signum == signal.SIGINT:  # Ctrl-C again: not waiting for the save
                _exit_now(
                    signum,
                    "again: the save was abandoned (a restart resumes from the last periodic "
                    "checkpoint or finished iteration)",
                )
            return
        self.received_at = time.monotonic()
        self.signum = signum
        if not self._training:
            over = self.ended() if self.ended else None
            if over:  # not a preemption: the job's end stops this process
                print(over, file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(0)
            _exit_now(signum, "outside training: nothing to save")
        elif not self.can_defer:
            _exit_now(signum, "a replica of a synchronous cluster cannot checkpoint alone")


_before_exit: list[Callable[[], None]] = []


@contextlib.contextmanager
def before_exit_now(cleanup: Callable[[], None]) -> Iterator[None]:
    """Runs `cleanup` before a signal ends the process at once (`os._exit`: nothing unwinds),
    within the span: for what must not outlive the process (the job dir's lease)."""
    _before_exit.append(cleanup)
    try:
        yield
    finally:
        _before_exit.remove(cleanup)


def _exit_now(signum: int, why: str) -> None:
    print(stopped_line(signum, f"{signal.Signals(signum).name} {why}"), file=sys.stderr, flush=True)
    sys.stdout.flush()
    for cleanup in reversed(_before_exit):
        with contextlib.suppress(Exception):  # exiting regardless
            cleanup()
    os._exit(exit_code(signum))


_current: Notice | None = None  # the one `watch` installed: a signal handler is per process


def current() -> Notice:
    """The notice `watch` installed in this process, or an inert one outside `watch`."""
    return _current or Notice()


@contextlib.contextmanager
def watch(
    *, can_defer: bool = True, ended: Callable[[], str | None] | None = None
) -> Iterator[Notice]:
    """Handles SIGTERM and SIGINT with a `Notice` for the duration of the block (in the main
    thread only: elsewhere Python cannot install handlers and the notice stays inert). The
    previous handlers come back afterwards, unless the block ends in `Preempted`: then a later
    SIGTERM is ignored, so that the process exits with its code and is not killed half way out,
    and a later SIGINT (a user who will not wait) kills it."""
    global _current
    notice = Notice(can_defer=can_defer, ended=ended)
    if threading.current_thread() is not threading.main_thread():
        yield notice
        return
    previous = {signum: signal.signal(signum, notice.handle) for signum in SIGNALS}
    outer, _current = _current, notice
    preempted = False
    try:
        yield notice
    except Preempted:
        preempted = True
        raise
    finally:
        _current = outer
        for signum, handler in previous.items():
            # (None: a handler installed outside Python, which cannot be put back; the default.)
            restored = signal.SIG_DFL if handler is None else handler
            if preempted:
                restored = signal.SIG_DFL if signum == signal.SIGINT else signal.SIG_IGN
            signal.signal(signum, restored)
