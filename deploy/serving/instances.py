"""The instance format shared by the local server, local batch prediction and the fakes:
a list of JSON objects keyed by the model's raw column names, in; one JSON object per instance
with every output of `serving_default`, out (what Vertex's TensorFlow container returns for a
signature with several outputs).

`parse_json` reads the server's request bodies and batch prediction's JSON lines alike:
stricter than `json.loads`, so that every text Python's parser fails on in an unexpected way
(nesting deeper than its recursion limit, an integer of over 4,300 digits) or takes though it
is not JSON (`Infinity`) is a `NotJson` naming the problem; `NaN`, which TensorFlow Serving
takes for a missing number, is a missing number here too. `Predictor` loads a SavedModel once and
checks each instance against the signature's inputs before anything runs, so a bad instance is
rejected with a message naming its index and field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from deploy.cloud import api
from trainer.input.schema import MISSING_TOKENS

NUMBER, TEXT = "number", "string"
FLOAT32_MAX = float(np.finfo(np.float32).max)  # numbers are fed as float32
_LONGEST_INTEGER = 400  # digits; float32 ends near 3.4e38, so longer integers cannot fit
_SHOW = reprlib.Repr()  # values in messages stay short, however large or nested
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlevel = 60, 60, 3


class NotJson(ValueError):
    """JSON text that cannot be taken as sent; the message names the problem."""


def parse_json(text: str, subject: str) -> Any:
    """The value of JSON `text`, or NotJson whose message starts with `subject` ("the body",
    "the line"): text that is not JSON (RFC 8259: no NaN or Infinity), a number beyond a float
    (an integer of over 400 digits, 1e400), or nesting too deep for Python's parser."""

    def constant(name: str) -> float:
        if name == "NaN":  # TensorFlow Serving's form of a missing number: taken as one
            return math.nan
        raise NotJson(
            f"{subject} holds {name}, which is not JSON (RFC 8259 has no Infinity); send "
            "finite numbers, and null (or NaN, as TensorFlow Serving takes it) for a missing one."
        )

    def integer(digits: str) -> int:
        # Python refuses integers over 4,300 digits with an unhelpful message.
        length = len(digits.lstrip("-"))
        if length > _LONGEST_INTEGER:
            raise NotJson(
                f"{subject} holds an integer of {length} digits ({digits[:12]}...); numbers "
                "must fit a float32 (about 3.4e38)."
            )
        return int(digits)

    def number(digits: str) -> float:
        value = float(digits)
        if math.isinf(value):
            raise NotJson(
                f"{subject} holds the number {clip(digits)}, beyond a 64-bit float; numbers "
                "must fit a float32 (about 3.4e38)."
            )
        return value

    try:
        return json.loads(text, parse_constant=constant, parse_int=integer, parse_float=number)
    except NotJson:
        raise
    except RecursionError:
        raise NotJson(
            f"{subject} nests arrays or objects too deeply to parse; instances are flat "
            'objects: {"field": value, ...}.'
        ) from None
    except ValueError as e:
        raise NotJson(f"{subject} is not JSON ({e}).") from None


def clip(text: str, limit: int = 40) -> str:
    """`text`, cut after `limit` characters (for messages)."""
    return text if len(text) <= limit else text[:limit] + "..."


class InstanceError(ValueError):
    """One instance does not fit the model's inputs; the others are unaffected."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"instance {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Fields:
    """The model's input fields: name -> NUMBER (float32) or TEXT (string).

    A value may be missing, as it may in training: JSON null, a field left out, or (for a
    number) one of the training data's missing-value tokens ("", "NA", "?", ...; text keeps
    them as categories, as training did). The model receives a missing number as NaN and a
    missing text as "", which its preprocessing encodes exactly as the training data's missing
    values (the column's mean; the empty category)."""

    kinds: dict[str, str]

    @classmethod
    def from_signature(cls, fn) -> Fields:
        import tensorflow as tf

        _, specs = fn.structured_input_signature
        kinds = {}
        for name, spec in sorted(specs.items()):
            if spec.dtype == tf.string:
                kinds[name] = TEXT
            elif spec.dtype.is_floating or spec.dtype.is_integer:
                kinds[name] = NUMBER
            else:
                raise ValueError(
                    f"input '{name}' has dtype {spec.dtype.name}; only numbers and "
                    "strings are served."
                )
        return cls(kinds)

    def check(self, index: int, instance: Any) -> dict:
        """The instance if it fits, else InstanceError naming the index and the field."""
        if not isinstance(instance, dict):
            raise InstanceError(
                index,
                f"is a {type(instance).__name__}, expected an object "
                f"with the fields {', '.join(self.kinds)}.",
            )
        unknown = sorted(set(instance) - set(self.kinds))
        if unknown:
            name = unknown[0] if len(unknown[0]) <= 60 else unknown[0][:60] + "..."
            raise InstanceError(
                index, f"unknown field '{name}'; the model takes {', '.join(self.kinds)}."
            )
        for name, kind in self.kinds.items():
            value: Any = instance.get(name)
            if is_missing(value, kind):
                continue
            if not _fits(value, kind):
                raise InstanceError(
                    index, f"field '{name}' must be a {kind} or null, got {_SHOW.repr(value)}."
                )
            # ASCII (nearly all text) is Unicode: a flag of the string, read before encoding.
            if kind == TEXT and not (value.isascii() or _is_unicode(value)):
                raise InstanceError(
                    index,
                    f"field '{name}' is {_SHOW.repr(value)}, which holds a lone surrogate (a "
                    "\\uD800-\\uDFFF escape that is not half of a pair), so it is not Unicode "
                    "text; send the character itself or both halves of its pair.",
                )
            if kind == NUMBER and not -FLOAT32_MAX <= value <= FLOAT32_MAX:
                raise InstanceError(
                    index,
                    f"field '{name}' is {_SHOW.repr(value)}, beyond float32's range "
                    f"(+-{FLOAT32_MAX:.3g}), which the model takes.",
                )
        return instance

    def for_tf_serving(self, instance: dict) -> dict:
        """A checked instance as TensorFlow Serving (Vertex's prebuilt container) takes it:
        every field present, a missing number NaN (it refuses null), a missing text ""."""
        return {name: model_value(instance.get(name), kind) for name, kind in self.kinds.items()}

    def from_text(self, index: int, row: dict[str, str]) -> dict:
        """A CSV row (all text) typed by the fields: numbers parsed, strings kept."""
        typed: dict[str, float | str | None] = {}
        for name, text in row.items():
            kind = self.kinds.get(name)
            if kind == NUMBER and is_missing(text, kind):
                typed[name] = None
            elif kind == NUMBER:
                try:
                    number = float(text)
                except ValueError:
                    raise InstanceError(
                        index, f"field '{name}' must be a number or empty, got {text!r}."
                    ) from None
                # "inf" is missing, as the trainer's reader takes every non-finite number.
                typed[name] = number if math.isfinite(number) else None
            else:
                typed[name] = text
        return self.check(index, typed)


def is_missing(value: Any, kind: str) -> bool:
    """Whether `value` (of a field of `kind`) means a missing value: null (or left out), or for
    a number a missing-value token of the training data."""
    if value is None:
        return True
    if kind != NUMBER:
        return False
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, str) and value.strip() in MISSING_TOKENS


def model_value(value: Any, kind: str) -> float | str:
    """A checked field's value as the model takes it: a missing number is NaN, a missing text
    "" (what the trainer's reader makes of either)."""
    if is_missing(value, kind):
        return math.nan if kind == NUMBER else ""
    return value


def _is_unicode(text: str) -> bool:
    """Whether `text` can be encoded (JSON's "\\ud800" escapes decode to lone surrogates,
    which neither UTF-8 nor the model's string tensors can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fits(value: Any, kind: str) -> bool:
    if kind == TEXT:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


class Predictor:
    """A SavedModel's `serving_default`, loaded once, over lists of instances.

    Args:
        model_dir: the exported model, `JOB_DIR/model` (local or gs://).
        what: names `model_dir` in messages (the flag or setting it came from, and its value).

    Raises:
        api.DeployError: `model_dir` does not exist, is a job dir, or holds no SavedModel.
    """

    def __init__(self, model_dir: str, *, what: str | None = None):
        import tensorflow as tf

        self._tf = tf
        self.model_dir = model_dir
        try:
            self._model = tf.saved_model.load(model_dir)  # keeps the function's variables alive
        except (OSError, tf.errors.OpError) as e:
            raise api.DeployError(
                _no_model(model_dir, what or f"--model_dir ({model_dir})", e)
            ) from None
        self._fn = self._model.signatures["serving_default"]
        self.fields = Fields.from_signature(self._fn)

    def check(self, instances: Sequence[Any]) -> list[dict]:
        """Every instance checked; raises InstanceError for the first bad one."""
        if not isinstance(instances, (list, tuple)):
            raise InstanceError(0, f"'instances' must be a list, got {type(instances).__name__}.")
        return [self.fields.check(i, x) for i, x in enumerate(instances)]

    def predict(self, instances: Sequence[Any]) -> list[dict]:
        """One output object per instance; InstanceError before any work if one is bad."""
        checked = self.check(instances)
        if not checked:
            return []
        return self.predict_checked(checked)

    def predict_tensors(self, features: dict) -> dict:
        """The signature's outputs (tensors) for a batch of feature tensors."""
        return self._fn(**features)

    def predict_checked(self, instances: Sequence[dict]) -> list[dict]:
        """Predictions for instances already checked against `fields`."""
        tf = self._tf
        feeds = {}
        for name, kind in self.fields.kinds.items():
            column = [model_value(x.get(name), kind) for x in instances]
            feeds[name] = (
                tf.constant(np.asarray(column, dtype=np.float32))
                if kind == NUMBER
                else tf.constant(column, dtype=tf.string)
            )
        outputs = self._fn(**feeds)
        return rows_of({k: v.numpy() for k, v in outputs.items()})


def _no_model(model_dir: str, what: str, error: Exception) -> str:
    """Why `model_dir` holds no model, and what to pass instead."""
    from tensorflow.io import gfile

    exported = f"{model_dir.rstrip('/')}/model"
    if gfile.exists(f"{exported}/saved_model.pb"):
        return f"{what} is a job dir; the model it exported is {exported}: use that."
    if not gfile.exists(model_dir):
        return f"{what} does not exist; it must be the exported model, JOB_DIR/model."
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"{what} holds no SavedModel ({clip(detail, 200)}); it must be the exported model, "
        "JOB_DIR/model."
    )


def rows_of(outputs: dict[str, np.ndarray]) -> list[dict]:
    """Batched outputs -> one JSON-ready object per instance (bytes decoded to str)."""
    names = sorted(outputs)
    count = len(outputs[names[0]])
    return [{name: json_value(outputs[name][i]) for name in names} for i in range(count)]


def json_value(value):
    """A numpy value (an array, a scalar, bytes) as JSON's: lists, Python numbers, text."""
    value = (
        value.tolist()
        if isinstance(value, np.ndarray)
        else value.item()
        if isinstance(value, np.generic)
        else value
    )
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [json_value(v) for v in value]
    return value
