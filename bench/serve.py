"""Local serving and batch prediction speed, and a bounded load test and soak of the server.

Run from the repo root::

    .venv/bin/python bench/serve.py                          # trains runs/bench-serve first
    .venv/bin/python bench/serve.py --model_dir=runs/demo/model --soak_seconds=30

Figures (on the machine it runs on, CPU only), all against `python -m deploy.serve` in its own
process on loopback (the clients are this process, so they do not share the server's GIL):

  latency     p50 / p99 milliseconds of `POST /predict` with one instance, --requests in a row
              over one keep-alive connection.
  throughput  instances/s with --batch instances per request from --clients threads.
  bursts      for each of --bursts (50, 200, 500): that many clients connect at once and each
              sends one single-instance request; answers counted as ok (200), refused (429 or
              503), failed (another status or no answer in --timeout s) and reset (the
              connection reset or closed without an answer); p50 / p99 / max from connect to
              answer. Each burst runs --burst_repeats times.
  steady      single-instance requests/s with --steady_clients keep-alive connections sending
              one request after another for --steady_seconds; p50 / p99.
  soak        the steady load for --soak_seconds (default 5 minutes), sampling the server's
              RSS and the latency every --soak_every seconds; first against last sample.
  batch       instances/s of `deploy.batch_prediction.local.predict_local` over the census
              test set (16,281 CSV rows: read, check, predict, write the results), the model
              already loaded; the median of --batch_repeats runs.

The load clients are one asyncio event loop speaking HTTP/1.1 over raw connections (far
cheaper per request than the server, so they are not the bottleneck). Everything is bounded in
count and time and the server is stopped at the end. Without --model_dir it trains the default
search (`python -m trainer.task`, as `make demo`) into runs/bench-serve once. Writes --out
(JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import http.client
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from deploy.batch_prediction import local as batch_local
from deploy.serving.instances import Predictor
from trainer.input.files import CENSUS_LABEL, CENSUS_TEST


def _flags() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", help="An exported model; default: train runs/bench-serve.")
    p.add_argument("--requests", type=int, default=1000, help="Single-instance requests.")
    p.add_argument("--batch", type=int, default=64, help="Instances per throughput request.")
    p.add_argument("--clients", type=int, default=4, help="Concurrent throughput clients.")
    p.add_argument("--seconds", type=float, default=10, help="Throughput measuring time.")
    p.add_argument("--batch_repeats", type=int, default=3, help="Local batch runs (median).")
    p.add_argument(
        "--bursts", default="50,200,500", help="Concurrent clients of each burst (comma list)."
    )
    p.add_argument("--burst_repeats", type=int, default=3, help="Runs of each burst.")
    p.add_argument("--steady_clients", type=int, default=64, help="Steady-load connections.")
    p.add_argument("--steady_seconds", type=float, default=10, help="Steady measuring time.")
    p.add_argument("--soak_seconds", type=float, default=300, help="Soak time (0: no soak).")
    p.add_argument("--soak_every", type=float, default=5, help="Soak sampling interval.")
    p.add_argument("--timeout", type=float, default=30, help="Seconds a load request may take.")
    p.add_argument(
        "--server_flag",
        action="append",
        default=[],
        help="A flag for deploy.serve, e.g. --server_flag=--max_wait_ms=2 (repeatable).",
    )
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "serve.json"))
    return p.parse_args()


def _model_dir(flag: str | None) -> str:
    if flag:
        return flag
    job_dir = os.path.join(REPO, "runs", "bench-serve")
    if not os.path.exists(os.path.join(job_dir, "model", "saved_model.pb")):
        subprocess.run(
            [sys.executable, "-m", "trainer.task", f"--job_dir={job_dir}"], cwd=REPO, check=True
        )
    return os.path.join(job_dir, "model")


def _census_instances(predictor: Predictor, count: int) -> list[dict]:
    import csv
    import gzip

    with gzip.open(CENSUS_TEST, "rt") as f:
        rows = [r for _, r in zip(range(count), csv.DictReader(f, skipinitialspace=True))]
    return [
        predictor.fields.from_text(i, {k: v for k, v in r.items() if k != CENSUS_LABEL})
        for i, r in enumerate(rows)
    ]


def _start_server(model_dir: str, flags: list[str]) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deploy.serve",
            f"--model_dir={model_dir}",
            f"--port={port}",
            *flags,
        ],
        cwd=REPO,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server, port
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not become healthy in 120 s")


def _post(connection: http.client.HTTPConnection, instances: list[dict]) -> None:
    connection.request(
        "POST",
        "/predict",
        json.dumps({"instances": instances}),
        {"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:300]!r}")


def latency(port: int, instances: list[dict], requests: int) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    for x in instances[:20]:  # warm-up
        _post(connection, [x])
    times = []
    for i in range(requests):
        start = time.perf_counter()
        _post(connection, [instances[i % len(instances)]])
        times.append(time.perf_counter() - start)
    connection.close()
    ms = np.array(times) * 1000
    return {
        "requests": requests,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


def throughput(
    port: int, instances: list[dict], batch_size: int, clients: int, seconds: float
) -> dict:
    chunk = instances[:batch_size]

    def client(deadline: float) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port)
        done = 0
        while time.perf_counter() < deadline:
            _post(connection, chunk)
            done += len(chunk)
        connection.close()
        return done

    client(time.perf_counter() + 1)  # warm-up
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        counts = list(pool.map(client, [start + seconds] * clients))
    elapsed = time.perf_counter() - start
    return {
        "batch": batch_size,
        "clients": clients,
        "seconds": elapsed,
        "instances_per_s": sum(counts) / elapsed,
    }


# --- The load test: one asyncio loop, raw HTTP/1.1 connections ---------------------------

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
OUTCOMES = ("ok", "refused", "failed", "reset")


class _NoAnswer(ConnectionError):
    """The server closed the connection without answering."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection sending one request at a time; `post` returns the status."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._answer: asyncio.Future | None = None

    @classmethod
    async def open(cls, port: int) -> _Connection:
        _, connection = await asyncio.get_running_loop().create_connection(cls, "127.0.0.1", port)
        return connection

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        answer = self._answer
        end = self._buffer.find(b"\r\n\r\n")
        if answer is None or answer.done() or end < 0:
            return
        length = _CONTENT_LENGTH.search(self._buffer, 0, end + 2)
        size = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) >= size:
            status = int(self._buffer[9:12])
            del self._buffer[:size]
            answer.set_result(status)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc or _NoAnswer("closed without an answer"))

    async def post(self, request: bytes) -> int:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._answer

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _requests(instances: list[dict]) -> list[bytes]:
    """One raw single-instance POST per instance (built once: the client stays cheap)."""
    out = []
    for x in instances:
        body = json.dumps({"instances": [x]}).encode()
        head = (
            "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


def _outcome(status: int) -> str:
    return "ok" if status == 200 else "refused" if status in (429, 503) else "failed"


def _error_outcome(error: BaseException) -> str:
    if isinstance(error, (ConnectionResetError, BrokenPipeError, _NoAnswer)):
        return "reset"
    return "failed"  # no answer in time, a refused connection, another error


def _summary(counts: collections.Counter, seconds: list[float]) -> dict:
    ms = np.array(seconds or [0.0]) * 1000
    return {
        **{name: counts[name] for name in OUTCOMES},
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


async def _burst(port: int, requests: list[bytes], clients: int, timeout: float) -> dict:
    """`clients` connections opened at once, each sending one request; every outcome."""
    go = asyncio.Event()

    async def client(request: bytes) -> tuple[str, float]:
        await go.wait()
        start = time.perf_counter()
        connection = None
        try:
            connection = await asyncio.wait_for(_Connection.open(port), timeout)
            status = await asyncio.wait_for(connection.post(request), timeout)
            outcome = _outcome(status)
        except (OSError, asyncio.TimeoutError) as e:
            outcome = _error_outcome(e)
        finally:
            if connection is not None:
                connection.close()
        return outcome, time.perf_counter() - start

    tasks = [asyncio.create_task(client(requests[i % len(requests)])) for i in range(clients)]
    await asyncio.sleep(0.05)  # every client waits at the gate
    go.set()
    results = await asyncio.gather(*tasks)
    return _summary(collections.Counter(o for o, _ in results), [t for _, t in results])


def bursts(port: int, requests: list[bytes], sizes: list[int], repeats: int, timeout: float):
    rows = []
    for clients in sizes:
        runs = []
        for _ in range(repeats):
            runs.append(asyncio.run(_burst(port, requests, clients, timeout)))
            time.sleep(1)  # the sockets of the last burst leave TIME_WAIT on the client side
        rows.append(
            {
                "clients": clients,
                "requests": clients * repeats,
                **{name: sum(r[name] for r in runs) for name in OUTCOMES},
                "p50_ms": float(np.median([r["p50_ms"] for r in runs])),
                "p99_ms": max(r["p99_ms"] for r in runs),  # the worst run's
                "max_ms": max(r["max_ms"] for r in runs),
                "runs": runs,
            }
        )
    return rows


class _Load:
    """`clients` keep-alive connections, each sending one request after another until
    `stop()`; outcomes and latencies accumulate until `take()`."""

    def __init__(self, port: int, requests: list[bytes], clients: int, timeout: float):
        self.port, self.requests, self.clients, self.timeout = port, requests, clients, timeout
        self.counts: collections.Counter = collections.Counter()
        self.seconds: list[float] = []
        self._stopped = False

    def take(self) -> tuple[collections.Counter, list[float]]:
        taken = self.counts, self.seconds
        self.counts, self.seconds = collections.Counter(), []
        return taken

    def stop(self) -> None:
        self._stopped = True

    async def run(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    async def _client(self, index: int) -> None:
        connection = None
        n = index
        while not self._stopped:
            request = self.requests[n % len(self.requests)]
            n += self.clients
            start = time.perf_counter()
            try:
                if connection is None or connection.closed:
                    connection = await asyncio.wait_for(_Connection.open(self.port), self.timeout)
                status = await asyncio.wait_for(connection.post(request), self.timeout)
                outcome = _outcome(status)
            except (OSError, asyncio.TimeoutError) as e:
                outcome = _error_outcome(e)
                if connection is not None:
                    connection.close()
                connection = None
            self.counts[outcome] += 1
            self.seconds.append(time.perf_counter() - start)
        if connection is not None:
            connection.close()


async def _steady(port, pid, requests, clients, seconds, timeout) -> dict:
    load = _Load(port, requests, clients, timeout)
    task = asyncio.create_task(load.run())
    await asyncio.sleep(1.0)  # warm-up: connections open, the server's pools fill
    load.take()
    start, client_cpu, server_cpu = time.perf_counter(), time.process_time(), _cpu_s(pid)
    await asyncio.sleep(seconds)
    counts, latencies = load.take()
    elapsed = time.perf_counter() - start
    client_cpu, server_cpu = time.process_time() - client_cpu, _cpu_s(pid) - server_cpu
    load.stop()
    await task
    return {
        "clients": clients,
        "seconds": elapsed,
        "requests": sum(counts.values()),
        "requests_per_s": counts["ok"] / elapsed,
        **_summary(counts, latencies),
        # cores busy on average: the client must stay well below the server
        "client_cores": client_cpu / elapsed,
        "server_cores": server_cpu / elapsed,
    }


def steady(port, pid, requests, clients, seconds, timeout) -> dict:
    return asyncio.run(_steady(port, pid, requests, clients, seconds, timeout))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


async def _soak(port, pid, requests, clients, seconds, every, timeout) -> dict:
    load = _Load(port, requests, clients, timeout)
    task = asyncio.create_task(load.run())
    samples: list[dict] = []
    start = last = time.perf_counter()
    while last - start < seconds:
        await asyncio.sleep(min(every, seconds - (last - start)))
        counts, latencies = load.take()
        now = time.perf_counter()
        sample = {"t_s": now - start, "rss_mb": _rss_mb(pid)}
        sample.update(requests_per_s=counts["ok"] / (now - last), **_summary(counts, latencies))
        samples.append(sample)
        last = now
    load.stop()
    await task
    first, final = samples[0], samples[-1]
    growth = (
        (final["rss_mb"] - first["rss_mb"]) / first["rss_mb"]
        if first["rss_mb"] and final["rss_mb"]
        else None
    )
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": sum(sum(s[name] for name in OUTCOMES) for s in samples),
        **{name: sum(s[name] for s in samples) for name in OUTCOMES},
        "rss_first_mb": first["rss_mb"],
        "rss_last_mb": final["rss_mb"],
        "rss_max_mb": max((s["rss_mb"] or 0) for s in samples),
        "rss_growth": growth,
        "rss_flat": growth is not None and abs(growth) <= 0.10,
        "p99_first_ms": first["p99_ms"],
        "p99_last_ms": final["p99_ms"],
        "requests_per_s_first": first["requests_per_s"],
        "requests_per_s_last": final["requests_per_s"],
        "samples": samples,
    }


def soak(port, pid, requests, clients, seconds, every, timeout) -> dict:
    return asyncio.run(_soak(port, pid, requests, clients, seconds, every, timeout))


def batch_speed(predictor: Predictor, repeats: int) -> dict:
    """The median of `repeats` runs (the machine is shared; one run can be unlucky)."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            runs.append(
                batch_local.predict_local(
                    model_dir=predictor.model_dir,
                    sources=[CENSUS_TEST],
                    output_prefix=out,
                    instances_format="csv",
                    excluded_fields=[CENSUS_LABEL],
                    predictor=predictor,
                )
            )
    seconds = float(np.median([r.seconds for r in runs]))
    return {
        "instances": runs[0].num_predictions,
        "errors": runs[0].num_errors,
        "repeats": repeats,
        "seconds": seconds,
        "all_seconds": [r.seconds for r in runs],
        "instances_per_s": runs[0].num_predictions / seconds,
    }


def main() -> int:
    flags = _flags()
    model_dir = _model_dir(flags.model_dir)
    predictor = Predictor(model_dir)
    instances = _census_instances(predictor, 1000)
    requests = _requests(instances)
    server, port = _start_server(model_dir, flags.server_flag)
    try:
        figures: dict = {
            "server_flags": flags.server_flag,
            "latency": latency(port, instances, flags.requests),
            "throughput": throughput(port, instances, flags.batch, flags.clients, flags.seconds),
        }
        sizes = [int(n) for n in flags.bursts.split(",") if n]
        figures["bursts"] = bursts(port, requests, sizes, flags.burst_repeats, flags.timeout)
        figures["steady"] = steady(
            port, server.pid, requests, flags.steady_clients, flags.steady_seconds, flags.timeout
        )
        if flags.soak_seconds > 0:
            figures["soak"] = soak(
                port,
                server.pid,
                requests,
                flags.steady_clients,
                flags.soak_seconds,
                flags.soak_every,
                flags.timeout,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    figures["batch"] = batch_speed(predictor, flags.batch_repeats)
    import tensorflow as tf

    figures["machine"] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "model_dir": os.path.relpath(model_dir, REPO),
    }
    os.makedirs(os.path.dirname(flags.out), exist_ok=True)
    with open(flags.out, "w") as f:
        json.dump(figures, f, indent=1)
    _print_table(figures)
    return 0


def _print_table(figures: dict) -> None:
    lat, thr, bat = figures["latency"], figures["throughput"], figures["batch"]
    print("| local server (1 instance per request unless said) | |")
    print("|---|---|")
    print(
        f"| one client, {lat['requests']} requests in a row | p50 {lat['p50_ms']:.2f} ms, "
        f"p99 {lat['p99_ms']:.2f} ms |"
    )
    print(
        f"| {thr['batch']} instances/request, {thr['clients']} clients | "
        f"{thr['instances_per_s']:,.0f} instances/s |"
    )
    for b in figures["bursts"]:
        runs = len(b["runs"])
        print(
            f"| burst: {b['clients']} clients connect and send at once (x{runs}) | "
            f"{b['ok']} ok, {b['refused']} refused, {b['failed']} failed, {b['reset']} reset; "
            f"p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms, max {b['max_ms']:.0f} ms |"
        )
    st = figures["steady"]
    print(
        f"| steady: {st['clients']} clients, {st['seconds']:.0f} s | "
        f"{st['requests_per_s']:,.0f} requests/s, p50 {st['p50_ms']:.1f} ms, "
        f"p99 {st['p99_ms']:.1f} ms; {st['failed']} failed, {st['reset']} reset; cores busy: "
        f"server {st['server_cores']:.2f}, client {st['client_cores']:.2f} |"
    )
    if "soak" in figures:
        so = figures["soak"]
        growth = so["rss_growth"]
        growth_text = "n/a" if growth is None else f"{growth:+.1%}"
        print(
            f"| soak: {so['clients']} clients, {so['seconds']:.0f} s, first -> last sample | "
            f"RSS {so['rss_first_mb']:.0f} -> {so['rss_last_mb']:.0f} MB ({growth_text}), "
            f"p99 {so['p99_first_ms']:.1f} -> {so['p99_last_ms']:.1f} ms, "
            f"{so['requests_per_s_first']:,.0f} -> {so['requests_per_s_last']:,.0f} "
            f"requests/s; {so['failed']} failed, {so['reset']} reset |"
        )
    print(
        f"| local batch prediction, census test ({bat['instances']} rows, csv) | "
        f"{bat['instances_per_s']:,.0f} instances/s ({bat['seconds']:.1f} s) |"
    )


if __name__ == "__main__":
    sys.exit(main())
