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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.local.cluster import free_ports
from tests.support import REPO, task_env, wait_for
from trainer.distribute import cluster as cluster_lib
from trainer.distribute.cluster import ChiefWatch, Cluster, is_listening

TIMEOUT = 5  # --cluster_timeout_secs
# What a process may take beyond it: importing TensorFlow on 2 busy cores (5-15 s), its exit.
SLACK = 40

TASK = ("-m", "trainer.task")
# `python -m trainer.task`, but a normal exit prints a last line at the interpreter's teardown.
# A replica with a TensorFlow server running must end past it (os._exit): tearing TensorFlow
# down under its gRPC threads hung for more than 30 s in CI.
TASK_WITH_TEARDOWN_LINE = (
    "-c",
    "import atexit; atexit.register(print, 'interpreter teardown', flush=True); "
    "from trainer import task; task.run()",
)


def _jobs(*roles: str) -> dict[str, list[str]]:
    """A cluster of one replica per role, each at a free loopback port."""
    ports = iter(free_ports(len(roles)))
    jobs: dict[str, list[str]] = {}
    for role in roles:
        jobs.setdefault(role, []).append(f"127.0.0.1:{next(ports)}")
    return jobs


def _start(
    tmp_path: Path,
    jobs: dict,
    role: str,
    *flags: str,
    task: tuple[str, ...] = TASK,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """The trainer as `role` 0 of `jobs`, its output in `tmp_path/<role>.log`; `env`: more
    variables."""
    config = {"cluster": jobs, "task": {"type": role, "index": 0}}
    with open(tmp_path / f"{role}.log", "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                *task,
                f"--job_dir={tmp_path / 'job'}",
                f"--cluster_timeout_secs={TIMEOUT}",
                *flags,
            ],
            cwd=REPO,
            env=task_env(TF_CONFIG=json.dumps(config), **(env or {})),
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


@pytest.mark.parametrize(
    "missing, said",
    [
        (
            [("chief", 0, "h:1")],
            "the chief at h:1 never answered in 9 s (--cluster_timeout_secs). Check that it is "
            "running (see its logs) and that its port is reachable from this replica, or raise "
            "--cluster_timeout_secs if the chief takes longer to start (with parameter servers "
            "it answers once its input is checked).",
        ),
        (
            [("worker", 1, "h:2"), ("ps", 0, "h:3")],
            "worker 1 (h:2), ps 0 (h:3) never answered in 9 s (--cluster_timeout_secs). Check "
            "that they are running (see their logs) and that their ports are reachable from "
            "this replica, or raise --cluster_timeout_secs.",
        ),
    ],
)
def test_who_never_answered_is_said_one_way_in_every_role(missing, said):
    assert cluster_lib.never_answered(missing, 9) == said


def test_a_chief_waiting_for_its_servers_says_who_never_answered():
    chief, worker, ps = (f"127.0.0.1:{port}" for port in free_ports(3))
    cluster = Cluster("chief", 0, {"chief": (chief,), "worker": (worker,), "ps": (ps,)})
    with pytest.raises(TimeoutError) as raised:
        cluster_lib.wait_for_servers(cluster, timeout_secs=0, poll_secs=0)
    assert str(raised.value) == cluster_lib.never_answered(
        [("worker", 0, worker), ("ps", 0, ps)], 0
    )


# -- real processes -------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["worker", pytest.param("ps", marks=pytest.mark.slow)])
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


@pytest.mark.slow
def test_an_evaluator_whose_chief_never_comes_exits_naming_it(tmp_path):
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, "evaluator", "--server_grace_secs=5")
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / "evaluator.log").read_text()
    assert code == 1, output[-3000:]
    chief = jobs["chief"][0]
    assert f"the chief at {chief} never answered in {TIMEOUT} s" in output
    assert not (tmp_path / "job").exists()


@pytest.mark.slow
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


@pytest.mark.parametrize("role", ["chief", pytest.param("worker", marks=pytest.mark.slow)])
def test_a_synchronous_replica_whose_peer_never_comes_exits_naming_it(tmp_path, role):
    """...in one line, and past the interpreter's teardown: its TensorFlow server runs and a
    thread of the strategy waits in an all-reduce that never ends."""
    jobs = _jobs("chief", "worker")
    process = _start(tmp_path, jobs, role, task=TASK_WITH_TEARDOWN_LINE)
    code, _ = _finish(process, TIMEOUT + SLACK)
    output = (tmp_path / f"{role}.log").read_text()
    assert code == 1, output[-3000:]
    peer = {
        "chief": f"worker 0 ({jobs['worker'][0]})",
        "worker": f"the chief at {jobs['chief'][0]}",
    }
    said = f"training stopped: {peer[role]} never answered in {TIMEOUT} s (--cluster_timeout_secs)"
    assert said in output
    assert "Traceback" not in output
    assert "interpreter teardown" not in output


@pytest.mark.slow
def test_a_waiting_synchronous_chief_honours_sigterm(tmp_path):
    """TensorFlow's coordination service installs its own SIGTERM handler (its preemption
    notifier), which only logs the signal; while the chief waits for its worker it must still
    stop at once, with the preemption exit code (at once: not after minutes, or its 300 s).

    The signal goes to the process, but the kernel hands it to one of its threads: here to
    the newest, as it sometimes did by itself (a kill(2) of a thread's id offers the signal to
    that thread first), and the main thread, where Python runs its handlers, must not sleep
    through it."""
    jobs = _jobs("chief", "worker")
    # (TensorFlow's own lines shown: one says when the strategy starts to wait.)
    process = _start(
        tmp_path, jobs, "chief", "--cluster_timeout_secs=300", env={"TRAINER_VERBOSE": "1"}
    )
    log = tmp_path / "chief.log"
    try:
        # The strategy's health check waits for every replica: its server runs, and any
        # handler TensorFlow would install is in place.
        wait_for(
            lambda: "Waiting for the cluster" in log.read_text() or process.poll() is not None,
            SLACK,
            "the chief's wait for its worker",
        )
        assert process.poll() is None, log.read_text()[-3000:]
        assert is_listening(jobs["chief"][0])
        threads = sorted(int(t) for t in os.listdir(f"/proc/{process.pid}/task"))
        os.kill(threads[-1], signal.SIGTERM)
        code, seconds = _finish(process, 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 143, output[-3000:]
    assert seconds < 30, output[-3000:]
    assert "preempted: SIGTERM" in output
