"""SIGTERM (a Spot VM's preemption): the trainer saves a checkpoint at the step it reached,
exits with 143, and the same command resumes at exactly that step; before training it stops at
once and writes nothing. Ctrl-C (SIGINT) does the same with exit code 130, without a traceback.
The signal handler itself is tested in this process."""

from __future__ import annotations

import contextlib
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

from deploy.local.cluster import free_ports
from tests.support import (
    HEADER,
    REPO,
    load_report,
    make_data,
    run_task,
    synthetic_rows,
    task_env,
    write_csv,
)
from trainer.distribute import preemption


# -- the handler, in this process --------------------------------------------------------------
def _sigterm_self(notice: preemption.Notice, count: int) -> None:
    """Sends SIGTERM to this process and waits until the handler has seen `count` of them."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while notice.count < count:
        assert time.monotonic() < deadline, "the handler did not run"
        time.sleep(0.01)


@pytest.fixture
def sigterm_restored():
    """Puts this process's SIGTERM and SIGINT handlers back (`watch` may leave them ignored)."""
    original = {signum: signal.getsignal(signum) for signum in preemption.SIGNALS}
    yield
    for signum, handler in original.items():
        signal.signal(signum, handler)


def test_sigterm_while_training_only_sets_the_flag_and_later_ones_are_ignored(sigterm_restored):
    with (
        pytest.raises(preemption.Preempted, match="checkpointed at step 7"),
        preemption.watch() as notice,
    ):
        assert preemption.current() is notice
        with notice.deferred():
            assert not notice.requested
            _sigterm_self(notice, 1)
            assert notice.requested  # and no exception: the loop stops at a safe point
            _sigterm_self(notice, 2)  # a second one changes nothing
            assert notice.seconds_since() >= 0
        raise notice.stop("checkpointed at step 7")
    # On the way out after a preemption, SIGTERM no longer kills the process half way; Ctrl-C
    # (a user who will not wait) does.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert not preemption.current().requested  # outside `watch`: an inert notice


def _watching(body: str, *, can_defer: bool) -> subprocess.Popen:
    """A Python process that runs `body` (indented code, which prints 'ready' when it is where
    the test wants the signal) under `preemption.watch(can_defer=...) as notice`."""
    code = (
        "import time\n"
        "from trainer.distribute import preemption\n"
        f"with preemption.watch(can_defer={can_defer}) as notice:\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code + body],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize(
    "can_defer, body, why",
    [
        (
            True,
            "    print('ready', flush=True)\n    time.sleep(30)\n",
            "outside training: nothing to save",
        ),
        (
            False,
            "    with notice.deferred():\n"
            "        print('ready', flush=True)\n"
            "        time.sleep(30)\n",
            "a replica of a synchronous cluster cannot checkpoint alone",
        ),
    ],
    ids=["outside_training", "synchronous_replica"],
)
def test_a_signal_with_nothing_to_save_ends_the_process_at_once(can_defer, body, why, signum):
    process = _watching(body, can_defer=can_defer)
    assert process.stdout and process.stderr
    assert process.stdout.readline() == "ready\n"
    code, seconds = _terminate(process, signum)
    assert code == 128 + signum  # 143, 130
    assert seconds < 3  # not the 30 s of the sleep
    name = signal.Signals(signum).name
    verb = "preempted" if signum == signal.SIGTERM else "interrupted"
    stderr = process.stderr.read()
    assert f"{verb}: {name} {why}; exit code {128 + signum}" in stderr
    assert "Traceback" not in stderr


def test_ctrl_c_while_training_only_sets_the_flag_and_says_which_signal_came():
    body = (
        "    with notice.deferred():\n"
        "        print('ready', flush=True)\n"
        "        while not notice.requested:\n"
        "            time.sleep(0.01)\n"
        "        stop = notice.stop('saved at step 7')\n"
        "    print(stop.signum, stop, flush=True)\n"
    )
    process = _watching(body, can_defer=True)
    assert process.stdout and process.stderr
    assert process.stdout.readline() == "ready\n"
    os.kill(process.pid, signal.SIGINT)
    assert process.wait(timeout=10) == 0, process.stderr.read()
    line = process.stdout.readline()
    assert line.startswith(f"{int(signal.SIGINT)} SIGINT ") and "s ago: saved at step 7" in line
    assert "KeyboardInterrupt" not in process.stderr.read()


def test_a_second_sigterm_on_the_way_out_does_not_cut_it_short():
    body = (
        "    with notice.deferred():\n"
        "        print('ready', flush=True)\n"
        "        while not notice.requested:\n"
        "            time.sleep(0.01)\n"
        "    print('saved', flush=True)\n"  # (the checkpoint), then out of the span
        "    time.sleep(1)\n"
        "    print('done', flush=True)\n"
    )
    process = _watching(body, can_defer=True)
    assert process.stdout and process.stderr
    assert process.stdout.readline() == "ready\n"
    os.kill(process.pid, signal.SIGTERM)
    assert process.stdout.readline() == "saved\n"
    code, _ = _terminate(process)  # the second SIGTERM
    assert process.stdout.readline() == "done\n"
    assert code == 0, process.stderr.read()  # (the script itself ends normally)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_ctrl_c_abandons_a_hung_save_at_once(first):
    body = (
        "    with notice.deferred():\n"
        "        print('ready', flush=True)\n"
        "        while not notice.requested:\n"
        "            time.sleep(0.01)\n"
        "        print('saving', flush=True)\n"
        "        time.sleep(120)\n"  # a save that hangs (a stuck file system)
    )
    process = _watching(body, can_defer=True)
    assert process.stdout and process.stderr
    assert process.stdout.readline() == "ready\n"
    os.kill(process.pid, first)
    assert process.stdout.readline() == "saving\n"
    code, seconds = _terminate(process, signal.SIGINT)
    assert code == 130
    assert seconds < 20  # at once, not after the save's 120 s
    assert process.stderr.read().strip().splitlines()[-1] == (
        "interrupted: SIGINT again: the save was abandoned (a restart resumes from the last "
        "periodic checkpoint or finished iteration); exit code 130 (restart to resume)"
    )


@pytest.mark.parametrize(
    "when, said",
    [
        ("before", "interrupted: SIGINT before any work; exit code 130"),
        ("after", "interrupted: SIGINT after the work had ended; what it finished is saved;"),
    ],
)
def test_ctrl_c_outside_the_watch_says_when_it_came(
    when, said, binary_data, tmp_path, monkeypatch, sigterm_restored
):
    """Python's own SIGINT handler raises KeyboardInterrupt before `preemption.watch` takes the
    signal over and after it gives it back; here raised at those two points of an evaluator."""
    from tests.support import run_in_process
    from trainer import task

    watch = preemption.watch

    @contextlib.contextmanager
    def watch_then_ctrl_c(**kwargs):
        with watch(**kwargs) as notice:
            yield notice
        raise KeyboardInterrupt  # just after SIGINT is Python's again

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    if when == "before":
        monkeypatch.setattr(task, "build_config", ctrl_c)
    else:
        monkeypatch.setattr(task.preemption, "watch", watch_then_ctrl_c)
    monkeypatch.setattr(task.evaluator, "run", lambda config, chief: [])
    evaluator = {"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "evaluator"}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(evaluator))
    args = [f"--train_data={binary_data.train}", "--label_column=target"]
    code, stderr = run_in_process([*args, f"--job_dir={tmp_path / 'job'}"])
    assert code == 130
    assert said in stderr


def test_the_previous_handlers_come_back_after_a_normal_end(sigterm_restored):
    def mine(signum, frame):
        pass

    sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, mine)
    with preemption.watch():
        assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGINT) is not sigint
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is sigint


# -- the trainer, a real process ---------------------------------------------------------------
def _args(data, job: Path, steps: int) -> list[str]:
    return [
        f"--train_data={data.train}",
        f"--eval_data={data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=1",
        f"--max_iteration_steps={steps}",
        "--batch_size=32",
        "--steps_per_loop=50",
        # No periodic checkpoint: only the SIGTERM's can explain one in the middle.
        "--checkpoint_every_secs=100000",
    ]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """`python -m trainer.task ARGS`, its output in `log`."""
    return _spawn(["-m", "trainer.task", *args], log)


def _spawn(python_args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, *python_args],
            cwd=REPO,
            env=env or task_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(predicate, process: subprocess.Popen, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert process.poll() is None, f"the trainer ended before {what}"
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout} s"
        time.sleep(0.01)
    return found


def _terminate(process: subprocess.Popen, signum: int = signal.SIGTERM) -> tuple[int, float]:
    """SIGTERM (or `signum`); the exit code and the seconds until the process was gone."""
    sent = time.monotonic()
    os.kill(process.pid, signum)
    try:
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return code, time.monotonic() - sent


def _checkpoint_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1].split(".")[0]) for p in folder.glob("ckpt-*.index"))


@pytest.mark.slow
def test_sigterm_mid_iteration_saves_the_step_reached_and_the_restart_resumes_there(
    binary_data, tmp_path
):
    job, steps = tmp_path / "job", 30_000  # (the first progress line comes 5 s in)
    args = _args(binary_data, job, steps)
    log = tmp_path / "first.log"
    process = _start(args, log)
    try:
        # A progress line: steps are being trained (the first comes 5 s into training).
        progress = _wait_for(
            lambda: re.search(r"iteration 0 step (\d+)/", log.read_text()),
            process,
            "the first progress line",
        )
    finally:
        code, seconds = _terminate(process)
    output = log.read_text()
    assert code == preemption.EXIT_CODE, output[-3000:]
    assert seconds < 10, output[-3000:]  # the notice is ~30 s; here it takes well under 1 s
    assert f"exit code {preemption.EXIT_CODE}" in output
    saved = re.search(r"SIGTERM \(preemption\): saved \S+ at step (\d+) in ([\d.]+) s", output)
    assert saved, output[-3000:]
    step = int(saved.group(1))
    # Training went on after the progress line, the save holds all of it (nothing else
    # checkpointed: checkpoints every 100,000 s), and the iteration was not finished.
    assert int(progress.group(1)) <= step < steps
    assert (step - 1) % 50 == 0  # between loop calls: 1 step, then 50 per call
    folder = job / "checkpoints" / "iteration-0"
    assert _checkpoint_steps(folder) == [step]
    assert f"ckpt-{step}" in (folder / "checkpoint").read_text()
    assert not (job / "checkpoints" / "iteration-0.json").exists()
    assert not (job / "model").exists()

    result = run_task(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(rf"Iteration 0: resumed from \S+ckpt-{step} at step {step}\.", result.stderr)
    report = load_report(job)
    assert report["status"] == "complete"
    assert report["iterations"][0]["steps"] == steps
    assert report["final"]["metrics"]["accuracy"] > 0.9
    assert (job / "model" / "saved_model.pb").exists()
    assert not list(job.rglob("*.tmp-*"))


@pytest.mark.slow
def test_ctrl_c_mid_iteration_saves_the_step_reached_like_sigterm(binary_data, tmp_path):
    job, steps = tmp_path / "job", 30_000
    log = tmp_path / "ctrl_c.log"
    process = _start(_args(binary_data, job, steps), log)
    try:
        _wait_for(
            lambda: re.search(r"iteration 0 step (\d+)/", log.read_text()),
            process,
            "the first progress line",
        )
    finally:
        code, seconds = _terminate(process, signal.SIGINT)
    output = log.read_text()
    assert code == 130, output[-3000:]
    assert seconds < 10, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    saved = re.search(
        r"interrupted: SIGINT [\d.]+ s ago: iteration 0 checkpointed at step (\d+); "
        r"exit code 130",
        output,
    )
    assert saved, output[-3000:]
    step = int(saved.group(1))
    assert 0 < step < steps
    assert _checkpoint_steps(job / "checkpoints" / "iteration-0") == [step]
    assert "Iteration 0: SIGINT (Ctrl-C): saved" in output and "(preemption)" not in output


@pytest.mark.slow
def test_sigterm_during_the_data_scan_stops_at_once_and_writes_nothing(tmp_path):
    # Enough rows that the statistics pass takes a few seconds.
    data = make_data(tmp_path, "binary", n_train=10, n_eval=200)
    big = write_csv(tmp_path / "big_train.csv", HEADER, synthetic_rows("binary", 400_000, 3))
    job = tmp_path / "job"
    args = [*_args(data, job, 500)[1:], f"--train_data={big}"]
    process = _start(args, tmp_path / "scan.log")
    try:
        # The chief has the training file open: the scan before training is under way.
        _wait_for(lambda: _has_open(process.pid, big), process, "the training file opened")
    finally:
        code, seconds = _terminate(process)
    output = (tmp_path / "scan.log").read_text()
    assert code == preemption.EXIT_CODE, output[-3000:]
    assert seconds < 5, output[-3000:]
    assert "nothing to save" in output
    assert "Iteration 0" not in output
    # No schema, no run.json, no checkpoint, no temporary file: nothing at all.
    assert not job.exists() or not list(job.rglob("*")), list(job.rglob("*"))


def _has_open(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
def test_sigterm_after_training_during_the_export_resumes_to_a_complete_model(tmp_path):
    data = make_data(tmp_path, "binary")
    job = tmp_path / "job"
    args = _args(data, job, 300)
    log = tmp_path / "export.log"
    process = _start(args, log)
    try:
        # The last iteration's record is published: selection is over, the export starts.
        _wait_for(
            lambda: (job / "checkpoints" / "iteration-0.json").exists(),
            process,
            "the record of the last iteration",
        )
    finally:
        code, _ = _terminate(process)
    output = log.read_text()
    assert code == preemption.EXIT_CODE, output[-3000:]
    assert "preempted: SIGTERM outside training: nothing to save" in output
    # Stopped before the export was published (it takes seconds), its leftovers unseen.
    assert not (job / "model" / "saved_model.pb").exists()
    assert not (job / "report.json").exists() or load_report(job)["status"] != "complete"

    result = run_task(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Iteration 0: training" not in result.stderr  # the finished iteration is kept
    assert load_report(job)["status"] == "complete"
    assert (job / "model" / "saved_model.pb").exists()
    assert not list(job.rglob("*.tmp-*"))


# -- workers and parameter servers under a coordinator -----------------------------------------
_SERVE = """
import os
from absl import logging
from trainer.distribute import cluster
from trainer.distribute import runtime as distributed
logging.set_verbosity(logging.INFO)
distributed.serve(
    cluster.parse(os.environ["TF_CONFIG"]), timeout_secs=60, grace_secs=60, poll_secs=0.2
)
"""


@pytest.mark.parametrize(
    "chief, code",
    [
        ("runs", preemption.EXIT_CODE),
        # (its data scan): still to be restarted
        pytest.param("never answered", preemption.EXIT_CODE, marks=pytest.mark.slow),
        pytest.param("answered and is gone", 0, marks=pytest.mark.slow),
    ],
)
def test_a_server_stopped_before_its_chief_is_done_exits_to_be_restarted(chief, code, tmp_path):
    """A worker's SIGTERM while its chief runs, or before the chief ever answered, is a
    preemption: non-zero, so that Vertex AI restarts it; once the chief it saw is gone it is
    the end of the job: 0."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if chief != "never answered":
            listener.listen()
        worker, ps = free_ports(2)
        jobs = {
            "chief": [f"127.0.0.1:{listener.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{worker}"],
            "ps": [f"127.0.0.1:{ps}"],
        }
        tf_config = {"cluster": jobs, "task": {"type": "worker", "index": 0}}
        log = tmp_path / "worker.log"
        process = _spawn(["-c", _SERVE], log, env=task_env(TF_CONFIG=json.dumps(tf_config)))
        try:
            # (Its SIGTERM handler is in place before that line.)
            _wait_for(lambda: "serving at" in log.read_text(), process, "the server")
            if chief != "never answered":
                _wait_for(lambda: "The chief answers" in log.read_text(), process, "the chief")
            if chief == "answered and is gone":
                listener.close()
        finally:
            exit_code, seconds = _terminate(process)
    said = log.read_text()
    assert exit_code == code, said[-3000:]
    assert seconds < 30, said[-3000:]  # promptly, not after the 60 s bounds
    if code:
        assert "SIGTERM while the chief" in said
    else:
        assert "SIGTERM after the chief had gone: the job is over" in said


@pytest.mark.slow
def test_a_preempted_chief_of_a_parameter_server_cluster_saves_and_its_restart_resumes(tmp_path):
    """Under parameter servers the chief checkpoints between two chunks it fetches; chunks
    still in flight may add steps before the save reads the counters, never remove any."""
    from tests.distribute.test_distributed import Job, assert_trained
    from trainer.distribute.cluster import ClusterShape

    steps = 30_000  # (about 15 s of training here: the first progress line comes after 5 s)
    extra = ("--max_iterations=1", f"--max_iteration_steps={steps}", "--checkpoint_every_secs=1e5")
    with Job(tmp_path, ClusterShape(workers=2, ps=1), *extra) as job:
        job.wait_for_line("chief", "iteration 0 step")
        chief = job.cluster.process("chief")
        chief.send_signal(signal.SIGTERM)
        assert chief.wait(timeout=30) == preemption.EXIT_CODE
        said = "\n".join(job.cluster.output("chief"))
        saved = re.search(r"SIGTERM \(preemption\): saved \S+ at step (\d+)", said)
        assert saved, said[-3000:]
        step = int(saved.group(1))
        assert 0 < step < steps
        job.cluster.restart("chief")
        assert job.cluster.wait(timeout=400) == 0
        said = "\n".join(job.cluster.output("chief"))
        report = job.report()
    resumed = re.search(rf"Iteration 0: resumed from \S+ckpt-{step} at step (\d+)\.", said)
    assert resumed, said[-3000:]
    assert int(resumed.group(1)) >= step
    assert_trained(report, iterations=1)


@pytest.mark.slow
def test_a_synchronous_replica_stops_at_once_on_sigterm_in_training(tmp_path):
    """A replica of a synchronous cluster cannot checkpoint alone: SIGTERM in training stops it
    at once with 143 (TensorFlow's coordination service, which swallowed the signal with a
    handler of its own, is not used)."""
    from tests.distribute.test_distributed import Job
    from trainer.distribute.cluster import ClusterShape

    extra = ("--max_iterations=1", "--max_iteration_steps=30000")
    with Job(tmp_path, ClusterShape(workers=1), *extra) as job:
        job.wait_for_line("chief", "iteration 0 step")
        chief = job.cluster.process("chief")
        code, seconds = _terminate(chief)
        said = "\n".join(job.cluster.output("chief"))
    assert code == preemption.EXIT_CODE, said[-3000:]
    assert seconds < 10
    assert "preempted: SIGTERM a replica of a synchronous cluster cannot checkpoint alone" in said


@pytest.mark.parametrize(
    "over, code, says",
    [
        ("'evaluator: the job is complete.'", 0, "evaluator: the job is complete."),
        ("None", preemption.EXIT_CODE, "preempted: SIGTERM outside training: nothing to save"),
    ],
)
def test_a_signal_after_the_work_is_over_is_a_normal_end(over, code, says):
    """An evaluator stopped by the cluster's end after a complete job exits 0, saying so; one
    stopped before, as a preempted replica (a restart resumes it)."""
    program = (
        "import os, signal, time\n"
        "from trainer.distribute import preemption\n"
        f"with preemption.watch(ended=lambda: {over}):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == code
    assert says in result.stderr
