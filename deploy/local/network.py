"""The local cluster's private network: a network namespace with only loopback, kept by a small
holder process (`Namespace`), which every task enters, so that TensorFlow's unauthenticated
servers are reachable from the cluster alone (`deploy/local/cluster.py` says why, and when the
cluster runs on this machine's network instead: `network_needs`)."""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

# How long a namespace's holder may take to say it is ready (it starts a Python interpreter).
NAMESPACE_START_SECS = 20.0


class PrivateNetworkUnavailable(Exception):
    """No private network namespace could be made here; the message says why, each way tried.
    `network="auto"` then runs the cluster on this machine's network; `private` stops."""


def network_needs(args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why a job with these arguments and environment needs this machine's network (None: it
    does not): a Cloud Storage or BigQuery URI among the arguments or the variables' values
    (`AIP_MODEL_DIR=gs://...`), or Vertex AI Experiments (`--experiment`,
    `AIP_EXPERIMENT_NAME`). A `/gcs/` path is a local mount and needs none."""
    for arg in args:
        if "gs://" in arg or "bq://" in arg:
            return f"{arg} is in Cloud Storage or BigQuery"
        if arg == "--experiment" or arg.startswith("--experiment="):
            return f"{arg} logs to Vertex AI Experiments"
    for name, value in sorted(env.items()):
        if value.startswith(("gs://", "bq://")):
            return f"{name}={value} is in Cloud Storage or BigQuery"
    if env.get("AIP_EXPERIMENT_NAME"):
        return "AIP_EXPERIMENT_NAME logs to Vertex AI Experiments"
    return None


# Run by the holder of a private network namespace: brings its loopback up (SIOCSIFFLAGS, as
# `ip link set lo up`, which not every image has), says so, and keeps the namespace until its
# stdin closes (the launcher stops or dies).
_HOLD_NAMESPACE = """
import fcntl, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"  # struct ifreq: the interface's name, its flags
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
print("ready", flush=True)
sys.stdin.read()
"""


def _first_line(stream, timeout_secs: float) -> bytes | None:
    """The first line `stream` gives (what it gave if it ended first), or None if no whole
    line came within `timeout_secs`."""
    deadline = time.monotonic() + timeout_secs
    fd, data = stream.fileno(), b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data


def close_pipes(process: subprocess.Popen) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def probe_private_network() -> None:
    """Makes a private network namespace and ends it.

    Raises:
        PrivateNetworkUnavailable: none can be made here, saying why.
    """
    Namespace.start().stop()


@dataclasses.dataclass
class Namespace:
    """A private network namespace: its holder process, and the command prefix that enters it."""

    holder: subprocess.Popen
    enter: list[str]

    @classmethod
    def start(cls, timeout_secs: float | None = None) -> Namespace:
        """Raises PrivateNetworkUnavailable saying why no namespace could be made (each way
        tried), also when a holder did not say it was ready within `timeout_secs` (default:
        `NAMESPACE_START_SECS`)."""
        timeout_secs = NAMESPACE_START_SECS if timeout_secs is None else timeout_secs
        unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if not unshare or not nsenter:
            raise PrivateNetworkUnavailable("util-linux's unshare and nsenter are not on PATH")
        # Root (or CAP_SYS_ADMIN) makes a network namespace alone; others need a user namespace
        # of their own too (unprivileged user namespaces: most Linux distributions allow them).
        ways = [(["--user", "--map-root-user"], ["--user", "--preserve-credentials"])]
        if os.geteuid() == 0:
            ways.insert(0, ([], []))
        reasons = []
        for unshare_flags, nsenter_flags in ways:
            how = " ".join(["unshare --net", *unshare_flags])
            try:
                holder = subprocess.Popen(
                    [unshare, "--net", *unshare_flags, "--", sys.executable, "-c", _HOLD_NAMESPACE],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher alone
                )
            except OSError as e:
                reasons.append(f"{how}: {e}")
                continue
            assert holder.stdout is not None and holder.stderr is not None
            said = _first_line(holder.stdout, timeout_secs)
            if said == b"ready\n":
                return cls(holder, [nsenter, f"--target={holder.pid}", "--net", *nsenter_flags])
            holder.kill()  # (one that still runs)
            holder.wait()
            if said is None:
                why = f"the namespace's holder gave no word in {timeout_secs:g} s"
            else:
                lines = holder.stderr.read().decode(errors="replace").strip().splitlines()
                why = lines[-1] if lines else said.decode(errors="replace").strip()
            reasons.append(f"{how}: {why or f'exit code {holder.returncode}'}")
            close_pipes(holder)
        raise PrivateNetworkUnavailable("; ".join(reasons))

    def stop(self) -> None:
        """Ends the holder (the namespace goes with its last process)."""
        close_pipes(self.holder)
        try:
            self.holder.wait(5)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()
