"""Input at scale: the statistics pass, time to first step, training examples/s, peak memory
and local batch prediction on census-shaped synthetic data of 1M and 10M rows.

Run from the repo root::

    .venv/bin/python bench/scale.py                        # 1M and 10M rows
    .venv/bin/python bench/scale.py --rows=1000000         # one size

Data: `--rows` rows in gzip CSV shards of `--shard_rows` under --data_dir (generated once and
reused; never committed), made by resampling the census training rows shipped in the package
and jittering age, fnlwgt and hours_per_week, so the label keeps its signal. Each size gets:

  scan      the chief's statistics pass alone (`trainer.input.scan`, in its own process):
            seconds, rows/s, peak RSS.
  train     `python -m trainer.task` on the shards, one process, the default search, one
            iteration of --steps steps, 10% held out: the input seconds (open + scan), the
            first training step's seconds after the run started, training examples/s, and
            the process's peak RSS. The baseline row is the same run on the in-memory census
            data (32,561 rows; kept in memory), in the same bench run: the ratio column is
            examples/s against it.
  cluster   (the smallest size) a chief, 2 workers and a parameter server on loopback
            (`deploy.launch`): each process's peak RSS; every worker reads its own shards.
  predict   `python -m deploy.batch local` over the shards with the exported model: rows/s
            and peak RSS.

Peak RSS is each process's VmHWM (/proc/PID/status), read until it exits. Figures go to --out
(JSON, with the machine) and a table to stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local.cluster import LocalCluster
from trainer.distribute.cluster import ClusterShape
from trainer.input.files import CENSUS_LABEL, CENSUS_TEST, CENSUS_TRAIN

SEARCH = ("--max_iterations=1", "--checkpoint_every_secs=600")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


# -- data -------------------------------------------------------------------------------------
def generate(directory: str, rows: int, shard_rows: int, seed: int = 0) -> list[str]:
    """Census-shaped gzip CSV shards (made once; a complete set is reused)."""
    count = -(-rows // shard_rows)
    paths = [os.path.join(directory, f"part-{i:05d}-of-{count:05d}.csv.gz") for i in range(count)]
    if all(os.path.exists(p) for p in paths):
        return paths
    os.makedirs(directory, exist_ok=True)
    with gzip.open(CENSUS_TRAIN, "rt") as f:
        header, *lines = f.read().splitlines()
    fields = np.array([line.split(",") for line in lines], dtype=object)
    age, fnlwgt, hours = (fields[:, i].astype(float) for i in (0, 2, 12))
    # the text between the jittered columns, per census row
    between = [
        np.array([",".join(r) for r in fields[:, a:b]], dtype=object)
        for a, b in ((1, 2), (3, 12), (13, 15))
    ]
    rng = np.random.default_rng(seed)
    for i, path in enumerate(paths):
        n = min(shard_rows, rows - i * shard_rows)
        pick = rng.integers(0, len(lines), n)
        parts = [
            np.clip(age[pick] + rng.integers(-2, 3, n), 17, 90).astype(int).astype(str),
            between[0][pick],
            np.round(fnlwgt[pick] * rng.uniform(0.9, 1.1, n)).astype(int).astype(str),
            between[1][pick],
            np.clip(hours[pick] + rng.integers(-3, 4, n), 1, 99).astype(int).astype(str),
            between[2][pick],
        ]
        text = "\n".join(",".join(row) for row in zip(*parts))
        temp = path + ".tmp"
        with gzip.open(temp, "wt", compresslevel=1) as f:
            f.write(header + "\n" + text + "\n")
        os.replace(temp, path)
    return paths


# -- processes and their peak memory ----------------------------------------------------------
def peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            match = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        return int(match.group(1)) / 1024 if match else None
    except OSError:
        return None


class PeakWatcher:
    """Polls the peak RSS of processes until they exit (VmHWM only grows)."""

    def __init__(self, pids: dict[str, int]):
        self.peaks = {name: 0.0 for name in pids}
        self._pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.2):
            for name, pid in self._pids.items():
                value = peak_rss_mb(pid)
                if value:
                    self.peaks[name] = max(self.peaks[name], value)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def run(cmd: list[str], *, log) -> tuple[float, float, str]:
    """Runs `cmd`; returns (seconds, peak RSS MB, stdout). Fails on a non-zero exit."""
    started = time.monotonic()
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=log, text=True
    )
    watcher = PeakWatcher({"p": process.pid})
    out, _ = process.communicate()
    seconds = time.monotonic() - started
    peak = watcher.stop()["p"]
    if process.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} exited with {process.returncode}; see the log")
    return seconds, peak, out


# -- measurements -----------------------------------------------------------------------------
SCAN = """
import json, sys, time
from trainer.input import files, scan
from trainer.input.options import BadRows
from trainer.input.schema import ColumnChoices
started = time.monotonic()
source = files.open_source(sys.argv[1], flag="--train_data")
schema = scan.scan_training(source, ColumnChoices(sys.argv[2]), bad_rows=BadRows.ERROR,
                            holdout=scan.Holdout(0.1, 42))
print(json.dumps({"seconds": time.monotonic() - started,
                  "rows": schema.summary["train"]["rows"]}))
"""


def measure_scan(pattern: str, *, log) -> dict:
    _, peak, out = run([sys.executable, "-c", SCAN, pattern, CENSUS_LABEL], log=log)
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "kind": "scan",
        "rows": result["rows"],
        "seconds": result["seconds"],
        "rows_per_s": result["rows"] / result["seconds"],
        "peak_rss_mb": peak,
    }


def measure_train(args: list[str], *, rows: int | None, steps: int, job_dir: str, log) -> dict:
    seconds, peak, _ = run(
        [
            sys.executable,
            "-m",
            "trainer.task",
            f"--job_dir={job_dir}",
            f"--max_iteration_steps={steps}",
            *SEARCH,
            *args,
        ],
        log=log,
    )
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    record = report["iterations"][0]
    return {
        "kind": "train",
        "rows": rows,
        "wall_s": seconds,
        "peak_rss_mb": peak,
        "input_s": report["timing"]["input_seconds"],
        "first_step_s": report["timing"]["first_step_seconds"],
        "examples_per_s": record["examples_per_sec"],
        "mode": report["input"]["mode"],
        "training_rows": report["input"]["training_rows"],
        "eval_rows": report["input"]["eval_rows"],
        "accuracy": report["final"]["metrics"]["accuracy"],
        "model_dir": report["model_dir"],
    }


def measure_cluster(pattern: str, *, rows: int, steps: int, job_dir: str, log) -> dict:
    args = (
        f"--job_dir={job_dir}",
        f"--train_data={pattern}",
        f"--label_column={CENSUS_LABEL}",
        f"--max_iteration_steps={steps}",
        *SEARCH,
    )
    with LocalCluster(
        ClusterShape(workers=2, ps=1),
        module="trainer.task",
        args=args,
        cwd=ROOT,
        sink=log,
        grace=10,
    ) as cluster:
        pids = {
            "chief": cluster.process("chief").pid,
            "worker 0": cluster.process("worker", 0).pid,
            "worker 1": cluster.process("worker", 1).pid,
            "ps 0": cluster.process("ps", 0).pid,
        }
        watcher = PeakWatcher(pids)
        code = cluster.wait(timeout=3600)
        peaks = watcher.stop()
    if code != 0:
        raise RuntimeError(f"the cluster's chief exited with {code}; see the log")
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    return {
        "kind": "cluster",
        "rows": rows,
        "peak_rss_mb": peaks,
        "readers": report["input"]["readers"],
        "accuracy": report["final"]["metrics"]["accuracy"],
    }


def measure_predict(pattern: str, model_dir: str, *, output: str, log) -> dict:
    _, peak, out = run(
        [
            sys.executable,
            "-m",
            "deploy.batch",
            "local",
            f"--model_dir={model_dir}",
            f"--source={pattern}",
            "--instances_format=csv",
            f"--excluded_fields={CENSUS_LABEL}",
            f"--output_prefix={output}",
        ],
        log=log,
    )
    result = json.loads(out[out.index("{") :])
    subprocess.run(["rm", "-rf", output], check=True)
    return {
        "kind": "predict",
        "rows": result["num_predictions"],
        "errors": result["num_errors"],
        "seconds": result["seconds"],
        "rows_per_s": result["num_predictions"] / result["seconds"],
        "peak_rss_mb": peak,
    }


# -- the table --------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    baseline = next(
        (r["examples_per_s"] for r in rows if r["kind"] == "train" and r["rows"] is None), None
    )
    lines = [
        f"{'what':<9}{'rows':>12}{'seconds':>9}{'rows/s':>10}{'first step s':>14}"
        f"{'examples/s':>12}{'vs census':>10}{'peak RSS MB':>14}",
        "-" * 90,
    ]
    for r in rows:
        rss = r["peak_rss_mb"]
        rss = (
            "  ".join(f"{k} {v:,.0f}" for k, v in rss.items())
            if isinstance(rss, dict)
            else f"{rss:,.0f}"
        )
        size = "census" if r["rows"] is None else f"{r['rows']:,}"
        if r["kind"] == "train":
            ratio = f"{r['examples_per_s'] / baseline:.2f}x" if baseline and r["rows"] else "-"
            lines.append(
                f"{'train':<9}{size:>12}{r['wall_s']:>9.1f}{'':>10}"
                f"{r['first_step_s']:>14.1f}{r['examples_per_s']:>12,.0f}"
                f"{ratio:>10}{rss:>14}"
            )
        elif r["kind"] == "cluster":
            lines.append(f"{'cluster':<9}{size:>12}   peak RSS MB: {rss}")
        else:
            lines.append(
                f"{r['kind']:<9}{size:>12}{r['seconds']:>9.1f}"
                f"{r['rows_per_s']:>10,.0f}{'':>36}{rss:>14}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1000000,10000000", help="sizes, comma-separated")
    parser.add_argument("--shard_rows", type=int, default=500_000)
    parser.add_argument("--steps", type=int, default=3000, help="train steps per job")
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(), "adanet-scale"))
    parser.add_argument("--no_cluster", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/scale.json"))
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-scale.log"))
    args = parser.parse_args()
    sizes = [int(n) for n in args.rows.split(",")]
    results = []

    def add(row):
        results.append(row)
        print(table([row]).splitlines()[-1], flush=True)

    with open(args.log, "w") as log, tempfile.TemporaryDirectory() as tmp:
        add(
            measure_train(
                [f"--eval_data={CENSUS_TEST}"],
                rows=None,
                steps=args.steps,
                job_dir=os.path.join(tmp, "census"),
                log=log,
            )
        )
        for size in sizes:
            started = time.monotonic()
            files = generate(os.path.join(args.data_dir, str(size)), size, args.shard_rows)
            print(
                f"data: {size:,} rows in {len(files)} shards ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            pattern = os.path.join(args.data_dir, str(size), "part-*.csv.gz")
            add(measure_scan(pattern, log=log))
            train = measure_train(
                [f"--train_data={pattern}", f"--label_column={CENSUS_LABEL}"],
                rows=size,
                steps=args.steps,
                job_dir=os.path.join(tmp, f"train-{size}"),
                log=log,
            )
            add(train)
            if not args.no_cluster and size == min(sizes):
                add(
                    measure_cluster(
                        pattern,
                        rows=size,
                        steps=args.steps,
                        job_dir=os.path.join(tmp, f"cluster-{size}"),
                        log=log,
                    )
                )
            add(
                measure_predict(
                    pattern,
                    train["model_dir"],
                    output=os.path.join(tmp, f"predict-{size}"),
                    log=log,
                )
            )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "steps": args.steps,
        "rows": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(results))
    print(f"\nwrote {args.out}; process logs in {args.log}")


if __name__ == "__main__":
    main()
