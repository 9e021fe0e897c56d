"""Missing values that speak (issue 47): on a generated table whose label depends on whether a
number is missing, the trainer with its missing indicators (the default) and without them
(`--missing_indicators=false`: a missing number is the column's mean, nothing else), seeds
1-3, beside scikit-learn's HistGradientBoosting (which routes missing values by learning).

    .venv/bin/python bench/missing.py              # about 5 minutes on 2 cores

The table (seed 7 for the data, nothing downloaded, nothing committed): 8,000 training and
4,000 eval rows of four numbers and a category. `visits` (a count, 0-10, binomial: its mean 5
is also its most frequent value) is missing in 25% of the rows, and the label's logit is
1.2 x2 - 0.8 x3 + plan effect, plus 2.5 where visits is missing, else 0.6 x standardised
visits. A missing count is a strong signal that the mean cannot carry: imputed, it is the
same 5 as the rows that did visit five times. `tenure` is missing in 10% of the rows at random
(no signal). Writes bench/results/missing.json and prints a table: each setting's eval accuracy
and log loss per seed, their mean, and the paired difference with its standard error.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = ["visits", "tenure", "x2", "x3", "plan", "label"]
PLANS = {"basic": -0.4, "plus": 0.1, "pro": 0.6}
SETTINGS = {"indicators (default)": [], "no indicators": ["--missing_indicators=false"]}


def _rows(rng: np.random.Generator, n: int) -> list[list[str]]:
    visits = rng.binomial(10, 0.5, n)
    tenure = rng.normal(0, 1, n)
    x2, x3 = rng.normal(0, 1, (2, n))
    plan = rng.choice(list(PLANS), n, p=[0.5, 0.3, 0.2])
    visits_missing = rng.random(n) < 0.25
    logit = 1.2 * x2 - 0.8 * x3 + np.array([PLANS[p] for p in plan])
    logit += np.where(visits_missing, 2.5, 0.6 * (visits - 5) / np.sqrt(2.5))
    label = logit + rng.logistic(0, 1, n) > 0.5
    tenure_missing = rng.random(n) < 0.1
    return [
        [
            "" if visits_missing[i] else str(visits[i]),
            "" if tenure_missing[i] else f"{5 + 2 * tenure[i]:.2f}",
            f"{x2[i]:.4f}",
            f"{x3[i]:.4f}",
            plan[i],
            "yes" if label[i] else "no",
        ]
        for i in range(n)
    ]


def _write(path: str, rows: list[list[str]]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


def _trainer(train: str, eval_data: str, job_dir: str, seed: int, flags: list[str]) -> dict:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.task",
            f"--train_data={train}",
            f"--eval_data={eval_data}",
            "--label_column=label",
            f"--job_dir={job_dir}",
            f"--seed={seed}",
            *flags,
        ],
        cwd=os.environ.get("BENCH_TRAINER_ROOT", REPO),
        capture_output=True,
        text=True,
        check=True,
    )
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    return report["final"]["metrics"]


def _trees(train: str, eval_data: str, seed: int) -> dict:
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import accuracy_score, log_loss

    train_df, eval_df = pd.read_csv(train), pd.read_csv(eval_data)
    columns = HEADER[:-1]
    for frame in (train_df, eval_df):
        frame["plan"] = pd.Categorical(frame["plan"], categories=list(PLANS))
    model = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=seed)
    model.fit(train_df[columns], train_df.label == "yes")
    p = model.predict_proba(eval_df[columns])[:, 1]
    y = eval_df.label == "yes"
    return {"accuracy": accuracy_score(y, p > 0.5), "loss": log_loss(y, p)}


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    d = np.asarray(a) - np.asarray(b)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "missing.json"))
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rng = np.random.default_rng(7)
    runs: dict[str, list[dict]] = {name: [] for name in [*SETTINGS, "HistGradientBoosting"]}
    with tempfile.TemporaryDirectory(prefix="missing-") as tmp:
        train = _write(os.path.join(tmp, "train.csv"), _rows(rng, 8000))
        eval_data = _write(os.path.join(tmp, "eval.csv"), _rows(rng, 4000))
        for seed in seeds:
            for i, (name, flags) in enumerate(SETTINGS.items()):
                job_dir = os.path.join(tmp, f"s{seed}-{i}")
                runs[name].append(
                    {"seed": seed, **_trainer(train, eval_data, job_dir, seed, flags)}
                )
            runs["HistGradientBoosting"].append({"seed": seed, **_trees(train, eval_data, seed)})
    on, off = runs["indicators (default)"], runs["no indicators"]
    summary = {
        metric: dict(
            zip(("mean", "se"), _paired([r[metric] for r in on], [r[metric] for r in off]))
        )
        for metric in ("accuracy", "loss")
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"runs": runs, "indicators_minus_none": summary, "seeds": seeds}, f, indent=1)
    print("| model (4,000 eval rows) | accuracy by seed | mean | log loss by seed | mean |")
    print("|---|---|---|---|---|")
    for name, rows in runs.items():
        acc = [r["accuracy"] for r in rows]
        loss = [r["loss"] for r in rows]
        print(
            f"| {name} | {', '.join(f'{a:.4f}' for a in acc)} | {np.mean(acc):.4f} | "
            f"{', '.join(f'{x:.4f}' for x in loss)} | {np.mean(loss):.4f} |"
        )
    a, b = summary["accuracy"], summary["loss"]
    print(
        f"\nindicators - none, paired over seeds: accuracy {a['mean']:+.4f} (SE {a['se']:.4f}), "
        f"log loss {b['mean']:+.4f} (SE {b['se']:.4f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
