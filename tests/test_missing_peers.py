"""A replica whose peers never come: every role (chief, worker, ps, evaluator; with parameter
servers and synchronous) exits by itself with code 1 within `--cluster_timeout_secs`, naming
who is missing, and honours SIGTERM while it waits. Each test runs `python -m trainer.task` as
one real process whose TF_CONFIG names peers that never start (free ports nobody listens on).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO, task_env
from trainer.cluster import ChiefWatch, Cluster

TIMEOUT = 5  # --cluster_timeout_secs
# What a process may take beyond it: importing TensorFlow on 2 busy cores (5-15 s), its exit.
SLACK = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jobs(*roles: str) -> dict[str, list[str]]:
    """A cluster of one replica per role, each at a free loopback port."""
    jobs: dict[str, list[str]] = {}
    for role in roles:
        jobs.setdefault(role, []).append(f"127.0.0.1:{_free_port()}")
    return jobs


def _start(tmp_path: Path, jobs: dict, role: str, *flags: str) -> subprocess.Popen:
    """`python -m trainer.task` as `role` 0 of `jobs`, its output in `tmp_path/<role>.log`."""
    config = {"cluster": jobs, "task": {"type": role, "index": 0}}
    with open(tmp_path / f"{role}.log", "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer.task",
                f"--job_dir={tmp_path / 'job'}",
                f"--cluster_timeout_secs={TIMEOUT}",
                *flags,
            ],
            cwd=REPO,
            env=task_env(TF_CONFIG=json.dumps(config)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _finish(process: subprocess.Popen, timeout: float) -> tuple[int, float]:
    """The exit code and the seconds it took; kills a process still running after `timeout`."""
    started = time.monotonic()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"still running after {timeout} s: it never gave up") from None
    return code, time.monotonic() - started


# -- the rule, on a fake clock and probe (milliseconds) -----------------------------------------
@pytest.mark.parametrize(
    "answers, gone, error",
    [
        # (seconds since the start, whether the chief answers) at each look
        ([(1, False), (9, False)], [False, False], None),  # may still come (timeout 10)
        ([(1, False), (11, False)], [False], "never answered in 10 s (--cluster_timeout_secs)"),
        ([(1, True), (30, True)], [False, False], None),  # there
        ([(1, True), (30, False), (34, False)], [False, False, False], None),  # within grace
        ([(1, True), (30, False), (36, False)], [False, False, True], None),  # gone: done
        ([(1, True), (30, False), (34, True), (40, False)], [False] * 4, None),  # came back
    ],
)
def test_the_chief_must_answer_in_time_and_may_be_gone_a_grace(answers, gone, error):
    clock = iter([0.0] + [t for t, _ in answers])
    probes = iter([up for _, up in answers])
    watch = ChiefWatch(
        Cluster("worker", 0, {"chief": ("h:1",), "worker": ("h:2",), "ps": ("h:3",)}),
        timeout_secs=10,
        grace_secs=5,
        probe=lambda address: address == "h:1" and next(probes),
        clock=lambda: next(clock),
    )
    seen = [watch.gone() for _ in gone]
    assert seen == gone
    if error:
        with pytest.raises(TimeoutError, match=re.escape(f"the chief at h:1 {error}")):
            watch.gone()


# -- real processes -------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["worker", "ps"])
def test_a_server_whose_chief_never_comes_exits_naming_it(tmp_path, role):
    jobs = _jobs("chief", "worker", "ps")
    process = _start(tmp_path, jobs, role)
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / f"{role}.log").read_text()
    assert code == 1, output[-3000:]
    chief = jobs["chief"][0]
    assert f"the chief at {chief} never answered in {TIMEOUT} s (--cluster_timeout_secs)" in (
        output
    )


def test_an_evaluator_whose_chief_never_comes_exits_naming_it(tmp_path):
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, "evaluator", "--server_grace_secs=5")
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / "evaluator.log").read_text()
    assert code == 1, output[-3000:]
    chief = jobs["chief"][0]
    assert f"the chief at {chief} never answered in {TIMEOUT} s" in output
    assert not (tmp_path / "job").exists()


def test_an_evaluator_beside_a_lone_chief_that_never_starts_the_job_exits_naming_it(tmp_path):
    """A chief with no workers or ps runs no server: the evaluator waits for the job dir it
    writes once its input is checked, as long as for a chief's port."""
    jobs = _jobs("chief")
    process = _start(tmp_path, jobs, "evaluator")
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / "evaluator.log").read_text()
    assert code == 1, output[-3000:]
    job = tmp_path / "job"
    assert f"no job in {job} after {TIMEOUT} s (--cluster_timeout_secs)" in output
    assert f"the chief writes {job / 'run.json'} once its input is checked" in output
    assert not job.exists()


def test_a_synchronous_chief_whose_worker_never_comes_exits_naming_it(tmp_path):
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, "chief")
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / "chief.log").read_text()
    assert code == 1, output[-3000:]
    assert f"worker 0 ({jobs['worker'][0]})" in output
    assert f"in {TIMEOUT} s (--cluster_timeout_secs)" in output
    assert "Traceback" not in output


def test_a_synchronous_worker_whose_chief_never_comes_exits_naming_it(tmp_path):
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, "worker")
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / "worker.log").read_text()
    assert code == 1, output[-3000:]
    assert f"the chief at {jobs['chief'][0]} never answered in {TIMEOUT} s" in output
    assert "Traceback" not in output


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_a_waiting_synchronous_chief_honours_sigterm(tmp_path):
    """TensorFlow's coordination service installs its own SIGTERM handler (its preemption
    notifier), which only logs the signal; while the chief waits for its worker it must still
    stop at once, with the preemption exit code."""
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, "chief", "--cluster_timeout_secs=300")
    try:
        # Its server listens: the strategy is being created, and the wait has begun.
        deadline = time.monotonic() + SLACK
        while not _listening(jobs["chief"][0]):
            assert process.poll() is None, (tmp_path / "chief.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the chief's server never started"
            time.sleep(0.1)
        time.sleep(2)  # well into the wait, past TensorFlow's handler
        os.kill(process.pid, signal.SIGTERM)
        code, seconds = _finish(process, 20)
    finally:
        if process.poll() is None:
            process.kill()
    output = (tmp_path / "chief.log").read_text()
    assert code == 143, output[-3000:]
    assert seconds < 5, output[-3000:]
    assert "preempted: SIGTERM" in output
