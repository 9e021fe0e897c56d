"""Would bagging whole searches help on small tables? The measurement behind a feature not built.

Below 1,000 rows the trainer chooses on a hold-out of a few dozen rows, and which candidate
that hold-out prefers moves from seed to seed (README, "Quality"). AutoGluon's answer on small
data is bagging: k models, each with its own held-out rows, their predictions averaged. This
emulates it with the trainer as it is: for each seed S, --bags trainer processes with the
default flags and seeds 100 S + b (each seed holds out other rows: the hold-out is a hash of
the row keyed by the seed), on the same train rows as bench/quality.py; the bag's prediction
on the test rows is the mean of its exported models' `predictions` (regression) or
`probabilities` (then the most probable class). The tables below 1,000 rows only.

It reports, per data set, the single runs (every bag member scored alone: bags x seeds runs),
the bags, and in the same run the linear model and HistGradientBoosting. Writes
--out (JSON) and prints a table. Run from the repo root::

    .venv/bin/python bench/bagging.py                          # diabetes, friedman_small
    .venv/bin/python bench/bagging.py --datasets=breast_cancer,wine \\
        --out=bench/results/bagging_classes.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import quality

BASELINES = ("linear", "hgb")
SMALL = ("breast_cancer", "wine", "diabetes", "friedman_small")  # the tables below 1,000 rows


def predict(model_dir: str, task: str, test: quality.Split) -> np.ndarray:
    """The exported model's predictions, or class probabilities, on the test rows (run in a
    fresh child process)."""
    import tensorflow as tf

    serving = tf.saved_model.load(model_dir).signatures["serving_default"]
    key = "predictions" if task == "regression" else "probabilities"
    batches = quality.model_inputs(test, serving.structured_input_signature[1])
    return np.concatenate([serving(**batch)[key].numpy() for batch in batches])


def run_member(dataset: quality.DataSet, seed: int, workdir: str) -> tuple[np.ndarray, list, float]:
    """One trainer process with the default flags: its test outputs, its classes (in the
    order of its probabilities; [] for regression) and its seconds."""
    job_dir = tempfile.mkdtemp(prefix=f"{dataset.name}-{seed}-", dir=workdir)
    try:
        started = time.perf_counter()
        process = subprocess.run(
            [sys.executable, "-m", "trainer.task", *quality.trainer_argv(dataset, job_dir, seed)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        if process.returncode:
            raise RuntimeError(
                f"{dataset.name}, seed {seed}: the trainer exited {process.returncode}:\n"
                + process.stderr[-3000:]
            )
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
            model = os.path.join(job_dir, "model")
            outputs = child.submit(predict, model, dataset.task, dataset.test).result()
        with open(os.path.join(job_dir, "report.json")) as f:
            classes = json.load(f).get("classes") or []
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    return outputs, classes, seconds


def score(dataset: quality.DataSet, outputs: np.ndarray, classes: list) -> float:
    """Test RMSE, or accuracy of the most probable class."""
    predicted = np.asarray(classes)[outputs.argmax(axis=1)] if classes else outputs
    return quality.score(dataset.task, dataset.test.label, predicted)[dataset.metric]


def spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="diabetes,friedman_small")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--bags", type=int, default=5)
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "bagging.json"))
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.datasets.split(",")
    if unknown := [n for n in names if n not in SMALL]:
        p.error(f"--datasets: {unknown}: bagging is measured on {list(SMALL)} only.")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="bench-bagging-")
    results = {}
    try:
        datasets = [quality.load(n, workdir, quick=False, large_rows=0) for n in names]
        for dataset in datasets:
            single, bagged, seconds = [], [], []
            for seed in seeds:
                members = []
                for b in range(args.bags):
                    outputs, classes, took = run_member(dataset, 100 * seed + b, workdir)
                    members.append(outputs)
                    single.append(score(dataset, outputs, classes))
                    seconds.append(took)
                bagged.append(score(dataset, np.mean(members, axis=0), classes))
                alone = ", ".join(f"{v:.4f}" for v in single[-args.bags :])
                print(f"{dataset.name} seed {seed}: bag {bagged[-1]:.4f}, alone {alone}")
            baselines = {
                m: quality.run_baseline(m, dataset, seeds[0])[dataset.metric] for m in BASELINES
            }
            results[dataset.name] = {
                "task": dataset.task,
                "metric": dataset.metric,
                "train_rows": dataset.train.rows,
                "test_rows": dataset.test.rows,
                "single": spread(single),
                "bagged": spread(bagged),
                "seconds_per_run": statistics.median(seconds),
                **baselines,
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    record = {
        "command": ["bench/bagging.py", *(argv or sys.argv[1:])],
        "bags": args.bags,
        "seeds": seeds,
        "code": quality.code_state(REPO),
        "machine": quality.machine(),
        "seconds": time.perf_counter() - started,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"\n{'data set':16} {'metric':8} {'single':>16} {'bagged':>16} {'linear':>8} {'hgb':>8}")
    for name, r in results.items():
        cells = [f"{r[k]['mean']:.4f} ± {r[k]['sd']:.4f}" for k in ("single", "bagged")]
        print(f"{name:16} {r['metric']:8} {cells[0]:>16} {cells[1]:>16} ", end="")
        print(f"{r['linear']:8.4f} {r['hgb']:8.4f}")


if __name__ == "__main__":
    main()
