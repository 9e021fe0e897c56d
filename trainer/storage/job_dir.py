"""The job dir: where every artifact lives, and how metadata is written safely.

Layout::

    JOB_DIR/
      schema.json               columns, statistics, label (the encoding, written once)
      run.json                  the flags that define the search (checked on resume)
      lease.json                while a trainer writes the job dir: who (trainer/storage/lease.py)
      checkpoints/
        iteration-<t>/          periodic checkpoints of the running iteration
        frozen-<t>/             the chosen ensemble of iteration t (weights)
        iteration-<t>.json      the record of iteration t: candidates, scores, choice
      logs/                     TensorBoard summaries, one run per candidate
      eval/                     the evaluator replica's metrics per checkpoint
      model/                    the exported SavedModel (only the chosen ensemble)
      model.json                what model/ was exported from (which iterations; a resume
                                that grows the ensemble exports it again)
      report.json               everything above, summarised
      report.png                the search; feature_importance.png: trainer/evaluation/importance.py
      eval_predictions.npz      a bag's: its model's logits on its hold-out, with the labels
                                (the bagged job's out-of-bag metrics, without a second pass)
      bags/<b>/                 with --bags: bag b's own job dir (trainer/job/bagging.py);
                                model/ is then the bagged model, report.json its bags
      data/                     BigQuery tables staged as CSV shards (ps clusters only:
                                trainer/input/staging.py)

An iteration is finished exactly when `iteration-<t>.json` exists: it is published in one
step (written in full under a temporary name, then renamed) after the frozen weights it names
are written, so a crash at any moment leaves either the old state or the new one. On `gs://`
a rename is a copy then a delete, but the copy makes the new object appear whole in one step,
so the same holds; a crash between the two leaves a temporary file that `remove_leftovers`
deletes. The exported model is complete exactly when `model/saved_model.pb` exists: it is
written last (see `storage.publish_dir`), and deleted first when a grown ensemble replaces
the model. `model.json` is written after the model is complete and deleted before it is
replaced, so a model without it is exported again.

Every path may be local, `gs://BUCKET/...` or a Cloud Storage FUSE path (`/gcs/BUCKET/...`).
The three output dirs can live elsewhere (`paths.OutputDirs.resolve`: `--model_dir`,
`--checkpoint_dir`, `--tensorboard_log_dir`, or Vertex AI's `AIP_MODEL_DIR`, `AIP_CHECKPOINT_DIR`,
`AIP_TENSORBOARD_LOG_DIR`). Without `--job_dir`, the job dir (schema.json, run.json,
report.json) is then the checkpoint dir: everything a resume reads stays in one place.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import uuid

import tensorflow as tf
from absl import logging
from google.protobuf import text_format

from trainer.errors import InputError, first_line
from trainer.storage import files as storage
from trainer.storage.paths import MODEL_EXTRA, OutputDirs, join

_RECORD = re.compile(r"iteration-(\d+)\.json$")
PERIODIC = re.compile(r"ckpt-(\d+)\.index$")  # a periodic checkpoint of an iteration
_PERIODIC_DIR = re.compile(r"iteration-(\d+)$")  # the folder of an iteration's periodic ones


# What TensorFlow's checkpoint reader says of a file cut short, emptied or missing (as an
# OpError of code UNKNOWN): an index "file is too short to be an sstable", "not an sstable
# (bad magic number)"; a data file "No such file or directory".
_DAMAGE_TEXTS = ("sstable", "No such file or directory", "Read less bytes", "checksum", "corrupt")
CHECKPOINT_ERRORS = (tf.errors.OpError, IndexError)  # a data file cut short: IndexError


def is_damage(error: Exception) -> bool:
    """Whether reading a checkpoint failed for its files (cut short, emptied, missing), not
    for storage that refused or may answer next time (permissions, a network error)."""
    if isinstance(error, (tf.errors.DataLossError, tf.errors.NotFoundError)):
        return True
    if isinstance(error, IndexError):  # "Read less bytes than requested"
        return True
    return type(error) in (tf.errors.OpError, tf.errors.UnknownError) and any(
        text in str(error) for text in _DAMAGE_TEXTS
    )


_TEMP_MARK = ".tmp-"
MODEL_MARKER = "saved_model.pb"
_SAVED_MODEL_ENTRIES = {"variables", "assets", MODEL_EXTRA, "fingerprint.pb", "keras_metadata.pb"}


def write_atomically(path: str, text: str | bytes) -> None:
    """Writes `text` to `path` so that readers see the old file or the new one, never half.
    Transient storage errors are retried (each attempt under a new temporary name)."""
    storage.retry(lambda: _write_then_rename(path, text), what=f"writing {path}")


def _write_then_rename(path: str, text: str | bytes) -> None:
    temp = f"{path}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(temp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


def write_json(path: str, value) -> None:
    write_atomically(path, json.dumps(value, indent=1, sort_keys=False) + "\n")


class Damaged(InputError):
    """A job dir file that cannot be read: empty, cut short or not JSON. Every file is written
    whole (`write_atomically`), so this is damage from outside the trainer (a copy cut short,
    a disk fault, an edit)."""


def read_json(path: str):
    """The JSON value of `path`; Damaged, naming it, when it is not JSON."""
    text = read_text(path)
    try:
        return json.loads(text)
    except ValueError as e:
        what = "empty" if not text.strip() else f"not JSON: {e}"
        raise Damaged(
            f"{path} is damaged ({what}): it was cut short or changed outside the trainer. "
            "Restore it from a copy, or give a new --job_dir to start afresh."
        ) from None


def read_text(path: str) -> str:
    """The whole file; transient storage errors are retried."""

    def read() -> str:
        with tf.io.gfile.GFile(path) as f:
            return f.read()

    return storage.retry(read, what=f"reading {path}")


class JobDir:
    """Paths under one job dir, and the state a resume reads."""

    def __init__(
        self,
        root: str,
        *,
        model: str | None = None,
        checkpoints: str | None = None,
        logs: str | None = None,
    ):
        self.root = _strip(root)
        self.checkpoints = _strip(checkpoints) if checkpoints else join(self.root, "checkpoints")
        self.logs = _strip(logs) if logs else join(self.root, "logs")
        self.model = _strip(model) if model else join(self.root, "model")
        self.eval = join(self.root, "eval")
        self.schema = join(self.root, "schema.json")
        self.run = join(self.root, "run.json")
        self.report = join(self.root, "report.json")
        self.model_stamp = join(self.root, "model.json")
        self.report_png = join(self.root, "report.png")
        self.importance_png = join(self.root, "feature_importance.png")
        self.calibration_png = join(self.root, "calibration.png")
        self.eval_predictions = join(self.root, "eval_predictions.npz")
        self.data = join(self.root, "data")

    @classmethod
    def of(cls, outputs: OutputDirs) -> JobDir:
        return cls(
            outputs.job_dir,
            model=outputs.model_dir,
            checkpoints=outputs.checkpoint_dir,
            logs=outputs.log_dir,
        )

    def bag(self, b: int) -> str:
        """Bag b's own job dir, in a bagged job (trainer/job/bagging.py)."""
        return join(self.root, "bags", str(b))

    def output_flags(self) -> list[tuple[str, str]]:
        """(flag, dir) of every dir this job writes, for the preflight check."""
        return [
            ("--job_dir", self.root),
            ("--checkpoint_dir", self.checkpoints),
            ("--tensorboard_log_dir", self.logs),
            ("--model_dir", self.model),
        ]

    def exists(self) -> bool:
        return storage.retry(lambda: tf.io.gfile.exists(self.run), what=f"reading {self.run}")

    def create(self) -> None:
        for path in (self.root, self.checkpoints, self.logs):
            tf.io.gfile.makedirs(path)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Deletes temporary files and half-exported models a crash may have left."""
        model_parent, model_name = (
            self.model.rsplit("/", 1) if "/" in self.model else (".", self.model)
        )
        # (folder, prefix) pairs, not a dict: the model's parent is usually the job dir itself,
        # whose other temporaries (report.json's) must go too.
        searched = [(self.root, ""), (self.checkpoints, ""), (model_parent, model_name)]
        for folder, prefix in searched:
            if not tf.io.gfile.isdir(folder):
                continue
            for name in tf.io.gfile.listdir(folder):
                if _TEMP_MARK in name and name.startswith(prefix):
                    _delete(join(folder, name.rstrip("/")))
        if tf.io.gfile.isdir(self.model) and not self.has_model():
            self.remove_model()

    def remove_model(self) -> None:
        """Deletes the exported model, or what a publish that did not finish left: its stamp,
        then its marker (readers then see no model), then the other SavedModel entries."""
        if tf.io.gfile.exists(self.model_stamp):
            tf.io.gfile.remove(self.model_stamp)
        if not tf.io.gfile.isdir(self.model):
            return
        if self.has_model():
            tf.io.gfile.remove(join(self.model, MODEL_MARKER))
        for name in tf.io.gfile.listdir(self.model):
            if name.rstrip("/") in _SAVED_MODEL_ENTRIES:
                _delete(join(self.model, name.rstrip("/")))

    def complete_report(self) -> dict | None:
        """The report of a job that was complete, with its model (None: it was not)."""
        if not (self.has_model() and tf.io.gfile.exists(self.report)):
            return None
        try:
            report = read_json(self.report)
        except Damaged as e:  # written again at the job's end
            logging.warning("%s The job's end runs again to rewrite it.", e)
            return None
        return report if report.get("status") == "complete" else None

    def stamp_model(self, source: dict, calibration: dict | None = None) -> None:
        """Records what the complete model in the model dir was exported from, and where it
        is: relative to the job dir when inside it, so that a moved job dir still owns it;
        and how it was calibrated (`exported_calibration`)."""
        write_json(
            self.model_stamp,
            {"model_dir": self._relative(self.model), "source": source, "calibration": calibration},
        )

    def exported_calibration(self) -> dict | None:
        """The `calibration` the model in the model dir was stamped with (None: none)."""
        stamp = self._model_stamp()
        return stamp.get("calibration") if stamp else None

    def exported_from(self) -> dict | None:
        """What the complete model in the model dir was exported from (`stamp_model`); None
        when there is no complete model, or no stamp of it here."""
        stamp = self._model_stamp()
        return stamp["source"] if stamp else None

    def _model_stamp(self) -> dict | None:
        """The stamp of the complete model in the model dir, if it is this job's."""
        stamp = self._stamp()
        return stamp if stamp and self.has_model() and self._stamped_here(stamp) else None

    def _stamp(self) -> dict | None:
        """model.json, or None where there is none or it is damaged (the model is then
        exported again, as one without a stamp is)."""
        if not tf.io.gfile.exists(self.model_stamp):
            return None
        try:
            return read_json(self.model_stamp)
        except Damaged as e:
            logging.warning("%s The model is exported again.", e)
            return None

    def _relative(self, path: str) -> str:
        inside = self.root.rstrip("/") + "/"
        return path[len(inside) :] if path.startswith(inside) else path

    def _stamped_here(self, stamp: dict) -> bool:
        """Whether `stamp` names this job's model dir: the same path relative to the job dir
        (or, for a stamp of an absolute path, as versions before wrote them, the same path or
        the same place in a job dir that was moved)."""
        recorded = stamp.get("model_dir") or ""
        if recorded == self._relative(self.model) or recorded == self.model:
            return True
        moved = recorded.rstrip("/").rpartition("/")[2]
        return recorded.startswith(("/", "gs://")) and self.model == join(self.root, moved)

    def check_model_dir(self) -> None:
        """Fails, before any work, when the model dir cannot hold this job's model alone:
        it is (or holds) the job dir or another output dir, it holds files that are not a
        SavedModel's (Vertex AI serves every file of it), or a model this job did not
        export: in a new job, or where the job's stamp names another dir. A model without a
        stamp in an existing job dir is this job's (exported just before a crash, or by a
        version without stamps): it is exported again."""
        flag = "--model_dir (or AIP_MODEL_DIR)"
        for other_flag, other in (
            ("--job_dir", self.root),
            ("--checkpoint_dir", self.checkpoints),
            ("--tensorboard_log_dir", self.logs),
        ):
            if other == self.model or other.startswith(self.model.rstrip("/") + "/"):
                raise InputError(
                    f"{flag} {self.model} is {other_flag} {other} or holds it: the exported "
                    "model needs a folder of its own, since Vertex AI serves every file in it. "
                    f"Leave --model_dir out (the model goes to {join(self.root, 'model')}) or "
                    "name a new folder."
                )
        if not tf.io.gfile.isdir(self.model):
            return
        foreign = sorted(
            name.rstrip("/")
            for name in tf.io.gfile.listdir(self.model)
            if name.rstrip("/") not in _SAVED_MODEL_ENTRIES | {MODEL_MARKER}
        )
        if foreign:
            raise InputError(
                f"{flag} {self.model} holds files that are not a SavedModel's "
                f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}): the "
                "exported model needs a folder of its own, since Vertex AI serves every file "
                "in it. Name an empty or new folder."
            )
        if not self.has_model():
            return
        stamp = self._stamp()
        if stamp is None and not self.exists():
            raise InputError(
                f"{flag} {self.model} holds a model this job did not export (a new job, with "
                f"no {self.model_stamp}). Delete it, or name an empty or new folder."
            )
        if stamp is not None and not self._stamped_here(stamp):
            recorded = stamp.get("model_dir") or ""
            own = recorded if recorded.startswith(("/", "gs://")) else join(self.root, recorded)
            raise InputError(
                f"{flag} {self.model} holds a model this job did not export (its own is in "
                f"{own}, by {self.model_stamp}). Delete it, or name an empty or new folder."
            )

    def iteration_checkpoints(self, t: int) -> str:
        return _iteration_checkpoints(self.checkpoints, t)

    def frozen_prefix(self, t: int) -> str:
        return _frozen_prefix(self.checkpoints, t)

    def record_path(self, t: int) -> str:
        return join(self.checkpoints, f"iteration-{t}.json")

    def record_documents(self) -> list[tuple[str, dict]]:
        """(path, JSON) of the records of finished iterations 0..t-1, in order (stops at the
        first gap); `trainer.search.record.finished` reads them as records."""
        if not tf.io.gfile.isdir(self.checkpoints):
            return []
        numbers = sorted(
            int(m.group(1))
            for name in tf.io.gfile.listdir(self.checkpoints)
            if (m := _RECORD.match(name))
        )
        documents: list[tuple[str, dict]] = []
        for t in numbers:
            if t != len(documents):
                break
            path = self.record_path(t)
            try:
                documents.append((path, read_json(path)))
            except Damaged as e:  # the chief sets it aside: `set_aside_records`
                logging.warning("%s Iterations from %d are trained again.", e, t)
                break
        return documents

    def set_aside_records(self, first: int) -> None:
        """Renames the records of iterations from `first` on (a damaged one, and those that
        built on it) to `iteration-<t>.json.set-aside`, so that the job trains them again
        and never reads them; and deletes the periodic checkpoints of iterations after
        `first`, which trained on the ensembles set aside (iteration `first`'s own, where a
        run stopped in it, trained on the intact ones: it resumes)."""
        if not tf.io.gfile.isdir(self.checkpoints):
            return
        for name in sorted(tf.io.gfile.listdir(self.checkpoints)):
            path = join(self.checkpoints, name)
            if (m := _RECORD.match(name)) and int(m.group(1)) >= first:
                tf.io.gfile.rename(path, path + ".set-aside", overwrite=True)
                logging.warning("Set %s aside (as %s.set-aside).", path, name)
            elif (m := _PERIODIC_DIR.match(name.rstrip("/"))) and int(m.group(1)) > first:
                tf.io.gfile.rmtree(path)
                logging.warning(
                    "Deleted %s: iteration %s's checkpoints built on the iterations set aside.",
                    path,
                    m.group(1),
                )

    def publish_record(self, iteration: int, document: dict) -> None:
        """Publishes a finished iteration's record (its frozen weights are written first: the
        record is what makes the iteration finished) and drops its periodic checkpoints."""
        write_json(self.record_path(iteration), document)
        self.drop_iteration_checkpoints(iteration)

    def model_temp(self) -> str:
        return f"{self.model}{_TEMP_MARK}{uuid.uuid4().hex[:8]}"

    def has_model(self) -> bool:
        """The exported model is complete (its marker is published last)."""
        return tf.io.gfile.exists(join(self.model, MODEL_MARKER))

    def drop_iteration_checkpoints(self, t: int) -> None:
        path = self.iteration_checkpoints(t)
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)


def _iteration_checkpoints(checkpoints: str, t: int) -> str:
    """Iteration t's periodic checkpoints under a checkpoints dir (the job's or a scratch one)."""
    return join(checkpoints, f"iteration-{t}")


def _frozen_prefix(checkpoints: str, t: int) -> str:
    """The prefix of iteration t's frozen chosen ensemble under a checkpoints dir."""
    return join(checkpoints, f"frozen-{t}", "ensemble")


def _strip(path: str) -> str:
    return path.rstrip("/") or "/"


def _delete(path: str) -> None:
    if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
    else:
        tf.io.gfile.remove(path)


class ReplicaWrites:
    """Where this replica writes. The chief writes into the job dir. Another replica of a
    synchronous cluster must take part in every checkpoint (each saves its share), so it
    writes the same files into a scratch dir of its own that nothing reads, deleted by
    `close`; it publishes no records and writes no summaries."""

    def __init__(self, job: JobDir, *, chief: bool):
        self.job = job
        self.is_chief = chief
        self._root = job.checkpoints if chief else tempfile.mkdtemp(prefix="replica-")

    def iteration_checkpoints(self, t: int) -> str:
        return _iteration_checkpoints(self._root, t)

    def frozen_prefix(self, t: int) -> str:
        return _frozen_prefix(self._root, t)

    @property
    def logs(self) -> str | None:
        """The TensorBoard dir (None: no summaries from this replica)."""
        return self.job.logs if self.is_chief else None

    def drop_checkpoint_state(self, t: int) -> None:
        """Deletes iteration `t`'s checkpoint state file (`checkpoint`, which names its
        periodic checkpoints) when it cannot be read: the next save writes it again."""
        directory = self.iteration_checkpoints(t)
        try:
            tf.train.get_checkpoint_state(directory)
        except (ValueError, text_format.ParseError) as e:  # from the file's text
            logging.warning(
                "%s/checkpoint is damaged (%s): deleted; the next checkpoint writes it again.",
                directory,
                first_line(e),
            )
            tf.io.gfile.remove(join(directory, "checkpoint"))

    def publish_record(self, iteration: int, document: dict) -> None:
        if self.is_chief:
            self.job.publish_record(iteration, document)

    def close(self) -> None:
        if not self.is_chief:
            shutil.rmtree(self._root, ignore_errors=True)
