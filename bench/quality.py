"""Quality benchmark: the trainer against scikit-learn baselines on census and other tables.

Each data set is written once as CSV files with a header and a `label` column (the large
generated sets as gzip shards, which the trainer streams) and split once into train and test
rows: census has its own test file; scikit-learn's bundled sets get a 75/25 split with seed 0
(stratified for classes); generated sets train on their first rows and test on the rest.
Then, for each data set and each seed:

- ours: `python -m trainer.task --train_data=... --label_column=label --job_dir=... --seed=S`
  plus --trainer_flags, in a subprocess, with no eval data: the trainer holds out
  --holdout_fraction of the train rows for its own choices and never sees a test row. The
  exported SavedModel (`serving_default`: raw columns by name) predicts the test rows; the
  members of the final ensemble are rebuilt from the job dir (as the evaluator replica
  rebuilds them) and predict the test rows alone, to tell whether the ensemble beats its best
  member. Seconds: the whole process, from start to exported model.
- linear: standardised numerics and one-hot categoricals; LogisticRegression (max_iter
  5,000) or Ridge.
- hgb: HistGradientBoostingClassifier/Regressor with defaults; categoricals ordinal-encoded
  and declared in `categorical_features` (native categorical splits; a category unseen in
  training is missing).
- mlp: MLPClassifier/MLPRegressor with defaults on the linear model's features (regression:
  the target standardised, as the trainer trains on it).

Baselines train on every train row, with the run's seed as `random_state`; their seconds are
fit + predict. Metrics: test accuracy (classification), test RMSE and R² (regression).

Data sets (--datasets, default all): census (UCI Adult, 32,561 train rows, binary),
breast_cancer (569 rows, binary), wine (178, 3 classes), diabetes (442, regression), digits
(1,797, 10 classes), gen_binary (make_classification: --large_rows train rows, 120,000 by
default, and a quarter as many test rows; 16 numeric and 3 categorical columns, one of 200
categories; 5% of labels flipped), gen_regression (make_friedman1 with noise 1 plus a
categorical column that shifts the target; as many rows), friedman_small (the same with
320 train rows, a small table that is not linear). Generated data lives in a temporary dir,
in 4 gzip shards.

Writes --out_dir/quality.json (every run, the summary, the machine, the flags) and
quality.png (a panel per data set), and prints a table. Run from the repo root::

    .venv/bin/python bench/quality.py                                    # everything, seeds 1-5
    .venv/bin/python bench/quality.py --quick --datasets=wine,diabetes   # a smoke run
    .venv/bin/python bench/quality.py --datasets=census --merge \\
        --trainer_flags='--max_iterations=5'   # re-run one data set, keep the others' rows
    .venv/bin/python bench/quality.py --methods=ours --merge   # only ours, keep the baselines
    .venv/bin/python bench/quality.py --report_only     # the table and plot of quality.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import gzip
import itertools
import json
import math
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import worktree

LABEL = "label"
METHODS = ("ours", "linear", "hgb", "mlp")
DATASETS = (
    "census",
    "breast_cancer",
    "wine",
    "diabetes",
    "friedman_small",
    "digits",
    "gen_binary",
    "gen_regression",
)
SPLIT_SEED = 0  # the train/test split of every data set, whatever the run's seed
QUICK_ROWS = 4_000  # --quick: train rows of census and the generated sets
FRIEDMAN_SMALL_ROWS = 320  # train rows of friedman_small (and a quarter as many test rows)
QUICK_TRAINER_FLAGS = ("--max_iterations=2", "--max_iteration_steps=100")
PREDICT_BATCH = 8_192
BASELINES = {
    "linear": "standardised numerics + one-hot categoricals; LogisticRegression(max_iter=5000) "
    "or Ridge()",
    "hgb": "HistGradientBoostingClassifier/Regressor defaults; categoricals ordinal-encoded as "
    "categorical_features (unseen categories missing)",
    "mlp": "MLPClassifier/MLPRegressor defaults on the linear model's features; regression "
    "target standardised (TransformedTargetRegressor)",
}
CENSUS_COLUMNS = (
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
)
CENSUS_NUMERIC = (
    "age",
    "fnlwgt",
    "education_num",
    "capital_gain",
    "capital_loss",
    "hours_per_week",
)


# -- data sets ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Split:
    """One side of a data set exactly as its CSV files hold it: each column's text by name, and
    the label's text. The trainer reads the files; the baselines and the test predictions
    read these same values, so both see the same data."""

    columns: dict[str, np.ndarray]
    label: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.label)

    def numbers(self, name: str) -> np.ndarray:
        return _numbers(self.columns[name])

    def take(self, rows: np.ndarray) -> Split:
        return Split({k: v[rows] for k, v in self.columns.items()}, self.label[rows])


@dataclasses.dataclass(frozen=True)
class DataSet:
    """A table split into train and test rows, and the train rows' files for the trainer."""

    name: str
    task: str  # binary | multiclass | regression
    source: str
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    train: Split
    test: Split
    train_data: str  # --train_data: a file or a glob of shards

    @property
    def metric(self) -> str:
        return "rmse" if self.task == "regression" else "accuracy"

    def describe(self) -> dict:
        return {
            "task": self.task,
            "source": self.source,
            "train_rows": self.train.rows,
            "test_rows": self.test.rows,
            "numeric_columns": len(self.numeric),
            "categorical_columns": len(self.categorical),
            "classes": None if self.task == "regression" else len(np.unique(self.train.label)),
            "metric": self.metric,
        }


def _numbers(text: np.ndarray) -> np.ndarray:
    return np.where(np.isin(text, ["", "?"]), "nan", text).astype(np.float64)


def _text(values: np.ndarray, fmt: str = "%.6g") -> np.ndarray:
    return np.char.mod(fmt, values).astype(str)


def write_csv(split: Split, path_prefix: str, *, shards: int = 1) -> str:
    """Writes `split` as CSV with a header (label last); several gzip shards when `shards` >
    1. Returns what --train_data takes: the file, or the shards' glob."""
    names = [*split.columns, LABEL]
    columns = [*split.columns.values(), split.label]
    bounds = np.linspace(0, split.rows, shards + 1).astype(int)
    for shard in range(shards):
        path = f"{path_prefix}.csv" if shards == 1 else f"{path_prefix}-{shard:05d}.csv.gz"
        opener = gzip.open if shards > 1 else open
        with opener(path, "wt", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(names)
            rows = slice(bounds[shard], bounds[shard + 1])
            writer.writerows(zip(*(c[rows] for c in columns)))
    return f"{path_prefix}.csv" if shards == 1 else f"{path_prefix}-*.csv.gz"


def _clean(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_")


def census(workdir: str, *, quick: bool) -> DataSet:
    """UCI Adult as the package ships it (trainer/data/census: its own train and test files,
    each with a header); --quick: the first QUICK_ROWS train rows and half as many test rows."""
    from trainer.input import files  # TensorFlow: loaded only when census is asked for

    def read(path: str, limit: int | None) -> Split:
        with gzip.open(path, "rt", newline="") as f:
            reader = csv.reader(f)
            header = tuple(next(reader))
            if header != CENSUS_COLUMNS:
                raise ValueError(f"{path}: columns {header}, expected {CENSUS_COLUMNS}.")
            rows = list(itertools.islice(reader, limit))
        table = np.array(rows, dtype=str)
        features = {name: table[:, i] for i, name in enumerate(CENSUS_COLUMNS[:-1])}
        return Split(features, table[:, -1])

    train = read(files.CENSUS_TRAIN, QUICK_ROWS if quick else None)
    test = read(files.CENSUS_TEST, QUICK_ROWS // 2 if quick else None)
    numeric = CENSUS_NUMERIC
    categorical = tuple(c for c in CENSUS_COLUMNS[:-1] if c not in numeric)
    path = write_csv(train, os.path.join(workdir, "census-train"))
    return DataSet("census", "binary", "UCI Adult", numeric, categorical, train, test, path)


def bundled(name: str, workdir: str) -> DataSet:
    """One of scikit-learn's bundled data sets (no download), split 75/25 with SPLIT_SEED."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    loaders = {
        "breast_cancer": (datasets.load_breast_cancer, "binary"),
        "wine": (datasets.load_wine, "multiclass"),
        "diabetes": (datasets.load_diabetes, "regression"),
        "digits": (datasets.load_digits, "multiclass"),
    }
    loader, task = loaders[name]
    bunch = loader()
    names = [_clean(str(n)) for n in bunch.feature_names]
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: feature names {names} are not unique once cleaned.")
    columns = {n: _text(bunch.data[:, i], "%.8g") for i, n in enumerate(names)}
    if task == "regression":
        label = _text(bunch.target, "%.8g")
    else:
        label = bunch.target.astype(int).astype(str)
    table = Split(columns, label)
    train_rows, test_rows = train_test_split(
        np.arange(table.rows),
        test_size=0.25,
        random_state=SPLIT_SEED,
        stratify=None if task == "regression" else label,
    )
    train, test = table.take(np.sort(train_rows)), table.take(np.sort(test_rows))
    path = write_csv(train, os.path.join(workdir, f"{name}-train"))
    source = f"sklearn.datasets.{loader.__name__}, 75/25 split (seed {SPLIT_SEED})"
    return DataSet(name, task, source, tuple(names), (), train, test, path)


def _bins(values: np.ndarray, count: int) -> np.ndarray:
    """Each value's quantile bin, 0 to count - 1."""
    edges = np.quantile(values, np.linspace(0, 1, count + 1)[1:-1])
    return np.searchsorted(edges, values)


def gen_binary(workdir: str, train_rows: int) -> DataSet:
    """make_classification: 8 informative, 4 redundant and 8 noise features, 3 clusters per
    class, 5% of labels flipped. Four informative features become 3 categorical columns (8
    bins; 5 x 5 bins of two; 200 bins, above the trainer's one-hot limit) and are dropped."""
    from sklearn.datasets import make_classification

    rows = train_rows + train_rows // 4
    x, y = make_classification(
        n_samples=rows,
        n_features=20,
        n_informative=8,
        n_redundant=4,
        n_clusters_per_class=3,
        flip_y=0.05,
        shuffle=False,  # keeps the informative features first; rows are shuffled below
        random_state=SPLIT_SEED,
    )
    order = np.random.default_rng(SPLIT_SEED).permutation(rows)
    x, y = x[order], y[order]
    columns = {f"x{i}": _text(x[:, i], "%.5g") for i in range(4, 20)}
    columns["cat_a"] = np.char.add("a", _bins(x[:, 0], 8).astype(str))
    pairs = _bins(x[:, 1], 5) * 5 + _bins(x[:, 2], 5)
    columns["cat_b"] = np.char.add("b", pairs.astype(str))
    columns["cat_c"] = np.char.add("c", _bins(x[:, 3], 200).astype(str))
    return _generated(
        "gen_binary",
        "binary",
        "sklearn make_classification (seed 0), 4 informative features binned to 3 categoricals",
        Split(columns, y.astype(str)),
        train_rows,
        workdir,
    )


def gen_regression(workdir: str, train_rows: int, name: str = "gen_regression") -> DataSet:
    """make_friedman1 (10 features, 5 informative, noise 1) plus a column of 8 groups, each
    shifting the target by its own offset (normal, sd 3). As `friedman_small`, a table of a
    few hundred rows whose target is not linear in its columns (sin(pi x0 x1), (x2 - 0.5)^2):
    where the small-table rules must still let the search grow past the linear model."""
    from sklearn.datasets import make_friedman1

    rows = train_rows + train_rows // 4
    x, y = make_friedman1(n_samples=rows, n_features=10, noise=1.0, random_state=SPLIT_SEED)
    rng = np.random.default_rng(SPLIT_SEED)
    group = rng.integers(0, 8, rows)
    y = y + rng.normal(0, 3, 8)[group]
    columns = {f"x{i}": _text(x[:, i], "%.5g") for i in range(10)}
    columns["group"] = np.char.add("g", group.astype(str))
    return _generated(
        name,
        "regression",
        "sklearn make_friedman1 (seed 0, noise 1) + a group offset",
        Split(columns, _text(y, "%.6g")),
        train_rows,
        workdir,
    )


def _generated(
    name: str, task: str, source: str, table: Split, train_rows: int, workdir: str
) -> DataSet:
    """The first `train_rows` rows train (4 gzip shards), the rest test. Numeric columns are
    named x<i>, the others are categorical."""
    train, test = table.take(np.arange(train_rows)), table.take(np.arange(train_rows, table.rows))
    path = write_csv(train, os.path.join(workdir, f"{name}-train"), shards=4)
    numeric = tuple(c for c in table.columns if c.startswith("x"))
    categorical = tuple(c for c in table.columns if c not in numeric)
    return DataSet(name, task, source, numeric, categorical, train, test, path)


def load(name: str, workdir: str, *, quick: bool, large_rows: int) -> DataSet:
    if name == "census":
        return census(workdir, quick=quick)
    if name == "gen_binary":
        return gen_binary(workdir, QUICK_ROWS if quick else large_rows)
    if name == "gen_regression":
        return gen_regression(workdir, QUICK_ROWS if quick else large_rows)
    if name == "friedman_small":
        return gen_regression(workdir, FRIEDMAN_SMALL_ROWS, name="friedman_small")
    return bundled(name, workdir)


# -- metrics ------------------------------------------------------------------------------


def score(task: str, truth: np.ndarray, predicted: np.ndarray) -> dict:
    """Accuracy, or RMSE and R², of predicted labels (text) or values against the labels'
    text."""
    if task != "regression":
        return {"accuracy": float(np.mean(predicted.astype(str) == truth))}
    y = truth.astype(np.float64)
    residual = predicted.astype(np.float64) - y
    return {
        "rmse": float(np.sqrt(np.mean(residual**2))),
        "r2": float(1 - np.sum(residual**2) / np.sum((y - y.mean()) ** 2)),
    }


def beats(a: float, b: float, metric: str) -> bool:
    return a < b if metric == "rmse" else a > b


def compare(a: float, b: float, metric: str) -> str:
    """ "better", "tie" or "worse": `a` against `b` on `metric`."""
    if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
        return "tie"
    return "better" if beats(a, b, metric) else "worse"


# -- baselines ----------------------------------------------------------------------------


def design(dataset: DataSet, split: Split) -> np.ndarray:
    """The baselines' input: numeric columns (floats), then categorical ones (text)."""
    table = np.empty((split.rows, len(dataset.numeric) + len(dataset.categorical)), object)
    for i, name in enumerate(dataset.numeric):
        table[:, i] = split.numbers(name)
    for i, name in enumerate(dataset.categorical, start=len(dataset.numeric)):
        table[:, i] = split.columns[name]
    return table


def baseline(method: str, dataset: DataSet, seed: int):
    """An unfitted scikit-learn pipeline of `method` (see BASELINES)."""
    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    regression = dataset.task == "regression"
    numeric = list(range(len(dataset.numeric)))
    categorical = list(range(len(numeric), len(numeric) + len(dataset.categorical)))
    if method == "hgb":
        ordinal = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan)
        features = ColumnTransformer(
            [("categorical", ordinal, categorical), ("numeric", "passthrough", numeric)]
        )
        hgb = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
        declared = list(range(len(categorical))) or None
        return make_pipeline(features, hgb(categorical_features=declared, random_state=seed))
    features = ColumnTransformer(
        [
            ("numeric", StandardScaler(), numeric),
            ("categorical", OneHotEncoder(handle_unknown="ignore"), categorical),
        ]
    )
    if method == "linear":
        return make_pipeline(features, Ridge() if regression else LogisticRegression(max_iter=5000))
    if method == "mlp":
        if regression:
            mlp = MLPRegressor(random_state=seed)
            return make_pipeline(
                features, TransformedTargetRegressor(regressor=mlp, transformer=StandardScaler())
            )
        return make_pipeline(features, MLPClassifier(random_state=seed))
    raise ValueError(f"method '{method}' is not a baseline; use one of {list(BASELINES)}.")


def run_baseline(method: str, dataset: DataSet, seed: int) -> dict:
    from sklearn.exceptions import ConvergenceWarning

    x_train, x_test = design(dataset, dataset.train), design(dataset, dataset.test)
    y_train = dataset.train.label
    if dataset.task == "regression":
        y_train = y_train.astype(np.float64)
    model = baseline(method, dataset, seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        started = time.perf_counter()
        model.fit(x_train, y_train)
        predicted = model.predict(x_test)
        seconds = time.perf_counter() - started
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    metrics = score(dataset.task, dataset.test.label, predicted)
    return {**metrics, "seconds": seconds, "converged": converged}


# -- ours ---------------------------------------------------------------------------------


def model_inputs(test: Split, signature: dict) -> Iterator[dict]:
    """The test rows in batches, each raw column as the serving signature types it."""
    import tensorflow as tf

    for start in range(0, test.rows, PREDICT_BATCH):
        rows = slice(start, start + PREDICT_BATCH)
        batch = {}
        for name, spec in signature.items():
            if spec.dtype == tf.string:
                batch[name] = tf.constant(test.columns[name][rows])
            else:
                batch[name] = tf.constant(test.numbers(name)[rows], spec.dtype)
        yield batch


def test_score(task: str, test: Split, signature: dict, outputs: Callable[[dict], dict]) -> dict:
    """The test metrics of a model: `outputs` maps a batch of raw columns to serving outputs
    (`classes` or `predictions`)."""
    key = "predictions" if task == "regression" else "classes"
    parts = [outputs(batch)[key].numpy() for batch in model_inputs(test, signature)]
    predicted = np.concatenate(parts)
    return score(task, test.label, predicted if task == "regression" else predicted.astype(str))


def evaluate_export(job_dir: str, trainer_argv: Sequence[str], task: str, test: Split) -> dict:
    """The exported model's test metrics, and those of the final ensemble rebuilt from the job
    dir (by the trainer's own factory, as its evaluator replica rebuilds it) and of each of
    its members alone. Runs in a fresh child process: TensorFlow (its thread pools, its
    memory, the trainer's modules as they were when imported) stays out of the process that
    times the baselines."""
    warnings.simplefilter("ignore", FutureWarning)  # google-api-core's, on importing trainer
    import tensorflow as tf

    def score(model_dir: str) -> tuple[dict, dict]:
        """The export's test metrics, and its serving signature's inputs."""
        serving = tf.saved_model.load(model_dir).signatures["serving_default"]
        signature = serving.structured_input_signature[1]
        return test_score(task, test, signature, lambda batch: serving(**batch)), signature

    export, signature = score(os.path.join(job_dir, "model"))
    result: dict[str, Any] = {"export": export}
    bags = os.path.join(job_dir, "bags")
    if os.path.isdir(bags):  # a bagged job: each bag's own export too (bag 0: the same search
        # as --bags=1); its members are the bags'
        count = len(os.listdir(bags))
        result["bags_test"] = [score(os.path.join(bags, str(b), "model"))[0] for b in range(count)]
        result["members_test"] = {"error": "a bagged job: see bags_test"}
        return result
    try:
        result["members_test"] = _member_scores(task, test, trainer_argv, signature)
    except Exception as e:  # the trainer's internals moved: the export's metrics still count
        result["members_test"] = {"error": repr(e)}
    return result


def _member_scores(task: str, test: Split, trainer_argv: Sequence[str], signature: dict) -> dict:
    from absl import flags

    from trainer import task as task_lib
    from trainer.input.features import Preprocessor
    from trainer.input.schema import Schema
    from trainer.model.heads import Head
    from trainer.search import adapt
    from trainer.search import record as record_lib
    from trainer.search.factory import Models
    from trainer.storage import job_dir as job_dir_lib

    flags.FLAGS.unparse_flags()
    flags.FLAGS(["quality", *trainer_argv])
    config = task_lib.build_config(flags.FLAGS)
    job = job_dir_lib.JobDir.of(config.outputs)
    schema = Schema.from_json(job_dir_lib.read_text(job.schema), path=job.schema)
    head = Head(schema.label)
    # the defaults the trainer chose for the rows it trained on (a generator among them)
    rows = job_dir_lib.read_json(job.report)["input"]["training_rows"]
    config, _ = adapt.resolve(config, rows, schema.label.head)
    frozen = Models(config, schema).restore(record_lib.finished(job), job, local=True)
    preprocessor = Preprocessor(schema)
    metric = "rmse" if task == "regression" else "accuracy"

    def alone(subnetwork) -> Callable[[dict], dict]:
        return lambda batch: head.predictions(subnetwork(preprocessor(batch))[1])

    members = {
        m.key: test_score(task, test, signature, alone(m.subnetwork))[metric]
        for m in frozen.members
    }
    rebuilt = test_score(
        task, test, signature, lambda batch: head.predictions(frozen.logits(preprocessor(batch)))
    )
    return {"rebuilt_ensemble": rebuilt[metric], "members": members}


def holdout_members(report: dict, metric: str) -> dict:
    """The report's held-out metric of each member of the final ensemble (its subnetwork's
    eval when it was trained)."""
    subnetworks = {s["name"]: s["eval"] for r in report["iterations"] for s in r["subnetworks"]}
    return {
        m["key"]: _holdout_metric(subnetworks.get(m["key"], {}), metric)
        for m in report["architecture"]["members"]
    }


def _holdout_metric(metrics: dict, metric: str) -> float | None:
    if metric == "rmse":
        mse = metrics.get("mse")
        return None if mse is None else math.sqrt(mse)
    return metrics.get(metric)


def trainer_argv(
    dataset: DataSet, job_dir: str, seed: int, trainer_flags: Sequence[str] = ()
) -> list[str]:
    """`trainer.task`'s flags for one run on the data set's train files (no eval data)."""
    return [
        f"--train_data={dataset.train_data}",
        f"--label_column={LABEL}",
        f"--job_dir={job_dir}",
        f"--seed={seed}",
        *trainer_flags,
    ]


def run_ours(
    dataset: DataSet,
    seed: int,
    trainer_flags: Sequence[str],
    *,
    root: str,
    workdir: str,
    timeout: float,
) -> dict:
    """One trainer process on the train files, then (in a fresh child process, which imports
    the trainer as it is now) its exported model and members on the test rows."""
    job_dir = tempfile.mkdtemp(prefix=f"{dataset.name}-{seed}-", dir=workdir)
    argv = trainer_argv(dataset, job_dir, seed, trainer_flags)
    try:
        started = time.perf_counter()
        try:
            process = subprocess.run(
                [sys.executable, "-m", "trainer.task", *argv],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"seconds": time.perf_counter() - started, "error": f"timed out ({timeout} s)"}
        seconds = time.perf_counter() - started
        if process.returncode:
            tail = (process.stdout + process.stderr).strip().splitlines()[-15:]
            return {"seconds": seconds, "error": f"exit {process.returncode}: " + "\n".join(tail)}
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
        if report["head"] != dataset.task:
            raise RuntimeError(
                f"{dataset.name}: the trainer inferred a {report['head']} head for a "
                f"{dataset.task} data set; pass --head={dataset.task} in --trainer_flags."
            )
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as child:
            evaluated = child.submit(
                evaluate_export, job_dir, argv, dataset.task, dataset.test
            ).result()
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    metric = dataset.metric
    members_test = evaluated["members_test"]
    if "members" in members_test:
        values = members_test["members"].values()
        best = min(values) if metric == "rmse" else max(values)
        members_test.update(
            best=best, ensemble_beats_best_member=beats(evaluated["export"][metric], best, metric)
        )
    holdout = report["final"]["metrics"]
    common = {
        **evaluated["export"],
        "seconds": seconds,
        "members_test": members_test,
        "adapted": report.get("adapted"),
        "budget": report.get("budget"),
    }
    if "bags" in report:  # iterations and members: all the bags' together
        bags = report["bags"]
        return {
            **common,
            "iterations": sum(b["iterations"] for b in bags),
            "steps": sum(b["steps"] for b in bags),
            "members": [f"bag{b['bag']}/{key}" for b in bags for key in b["ensemble"]],
            "bags_test": [bag[metric] for bag in evaluated["bags_test"]],
            "holdout": {
                "data": report["final"]["eval_data"],
                "ensemble": _holdout_metric(holdout, metric),
                "bags": [_holdout_metric(b["metrics"], metric) for b in bags],
            },
        }
    return {
        **common,
        "iterations": len(report["iterations"]),
        "chosen": [r["chosen"] for r in report["iterations"]],
        "steps": sum(r["steps"] for r in report["iterations"]),
        "members": [m["key"] for m in report["architecture"]["members"]],
        "holdout": {
            "data": report["final"]["eval_data"],
            "ensemble": _holdout_metric(holdout, metric),
            "members": holdout_members(report, metric),
        },
    }


# -- summary ------------------------------------------------------------------------------


def summarize(runs: list[dict], datasets: dict[str, dict]) -> list[dict]:
    """One row per (data set, method): mean and sd over the seeds that ran, mean seconds."""
    rows = []
    for name in [d for d in DATASETS if d in datasets]:
        info = datasets[name]
        metric = info["metric"]
        for method in METHODS:
            group = [r for r in runs if r["dataset"] == name and r["method"] == method]
            done = [r for r in group if r.get(metric) is not None]
            if not group:
                continue
            values = [r[metric] for r in done]
            row = {
                "dataset": name,
                "task": info["task"],
                "method": method,
                "metric": metric,
                "seeds": len(done),
                "failed": len(group) - len(done),
                "mean": statistics.fmean(values) if values else None,
                "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                "seconds": statistics.fmean(r["seconds"] for r in group),
                "seconds_median": statistics.median(r["seconds"] for r in group),
            }
            if metric == "rmse" and values:
                row["r2_mean"] = statistics.fmean(r["r2"] for r in done)
            if method == "ours" and done:
                row["iterations_mean"] = statistics.fmean(r["iterations"] for r in done)
                row["members_mean"] = statistics.fmean(len(r["members"]) for r in done)
                bagged = [r for r in done if "bags_test" in r]
                if bagged:  # bag 0 alone is the search --bags=1 runs; every bag alone
                    first = [r["bags_test"][0] for r in bagged]
                    alone = [v for r in bagged for v in r["bags_test"]]
                    row["bags"] = {
                        "seeds": len(bagged),
                        "bags_mean": statistics.fmean(len(r["bags_test"]) for r in bagged),
                        "bag_0_mean": statistics.fmean(first),
                        "bag_0_sd": statistics.stdev(first) if len(first) > 1 else 0.0,
                        "one_bag_mean": statistics.fmean(alone),
                        "one_bag_sd": statistics.stdev(alone) if len(alone) > 1 else 0.0,
                        "one_bag_runs": len(alone),
                    }
                evaluated = [r for r in done if "ensemble_beats_best_member" in r["members_test"]]
                row["ensemble_beats_best_member"] = {
                    "seeds": len(evaluated),
                    "beats": sum(
                        r["members_test"]["ensemble_beats_best_member"] for r in evaluated
                    ),
                    "single_member": sum(len(r["members"]) == 1 for r in evaluated),
                }
            rows.append(row)
    return rows


def verdicts(summary: list[dict]) -> list[dict]:
    """Per data set: ours' mean against each baseline's: "better", "tie" (equal means, as
    when every method classifies a small test set perfectly) or "worse"."""
    out = []
    for name in dict.fromkeys(r["dataset"] for r in summary):
        rows = {r["method"]: r for r in summary if r["dataset"] == name}
        ours = rows.get("ours")
        if ours is None or ours["mean"] is None:
            continue
        verdict = {"dataset": name}
        for method in METHODS[1:]:
            other = rows.get(method)
            if other and other["mean"] is not None:
                verdict[f"ours_vs_{method}"] = compare(ours["mean"], other["mean"], ours["metric"])
        out.append(verdict)
    return out


def table(results: dict) -> str:
    summary, datasets = results["summary"], results["datasets"]
    decided = {v["dataset"]: v for v in results["verdicts"]}
    header = ["dataset", "task", "train", "test", "metric", *METHODS]
    header += ["beats linear?", "beats HGB?", "ens > best member"]
    lines = []
    for name in dict.fromkeys(r["dataset"] for r in summary):
        info = datasets[name]
        rows = {r["method"]: r for r in summary if r["dataset"] == name}
        cells = [
            name,
            info["task"],
            f"{info['train_rows']:,}",
            f"{info['test_rows']:,}",
            info["metric"],
        ]
        for method in METHODS:
            cells.append(_cell(rows.get(method)))
        verdict = decided.get(name, {})
        cells += [_yes(verdict.get("ours_vs_linear")), _yes(verdict.get("ours_vs_hgb"))]
        cells.append(_members_cell(rows.get("ours")))
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines]]
    text.insert(1, "-" * len(text[0]))
    text.append(
        "\ncells: test metric mean ± sd over seeds, median seconds (ours: the whole trainer "
        "process; baselines: fit + predict; the mean is in quality.json). accuracy: higher is "
        "better; rmse: lower is better.\n"
        "beats linear? / HGB?: ours' mean against theirs (tie: equal means).\n"
        "ours below 1,000 rows: 5 bags (--bags, trainer/job/bagging.py; the mean of their "
        "probabilities, a regression's trimmed mean of their predictions); each bag "
        "alone is in quality.json (`bags`; bag 0 is the search --bags=1 runs).\n"
        "ens > best member: seeds whose exported ensemble beat its best member alone on the "
        "test rows (single: one-member ensembles, which cannot)."
    )
    return "\n".join(text)


def _cell(row: dict | None) -> str:
    if row is None or row["mean"] is None:
        return "-" if row is None else f"failed x{row['failed']}"
    failed = f" ({row['failed']} failed)" if row["failed"] else ""
    return f"{row['mean']:.4f} ± {row['sd']:.4f} {row['seconds_median']:.1f}s{failed}"


def _members_cell(ours: dict | None) -> str:
    """'3/5 (1 single)': seeds whose ensemble beat its best member on the test rows, of the
    seeds evaluated, and how many of those ensembles had one member (they cannot)."""
    counts = (ours or {}).get("ensemble_beats_best_member")
    if not counts or not counts["seeds"]:
        return "-"
    single = f" ({counts['single_member']} single)" if counts["single_member"] else ""
    return f"{counts['beats']}/{counts['seeds']}{single}"


def _yes(verdict: str | None) -> str:
    return {None: "-", "better": "yes", "tie": "tie", "worse": "no"}[verdict]


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, datasets = results["summary"], results["datasets"]
    names = list(dict.fromkeys(r["dataset"] for r in summary))
    columns = min(4, len(names))
    grid_rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(
        grid_rows, columns, figsize=(3.6 * columns, 3.3 * grid_rows), squeeze=False
    )
    colors = {"ours": "tab:green", "linear": "0.55", "hgb": "tab:blue", "mlp": "tab:orange"}
    for ax, name in zip(axes.flat, names):
        info = datasets[name]
        rows = [r for r in summary if r["dataset"] == name and r["mean"] is not None]
        means = np.array([r["mean"] for r in rows])
        sds = np.array([r["sd"] for r in rows])
        ax.bar(
            [f"{r['method']}\n{r['seconds_median']:.1f} s" for r in rows],
            means,
            yerr=sds,
            capsize=3,
            color=[colors[r["method"]] for r in rows],
            edgecolor=["black" if r["method"] == "ours" else "none" for r in rows],
        )
        low, high = float((means - sds).min()), float((means + sds).max())
        pad = max(0.6 * (high - low), 0.005 * abs(high), 1e-6)
        ax.set_ylim(low - pad, high + pad)
        ax.ticklabel_format(axis="y", useOffset=False)
        for x, (mean, sd) in enumerate(zip(means, sds)):
            ax.text(x, mean + sd, f"{mean:.4g}", ha="center", va="bottom", fontsize=7)
        better = "lower is better" if info["metric"] == "rmse" else "higher is better"
        ax.set_title(f"{name}: {info['task']}, {info['train_rows']:,} rows", fontsize=9)
        ax.set_ylabel(f"test {info['metric']} ({better})", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    seeds = max((r["seeds"] for r in summary), default=0)
    fig.suptitle(
        f"Trainer (ours) vs scikit-learn baselines: test metric, mean ± sd over "
        f"{seeds} seed{'s' if seeds > 1 else ''}; under each bar its median seconds",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma list (default all)")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument(
        "--trainer_flags",
        default="",
        help="one string of flags passed to every trainer run, e.g. '--max_iterations=2'",
    )
    p.add_argument("--methods", default=",".join(METHODS), help="comma list (default all)")
    p.add_argument(
        "--large_rows",
        type=int,
        default=120_000,
        help="train rows of each generated set (test rows: a quarter as many)",
    )
    p.add_argument(
        "--run_timeout",
        type=float,
        default=900.0,
        help="seconds after which a trainer run is stopped and counted as failed",
    )
    p.add_argument("--out_dir", default=os.path.join(REPO, "bench", "results"))
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: the first seed, {QUICK_ROWS:,} train rows of census and the "
        f"generated sets, and trainer flags {' '.join(QUICK_TRAINER_FLAGS)} before "
        "--trainer_flags",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of an existing --out_dir/quality.json that this run does not redo "
        "(other data sets, and other methods of the same data set)",
    )
    p.add_argument(
        "--report_only",
        action="store_true",
        help="run nothing: recompute the summary, plot and table of --out_dir/quality.json",
    )
    p.add_argument(
        "--commit",
        default=None,
        help="run the trainer of this commit from a temporary git worktree "
        "(default: this working tree)",
    )
    args = p.parse_args(argv)
    unknown = sorted(set(args.datasets.split(",")) - set(DATASETS))
    if unknown:
        p.error(f"--datasets: {unknown} are not data sets; choose from {list(DATASETS)}.")
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        p.error(f"--methods: {unknown} are not methods; choose from {list(METHODS)}.")
    if args.large_rows < 1_000:
        p.error(f"--large_rows ({args.large_rows}) must be at least 1,000.")
    return args


@contextlib.contextmanager
def trainer_root(commit: str | None) -> Iterator[str]:
    """This working tree, or a temporary git worktree of `commit` (removed afterwards)."""
    if commit is None:
        yield REPO
        return
    with worktree.checkout(commit, "bench-quality-trainer-") as path:
        yield path


def code_state(root: str) -> dict:
    """The commit the trainer ran from, and its uncommitted changes under trainer/ if any."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_trainer_files": git("status", "--porcelain", "--", "trainer").splitlines(),
    }


def machine() -> dict:
    """The machine and the versions (read without importing TensorFlow here)."""
    import sklearn

    def version(*distributions: str) -> str | None:
        for name in distributions:
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(name)
        return None

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": version("tensorflow-cpu", "tensorflow"),
        "scikit_learn": sklearn.__version__,
        "numpy": np.__version__,
        "load_average_at_start": list(os.getloadavg()),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.quick else None]
    names = [d for d in DATASETS if d in args.datasets.split(",")]
    methods = [m for m in METHODS if m in args.methods.split(",")]
    trainer_flags = [*(QUICK_TRAINER_FLAGS if args.quick else ()), *shlex.split(args.trainer_flags)]
    out_json = os.path.join(args.out_dir, "quality.json")
    if args.report_only:
        with open(out_json) as f:
            publish(json.load(f), args.out_dir)
        return
    started = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="bench-quality-")
    runs: list[dict] = []
    datasets: dict[str, dict] = {}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the evaluator children's C++ lines
    try:
        with trainer_root(args.commit) as root:
            sys.path.insert(0, root)  # the evaluator children rebuild members with this trainer
            settings = {
                "seeds": seeds,
                "trainer_flags": trainer_flags,
                "quick": args.quick,
                "code": code_state(root),
            }
            info = machine()
            for name in names:
                dataset = load(name, workdir, quick=args.quick, large_rows=args.large_rows)
                datasets[name] = {**dataset.describe(), "settings": settings}
                print(
                    f"{name}: {dataset.task}, {dataset.train.rows:,} train rows, "
                    f"{dataset.test.rows:,} test rows",
                    flush=True,
                )
                for seed in seeds:
                    for method in methods:
                        if method == "ours":
                            row = run_ours(
                                dataset,
                                seed,
                                trainer_flags,
                                root=root,
                                workdir=workdir,
                                timeout=args.run_timeout,
                            )
                        else:
                            row = run_baseline(method, dataset, seed)
                        runs.append({"dataset": name, "method": method, "seed": seed, **row})
                        print("  " + _progress(runs[-1], dataset.metric), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.merge and os.path.exists(out_json):
        with open(out_json) as f:
            previous = json.load(f)
        rerun = {(r["dataset"], r["method"]) for r in runs}
        runs = [r for r in previous["runs"] if (r["dataset"], r["method"]) not in rerun] + runs
        datasets = {**{k: v for k, v in previous["datasets"].items()}, **datasets}
    results = {
        "command": [os.path.relpath(sys.argv[0], REPO), *(argv or sys.argv[1:])],
        "trainer_command": shlex.join(
            [
                *("python", "-m", "trainer.task", "--train_data=TRAIN", "--label_column=label"),
                *("--job_dir=JOB", "--seed=SEED", *trainer_flags),
            ]
        ),
        "seconds_this_invocation": time.perf_counter() - started,
        "machine": {**info, "load_average_at_end": list(os.getloadavg())},
        "baselines": BASELINES,
        "datasets": {d: datasets[d] for d in DATASETS if d in datasets},
        "runs": runs,
    }
    publish(results, args.out_dir)
    print(f"{results['seconds_this_invocation']:.0f} s in all")


def publish(results: dict, out_dir: str) -> None:
    """Summarises `results` (its data sets and runs), writes quality.json and quality.png to
    `out_dir` and prints the table."""
    summary = summarize(results["runs"], results["datasets"])
    results = {
        **{k: v for k, v in results.items() if k not in ("summary", "verdicts", "runs")},
        "summary": summary,
        "verdicts": verdicts(summary),
        "runs": results["runs"],
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "quality.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(out_dir, "quality.png"))
    print(table(results))
    print(f"\nwrote {out_dir}/quality.json and quality.png")


def _progress(run: dict, metric: str) -> str:
    head = f"seed {run['seed']} {run['method']:<6}"
    if "error" in run:
        return f"{head} FAILED after {run['seconds']:.1f} s: {run['error']}"
    extra = ""
    if run["method"] == "ours":
        test = run["members_test"]
        members = test.get("members") or f"{run['members']} (not evaluated: {test.get('error')})"
        extra = f", {run['iterations']} iterations, members {members}"
        if "bags_test" in run:
            bags = ", ".join(f"{v:.4f}" for v in run["bags_test"])
            extra = f", {len(run['bags_test'])} bags alone {bags}, {run['iterations']} iterations"
    return f"{head} {metric} {run[metric]:.4f} in {run['seconds']:.1f} s{extra}"


if __name__ == "__main__":
    main()
