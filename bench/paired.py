"""Census's test rows, paired: the default search against HistGradientBoosting, row by row.

Run from the repo root::

    .venv/bin/python bench/paired.py                       # ours seeds 42, 1-5; HGB seeds 1-5
    .venv/bin/python bench/paired.py --seeds=42 --hgb_seeds=1,2

Each of our seeds is the demo's command (`python -m trainer.task` with default flags, census
shipped with the package, its test file as eval data) with `--seed`; each HGB seed is
bench/quality.py's HistGradientBoosting with defaults on the same train rows. Both predict the
same 16,281 test rows, so a difference in accuracy is a count of rows one gets right and the
other wrong (b and c), and its paired standard error is sqrt(b + c - (b - c)^2 / n) / n
(McNemar's). The table also gives each accuracy's own binomial standard error and how many test
rows each run is from 0.872, issue 12's census target: what a difference of a few rows means
against the noise of the test set itself. Last, the accuracy of our runs' probabilities
averaged, 2 at a time up to all of them: how far averaging whole searches moves it.

Figures go to --out (JSON) and a table to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import quality

TARGET = 0.872  # issue 12: census test accuracy of `make demo`


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="42,1,2,3,4,5", help="our runs' --seed (42: the demo's)")
    p.add_argument("--hgb_seeds", default="1,2,3,4,5")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "paired.json"))
    return p.parse_args(argv)


def ours(seed: int, test: quality.Split) -> tuple[np.ndarray, np.ndarray, float]:
    """The exported model's class probabilities on the test rows (a row each), the classes of
    their columns (`report.json`'s) and the run's wall seconds."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="bench-paired-") as job_dir:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "trainer.task", f"--job_dir={job_dir}", f"--seed={seed}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - started
        with open(os.path.join(job_dir, "report.json")) as f:
            classes = json.load(f)["classes"]
        serving = tf.saved_model.load(os.path.join(job_dir, "model")).signatures["serving_default"]
        signature = serving.structured_input_signature[1]
        probabilities = np.concatenate(
            [
                serving(**batch)["probabilities"].numpy()
                for batch in quality.model_inputs(test, signature)
            ]
        )
    return probabilities, np.array(classes), wall


def averaged(probabilities: list[np.ndarray], classes: np.ndarray, truth: np.ndarray) -> list:
    """Accuracy of the mean probabilities of every k of our runs (k = 2 .. all): mean, lowest
    and highest over the combinations. What averaging independent searches (bagging whole
    searches) would gain."""
    rows = []
    for k in range(2, len(probabilities) + 1):
        accuracies = [
            float(np.mean(classes[np.mean(combo, axis=0).argmax(axis=1)] == truth))
            for combo in itertools.combinations(probabilities, k)
        ]
        rows.append(
            {
                "runs": k,
                "combinations": len(accuracies),
                "accuracy_mean": sum(accuracies) / len(accuracies),
                "accuracy_min": min(accuracies),
                "accuracy_max": max(accuracies),
            }
        )
    return rows


def single(right: np.ndarray) -> dict:
    """One run's accuracy, rows right, binomial standard error and rows from the target."""
    n, count = len(right), int(right.sum())
    accuracy = count / n
    return {
        "accuracy": accuracy,
        "right": count,
        "standard_error": math.sqrt(accuracy * (1 - accuracy) / n),
        "rows_to_target": math.ceil(TARGET * n) - count,
    }


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Accuracy of a minus that of b on the same rows, with McNemar's standard error."""
    n = len(a)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    se = math.sqrt(only_a + only_b - (only_a - only_b) ** 2 / n) / n
    return {
        "only_ours_right": only_a,
        "only_hgb_right": only_b,
        "difference": (only_a - only_b) / n,
        "standard_error": se,
    }


def summarize(result: dict) -> dict:
    """Means over the seeds, how many runs reach the target, and the mean paired difference."""
    ours, hgb = result["ours"], result["hgb"]
    differences = [p["difference"] for run in ours for p in run["vs_hgb"]]
    return {
        "ours_mean": sum(r["accuracy"] for r in ours) / len(ours),
        "hgb_mean": sum(h["accuracy"] for h in hgb) / len(hgb),
        "ours_at_target": sum(r["rows_to_target"] <= 0 for r in ours),
        "hgb_at_target": sum(h["rows_to_target"] <= 0 for h in hgb),
        "mean_difference": sum(differences) / len(differences),
    }


def table(result: dict) -> str:
    hgb_seeds = [h["seed"] for h in result["hgb"]]
    head = f"{'run':>10} {'accuracy':>9} {'right':>7} {'se':>7} {'to ' + str(TARGET):>9}"
    lines = [head + "".join(f" {'vs hgb ' + str(s):>16}" for s in hgb_seeds)]
    for run in result["ours"]:
        cells = "".join(
            f" {p['difference']:>+8.4f} ({p['standard_error']:.4f})" for p in run["vs_hgb"]
        )
        lines.append(
            f"{'ours ' + str(run['seed']):>10} {run['accuracy']:>9.4f} {run['right']:>7,} "
            f"{run['standard_error']:>7.4f} {run['rows_to_target']:>+9}{cells}"
        )
    for h in result["hgb"]:
        lines.append(
            f"{'hgb ' + str(h['seed']):>10} {h['accuracy']:>9.4f} {h['right']:>7,} "
            f"{h['standard_error']:>7.4f} {h['rows_to_target']:>+9}"
        )
    summary = result["summary"]
    lines.append(
        f"{result['test_rows']:,} test rows; 'to {TARGET}': rows more that a run needs right; "
        "'vs hgb': our accuracy minus HGB's (paired standard error)"
    )
    lines.append(
        f"mean accuracy: ours {summary['ours_mean']:.4f} ({summary['ours_at_target']} of "
        f"{len(result['ours'])} seeds at {TARGET}), HGB {summary['hgb_mean']:.4f} "
        f"({summary['hgb_at_target']} of {len(result['hgb'])}); mean paired difference "
        f"{summary['mean_difference']:+.4f}"
    )
    for row in result["averaged"]:
        lines.append(
            f"mean probabilities of {row['runs']} of our runs "
            f"({row['combinations']} way{'s' if row['combinations'] > 1 else ''}): "
            f"accuracy {row['accuracy_mean']:.4f} ({row['accuracy_min']:.4f}-"
            f"{row['accuracy_max']:.4f})"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-paired-data-") as workdir:
        census = quality.census(workdir, quick=False)
    truth = census.test.label
    x_train, x_test = quality.design(census, census.train), quality.design(census, census.test)
    hgb_right = {}
    for seed in (int(s) for s in args.hgb_seeds.split(",")):
        model = quality.baseline("hgb", census, seed).fit(x_train, census.train.label)
        hgb_right[seed] = model.predict(x_test) == truth
    runs, probabilities = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        probability, classes, wall = ours(seed, census.test)
        probabilities.append(probability)
        right = classes[probability.argmax(axis=1)] == truth
        run = {"seed": seed, "wall_seconds": wall, **single(right)}
        run["vs_hgb"] = [{"hgb_seed": s, **paired(right, h)} for s, h in hgb_right.items()]
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "vs_hgb"}), flush=True)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "test_rows": len(truth),
        "target": TARGET,
        "ours": runs,
        "hgb": [{"seed": s, **single(h)} for s, h in hgb_right.items()],
    }
    result["summary"] = summarize(result)
    result["averaged"] = averaged(probabilities, classes, truth)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()
