"""`trainer.task` that also writes down which rows each sharded training dataset of this
process takes: the first field (a row id) of every row the shard's `Selection.keep` keeps, one
line each, appended to READS_DIR/ROLE-INDEX.txt (the role from TF_CONFIG; a lone chief is
`chief-0`). The trainer records the plan (report.json's `input.readers`), not the rows a reader
took; this shows them. Only for datasets this process runs (a synchronous cluster's replicas,
which read the files themselves): a parameter-server worker runs a dataset the chief traced,
with no Python.

    READS_DIR=DIR python -m tests.input.reads_task [trainer.task flags]
"""

from __future__ import annotations

import json
import os
import threading

import tensorflow as tf

from trainer import task
from trainer.input import pipeline

_parse_fn = pipeline.Pipeline._parse_fn
_lock = threading.Lock()


def _path() -> str:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    role = config.get("task", {"type": "chief", "index": 0})
    return os.path.join(os.environ["READS_DIR"], f"{role['type']}-{role['index']}.txt")


def _record(text: tf.Tensor) -> int:
    ids = b"".join(row.split(b",", 1)[0] + b"\n" for row in text.numpy())
    with _lock, open(_path(), "ab") as f:
        f.write(ids)
    return 0


def _recording_parse_fn(self: pipeline.Pipeline, selection: pipeline.Selection, **kwargs):
    parse = _parse_fn(self, selection, **kwargs)
    if selection.shard is None:  # not a training reader's share (evaluation, the scan)
        return parse

    def recording(file, line, text):
        kept = tf.boolean_mask(text, selection.keep(self.source, file, line))
        done = tf.py_function(_record, [kept], tf.int32)
        with tf.control_dependencies([done]):
            return parse(tf.identity(file), line, text)

    return recording


if __name__ == "__main__":
    pipeline.Pipeline._parse_fn = _recording_parse_fn  # type: ignore[method-assign]
    task.run()
