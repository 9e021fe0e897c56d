"""Census quality benchmark: the AdaNet ensemble against its own members and a plain Keras DNN.

Reads ../shared/data/census (UCI Adult, raw format), trains the default search with
`trainer.task`'s defaults, and reports test accuracy of
  - the final ensemble (the exported SavedModel, served on raw test rows),
  - each member of the final ensemble alone,
  - a plain Keras DNN (2 x 64 ReLU, Adam) on the same encoded features with the same total
    step budget (iterations x steps per iteration, same batch size).
Writes bench/results/quality.json and quality.png, and prints a table.

    .venv/bin/python bench/quality.py [--shared=../shared] [--out=bench/results]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education_num",
    "marital_status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
    "native_country",
    "income_bracket",
]
# From ../shared/data/census/README.md, measured there with scikit-learn.
REFERENCES = {
    "majority class": 0.7638,
    "logistic regression (sklearn)": 0.8530,
    "gradient boosting (sklearn)": 0.8709,
}


def convert(raw_path: str, out_path: str) -> int:
    """UCI format (no header, ', ' separators, test labels ending in '.') to a CSV file."""
    rows = 0
    with open(raw_path) as f, open(out_path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        for line in f:
            fields = [x.strip() for x in line.strip().split(",")]
            if len(fields) != len(COLUMNS):
                continue  # blank lines and the test file's '|1x3 Cross validator' line
            fields[-1] = fields[-1].rstrip(".")
            writer.writerow(fields)
            rows += 1
    return rows


def keras_baseline(
    x_train,
    y_train,
    x_test,
    y_test,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
) -> tuple[float, int]:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((x_train.shape[1],)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    steps_per_epoch = len(x_train) // batch_size
    epochs = max(1, round(steps / steps_per_epoch))
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
    logits = model.predict(x_test, batch_size=8192, verbose=0)[:, 0]
    return float(np.mean((logits > 0) == (y_test == 1))), epochs * steps_per_epoch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", default=os.path.join(REPO, "..", "shared"))
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    parser.add_argument("--job_dir", default=None, help="default: a temporary dir")
    parser.add_argument("trainer_flags", nargs="*", help="extra trainer flags, after --")
    args = parser.parse_args()

    import tensorflow as tf
    from absl import flags, logging

    from bench import census as census_lib
    from trainer import task, training

    logging.set_verbosity(logging.WARNING)
    workdir = tempfile.mkdtemp(prefix="quality-")
    train_csv, test_csv = os.path.join(workdir, "train.csv"), os.path.join(workdir, "test.csv")
    census = os.path.join(args.shared, "data", "census")
    n_train = convert(os.path.join(census, "adult.data"), train_csv)
    n_test = convert(os.path.join(census, "adult.test"), test_csv)
    job = args.job_dir or os.path.join(workdir, "job")
    flags.FLAGS(
        [
            "quality",
            f"--train_data={train_csv}",
            f"--eval_data={test_csv}",
            "--label_column=income_bracket",
            f"--job_dir={job}",
            *args.trainer_flags,
        ]
    )
    config = task.build_config(flags.FLAGS)

    started = time.monotonic()
    report = training.run(config)
    adanet_seconds = time.monotonic() - started
    ensemble_accuracy = report["final"]["metrics"]["accuracy"]

    subnetworks = {s["name"]: s for r in report["iterations"] for s in r["subnetworks"]}
    members = [
        {
            "member": m["key"],
            "iteration": m["iteration"],
            "accuracy": subnetworks[m["key"]]["eval"]["accuracy"],
        }
        for m in report["architecture"]["members"]
    ]
    best_member = max(m["accuracy"] for m in members)

    data = census_lib.census_input(config, job)  # the job's own schema
    x_train, y_train = census_lib.arrays(data.train_encoded())
    x_eval, y_eval = census_lib.arrays(data.eval_encoded())
    search = config.search
    budget = search.max_iterations * search.max_iteration_steps
    started = time.monotonic()
    keras_accuracy, keras_steps = keras_baseline(
        x_train,
        y_train,
        x_eval,
        y_eval,
        steps=budget,
        batch_size=config.train.batch_size,
        learning_rate=config.train.learning_rate,
        seed=config.seed,
    )
    keras_seconds = time.monotonic() - started

    results = {
        "data": {"train_rows": n_train, "test_rows": n_test, "source": census},
        "config": report["config"],
        "ensemble": {
            "accuracy": ensemble_accuracy,
            "auc": report["final"]["metrics"]["auc"],
            "members": len(members),
            "seconds": adanet_seconds,
        },
        "members": members,
        "best_member_accuracy": best_member,
        "ensemble_beats_best_member": ensemble_accuracy > best_member,
        "keras_dnn": {
            "accuracy": keras_accuracy,
            "steps": keras_steps,
            "seconds": keras_seconds,
            "architecture": "2 x 64 ReLU, Adam",
        },
        "references": REFERENCES,
        "target": {"accuracy": 0.86, "met": ensemble_accuracy >= 0.86},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
        },
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quality.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(args.out, "quality.png"))
    print(table(results))


def table(results: dict) -> str:
    rows = [("AdaNet ensemble (exported model)", results["ensemble"]["accuracy"])]
    rows += [(f"  member {m['member']} alone", m["accuracy"]) for m in results["members"]]
    rows.append(
        (
            f"plain Keras DNN, {results['keras_dnn']['steps']} steps",
            results["keras_dnn"]["accuracy"],
        )
    )
    rows += [(f"reference: {k}", v) for k, v in results["references"].items()]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'census test accuracy'.ljust(width)}  value", "-" * (width + 8)]
    lines += [f"{name.ljust(width)}  {value:.4f}" for name, value in rows]
    lines.append(
        f"\nensemble beats its best member: {results['ensemble_beats_best_member']}; "
        f"target 0.86 met: {results['target']['met']}; AdaNet wall time "
        f"{results['ensemble']['seconds']:.0f} s on {results['machine']['cpus']} cores"
    )
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["ensemble"] + [m["member"] for m in results["members"]] + ["Keras DNN"]
    values = (
        [results["ensemble"]["accuracy"]]
        + [m["accuracy"] for m in results["members"]]
        + [results["keras_dnn"]["accuracy"]]
    )
    colors = ["tab:green"] + ["tab:blue"] * len(results["members"]) + ["tab:gray"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(names, values, color=colors)
    for name, value in results["references"].items():
        if value > 0.8:
            ax.axhline(value, linestyle="--", linewidth=1, color="tab:red")
            ax.text(len(names) - 0.5, value, name, ha="right", va="bottom", fontsize=8)
    ax.set_ylim(0.84, 0.875)
    ax.set_ylabel("test accuracy (census, 16,281 rows)")
    ax.set_title("AdaNet ensemble vs its members and a plain DNN")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
