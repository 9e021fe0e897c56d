"""deploy.launch: the command line, as parsed and as a real process running
`tests.cluster_task`. Every test stops what it started, pass or fail."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from deploy import launch
from tests.deploy.test_job_spec import write
from tests.support import DUMMY_TASK as DUMMY
from tests.support import REPO, is_alive, kill_quietly, wait_for
from trainer.distribute.cluster import ClusterShape
from trainer.errors import InputError

pytestmark = pytest.mark.timeout(30)

LABELS = ["chief", "worker 0", "worker 1", "ps 0", "evaluator"]


class Launcher:
    """`python -m deploy.launch ...` as a real process, its stdout collected by a thread."""

    def __init__(self, argv: list[str], env: dict | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "deploy.launch", *argv],
            cwd=REPO,
            env=env or dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float = 10.0) -> int:
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()
        return code

    def pids(self) -> list[int]:
        """Pids the launcher reported starting (`[launch] worker 0: pid N, ...`)."""
        return [
            int(m.group(1))
            for line in list(self.lines)
            if (m := re.match(r"\[launch\] .+: pid (\d+),", line))
        ]

    def cleanup(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.pids():
            kill_quietly(pid)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def launcher():
    """Starts launcher processes; at teardown kills them and every process they started."""
    started = []

    def start(*argv: str, env: dict | None = None) -> Launcher:
        started.append(Launcher(list(argv), env))
        return started[-1]

    yield start
    for process in started:
        process.cleanup()


# -- flags ------------------------------------------------------------------------------------


def test_flags_override_the_configs_sizes_and_args():
    config = f"--config={REPO / 'config.yaml'}"
    options = launch.parse_command_line([config, "--workers=1", "--no-evaluator"])
    assert options.shape == ClusterShape(workers=1, ps=1, evaluator=False)
    # config.yaml's containerSpec: its args, and the module the image's entry point runs
    assert options.args == (
        "--placement=replication",
        "--max_iterations=3",
        "--max_iteration_steps=750",
    )
    assert options.module == "trainer.task"
    options = launch.parse_command_line([config, "--ps=0", "--", "--max_iterations=1"])
    assert options.shape == ClusterShape(workers=2, ps=0, evaluator=True)
    assert options.args == ("--max_iterations=1",)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers=-2"], "--workers=-2: the count must be 0 or more"),
        (["--ps=-1"], "--ps=-1: the count must be 0 or more"),
        (["--grace=-1"], "--grace (-1.0) must be >= 0"),
    ],
)
def test_bad_counts_name_the_flag(argv, message):
    with pytest.raises(InputError, match=re.escape(message)):
        launch.parse_command_line(argv)


def test_without_a_config_the_defaults_are_a_lone_trainer_task():
    options = launch.parse_command_line(["--", "--job_dir=x"])
    assert options.shape == ClusterShape() and options.module == "trainer.task"
    assert options.args == ("--job_dir=x",)


@pytest.mark.parametrize(
    "code, shell_code", [(0, 0), (3, 3), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143)]
)
def test_a_chief_killed_by_a_signal_exits_like_a_shell(code, shell_code):
    assert launch._exit_code(code) == shell_code


# -- the command line, as a real process ------------------------------------------------------


def test_cli_prefixes_every_line_and_exits_with_the_chiefs_code(launcher):
    run = launcher(
        "--workers=2",
        "--ps=1",
        "--evaluator",
        f"--module={DUMMY}",
        "--",
        "--stderr",
        "--exit_code=3",
        "--sleep=0.3",
    )
    assert run.wait() == 3
    prefixes = tuple(f"[{label}] " for label in [*LABELS, "launch"])
    assert [line for line in run.lines if not line.startswith(prefixes)] == []
    for label in LABELS:
        assert f"[{label}] ready" in run.lines
        assert (
            f"[{label}] {label.replace('chief', 'chief 0').replace('evaluator', 'evaluator 0')}"
            " on stderr" in run.lines
        )
    assert "[launch] chief exited with code 3" in run.lines


def test_cli_stops_every_process_when_the_chief_ends(launcher):
    run = launcher("--workers=2", "--ps=1", "--evaluator", f"--module={DUMMY}", "--", "--sleep=0.5")
    assert run.wait() == 0
    pids = run.pids()
    assert len(pids) == 5
    assert [pid for pid in pids if is_alive(pid)] == []


@pytest.mark.parametrize("to_a_thread", [False, True], ids=["to-the-process", "to-a-thread"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_stops_everything_on_a_signal(launcher, sig, to_a_thread):
    """Also when the kernel hands the signal to one of the launcher's threads (a kill(2) of a
    thread's id offers it to that thread first) while its main thread waits for the chief."""
    run = launcher("--workers=1", "--ps=1", "--evaluator", f"--module={DUMMY}", "--", "--sleep=-1")
    wait_for(
        lambda: sum(line.endswith("] ready") for line in run.lines) == 4, what="all four tasks"
    )
    pids = run.pids()
    assert all(is_alive(pid) for pid in pids)
    if to_a_thread:
        threads = sorted(int(t) for t in os.listdir(f"/proc/{run.process.pid}/task"))
        assert len(threads) > 1, "the launcher reads its tasks' output in threads"
        os.kill(threads[-1], sig)
    else:
        run.process.send_signal(sig)
    assert run.wait() == 128 + sig
    assert [pid for pid in pids if is_alive(pid)] == []
    assert f"[launch] {signal.Signals(sig).name}: stopping the cluster" in run.lines


def test_cli_runs_the_cluster_where_only_it_reaches_its_servers(launcher, private_network):
    """The tasks listen on every interface, as TensorFlow's servers do, but of a private network
    namespace: nothing on this machine's network answers on their ports."""
    from tests.deploy.test_local_cluster import listening

    run = launcher("--workers=1", "--ps=1", f"--module={DUMMY}", "--", "--listen", "--sleep=-1")
    wait_for(lambda: sum(line.endswith("] ready") for line in run.lines) == 3, what="all tasks")
    assert any(line.startswith("[launch] network: private") for line in run.lines)
    ports = [
        int(m.group(1)) for line in run.lines if (m := re.search(r"pid \d+, [\d.]+:(\d+)$", line))
    ]
    assert len(ports) == 3
    assert [port for port in ports if listening(port)] == []
    for pid, port in zip(run.pids(), ports):
        assert listening(port, pid) == ["0.0.0.0"]


def test_cli_without_namespaces_refuses_a_private_network_naming_the_way_out(launcher, tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no unshare, no nsenter
    run = launcher("--workers=1", "--network=private", f"--module={DUMMY}", env=env)
    assert run.wait() == 2
    assert "no private network namespace for the cluster" in run.stderr
    assert "--network=host runs it on this machine's network" in run.stderr
    assert run.pids() == []


def test_cli_blames_the_network_only_for_the_network():
    """Another failure to start the cluster (here too many open files, with the host network)
    is not answered with the private network's way out."""
    import resource

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.launch",
            "--workers=30",
            "--network=host",
            f"--module={DUMMY}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=few_files,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Too many open files" in result.stderr
    assert "--network=host runs it" not in result.stderr


def test_cli_takes_sizes_and_args_from_the_config(launcher, tmp_path):
    path = write(
        tmp_path,
        "workerPoolSpecs:\n"
        "  - {replicaCount: 1, pythonPackageSpec: {pythonModule: tests.cluster_task,"
        " args: [--exit_code=4, --sleep=0.2]}}\n"
        "  - {replicaCount: 2, pythonPackageSpec: {pythonModule: tests.cluster_task}}\n",
    )
    run = launcher(f"--config={path}")
    assert run.wait() == 4
    assert {"[worker 0] ready", "[worker 1] ready", "[chief] ready"} <= set(run.lines)
    assert not any(line.startswith("[ps") for line in run.lines)


def test_cli_refuses_a_bad_config_before_starting_anything(launcher, tmp_path):
    path = write(tmp_path, "workerPoolSpecs:\n  - {replicaCount: 3, containerSpec: {}}\n")
    run = launcher(f"--config={path}", f"--module={DUMMY}")
    assert run.wait() == 2
    assert "replicaCount (3) must be 1" in run.stderr
    assert run.lines == [] and run.pids() == []


def test_the_retired_trainer_launch_names_the_command_that_replaced_it():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers=2", "--", "--max_steps=5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "python -m deploy.launch --workers=2 -- --max_steps=5" in result.stderr
