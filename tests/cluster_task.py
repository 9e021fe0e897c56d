"""A stand-in for `trainer.task` in launcher tests: starts in milliseconds, no TensorFlow.

    python -m tests.cluster_task [--exit_code=N] [--sleep=S] [--others_exit=N]
                                 [--others_sleep=S] [--listen] [--ignore_sigterm] [--stderr]

Every process gets the same arguments (as on Vertex; others, the trainer's, are ignored) and acts
by the role in its TF_CONFIG (no TF_CONFIG: a lone chief). It prints `env {...}` (its pid and
cluster variables) and, with `--listen`, listens on its own port from TF_CONFIG/CLUSTER_SPEC on
every interface (as TensorFlow's servers do), then prints `ready`.
The chief exits with `--exit_code` after `--sleep` seconds (negative: never); other roles
run until stopped, like TensorFlow servers, unless `--others_exit` is given (exit with it after
`--others_sleep` seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time


def _role() -> tuple[str, int]:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {"type": "chief", "index": 0})
    return task["type"], task["index"]


def _own_port() -> int:
    """This task's port: from CLUSTER_SPEC, which (unlike TF_CONFIG) lists the evaluator too."""
    spec = json.loads(os.environ["CLUSTER_SPEC"])
    task = spec["task"]
    return int(spec["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])


def _listen() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("0.0.0.0", _own_port()))  # fails loudly if the port is taken
    server.listen()
    return server


def _sleep(seconds: float) -> None:
    if seconds < 0:
        while True:
            time.sleep(3600)
    time.sleep(seconds)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit_code", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--others_exit", type=int, default=None)
    parser.add_argument("--others_sleep", type=float, default=0.0)
    parser.add_argument("--listen", action="store_true")
    parser.add_argument("--ignore_sigterm", action="store_true")
    parser.add_argument("--stderr", action="store_true")
    flags, _ = parser.parse_known_args(argv)

    if flags.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    role, index = _role()
    print(
        "env "
        + json.dumps(
            {
                "pid": os.getpid(),
                "role": role,
                "index": index,
                **{
                    k: os.environ.get(k)
                    for k in (
                        "TF_CONFIG",
                        "CLUSTER_SPEC",
                        "GRPC_FAIL_FAST",
                        "no_proxy",
                        "PYTHONUNBUFFERED",
                    )
                },
            }
        )
    )
    server = _listen() if flags.listen and "CLUSTER_SPEC" in os.environ else None
    if flags.stderr:
        print(f"{role} {index} on stderr", file=sys.stderr)
    print("ready")
    if role == "chief":
        _sleep(flags.sleep)
        return flags.exit_code
    if flags.others_exit is None:
        _sleep(-1)
    _sleep(flags.others_sleep)
    del server
    return flags.others_exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
