"""A cluster of real processes on this machine, shaped like a Vertex AI job.

`LocalCluster` starts a chief, N workers, M parameter servers and optionally an evaluator as
separate processes (`python -m MODULE ARGS`, the same arguments for every process, as on
Vertex) on 127.0.0.1 with free ports. Each gets `TF_CONFIG` and `CLUSTER_SPEC` in Vertex's
shapes, `GRPC_FAIL_FAST=use_caller` and loopback in `no_proxy`. A lone chief gets no
`TF_CONFIG`, as on a single-replica Vertex job. Output lines are prefixed with the role
(`[worker 0] `). `python -m deploy.launch` is its command line; tests and benchmarks use it
directly:

    with LocalCluster(ClusterShape(workers=2, ps=1), args=["--max_iterations=1"]) as cluster:
        cluster.process("worker", 0).kill()
        cluster.restart("worker", 0)       # same port, same TF_CONFIG
        code = cluster.wait(timeout=600)

The network. TensorFlow's gRPC server listens on every interface whatever address TF_CONFIG
gives it (TF 2.17 `GrpcServer::Init` binds `0.0.0.0:PORT`; `ServerDef` sets only the port), and
it runs any operation it is sent, without authentication. So the processes run in a network
namespace of their own that has only a loopback interface (`network="private"`): their
servers are reachable from the cluster alone, not from this machine's other programs or its
network. A small holder process (`unshare --net`, with `--user --map-root-user` when not root)
keeps the namespace and brings its loopback up; every task enters it with `nsenter` (no fork:
the pid is the task's). Such a cluster reaches nothing outside, so a job that needs the network
(a `gs://` or `bq://` path, Vertex AI Experiments: `network_needs`) runs on this machine's
network (`network="host"`), as does every cluster where namespaces are not available (a
container without the privilege, no util-linux); the launcher says so and why.

A caller that builds the network itself (`bench/simcluster.py`: a namespace per replica, with a
rate-limited link each, and a CPU quota per replica) gives every task's address and the words
that put a task's process in its place (`addresses`, `prefix`): the cluster then runs on the
caller's network (`network="caller"`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TextIO

from deploy.local.library_lines import LibraryLines
from deploy.local.network import Namespace, PrivateNetworkUnavailable, network_needs
from trainer.distribute.cluster import CHIEF, EVALUATOR, ClusterShape, Task

DEFAULT_MODULE = "trainer.task"
DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost")
# Where the processes' servers can be reached from: `PRIVATE`, a network namespace with only
# loopback (the cluster alone); `HOST`, this machine's network; `AUTO`, private when the job
# needs no network and namespaces are available.
# `CALLER`, the addresses the caller gives (set by passing them, not chosen).
AUTO, PRIVATE, HOST, CALLER = "auto", "private", "host", "caller"
NETWORKS = (AUTO, PRIVATE, HOST)
# Variables the launcher sets per process; inherited values would mislead the processes.
_CLUSTER_VARIABLES = ("TF_CONFIG", "CLUSTER_SPEC")


# -- what each process is told ----------------------------------------------------------------


def tf_config(addresses: dict[Task, str], task: Task) -> dict:
    """`TF_CONFIG` for `task` in Vertex's shape.

    `cluster` lists chief, workers and ps (empty roles omitted) and never the evaluator; the
    evaluator only learns its role from `task`.
    """
    cluster: dict[str, list[str]] = {}
    for other in sorted(addresses, key=lambda t: (t.pool, t.index)):
        if other.role != EVALUATOR:
            cluster.setdefault(other.role, []).append(addresses[other])
    return {
        "cluster": cluster,
        "task": {"type": task.role, "index": task.index},
        "environment": "cloud",
    }


def cluster_spec(addresses: dict[Task, str], task: Task) -> dict:
    """`CLUSTER_SPEC` for `task` in Vertex's shape: the cluster keyed `workerpool0..3`,
    the evaluator's pool included."""
    cluster: dict[str, list[str]] = {}
    for other in sorted(addresses, key=lambda t: (t.pool, t.index)):
        cluster.setdefault(f"workerpool{other.pool}", []).append(addresses[other])
    return {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": f"workerpool{task.pool}", "index": task.index},
    }


def with_loopback_no_proxy(no_proxy: str | None) -> str:
    """`no_proxy` with 127.0.0.1 and localhost appended (gRPC honours proxy variables, and a
    cluster whose traffic goes into a proxy hangs)."""
    entries = [e.strip() for e in (no_proxy or "").split(",") if e.strip()]
    return ",".join(entries + [h for h in LOOPBACK_NO_PROXY if h not in entries])


def task_environment(
    base: dict[str, str], addresses: dict[Task, str] | None, task: Task
) -> dict[str, str]:
    """The environment of one process: `base` plus the cluster variables.

    `addresses=None` is a lone chief: no TF_CONFIG or CLUSTER_SPEC, even if `base` has them.
    """
    env = {k: v for k, v in base.items() if k not in _CLUSTER_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the launcher as they are printed
    env["GRPC_FAIL_FAST"] = "use_caller"
    no_proxy = with_loopback_no_proxy(base.get("no_proxy") or base.get("NO_PROXY"))
    env["no_proxy"] = env["NO_PROXY"] = no_proxy
    if addresses is not None:
        env["TF_CONFIG"] = json.dumps(tf_config(addresses, task))
        env["CLUSTER_SPEC"] = json.dumps(cluster_spec(addresses, task))
    return env


def free_ports(count: int, host: str = DEFAULT_HOST) -> list[int]:
    """`count` distinct ports that are free on `host` right now.

    All sockets stay bound until every port is chosen, so the kernel cannot hand out one port
    twice; they are closed on return, just before the processes start. A process that binds
    its port much later (TensorFlow imports for seconds) can in rare cases lose it to another
    program; the kernel picks bind(0) ports at random, which makes that unlikely.
    """
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]


# -- the processes ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Launch:
    """One start of one task's process; `stopping` is set when the launcher ends it."""

    process: subprocess.Popen
    reader: threading.Thread | None = None
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)


def exit_description(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to the process's group (it leads its own session), ignoring gone ones."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


class LocalCluster:
    """Chief, workers, ps and an evaluator as processes on loopback, like a Vertex AI job.

    Every process runs `python -m MODULE ARGS` with its own TF_CONFIG; ports are chosen once,
    so a restarted task keeps its address (Vertex restarts a replica under the same hostname).
    With `network` `private` (or `auto` and a job that needs no network) they share a network
    namespace with only loopback (see the module doc). With `addresses` (every task's
    `host:port`) they run where the caller put them: `prefix(task)` gives the words that start
    each process there (e.g. entering its namespace and CPU group), before `python -m`. Use as
    a context manager: leaving the block stops every process.

    Example:
        with LocalCluster(ClusterShape(workers=1, ps=1), module="trainer.task") as cluster:
            code = cluster.wait()
    """

    def __init__(
        self,
        shape: ClusterShape,
        *,
        module: str = DEFAULT_MODULE,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        sink: TextIO | None = sys.stdout,
        grace: float = 5.0,
        host: str = DEFAULT_HOST,
        network: str = AUTO,
        addresses: Mapping[Task, str] | None = None,
        prefix: Callable[[Task], Sequence[str]] | None = None,
        library_log: IO[str] | None = None,
    ):
        # -- what runs
        self.shape = shape
        self.module = module
        self.args = tuple(args)
        self.cwd = cwd
        # -- how it is watched
        self.sink = sink  # where prefixed lines go (None: only collected)
        # Where TensorFlow's own log lines go instead of `sink` (`library_lines`); None: to the
        # sink with the others. `library_count` counts them.
        self.library_log = library_log
        self.library_count = 0
        self.grace = grace
        self.host = host
        if network not in NETWORKS:
            raise ValueError(f"network {network!r} is not one of {', '.join(NETWORKS)}.")
        if addresses is not None and set(addresses) != set(shape.tasks()):
            raise ValueError(
                f"addresses name {sorted(t.label for t in addresses)}, the cluster's tasks are "
                f"{[t.label for t in shape.tasks()]}."
            )
        self._given_addresses = dict(addresses) if addresses is not None else None
        self._prefix = prefix
        self.requested_network = CALLER if addresses is not None else network
        self.network: str | None = None  # where it runs once started: PRIVATE, HOST or CALLER
        self._namespace: Namespace | None = None
        self._stopped = False
        self._base_env = dict(os.environ if env is None else env)
        self._addresses: dict[Task, str] | None = None
        self._launches: dict[Task, _Launch] = {}
        self._lines: dict[Task, list[str]] = {t: [] for t in shape.tasks()}
        self._write_lock = threading.Lock()
        self._chief_done = threading.Event()
        self._readers: list[threading.Thread] = []

    # -- context manager
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addresses and environments
    @property
    def addresses(self) -> dict[Task, str]:
        """`host:port` of every task (empty for a lone chief, which needs no port)."""
        return dict(self._addresses or {})

    def environment(self, role: str, index: int = 0) -> dict[str, str]:
        """The environment the task's process is started with."""
        return task_environment(self._base_env, self._addresses, self._task(role, index))

    def _task(self, role: str, index: int) -> Task:
        task = Task(role, index)
        if task not in self._lines:
            raise KeyError(f"{task.label} is not in this cluster ({self.shape}).")
        return task

    # -- starting
    def start(self) -> None:
        """Chooses ports and starts every process; on a failure stops the ones started."""
        if self._stopped:
            raise RuntimeError("the cluster is stopped; start a new LocalCluster.")
        if self._launches:
            raise RuntimeError("the cluster is already started; use restart() for one task.")
        tasks = self.shape.tasks()
        if self._given_addresses is not None:
            self._addresses = dict(self._given_addresses)
        elif not self.shape.is_single_process:
            ports = free_ports(len(tasks), self.host)
            self._addresses = {t: f"{self.host}:{p}" for t, p in zip(tasks, ports)}
        try:
            self._choose_network()
            for task in tasks:
                self._spawn(task)
        except BaseException:
            self.stop()
            raise

    def _choose_network(self) -> None:
        """Makes the private namespace, or says why the cluster runs on this machine's network;
        sets `network`.

        Raises:
            PrivateNetworkUnavailable: `network="private"` and no namespace could be made.
        """
        requested = self.requested_network
        if requested == CALLER:
            self.network = CALLER
            self.log("network: the caller's (every task at the address it was given)")
            return
        if requested == HOST or self.shape.is_single_process:  # (no server, nothing to hide)
            self.network = HOST
            return
        why = None
        if self.host not in LOOPBACK_NO_PROXY:
            why = f"the tasks listen on {self.host}, not on loopback"
        elif requested == AUTO:
            why = network_needs(self.args, self._base_env)
        if why is None:
            try:
                self._namespace = Namespace.start()
            except PrivateNetworkUnavailable as e:
                if requested == PRIVATE:
                    raise PrivateNetworkUnavailable(
                        f"no private network namespace for the cluster: {e}"
                    ) from None
                why = f"no private network namespace ({e})"
        if self._namespace is not None:
            self.network = PRIVATE
            self.log(
                "network: private (a namespace with only loopback: the TensorFlow servers, "
                "which listen on every interface, are reachable from this cluster alone)"
            )
            return
        self.network = HOST
        self.log(
            f"warning: network: this machine's, as {why}. TensorFlow's servers listen on every "
            "interface (0.0.0.0), unauthenticated: whoever can reach this machine's ports can "
            "run operations in them. Run on a trusted network or behind a firewall."
        )

    def _spawn(self, task: Task) -> subprocess.Popen:
        env = task_environment(self._base_env, self._addresses, task)
        # Each process leads its own session, so a Ctrl-C in the terminal reaches only the
        # launcher, which then stops them all in order (and their children with them).
        enter = self._namespace.enter if self._namespace else []
        if self._prefix is not None:
            enter = [*enter, *self._prefix(task)]
        process = subprocess.Popen(
            [*enter, sys.executable, "-m", self.module, *self.args],
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        launch = _Launch(process)
        self._launches[task] = launch
        address = self._addresses[task] if self._addresses else "no TF_CONFIG"
        self.log(f"{task.label}: pid {process.pid}, {address}")
        launch.reader = threading.Thread(
            target=self._read, args=(task, launch), name=f"read {task.label}", daemon=True
        )
        self._readers.append(launch.reader)
        launch.reader.start()
        return process

    # -- output
    def log(self, message: str) -> None:
        """Writes a launcher message (`[launch] ...`) to the sink."""
        self._emit(f"[launch] {message}")

    def _keep_library_line(self, line: str) -> None:
        assert self.library_log is not None
        # As in `_emit`: the pipes are drained whatever happens to the file.
        with self._write_lock, contextlib.suppress(OSError, ValueError):
            self.library_count += 1
            self.library_log.write(line + "\n")

    def _emit(self, line: str) -> None:
        if self.sink is None:
            return
        with self._write_lock:
            try:
                self.sink.write(line + "\n")
                self.sink.flush()
            except (OSError, ValueError):
                pass  # a closed sink must not stop the draining of the pipes

    def _read(self, task: Task, launch: _Launch) -> None:
        """Prefixes and forwards every line of one process, then reports an early exit."""
        stdout = launch.process.stdout
        assert stdout is not None, "processes are started with stdout=PIPE"
        library = LibraryLines()
        for raw in iter(stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._lines[task].append(line)
            if self.library_log is not None and library.is_library(line):
                self._keep_library_line(f"[{task.label}] {line}")
            else:
                self._emit(f"[{task.label}] {line}")
        stdout.close()
        code = launch.process.wait()
        if task.role != CHIEF and not launch.stopping.is_set() and not self._chief_done.is_set():
            if code:
                self.log(
                    f"{task.label} failed with {exit_description(code)} before the chief "
                    "ended; the others keep running (the chief may recover)."
                )
            else:
                self.log(f"{task.label} finished (exit 0) before the chief ended.")

    def output(self, role: str, index: int = 0) -> list[str]:
        """Every line the task has printed so far (stdout and stderr, all its starts)."""
        return list(self._lines[self._task(role, index)])

    # -- the processes
    def process(self, role: str, index: int = 0) -> subprocess.Popen:
        """The task's current process (for pids, signals and return codes)."""
        task = self._task(role, index)
        if task not in self._launches:
            raise RuntimeError(f"{task.label} has not been started; call start() first.")
        return self._launches[task].process

    def restart(self, role: str, index: int = 0) -> subprocess.Popen:
        """Starts the task again with the same port and TF_CONFIG, stopping it first if it
        still runs. Returns the new process."""
        task = self._task(role, index)
        old = self._launches.get(task)
        if old is None:
            raise RuntimeError(f"{task.label} has not been started; call start() first.")
        if self._stopped:
            raise RuntimeError(
                f"the cluster is stopped (its private network with it): {task.label} cannot "
                "restart; start a new LocalCluster."
            )
        self._terminate([old])
        self.log(f"restarting {task.label}")
        return self._spawn(task)

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the chief to exit and returns its exit code (negative: killed by that
        signal). Other processes keep running until stop().

        Raises:
            TimeoutError: the chief still runs after `timeout` seconds.
        """
        # Popen.wait polls with a finite timeout and blocks in waitpid without one, where a
        # SIGTERM or Ctrl-C delivered to a reader thread would run no handler until the chief
        # exits: a finite timeout always.
        chief = self.process(CHIEF)
        try:
            code = chief.wait(math.inf if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the chief still runs after {timeout} s.") from None
        self._chief_done.set()
        return code

    def stop(self) -> None:
        """Stops every process (SIGTERM, SIGKILL after `grace` seconds), drains output and ends
        the private network; the cluster cannot start or restart a task again."""
        self._stopped = True
        self._chief_done.set()
        running = [launch for launch in self._launches.values() if launch.process.poll() is None]
        if running:
            self.log(f"stopping {len(running)} process(es)")
        self._terminate(list(self._launches.values()))
        for reader in self._readers:
            reader.join(timeout=self.grace)
        if self._namespace is not None:
            self._namespace.stop()
            self._namespace = None

    def _terminate(self, launches: list[_Launch]) -> None:
        """SIGTERM to each process group, then SIGKILL to those alive after `grace` seconds."""
        for launch in launches:
            launch.stopping.set()
            if launch.process.poll() is None:
                _signal_group(launch.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for launch in launches:
            with contextlib.suppress(subprocess.TimeoutExpired):
                launch.process.wait(max(0.0, deadline - time.monotonic()))
        for launch in launches:
            if launch.process.poll() is None:
                _signal_group(launch.process, signal.SIGKILL)
                launch.process.wait()
            # The group may hold children that outlived their leader.
            _signal_group(launch.process, signal.SIGKILL)
