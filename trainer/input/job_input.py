"""A job's input, prepared once per replica: its sources opened and checked, its schema scanned
(by the chief, before training) or read from the job dir (a resume, a worker, the evaluator),
and the datasets each role reads."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping

import tensorflow as tf
from absl import logging

from trainer.errors import InputError
from trainer.input import blocks, scan
from trainer.input import features as features_lib
from trainer.input import files as files_lib
from trainer.input.formats import registry, shards
from trainer.input.formats.base import Source
from trainer.input.options import InputOptions
from trainer.input.pipeline import (
    EVAL_BATCH_SIZE,
    Derived,
    Pipeline,
    Selection,
    Shard,
    Side,
    in_memory,
    shard_plan,
)
from trainer.input.scan import Holdout
from trainer.input.schema import ColumnChoices, Schema
from trainer.storage import job_dir as job_dir_lib

# Eval sets of up to this many rows are also kept in memory as the exported model takes them
# (`JobInput.eval_raw`): the job evaluates its export, then its feature importance reads the
# rows again, and each new pass traces its parser (~0.9 s on 2 cores), longer than reading
# a small table.
RAW_CACHE_ROWS = 100_000
# An in-memory table whose encoded rows would take more than this is kept half-encoded
# (`Preprocessor.compact`: a few numbers per row instead of every numeric's bins and every
# category's one-hot slots; nycflights13's 236k training rows: 187 MB as encoded rows, 11 MB
# compact) and its batches are encoded as they are read. Not below it: the map that encodes
# the batches is traced anew for every dataset, and small tables are fastest without it.
COMPACT_TABLE_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class Role:
    """Which replica opens the job's input, which decides what `prepare` does: the chief
    scans a new job's data (`scans`; in a parameter-server cluster it stages the inputs
    workers cannot read first, `stage_tables`); a worker waits up to `wait_secs` for the
    schema the chief writes; the evaluator never opens the training data (`opens_train`)."""

    scans: bool = True
    opens_train: bool = True
    wait_secs: float = 0.0
    stage_tables: bool = False

    @classmethod
    def chief(cls, *, stage_tables: bool = False) -> Role:
        return cls(stage_tables=stage_tables)

    @classmethod
    def worker(cls, wait_secs: float, *, stage_tables: bool = False) -> Role:
        return cls(scans=False, wait_secs=wait_secs, stage_tables=stage_tables)

    @classmethod
    def evaluator(cls) -> Role:
        return cls(scans=False, opens_train=False)


@dataclasses.dataclass(frozen=True)
class JobInput:
    """The schema, the sources, the hold-out and how to read them. `train` is None for an
    evaluator given its own eval data: it never opens the training data.

    `holdout` is the training rows held out (never trained on): without --eval_data always,
    the rows the search scores candidates on and the exported model's eval rows; with
    --eval_data only once `for_selection` says the search selects on held-out rows, which
    are then the training hold-out, so that the eval data stays a test set the search never
    saw."""

    schema: Schema
    train: Source | None
    eval: Source
    holdout: Holdout | None
    options: InputOptions
    eval_data: bool = False  # whether `eval` is --eval_data (not the training hold-out)
    # Whether the search chose on the eval rows too (held-out selection without --eval_data):
    # the exported model's figure on them is then a selection score, said so.
    selected_on_eval: bool = False
    # --test_data (the chief's): scored once by the exported model, after the eval rows
    test: Source | None = None
    # `eval` is the validation split a user chose (`trainer/input/splits.py`): the search
    # chooses on it and the calibration fits on it; the test data is the unseen figure
    validation: bool = False
    # The encoded tables this process holds in memory (`_table`), built on first use.
    _tables: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def train_source(self) -> Source:
        """The training files; only a replica that trains (or scans) asks for them."""
        if self.train is None:
            raise RuntimeError("this replica did not open --train_data")
        return self.train

    def for_selection(self, *, on_holdout: bool) -> JobInput:
        """This input for a search that selects on held-out rows (`on_holdout`) or not: with
        --eval_data and `on_holdout`, the training rows the scan held out become the selection
        rows (and are not trained on); a job dir scanned before hold-outs were counted beside
        --eval_data keeps selecting on the eval data, and a validation split is chosen on."""
        if not self.eval_data or self.validation:
            return dataclasses.replace(self, selected_on_eval=on_holdout)
        recorded = self.schema.summary.get("holdout")
        if not on_holdout or self.train is None or not recorded:
            return self
        return dataclasses.replace(self, holdout=Holdout(**recorded))

    # -- evaluation -----------------------------------------------------------------------
    @property
    def eval_selection(self) -> Selection:
        if self.holdout and not self.eval_data:
            return Selection(self.holdout, Side.HELD_OUT)
        return Selection()

    def selection_encoded(self) -> tf.data.Dataset:
        """One pass over the rows the search scores its candidates on, encoded: the training
        hold-out where `for_selection` made one beside --eval_data, else the eval rows."""
        if not (self.eval_data and self.holdout):
            return self.eval_encoded()
        selection = Selection(self.holdout, Side.HELD_OUT)
        rows = self.schema.summary["train"]["holdout_rows"]
        if self._fits(rows):
            return self._batches(self._table(self.train_source, selection, rows), rows)
        return self._pipeline(self.train_source).encoded(selection)

    @property
    def has_calibration_rows(self) -> bool:
        return self.validation or not (self.eval_data and not self.holdout)

    def calibration_rows(self) -> tuple[tf.data.Dataset, str] | None:
        """The rows the exported model's calibration may be fitted on, encoded, and their
        description: the rows the search chose on, unless those are --eval_data (which
        stays a test set); None then."""
        if not self.has_calibration_rows:
            return None
        if self.validation:
            return self.eval_encoded(), f"the validation split {self.eval.pattern}"
        if self.eval_data:  # (and a hold-out: `for_selection`)
            return self.selection_encoded(), self.holdout.describe()  # type: ignore[union-attr]
        return self.selection_encoded(), self.describe_eval()

    def eval_encoded(self) -> tf.data.Dataset:
        """One pass over the eval rows, encoded: from memory when they fit the memory budget
        (read and encoded once per process, however many evaluations the job runs)."""
        if self._fits(self.eval_rows):
            table = self._table(self.eval, self.eval_selection, self.eval_rows)
            return self._batches(table, self.eval_rows)
        return self._pipeline(self.eval).encoded(self.eval_selection)

    def eval_raw(self, *, with_weight: bool = False) -> tf.data.Dataset:
        """One pass over the eval rows as the exported model takes them: `(features,
        labels)`, or with `with_weight` and a weight column `(features, labels, weights)`.
        Up to RAW_CACHE_ROWS rows that fit the memory budget are read once per process."""
        pipeline = self._pipeline(self.eval)
        if self.eval_rows > RAW_CACHE_ROWS or not self._fits(self.eval_rows):
            return pipeline.raw(self.eval_selection, with_weight=with_weight)
        key = ("raw", with_weight)
        if key not in self._tables:
            batches = list(pipeline.raw(self.eval_selection, with_weight=with_weight))
            if not batches:
                return pipeline.raw(self.eval_selection, with_weight=with_weight)
            self._tables[key] = tf.nest.map_structure(lambda *b: tf.concat(b, 0), *batches)
        return tf.data.Dataset.from_tensor_slices(self._tables[key]).batch(EVAL_BATCH_SIZE)

    def test_raw(self) -> tf.data.Dataset:
        """One pass over the --test_data rows as the exported model takes them, `(features,
        labels[, weights])`, streamed."""
        assert self.test is not None, "a job given --test_data"
        return self._pipeline(self.test).raw(Selection(), with_weight=True)

    def describe_eval(self) -> str:
        if self.validation and self.selected_on_eval:
            return f"{self.eval.pattern}, the validation split the search chose on"
        if self.eval_data or self.holdout is None:
            return self.eval.pattern
        if self.selected_on_eval:
            return (
                f"{self.holdout.describe()}, which the search chose on (a selection score, "
                "not a test score: give --eval_data for one)"
            )
        return self.holdout.describe()

    @property
    def eval_rows(self) -> int:
        summary = self.schema.summary
        if self.eval_data:
            return summary["eval"]["rows"]
        return summary["train"]["holdout_rows"]

    # -- training -------------------------------------------------------------------------
    @property
    def train_rows(self) -> int:
        train = self.schema.summary["train"]
        return train["rows"] - train.get("holdout_rows", 0) if self.holdout else train["rows"]

    def train_selection(self, shard: Shard | None = None) -> Selection:
        if self.holdout:
            return Selection(self.holdout, Side.TRAIN, shard)
        return Selection(shard=shard)

    def train_encoded(self) -> tf.data.Dataset:
        """One pass over the training rows (for selection on the training data)."""
        if self.is_cached(readers=1):
            table = self._table(self.train_source, self.train_selection(), self.train_rows)
            return self._batches(table, self.train_rows)
        return self._pipeline(self.train_source).encoded(self.train_selection())

    def is_cached(self, readers: int) -> bool:
        """Whether a reader's share of the encoded training rows fits the memory budget."""
        return self._fits(math.ceil(self.train_rows / max(readers, 1)))

    def training(
        self,
        *,
        readers: int,
        shard: Shard | None,
        batch_size: int,
        seed: int,
        in_process: bool = True,
        derived: Derived | None = None,
    ) -> tf.data.Dataset:
        """Endless shuffled training batches for one of `readers` readers (see Pipeline).
        In this process (not a parameter-server worker's dataset), a share that fits the
        memory budget is read and encoded once and kept for every later iteration; the
        `derived` columns are added to it when they fit the budget too."""
        if in_process and self.is_cached(readers):
            features, labels = self._table(
                self.train_source, self.train_selection(shard), self.train_rows
            )
            share = math.ceil(self.train_rows / max(readers, 1))
            expand = self._expand(self.train_rows)
            if derived is not None and self._fits(share, derived.bytes_per_example):
                features = derived(features, expand=expand)
            table = tf.data.Dataset.from_tensors((features, labels))
            return in_memory(table, batch_size, seed, expand)
        return self._pipeline(self.train_source, in_process=in_process).training(
            self.train_selection(shard),
            batch_size=batch_size,
            seed=seed,
            shuffle_buffer=self.options.shuffle_buffer,
            cache_rows=self.train_rows if self.is_cached(readers) else None,
        )

    def reads(self, readers: list[str]) -> dict:
        """What each reader reads of the training data, for the report."""
        mode = "in memory" if self.is_cached(len(readers)) else "streamed from the files"
        return {
            "training_rows": self.train_rows,
            "eval_rows": self.eval_rows,
            "eval_data": self.describe_eval(),
            "mode": mode,
            "readers": {
                name: plan
                for name, plan in zip(readers, shard_plan(self.train_source, len(readers)))
            },
        }

    def _pipeline(self, source: Source, *, in_process: bool = True) -> Pipeline:
        return Pipeline(source, self.schema, self.options.bad_rows, in_process)

    def _fits(self, rows: int, extra_bytes: int = 0) -> bool:
        """Whether `rows` encoded rows (and `extra_bytes` more per row) fit the memory budget
        (`--cache_mb`)."""
        per_row = self.schema.bytes_per_example() + extra_bytes
        return rows * per_row <= self.options.cache_bytes

    def _table(self, source: Source, selection: Selection, rows: int) -> tuple:
        """The rows `selection` takes of `source` (at most `rows`), encoded, as tensors this
        process keeps: read once, the first time they are asked for."""
        key = (source, selection)
        if key not in self._tables:
            compact = self._expand(rows) is not None
            table = self._pipeline(source).table(selection, rows=rows, compact=compact)
            self._tables[key] = table.get_single_element()
        return self._tables[key]

    def _expand(self, rows: int) -> Callable | None:
        """How the batches of an in-memory table of `rows` rows are encoded as they are read
        (`trainer.input.features.expand`), or None when the table holds encoded rows."""
        if rows * self.schema.dense_width * 4 <= COMPACT_TABLE_BYTES:
            return None
        return functools.partial(features_lib.expand, self.schema)

    def _batches(self, table: tuple, rows: int) -> tf.data.Dataset:
        """One pass over an in-memory table of `rows` rows, encoded."""
        batches = tf.data.Dataset.from_tensor_slices(table).batch(EVAL_BATCH_SIZE)
        expand = self._expand(rows)
        return batches if expand is None else batches.map(lambda f, y: (expand(f), y))


def prepare(
    *,
    train_data: str,
    eval_data: str | None,
    columns: ColumnChoices,
    holdout_fraction: float,
    options: InputOptions,
    seed: int,
    job: job_dir_lib.JobDir,
    role: Role = Role(),
    holdout_fold: int = 0,
    test_data: str | None = None,
    validation: bool = False,
) -> JobInput:
    """Opens the sources and gets the schema: from the job dir when it exists; else scanned
    here (`role.scans`, the chief: InputError on bad input, before anything is written);
    else waited for, up to `role.wait_secs` (a replica whose chief is scanning). A BigQuery
    table is read through the read session its scan opened: a replica that waits for the
    chief opens it from the schema's summary (`Format.record`). With `role.stage_tables` (a
    cluster with parameter servers, whose workers cannot run a reader in Python: the table
    reader, the JSON Lines and Parquet converters) the chief of a new job first stages each
    such input into `JOB_DIR/data` (`trainer/input/formats/shards.py`), and the job reads
    those files; bad input found after staging deletes them. `holdout_fold`: which of the
    seed's disjoint hold-outs (a bag's, `trainer/job/bagging.py`). `test_data` is opened by
    the chief alone (`role.scans`) and checked against the schema in the scan of a new job
    (summary `test`); a resumed job's, first given then, is checked as it is read.
    `validation`: `eval_data` is a validation split (`JobInput.validation`)."""
    scan_if_new, stage_tables = role.scans, role.stage_tables
    schema = _known_schema(job, role, (train_data, eval_data))
    stage = stage_tables and scan_if_new and schema is None
    opener = _Opener(schema.summary if schema else {}, options, job, stage=stage)
    eval_source = opener.open(eval_data, "--eval_data", "eval") if eval_data else None
    test = opener.open(test_data, "--test_data", "test") if test_data and scan_if_new else None
    # Counted by the scan with --eval_data too: the rows a search that selects on held-out
    # rows holds out (`JobInput.for_selection`), so that it never selects on the test rows.
    scan_holdout = Holdout(holdout_fraction, seed, holdout_fold)
    holdout = None if eval_data else scan_holdout
    train = (
        opener.open(train_data, "--train_data", "train") if role.opens_train or holdout else None
    )
    if train is not None:
        columns = train.format.column_choices(train, columns)
    resumed = schema is not None
    if schema is None and scan_if_new:
        assert train is not None, "a replica that scans opens the training data"
        schema, train, eval_source = _scan_new(
            train, eval_source, test, columns, options, scan_holdout, seed, job, stage=stage
        )
    elif schema is None:
        schema = _wait_for_schema(job, role.wait_secs)
    _check_sources(train, eval_source, schema, role, resumed=resumed)
    evaluated = eval_source or train
    assert evaluated is not None, "without --eval_data the hold-out opens the training data"
    return JobInput(
        schema,
        train,
        evaluated,
        holdout,
        options,
        eval_data=eval_source is not None,
        test=test,
        validation=validation and eval_source is not None,
    )


def _known_schema(
    job: job_dir_lib.JobDir, role: Role, data: tuple[str | None, ...]
) -> Schema | None:
    """The schema a job already has: its job dir's; or, for a replica that does not scan and
    needs what the chief's scan records (a table's read session, staged shards), the one it
    waits for; None where this replica scans a new job or opens its input alone."""
    if job.exists():
        return Schema.from_document(job_dir_lib.read_json(job.schema), path=job.schema)
    if not role.scans and (role.stage_tables or any(_recorded_by_chief(d) for d in data)):
        return _wait_for_schema(job, role.wait_secs)
    return None


@dataclasses.dataclass(frozen=True)
class _Opener:
    """Opens an input as the schema's summary recorded it (staged shards, a read session), or
    afresh; with `stage`, reusing what a start that ended before its scan staged."""

    summary: Mapping
    options: InputOptions
    job: job_dir_lib.JobDir
    stage: bool

    def open(self, data: str, flag: str, key: str) -> Source:
        recorded = self.summary.get(key) or {}
        if "staged" in recorded:  # the shards the job staged
            manifest = recorded["staged"]
            return registry.staged(manifest).open_staged(
                data, flag=flag, options=self.options, manifest=manifest
            )
        fmt, files = files_lib.detect(data, flag=flag, options=self.options)
        if self.stage and not fmt.in_graph:
            done = fmt.reuse_staged(
                data, files, flag=flag, options=self.options, folder=self.job.data, name=key
            )
            if done:
                return done
        return fmt.open(
            data, files, flag=flag, options=self.options, recorded=recorded.get(fmt.name)
        )


def _scan_new(
    train: Source,
    eval_source: Source | None,
    test: Source | None,
    columns: ColumnChoices,
    options: InputOptions,
    holdout: Holdout,
    seed: int,
    job: job_dir_lib.JobDir,
    *,
    stage: bool,
) -> tuple[Schema, Source, Source | None]:
    """The schema of a new job, from the chief's scan (of the staged shards, with `stage`),
    with the sources' records and identities; (schema, train, eval) as the job reads them."""
    # Before the pass: a file rewritten while it is read is found changed on resume.
    identities = {
        key: _identities(source) for key, source in (("train", train), ("eval", eval_source))
    }
    try:
        if stage:  # every check of the columns is done: the one pass over them
            staged_train = _staged(train, "train", job)
            assert staged_train is not None
            train, eval_source = staged_train, _staged(eval_source, "eval", job)
        schema = _scan(train, eval_source, test, columns, options, holdout, seed)
        schema = _with_records(schema, train=train, eval=eval_source)
        return _with_identities(schema, identities), train, eval_source
    except InputError:
        if stage:  # the job never starts: leave no shards behind (nor half of them)
            for key in ("train", "eval"):
                shards.remove(job.data, key)
        raise


def _check_sources(
    train: Source | None, eval_source: Source | None, schema: Schema, role: Role, *, resumed: bool
) -> None:
    """InputError where the inputs are not those of the job: other files, other contents (the
    chief of a resumed job), or read in Python where parameter-server workers cannot."""
    streamed = [s for s in (train, eval_source) if s and not s.format.in_graph]
    if role.stage_tables and streamed:
        raise InputError(
            f"{streamed[0].flag}={streamed[0].pattern}: the job in this --job_dir reads its "
            f"{streamed[0].format.title} input in Python (it started without parameter "
            "servers), which parameter-server workers cannot run. Resume it without a ps pool, "
            "or start a new --job_dir."
        )
    for source, key in ((train, "train"), (eval_source, "eval")):  # not the test: never trained on
        _check_same_files(source, schema.summary.get(key))
        if resumed and role.scans:  # the chief of a resumed job: the same contents too
            _check_unchanged(source, schema.summary.get(key))


def _scan(
    train: Source,
    eval_source: Source | None,
    test: Source | None,
    columns: ColumnChoices,
    options: InputOptions,
    holdout: Holdout,
    seed: int,
) -> Schema:
    schema = scan.scan_training(
        train, columns, bad_rows=options.bad_rows, holdout=holdout, seed=seed
    )
    checked = {
        key: scan.scan_eval(source, schema, bad_rows=options.bad_rows)
        for key, source in (("eval", eval_source), ("test", test))
        if source
    }
    return dataclasses.replace(schema, summary={**schema.summary, **checked})


def _recorded_by_chief(data: str | None) -> bool:
    """Whether replicas read `data` as the chief opened it (a table's read session), recorded
    in the schema's summary."""
    fmt = registry.claiming(data) if data else None
    return fmt is not None and fmt.shared_state


def _staged(source: Source | None, key: str, job: job_dir_lib.JobDir) -> Source | None:
    """An input a parameter-server worker cannot read staged into the job dir as CSV shards;
    other inputs (and shards a previous start staged) stay as they are."""
    if source is None or source.format.in_graph:
        return source
    return source.format.stage(source, folder=job.data, name=key)


def _with_records(schema: Schema, **sources: Source | None) -> Schema:
    """The schema with what the replicas need to open each input again in its summary: the
    manifest of the shards staged of it, or what its format records (a read session)."""
    summary = dict(schema.summary)
    for key, source in sources.items():
        if source is None:
            continue
        if source.staged is not None:
            summary[key] = dict(summary[key], staged=source.staged)
        elif (record := source.format.record(source)) is not None:
            summary[key] = dict(summary[key], **{source.format.name: record})
    return dataclasses.replace(schema, summary=summary)


def _check_same_files(source: Source | None, summary: dict | None) -> None:
    """Fails when an input matches other files than when its job started (the statistics,
    the hold-out and the row counts describe those)."""
    if source is None or summary is None:
        return
    then = [f["path"] for f in summary["files"]]
    if list(source.files) != then:
        added = sorted(set(source.files) - set(then))[:3]
        gone = sorted(set(then) - set(source.files))[:3]
        raise InputError(
            f"{source.flag} now matches {len(source.files)} files, but the job in this "
            f"--job_dir was started on {len(then)} (new: {added}, gone: {gone}). Resume with "
            "the same files, or train on the new ones in a new --job_dir."
        )


def _identities(source: Source | None) -> list[dict] | None:
    """Each file's size and modification time (files_lib.identities); None for a table's read
    streams (a read session reads one snapshot of the table, whenever it is read)."""
    if source is None or not source.format.has_files:
        return None
    return files_lib.identities(source.files)


def _with_identities(schema: Schema, identities: dict[str, list[dict] | None]) -> Schema:
    """The schema with each input file's identity beside its row counts (and the CRC-32 the
    scan found), for `_check_unchanged` on resume. Staged inputs (the job's own shards) are the
    files the job reads."""
    summary = dict(schema.summary)
    for key, files in identities.items():
        if files is None or key not in summary or "staged" in summary[key]:
            continue
        entries = [{**entry, **i} for entry, i in zip(summary[key]["files"], files)]
        summary[key] = dict(summary[key], files=entries)
    return dataclasses.replace(schema, summary=summary)


def _check_unchanged(source: Source | None, summary: dict | None) -> None:
    """Fails when a file of the input changed since the job's scan (its size or modification
    time): the statistics, the hold-out and every finished iteration describe the old
    contents. Job dirs of versions that recorded no identities are not checked."""
    if source is None or summary is None or not source.format.has_files:
        return
    recorded = [f for f in summary["files"] if "bytes" in f]
    if not recorded or len(recorded) != len(source.files):
        return
    for entry, now in zip(recorded, files_lib.identities(source.files)):
        if entry["bytes"] == now["bytes"]:
            if entry["modified_ns"] == now["modified_ns"]:
                continue
            if "crc32" in entry and entry["crc32"] == blocks.checksum(entry["path"]):
                logging.info(
                    "%s: %s was modified since the job's scan, but its bytes are the same.",
                    source.flag,
                    entry["path"],
                )
                continue
        then, modified = _time(entry["modified_ns"]), _time(now["modified_ns"])
        if entry["bytes"] != now["bytes"]:
            what = f"{entry['bytes']:,} bytes when the job scanned it, {now['bytes']:,} now"
        elif "crc32" in entry:
            what = f"modified at {modified}, and its bytes are not those the job scanned"
        else:
            what = f"modified at {modified}; it was last modified at {then} when scanned"
        raise InputError(
            f"{source.flag}: {entry['path']} changed since the job in this --job_dir started "
            f"({what}): its statistics, hold-out and finished iterations describe the old "
            "contents. Restore the file to resume, or train on the new data in a new "
            "--job_dir."
        )


def _time(nanoseconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(nanoseconds / 1e9))


def _wait_for_schema(job: job_dir_lib.JobDir, wait_secs: float) -> Schema:
    deadline = time.monotonic() + wait_secs
    while not job.exists():
        if time.monotonic() > deadline:
            raise InputError(
                f"the chief did not write {job.run} in {wait_secs:.0f} s; it "
                "scans the data first. Check the chief's log."
            )
        logging.log_every_n_seconds(
            logging.INFO, "Waiting for the chief's schema in %s.", 30, job.root
        )
        time.sleep(1.0)
    return Schema.from_document(job_dir_lib.read_json(job.schema), path=job.schema)
