"""A table with a date column, as a new user brings one (issue 42): what the trainer's defaults
make of it, what the scan warns, and the accuracy with the fix it suggests, beside
scikit-learn's logistic regression and HistGradientBoosting on the same split.

    .venv/bin/python bench/date_column.py          # about 3 minutes on 2 cores

The table is generated (seed 7, nothing downloaded, nothing committed): 2,700 training and 600
eval rows of age and income (numbers, missing as "", "NA" or "?"), plan and region
(categories, "?" one of them) and a signup date over 336 days that the label does not depend
on. Writes bench/results/date_column.json and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = ["age", "income", "plan", "region", "signup_date", "churn"]
PLANS = {"basic": -0.5, "plus": 0.2, "pro": 0.8}


def _rows(rng: np.random.Generator, n: int) -> list[list[str]]:
    rows = []
    for _ in range(n):
        age = int(rng.integers(18, 80))
        income = float(rng.lognormal(10.5, 0.5))
        plan = str(rng.choice(list(PLANS), p=[0.5, 0.3, 0.2]))
        region = str(rng.choice(["north", "south", "east", "west", "?"]))
        day = datetime.date(2023, 1, 1) + datetime.timedelta(days=int(rng.integers(0, 336)))
        score = 0.04 * (age - 45) + 0.8 * (np.log(income) - 10.5) + PLANS[plan]
        label = "yes" if score + 0.9 * rng.normal() > 0 else "no"
        shown_age = "" if rng.random() < 0.1 else str(age)
        shown_income = f"{income:.0f}"
        if rng.random() < 0.12:
            shown_income = "NA" if rng.random() < 0.5 else "?"
        rows.append([shown_age, shown_income, plan, region, day.isoformat(), label])
    return rows


def _write(path: str, rows: list[list[str]]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


def _trainer(train: str, eval_data: str, job_dir: str, *flags: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.task",
            f"--train_data={train}",
            f"--eval_data={eval_data}",
            "--label_column=churn",
            f"--job_dir={job_dir}",
            *flags,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: column")]
    return {
        "metrics": report["final"]["metrics"],
        "scan_warnings": warned,
        "overfitting_iterations": [e["iteration"] for e in report.get("overfitting") or []],
    }


def _baselines(train: str, eval_data: str) -> dict:
    import pandas as pd
    from sklearn.compose import make_column_transformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    read = lambda path: pd.read_csv(path, na_values=["NA", "?"])  # noqa: E731
    train_df, eval_df = read(train), read(eval_data)
    y, y_eval = train_df.churn == "yes", eval_df.churn == "yes"
    numbers, categories = ["age", "income"], ["plan", "region"]
    fill = {c: "" for c in categories}
    encode = make_column_transformer(
        (make_pipeline(SimpleImputer(), StandardScaler()), numbers),
        (OneHotEncoder(handle_unknown="ignore"), categories),
    )
    linear = make_pipeline(encode, LogisticRegression(max_iter=2000))
    linear.fit(train_df[numbers + categories].fillna(fill), y)
    p_linear = linear.predict_proba(eval_df[numbers + categories].fillna(fill))[:, 1]
    x, x_eval = train_df[numbers + categories].copy(), eval_df[numbers + categories].copy()
    for c in categories:
        x[c] = x[c].astype("category")
        x_eval[c] = pd.Categorical(x_eval[c], categories=x[c].cat.categories)
    trees = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0)
    p_trees = trees.fit(x, y).predict_proba(x_eval)[:, 1]
    return {
        name: {"accuracy": accuracy_score(y_eval, p > 0.5), "auc": roc_auc_score(y_eval, p)}
        for name, p in (("logistic regression", p_linear), ("HistGradientBoosting", p_trees))
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "date_column.json"))
    args = p.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="date-column-") as tmp:
        train = _write(os.path.join(tmp, "train.csv"), _rows(rng, 2700))
        eval_data = _write(os.path.join(tmp, "eval.csv"), _rows(rng, 600))
        runs = {
            "trainer, default flags": _trainer(train, eval_data, os.path.join(tmp, "a")),
            "trainer, --ignore_columns=signup_date": _trainer(
                train, eval_data, os.path.join(tmp, "b"), "--ignore_columns=signup_date"
            ),
        }
        baselines = _baselines(train, eval_data)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"runs": runs, "baselines": baselines}, f, indent=1)
    print("| model (600 eval rows) | accuracy | AUC | scan warned | over-fitting iterations |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        m = run["metrics"]
        warned = "signup_date" if any("signup_date" in w for w in run["scan_warnings"]) else "-"
        over = ", ".join(map(str, run["overfitting_iterations"])) or "-"
        print(f"| {name} | {m['accuracy']:.4f} | {m['auc']:.4f} | {warned} | {over} |")
    for name, m in baselines.items():
        print(f"| {name} (without the date) | {m['accuracy']:.4f} | {m['auc']:.4f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
