"""Local serving and batch prediction speed.

Run from the repo root::

    .venv/bin/python bench/serve.py                          # trains runs/bench-serve first
    .venv/bin/python bench/serve.py --model_dir=runs/demo/model

Figures (on the machine it runs on, CPU only):

  latency     p50 / p99 milliseconds of `POST /predict` with one instance, --requests in a row
              over one keep-alive connection, against `python -m deploy.serve` in its own
              process (the client is this process, so they do not share a GIL).
  throughput  instances/s with --batch instances per request from --clients threads.
  batch       instances/s of `deploy.batch_local.predict_local` over the census test set (16,281
              CSV rows: read, check, predict, write the results), the model already loaded;
              the median of --batch_repeats runs.

Without --model_dir it trains the default search (`python -m trainer.task`, as `make demo`)
into runs/bench-serve once. Writes --out (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from deploy import batch_local
from deploy.instances import Predictor
from trainer.input.files import CENSUS_LABEL, CENSUS_TEST


def _flags() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", help="An exported model; default: train runs/bench-serve.")
    p.add_argument("--requests", type=int, default=1000, help="Single-instance requests.")
    p.add_argument("--batch", type=int, default=64, help="Instances per throughput request.")
    p.add_argument("--clients", type=int, default=4, help="Concurrent throughput clients.")
    p.add_argument("--seconds", type=float, default=10, help="Throughput measuring time.")
    p.add_argument("--batch_repeats", type=int, default=3, help="Local batch runs (median).")
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


def _start_server(model_dir: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    server = subprocess.Popen(
        [sys.executable, "-m", "deploy.serve", f"--model_dir={model_dir}", f"--port={port}"],
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
    server, port = _start_server(model_dir)
    try:
        figures = {
            "latency": latency(port, instances, flags.requests),
            "throughput": throughput(port, instances, flags.batch, flags.clients, flags.seconds),
        }
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
    lat, thr, bat = figures["latency"], figures["throughput"], figures["batch"]
    print(
        f"| local server, 1 instance/request ({lat['requests']} requests) | p50 "
        f"{lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms |"
    )
    print(
        f"| local server, {thr['batch']} instances/request, {thr['clients']} clients | "
        f"{thr['instances_per_s']:,.0f} instances/s |"
    )
    print(
        f"| local batch prediction, census test ({bat['instances']} rows, csv) | "
        f"{bat['instances_per_s']:,.0f} instances/s ({bat['seconds']:.1f} s) |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
