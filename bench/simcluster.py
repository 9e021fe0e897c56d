"""A simulated cluster for benchmarks: every replica a host of its own, with a fixed CPU budget
and, optionally, a link of fixed bandwidth. Needs root; no test uses it.

On a machine of a few cores a local cluster's processes share the cores, so it cannot say what
more workers buy. Here each replica of a `LocalCluster` gets, from Linux itself:

- CPU: a cgroup v1 `cpu` group whose CFS quota is `cores` of a core (`cpu.cfs_quota_us`), and
  a `cpuacct` group that counts the CPU time it used; TensorFlow's thread pools are sized to it
  (`TF_NUM_INTRAOP_THREADS`, `TF_NUM_INTEROP_THREADS`).
- network (with `link_mbit`): a network namespace of its own whose one interface `eth0` is a
  veth pair's end; the other end is on a bridge in a "switch" namespace, and a token bucket
  (the `tbf` qdisc) on each end holds each direction to `link_mbit`. The replicas reach each
  other at 10.77.0.N:2222 (Vertex's port), and nothing else reaches them. No delay is added:
  the `netem` qdisc is absent from this kernel, and a veth hop adds tens of microseconds, under
  a Vertex zone's round trip of about 0.1-0.2 ms. Each interface's byte counters give what a
  replica sent and received.

What a replica's link should be: `vertex_link_mbit`, the compute-to-network ratio of a Vertex
worker (module constants: an n2-standard-8, 8 vCPUs, with its 16 Gbit/s egress), with one of
these cores counted as one vCPU.

Everything is named `adnsim-<pid>-...` after the process that made it. Leaving the
`SimulatedCluster` block removes its groups and namespaces (stopping what still runs in them),
also on SIGTERM and Ctrl-C when the bench turns them into `SystemExit` (`exit_on_signals`);
one killed outright leaves them behind, and the next `SimulatedCluster` (or
`python bench/simcluster.py --clean`) removes every one whose maker is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from trainer.distribute.cluster import ClusterShape, Task

PREFIX = "adnsim"
CGROUPS = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "cpuacct")
PERIOD_US = 100_000
SUBNET = "10.77.0"
PORT = 2222  # Vertex AI's: every replica listens on it, each in its own namespace
# A Vertex AI worker the simulation stands for: n2-standard-8's vCPUs and its egress bandwidth.
VERTEX_VCPUS = 8
VERTEX_LINK_MBIT = 16_000.0
# tbf's bucket: enough for a few full-size packets at any of these rates; its queue limit.
TBF_BURST = "256kb"
TBF_LATENCY = "100ms"


class NotAvailable(RuntimeError):
    """This machine (or user) cannot simulate a cluster: the message says why and what to do."""


def vertex_link_mbit(cores: float) -> float:
    """The link of a replica of `cores` cores whose compute-to-network ratio is a Vertex
    n2-standard-8's: 16 Gbit/s for 8 vCPUs, one core here counted as one vCPU. (TensorFlow on 8
    vCPUs trains less than 8 times one core's examples/s, so the real link is, if anything,
    larger per example than this.)"""
    return VERTEX_LINK_MBIT * cores / VERTEX_VCPUS


@dataclasses.dataclass(frozen=True)
class Budget:
    """What every replica gets: `cores` of CPU time (a quota, not a pinning), TensorFlow's
    intra-op pool of `threads`, and with `link_mbit` a link of its own at that rate each
    way (None: the replicas share the private loopback namespace of `LocalCluster`)."""

    cores: float
    link_mbit: float | None = None
    threads: int = 1

    def __post_init__(self):
        if not 0.01 <= self.cores <= (os.cpu_count() or 1):
            raise ValueError(f"cores ({self.cores}) must be within [0.01, this machine's cores].")
        if self.link_mbit is not None and not self.link_mbit > 0:
            raise ValueError(f"link_mbit ({self.link_mbit}) must be > 0, or None.")
        if self.threads < 1:
            raise ValueError(f"threads ({self.threads}) must be >= 1.")


def check_available() -> None:
    """Raises NotAvailable saying why this machine cannot run a simulated cluster."""
    if os.geteuid() != 0:
        raise NotAvailable(
            "a simulated cluster needs root (cgroup CPU quotas, network namespaces): run the "
            "benchmark as root, or without --simulate."
        )
    for controller in CONTROLLERS:
        if not os.path.exists(os.path.join(CGROUPS, controller, "cgroup.procs")):
            raise NotAvailable(
                f"no cgroup v1 '{controller}' controller at {CGROUPS}/{controller}: this "
                "simulation needs the v1 cpu and cpuacct hierarchies."
            )
    if not shutil.which("ip") or not shutil.which("tc"):
        raise NotAvailable("`ip` and `tc` are not on PATH: apt-get install iproute2.")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _remove_group(path: str) -> None:
    """Kills what still runs in the cgroup and removes it."""
    for _ in range(50):
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(path)
                return
            except OSError:  # busy: the killed processes are not reaped yet
                time.sleep(0.1)
                continue
        return
    raise RuntimeError(f"could not remove the cgroup {path}: processes stay in it")


def _namespaces() -> list[str]:
    listing = _run("ip", "netns", "list")
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _remove_namespace(name: str) -> None:
    with contextlib.suppress(RuntimeError):
        for pid in _run("ip", "netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(RuntimeError):
        _run("ip", "netns", "delete", name)


def clean_stale() -> list[str]:
    """Removes the groups and namespaces of simulations whose maker is gone; returns them."""
    pattern = re.compile(rf"^{PREFIX}-(\d+)-")
    removed = []
    for controller in CONTROLLERS:
        base = os.path.join(CGROUPS, controller)
        for name in sorted(os.listdir(base)):
            match = pattern.match(name)
            if match and not _alive(int(match.group(1))):
                _remove_group(os.path.join(base, name))
                removed.append(f"{controller}/{name}")
    for name in _namespaces():
        match = pattern.match(name)
        if match and not _alive(int(match.group(1))):
            _remove_namespace(name)
            removed.append(f"netns {name}")
    return removed


_serial = 0


class SimulatedCluster:
    """The hosts of one cluster: per task, a CPU group and, with a link, a namespace.

    Pass `addresses` (None without links: LocalCluster then picks loopback ports), `prefix`
    and `environment(base)` to the `LocalCluster` of the same shape, started inside this block:

        with SimulatedCluster(shape, Budget(0.25, link_mbit=500)) as sim:
            with LocalCluster(shape, addresses=sim.addresses, prefix=sim.prefix,
                              env=sim.environment(os.environ)) as cluster:
                cluster.wait()
            usage = sim.usage()   # CPU seconds, throttling, bytes sent and received
    """

    def __init__(self, shape: ClusterShape, budget: Budget):
        global _serial
        _serial += 1
        self.shape = shape
        self.budget = budget
        self.tasks = shape.tasks()
        self.name = f"{PREFIX}-{os.getpid()}-{_serial}"
        self._groups: list[str] = []
        self._namespaces: list[str] = []
        self._start_counters: dict[Task, dict[str, int]] = {}

    # -- names
    def _slug(self, task: Task) -> str:
        return task.label.replace(" ", "")

    def group(self, controller: str, task: Task) -> str:
        return os.path.join(CGROUPS, controller, f"{self.name}-{self._slug(task)}")

    def namespace(self, task: Task) -> str:
        return f"{self.name}-{self._slug(task)}"

    @property
    def switch(self) -> str:
        return f"{self.name}-switch"

    def ip(self, task: Task) -> str:
        return f"{SUBNET}.{self.tasks.index(task) + 1}"

    # -- what LocalCluster is given
    @property
    def addresses(self) -> dict[Task, str] | None:
        if self.budget.link_mbit is None or self.shape.is_single_process:
            return None
        return {task: f"{self.ip(task)}:{PORT}" for task in self.tasks}

    def prefix(self, task: Task) -> list[str]:
        """The words that put `task`'s process in its CPU groups (and namespace), then exec."""
        words = [
            "sh",
            "-c",
            'echo $$ > "$0/cgroup.procs" && echo $$ > "$1/cgroup.procs" && shift && exec "$@"',
            self.group("cpu", task),
            self.group("cpuacct", task),
        ]
        if self.addresses is not None:
            words += ["ip", "netns", "exec", self.namespace(task)]
        return words

    def environment(self, base: dict[str, str] | os._Environ) -> dict[str, str]:
        """`base` with TensorFlow's pools sized to the budget and the replicas' addresses out of
        any proxy."""
        env = dict(base)
        env["TF_NUM_INTRAOP_THREADS"] = str(self.budget.threads)
        env["TF_NUM_INTEROP_THREADS"] = str(max(2, self.budget.threads))
        if self.addresses is not None:
            hosts = [address.split(":")[0] for address in self.addresses.values()]
            current = env.get("no_proxy") or env.get("NO_PROXY") or ""
            env["no_proxy"] = env["NO_PROXY"] = ",".join(filter(None, [current, *hosts]))
        return env

    # -- making and removing
    def __enter__(self) -> SimulatedCluster:
        check_available()
        clean_stale()
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make(self) -> None:
        quota = max(1000, round(self.budget.cores * PERIOD_US))
        for task in self.tasks:
            for controller in CONTROLLERS:
                path = self.group(controller, task)
                os.mkdir(path)
                self._groups.append(path)
            cpu = self.group("cpu", task)
            for name, value in (("cpu.cfs_period_us", PERIOD_US), ("cpu.cfs_quota_us", quota)):
                with open(os.path.join(cpu, name), "w") as f:
                    f.write(str(value))
        if self.addresses is None:
            return
        rate = f"{self.budget.link_mbit:g}mbit"
        _run("ip", "netns", "add", self.switch)
        self._namespaces.append(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, task in enumerate(self.tasks):
            ns, port = self.namespace(task), f"p{i}"
            _run("ip", "netns", "add", ns)
            self._namespaces.append(ns)
            _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
                 "eth0", "netns", ns)  # fmt: skip
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(task)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for where, device in ((ns, "eth0"), (self.switch, port)):  # each direction
                _run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", device, "root",
                     "tbf", "rate", rate, "burst", TBF_BURST, "latency", TBF_LATENCY)  # fmt: skip
        self._start_counters = {task: self._link_bytes(task) for task in self.tasks}

    def close(self) -> None:
        """Removes the groups and namespaces (stopping what still runs in them)."""
        for path in reversed(self._groups):
            with contextlib.suppress(FileNotFoundError):
                _remove_group(path)
        self._groups.clear()
        for ns in reversed(self._namespaces):
            _remove_namespace(ns)
        self._namespaces.clear()

    # -- what was used
    def _link_bytes(self, task: Task) -> dict[str, int]:
        shown = json.loads(
            _run("ip", "-n", self.namespace(task), "-s", "-j", "link", "show", "eth0")
        )
        stats = shown[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}

    def usage(self) -> dict[str, dict[str, float]]:
        """Per task label: CPU seconds used and seconds held back by the quota, and with links
        the bytes sent and received since the links were made."""
        used = {}
        for task in self.tasks:
            with open(os.path.join(self.group("cpuacct", task), "cpuacct.usage")) as f:
                cpu_s = int(f.read()) / 1e9
            with open(os.path.join(self.group("cpu", task), "cpu.stat")) as f:
                stat = dict(line.split() for line in f if line.strip())
            row: dict[str, float] = {
                "cpu_s": cpu_s,
                "throttled_s": int(stat["throttled_time"]) / 1e9,
                "throttled_periods": int(stat["nr_throttled"]),
            }
            if self.addresses is not None:
                now, start = self._link_bytes(task), self._start_counters[task]
                row.update({key: now[key] - start[key] for key in now})
            used[task.label] = row
        return used


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end this process as SystemExit (as Ctrl-C's KeyboardInterrupt does),
    so `with` blocks remove what they made."""

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove what dead runs left")
    args = parser.parse_args()
    try:
        check_available()
    except NotAvailable as e:
        sys.exit(f"simcluster: {e}")
    if args.clean:
        removed = clean_stale()
        print("\n".join(removed) if removed else "nothing left behind")
        return
    shape = ClusterShape(workers=2, ps=1)
    with SimulatedCluster(shape, Budget(0.2, link_mbit=vertex_link_mbit(0.2))) as sim:
        print(f"made {sim.name}: {', '.join(t.label for t in sim.tasks)}")
        print(json.dumps(sim.usage(), indent=1))


if __name__ == "__main__":
    main()
