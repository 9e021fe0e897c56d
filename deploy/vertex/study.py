"""The study of a hyperparameter tuning job, read from `tune.yaml` (`load_study`) and checked
against the trainer's own flags (`check_study`: each parameter a tunable flag of
`trainer/flags.py`, its values within the flag's type and range, the metric one the trainer
reports), so a typo fails here and not in the first trial."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import NoReturn

from deploy.cloud import api
from deploy.vertex import job_spec
from deploy.vertex.evaluation import HIGHER_IS_BETTER
from trainer.flags import FLAGS, Flag

STUDY = os.path.join(job_spec.REPO, "tune.yaml")


# The metrics the trainer reports and the goal of a study of each.
METRIC_GOALS = {m: "MAXIMIZE" if up else "MINIMIZE" for m, up in HIGHER_IS_BETTER.items()}


ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")  # unspecified: Bayesian


SCALES = ("UNIT_LINEAR_SCALE", "UNIT_LOG_SCALE", "UNIT_REVERSE_LOG_SCALE")


_VALUE_SPECS = {
    "doubleValueSpec": "DOUBLE",
    "integerValueSpec": "INTEGER",
    "discreteValueSpec": "DISCRETE",
    "categoricalValueSpec": "CATEGORICAL",
}


# The value specs each kind of flag takes.
_SPECS_OF = {
    "float": ("doubleValueSpec", "discreteValueSpec", "categoricalValueSpec"),
    "int": ("integerValueSpec", "categoricalValueSpec"),
    "enum": ("categoricalValueSpec",),
    "bool": ("categoricalValueSpec",),
}


_STUDY_KEYS = {"metrics", "parameters", "algorithm", "measurementSelectionType", "observationNoise"}


_JOB_KEYS = {"studySpec", "maxTrialCount", "parallelTrialCount", "maxFailedTrialCount"}


Fail = Callable[[str], NoReturn]  # raises the DeployError of a study's file


# The trainer's flags that change the model or its training, with their types and ranges
# (trainer/flags.py: no TensorFlow to load).
TUNABLE_FLAGS: dict[str, Flag] = {flag.name: flag for flag in FLAGS if flag.tunable}


_BOOL_CHOICES = ("true", "false")


def load_study(
    path: str = STUDY,
    *,
    max_trial_count: int | None = None,
    parallel_trial_count: int | None = None,
) -> dict:
    """The study in `path` (tune.yaml), checked, with the counts given on the command line.

    Returns:
        `studySpec` (the metric's goal filled in, int64 bounds as strings),
        `maxTrialCount`, `parallelTrialCount` and `maxFailedTrialCount` as REST JSON.

    Raises:
        DeployError: the file is missing or not YAML; a key deploy.tune does not take; no
            metric, or one the trainer does not report, or the opposite goal; a parameter
            that is not a tunable trainer flag, of an unknown type, of a type the flag cannot
            take, with min > max or values outside what the trainer accepts; bad counts.
    """
    import yaml

    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise api.DeployError(f"--study={path}: no such file.") from None
    except yaml.YAMLError as e:
        raise api.DeployError(f"--study={path}: not valid YAML ({e}).") from None
    return check_study(
        raw, path, max_trial_count=max_trial_count, parallel_trial_count=parallel_trial_count
    )


def check_study(
    raw: object,
    path: str = "tune.yaml",
    *,
    max_trial_count: int | None = None,
    parallel_trial_count: int | None = None,
) -> dict:
    """`load_study`'s checks of a study already read (see there)."""

    def fail(message: str) -> NoReturn:
        raise api.DeployError(f"{path}: {message}")

    if not isinstance(raw, dict) or not isinstance(raw.get("studySpec"), dict):
        fail("needs a `studySpec` mapping (metrics, parameters, algorithm).")
    if "trialJobSpec" in raw:
        fail("trialJobSpec comes from config.yaml (--config); remove it here.")
    unknown = sorted(set(raw) - _JOB_KEYS) + sorted(
        f"studySpec.{k}" for k in set(raw["studySpec"]) - _STUDY_KEYS
    )
    if unknown:
        fail(
            f"key '{unknown[0]}' is not supported by deploy.tune (it takes "
            f"{', '.join(sorted(_JOB_KEYS))}; studySpec takes {', '.join(sorted(_STUDY_KEYS))})."
        )
    study = dict(raw["studySpec"])
    study["metrics"] = [_metric(study.get("metrics"), fail)]
    parameters = study.get("parameters")
    if not isinstance(parameters, list) or not parameters:
        fail("studySpec.parameters must list the trainer flags to tune.")
    study["parameters"] = [_parameter(p, i, fail) for i, p in enumerate(parameters)]
    ids = [p["parameterId"] for p in study["parameters"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        fail(f"parameter '{twice[0]}' is listed twice.")
    algorithm = study.get("algorithm", "ALGORITHM_UNSPECIFIED")
    if algorithm not in ALGORITHMS:
        fail(f"studySpec.algorithm ({algorithm!r}) must be one of {', '.join(ALGORITHMS)}.")
    doubles = [p["parameterId"] for p in study["parameters"] if "doubleValueSpec" in p]
    if algorithm == "GRID_SEARCH" and doubles:
        fail(
            f"GRID_SEARCH needs a finite grid, but {doubles[0]} is a DOUBLE range: give it "
            "discreteValueSpec values, or use RANDOM_SEARCH or the default (Bayesian)."
        )
    counts = {
        "maxTrialCount": raw.get("maxTrialCount") if max_trial_count is None else max_trial_count,
        "parallelTrialCount": (
            raw.get("parallelTrialCount") if parallel_trial_count is None else parallel_trial_count
        ),
        "maxFailedTrialCount": raw.get("maxFailedTrialCount", 0),
    }
    for key, value in counts.items():
        least = 0 if key == "maxFailedTrialCount" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            fail(f"{key} ({value!r}) must be a whole number >= {least}.")
    if counts["parallelTrialCount"] > counts["maxTrialCount"]:
        fail(
            f"parallelTrialCount ({counts['parallelTrialCount']}) is above maxTrialCount "
            f"({counts['maxTrialCount']})."
        )
    return {"studySpec": study, **counts}


def _metric(metrics: object, fail: Fail) -> dict:
    reported = ", ".join(METRIC_GOALS)
    if not isinstance(metrics, list) or not metrics:
        fail(
            "studySpec.metrics is missing: name the metric the trainer reports "
            f"({reported}), e.g. metrics: [{{metricId: accuracy, goal: MAXIMIZE}}]."
        )
    if len(metrics) > 1:
        fail(f"studySpec.metrics has {len(metrics)} metrics; the trainer reports one.")
    metric = metrics[0]
    if not isinstance(metric, dict) or set(metric) - {"metricId", "goal"}:
        fail(f"studySpec.metrics[0] ({metric!r}) must be {{metricId: ID, goal: GOAL}}.")
    metric_id = metric.get("metricId")
    if metric_id not in METRIC_GOALS:
        fail(
            f"metricId ({metric_id!r}) is not a metric the trainer reports; choose from "
            f"{reported} (the trainer's --hypertune_metric)."
        )
    goal = metric.get("goal", METRIC_GOALS[metric_id])
    if goal != METRIC_GOALS[metric_id]:
        fail(f"metric {metric_id} must be {METRIC_GOALS[metric_id]}D, not {goal!r}.")
    return {"metricId": metric_id, "goal": goal}


def _parameter(parameter: object, index: int, fail: Fail) -> dict:
    where = f"studySpec.parameters[{index}]"
    if not isinstance(parameter, dict):
        fail(f"{where} ({parameter!r}) must be a mapping.")
    name = parameter.get("parameterId")
    flag = TUNABLE_FLAGS.get(name) if isinstance(name, str) else None
    if flag is None:
        fail(
            f"{where}.parameterId ({name!r}) is not a trainer flag deploy.tune can tune; "
            f"choose from {', '.join(TUNABLE_FLAGS)}."
        )
    where = f"parameter {name}"
    kinds = [k for k in parameter if k.endswith("ValueSpec") or k == "type"]
    unknown = [k for k in kinds if k not in _VALUE_SPECS]
    if unknown or len(kinds) != 1:
        fail(
            f"{where} has {'type ' + repr(unknown[0]) if unknown else f'{len(kinds)} types'}; "
            f"give exactly one of {', '.join(_VALUE_SPECS)} "
            f"({', '.join(_VALUE_SPECS.values())})."
        )
    extra = set(parameter) - {"parameterId", "scaleType", kinds[0]}
    if extra:
        fail(f"{where}: key '{sorted(extra)[0]}' is not supported by deploy.tune.")
    kind = kinds[0]
    if kind == "discreteValueSpec" and flag.kind == "int":
        # Vertex is reported to pass a DISCRETE value as a double ("64.0"; python-aiplatform
        # issue 866 and users' code), which absl's integer flag rejects.
        fail(
            f"{where}: Vertex passes DISCRETE values as real numbers (64.0), which the "
            f"trainer's integer flag --{name} does not take; use integerValueSpec, or "
            "categoricalValueSpec with the values as strings."
        )
    if kind not in _SPECS_OF[flag.kind]:
        fail(
            f"{where}: --{name} is a{'n' if flag.kind[0] in 'aeiou' else ''} {flag.kind} flag; "
            f"give it {' or '.join(_SPECS_OF[flag.kind])}, not {kind}."
        )
    spec = parameter[kind]
    if not isinstance(spec, dict):
        fail(f"{where}.{kind} ({spec!r}) must be a mapping.")
    checked = {
        "doubleValueSpec": _double,
        "integerValueSpec": _integer,
        "discreteValueSpec": _discrete,
        "categoricalValueSpec": _categorical,
    }[kind](spec, flag, f"{where}.{kind}", fail)
    out = {"parameterId": name, kind: checked}
    scale = parameter.get("scaleType")
    if scale is not None:
        if kind == "categoricalValueSpec" or scale not in SCALES:
            fail(
                f"{where}.scaleType ({scale!r}) must be one of {', '.join(SCALES)}, "
                "and only for DOUBLE, INTEGER and DISCRETE parameters."
            )
        if scale != "UNIT_LINEAR_SCALE":
            low = float(checked.get("minValue", min(checked.get("values", [1]))))
            if low <= 0:
                fail(f"{where}: {scale} needs values above 0 (the smallest is {low:g}).")
        out["scaleType"] = scale
    return out


def _range(spec: dict, flag: Flag, where: str, fail, number: type) -> tuple:
    _no_default(spec, where, fail)
    if set(spec) != {"minValue", "maxValue"}:
        fail(f"{where} takes minValue and maxValue, not {sorted(spec)}.")
    values = []
    for key in ("minValue", "maxValue"):
        value = _number(spec.get(key), number, f"{where}.{key}", fail)
        if not flag.accepts(value):
            fail(f"{where}.{key} ({value!r}): the trainer takes values {flag.range}.")
        values.append(value)
    low, high = values
    if low > high:
        fail(f"{where}: minValue ({low!r}) is above maxValue ({high!r}).")
    return low, high


def _no_default(spec: dict, where: str, fail: Fail) -> None:
    if "defaultValue" in spec:
        fail(f"{where}.defaultValue: hyperparameter tuning jobs do not take one (Vizier does).")


def _number(value: object, number: type, where: str, fail: Fail):
    if number is int and isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # int64 in REST JSON
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number is int:
        ok = ok and float(value).is_integer()  # type: ignore[arg-type]
    if not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
        kind = "a whole number" if number is int else "a number"
        fail(f"{where} ({value!r}) must be {kind}.")
    return number(value)


def _double(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    low, high = _range(spec, flag, where, fail, float)
    return {"minValue": low, "maxValue": high}


def _integer(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    low, high = _range(spec, flag, where, fail, int)
    return {"minValue": api.int64(low), "maxValue": api.int64(high)}


def _discrete(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    _no_default(spec, where, fail)
    values = spec.get("values")
    if set(spec) != {"values"} or not isinstance(values, list) or not values:
        fail(f"{where} needs `values`, a list of numbers.")
    numbers = [_number(v, float, f"{where}.values", fail) for v in values]
    bad = [v for v in numbers if not flag.accepts(v)]
    if bad:
        fail(f"{where}.values: {bad[0]!r} is outside what the trainer takes ({flag.range}).")
    if numbers != sorted(set(numbers)):
        fail(f"{where}.values ({numbers}) must increase, without repeats.")
    return {"values": numbers}


def _categorical(spec: dict, flag: Flag, where: str, fail: Fail) -> dict:
    _no_default(spec, where, fail)
    values = spec.get("values")
    if set(spec) != {"values"} or not isinstance(values, list) or not values:
        fail(f"{where} needs `values`, a list of strings.")
    texts = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    choices = _BOOL_CHOICES if flag.kind == "bool" else flag.choices
    for text in texts:
        if choices and text not in choices:
            fail(f"{where}: {text!r} is not a value of the flag; choose from {choices}.")
        if flag.kind in ("int", "float"):
            number = _number(
                _parse(text, flag.kind),
                int if flag.kind == "int" else float,
                f"{where}.values",
                fail,
            )
            if not flag.accepts(number):
                fail(f"{where}: {text!r} is outside what the trainer takes ({flag.range}).")
    if len(set(texts)) != len(texts):
        fail(f"{where}.values ({texts}) repeats a value.")
    return {"values": texts}


def _parse(text: str, kind: str) -> object:
    """A categorical value of a numeric flag as the flag parses it (the text if it cannot)."""
    try:
        return int(text) if kind == "int" else float(text)
    except ValueError:
        return text
