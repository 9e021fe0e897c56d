"""Compressed input cut short or corrupt is never read as if whole (issue 28, finding 3):
`blocks.line_chunks` and `blocks.check_compressed` on real gzip files, then the statistics
pass (`trainer.task` in this process) on truncated CSV, JSON Lines and TFRecord files."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from tests.input.support import write_tfrecord
from tests.support import FAST_FLAGS, HEADER, load_report, run_in_process, synthetic_rows
from trainer.errors import InputError
from trainer.input import blocks


def _csv_bytes(rows: list[list[str]]) -> bytes:
    return ("\n".join(",".join(r) for r in [HEADER, *rows]) + "\n").encode()


def _gzip_cut(path, text: bytes, keep: float) -> bytes:
    """Writes `text` gzipped, cut after `keep` of its compressed bytes; returns the text of
    the lines a reader may use (the whole lines before the cut, by inflating the prefix)."""
    data = gzip.compress(text)
    cut = data[: int(len(data) * keep)]
    path.write_bytes(cut)
    inflated = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16).decompress(cut)
    return inflated[: inflated.rfind(b"\n") + 1]


def _read(path, **kwargs) -> bytes:
    return b"\n".join(text for text, _ in blocks.line_chunks(str(path), **kwargs))


def test_a_whole_file_reads_whole_also_as_several_members_with_padding(tmp_path):
    text = _csv_bytes(synthetic_rows("binary", 3000, 1))
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(text[:5000]) + gzip.compress(text[5000:]) + b"\0" * 64)
    assert _read(path) + b"\n" == text
    assert blocks.check_compressed(str(path)) is None


@pytest.mark.parametrize("keep", [0.3, 0.5, 0.97])
def test_a_cut_file_raises_after_its_whole_lines_and_never_yields_the_fragment(tmp_path, keep):
    text = _csv_bytes(synthetic_rows("binary", 20_000, 1))
    path = tmp_path / "cut.csv.gz"
    whole = _gzip_cut(path, text, keep)
    got: list[bytes] = []
    with pytest.raises(blocks.TruncatedInput) as caught:
        for chunk, _ in blocks.line_chunks(str(path)):
            got.append(chunk)
    assert b"\n".join(got) + b"\n" == whole
    lines = whole.count(b"\n")
    assert caught.value.tail.lines == lines
    assert isinstance(caught.value, InputError)
    assert str(path) in str(caught.value) and "ends before its gzip stream does" in str(
        caught.value
    )
    assert f"its first {lines:,} lines are whole" in str(caught.value)


def test_with_lost_tails_the_whole_lines_are_read_and_notes_say_where_the_cut_is(tmp_path):
    text = _csv_bytes(synthetic_rows("binary", 20_000, 1))
    path = tmp_path / "cut.csv.gz"
    whole = _gzip_cut(path, text, 0.5)
    assert _read(path, lost_tails=True) + b"\n" == whole  # nothing noted, nothing raised
    notes = blocks.Notes()
    assert _read(path, lost_tails=True, notes=notes) + b"\n" == whole
    assert notes.lost[str(path)].lines == whole.count(b"\n") and not notes.checksums
    # Noted without lost_tails: the cut is noted, then raised.
    with pytest.raises(blocks.TruncatedInput):
        _read(path, notes=(raised := blocks.Notes()))
    assert raised.lost[str(path)] == notes.lost[str(path)]
    # A whole file: its checksum, no cut.
    path.write_bytes(gzip.compress(text))
    whole_notes = blocks.Notes()
    assert _read(path, notes=whole_notes) + b"\n" == text
    assert whole_notes.checksums == {str(path): zlib.crc32(path.read_bytes())}
    assert whole_notes.checksums[str(path)] == blocks.checksum(str(path))
    assert not whole_notes.lost


def test_a_corrupt_stream_is_not_whole(tmp_path):
    data = bytearray(gzip.compress(_csv_bytes(synthetic_rows("binary", 5000, 1))))
    data[len(data) // 2] ^= 0xFF  # a flipped byte: the inflate fails, or the CRC check does
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(blocks.TruncatedInput, match="is not a whole gzip stream"):
        _read(path)
    assert "is not a whole gzip stream" in (blocks.check_compressed(str(path)) or "")


def test_a_gzip_file_missing_only_its_trailer_is_cut(tmp_path):
    """TensorFlow's TextLineDataset reads this file as whole (every line is there); its CRC
    and size were never checked."""
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(_csv_bytes(synthetic_rows("binary", 100, 1)))[:-8])
    with pytest.raises(blocks.TruncatedInput):
        _read(path)


# -- the statistics pass ------------------------------------------------------------------------
def _cut_csv(tmp_path, name: str, rows, keep: float = 0.5):
    path = tmp_path / name
    _gzip_cut(path, _csv_bytes(rows), keep)
    return path


def _label_cut(tmp_path):
    """A .csv.gz cut inside the label of a line: the fragment ("ye" of "yes") would be a
    third class if it were read."""
    rows = synthetic_rows("binary", 2000, 1)
    rows[1500][3] = "yes"
    text = _csv_bytes(rows)
    end = text.index(b"\n".join([b",".join(r.encode() for r in rows[1500])]))
    path = tmp_path / "label_cut.csv.gz"
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    cut_at = end + len(",".join(rows[1500][:3])) + 3  # after "ye"
    path.write_bytes(compressor.compress(text[:cut_at]) + compressor.flush(zlib.Z_SYNC_FLUSH))
    return path


def test_truncated_training_data_stops_the_job_naming_the_file(tmp_path):
    path = _cut_csv(tmp_path, "train.csv.gz", synthetic_rows("binary", 2000, 1))
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [f"--train_data={path}", "--label_column=target", f"--job_dir={job}"]
    )
    assert code == 2, stderr[-2000:]
    assert f"--train_data: {path} ends before its gzip stream does" in stderr
    assert "fields" not in stderr  # not reported as one malformed line
    assert not job.exists()


def test_a_cut_inside_a_label_is_not_a_class(tmp_path):
    path = _label_cut(tmp_path)
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [f"--train_data={path}", "--label_column=target", f"--job_dir={job}"]
    )
    assert code == 2 and "ends before its gzip stream does" in stderr, stderr[-2000:]


def test_truncated_eval_data_and_json_lines_stop_the_job(tmp_path):
    good = tmp_path / "train.csv"
    good.write_bytes(_csv_bytes(synthetic_rows("binary", 500, 1)))
    bad_eval = _cut_csv(tmp_path, "eval.csv.gz", synthetic_rows("binary", 2000, 2))
    lines = [json.dumps(dict(zip(HEADER, r))) for r in synthetic_rows("binary", 2000, 3)]
    jsonl = tmp_path / "train.jsonl.gz"
    _gzip_cut(jsonl, ("\n".join(lines) + "\n").encode(), 0.6)
    for args, flag, path in (
        ([f"--train_data={good}", f"--eval_data={bad_eval}"], "--eval_data", bad_eval),
        ([f"--train_data={jsonl}"], "--train_data", jsonl),
    ):
        job = tmp_path / f"job-{flag}"
        code, stderr = run_in_process([*args, "--label_column=target", f"--job_dir={job}"])
        assert code == 2, stderr[-2000:]
        assert f"{flag}: {path} ends before its gzip stream does" in stderr
        assert not job.exists()


def test_a_tfrecord_file_cut_between_records_stops_the_job(tmp_path):
    """TensorFlow reads a compressed TFRecord file cut at a record boundary as whole."""
    whole = tmp_path / "whole.tfrecord.gz"
    records = [
        {"x1": float(r[0]), "x2": float(r[1]), "color": r[2].encode(), "target": r[3].encode()}
        for r in synthetic_rows("binary", 3000, 1)
    ]
    write_tfrecord(whole, records, "GZIP")
    text = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16).decompress(whole.read_bytes())
    cut = tmp_path / "cut.tfrecord.gz"
    # The first records' bytes, whole, as a gzip stream without its end.
    compressor = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    cut.write_bytes(
        compressor.compress(text[: len(text) // 2]) + compressor.flush(zlib.Z_FULL_FLUSH)
    )
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [f"--train_data={cut}", "--label_column=target", f"--job_dir={job}", "--bad_rows=skip"]
    )
    assert code == 2, stderr[-2000:]
    assert f"--train_data: {cut} ends before its gzip stream does" in stderr


@pytest.mark.slow
def test_with_bad_rows_skip_a_cut_file_trains_on_its_whole_lines_and_reports_the_lost_tail(
    tmp_path,
):
    rows = synthetic_rows("binary", 3000, 1)
    cut = _label_cut(tmp_path)
    whole = tmp_path / "whole.csv"
    whole.write_bytes(_csv_bytes(rows[:1000]))
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [
            f"--train_data={whole},{cut}",
            "--label_column=target",
            f"--job_dir={job}",
            "--bad_rows=skip",
            *FAST_FLAGS,
            "--max_iterations=1",
            "--max_iteration_steps=20",
        ]
    )
    assert code == 0, stderr[-3000:]
    schema = json.loads((job / "schema.json").read_text())
    train = schema["input"]["train"]
    assert train["bad_rows"] == 0 and train["lost_tails"] == 1
    entry = next(f for f in train["files"] if f["path"] == str(cut))
    assert entry["lost_tail_after_line"] == 1501  # the header and the 1,500 rows before the cut
    assert entry["rows"] == 1500
    assert schema["label"]["classes"] == ["no", "yes"]
    report = load_report(job)
    assert report["input"]["bad_rows"]["lost_tails"] == {str(cut): 1501}
