"""The datasets training and evaluation read: shards that are disjoint and cover the data, a
hold-out that is the same whoever reads it, eval passes that see each row once, and training
batches from memory or streamed."""

import collections
import zlib

import numpy as np
import pytest
import tensorflow as tf

from tests.input.support import write_rows
from trainer.input import files, job_input, pipeline, scan
from trainer.input import schema as S
from trainer.input.job_input import JobInput
from trainer.input.options import BadRows, InputOptions
from trainer.input.pipeline import Pipeline, Selection, Shard, Side

HEADER = ["id", "x", "c", "y"]


def make(tmp_path, *, files_count=3, rows=600, bad_rows=BadRows.ERROR, extra=(), holdout=None):
    """`files_count` CSV files; column id numbers the rows (0..rows-1)."""
    all_rows = [[i, i % 13 / 13, "abc"[i % 3], i % 2] for i in range(rows)]
    paths = [
        write_rows(tmp_path, HEADER, all_rows[k::files_count] + list(extra), f"part-{k}.csv")
        for k in range(files_count)
    ]
    source = files.open_source(",".join(paths), flag="--train_data")
    schema = scan.scan_training(
        source, S.ColumnChoices("y", numeric=("id",)), bad_rows=bad_rows, holdout=holdout
    )
    return source, schema


def ids(dataset):
    """The id of every row of one pass (raw features)."""
    out = []
    for features, _ in dataset:
        out += features["id"].numpy().astype(int).tolist()
    return out


@pytest.mark.parametrize(
    "files_count, readers, by_file, in_process",
    [
        (4, 2, True, True),
        (1, 2, False, False),
        pytest.param(4, 2, True, False, marks=pytest.mark.slow),
        pytest.param(1, 2, False, True, marks=pytest.mark.slow),
        pytest.param(3, 4, False, True, marks=pytest.mark.slow),
        pytest.param(3, 4, False, False, marks=pytest.mark.slow),
        pytest.param(5, 3, True, True, marks=pytest.mark.slow),
        pytest.param(5, 3, True, False, marks=pytest.mark.slow),
    ],
)
def test_shards_are_disjoint_and_cover_the_data(
    tmp_path, files_count, readers, by_file, in_process
):
    source, schema = make(tmp_path, files_count=files_count)
    data = Pipeline(source, schema, in_process=in_process)
    seen = []
    for reader in range(readers):
        # A worker's index is a tensor in the function its dataset is built from.
        index = tf.constant(reader, tf.int64) if not in_process else reader
        shard = Shard.of(index, readers, num_files=files_count)
        assert shard is not None and shard.by_file is by_file
        seen.append(ids(data.raw(Selection(shard=shard))))
    assert all(seen)
    assert sorted(i for part in seen for i in part) == list(range(600))


def test_shard_plan_names_each_readers_files(tmp_path):
    source, _ = make(tmp_path, files_count=3)
    plan = pipeline.shard_plan(source, 2)
    assert plan[0]["files"] == [source.files[0], source.files[2]]
    assert plan[1]["files"] == [source.files[1]]
    assert "modulo 4" in pipeline.shard_plan(source, 4)[3]["rows"]


@pytest.mark.slow
def test_the_holdout_is_the_same_for_every_reader_and_complements_training(tmp_path):
    source, schema = make(tmp_path, files_count=2)
    holdout = scan.Holdout(0.25, seed=1)
    data = Pipeline(source, schema)
    held = ids(data.raw(Selection(holdout, Side.HELD_OUT)))
    train = ids(data.raw(Selection(holdout, Side.TRAIN)))
    assert sorted(held + train) == list(range(600))
    assert 100 < len(held) < 200
    sharded = [
        ids(data.raw(Selection(holdout, Side.HELD_OUT, Shard.of(r, 3, num_files=2))))
        for r in range(3)
    ]
    assert sorted(i for part in sharded for i in part) == sorted(held)
    assert sorted(
        ids(Pipeline(source, schema, in_process=False).raw(Selection(holdout, Side.HELD_OUT)))
    ) == sorted(held)


def test_an_eval_pass_counts_each_row_once(tmp_path):
    source, schema = make(tmp_path, files_count=3, rows=10_007)
    rows: collections.Counter[int] = collections.Counter()
    for encoded, labels in Pipeline(source, schema).encoded(batch_size=512):
        assert encoded["dense"].shape[0] == labels.shape[0] <= 512
        rows.update(
            np.round(
                encoded["dense"][:, 0].numpy() * schema.columns[0].std + schema.columns[0].mean
            )
            .astype(int)
            .tolist()
        )
    assert len(rows) == 10_007 and set(rows.values()) == {1}


@pytest.mark.parametrize("cache", [True, False])
def test_training_batches_are_full_shuffled_and_endless(tmp_path, cache):
    source, schema = make(tmp_path, files_count=2, rows=300)
    dataset = Pipeline(source, schema).training(
        Selection(), batch_size=64, seed=5, shuffle_buffer=1000, cache_rows=300 if cache else None
    )
    batches = [b for _, b in zip(range(14), dataset)]  # three epochs
    assert all(b[0]["dense"].shape == (64, schema.dense_width) for b in batches)
    first = np.sort(np.concatenate([b[1].numpy() for b in batches[:4]]))
    assert len(first) == 256
    epoch_ids = lambda bs: [tuple(np.round(b[0]["dense"][:, 0].numpy(), 4)) for b in bs]  # noqa
    assert epoch_ids(batches[:4]) != epoch_ids(batches[4:8])  # a new order each epoch
    if cache:  # the same seed gives the same batches
        again = Pipeline(source, schema).training(
            Selection(), batch_size=64, seed=5, shuffle_buffer=1000, cache_rows=300
        )
        np.testing.assert_array_equal(next(iter(again))[0]["dense"], batches[0][0]["dense"])


@pytest.mark.slow
def test_the_datasets_a_search_opens_and_drops_run_without_the_autotune_thread(tmp_path):
    """Each iteration drops its training iterator and each evaluation its pass; with
    tf.data's autotuning on, deleting one waited seconds for that thread (`_untuned`)."""
    source, schema = make(tmp_path, files_count=2, rows=300)
    data = Pipeline(source, schema)
    datasets = [
        data.training(
            Selection(), batch_size=64, seed=5, shuffle_buffer=1000, cache_rows=cache_rows
        )
        for cache_rows in (300, None)
    ] + [data.encoded(), data.raw()]
    assert [d.options().autotune.enabled for d in datasets] == [False] * 4


def test_bad_rows_are_skipped_or_fail_the_pass(tmp_path):
    extra = [["oops", 0.5, "a", 1]]
    source, schema = make(tmp_path, files_count=2, rows=100, bad_rows=BadRows.SKIP, extra=extra)
    assert schema.summary["train"]["bad_rows"] == 2
    assert sorted(ids(Pipeline(source, schema, BadRows.SKIP).raw())) == list(range(100))
    with pytest.raises(tf.errors.InvalidArgumentError, match="a row that cannot be used"):
        ids(Pipeline(source, schema, BadRows.ERROR).raw())


@pytest.mark.parametrize("in_process", [True, False])
def test_a_cut_file_under_skip_reads_the_rows_of_its_whole_lines_in_both_readers(
    tmp_path, in_process
):
    """TensorFlow's line reader (a parameter-server worker's) reads a cut .gz as if whole,
    its partial last line too: it stops at the last whole line the scan found. The cut falls
    inside the last field, a number ("0.92" of "0.923..."): read, the fragment would be a
    row with all its fields and a wrong value."""
    lines = ["id,c,y,x"] + [f"{i},{'abc'[i % 3]},{i % 2},{i % 13 / 13}" for i in range(600)]
    text = "\n".join(lines) + "\n"
    start = text.index("\n597,") + 1
    cut_at = text.index("\n", start) - 10  # inside 0.9230769230769231
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(
        compressor.compress(text[:cut_at].encode()) + compressor.flush(zlib.Z_SYNC_FLUSH)
    )
    source = files.open_source(str(path), flag="--train_data")
    schema = scan.scan_training(
        source, S.ColumnChoices("y", numeric=("id", "x")), bad_rows=BadRows.SKIP, holdout=None
    )
    assert schema.summary["train"]["files"][0]["lost_tail_after_line"] == 598
    assert schema.summary["train"]["rows"] == 597
    read = ids(Pipeline(source, schema, BadRows.SKIP, in_process=in_process).raw())
    assert sorted(read) == list(range(597))


def _job_input(tmp_path, *, cache_mb=256.0):
    holdout = scan.Holdout(0.25, seed=1)
    source, schema = make(tmp_path, files_count=2, rows=300, holdout=holdout)
    options = InputOptions(cache_mb=cache_mb)
    return JobInput(schema, source, source, holdout, options)


def _dense_rows(dataset):
    return sorted(map(tuple, np.concatenate([f["dense"].numpy() for f, _ in dataset]).round(5)))


@pytest.mark.slow
def test_a_job_reads_and_encodes_a_table_that_fits_in_memory_once(tmp_path, monkeypatch):
    """The eval rows and the training rows are read once per process, however many
    evaluations and iterations ask for them, and give the rows the files give."""
    streamed = _dense_rows(_job_input(tmp_path, cache_mb=0).eval_encoded())
    data = _job_input(tmp_path)
    reads: collections.Counter[Side] = collections.Counter()
    table = Pipeline.table

    def counted(self, selection, *, rows, compact):
        reads[selection.side] += 1
        return table(self, selection, rows=rows, compact=compact)

    monkeypatch.setattr(Pipeline, "table", counted)
    for _ in range(3):
        assert _dense_rows(data.eval_encoded()) == streamed
        batches = data.training(readers=1, shard=None, batch_size=16, seed=3)
        assert next(iter(batches))[0]["dense"].shape == (16, data.schema.dense_width)
    assert len(_dense_rows(data.train_encoded())) == data.train_rows
    assert reads == {Side.HELD_OUT: 1, Side.TRAIN: 1}
    assert len(streamed) == data.eval_rows and 50 < len(streamed) < 100


@pytest.mark.parametrize("cached", [True, False], ids=["small", "past-raw-cache-rows"])
def test_the_raw_eval_rows_of_a_small_table_are_read_once(tmp_path, monkeypatch, cached):
    """The exported model's eval passes (its metrics, then its feature importance) read a
    small eval set once per process and give the rows the files give; past RAW_CACHE_ROWS
    every pass streams."""
    data = _job_input(tmp_path)
    if not cached:
        monkeypatch.setattr(job_input, "RAW_CACHE_ROWS", data.eval_rows - 1)
    passes = []
    raw = Pipeline.raw

    def counted(self, *args, **kwargs):
        passes.append(kwargs)
        return raw(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "raw", counted)
    rows = [
        sorted(
            tuple(f[name].numpy()[i] for name in sorted(f)) + (y.numpy()[i],)
            for f, y in data.eval_raw(with_weight=True)
            for i in range(len(y))
        )
        for _ in range(3)
    ]
    assert rows[0] == rows[1] == rows[2]
    assert len(rows[0]) == data.eval_rows
    assert len(passes) == (1 if cached else 3)


def test_a_large_table_kept_compact_gives_the_same_encoded_rows(tmp_path, monkeypatch):
    """Past COMPACT_TABLE_BYTES an in-memory table keeps its rows half-encoded and encodes
    each batch as it is read: the eval and training passes, the training batches and the
    derived columns are those of a table of encoded rows."""
    derived = pipeline.Derived(lambda f: {"twice": 2 * f["dense"]}, bytes_per_example=0)

    def passes(data):
        training = data.training(readers=1, shard=None, batch_size=16, seed=3, derived=derived)
        features, labels = next(iter(training))
        assert set(features) == {"dense", "twice"}
        np.testing.assert_array_equal(features["twice"], 2 * features["dense"])
        return (
            _dense_rows(data.eval_encoded()),
            _dense_rows(data.train_encoded()),
            features["dense"].numpy().tolist(),
            labels.numpy().tolist(),
        )

    encoded = passes(_job_input(tmp_path))
    monkeypatch.setattr(job_input, "COMPACT_TABLE_BYTES", 0)
    data = _job_input(tmp_path)
    assert data._expand(data.train_rows) is not None
    assert passes(data) == encoded
    table = next(iter(data._tables.values()))
    assert "dense" not in table[0] and "numeric" in table[0]


def test_derived_columns_join_a_table_in_memory_when_they_fit(tmp_path):
    """Columns derived from the encoded rows (the previous members' outputs) are computed
    once, in chunks, and batched with their rows; past the memory budget they are left out
    (the forward pass then computes them)."""

    def derive(features):
        return {"twice": (2 * features["dense"], features["dense"][:, :1])}

    data = _job_input(tmp_path, cache_mb=1.0)
    width = data.schema.dense_width
    derived = pipeline.Derived(derive, bytes_per_example=4 * (width + 1))
    table, _ = next(iter(Pipeline(data.train_source, data.schema).table(Selection(), rows=300)))
    joined = derived(table, chunk=7)  # 43 chunks of 7 rows (the last of 6), joined
    np.testing.assert_array_equal(joined["twice"][0].numpy(), 2 * table["dense"].numpy())
    assert joined["twice"][1].shape == (300, 1)
    batch, _ = next(
        iter(data.training(readers=1, shard=None, batch_size=16, seed=3, derived=derived))
    )
    np.testing.assert_array_equal(batch["twice"][0].numpy(), 2 * batch["dense"].numpy())
    np.testing.assert_array_equal(batch["twice"][1].numpy(), batch["dense"].numpy()[:, :1])
    over = pipeline.Derived(derive, bytes_per_example=1 << 20)  # 1 MB a row
    batch, _ = next(iter(data.training(readers=1, shard=None, batch_size=16, seed=3, derived=over)))
    assert set(batch) == {"dense"}
