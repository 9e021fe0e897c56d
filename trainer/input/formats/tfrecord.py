"""TFRecord input: files of tf.Example records named *.tfrecord, *.tfrecords or *.tfr
(optionally .gz), read by TensorFlow (also in a parameter-server worker's dataset).

The columns are the features of the first `SNIFF_RECORDS` records, sorted, each with its type
(`BYTES`, `INT64`, `FLOAT`): a feature stored as numbers is numeric unless named categorical.
A row's number counts records from 1 in each file. TensorFlow inflates compressed files itself
and reads one cut short between two records as if whole: each is read through once before a
pass (`check_whole`).
"""

from __future__ import annotations

import concurrent.futures

import tensorflow as tf

from trainer.errors import InputError
from trainer.input import blocks
from trainer.input.formats.base import Format, Reading, RowText, Source
from trainer.input.options import InputOptions

# Records read to learn a TFRecord input's feature names and types.
SNIFF_RECORDS = 1000


class TFRecord(Format):
    name = "tfrecord"
    title = "TFRecord"
    suffixes = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz", ".tfr")
    row_text = RowText.EXAMPLE
    unit = "record"
    reads_as = "TFRecord files of tf.Example"

    def open(self, pattern, files, *, flag, options: InputOptions, recorded=None) -> Source:
        names, types = _sniff(files, flag=flag)
        return Source(flag, pattern, tuple(files), self, names, types)

    def reader(self, source: Source, reading: Reading):
        return _record_blocks, False

    def check_whole(self, source: Source) -> None:
        compressed = [path for path in source.files if path.endswith(".gz")]
        if not compressed:
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(compressed), 8)) as pool:
            for why in pool.map(blocks.check_compressed, compressed):
                if why:
                    raise InputError(
                        f"{source.flag}: {why} (a copy or a writer that was interrupted?). "
                        f"Copy or write it again, or leave it out of {source.flag}."
                    )

    def describe_malformed(self, text: bytes, columns: tuple[str, ...]) -> str:
        return "holds a feature with several values; this trainer takes one value per feature"

    def value(self, text: bytes, columns: tuple[str, ...], column: str) -> str:
        feature = tf.train.Example.FromString(text).features.feature[column]
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        value = values[0] if values else ""
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)


TFRECORD = TFRecord()


def _record_blocks(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
    records = tf.data.TFRecordDataset(
        path, blocks.compression(path), buffer_size=blocks.READ_BUFFER_BYTES
    )
    return (
        records.batch(blocks.READ_BLOCK_ROWS)
        .enumerate()
        .map(lambda i, text: blocks.located(index, i * blocks.READ_BLOCK_ROWS + 1, text))
    )


def _sniff(files, *, flag: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Feature names (sorted) and types, from the first records of the first files. A feature
    that first appears later is not seen (and not used)."""
    types: dict[str, str] = {}
    seen = 0
    for path in files:
        try:
            for record in tf.data.TFRecordDataset(path, Source.compression(path)).take(
                SNIFF_RECORDS - seen
            ):
                example = tf.train.Example.FromString(record.numpy())
                for name, feature in example.features.feature.items():
                    kind = feature.WhichOneof("kind")
                    if kind is None:
                        continue
                    if types.setdefault(name, kind) != kind:
                        raise InputError(
                            f"{flag}: feature '{name}' is a {types[name]} in some "
                            f"records and a {kind} in others ({path}); give each "
                            "feature one type."
                        )
                seen += 1
        except InputError:
            raise
        except Exception as e:  # a corrupt file raises OpError, a corrupt record DecodeError
            raise InputError(
                f"{flag}: cannot read {path} as TFRecord files of tf.Example "
                f"({type(e).__name__}: {e})."
            ) from None
        if seen >= SNIFF_RECORDS:
            break
    if not types:
        raise InputError(f"{flag}: {', '.join(files[:3])} hold no tf.Example with features.")
    names = tuple(sorted(types))
    return names, tuple(types[n] for n in names)
