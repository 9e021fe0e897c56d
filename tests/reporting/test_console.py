"""What the user sees: quiet libraries, plain lines in a log, a progress bar on a terminal."""

from __future__ import annotations

import logging as std_logging
import os
import pty
import subprocess
import sys
import warnings

import pytest
from absl import logging

from tests.support import ABSL_PREFIX, FAST_FLAGS, REPO, task_env
from trainer.reporting import console


@pytest.mark.parametrize(
    "argv, environ, expected",
    [
        ([], {}, False),
        (["--verbosity=1"], {}, True),
        (["--verbosity", "2"], {}, True),
        (["-v", "1"], {}, True),
        (["--verbosity=0"], {}, False),
        (["--verbosity=-1"], {}, False),
        (["--verbosity=loud"], {}, False),  # absl's own parsing names the bad value
        ([], {"TRAINER_VERBOSE": "1"}, True),
        ([], {"TRAINER_VERBOSE": "true"}, True),
        ([], {"TRAINER_VERBOSE": "0"}, False),
    ],
)
def test_verbose_comes_from_the_verbosity_flag_or_the_environment(argv, environ, expected):
    assert console.verbose(["trainer.task", *argv], environ) is expected


def test_quiet_libraries_sets_the_tensorflow_log_level_unless_the_user_did():
    with warnings.catch_warnings():
        environ: dict[str, str] = {}
        assert console.quiet_libraries([], environ) is False
        assert environ == {"TF_CPP_MIN_LOG_LEVEL": "2"}
        mine = {"TF_CPP_MIN_LOG_LEVEL": "0"}
        console.quiet_libraries([], mine)
        assert mine == {"TF_CPP_MIN_LOG_LEVEL": "0"}
        loud: dict[str, str] = {}
        assert console.quiet_libraries(["--verbosity=1"], loud) is True
        assert loud == {}


def _record(pathname: str, level: int) -> std_logging.LogRecord:
    return std_logging.LogRecord("absl", level, pathname, 1, "the message", None, None)


def test_plain_lines_keep_this_projects_lines_and_other_packages_errors():
    handler = logging.get_absl_handler()
    formatter, filters = handler.formatter, list(handler.filters)
    tensorflow = std_logging.getLogger("tensorflow")
    tensorflow_filters = list(tensorflow.filters)
    try:
        console.plain_lines()
        ours = os.path.join(REPO, "trainer", "search", "controller.py")
        theirs = "/usr/lib/python3/site-packages/tensorflow/python/checkpoint/sharding.py"
        assert handler.filter(_record(ours, std_logging.INFO))
        assert not handler.filter(_record(theirs, std_logging.INFO))
        assert not handler.filter(_record(theirs, std_logging.WARNING))
        assert handler.filter(_record(theirs, std_logging.ERROR))
        coordinator = "/x/tensorflow/python/distribute/coordinator/cluster_coordinator.py"
        assert handler.filter(_record(coordinator, std_logging.INFO))  # worker lost, recovered
        assert handler.format(_record(ours, std_logging.INFO)) == "the message"
        assert handler.format(_record(ours, std_logging.WARNING)) == "warning: the message"
    finally:
        handler.setFormatter(formatter)
        handler.filters[:] = filters
        tensorflow.filters[:] = tensorflow_filters


def _run_on_a_terminal(args: list[str], env: dict) -> tuple[int, str]:
    """Runs `python -m trainer.task ARGS` with stderr on a pseudo-terminal; (exit code, what
    the terminal showed)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    return process.wait(timeout=300), shown.decode("utf-8", "replace")


@pytest.mark.slow
def test_a_terminal_shows_a_progress_bar_and_no_library_noise(binary_data, tmp_path):
    env = task_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # the trainer's default, as a user runs it
    code, shown = _run_on_a_terminal(
        [
            f"--train_data={binary_data.train}",
            f"--eval_data={binary_data.eval}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            *FAST_FLAGS,
        ],
        env,
    )
    assert code == 0, shown[-3000:]
    assert "━" in shown and "200/200" in shown  # rich's bar, at the end of each iteration
    assert "Iteration 1: chose" in shown
    assert not ABSL_PREFIX.search(shown), shown[-3000:]
    for noise in ("FutureWarning", "oneDNN", "cpu_feature_guard", "Sharding callback"):
        assert noise not in shown, noise


def test_the_progress_line_never_shows_negative_time_left():
    from trainer.reporting.progress import progress_status
    from trainer.search.iteration import Snapshot

    def status(step: int) -> str:
        snapshot = Snapshot(step, (step,), (0.5,), (0.5,), (False,), (False,), (0,))
        return progress_status(("a",), snapshot, 1000, 100.0, 256)

    assert "0:00:05 left" in status(500)
    # Parameter-server chunks in flight can overshoot the iteration's steps.
    assert "0:00:00 left" in status(1200)
