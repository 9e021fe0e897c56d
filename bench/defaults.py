"""Batch size and learning rate of one process on census: examples/s against test accuracy.

Run from the repo root::

    .venv/bin/python bench/defaults.py                  # 64..1024 x two learning rates x 3 seeds
    .venv/bin/python bench/defaults.py --batch_sizes=64,512 --learning_rates=0.003 --seeds=1
    .venv/bin/python bench/defaults.py --examples_per_iteration=192000 \\
        --out=bench/results/defaults_examples.json      # the same examples at every batch size
    .venv/bin/python bench/defaults.py --baseline_commit=895fce9 --batch_sizes=256 \\
        --learning_rates=0.003 --examples_per_iteration=192000 \\
        --out=bench/results/defaults_baseline.json     # against an older commit's defaults
    .venv/bin/python bench/defaults.py --batch_sizes=256 --learning_rates=0.003 \\
        --examples_per_iteration=192000 --flag_sets='--num_bins=16;--num_bins=32;--num_bins=48' \\
        --seeds=1,2,3,4,5 --out=bench/results/defaults_bins.json   # other flags, a row each
    .venv/bin/python bench/defaults.py --batch_sizes=256 --learning_rates=0.003 --seeds=1,2,3,4,5 \\
        --flag_sets='--learning_rate_schedule=constant;--learning_rate_schedule=cosine' \\
        --out=bench/results/defaults_schedule.json

Each (batch size, learning rate, seed) is a real `python -m trainer.task` run of the default
search (its flags, with only these three changed) on the census data shipped with the package.
From each run's `report.json` it reads the training examples/s of every iteration (steps/s x
batch size, after the first chunk), the wall seconds of the whole run, and the exported model's
test accuracy. The first batch size and learning rate listed are the baseline of the ratio
column (same session, same machine: the machines are shared and noisy). With
--baseline_commit the baseline is that commit instead, run with its own default flags from a
temporary git worktree (the code and defaults a user had then). This is the evidence
for the defaults of `trainer/task.py`: a default must train faster without losing accuracy.

Figures go to --out (JSON, with the machine's core count) and a table to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import worktree


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch_sizes", default="64,256,512,1024")
    p.add_argument("--learning_rates", default="0.001,0.003")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument(
        "--examples_per_iteration",
        type=int,
        default=None,
        help="train each iteration on this many examples (its steps: this / batch size) instead "
        "of the default step budget",
    )
    p.add_argument(
        "--flag_sets",
        default="",
        help="';'-separated sets of other trainer flags, each a row (e.g. "
        "'--num_bins=16;--num_bins=48'); they come last, so one of them overrides the "
        "row's batch size or learning rate",
    )
    p.add_argument(
        "--baseline_commit",
        default=None,
        help="first run this commit of the trainer with its own defaults, as the ratio's baseline",
    )
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "defaults.json"))
    return p.parse_args(argv)


def run_once(
    batch_size: int | None,
    learning_rate: float | None,
    seed: int,
    examples: int | None,
    code: str = "HEAD",
    root: str = ROOT,
    extra: str = "",
) -> dict:
    """One trainer run from `root`; its examples/s, wall seconds and test accuracy.

    A batch size or learning rate of None leaves the trainer's own default (a baseline commit).
    """
    flags = [f"--seed={seed}"]
    if batch_size is not None:
        flags += [f"--batch_size={batch_size}", f"--learning_rate={learning_rate}"]
        if examples:
            flags.append(f"--max_iteration_steps={round(examples / batch_size)}")
    flags += extra.split()  # last: a flag set's --learning_rate wins (absl keeps the last)
    with tempfile.TemporaryDirectory(prefix="bench-defaults-") as job_dir:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "trainer.task", f"--job_dir={job_dir}", *flags],
            cwd=root,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - started
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
    first = report["iterations"][0]
    rates = [i["examples_per_sec"] for i in report["iterations"] if i["examples_per_sec"]]
    return {
        "code": code,
        "flags": extra,
        "batch_size": first["batch_size"],
        "learning_rate": learning_rate if learning_rate is not None else "default",
        "seed": seed,
        "steps_per_iteration": first["steps"],
        "examples_per_sec": statistics.median(rates),
        "wall_seconds": wall,
        "accuracy": report["final"]["metrics"]["accuracy"],
    }


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (code, flags, batch size, learning rate): medians and means over the
    seeds."""
    rows = []
    for (code, extra, batch_size, learning_rate), runs_of_setting in itertools.groupby(
        runs, key=lambda r: (r["code"], r["flags"], r["batch_size"], r["learning_rate"])
    ):
        group = list(runs_of_setting)
        accuracies = [r["accuracy"] for r in group]
        rows.append(
            {
                "code": code,
                "flags": extra,
                "batch_size": batch_size,
                "steps_per_iteration": group[0]["steps_per_iteration"],
                "learning_rate": learning_rate,
                "seeds": len(group),
                "examples_per_sec": statistics.median(r["examples_per_sec"] for r in group),
                "wall_seconds": statistics.median(r["wall_seconds"] for r in group),
                "accuracy_mean": statistics.fmean(accuracies),
                "accuracy_sd": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            }
        )
    baseline = rows[0]["examples_per_sec"]
    for row in rows:
        row["ratio"] = row["examples_per_sec"] / baseline
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        f"{'code':>8} {'batch':>6} {'steps':>6} {'lr':>7} {'examples/s':>11} {'ratio':>6} "
        f"{'wall s':>7} {'accuracy':>9} {'sd':>7} {'seeds':>5}"
    ]
    for r in rows:
        lines.append(
            f"{r['code']:>8} {r['batch_size']:>6} {r['steps_per_iteration']:>6} "
            f"{r['learning_rate']!s:>7} "
            f"{r['examples_per_sec']:>11,.0f} "
            f"{r['ratio']:>5.2f}x {r['wall_seconds']:>7.1f} {r['accuracy_mean']:>9.4f} "
            f"{r['accuracy_sd']:>7.4f} {r['seeds']:>5} {r['flags']}"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    learning_rates = [float(lr) for lr in args.learning_rates.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []

    def record(run: dict) -> None:
        runs.append(run)
        print(json.dumps(run), flush=True)

    if args.baseline_commit:
        with worktree.checkout(args.baseline_commit, "bench-defaults-baseline-") as old:
            for seed in seeds:
                record(run_once(None, None, seed, None, args.baseline_commit, old))
    flag_sets = args.flag_sets.split(";")
    for extra, batch_size, learning_rate in itertools.product(
        flag_sets, batch_sizes, learning_rates
    ):
        for seed in seeds:
            record(
                run_once(batch_size, learning_rate, seed, args.examples_per_iteration, extra=extra)
            )
    rows = summarize(runs)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "examples_per_iteration": args.examples_per_iteration,
        "baseline_commit": args.baseline_commit,
        "rows": rows,
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
