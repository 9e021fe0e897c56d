"""A local cluster in one command, shaped like a Vertex AI job.

    python -m deploy.launch [--workers=N] [--ps=M] [--evaluator] [--config=config.yaml]
                             [--module=trainer.task] [--grace=SECONDS]
                             [--network=auto|private|host] [--verbose] -- TRAINER_ARGS...

Starts a chief, N workers, M parameter servers and optionally an evaluator as separate
processes (`python -m MODULE TRAINER_ARGS`, the same arguments for every process, as on Vertex)
on 127.0.0.1 with free ports. Each gets `TF_CONFIG` and `CLUSTER_SPEC` in Vertex's shapes,
`GRPC_FAIL_FAST=use_caller` and loopback in `no_proxy`. A lone chief gets no `TF_CONFIG`, as
on a single-replica Vertex job. Output lines are prefixed with the role (`[worker 0] `);
TensorFlow's own log lines (`deploy.local.library_lines`: most of a successful
run's output) go to a temporary file, named at the end, unless `--verbose`.
TensorFlow's servers listen on every interface, so the processes run in a network namespace
with only loopback, unless the job needs the network (`gs://`, `bq://`, an experiment) or
`--network=host` (see `deploy.local.cluster`).
When the chief ends, every other process is stopped (SIGTERM, then SIGKILL after `--grace`
seconds) and the launcher exits with the chief's exit code; Ctrl-C or SIGTERM stops them all
and exits with 128 + the signal number.

The processes are `deploy.local.cluster.LocalCluster`; `--config` is read by
`deploy.vertex.job_spec`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
from collections.abc import Sequence

from deploy.local.cluster import (
    AUTO,
    DEFAULT_MODULE,
    NETWORKS,
    LocalCluster,
    PrivateNetworkUnavailable,
    exit_description,
)
from deploy.vertex.job_spec import read_job_config
from trainer.distribute.cluster import ClusterShape
from trainer.errors import InputError


class _Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.launch",
        usage="%(prog)s [--workers=N] [--ps=M] [--evaluator] [--config=config.yaml] "
        "[--module=trainer.task] [--grace=SECONDS] [--network=auto|private|host] [--verbose] "
        "-- TRAINER_ARGS...",
        description="Runs a chief, workers, parameter servers and an evaluator as local "
        "processes with Vertex AI's TF_CONFIG; stops them all when the chief ends "
        "and exits with its code.",
    )
    parser.add_argument(
        "--workers", type=int, help="Workers (default: the config's pool 1, else 0)."
    )
    parser.add_argument(
        "--ps", type=int, help="Parameter servers (default: the config's pool 2, else 0)."
    )
    parser.add_argument(
        "--evaluator",
        action=argparse.BooleanOptionalAction,
        help="Start an evaluator (default: if the config's pool 3 has one).",
    )
    parser.add_argument(
        "--config",
        help="A Vertex AI CustomJobSpec in YAML (config.yaml): pool "
        "sizes, and the chief's args when no TRAINER_ARGS are given.",
    )
    parser.add_argument(
        "--module",
        help=f"Python module each process runs (default: the "
        f"config's pythonModule, else {DEFAULT_MODULE}).",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="Seconds between SIGTERM and SIGKILL when stopping (default: 5).",
    )
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        default=AUTO,
        help="private: the processes share a network namespace with only loopback, so their "
        "TensorFlow servers (which listen on every interface) are reachable from the cluster "
        "alone; host: this machine's network; auto (default): private unless the job needs "
        "the network (a gs:// or bq:// path, an experiment) or namespaces are unavailable.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Show TensorFlow's own log lines (gRPC errors as replicas disconnect, server "
        "info) among the processes' lines; by default they go to a file the launcher names.",
    )
    return parser


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """The command line, resolved against the config."""

    shape: ClusterShape
    module: str
    args: tuple[str, ...]
    grace: float
    network: str = AUTO
    verbose: bool = False


def parse_command_line(argv: Sequence[str]) -> LaunchOptions:
    """Launcher flags before `--`, trainer args after it; flags override the config.

    Raises:
        InputError: a bad config or bad counts (argparse itself exits 2 on unknown flags).
    """
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    flags = _parser().parse_args(argv[:split])
    trainer_args = tuple(argv[split + 1 :])
    for name in ("workers", "ps"):
        value = getattr(flags, name)
        if value is not None and value < 0:
            raise InputError(f"--{name}={value}: the count must be 0 or more.")
    job = read_job_config(flags.config) if flags.config else None
    base = job.shape if job else ClusterShape()
    shape = ClusterShape(
        workers=base.workers if flags.workers is None else flags.workers,
        ps=base.ps if flags.ps is None else flags.ps,
        evaluator=base.evaluator if flags.evaluator is None else flags.evaluator,
    )
    if flags.grace < 0:
        raise InputError(f"--grace ({flags.grace}) must be >= 0 seconds.")
    return LaunchOptions(
        shape=shape,
        module=flags.module or (job.module if job else None) or DEFAULT_MODULE,
        args=trainer_args or (job.args if job else ()),
        grace=flags.grace,
        network=flags.network,
        verbose=flags.verbose,
    )


def _ignore_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _raise_interrupted(signum, frame):
    # A second Ctrl-C must not cut the shutdown short and leave processes behind.
    _ignore_signals()
    raise _Interrupted(signum)


def _exit_code(code: int) -> int:
    """A process exit code for the shell: a signal N becomes 128 + N."""
    return 128 - code if code < 0 else code


def run(options: LaunchOptions) -> int:
    """Runs the cluster until the chief ends or a signal arrives; returns the exit code."""
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    with contextlib.ExitStack() as files:
        library_log = None
        if not options.verbose:
            library_log = files.enter_context(
                tempfile.NamedTemporaryFile(
                    "w", prefix="trainer-launch-", suffix=".log", delete=False
                )
            )
        cluster = LocalCluster(
            options.shape,
            module=options.module,
            args=options.args,
            grace=options.grace,
            network=options.network,
            library_log=library_log,
        )
        try:
            return _run(cluster)
        finally:
            if library_log is not None and cluster.library_count:
                print(
                    f"[launch] TensorFlow's own log lines ({cluster.library_count}; --verbose "
                    f"shows them here): {library_log.name}",
                    file=sys.stdout,
                    flush=True,
                )
            elif library_log is not None:
                os.unlink(library_log.name)


def _run(cluster: LocalCluster) -> int:
    try:
        try:
            cluster.start()
        except PrivateNetworkUnavailable as e:
            print(f"error: {e}; --network=host runs it on this machine's network.", file=sys.stderr)
            return 2
        code = cluster.wait()
        cluster.log(f"chief exited with {exit_description(code)}")
        return _exit_code(code)
    except _Interrupted as e:
        cluster.log(f"{e}: stopping the cluster")
        return 128 + e.signum
    finally:
        _ignore_signals()
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_command_line(sys.argv[1:] if argv is None else argv)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
