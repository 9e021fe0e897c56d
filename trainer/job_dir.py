"""The job dir: where every artifact lives, and how metadata is written safely.

Layout::

    JOB_DIR/
      schema.json               columns, statistics, label (the encoding, written once)
      run.json                  the flags that define the search (checked on resume)
      checkpoints/
        iteration-<t>/          periodic checkpoints of the running iteration
        frozen-<t>/             the chosen ensemble of iteration t (weights)
        iteration-<t>.json      the record of iteration t: candidates, scores, choice
      logs/                     TensorBoard summaries, one run per candidate
      eval/                     the evaluator replica's metrics per checkpoint
      model/                    the exported SavedModel (only the chosen ensemble)
      report.json               everything above, summarised

An iteration is finished exactly when `iteration-<t>.json` exists: it is published in one
step (written in full under a temporary name, then renamed) after the frozen weights it names
are written, so a crash at any moment leaves either the old state or the new one.
"""

from __future__ import annotations

import json
import re
import uuid

import tensorflow as tf

_RECORD = re.compile(r"iteration-(\d+)\.json$")
_TEMP_MARK = ".tmp-"


def join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` so that readers see the old file or the new one, never half."""
    temp = f"{path}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


def write_json(path: str, value) -> None:
    write_atomically(path, json.dumps(value, indent=1, sort_keys=False) + "\n")


def read_json(path: str):
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


class JobDir:
    """Paths under one job dir, and the state a resume reads."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"
        self.checkpoints = join(self.root, "checkpoints")
        self.logs = join(self.root, "logs")
        self.eval = join(self.root, "eval")
        self.model = join(self.root, "model")
        self.schema = join(self.root, "schema.json")
        self.run = join(self.root, "run.json")
        self.report = join(self.root, "report.json")

    def exists(self) -> bool:
        return tf.io.gfile.exists(self.run)

    def create(self) -> None:
        for path in (self.checkpoints, self.logs):
            tf.io.gfile.makedirs(path)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Deletes temporary files and half-exported models a crash may have left."""
        for folder in (self.root, self.checkpoints):
            for name in tf.io.gfile.listdir(folder):
                if _TEMP_MARK in name:
                    path = join(folder, name.rstrip("/"))
                    if tf.io.gfile.isdir(path):
                        tf.io.gfile.rmtree(path)
                    else:
                        tf.io.gfile.remove(path)

    def iteration_checkpoints(self, t: int) -> str:
        return join(self.checkpoints, f"iteration-{t}")

    def frozen_prefix(self, t: int) -> str:
        return join(self.checkpoints, f"frozen-{t}", "ensemble")

    def record_path(self, t: int) -> str:
        return join(self.checkpoints, f"iteration-{t}.json")

    def records(self) -> list[dict]:
        """The records of finished iterations 0..t-1, in order (stops at the first gap)."""
        if not tf.io.gfile.isdir(self.checkpoints):
            return []
        numbers = sorted(int(m.group(1)) for name in tf.io.gfile.listdir(self.checkpoints)
                         if (m := _RECORD.match(name)))
        records = []
        for t in numbers:
            if t != len(records):
                break
            records.append(read_json(self.record_path(t)))
        return records

    def model_temp(self) -> str:
        return f"{self.model}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"

    def has_model(self) -> bool:
        return tf.io.gfile.exists(join(self.model, "saved_model.pb"))

    def drop_iteration_checkpoints(self, t: int) -> None:
        path = self.iteration_checkpoints(t)
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)

